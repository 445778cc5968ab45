"""Export, import and merge (fleetstore.transfer and its commands).

Real stores under tmp_path, real subprocesses for the CLI and for stores written by
other processes.  Every database read here goes through fleetstore (apsw): the test
process never opens a store with the stdlib ``sqlite3`` (DESIGN.md, "Two SQLite
libraries in one process").
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zstandard

import fleetstore
from fleetstore import File, Reasoning, Text, ToolCall, ToolResult
from fleetstore.errors import AlreadyExists, InvalidArchive, NotFound
from fleetstore.store.facade import Store
from fleetstore.transfer.digest import session_digest
from fleetstore.transfer.export import export_store
from fleetstore.transfer.format import VERSION
from fleetstore.transfer.importing import import_file
from fleetstore.transfer.merge import merge

ROOT = Path(__file__).resolve().parents[2]

# Every table, in a fixed order: dumps compare whole stores.
TABLES = {
    "sessions": "id",
    "messages": "id",
    "parts": "message_id, seq",
    "chunks": "message_id, part_seq, seq",
    "usage": "message_id",
    "state": "session_id, namespace, key",
    "blobs": "sha256",
    "applied_ops": "op_id",
}
CONTENT = ("sessions", "messages", "parts", "chunks", "usage", "state")


def dump(store: Store, tables: Any = TABLES) -> dict[str, list[tuple[Any, ...]]]:
    def run(tx: Any) -> dict[str, list[tuple[Any, ...]]]:
        return {t: tx.execute(f"SELECT * FROM {t} ORDER BY {TABLES[t]}") for t in tables}

    return store.read(run)


def blob_dir(store: Store) -> list[tuple[str, int, int, str]]:
    """Every file under the blob directory: name, size, mtime and a hash of its bytes."""
    d = store.blobs.directory
    if not d.exists():
        return []
    return sorted(
        (
            str(p.relative_to(d)),
            p.stat().st_size,
            p.stat().st_mtime_ns,
            hashlib.sha256(p.read_bytes()).hexdigest(),
        )
        for p in d.rglob("*")
        if p.is_file()
    )


def everything(store: Store) -> dict[str, Any]:
    """Sessions, messages and state as the API returns them."""
    out: dict[str, Any] = {}
    for s in store.sessions.list(include_archived=True, limit=10_000):
        keys = {ns: store.state.keys(s.id, namespace=ns) for ns in ("default", "agent")}
        out[s.id] = (
            s,
            store.messages.list(s.id),
            {ns: [store.state.get(s.id, k, namespace=ns) for k in ks] for ns, ks in keys.items()},
        )
    return out


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[Callable[..., Store]]:
    """``stores(name, **settings)`` opens tmp_path/name; all are closed at the end."""
    opened: list[Store] = []

    def _open(name: str, **settings: Any) -> Store:
        store = fleetstore.open(tmp_path / name, **settings)
        opened.append(store)
        return store

    yield _open
    for store in opened:
        store.close()


def fill(store: Store) -> dict[str, str]:
    """A store with everything a round trip must keep: subagent trees, forks, archived and
    updated sessions, every part kind, blobs, streamed messages (finished, failed and one
    left streaming), usage, state of both encodings (inline and blob), and more messages
    than one read page holds."""
    root = store.sessions.create(
        title="fix flaky test", project="/src/app", metadata={"ü": [1, 2.5, None], "k": "v"}
    )
    user = store.messages.append(root.id, "user", "why does it flake? ✓", metadata={"n": 1})
    store.messages.append(
        root.id,
        "assistant",
        [
            Text("inline"),
            Reasoning("because"),
            ToolCall("bash", {"cmd": "pytest -x"}, call_id="c1"),
            ToolResult("c1", b"\x00\x01binary" * 10, is_error=True, name="bash"),
            ToolResult("c2", "x" * 5000, name="read"),  # a blob (threshold 1024)
            File(os.urandom(3000), "image/png", "shot.png"),  # a blob of bytes
        ],
        model="m-1",
        usage={"input_tokens": 10, "output_tokens": 3, "cache_read_tokens": 2, "cost": 0.25},
    )
    with store.messages.stream(root.id, model="m-2") as reply:
        for i in range(50):
            reply.text(f"delta {i} ")
        reply.reasoning("hmm " * 100)
        call = reply.tool_call("grep", {"pattern": "flaky"})
        call.result("match\n" * 1000)
        reply.text("the end")
        reply.usage(input_tokens=1200, output_tokens=310, reasoning_tokens=7, cost=0.01)
    with pytest.raises(RuntimeError), store.messages.stream(root.id, model="m-2") as failing:
        failing.text("half an answer")
        raise RuntimeError("model went away")
    sub = store.sessions.create(parent_id=root.id, title="subagent")
    store.messages.append(sub.id, "assistant", "sub answer")
    subsub = store.sessions.create(parent_id=sub.id, title="sub-subagent")
    store.messages.append(subsub.id, "user", "deep")
    fork = store.sessions.fork(root.id, at_message_id=user.id, title="the fork")
    store.messages.append(fork.id, "user", "another way")
    archived = store.sessions.create(title="old", project="/src/old")
    store.messages.append(archived.id, "user", "bye")
    store.sessions.archive(archived.id)
    store.sessions.update(root.id, title="fixed flaky test", metadata={"done": True})
    store.state.put(root.id, "cursor", {"seq": 3, "ünï": "côdé"})
    store.state.put(root.id, "cursor", {"seq": 4})  # version 2
    store.state.put(root.id, "snapshot", b"\x00" * 4000, namespace="agent")  # a blob
    store.state.put(sub.id, "raw", b"\x01\x02")
    long = store.sessions.create(title="long")
    for i in range(205):  # more than one page of 200
        store.messages.append(long.id, "user" if i % 2 else "assistant", f"m{i}")
    open_stream = store.messages.stream(long.id, model="m-3")
    open_stream.open()
    open_stream.text("still being written")
    open_stream.flush()
    store.streams_closed(open_stream)  # left streaming, as by a process that died
    return {
        "root": root.id,
        "sub": sub.id,
        "subsub": subsub.id,
        "fork": fork.id,
        "archived": archived.id,
        "long": long.id,
    }


def load(path: Path) -> list[dict[str, Any]]:
    """The records of an export file, header and trailer included."""
    data = path.read_bytes()
    text = zstandard.ZstdDecompressor().decompressobj().decompress(data)
    return [json.loads(line) for line in text.splitlines()]


def save(path: Path, records: list[Any], *, fix_trailer: bool = True) -> Path:
    """Write records as an export file; with *fix_trailer*, the last record is replaced by a
    trailer that matches (so that a test's flaw is the only one)."""
    lines = [
        r
        if isinstance(r, bytes)
        else json.dumps(r, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
        for r in records
    ]
    if fix_trailer:
        body = lines[:-1]
        middle = records[1:-1]
        end = {
            "records": len(middle),
            "blobs": len({r["blob"] for r in middle if isinstance(r, dict) and "blob" in r}),
            "ops": sum(1 for r in middle if isinstance(r, dict) and "op" in r),
            "sha256": hashlib.sha256(b"".join(body)).hexdigest(),
        }
        lines = [*body, json.dumps({"end": end}).encode() + b"\n"]
    path.write_bytes(zstandard.ZstdCompressor().compress(b"".join(lines)))
    return path


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSTORE_")}
    env.update(extra)
    return env


def cli(
    *args: str, input: bytes | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "fleetstore", *args],
        capture_output=True,
        input=input,
        timeout=120,
        env=env or clean_env(),
    )


# --- round trips ----------------------------------------------------------------------------


def test_round_trip_is_exact(stores: Callable[..., Store], tmp_path: Path) -> None:
    src = stores("src.db", blob_threshold=1024)
    ids = fill(src)
    file = tmp_path / "all.jsonl.zst"
    summary = export_store(src, file)
    assert summary.sessions == 6 and summary.messages == 4 + 1 + 1 + 2 + 1 + 206
    assert summary.blobs == 4  # the read output, the file, the grep output, the state snapshot

    dst = stores("dst.db")
    imported = import_file(dst, file)
    assert (imported.sessions, imported.messages, imported.states) == (6, 215, 3)
    assert imported.inserted == 6 + 215 + 3 and imported.new_blobs == 4

    assert everything(dst) == everything(src)
    assert dump(dst, CONTENT) == dump(src, CONTENT)
    blobs = "SELECT sha256, size, stored_size, codec FROM blobs ORDER BY sha256"
    assert dst.read(lambda tx: tx.execute(blobs)) == src.read(lambda tx: tx.execute(blobs))
    assert all(dst.blobs.verify(sha) for sha in summary.blob_shas)
    for sid in ids.values():
        assert session_digest(dst, sid) == summary.digests[sid]
    # What the API shows, spelled out for the cases that are easy to lose.
    assert dst.sessions.get(ids["subsub"]).root_id == ids["root"]
    assert dst.sessions.get(ids["fork"]).forked_from == ids["root"]
    assert dst.sessions.get(ids["archived"]).status == "archived"
    assert dst.sessions.get(ids["root"]).version == 2
    last = dst.messages.list(ids["long"], last=1)[0]
    assert (last.status, last.text) == ("streaming", "still being written")
    statuses = [m.status for m in dst.messages.list(ids["root"])]
    assert statuses == ["complete", "complete", "complete", "error"]
    assert dst.state.get(ids["root"], "snapshot", namespace="agent").value == b"\x00" * 4000


def test_importing_twice_changes_nothing(stores: Callable[..., Store], tmp_path: Path) -> None:
    src = stores("src.db", blob_threshold=1024)
    fill(src)
    file = tmp_path / "all.jsonl.zst"
    export_store(src, file)
    dst = stores("dst.db")
    import_file(dst, file)
    before, files = dump(dst), blob_dir(dst)
    again = import_file(dst, file)
    assert dump(dst) == before  # every table, applied_ops and blob rows included
    assert blob_dir(dst) == files
    assert (again.inserted, again.updated, again.newer, again.new_blobs) == (0, 0, 0, 0)
    assert again.unchanged == 6 + 215 + 3
    # A fresh export of the same store (new operation ids) changes nothing either,
    # and neither does importing a store's export into itself.
    export_store(dst, tmp_path / "again.jsonl.zst")
    import_file(dst, tmp_path / "again.jsonl.zst")
    own = dump(src)
    import_file(src, file)
    assert dump(dst) == before and dump(src) == own


def test_export_of_chosen_sessions_takes_their_subagent_trees(
    stores: Callable[..., Store], tmp_path: Path
) -> None:
    src = stores("src.db", blob_threshold=1024)
    ids = fill(src)
    summary = export_store(src, tmp_path / "tree.jsonl.zst", [ids["sub"], ids["archived"]])
    assert set(summary.digests) == {ids["sub"], ids["subsub"], ids["archived"]}
    assert not summary.whole_store
    with pytest.raises(NotFound, match="no session 'nope'"):
        export_store(src, tmp_path / "nope.jsonl.zst", ["nope"])
    assert not (tmp_path / "nope.jsonl.zst").exists()

    # A subagent's parent must be in the file or already in the store.
    empty = stores("empty.db")
    with pytest.raises(InvalidArchive, match=rf"its parent {ids['root']} is neither in the file"):
        import_file(empty, tmp_path / "tree.jsonl.zst")
    assert empty.sessions.list(include_archived=True) == []
    holder = stores("holder.db")
    export_store(src, tmp_path / "root.jsonl.zst", [ids["root"]])
    import_file(holder, tmp_path / "root.jsonl.zst")
    import_file(holder, tmp_path / "tree.jsonl.zst")
    assert holder.messages.list(ids["subsub"]) == src.messages.list(ids["subsub"])
    assert holder.sessions.get(ids["archived"]) == src.sessions.get(ids["archived"])


def test_big_payloads_are_exported_as_blobs_and_long_streams_split(
    stores: Callable[..., Store], tmp_path: Path
) -> None:
    # Inline payloads over 1 MiB (a store with a high blob_threshold), a streamed part
    # with one 9 MiB chunk, and a stream of 5 MiB in 40 chunks: no line gets long.
    src = stores("src.db", blob_threshold=64 * 1024 * 1024)
    s = src.sessions.create(title="big")
    inline = src.messages.append(s.id, "tool", [ToolResult("c", "r" * (1536 * 1024))])
    with src.messages.stream(s.id) as reply:
        reply.text("y" * (9 * 1024 * 1024))
    with src.messages.stream(s.id) as reply:
        for i in range(40):
            reply.text(chr(ord("a") + i % 26) * (128 * 1024))
    file = tmp_path / "big.jsonl.zst"
    export_store(src, file)
    records = load(file)
    assert max(len(json.dumps(r)) for r in records) < 8 * 1024 * 1024
    assert sum(1 for r in records if r.get("op") == "import_parts") >= 1

    dst = stores("dst.db")
    import_file(dst, file)
    assert dst.messages.list(s.id) == src.messages.list(s.id)
    assert session_digest(dst, s.id) == session_digest(src, s.id)
    part = "SELECT enc, blob_sha IS NOT NULL FROM parts WHERE message_id = ? ORDER BY seq"
    assert src.read(lambda tx: tx.execute(part, (inline.id,))) == [("str", 0)]
    assert dst.read(lambda tx: tx.execute(part, (inline.id,))) == [("str", 1)]
    chunks = "SELECT * FROM chunks ORDER BY message_id, part_seq, seq"
    streamed = [r for r in src.read(lambda tx: tx.execute(chunks)) if len(r[3]) < 1024 * 1024]
    assert [r for r in dst.read(lambda tx: tx.execute(chunks))] == streamed
    before = dump(dst)
    assert import_file(dst, file).inserted == 0
    assert dump(dst) == before


def test_a_later_export_brings_the_store_forward_and_an_older_one_changes_nothing(
    stores: Callable[..., Store], tmp_path: Path
) -> None:
    src = stores("src.db", blob_threshold=1024)
    s = src.sessions.create(title="first")
    src.state.put(s.id, "k", {"v": 1})
    reply = src.messages.stream(s.id, model="m")
    reply.open()
    reply.text("partial ")
    reply.flush()
    early = tmp_path / "early.jsonl.zst"
    export_store(src, early)
    reply.text("and the rest")
    reply.add(ToolResult("c", "z" * 3000))
    reply.usage(input_tokens=5, output_tokens=6)
    reply.finish()
    src.sessions.update(s.id, title="second")
    src.state.put(s.id, "k", {"v": 2})
    src.messages.append(s.id, "user", "thanks")
    late = tmp_path / "late.jsonl.zst"
    export_store(src, late)

    dst = stores("dst.db")
    import_file(dst, early)
    assert dst.messages.list(s.id)[0].status == "streaming"
    forward = import_file(dst, late)
    assert (forward.updated, forward.inserted) == (3, 1)  # session, message, state; "thanks"
    assert everything(dst) == everything(src)
    assert dump(dst, CONTENT) == dump(src, CONTENT)
    before = dump(dst)
    older = import_file(dst, early)
    assert (older.newer, older.inserted, older.updated) == (3, 0, 0)
    assert dump(dst) == before


def test_a_file_that_contradicts_the_store_is_rejected_whole(
    stores: Callable[..., Store], tmp_path: Path
) -> None:
    src = stores("src.db", blob_threshold=1024)
    ids = fill(src)
    file = tmp_path / "all.jsonl.zst"
    export_store(src, file)
    dst = stores("dst.db")
    # The same id used for another session (the last session of the file).
    dst.sessions.create(id=ids["long"], title="long", project="/elsewhere")
    before, files = dump(dst), blob_dir(dst)
    with pytest.raises(
        AlreadyExists,
        match=rf"line \d+: session {ids['long']} is in the store with a different project.*nothing was imported",
    ):
        import_file(dst, file)
    assert dump(dst) == before and blob_dir(dst) == files


# --- hostile and damaged files --------------------------------------------------------------


@pytest.fixture
def exported(stores: Callable[..., Store], tmp_path: Path) -> Path:
    src = stores("src.db", blob_threshold=1024)
    fill(src)
    file = tmp_path / "good.jsonl.zst"
    export_store(src, file)
    return file


def last_op(records: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return [r for r in records if r.get("op") == name][-1]


def blob_ref_op(records: list[dict[str, Any]]) -> tuple[int, dict[str, Any]]:
    """The index and part of the last import_message that refers to a blob."""
    for i in range(len(records) - 1, 0, -1):
        r = records[i]
        if r.get("op") == "import_message":
            for part in r["args"]["parts"]:
                if "blob" in part:
                    return i, part
    raise AssertionError("no blob reference in the file")


def flaw_blob_hash(records: list[Any]) -> None:
    # A blob whose bytes do not match its hash: the piece and the reference name another.
    _, part = blob_ref_op(records)
    old = part["blob"]["sha256"]
    new = hashlib.sha256(b"something else").hexdigest()
    part["blob"]["sha256"] = new
    for r in records:
        if r.get("blob") == old:
            r["blob"] = new


def flaw_missing_blob(records: list[Any]) -> None:
    _, part = blob_ref_op(records)
    sha = part["blob"]["sha256"]
    records[:] = [r for r in records if r.get("blob") != sha]


def flaw_traversal_in_piece(records: list[Any]) -> None:
    next(r for r in records if "blob" in r)["blob"] = "../../../../etc/passwd"


def flaw_traversal_in_reference(records: list[Any]) -> None:
    blob_ref_op(records)[1]["blob"]["sha256"] = "../" * 20 + "etc/passwd"


def flaw_unknown_op(records: list[Any]) -> None:
    records.insert(-1, {"op": "drop_everything", "id": "x1", "args": {}})


def flaw_not_an_import_op(records: list[Any]) -> None:
    sid = last_op(records, "import_session")["args"]["id"]
    records.insert(-1, {"op": "delete_session", "id": "x1", "args": {"id": sid}})


def flaw_newer_version(records: list[Any]) -> None:
    records[0]["version"] = VERSION + 1


def flaw_bad_base64(records: list[Any]) -> None:
    next(r for r in records if "blob" in r)["data"] = "not base64!"


def flaw_nan_time(records: list[Any]) -> None:
    i = records.index(last_op(records, "import_message"))
    records[i] = (
        json.dumps(records[i]).replace('"created_at":', '"created_at": NaN, "x":').encode() + b"\n"
    )


def flaw_deep_nesting(records: list[Any]) -> None:
    records.insert(-1, b"[" * 200_000 + b"]" * 200_000 + b"\n")


def flaw_duplicate_session(records: list[Any]) -> None:
    dup = json.loads(json.dumps(last_op(records, "import_session")))
    dup["id"] = "0" * 8
    records.insert(-1, dup)


def flaw_orphan_message(records: list[Any]) -> None:
    orphan = json.loads(json.dumps(last_op(records, "import_message")))
    orphan["args"]["id"] = "orphan-message"
    orphan["args"]["session_id"] = "no-such-session"
    records.insert(-1, orphan)


def flaw_bad_argument(records: list[Any]) -> None:
    last_op(records, "import_message")["args"]["parts"][0]["kind"] = "script"


def flaw_huge_integer(records: list[Any]) -> None:
    last_op(records, "import_message")["args"]["seq"] = 10**30


def flaw_two_messages_at_one_seq(records: list[Any]) -> None:
    twin = json.loads(json.dumps(last_op(records, "import_message")))
    twin["args"]["id"] = "twin-message"
    records.insert(-1, twin)


def flaw_part_twice(records: list[Any]) -> None:
    op = next(
        r
        for r in reversed(records)
        if r.get("op") == "import_message"
        and r["args"]["parts"]
        and "body" in r["args"]["parts"][0]
    )
    parts = op["args"]["parts"]
    parts.append({**parts[0], "body": "something else"})


def flaw_chunk_twice(records: list[Any]) -> None:
    parts = last_op(records, "import_message")["args"]["parts"]
    parts.append(json.loads(json.dumps(parts[0])))


def flaw_edited_without_trailer(records: list[Any]) -> None:
    last_op(records, "import_message")["args"]["role"] = "admin"


def flaw_data_after_end(records: list[Any]) -> None:
    records.append(last_op(records, "import_state"))


FLAWS: dict[str, tuple[Callable[[list[Any]], None], bool, str]] = {
    # name: (mutation, recompute the trailer, expected message)
    "blob bytes do not match its hash": (flaw_blob_hash, True, "do not match its hash"),
    "op refers to a blob not in the file": (
        flaw_missing_blob,
        True,
        "which the file does not hold",
    ),
    "path traversal in a blob piece": (flaw_traversal_in_piece, True, "not a blob hash"),
    "path traversal in a reference": (flaw_traversal_in_reference, True, "not a blob hash"),
    "unknown operation": (flaw_unknown_op, True, "unknown operation 'drop_everything'"),
    "operation that is not an import": (
        flaw_not_an_import_op,
        True,
        "'delete_session' cannot be imported",
    ),
    "newer format version": (flaw_newer_version, True, "format version 2 is newer"),
    "bad base64": (flaw_bad_base64, True, "not base64"),
    "NaN": (flaw_nan_time, True, "not JSON"),
    "deep nesting": (flaw_deep_nesting, True, "nested too deeply"),
    "duplicate session": (flaw_duplicate_session, True, "appears twice"),
    "message of a session not in the file": (
        flaw_orphan_message,
        True,
        "is not earlier in the file",
    ),
    "invalid argument": (flaw_bad_argument, True, "unknown part kind 'script'"),
    "integer out of range": (flaw_huge_integer, True, "an integer from 1 to 2**63-1"),
    "two messages at one seq": (flaw_two_messages_at_one_seq, True, "another message has its seq"),
    "a part twice": (flaw_part_twice, True, "appears twice"),
    "a chunk twice": (flaw_chunk_twice, True, "chunk 0 appears twice"),
    "edited record, old trailer": (
        flaw_edited_without_trailer,
        False,
        "does not match its checksum",
    ),
    "data after the end record": (flaw_data_after_end, False, "data after the end record"),
}


@pytest.mark.parametrize("flaw", sorted(FLAWS))
def test_a_hostile_file_is_rejected_whole(
    flaw: str, exported: Path, stores: Callable[..., Store], tmp_path: Path
) -> None:
    mutate, fix, message = FLAWS[flaw]
    records = load(exported)
    mutate(records)
    bad = save(tmp_path / "bad.jsonl.zst", records, fix_trailer=fix)
    dst = stores("dst.db")
    dst.messages.append(dst.sessions.create(title="already here").id, "user", "x" * 2000)
    before, files = dump(dst), blob_dir(dst)
    with pytest.raises(InvalidArchive, match=r"line \d+: ") as caught:
        import_file(dst, bad)
    assert message in str(caught.value)
    assert "nothing was imported" in str(caught.value)
    assert dump(dst) == before and blob_dir(dst) == files
    assert not (tmp_path / "etc").exists()


def test_damaged_and_oversized_files_are_rejected_whole(
    exported: Path, stores: Callable[..., Store], tmp_path: Path
) -> None:
    dst = stores("dst.db", max_payload_bytes=4500)
    plain = stores("plain.db")
    before, files = dump(dst), blob_dir(dst)
    data = exported.read_bytes()
    cases = {
        "truncated": (data[: len(data) // 2], "truncated"),
        # Cut inside its first frame: no line at all (it said "empty").
        "cut in its first frame": (data[:700], "cut short"),
        "not zstd": (b'{"format": "fleetstore-export", "version": 1}\n', "not zstd-compressed"),
        "empty": (zstandard.ZstdCompressor().compress(b""), "empty"),
        "not an export": (
            zstandard.ZstdCompressor().compress(b'{"a": 1}\n'),
            "not a fleetstore export",
        ),
        # The default line limit (64 MiB), crossed by one line of 65 MiB.
        "oversized line": (
            zstandard.ZstdCompressor().compress(
                b'{"format":"fleetstore-export","version":1}\n{"op":"' + b"a" * (65 << 20) + b'"}\n'
            ),
            "longer than the limit of 67,108,864 bytes",
        ),
    }
    for name, (content, message) in cases.items():
        bad = tmp_path / f"{name}.jsonl.zst"
        bad.write_bytes(content)
        with pytest.raises(InvalidArchive, match="nothing was imported") as caught:
            import_file(plain, bad)
        assert message in str(caught.value), name
    # A blob larger than this store's max_payload_bytes (the 5000-byte read output).
    with pytest.raises(InvalidArchive, match=r"line \d+: blob .* over max_payload_bytes \(4,500\)"):
        import_file(dst, exported)
    # Limits a caller can lower: the line length and the decompressed total.
    with pytest.raises(InvalidArchive, match="longer than the limit of 500 bytes"):
        import_file(stores("other.db"), exported, max_line=500)
    with pytest.raises(InvalidArchive, match="more than 20,000 bytes once decompressed"):
        import_file(stores("other2.db"), exported, max_total=20_000)
    assert dump(dst) == before and blob_dir(dst) == files
    assert dump(plain) == before and blob_dir(plain) == files


# --- merge ----------------------------------------------------------------------------------

WRITER = r"""
import os, sys
import fleetstore
path, tag, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
with fleetstore.open(path, blob_threshold=2048) as store:
    for i in range(n):
        s = store.sessions.create(title=f"{tag}-{i}", project=tag)
        store.messages.append(s.id, "user", f"question {i} from {tag}")
        with store.messages.stream(s.id, model="m") as reply:
            reply.text("thinking about it " * 10)
            call = reply.tool_call("read", {"i": i})
            call.result(os.urandom(4096) if i % 2 else "out " * 2000)
            reply.text("done")
            reply.usage(input_tokens=i, output_tokens=2 * i, cost=0.01 * i)
        sub = store.sessions.create(parent_id=s.id, title="sub")
        store.messages.append(sub.id, "assistant", "sub answer")
        store.state.put(s.id, "cursor", {"i": i})
print("written", path)
"""


def write_stores(tmp_path: Path, *tags: str, n: int = 5) -> list[Path]:
    """One store per tag, each written by its own process, at the same time."""
    paths = [tmp_path / f"{tag}.db" for tag in tags]
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(p), tag, str(n)], env=clean_env())
        for p, tag in zip(paths, tags, strict=True)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0] * len(procs)
    return paths


def test_merge_of_stores_written_by_separate_processes_twice(
    stores: Callable[..., Store], tmp_path: Path
) -> None:
    a, b = write_stores(tmp_path, "worker-a", "worker-b")
    dst = tmp_path / "merged.db"
    first = cli("merge", str(a), str(b), str(dst))
    assert first.returncode == 0, first.stderr.decode()
    assert b"2 stores, 20 sessions, 30 messages" in first.stdout and b"verified" in first.stdout

    merged = stores("merged.db")
    expected = {**everything(stores("worker-a.db")), **everything(stores("worker-b.db"))}
    assert everything(merged) == expected
    before, files = dump(merged), blob_dir(merged)
    second = cli("merge", str(a), str(b), str(dst))
    assert second.returncode == 0, second.stderr.decode()
    assert dump(merged) == before and blob_dir(merged) == files
    # A sharded store as a SRC is bad usage, as it is as the DST (it exited 1).
    sharded = f"sqlite+sharded://{tmp_path / 'fleet'}"
    fleetstore.open(sharded).close()
    for args in ((str(a), sharded, str(dst)), (str(a), sharded)):
        refused = cli("merge", *args)
        assert refused.returncode == 2 and b"sharded" in refused.stderr, refused.stderr
    assert dump(merged) == before


def test_merge_verification_catches_a_damaged_or_diverged_destination(
    stores: Callable[..., Store], tmp_path: Path
) -> None:
    (a,) = write_stores(tmp_path, "worker-a", n=2)
    dst = tmp_path / "merged.db"
    assert cli("merge", str(a), str(dst)).returncode == 0
    merged = stores("merged.db")
    # A blob file damaged in the destination is replaced by merging again...
    sha = next(iter(merged.blobs))
    merged.blobs.path(sha).write_bytes(zstandard.ZstdCompressor().compress(b"not it"))
    assert cli("merge", str(a), str(dst)).returncode == 0
    assert merged.blobs.verify(sha)

    # ...and one damaged after the import, before the verification, is caught.
    def damage(stage: str, done: int, total: int) -> None:
        if stage == "import" and done == total:
            merged.blobs.path(sha).write_bytes(zstandard.ZstdCompressor().compress(b"not it"))

    report = merge([a], dst, progress=damage)
    assert not report.ok
    assert any(f"blob {sha} does not verify in the destination" in p for p in report.problems)
    # A session changed in the destination after the merge: the import leaves the later
    # version, and verification says the destination is not what was exported.
    os.unlink(merged.blobs.path(sha))
    sid = merged.sessions.list(project="worker-a")[0].id
    merged.sessions.update(sid, title="edited in the merged store")
    done = cli("merge", str(a), str(dst))
    assert done.returncode == 1
    assert f"session {sid}: the destination does not match the export".encode() in done.stderr


def test_merge_reports_a_source_that_changed_during_the_merge(
    stores: Callable[..., Store], tmp_path: Path
) -> None:
    (a,) = write_stores(tmp_path, "worker-a", n=3)
    writer = stores("worker-a.db")
    roots = [s.id for s in writer.sessions.list(project="worker-a")]
    late: list[str] = []

    def still_writing(stage: str, done: int, total: int) -> None:
        # A worker still running: after the first session was exported, it appends to
        # every session and starts a new one.
        if stage == "export" and done == 1 and not late:
            for sid in roots:
                writer.messages.append(sid, "user", "one more thing")
            late.append(writer.sessions.create(title="late", project="worker-a").id)

    report = merge([a], tmp_path / "merged.db", progress=still_writing)
    assert not report.ok
    text = "\n".join(report.problems)
    assert "changed in" in text and "during the merge" in text
    assert "1 session(s) were created in" in text
    assert "does not match the export" not in text  # the destination holds what was exported
    # Once the worker has stopped, merging again brings everything and verifies.
    again = merge([a], tmp_path / "merged.db")
    assert again.ok, again.problems
    merged = stores("merged.db")
    assert everything(merged) == everything(writer)


def test_merge_api_refuses_a_source_that_is_the_destination(tmp_path: Path) -> None:
    (a,) = write_stores(tmp_path, "worker-a", n=1)
    with pytest.raises(fleetstore.InvalidInput, match="both a source and the destination"):
        merge([a], a)
    with pytest.raises(NotFound, match="no store at"):
        merge([tmp_path / "absent.db"], tmp_path / "merged.db")


# --- the commands ---------------------------------------------------------------------------


@pytest.mark.slow
def test_export_and_import_commands(tmp_path: Path) -> None:
    (a,) = write_stores(tmp_path, "worker-a", n=2)
    file = tmp_path / "a.jsonl.zst"
    done = cli("export", "-o", str(file), "--store", str(a))
    assert done.returncode == 0, done.stderr.decode()
    assert b"4 sessions, 6 messages, 2 state values, 2 blobs" in done.stdout
    done = cli("import", str(file), env=clean_env(FLEETSTORE_URL=str(tmp_path / "b.db")))
    assert done.returncode == 0, done.stderr.decode()
    assert (
        b"4 sessions, 6 messages, 2 state values, 2 blobs" in done.stdout
        and b"12 new" in done.stdout
    )
    done = cli("import", str(file), "--store", str(tmp_path / "b.db"))
    assert done.returncode == 0 and b"0 new, 0 brought forward, 12 unchanged" in done.stdout
    # A pipe: export to stdout, import from stdin.
    piped = cli("export", "-o", "-", env=clean_env(FLEETSTORE_URL=str(a)))
    assert piped.returncode == 0 and piped.stdout[:4] == b"\x28\xb5\x2f\xfd"  # zstd magic
    done = cli("import", "-", "--store", str(tmp_path / "c.db"), input=piped.stdout)
    assert done.returncode == 0, done.stderr.decode()
    with fleetstore.open(tmp_path / "b.db") as b, fleetstore.open(tmp_path / "c.db") as c:
        assert everything(b) == everything(c)
        assert dump(b, CONTENT) == dump(c, CONTENT)


@pytest.mark.slow
def test_command_exit_codes(tmp_path: Path) -> None:
    (a,) = write_stores(tmp_path, "worker-a", n=1)
    bad = tmp_path / "bad.jsonl.zst"
    bad.write_bytes(b"plain text\n")
    done = cli("import", str(bad), "--store", str(tmp_path / "b.db"))
    assert done.returncode == 1
    assert b"not zstd-compressed); nothing was imported" in done.stderr
    assert cli("import", str(tmp_path / "missing"), "--store", str(a)).returncode == 2
    assert (
        cli("export", "no-such-session", "-o", str(tmp_path / "x"), "--store", str(a)).returncode
        == 1
    )
    assert not (tmp_path / "x").exists()
    done = cli("export", "-o", str(tmp_path / "x"), "--store", str(tmp_path / "absent.db"))
    assert done.returncode == 2 and b"no store at" in done.stderr
    assert not (tmp_path / "absent.db").exists()
    assert cli("export", "--store", str(a)).returncode == 2  # -o is required
    assert cli("merge", str(a)).returncode == 2
    assert cli("merge", str(tmp_path / "absent.db"), str(tmp_path / "m.db")).returncode == 2
    assert cli("merge", str(a), str(a)).returncode == 2
    assert not (tmp_path / "absent.db").exists() and not (tmp_path / "m.db").exists()
