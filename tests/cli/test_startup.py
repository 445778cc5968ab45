"""The ``fleetstore`` command starts without loading what it does not need.

Issue 28: every command took 0.35-0.5 s to start; ``python -X importtime -m
fleetstore --help`` showed ``fleetstore.cli`` at 0.36 s (the package imported the
whole store, apsw and zstandard, and the CLI every command module's work).  The
guard is deterministic, what is imported, not a time: ``import fleetstore``,
``import fleetstore.cli``, ``fleetstore --help`` and a command's ``--help`` load no
driver, no compression library, no rich, and nothing of the store's layers.
(docs/cli.md, "Start-up", has the times measured.)
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import fleetstore

HEAVY = ("apsw", "zstandard", "psycopg", "psycopg_pool", "rich", "sqlite3")
LAYERS = ("fleetstore.engine", "fleetstore.store", "fleetstore.domain", "fleetstore.admin")

PROBE = """
import sys
{setup}
loaded = sorted(
    m for m in sys.modules
    if m.split(".")[0] in {heavy!r} or m.startswith({layers!r})
)
print(loaded)
"""

RUN_MAIN = """
from fleetstore.cli.main import main
try:
    main({argv!r}, prog_name="fleetstore")
except SystemExit:
    pass
"""


def loaded_by(setup: str) -> list[str]:
    code = PROBE.format(setup=setup, heavy=HEAVY, layers=LAYERS)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return list(ast.literal_eval(done.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize(
    "setup",
    [
        "import fleetstore",
        "import fleetstore.cli",
        "import fleetstore, fleetstore.errors; fleetstore.errors.NotFound; fleetstore.__version__",
        RUN_MAIN.format(argv=["--help"]),
        RUN_MAIN.format(argv=["--version"]),
        RUN_MAIN.format(argv=["sessions", "list", "--help"]),
        # Its --format and --width name the transcript's formats and default width
        # (core/transcripts.py), not admin/transcript.py's.
        RUN_MAIN.format(argv=["sessions", "show", "--help"]),
        RUN_MAIN.format(argv=["migrate", "--help"]),
        RUN_MAIN.format(argv=["stress", "--help"]),
        RUN_MAIN.format(argv=["backup", "--help"]),
    ],
    ids=[
        "package",
        "cli",
        "errors",
        "help",
        "version",
        "list-help",
        "show-help",
        "migrate-help",
        "stress-help",
        "backup-help",
    ],
)
def test_start_up_loads_no_driver_compression_rich_or_store(setup: str) -> None:
    assert loaded_by(setup) == []


def test_a_command_loads_only_its_own_module() -> None:
    setup = RUN_MAIN.format(argv=["lock", "--help"]) + (
        "\nprint([m for m in sys.modules if m.startswith('fleetstore.cli.')"
        " or m == 'importlib.metadata'])"
    )
    done = subprocess.run(
        [sys.executable, "-c", "import sys\n" + setup],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    modules = set(ast.literal_eval(done.stdout.strip().splitlines()[-1]))
    # No importlib.metadata either: the entry points (other distributions' commands,
    # tests/cli/test_plugins.py) are read only for a command fleetstore does not ship.
    # cli.logs: the group's -v/-q/--log-format set up logging before any command runs.
    assert modules == {
        "fleetstore.cli.main",
        "fleetstore.cli.util",
        "fleetstore.cli.logs",
        "fleetstore.cli.lock",
    }


def test_every_public_name_loads_and_the_lazy_table_matches_the_type_checking_imports() -> None:
    """fleetstore/__init__.py says twice where each name lives (``_LAZY`` for the
    interpreter, the ``TYPE_CHECKING`` imports for type checkers): they must agree."""
    source = Path(fleetstore.__file__).read_text(encoding="utf-8")
    tree = ast.parse(source)
    typed: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            for stmt in node.body:
                assert isinstance(stmt, ast.ImportFrom) and stmt.module
                typed |= {alias.name: stmt.module for alias in stmt.names}
    lazy = fleetstore._LAZY
    assert typed == lazy
    for name in fleetstore.__all__:
        assert getattr(fleetstore, name) is not None, name
        assert name in dir(fleetstore)
    with pytest.raises(AttributeError):
        fleetstore.no_such_name  # noqa: B018
