"""The docs are held to the code: examples run, settings and errors are all listed, links resolve.

Each test here can fail on a real drift between README.md / docs/ and src/fleetstore.
"""

from __future__ import annotations

import dataclasses
import re
import unicodedata
from pathlib import Path

import pytest

import fleetstore
from fleetstore import errors
from fleetstore.core.settings import env_var

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"
REFERENCE = DOCS / "reference.md"

# Pages whose ```python blocks are executed, in order, in one namespace per page.
RUNNABLE_PAGES = [README, DOCS / "quickstart.md"]

# The pages this file's author keeps; docs/cli.md and docs/benchmarks.md are kept by others.
OWN_PAGES = [
    "index.md",
    "quickstart.md",
    "design.md",
    "reference.md",
    "caveats.md",
    "glossary.md",
]

FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>```+|~~~+)(?P<info>[^\n`]*)$")
LINK = re.compile(
    r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?(?P<target>[^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)"
)
IMAGE = re.compile(r"!\[[^\]]*\]\(\s*<?(?P<target>[^)\s>]+)>?")
REF_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(?P<target>\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.M)


def markdown_pages() -> list[Path]:
    """README.md and every page under docs/, including ones other people own."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def code_blocks(text: str) -> list[tuple[str, str, int]]:
    """(info string, body, line number of the opening fence) for every fenced block."""
    blocks: list[tuple[str, str, int]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        fence, info, start = match["fence"], match["info"].strip(), i + 1
        body: list[str] = []
        i += 1
        while i < len(lines) and not re.match(rf"^ {{0,3}}{re.escape(fence)}\s*$", lines[i]):
            body.append(lines[i])
            i += 1
        blocks.append((info, "\n".join(body), start))
        i += 1
    return blocks


def prose(text: str, *, keep_code_spans: bool = False) -> str:
    """The page without its fenced code blocks (and, unless asked, its `code spans`), so
    links inside examples are not checked."""
    out: list[str] = []
    inside: str | None = None
    for line in text.splitlines():
        match = FENCE.match(line)
        if inside is None and match:
            inside = match["fence"]
            continue
        if inside is not None and re.match(rf"^ {{0,3}}{re.escape(inside)}\s*$", line):
            inside = None
            continue
        if inside is None:
            out.append(line)
    text = "\n".join(out)
    return text if keep_code_spans else re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*?|__?", "", heading.strip()).lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    kept = "".join(ch for ch in text if ch in " -_" or unicodedata.category(ch)[0] in ("L", "N"))
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in prose(path.read_text(encoding="utf-8"), keep_code_spans=True).splitlines():
        match = re.match(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        base = slug(match[1])
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


# --- README: the two commands come first -------------------------------------------------


def test_readme_shows_make_demo_and_make_test_before_any_other_code() -> None:
    blocks = [body for _, body, _ in code_blocks(README.read_text(encoding="utf-8"))]
    assert blocks, "README.md has no code blocks"

    def has(body: str, target: str) -> bool:
        return re.search(rf"^\s*make {target}\b", body, re.M) is not None

    first_other = next(
        (i for i, body in enumerate(blocks) if not has(body, "demo") and not has(body, "test")),
        len(blocks),
    )
    leading = blocks[:first_other]
    assert any(has(b, "demo") for b in leading), (
        "`make demo` must be in a code block before any other code block in README.md"
    )
    assert any(has(b, "test") for b in leading), (
        "`make test` must be in a code block before any other code block in README.md"
    )


def test_readme_commands_exist_in_the_makefile() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([A-Za-z][\w.-]*)\s*:(?!=)", makefile, re.M))
    text = README.read_text(encoding="utf-8")
    for page in [README, *DOCS.glob("*.md")]:
        for _, body, _ in code_blocks(page.read_text(encoding="utf-8")):
            for target in re.findall(r"^\s*make\s+([\w.-]+)", body, re.M):
                assert target in targets, f"{page.name}: `make {target}` is not a Makefile target"
    assert "make demo" in text and "make test" in text


def test_readme_demo_command_matches_the_makefile() -> None:
    """README quotes what `make demo` runs; keep the quote true to the Makefile."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    values = dict(re.findall(r"^(AGENTS|DURATION|THINK_MS)\s*\?=\s*(\S+)", makefile, re.M))
    recipe = re.search(r"^demo:.*\n\t(?P<cmd>.*)$", makefile, re.M)
    assert recipe, "Makefile has no demo recipe"
    command = recipe["cmd"].replace("$(BIN)/", "")
    for name, value in values.items():
        command = command.replace(f"$({name})", value)
    assert command in README.read_text(encoding="utf-8"), (
        f"README.md should quote the demo command exactly: {command}"
    )


# --- Examples run ------------------------------------------------------------------------


def python_blocks(path: Path) -> list[tuple[str, int]]:
    text = path.read_text(encoding="utf-8")
    return [
        (body, line) for info, body, line in code_blocks(text) if info.split()[:1] == ["python"]
    ]


@pytest.mark.parametrize("page", RUNNABLE_PAGES, ids=lambda p: p.name)
def test_python_examples_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = python_blocks(page)
    assert blocks, f"{page.name} has no ```python example"
    data_dir = tmp_path / "data"
    monkeypatch.setenv("FLEETSTORE_DATA_DIR", str(data_dir))
    for name in [f.name for f in dataclasses.fields(fleetstore.Settings)]:
        monkeypatch.delenv(env_var(name), raising=False)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)

    namespace: dict[str, object] = {"__name__": f"docs_{page.stem}"}
    try:
        for body, line in blocks:
            code = compile(body, f"{page.relative_to(ROOT)}:{line}", "exec")
            exec(code, namespace)
    finally:
        # An example that forgets to close its store must not leak into other tests.
        for value in list(namespace.values()):
            if isinstance(value, fleetstore.Database | fleetstore.Store):
                value.close()
    # Every file the examples made is private: sessions carry secrets.  Blob files
    # and spool journals (under <db>.blobs/ and <db>.spool/) are session content too.
    for made in [*work.rglob("*"), *(data_dir.rglob("*") if data_dir.exists() else [])]:
        private = re.search(r"\.db(-wal|-shm)?$|\.gate$", made.name) or any(
            re.search(r"\.(blobs|spool)$", parent.name) for parent in made.parents
        )
        if made.is_file() and private:
            assert made.stat().st_mode & 0o077 == 0, f"{made} is readable by others"


