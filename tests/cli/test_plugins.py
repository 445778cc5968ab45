"""``fleetstore stress`` comes from a distribution of its own (fleetstore-stress,
stress/ in the repository, issue 26): the command finds it through the
``fleetstore.commands`` entry point, never by importing it, and without it says in
one line what to install (exit 2), no traceback.

Each test runs the real ``fleetstore`` command in a process of its own.  An installed
harness is a distribution record on ``sys.path`` (a ``.dist-info`` directory with the
entry points stress/pyproject.toml declares, as pip writes it) beside the harness's
source; a missing one is its package made unimportable (``sys.modules[name] = None``,
as tests/cli/test_extras.py does), or the entry-point group emptied; so the tests
give the same answers in a venv that has it installed (``make venv``) and in one
that has not.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import fleetstore
from fleetstore.cli.main import OPTIONAL, PLUGINS

ROOT = Path(__file__).resolve().parents[2]
STRESS = ROOT / "stress"
HINT = "pip install 'fleetstore[stress]'"

RUN = """
import sys
blocked, group, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
if blocked:
    sys.modules[blocked] = None
from fleetstore.cli.main import main
if group:
    main.plugins = group
try:
    main(argv, prog_name="fleetstore")
finally:
    heavy = ("apsw", "zstandard", "psycopg", "rich", "fleetstore.engine", "fleetstore.store")
    print(sorted(m for m in sys.modules if m.startswith(heavy)), file=sys.stderr)
"""


def record(where: Path) -> Path:
    """An installed fleetstore-stress as pip records it: its ``.dist-info`` with
    stress/pyproject.toml's name, version and entry points."""
    with (STRESS / "pyproject.toml").open("rb") as fh:
        project = tomllib.load(fh)["project"]
    info = where / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
    )
    lines = []
    for group, entries in project["entry-points"].items():
        lines.append(f"[{group}]")
        lines += [f"{name} = {value}" for name, value in entries.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return where


def fleetstore_cmd(
    *argv: str, blocked: str = "", group: str = "", path: Path | None = None
) -> tuple[int, str, str, list[str]]:
    """(exit code, stdout, stderr less its last line, the heavy modules loaded)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSTORE_")}
    source = [str(Path(fleetstore.__file__).parent.parent), str(STRESS / "src")]
    extra = [str(path)] if path else []
    env["PYTHONPATH"] = os.pathsep.join([*extra, *source, env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", RUN, blocked, group, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    *err, loaded = done.stderr.splitlines()
    return done.returncode, done.stdout, "\n".join(err), list(ast.literal_eval(loaded))


def test_the_harness_is_found_by_its_entry_point_and_never_imported_otherwise(
    tmp_path: Path,
) -> None:
    installed = record(tmp_path / "site")
    code, out, err, loaded = fleetstore_cmd("stress", "--help", path=installed)
    assert code == 0, err
    assert "--agents" in out and "FLEETSTORE_STRESS_AGENTS" in out and "Exit codes" in out
    assert loaded == []  # its --help loads no driver, no store (tests/cli/test_startup.py)
    code, out, err, _ = fleetstore_cmd("--help", path=installed)
    assert code == 0, err
    (line,) = [x for x in out.splitlines() if x.split()[:1] == ["stress"]]
    assert "Run a fleet of agent processes" in line
    # Its own checks answer: the harness ran, through the entry point.
    code, _, err, _ = fleetstore_cmd("stress", "--agents", "0", path=installed)
    assert code == 2 and "FLEETSTORE_STRESS_AGENTS" in err, err


def test_the_entry_point_is_the_one_the_command_consults() -> None:
    with (STRESS / "pyproject.toml").open("rb") as fh:
        project = tomllib.load(fh)["project"]
    assert set(project["entry-points"][PLUGINS]) == set(OPTIONAL) == {"stress"}
    with (ROOT / "pyproject.toml").open("rb") as fh:
        extras = tomllib.load(fh)["project"]["optional-dependencies"]
    assert extras[OPTIONAL["stress"]] == [f"{project['name']}=={project['version']}"]


def check_not_installed(code: int, out: str, err: str) -> None:
    assert code == 2, err
    assert out == ""
    assert err.count("\n") == 0 and err.startswith("fleetstore stress: not installed: "), err
    assert HINT in err and "Traceback" not in err


def test_without_the_harness_stress_is_one_line_naming_the_pip_install(tmp_path: Path) -> None:
    # No entry point in the group (a venv without fleetstore-stress).
    for argv in (["stress", "--agents", "2", "--duration", "2"], ["stress", "--help"]):
        code, out, err, _ = fleetstore_cmd(*argv, group="fleetstore.no-such-group")
        check_not_installed(code, out, err)
    code, out, err, _ = fleetstore_cmd("--help", group="fleetstore.no-such-group")
    assert code == 0, err
    (line,) = [x for x in out.splitlines() if x.split()[:1] == ["stress"]]
    assert HINT in line
    # Its record is there but not its package (uninstalled by hand).
    installed = record(tmp_path / "site")
    code, out, err, _ = fleetstore_cmd(
        "stress", "--agents", "2", blocked="fleetstore_stress", path=installed
    )
    check_not_installed(code, out, err)


def test_an_unknown_command_is_still_click_s_usage_error() -> None:
    code, _, err, _ = fleetstore_cmd("strses")
    assert code == 2 and "No such command 'strses'" in err, err
    assert HINT not in err
