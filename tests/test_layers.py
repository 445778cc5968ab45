"""docs/design.md, "Layers": one folder per layer, enforced.

import-linter (`.importlinter`, run by `make lint`) holds the contracts: the layers
and the forbidden imports.  These tests run it too, and check what it does not: no
import cycle of any kind (module level, TYPE_CHECKING and function-local imports
alike), no module over 1,000 lines, and that the layer map in `.importlinter` and
the file tree in docs/design.md are the code's.
"""

from __future__ import annotations

import ast
import configparser
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

import fleetstore

DRIVERS = {"apsw", "sqlite3", "psycopg", "psycopg_pool"}
PACKAGE = Path(fleetstore.__file__).parent
ROOT = PACKAGE.parent.parent
#: The stress harness, a distribution of its own (stress/, issue 26): held to the same
#: rules (no cycle, no module over 1,000 lines, its tree in docs/design.md).
HARNESS = ROOT / "stress" / "src" / "fleetstore_stress"
MAX_LINES = 1000


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def test_import_linter_contracts_are_kept() -> None:
    done = subprocess.run(
        [str(Path(sys.executable).with_name("lint-imports")), "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout, done.stdout


def test_the_layer_map_names_every_folder_of_the_package() -> None:
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    layers = config["importlinter:contract:layers"]["layers"].split()
    top = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    top |= {p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__")}
    assert sorted(layers) == sorted(top), "every folder (and root module) is one layer"


def _cycles(package: str) -> list[list[str]]:
    graph = grimp.build_graph(package, include_external_packages=False)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.find_modules_directly_imported_by(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    # Restored after: a limit left raised lets tests/domain/test_hostile_api.py's
    # deeply nested values through (they are refused by a RecursionError).
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for module in sorted(graph.modules):
            if module not in index:
                visit(module)
    finally:
        sys.setrecursionlimit(limit)
    return found


def test_no_import_cycle_of_any_kind() -> None:
    # grimp reads every import statement: module level, under TYPE_CHECKING and
    # inside functions (the function-local imports that used to dodge cycles).
    assert _cycles("fleetstore") == []
    assert _cycles("fleetstore_stress") == []


def test_the_cycle_check_sees_function_local_and_type_checking_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "cyc"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from cyc import b\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from cyc import a\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        assert _cycles("cyc") == [["cyc.a", "cyc.b"]]
    finally:
        sys.path.remove(str(tmp_path))


def test_no_module_is_over_1000_lines() -> None:
    sizes = {
        str(p.relative_to(ROOT)): len(p.read_text().splitlines())
        for package in (PACKAGE, HARNESS)
        for p in package.rglob("*.py")
    }
    assert {k: v for k, v in sizes.items() if v > MAX_LINES} == {}
    assert max(sizes.values()) > 100  # the count sees the files


def tree_named(marker: str) -> set[str]:
    """The paths docs/design.md's tree between two *marker* comments names."""
    text = (ROOT / "docs" / "design.md").read_text()
    block = text.split(marker, 2)[1]
    named: set[str] = set()
    folder: list[str] = []
    for line in block.splitlines():
        if not line.startswith("  ") or not line.strip():
            continue
        depth = (len(line) - len(line.lstrip()) - 2) // 2
        tokens = line.split()
        # A line of file names only lists several files of one folder.
        names = tokens if all(t.endswith(".py") for t in tokens) else tokens[:1]
        folder = folder[:depth]
        for name in names:
            if name.endswith("/"):
                folder.append(name.rstrip("/"))
            else:
                named.add("/".join([*folder, name]))
    return named


@pytest.mark.parametrize(
    ("marker", "package"),
    [("<!-- layer-tree -->", PACKAGE), ("<!-- stress-tree -->", HARNESS)],
    ids=["fleetstore", "fleetstore_stress"],
)
def test_design_md_file_tree_is_the_code(marker: str, package: Path) -> None:
    """Every module of the package appears in docs/design.md's tree, and every path
    the tree names exists."""
    named = tree_named(marker)
    actual = {str(p.relative_to(package)) for p in package.rglob("*.py")}
    assert sorted(actual - named) == [], "modules missing from docs/design.md's tree"
    assert sorted(named - actual) == [], "docs/design.md names modules that do not exist"


def test_only_engine_modules_import_a_driver() -> None:
    # files/ (SQLite files from outside the write path) may import apsw, nothing else.
    allowed = {"engine": DRIVERS, "files": {"apsw"}}
    offenders = {
        str(path.relative_to(PACKAGE)): sorted(
            imported_modules(path)
            & DRIVERS - allowed.get(path.relative_to(PACKAGE).parts[0], set())
        )
        for path in PACKAGE.rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}
    # The check can see an import at all: the engine and files do import apsw.
    assert "apsw" in imported_modules(PACKAGE / "engine" / "sqlite.py")
    assert "apsw" in imported_modules(PACKAGE / "files" / "inspect.py")


def test_stdlib_sqlite3_is_never_imported_by_the_package() -> None:
    # Two SQLite libraries in one process drop each other's POSIX locks
    # (sqlite.org/howtocorrupt.html 2.2.1).  The harness's peers use it only through
    # the libraries they replay, in agent processes of their own.
    users = [
        p
        for package in (PACKAGE, HARNESS)
        for p in package.rglob("*.py")
        if "sqlite3" in imported_modules(p)
    ]
    assert users == []
    assert "apsw" in imported_modules(HARNESS / "patterns" / "plain.py")  # the check reads it


def test_psycopg_is_loaded_only_for_a_postgresql_store() -> None:
    """psycopg is an extra (fleetstore[postgres]): a SQLite-only install imports the
    package, opens stores and runs the CLI without it."""
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