# --- Reference covers the code -----------------------------------------------------------


def reference_text() -> str:
    return REFERENCE.read_text(encoding="utf-8")


def table_rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.lstrip().startswith("|")]


@pytest.mark.parametrize("field", dataclasses.fields(fleetstore.Settings), ids=lambda f: f.name)
def test_every_setting_is_in_the_reference_with_its_env_var_and_default(
    field: dataclasses.Field[object],
) -> None:
    var = env_var(field.name)
    rows = [
        row
        for row in table_rows(reference_text())
        if re.search(rf"`{field.name}`", row) and var in row
    ]
    assert rows, f"docs/reference.md needs a settings table row with `{field.name}` and {var}"
    default = field.default
    spelled = {str(default), repr(default)}
    if isinstance(default, bool):
        spelled |= {str(default).lower()}
    if isinstance(default, int) and not isinstance(default, bool):
        spelled |= {f"{default:_}", f"{default:,}"}
    assert any(s in rows[0] for s in spelled), (
        f"the {field.name} row should show its default {default!r}: {rows[0]}"
    )


def test_reference_documents_no_setting_that_does_not_exist() -> None:
    """Every FLEETSTORE_* variable in README/docs (not the CLI page) is one the code reads."""
    known = {env_var(f.name) for f in dataclasses.fields(fleetstore.Settings)}
    for source in (ROOT / "src" / "fleetstore").rglob("*.py"):
        known |= set(re.findall(r"FLEETSTORE_[A-Z0-9_]+", source.read_text(encoding="utf-8")))
    ours = [README, *(DOCS / name for name in OWN_PAGES)]
    for page in ours:
        for var in set(re.findall(r"FLEETSTORE_[A-Z0-9_]+", page.read_text(encoding="utf-8"))):
            assert var in known, f"{page.name} mentions {var}, which nothing in src/ reads"


@pytest.mark.parametrize("name", errors.__all__)
def test_every_error_is_in_the_reference(name: str) -> None:
    assert re.search(rf"\b{name}\b", reference_text()), f"docs/reference.md never names {name}"


