"""fleetstore-stress is a distribution of its own (issue 26): its wheel carries the
harness and the peer patterns, and declares the entry point the ``fleetstore`` command
finds it by (tests/cli/test_plugins.py runs that path)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from tests.test_packaging import build_wheel

STRESS = Path(__file__).resolve().parents[1]


def test_the_wheel_carries_the_harness_and_its_entry_point(tmp_path: Path) -> None:
    with build_wheel(STRESS, tmp_path) as wheel:
        names = wheel.namelist()
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        declared = wheel.read(entry_points).decode()
    modules = {str(p.relative_to(STRESS / "src")) for p in (STRESS / "src").rglob("*.py")}
    assert modules <= set(names) and "fleetstore_stress/patterns/plain.py" in modules
    assert not [n for n in names if n.startswith("fleetstore/")]  # the library is not in it
    assert "[fleetstore.commands]\nstress = fleetstore_stress.cli:stress_command" in declared
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)


PROBE = """
import sys, runpy
sys.argv = ["fleetstore stress", "--help"]
try:
    runpy.run_module("fleetstore_stress", run_name="__main__")
except SystemExit:
    pass
heavy = ("apsw", "zstandard", "psycopg", "rich", "fleetstore.engine", "fleetstore.store")
print(sorted(m for m in sys.modules if m.startswith(heavy)))
"""


def test_python_dash_m_help_loads_no_driver_or_store() -> None:
    """As tests/cli/test_startup.py for fleetstore's commands: the harness's --help
    imports its work only when it runs."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True
    )
    assert "--agents" in done.stdout
    assert ast.literal_eval(done.stdout.strip().splitlines()[-1]) == []
