"""The named queries: each written once in sql/common/, a dialect's file holding only
what it does differently (issue 26: 140 of 225 shared queries were kept as two equal
copies, and one text had two names).

The loader refuses the copies; these tests show each refusal on a folder of their own,
and that the shipped folders load with every common query still used by a dialect.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from fleetstore import sql


def _tree(root: Path, files: dict[str, str]) -> Path:
    for folder in ("common", "sqlite", "postgresql"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (root / name).write_text(text)
    return root


COMMON = """\
-- Preamble: a comment, no query.

-- one: the first
SELECT 1 FROM sessions WHERE id = ?

-- two: the second
SELECT 2 FROM sessions WHERE id = ?
"""


def test_a_dialect_query_replaces_the_common_one_of_its_name(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "common/a.sql": COMMON,
            "sqlite/a.sql": "-- two: SQLite's\nSELECT 22 FROM sessions WHERE id = ?1\n\n"
            "-- fts5_x: only here\nSELECT 3\n",
            "sqlite/schema.sql": "-- not_a_query: schema.sql is not read\nCREATE TABLE t (x)\n",
        },
    )
    assert sql.merge(root, "sqlite") == {
        "one": "SELECT 1 FROM sessions WHERE id = ?",
        "two": "SELECT 22 FROM sessions WHERE id = ?1",
        "fts5_x": "SELECT 3",
    }
    assert sql.merge(root, "postgresql") == {
        "one": "SELECT 1 FROM sessions WHERE id = ?",
        "two": "SELECT 2 FROM sessions WHERE id = ?",
    }


@pytest.mark.parametrize(
    ("files", "error"),
    [
        # an override that overrides nothing: the copy kept equal by hand
        (
            {"sqlite/a.sql": "-- two: the same\nSELECT 2 FROM sessions WHERE id = ?\n"},
            "'two' is the same as in sql/common/",
        ),
        (
            {
                "sqlite/a.sql": "-- two: laid out\nSELECT 2\n  -- a comment\n  FROM sessions WHERE id = ?"
            },
            "'two' is the same as in sql/common/",
        ),
        # a misspelt override would add a query nobody calls and leave the common one
        (
            {"sqlite/a.sql": "-- tow: misspelt\nSELECT 22 FROM sessions\n"},
            "'tow' replaces no query of sql/common/a.sql",
        ),
        # an override in another file than its common query
        (
            {"sqlite/b.sql": "-- two: elsewhere\nSELECT 22 FROM sessions\n"},
            "'two' replaces no query of sql/common/b.sql",
        ),
        # another dialect's prefix is no licence
        (
            {"sqlite/a.sql": "-- tsv_x: PostgreSQL's\nSELECT 3\n"},
            "'tsv_x' replaces no query",
        ),
        ({"common/b.sql": "-- fts5_x: a dialect's own\nSELECT 3\n"}, "'fts5_x' duplicated or a"),
        ({"common/b.sql": "-- one: again\nSELECT 11\n"}, "'one' duplicated"),
        ({"sqlite/a.sql": "-- fts5_x: twice\nSELECT 3\n-- fts5_x: twice\nSELECT 4\n"}, "dupl"),
        ({"sqlite/a.sql": "-- two: empty\n\n-- one: x\nSELECT 9\n"}, "'two' duplicated or empty"),
        # one text, two names: in common, or made so by an override
        (
            {"common/b.sql": "-- three: the first again\nSELECT 1 FROM sessions WHERE id = ?\n"},
            "one query",
        ),
        (
            {"sqlite/a.sql": "-- two: as one\nSELECT 1 FROM sessions WHERE id = ?\n"},
            "'one' and 'two' are one query",
        ),
        (
            {"common/b.sql": "-- three: again\nSELECT 1\nFROM sessions\nWHERE id = ?\n"},
            "'one' and 'three' are one query",
        ),
    ],
)
def test_a_copy_kept_by_hand_is_refused(tmp_path: Path, files: dict[str, str], error: str) -> None:
    root = _tree(tmp_path, {"common/a.sql": COMMON, **files})
    with pytest.raises(ValueError, match=error):
        sql.merge(root, "sqlite")
    assert sql.merge(_tree(tmp_path / "clean", {"common/a.sql": COMMON}), "sqlite")


def test_an_unknown_dialect_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no SQL dialect 'mysql'"):
        sql.merge(_tree(tmp_path, {"common/a.sql": COMMON}), "mysql")


def test_the_shipped_queries_load_and_every_common_query_is_used(tmp_path: Path) -> None:
    """Each dialect loads (the loader's refusals pass on the real files), and no common
    text is replaced in every dialect (it would be dead, a copy nobody runs)."""
    merged = {d: sql.queries(d) for d in sql.DIALECT_ONLY}
    shutil.copytree(Path(sql.__file__).parent / "common", tmp_path / "common")
    (tmp_path / "sqlite").mkdir()
    common = sql.merge(tmp_path, "sqlite")  # common/ alone
    assert len(common) > 150
    dead = [n for n, text in common.items() if all(q[n] != text for q in merged.values())]
    assert dead == []