def error_tree() -> list[tuple[int, str]]:
    """(depth, class name) from the reference's error tree block (the one naming StoreBusy
    under TransientError)."""
    for info, body, _ in code_blocks(reference_text()):
        if info == "text" and body.lstrip().startswith("FleetstoreError"):
            rows = []
            for line in body.splitlines():
                match = re.match(r"^(?P<lead>[\s│├└─]*)(?P<name>[A-Z]\w+)", line)
                if match:
                    rows.append((len(match["lead"]) // 4, match["name"]))
            return rows
    raise AssertionError("docs/reference.md needs a ```text block starting with FleetstoreError")


def test_reference_error_tree_matches_the_class_hierarchy() -> None:
    rows = error_tree()
    parents: dict[int, str] = {}
    drawn: set[str] = set()
    for depth, name in rows:
        cls = getattr(errors, name, None)
        assert isinstance(cls, type), f"the error tree names {name}, which errors.py lacks"
        if depth > 0 and issubclass(cls, BaseException):
            parent = getattr(errors, parents[depth - 1])
            assert issubclass(cls, parent), f"the tree draws {name} under {parent.__name__}"
            direct = [b for b in cls.__mro__[1:] if b.__module__ == errors.__name__]
            assert direct and direct[0] is parent, (
                f"the tree draws {name} under {parent.__name__}, its nearest base is "
                f"{direct[0].__name__ if direct else None}"
            )
        parents[depth] = name
        drawn.add(name)
    exceptions = {n for n in errors.__all__ if issubclass(getattr(errors, n), BaseException)}
    assert exceptions <= drawn, f"missing from the error tree: {sorted(exceptions - drawn)}"


def test_reference_lists_every_metrics_and_connection_report_key(tmp_path: Path) -> None:
    text = reference_text()
    with fleetstore.Database.open(tmp_path / "m.db") as db:
        with db.write() as tx:
            tx.execute("CREATE TABLE t(v)")
        metrics = db.metrics()
        report = db.connection_report()
    keys = set(metrics)
    for value in metrics.values():
        if isinstance(value, dict):
            keys |= set(value)
    for entry in report:
        keys |= set(entry)
    missing = sorted(k for k in keys if f"`{k}`" not in text)
    assert not missing, f"docs/reference.md does not list these keys: {missing}"


def test_reference_lists_every_store_metrics_key(tmp_path: Path) -> None:
    """Store.metrics() adds the operation, spool and stream figures to the engine's."""
    with fleetstore.open(tmp_path / "s.db") as store:
        session = store.sessions.create(title="t")
        store.messages.append(session.id, "user", "hi")
        metrics = store.metrics()
    assert metrics["operations"], "no operation was counted"
    keys = set(metrics)
    for value in metrics.values():
        if isinstance(value, dict) and value is not metrics["operations"]:
            keys |= set(value)
    text = reference_text()
    missing = sorted(k for k in keys if f"`{k}`" not in text)
    assert not missing, f"docs/reference.md does not list these Store.metrics() keys: {missing}"


def test_reference_lists_every_operation() -> None:
    """Every registered operation is named, with whether applied_ops logs it."""
    from fleetstore.domain.registry import REGISTRY

    rows = table_rows(reference_text())
    for name, spec in REGISTRY.items():
        found = [row for row in rows if row.lstrip().startswith(f"| `{name}` |")]
        assert found, f"docs/reference.md needs an operations table row for `{name}`"
        marker = "applied_ops" if spec.logged else "not logged"
        assert marker in found[0], f"the `{name}` row should say `{marker}`: {found[0]}"


def test_reference_names_every_public_export() -> None:
    text = reference_text()
    missing = [n for n in fleetstore.__all__ if n != "__version__" and n not in text]
    assert not missing, f"docs/reference.md never names: {missing}"


# --- Links -------------------------------------------------------------------------------


def relative_links(path: Path) -> list[str]:
    text = prose(path.read_text(encoding="utf-8"))
    targets = [m["target"] for m in LINK.finditer(text)]
    targets += [m["target"] for m in IMAGE.finditer(text)]
    targets += [m["target"] for m in REF_DEF.finditer(text)]
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.I)]


@pytest.mark.parametrize("page", markdown_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    """docs/cli.md and docs/benchmarks.md are written by others; until they land, the links
    to them fail here on purpose: a link to a missing page is a broken link."""
    broken: list[str] = []
    for target in relative_links(page):
        file_part, _, fragment = target.partition("#")
        dest = page if not file_part else (page.parent / file_part).resolve()
        if not dest.exists():
            broken.append(f"{target} (no such file)")
            continue
        if fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{target} (no heading #{fragment} in {dest.name})")
    assert not broken, f"{page.relative_to(ROOT)}: broken links: {broken}"


def test_docs_index_links_every_page() -> None:
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    linked = {(DOCS / t.partition("#")[0]).resolve() for t in relative_links(DOCS / "index.md")}
    expected = {(DOCS / name).resolve() for name in [*OWN_PAGES, "cli.md", "benchmarks.md"]}
    expected.discard((DOCS / "index.md").resolve())
    missing = sorted(p.name for p in expected - linked)
    assert not missing, f"docs/index.md does not link: {missing}"
    for heading in ("Quickstart", "How-to", "Discussions", "Reference"):
        assert re.search(rf"^#+\s+{heading}\b", index, re.M | re.I), f"index lacks {heading}"


def test_readme_links_the_docs() -> None:
    linked = {t.partition("#")[0] for t in relative_links(README)}
    for name in ("docs/quickstart.md", "docs/reference.md", "docs/design.md", "docs/caveats.md"):
        assert name in linked, f"README.md does not link {name}"
