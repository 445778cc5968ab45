"""Hostile values for the public API, one kind per parameter type, and a snapshot of
everything a store holds (every row of every file, the blob and spool files), for
tests/domain/test_hostile_api.py and test_limits.py.

Each kind is a list of values that must be refused (tried one by one, so every one is
tried) and a hypothesis strategy that generates more of the same.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from fleetstore import File, NewEffect, Store, Text, ToolCall, ToolResult, Usage
from fleetstore.core.validate import MAX_METADATA, MAX_SHORT


class Opaque:
    """No type the API knows."""

    def __repr__(self) -> str:
        return "Opaque()"


LONE = "a\ud800b"  # a lone surrogate: not UTF-8
HUGE = [2**63, 2**64, -(2**63) - 1, 10**400]
NOT_NUMBERS = [None, "1", b"1", [1], {"a": 1}, Opaque(), True, False]
NOT_FINITE = [math.nan, math.inf, -math.inf]


@dataclass(frozen=True)
class Kind:
    """Values a parameter must refuse."""

    values: tuple[Any, ...]
    strategy: st.SearchStrategy[Any]

    def __or__(self, other: Kind) -> Kind:
        return Kind(self.values + other.values, self.strategy | other.strategy)


def kind(values: Sequence[Any], strategy: st.SearchStrategy[Any] | None = None) -> Kind:
    values = tuple(values)
    return Kind(values, strategy if strategy is not None else st.sampled_from(values))


def _not_str_strategy() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.integers(),
        st.floats(),
        st.binary(max_size=4),
        st.lists(st.text(max_size=2), max_size=2),
        st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
        st.builds(Opaque),
    )


NOT_STR = kind([5, 1.5, b"abc", ["a"], {"a": 1}, Opaque(), True], _not_str_strategy())
BAD_TEXT = kind([LONE, "\x00", "a\x00b", "\udfff"], st.sampled_from([LONE, "\x00", "\udc80x"]))


def short(limit: int = MAX_SHORT, *, optional: bool = True) -> Kind:
    """A string of at most *limit* characters (None allowed when *optional*)."""
    long = kind(["x" * (limit + 1)], st.integers(1, 3).map(lambda n: "é" * (limit + n)))
    found = NOT_STR | BAD_TEXT | long
    return found if optional else found | kind([None])


def nonempty(limit: int = MAX_SHORT, *, optional: bool = True) -> Kind:
    return short(limit, optional=optional) | kind([""])


IDS = kind(
    ["", "a/b", "x" * 129, "a\\b", "tab\tin", "\x00", LONE, "\n"],
    st.sampled_from(["", "/", "x" * 200]) | st.text(alphabet="/\\\x00\n", min_size=1, max_size=3),
)
OPT_ID = NOT_STR | IDS
ID = OPT_ID | kind([None])


def integer(minimum: int, maximum: int = 2**63 - 1, *, optional: bool = False) -> Kind:
    out = [minimum - 1, 1.0, 1.5, "1", b"1", [1], True, *HUGE, math.nan]
    if maximum < 2**63 - 1:
        out.append(maximum + 1)
    if not optional:
        out.append(None)
    generated = st.integers(max_value=minimum - 1) | st.integers(min_value=maximum + 1)
    return kind(out, generated | st.floats() | st.booleans())


def number(minimum: float, maximum: float, *, optional: bool = False) -> Kind:
    out: list[Any] = [*NOT_FINITE, *HUGE, minimum - 1, maximum * 2 + 1, "1", b"1", [1.0]]
    out += [True, Opaque()]
    if not optional:
        out.append(None)
    generated = (
        st.floats(max_value=minimum, exclude_max=True)
        | st.floats(min_value=maximum, exclude_min=True)
        | st.integers(min_value=int(maximum) + 1)
    )
    return kind(out, generated | st.text(max_size=3))


BOOL = kind([None, 0, 1, "true", "", [], 1.0], st.integers() | st.text(max_size=2) | st.none())
OPT_BOOL = kind([0, 1, "true", "", [], 1.0], st.integers() | st.text(max_size=2))

_DEEP: list[Any] = []
_cursor = _DEEP
for _ in range(5000):
    _cursor.append([])
    _cursor = _cursor[0]

NOT_JSON = [
    Opaque(),
    {"a": Opaque()},
    {"a": math.nan},
    {"a": math.inf},
    {"a": b"bytes"},
    {"a": {1, 2}},
    {LONE: 1},
    {"a": LONE},
    {"a": 10**5000},
    {"a": _DEEP},
]


def metadata(limit: int = MAX_METADATA) -> Kind:
    """A JSON object whose text is at most *limit* bytes (None allowed)."""
    values = [
        5,
        "text",
        b"bytes",
        ["a", 1],
        {1: 2},
        {("t",): 1},
        *NOT_JSON,
        {"k": "x" * limit},  # its JSON text is just past the limit
        {"k": "é" * (limit // 2)},
        {"k": "\x01" * (limit // 6 + 1)},  # small in memory, escaped past the limit
    ]
    return kind(values)


JSON_VALUE = kind([*NOT_JSON[:-2], {"a": _DEEP}])
ITERABLE_OF_STR = kind(
    ["kx", "", b"kx", 5, [5], [None], [""], ["x" * 300], [LONE], ["\x00"], Opaque(), {"k": 1}],
    st.text(max_size=4) | st.lists(st.integers(), min_size=1, max_size=2),
)

BIG = "x" * (80 * 1024)  # over blob_threshold: becomes a blob file if accepted
PARTS = kind(
    [
        5,
        None,
        b"bytes",
        {"a": 1},
        [5],
        [None],
        ["text"],
        [Text(5)],  # type: ignore[arg-type]
        [Text(LONE)],
        [Text("\x00" + BIG), Text(5)],  # type: ignore[arg-type]
        [Text(BIG), ToolCall(5)],  # type: ignore[arg-type]
        [ToolCall("t", Opaque())],
        [ToolCall("t", {"a": 1}, call_id=5)],  # type: ignore[arg-type]
        [ToolCall("x" * (MAX_SHORT + 1), {"a": 1})],
        [ToolCall("t", {"a": 1}, call_id="x" * (MAX_SHORT + 1))],
        [ToolResult(5, "out")],  # type: ignore[arg-type]
        [ToolResult("c", 5)],  # type: ignore[arg-type]
        [ToolResult("c", "out", is_error=5)],  # type: ignore[arg-type]
        [ToolResult("c", BIG, name="x" * (MAX_SHORT + 1))],
        [File("text")],  # type: ignore[arg-type]
        [File(b"d", mime_type=5)],  # type: ignore[arg-type]
        [File(BIG.encode(), name=LONE)],
        [File(b"d", mime_type="x" * 257)],
        LONE,
        "x" * (2 * 1024 * 1024),  # over max_payload_bytes (the tests' stores: 1 MiB)
    ]
)
PART = kind(
    [
        5,
        None,
        "text",
        Text(5),  # type: ignore[arg-type]
        ToolCall(5),  # type: ignore[arg-type]
        ToolCall("t", Opaque()),
        ToolResult("c", BIG, is_error=5),  # type: ignore[arg-type]
        ToolResult("c", BIG, name="x" * (MAX_SHORT + 1)),
        File(BIG),  # type: ignore[arg-type]
        File(BIG.encode(), name=5),  # type: ignore[arg-type]
        Usage(),
    ]
)
USAGE = kind(
    [
        5,
        "x",
        [1],
        {"input_tokens": -1},
        {"input_tokens": 2**63},
        {"input_tokens": 10**400},
        {"output_tokens": 1.5},
        {"input_tokens": "1"},
        {"input_tokens": True},
        {"cost": math.nan},
        {"cost": math.inf},
        {"cost": -1.0},
        {"cost": 10**400},
        {"cost": "1"},
        {"bogus": 1},
        {5: 1},
        Usage(input_tokens=2**63),
        Usage(cost=math.nan),
        Usage(input_tokens="1"),  # type: ignore[arg-type]
    ]
)
PAYLOAD = kind([*NOT_JSON[:-1], LONE, "x" * (2 * 1024 * 1024)])


def _effect(**changes: Any) -> NewEffect:
    base: dict[str, Any] = {"thread_key": "t-hostile", "kind": "k", "payload": {"a": 1}}
    return NewEffect(**{**base, **changes})


EFFECTS = kind(
    [
        5,
        "ab",
        _effect(),
        {"a": 1},
        [5],
        [None],
        [{"thread_key": "t", "kind": "k"}],
        [_effect(thread_key=5)],
        [_effect(thread_key="")],
        [_effect(kind="x" * 257)],
        [_effect(payload=Opaque())],
        [_effect(payload={"a": math.nan})],
        [_effect(delay=math.nan)],
        [_effect(delay=-1)],
        [_effect(delay=10**400)],
        [_effect(max_attempts=0)],
        [_effect(max_attempts=2**63)],
        [_effect(replay_safe=1)],
        [_effect(idempotency_key="")],
        [_effect(idempotency_key=5)],
        [_effect(id="a/b")],
        [_effect(payload=BIG), _effect(kind=5)],
        [_effect(payload=BIG.encode()), _effect(delay=math.inf)],
    ]
)
TIMEOUT = number(0.0, 366 * 86400.0)
OPT_TIMEOUT = number(0.0, 366 * 86400.0, optional=True)
CALLABLE = kind([None, 5, "fn", Opaque()])


# -- what a store holds ---------------------------------------------------------------------


def tables(db: Any) -> dict[str, list[tuple[Any, ...]]]:
    def run(tx: Any) -> dict[str, list[tuple[Any, ...]]]:
        names = [
            r[0]
            for r in tx.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' "
                "AND name NOT LIKE 'sqlite_%' ORDER BY name"
            )
        ]
        return {n: sorted(map(tuple, tx.execute(f'SELECT * FROM "{n}"')), key=repr) for n in names}

    result: dict[str, list[tuple[Any, ...]]] = db.read(run)
    return result


def files_under(directory: Path) -> list[tuple[str, int]]:
    if not directory.exists():
        return []
    return sorted(
        (str(p.relative_to(directory)), p.stat().st_size)
        for p in directory.rglob("*")
        if p.is_file()
    )


def snapshot(store: Store) -> dict[str, Any]:
    """Every row of every file of *store* (SQLite layouts), and its blob and spool files."""
    found: dict[str, Any] = {}
    if store.router is None:
        found["main"] = tables(store.db)
    else:

        def collect(key: str | None, db: Any) -> None:
            found[f"shard {key}" if key else "catalog"] = tables(db)

        store.router.each(collect)
    found["blobs"] = files_under(Path(str(store.path) + ".blobs"))
    found["spool"] = [f for f in files_under(store.spool_dir) if not f[0].endswith(".lock")]
    return found


def blob_files(store: Store) -> list[tuple[str, int]]:
    return files_under(Path(str(store.path) + ".blobs"))


__all__ = ["Kind", "Opaque", "snapshot"]

Call = Callable[..., Any]
