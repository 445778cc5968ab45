"""DESIGN.md, "Layers": nothing above engine/ imports a database driver."""

from __future__ import annotations

import ast
from pathlib import Path

import fleetstore

DRIVERS = {"apsw", "sqlite3", "psycopg", "psycopg_pool"}
PACKAGE = Path(fleetstore.__file__).parent


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def test_only_engine_modules_import_a_driver() -> None:
    offenders = {
        str(path.relative_to(PACKAGE)): sorted(imported_modules(path) & DRIVERS)
        for path in PACKAGE.rglob("*.py")
        if "engine" not in path.relative_to(PACKAGE).parts
    }
    assert {k: v for k, v in offenders.items() if v} == {}
    # The check can see an import at all: the engine does import its driver.
    assert "apsw" in imported_modules(PACKAGE / "engine" / "sqlite.py")


def test_stdlib_sqlite3_is_never_imported_by_the_package() -> None:
    # Two SQLite libraries in one process drop each other's POSIX locks
    # (sqlite.org/howtocorrupt.html 2.2.1).
    users = [p for p in PACKAGE.rglob("*.py") if "sqlite3" in imported_modules(p)]
    assert users == []


def test_psycopg_is_loaded_only_for_a_postgresql_store() -> None:
    """psycopg is an extra (fleetstore[postgres]): a SQLite-only install imports the
    package, opens stores and runs the CLI without it."""
    import subprocess
    import sys

    assert "psycopg" in imported_modules(PACKAGE / "engine" / "postgres.py")
    code = (
        "import sys, tempfile, os, fleetstore, fleetstore.cli\n"
        "s = fleetstore.open(os.path.join(tempfile.mkdtemp(), 's.db'))\n"
        "s.sessions.create(title='t'); s.close()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('psycopg', 'psycopg_pool')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout
