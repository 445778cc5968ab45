"""A missing optional dependency is one line naming the ``pip install`` to run.

Issue 28: ``fleetstore import --from langgraph-sqlite`` without the extra printed a
25-line ``ModuleNotFoundError`` traceback.  The extras are installed here, so each test
runs a process in which the extra's package cannot be imported (``sys.modules[name] =
None``: Python's own "not importable"), exactly what a user without it gets.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetstore.core.extras import EXTRAS

RUN_WITHOUT = """
import sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None
from fleetstore.cli.main import main
main(sys.argv[2:], prog_name="fleetstore")
"""


def without(packages: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSTORE_")}
    return subprocess.run(
        [sys.executable, "-c", RUN_WITHOUT, packages, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.mark.parametrize(
    ("source", "extra", "blocked"),
    [
        ("langgraph-sqlite", "langgraph", "langgraph"),
        ("adk-sqlite", "adk", "google.adk,google"),
    ],
)
def test_import_from_a_framework_without_its_extra_is_one_line(
    tmp_path: Path, source: str, extra: str, blocked: str
) -> None:
    (tmp_path / "f.db").write_bytes(b"")
    store = tmp_path / "s.db"
    done = without(
        blocked, "import", "--from", source, str(tmp_path / "f.db"), "--store", str(store)
    )
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1, done.stderr  # one line, no traceback
    assert f"pip install 'fleetstore[{extra}]'" in done.stderr
    assert done.stderr.startswith("fleetstore import: ")
    assert not store.exists()  # nothing was created


def test_a_postgresql_store_without_psycopg_is_one_line() -> None:
    done = without("psycopg,psycopg_pool", "stats", "--store", "postgresql://u@127.0.0.1:1/db")
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1, done.stderr
    assert "pip install 'fleetstore[postgres]'" in done.stderr


def test_the_api_raises_missing_dependency_which_is_still_an_import_error() -> None:
    code = (
        "import sys; sys.modules['agents'] = None\n"
        "from fleetstore.errors import MissingDependency, ConfigError\n"
        "try:\n"
        "    from fleetstore.integrations.openai_agents import FleetstoreSession\n"
        "except ImportError as exc:\n"
        "    assert isinstance(exc, MissingDependency) and isinstance(exc, ConfigError)\n"
        "    assert exc.name.startswith('agents'), exc.name\n"
        "    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("pip install 'fleetstore[openai-agents]'")


def test_every_extra_is_one_of_pyprojects() -> None:
    """core/extras.EXTRAS names the extras users install: each is in pyproject.toml."""
    import tomllib

    root = Path(__file__).resolve().parents[2]
    with (root / "pyproject.toml").open("rb") as fh:
        published = tomllib.load(fh)["project"]["optional-dependencies"]
    assert set(EXTRAS) <= set(published)
    assert "dev" not in published  # a dependency group, never a published extra
