"""Export, import and merge: whole stores moved as streams of operations.

An export file is zstd-compressed JSON lines (one record a line)::

    {"format": "fleetstore-export", "version": 1, ...}                header
    {"blob": SHA, "size": N, "stored_size": M, "offset": O, "data": B64}  a piece of a blob
    {"op": "import_session", "id": OP_ID, "args": {...}}              an operation
    ...
    {"end": {"records": R, "blobs": B, "ops": K, "sha256": HEX}}      trailer

A blob's pieces (its zstd bytes as stored, at most 1 MiB a piece) come before the
first operation that refers to it; a session comes before its subagents, messages
and state.  The trailer counts the records and hashes every line before it, so a
truncated or edited file is detected.

Importing reads the file twice.  The first pass checks everything and writes
nothing: each line parses and is at most ``max_line`` bytes, the header's version
is known, every operation is an import operation with valid arguments, every blob
decompresses to its size and hash, every reference names a blob, session or
message earlier in the file, the trailer matches, and no record contradicts what
the store already holds.  Only then the second pass writes the blobs (files,
before any transaction) and applies the operations through ``Store.apply``, one
short transaction each.

The import operations carry whole rows (every column, the parts, the streamed
chunks, the usage), so a store round-trips exactly, and each is idempotent by
content: an object absent from the store is inserted; present and equal, nothing
happens; present at an earlier stage (a session at a lower version, a message
still streaming, state at a lower version) it is brought forward; present at a
later stage it is left alone (reported as ``newer``); anything else is a conflict
(``AlreadyExists``) naming the object.  Importing a file twice changes nothing.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import io
import json
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

import zstandard

from fleetstore import errors
from fleetstore.core.ids import new_id
from fleetstore.core.validate import check_int
from fleetstore.core.version import __version__
from fleetstore.domain import registry
from fleetstore.domain.blobs import check_sha
from fleetstore.domain.imports import (
    IMPORT_OPS,
    INSERTED,
    MISSING_PARENT,
    NEWER,
    PARSERS,
    SESSION_FIELDS,
    UNCHANGED,
    UPDATED,
    MessageIn,
    PartIn,
    PartsIn,
    SessionIn,
    StateIn,
    blob_refs,
    run_import,
    value_key,
)
from fleetstore.domain.operations import (
    Operation,
    Queries,
)
from fleetstore.engine.base import Tx
from fleetstore.models import USAGE_FIELDS

if TYPE_CHECKING:
    from fleetstore.store.facade import Store

FORMAT = "fleetstore-export"
VERSION = 1
#: Longest line an import accepts (a hostile file cannot make it hold more).
MAX_LINE = 64 * 1024 * 1024
#: Most decompressed bytes an import reads from one file.
MAX_TOTAL = 1 << 40

_BLOB_PIECE = 1024 * 1024
_RECORD_BUDGET = 4 * 1024 * 1024  # an exported record is split beyond this
_INLINE_LIMIT = 1024 * 1024  # larger inline payloads are exported as blobs
_CHUNK_LIMIT = 8 * 1024 * 1024  # a streamed part with a larger chunk is exported whole
_PAGE = 200  # messages read per read transaction
_CHECK_BATCH = 256  # operations checked against the store per read transaction
_WINDOW = 1 << 27  # largest zstd window accepted (128 MiB, zstd's own default)


#: ``progress(stage, done, total)``; stages: export, check, import.
Progress = Callable[[str, int, int], None]


# -- results ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SessionDigest:
    """A session's message count and a SHA-256 over its whole content (row,
    messages with parts and usage, state), independent of how payloads are
    stored (inline, blob or streamed chunks)."""

    messages: int
    sha256: str


@dataclass(frozen=True, slots=True)
class ExportSummary:
    path: str
    sessions: int
    messages: int
    states: int
    blobs: int
    blob_bytes: int
    file_bytes: int
    #: session id -> its digest as exported (what a merge verifies against).
    digests: Mapping[str, SessionDigest] = field(repr=False)
    blob_shas: frozenset[str] = field(repr=False)
    #: True when every session of the store was asked for.
    whole_store: bool = True


@dataclass(frozen=True, slots=True)
class ImportSummary:
    path: str
    sessions: int
    messages: int
    states: int
    blobs: int
    blob_bytes: int
    #: Blob files that were not in the store yet.
    new_blobs: int
    #: Sessions, messages and state values: new / brought forward / already
    #: there and equal / already there at a later stage (left as they were).
    inserted: int
    updated: int
    unchanged: int
    newer: int


@dataclass(frozen=True, slots=True)
class SourceResult:
    source: str
    exported: ExportSummary
    imported: ImportSummary


@dataclass(frozen=True, slots=True)
class MergeReport:
    dest: str
    sources: tuple[SourceResult, ...]
    #: What verification found; empty when the merge is verified.
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def sessions(self) -> int:
        return sum(s.exported.sessions for s in self.sources)

    @property
    def messages(self) -> int:
        return sum(s.exported.messages for s in self.sources)

    @property
    def blobs(self) -> int:
        return len(frozenset().union(*(s.exported.blob_shas for s in self.sources)))

    @property
    def blob_bytes(self) -> int:
        return sum(s.exported.blob_bytes for s in self.sources)


# -- reading a store -------------------------------------------------------------------------


@dataclass(slots=True)
class _PartRow:
    seq: int
    kind: str
    meta: str
    enc: str
    body: Any
    blob_sha: str | None
    size: int
    chunks: list[tuple[int, str]] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(t for _, t in self.chunks)

    def value_key(self) -> tuple[str, str, int]:
        return value_key(self.enc, self.body, self.blob_sha, self.size, self.text)


@dataclass(slots=True)
class _MessageRow:
    row: tuple[Any, ...]  # message_list: id, session_id, seq, role, status, model, metadata,
    # error, created_at, completed_at
    parts: list[_PartRow]
    usage: tuple[Any, ...] | None


_StateRow = tuple[Any, ...]  # namespace, key, version, enc, value, blob_sha, size, updated_at


def _read_messages(tx: Tx, q: Queries, sid: str, after: int, limit: int) -> list[_MessageRow]:
    rows = tx.execute(q["message_list"], {"session_id": sid, "after": after, "limit": limit})
    if not rows:
        return []
    ids = json.dumps([r[0] for r in rows])
    parts: dict[str, list[_PartRow]] = {r[0]: [] for r in rows}
    index: dict[tuple[str, int], _PartRow] = {}
    for mid, seq, kind, meta, enc, body, sha, size in tx.execute(q["transfer_parts"], (ids,)):
        part = _PartRow(seq, kind, meta, enc, body, sha, size)
        parts[mid].append(part)
        index[(mid, seq)] = part
    for mid, part_seq, seq, text in tx.execute(q["transfer_chunks"], (ids,)):
        owner = index.get((mid, part_seq))
        if owner is not None:
            owner.chunks.append((seq, text))
    usage = {u[0]: tuple(u[1:]) for u in tx.execute(q["usage_of_messages"], (ids,))}
    return [_MessageRow(tuple(r), parts[r[0]], usage.get(r[0])) for r in rows]


def _messages(store: Store, sid: str) -> Iterator[_MessageRow]:
    """A session's messages in order, a page per read transaction (a long read
    would pin the WAL; DESIGN.md, checkpoint starvation)."""
    q = store.queries
    after = 0
    while True:
        page = store.read(
            functools.partial(_read_messages, q=q, sid=sid, after=after, limit=_PAGE),
            session_id=sid,
        )
        yield from page
        if len(page) < _PAGE:
            return
        after = page[-1].row[2]


def _state_rows(store: Store, sid: str) -> list[_StateRow]:
    q = store.queries
    return [
        tuple(r)
        for r in store.read(
            lambda tx: tx.execute(q["transfer_state_of_session"], (sid,)), session_id=sid
        )
    ]


def _session_row(store: Store, sid: str) -> tuple[Any, ...] | None:
    q = store.queries
    rows = store.read(lambda tx: tx.execute(q["session_get"], (sid,)), session_id=sid)
    return tuple(rows[0]) if rows else None


def _canon(text: str) -> Any:
    return json.loads(text)


class _Digest:
    """SHA-256 over a session's content in a canonical form (see SessionDigest)."""

    def __init__(self) -> None:
        self._sha = hashlib.sha256()
        self.messages = 0

    def _add(self, item: list[Any]) -> None:
        line = json.dumps(item, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        self._sha.update(line.encode("utf-8") + b"\n")

    def session(self, r: tuple[Any, ...]) -> None:
        self._add(["session", *r[:8], _canon(r[8]), *r[9:]])

    def message(self, m: _MessageRow) -> None:
        self.messages += 1
        r = m.row
        parts = [[p.seq, p.kind, _canon(p.meta), *p.value_key()] for p in m.parts]
        usage = list(m.usage) if m.usage is not None else None
        self._add(["message", *r[:6], _canon(r[6]), *r[7:], usage, parts])

    def state(self, s: _StateRow) -> None:
        ns, key, version, enc, body, sha, size, updated = s
        self._add(["state", ns, key, version, *value_key(enc, body, sha, size), updated])

    def result(self) -> SessionDigest:
        return SessionDigest(self.messages, self._sha.hexdigest())


def session_digest(store: Store, session_id: str) -> SessionDigest | None:
    """The session's message count and content hash (None if there is no such session)."""
    row = _session_row(store, session_id)
    if row is None:
        return None
    digest = _Digest()
    digest.session(row)
    for m in _messages(store, session_id):
        digest.message(m)
    for s in _state_rows(store, session_id):
        digest.state(s)
    return digest.result()


def _session_order(store: Store, session_ids: Sequence[str] | None) -> list[str]:
    """The sessions to export, parents before their subagents."""
    q = store.queries
    store.sync_catalog()
    rows = store.read(lambda tx: tx.execute(q["transfer_session_tree"]))
    children: dict[str | None, list[str]] = {}
    known = set()
    for sid, parent in rows:
        children.setdefault(parent, []).append(sid)
        known.add(sid)
    if session_ids is None:
        roots = list(children.get(None, []))
    else:
        roots = []
        for sid in session_ids:
            if sid not in known:
                raise errors.NotFound(f"no session {sid!r} to export")
            roots.append(sid)
    order: list[str] = []
    seen: set[str] = set()
    for root in roots:
        stack = [root]
        while stack:
            sid = stack.pop()
            if sid in seen:
                continue
            seen.add(sid)
            order.append(sid)
            stack.extend(reversed(children.get(sid, [])))
    return order


# -- writing an export file ------------------------------------------------------------------


def _dumps(obj: object) -> bytes:
    return (
        json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False) + "\n"
    ).encode("utf-8")


class _Counting:
    """The file an export goes to, counting the bytes written."""

    def __init__(self, raw: IO[bytes]) -> None:
        self._raw = raw
        self.written = 0

    def write(self, data: Any) -> int:
        self._raw.write(data)
        size = len(data)
        self.written += size
        return size


class _Writer:
    def __init__(self, raw: IO[bytes]) -> None:
        self.out = _Counting(raw)
        self._z = zstandard.ZstdCompressor(level=3).stream_writer(
            cast(IO[bytes], self.out), closefd=False
        )
        self._sha = hashlib.sha256()
        self.records = self.blobs = self.ops = 0
        self.blob_bytes = 0
        self.stored: dict[str, int] = {}  # blobs written: sha -> stored size

    def _line(self, obj: object, hashed: bool = True) -> None:
        data = _dumps(obj)
        if len(data) > MAX_LINE:
            raise errors.InvalidInput(
                f"a record of {len(data):,} bytes is over the export line limit ({MAX_LINE:,})"
            )
        if hashed:
            self._sha.update(data)
        self._z.write(data)

    def header(self, info: Mapping[str, Any]) -> None:
        self._line({"format": FORMAT, "version": VERSION, **info})

    def blob(self, sha: str, size: int, packed: bytes) -> None:
        for offset in range(0, len(packed), _BLOB_PIECE):
            piece = base64.b64encode(packed[offset : offset + _BLOB_PIECE]).decode("ascii")
            self._line(
                {
                    "blob": sha,
                    "size": size,
                    "stored_size": len(packed),
                    "offset": offset,
                    "data": piece,
                }
            )
            self.records += 1
        self.stored[sha] = len(packed)
        self.blobs += 1
        self.blob_bytes += size

    def op(self, name: str, args: Mapping[str, Any]) -> None:
        self._line(Operation(name, args, new_id()).to_json())
        self.records += 1
        self.ops += 1

    def close(self) -> None:
        end = {
            "records": self.records,
            "blobs": self.blobs,
            "ops": self.ops,
            "sha256": self._sha.hexdigest(),
        }
        self._line({"end": end}, hashed=False)
        self._z.flush(zstandard.FLUSH_FRAME)


def _check_packed(packed: IO[bytes], sha: str, size: int) -> str | None:
    """None if *packed* (zstd) decompresses to *size* bytes hashing to *sha*, else
    what is wrong.  Streams: a hostile blob cannot make it hold more than 1 MiB."""
    packed.seek(0)
    digest = hashlib.sha256()
    seen = 0
    try:
        dctx = zstandard.ZstdDecompressor(max_window_size=_WINDOW)
        with dctx.stream_reader(packed, closefd=False) as reader:
            while chunk := reader.read(1 << 20):
                seen += len(chunk)
                if seen > size:
                    return f"decompresses to more than its size ({size:,} bytes)"
                digest.update(chunk)
    except zstandard.ZstdError as exc:
        return f"not valid zstd data ({exc})"
    if seen != size:
        return f"decompresses to {seen:,} bytes, not its size {size:,}"
    if digest.hexdigest() != sha:
        return "its bytes do not match its hash"
    return None


class _Exporter:
    def __init__(self, store: Store, writer: _Writer) -> None:
        self.store = store
        self.w = writer
        self.messages = 0
        self.states = 0

    def stored_blob(self, sha: str, size: int, owner: str) -> dict[str, Any]:
        if sha not in self.w.stored:
            packed = self.store.blobs.read_stored(sha)
            problem = _check_packed(io.BytesIO(packed), sha, size)
            if problem:
                raise errors.BlobCorrupt(
                    f"blob {sha} of {owner}: {problem} ({self.store.blobs.describe(sha)}); not exported"
                )
            self.w.blob(sha, size, packed)
        return {"sha256": sha, "size": size, "stored_size": self.w.stored[sha]}

    def payload(
        self, enc: str, body: Any, blob_sha: str | None, size: int, owner: str
    ) -> dict[str, Any]:
        """The encoded payload (history.encode_payload's format) of a stored value."""
        if blob_sha is not None:
            return {"enc": enc, "blob": self.stored_blob(blob_sha, size, owner)}
        if body is None:
            body = b"" if enc == "bytes" else ""
        raw = bytes(body) if enc == "bytes" else str(body).encode("utf-8")
        if len(raw) > _INLINE_LIMIT:
            # Kept out of the record so that no line needs to be long.
            sha = hashlib.sha256(raw).hexdigest()
            if sha not in self.w.stored:
                packed = zstandard.ZstdCompressor(level=3, write_content_size=True).compress(raw)
                self.w.blob(sha, len(raw), packed)
            return {
                "enc": enc,
                "blob": {"sha256": sha, "size": len(raw), "stored_size": self.w.stored[sha]},
            }
        if enc == "bytes":
            return {"enc": enc, "body": base64.b64encode(raw).decode("ascii")}
        return {"enc": enc, "body": str(body)}

    def part_items(self, p: _PartRow, mid: str) -> list[dict[str, Any]]:
        head = {"seq": p.seq, "kind": p.kind, "meta": json.loads(p.meta)}
        owner = f"part {p.seq} of message {mid}"
        if p.enc != "chunks":
            return [{**head, **self.payload(p.enc, p.body, p.blob_sha, p.size, owner)}]
        if any(len(t) > _CHUNK_LIMIT // 4 and len(t.encode()) > _CHUNK_LIMIT for _, t in p.chunks):
            # A huge single chunk cannot fit a line: export the part as one whole text.
            return [{**head, **self.payload("str", p.text, None, 0, owner)}]
        items: list[dict[str, Any]] = []
        batch: list[list[Any]] = []
        used = 0
        for seq, text in p.chunks:
            cost = len(text) + 16
            if batch and used + cost > _RECORD_BUDGET:
                items.append({**head, "enc": "chunks", "chunks": batch})
                batch, used = [], 0
            batch.append([seq, text])
            used += cost
        if batch or not items:
            items.append({**head, "enc": "chunks", "chunks": batch})
        return items

    def message(self, m: _MessageRow) -> None:
        mid, sid, seq, role, status, model, meta, error, created, completed = m.row
        items = [item for p in m.parts for item in self.part_items(p, mid)]
        usage = dict(zip(USAGE_FIELDS, m.usage, strict=True)) if m.usage is not None else None
        args: dict[str, Any] = {
            "id": mid,
            "session_id": sid,
            "seq": seq,
            "role": role,
            "status": status,
            "model": model,
            "metadata": json.loads(meta),
            "error": error,
            "created_at": created,
            "completed_at": completed,
            "usage": usage,
            "parts": [],
        }
        used = len(_dumps(args))
        records: list[list[dict[str, Any]]] = [args["parts"]]
        for item in items:
            cost = len(json.dumps(item, ensure_ascii=False))
            if records[-1] and used + cost > _RECORD_BUDGET:
                records.append([])
                used = 0
            records[-1].append(item)
            used += cost
        self.w.op("import_message", args)
        for more in records[1:]:
            self.w.op("import_parts", {"message_id": mid, "session_id": sid, "parts": more})
        self.messages += 1

    def state(self, sid: str, s: _StateRow) -> None:
        ns, key, version, enc, body, sha, size, updated = s
        value = self.payload(enc, body, sha, size, f"state {ns}/{key} of session {sid}")
        args = {
            "session_id": sid,
            "namespace": ns,
            "key": key,
            "version": version,
            "updated_at": updated,
            "value": value,
        }
        self.w.op("import_state", args)
        self.states += 1

    def session(self, sid: str) -> SessionDigest | None:
        row = _session_row(self.store, sid)
        if row is None:
            return None  # deleted since the list was read
        digest = _Digest()
        digest.session(row)
        args = dict(zip(SESSION_FIELDS, _session_columns(row), strict=True))
        args["metadata"] = json.loads(args["metadata"])
        self.w.op("import_session", args)
        for m in _messages(self.store, sid):
            digest.message(m)
            self.message(m)
        for s in _state_rows(self.store, sid):
            digest.state(s)
            self.state(sid, s)
        return digest.result()


def _session_columns(r: tuple[Any, ...]) -> tuple[Any, ...]:
    """session_get's columns (id, root_id, parent_id, ...) in SESSION_FIELDS' order."""
    return (r[0], r[2], r[1], *r[3:])


def export_store(
    store: Store,
    out: str | os.PathLike[str] | IO[bytes],
    session_ids: Sequence[str] | None = None,
    *,
    progress: Progress | None = None,
) -> ExportSummary:
    """Write the store's sessions (all, or *session_ids* with their subagent trees),
    with their messages, state and blobs, to *out*: a path (written to a temporary
    file and renamed, so a failed export leaves nothing) or a binary file."""

    order = _session_order(store, session_ids)
    if isinstance(out, str | os.PathLike):
        target = Path(out)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
        try:
            with open(tmp, "wb") as fh:
                summary = _export(
                    store, fh, order, session_ids is None, str(target), progress, __version__
                )
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()
        return summary
    name = getattr(out, "name", "<stream>")
    return _export(store, out, order, session_ids is None, str(name), progress, __version__)


def _export(
    store: Store,
    raw: IO[bytes],
    order: list[str],
    whole: bool,
    name: str,
    progress: Progress | None,
    version: str,
) -> ExportSummary:
    writer = _Writer(raw)
    writer.header({"fleetstore": version, "sessions": len(order), "source": str(store.path)})
    exporter = _Exporter(store, writer)
    digests: dict[str, SessionDigest] = {}
    for i, sid in enumerate(order):
        digest = exporter.session(sid)
        if digest is not None:
            digests[sid] = digest
        if progress is not None:
            progress("export", i + 1, len(order))
    writer.close()
    return ExportSummary(
        path=name,
        sessions=len(digests),
        messages=exporter.messages,
        states=exporter.states,
        blobs=writer.blobs,
        blob_bytes=writer.blob_bytes,
        file_bytes=writer.out.written,
        digests=digests,
        blob_shas=frozenset(writer.stored),
        whole_store=whole,
    )


# -- reading an export file ------------------------------------------------------------------


@dataclass(slots=True)
class _BlobItem:
    line: int
    sha256: str
    size: int
    data: IO[bytes]  # the stored (zstd) bytes


@dataclass(slots=True)
class _OpItem:
    line: int
    op: Operation
    parsed: Any
    #: import_session whose parent comes earlier in the file (else the store must have it).
    parent_in_file: bool = False


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


class _Reader:
    """Reads an export file and checks it record by record, as it streams: at most
    one line (``max_line`` bytes) and one blob piece are held at a time."""

    def __init__(self, path: Path, max_payload: int, max_line: int, max_total: int) -> None:
        self.path = path
        self.max_payload = max_payload
        self.max_line = max_line
        self.max_total = max_total
        self.file_size = path.stat().st_size
        self.position = 0
        self.sha256 = ""

    def fail(self, line: int, message: str) -> errors.InvalidArchive:
        where = f"line {line}: " if line else ""
        return errors.InvalidArchive(f"{self.path}: {where}{message}")

    def lines(self, raw: IO[bytes]) -> Iterator[tuple[int, bytes]]:
        number = 0
        total = 0
        pending = bytearray()
        dctx = zstandard.ZstdDecompressor(max_window_size=_WINDOW)
        with dctx.stream_reader(
            raw, read_size=1 << 20, read_across_frames=True, closefd=False
        ) as z:
            while True:
                try:
                    data = z.read(1 << 20)
                except zstandard.ZstdError as exc:
                    if number == 0 and not pending:
                        raise self.fail(
                            0, "not a fleetstore export (not zstd-compressed)"
                        ) from None
                    raise self.fail(number + 1, f"damaged compressed data ({exc})") from None
                self.position = raw.tell()
                if not data:
                    break
                total += len(data)
                if total > self.max_total:
                    raise self.fail(
                        number + 1, f"more than {self.max_total:,} bytes once decompressed"
                    )
                start = 0
                while True:
                    end = data.find(b"\n", start)
                    if end < 0:
                        pending += data[start:]
                        if len(pending) > self.max_line:
                            raise self.fail(
                                number + 1, f"longer than the limit of {self.max_line:,} bytes"
                            )
                        break
                    if pending:
                        pending += data[start : end + 1]
                        line = bytes(pending)
                        pending.clear()
                    else:
                        line = data[start : end + 1]
                    number += 1
                    if len(line) > self.max_line:
                        raise self.fail(number, f"longer than the limit of {self.max_line:,} bytes")
                    yield number, line
                    start = end + 1
        if pending:
            raise self.fail(number + 1, "the file ends inside a record: it is truncated")

    def items(self) -> Iterator[_BlobItem | _OpItem]:
        with open(self.path, "rb") as raw:
            yield from self._items(raw)

    def _items(self, raw: IO[bytes]) -> Iterator[_BlobItem | _OpItem]:
        sha = hashlib.sha256()
        blobs: dict[str, tuple[int, int]] = {}
        sessions: dict[str, str] = {}  # id -> root_id
        messages: set[str] = set()
        seqs: set[tuple[str, int]] = set()
        # The parts of the current message: seq -> (kind, meta, chunk seqs or None if whole).
        parts_seen: dict[int, tuple[str, str, set[int] | None]] = {}
        states: set[tuple[str, str, str]] = set()
        last_message: tuple[str, str] | None = None
        piece: tuple[str, int, int] | None = None  # the blob being received: sha, size, stored
        received = 0
        spool: IO[bytes] | None = None
        counts = {"records": 0, "blobs": 0, "ops": 0}
        ended = 0
        n = 0
        try:
            for n, line in self.lines(raw):
                try:
                    obj = json.loads(line, parse_constant=_reject_constant)
                except (ValueError, RecursionError) as exc:
                    what = "nested too deeply" if isinstance(exc, RecursionError) else exc
                    raise self.fail(n, f"not JSON ({str(what)[:200]})") from None
                if not isinstance(obj, dict):
                    raise self.fail(n, "a record must be a JSON object")
                if n == 1:
                    self._header(obj)
                    sha.update(line)
                    continue
                if ended:
                    raise self.fail(n, f"data after the end record (line {ended})")
                if "end" in obj:
                    if piece is not None:
                        raise self.fail(n, f"blob {piece[0]} is incomplete")
                    self._trailer(n, obj, counts, sha.hexdigest())
                    self.sha256 = sha.hexdigest()
                    ended = n
                    continue
                sha.update(line)
                counts["records"] += 1
                if "blob" in obj:
                    current, data = self._piece(n, obj, piece, received, blobs)
                    if piece is None:
                        spool = tempfile.SpooledTemporaryFile(max_size=8 * 1024 * 1024)  # noqa: SIM115  closed below or in finally
                        piece, received = current, 0
                    assert spool is not None
                    spool.write(data)
                    received += len(data)
                    if received == piece[2]:
                        problem = _check_packed(spool, piece[0], piece[1])
                        if problem:
                            raise self.fail(n, f"blob {piece[0]}: {problem}")
                        blobs[piece[0]] = (piece[1], piece[2])
                        counts["blobs"] += 1
                        spool.seek(0)
                        yield _BlobItem(n, piece[0], piece[1], spool)
                        spool.close()
                        spool, piece = None, None
                    continue
                if piece is not None:
                    raise self.fail(
                        n, f"blob {piece[0]} is incomplete ({received:,} of {piece[2]:,} bytes)"
                    )
                if "op" not in obj:
                    raise self.fail(n, "not a record (a blob piece, an operation or the end)")
                counts["ops"] += 1
                item = self._op(n, obj)
                parsed = item.parsed
                for ref in blob_refs(parsed):
                    if blobs.get(ref[0]) != (ref[1], ref[2]):
                        raise self.fail(
                            n,
                            f"{item.op.name} refers to blob {ref[0]}, which the file does not "
                            "hold (with that size) before this line",
                        )
                if isinstance(parsed, SessionIn):
                    if parsed.id in sessions:
                        raise self.fail(n, f"session {parsed.id} appears twice")
                    if parsed.parent_id in sessions:
                        item.parent_in_file = True
                        if sessions[parsed.parent_id] != parsed.root_id:
                            raise self.fail(
                                n, f"session {parsed.id}: root_id differs from its parent's"
                            )
                    sessions[parsed.id] = parsed.root_id
                elif isinstance(parsed, MessageIn):
                    if parsed.id in messages:
                        raise self.fail(n, f"message {parsed.id} appears twice")
                    if parsed.session_id not in sessions:
                        raise self.fail(
                            n,
                            f"message {parsed.id}: its session {parsed.session_id} is not "
                            "earlier in the file",
                        )
                    if (parsed.session_id, parsed.seq) in seqs:
                        raise self.fail(n, f"message {parsed.id}: another message has its seq")
                    messages.add(parsed.id)
                    seqs.add((parsed.session_id, parsed.seq))
                    last_message = (parsed.id, parsed.session_id)
                    parts_seen.clear()
                    self._parts(n, parsed.id, parsed.parts, parts_seen)
                elif isinstance(parsed, PartsIn):
                    if last_message != (parsed.message_id, parsed.session_id):
                        raise self.fail(n, f"parts of message {parsed.message_id} do not follow it")
                    self._parts(n, parsed.message_id, parsed.parts, parts_seen)
                else:
                    key = (parsed.session_id, parsed.namespace, parsed.key)
                    if parsed.session_id not in sessions:
                        raise self.fail(n, f"{parsed.what}: the session is not earlier in the file")
                    if key in states:
                        raise self.fail(n, f"{parsed.what} appears twice")
                    states.add(key)
                if isinstance(parsed, SessionIn | StateIn):
                    last_message = None
                yield item
        finally:
            if spool is not None:
                spool.close()
        if n == 0:
            raise self.fail(0, "empty: not a fleetstore export")
        if not ended:
            raise self.fail(n, "the file ends without its end record: it is truncated")

    def _parts(
        self,
        n: int,
        message_id: str,
        parts: Sequence[PartIn],
        seen: dict[int, tuple[str, str, set[int] | None]],
    ) -> None:
        """A part appears once, or (streamed) as slices of its chunks, each chunk once."""
        for p in parts:
            what = f"part {p.seq} of message {message_id}"
            before = seen.get(p.seq)
            if before is None:
                chunks: set[int] | None = None if p.chunks is None else set()
                seen[p.seq] = (p.kind, p.meta, chunks)
            elif before[2] is None or p.chunks is None or before[:2] != (p.kind, p.meta):
                raise self.fail(n, f"{what} appears twice")
            known = seen[p.seq][2]
            for seq, _ in p.chunks or ():
                assert known is not None
                if seq in known:
                    raise self.fail(n, f"{what}: chunk {seq} appears twice")
                known.add(seq)

    def _header(self, obj: Mapping[str, Any]) -> None:
        if obj.get("format") != FORMAT:
            raise self.fail(1, f"not a fleetstore export (the header's format is not {FORMAT!r})")
        version = obj.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise self.fail(1, f"bad format version {str(version)[:40]!r}")
        if version > VERSION:
            raise self.fail(
                1,
                f"format version {version} is newer than this fleetstore reads ({VERSION}); "
                "import it with a newer fleetstore",
            )

    def _trailer(
        self, n: int, obj: Mapping[str, Any], counts: Mapping[str, int], digest: str
    ) -> None:
        end = obj.get("end")
        if set(obj) != {"end"} or not isinstance(end, dict):
            raise self.fail(n, "a bad end record")
        expected = {**counts, "sha256": digest}
        if end.get("sha256") != digest:
            raise self.fail(n, "the file does not match its checksum: it was changed or damaged")
        if dict(end) != expected:
            raise self.fail(n, f"the end record counts {dict(end)!r:.200}, the file holds {counts}")

    def _piece(
        self,
        n: int,
        obj: dict[str, Any],
        piece: tuple[str, int, int] | None,
        received: int,
        blobs: Mapping[str, Any],
    ) -> tuple[tuple[str, int, int], bytes]:
        if set(obj) != {"blob", "size", "stored_size", "offset", "data"}:
            raise self.fail(n, "a blob piece has blob, size, stored_size, offset and data")
        try:
            sha = check_sha(obj["blob"])
            size = check_int(obj["size"], "size")
            stored = check_int(obj["stored_size"], "stored_size", minimum=1)
            offset = check_int(obj["offset"], "offset")
            data = obj["data"]
            if not isinstance(data, str):
                raise errors.InvalidInput("data must be base64 text")
            raw = base64.b64decode(data, validate=True)
        except errors.InvalidInput as exc:
            raise self.fail(n, str(exc)) from None
        except ValueError:
            raise self.fail(n, "a blob piece's data is not base64") from None
        if size > self.max_payload:
            raise self.fail(
                n, f"blob {sha} of {size:,} bytes is over max_payload_bytes ({self.max_payload:,})"
            )
        if stored > size + size // 128 + 65536:
            raise self.fail(
                n, f"blob {sha}: stored_size {stored:,} is impossible for {size:,} bytes"
            )
        if not raw:
            raise self.fail(n, f"blob {sha}: an empty piece")
        current = (sha, size, stored)
        if piece is None:
            if sha in blobs:
                raise self.fail(n, f"blob {sha} appears twice")
            if offset != 0:
                raise self.fail(n, f"blob {sha}: its first piece is at offset {offset}, not 0")
        elif current != piece or offset != received:
            raise self.fail(n, f"blob {piece[0]} is incomplete, or its pieces are out of order")
        if offset + len(raw) > stored:
            raise self.fail(n, f"blob {sha}: more bytes than its stored_size ({stored:,})")
        return current, raw

    def _op(self, n: int, obj: object) -> _OpItem:
        try:
            op = registry.decode(obj)
        except errors.InvalidInput as exc:
            raise self.fail(n, str(exc)) from None
        if op.name not in IMPORT_OPS:
            raise self.fail(
                n,
                f"operation {op.name!r} cannot be imported (an export holds only "
                f"{', '.join(IMPORT_OPS)})",
            )
        try:
            parsed = PARSERS[op.name](op.args)
        except errors.InvalidInput as exc:
            raise self.fail(n, f"{op.name}: {exc}") from None
        except RecursionError:
            raise self.fail(n, f"{op.name}: nested too deeply") from None
        return _OpItem(n, op, parsed)


# -- importing -------------------------------------------------------------------------------


def _item_session(store: Store, item: _OpItem) -> str:
    """The session whose file an operation of the file is checked in: its own, or,
    for a session the store does not hold yet, its parent's (a sharded store keeps
    a subagent in its parent's tree)."""
    parsed = item.parsed
    if item.op.name != "import_session":
        return str(parsed.session_id)
    sid = str(parsed.id)
    if store.router is not None and parsed.parent_id is not None and store.router.home(sid) is None:
        return str(parsed.parent_id)
    return sid


def _check_against_store(store: Store, reader: _Reader, batch: list[_OpItem]) -> None:
    """Dry-run a batch of operations against the store: a conflict is found
    before anything is written.  A sharded store checks each operation in the file
    of its session's tree, the operations of one file in one read transaction."""
    if store.router is None:
        _check_in(store, reader, batch, None)
        return
    groups: dict[str | None, tuple[str, list[_OpItem]]] = {}
    for item in batch:
        sid = _item_session(store, item)
        key = store.router.home(sid)
        groups.setdefault(key, (sid, []))[1].append(item)
    # In the order of each file's first operation; within a file, in file order.
    for sid, items in groups.values():
        _check_in(store, reader, items, sid)


def _check_in(store: Store, reader: _Reader, batch: list[_OpItem], session_id: str | None) -> None:
    q = store.queries

    def run(tx: Tx) -> None:
        for item in batch:
            try:
                outcome = run_import(tx, q, item.op.name, item.parsed, False, 0.0)
            except errors.AlreadyExists as exc:
                raise errors.AlreadyExists(
                    f"{reader.path}: line {item.line}: {exc}; nothing was imported"
                ) from None
            except errors.InvalidInput as exc:
                raise reader.fail(item.line, str(exc)) from None
            if outcome == MISSING_PARENT and not item.parent_in_file:
                s = item.parsed
                raise reader.fail(
                    item.line,
                    f"session {s.id}: its parent {s.parent_id} is neither in the file nor in "
                    "the store (export the parent's tree, or import its export first)",
                )

    store.read(run, session_id=session_id)


def import_file(
    store: Store,
    path: str | os.PathLike[str],
    *,
    progress: Progress | None = None,
    max_line: int = MAX_LINE,
    max_total: int = MAX_TOTAL,
) -> ImportSummary:
    """Import an export file into *store*: checked whole first (``InvalidArchive``,
    or ``AlreadyExists`` for a conflict with the store, and nothing is written),
    then blobs and operations written.  Importing a file twice changes nothing."""
    file = Path(path)
    limit = store.settings.max_payload_bytes
    check = _Reader(file, limit, max_line, max_total)
    batch: list[_OpItem] = []
    try:
        for item in check.items():
            if isinstance(item, _OpItem):
                batch.append(item)
                if len(batch) >= _CHECK_BATCH:
                    _check_against_store(store, check, batch)
                    batch.clear()
            if progress is not None:
                progress("check", check.position, check.file_size)
        _check_against_store(store, check, batch)
    except errors.InvalidArchive as exc:
        raise errors.InvalidArchive(f"{exc}; nothing was imported") from None

    counts = {INSERTED: 0, UPDATED: 0, UNCHANGED: 0, NEWER: 0}
    kinds = {"import_session": 0, "import_message": 0, "import_state": 0}
    blobs = new_blobs = blob_bytes = 0
    last: list[Any] = [None, None]  # the last message's id and outcome
    write = _Reader(file, limit, max_line, max_total)
    line = 0
    try:
        for item in write.items():
            line = item.line
            if isinstance(item, _BlobItem):
                fresh = not store.blobs.exists(item.sha256)
                store.blobs.put_stored(item.sha256, item.data.read(), item.size)
                blobs += 1
                new_blobs += fresh
                blob_bytes += item.size
            else:
                action = store.apply(item.op)["action"]
                name = item.op.name
                if name == "import_parts":
                    if action == UPDATED and last[1] in (UNCHANGED, NEWER):
                        counts[last[1]] -= 1
                        counts[UPDATED] += 1
                        last[1] = UPDATED
                else:
                    kinds[name] += 1
                    counts[action] += 1
                    if name == "import_message":
                        last = [item.parsed.id, action]
            if progress is not None:
                progress("import", write.position, write.file_size)
    except errors.InvalidArchive as exc:
        raise errors.InvalidArchive(
            f"{exc} (the file changed while it was imported: records before it were imported)"
        ) from None
    except errors.StoreBusy:
        raise
    except (errors.AlreadyExists, errors.NotFound, errors.InvalidInput) as exc:
        raise type(exc)(
            f"{file}: line {line}: {exc}; the import stopped there (the records before it "
            "were imported; importing the file again is safe)"
        ) from exc
    if write.sha256 != check.sha256:
        raise errors.InvalidArchive(f"{file}: the file changed while it was imported")
    return ImportSummary(
        path=str(file),
        sessions=kinds["import_session"],
        messages=kinds["import_message"],
        states=kinds["import_state"],
        blobs=blobs,
        blob_bytes=blob_bytes,
        new_blobs=new_blobs,
        inserted=counts[INSERTED],
        updated=counts[UPDATED],
        unchanged=counts[UNCHANGED],
        newer=counts[NEWER],
    )


# -- merging ---------------------------------------------------------------------------------


def _verify(source: Store, dest: Store, exported: ExportSummary, name: str) -> list[str]:
    """What differs between the export of *source*, the destination and the source now."""
    problems: list[str] = []
    for sid, want in exported.digests.items():
        got = session_digest(dest, sid)
        if got != want:
            found = (
                "missing" if got is None else f"{got.messages} messages, content {got.sha256[:12]}"
            )
            problems.append(
                f"session {sid}: the destination does not match the export of {name} "
                f"({want.messages} messages, content {want.sha256[:12]}; destination: {found})"
            )
        now = session_digest(source, sid)
        if now != want:
            found = "deleted" if now is None else f"{now.messages} messages"
            problems.append(
                f"session {sid} changed in {name} during the merge (exported with "
                f"{want.messages} messages, now {found}); merge again once its writers stopped"
            )
    if exported.whole_store:
        created = set(_session_order(source, None)) - set(exported.digests)
        if created:
            problems.append(
                f"{len(created)} session(s) were created in {name} during the merge "
                f"(e.g. {min(created)}); merge again once its writers stopped"
            )
    for sha in sorted(exported.blob_shas):
        if not dest.blobs.verify(sha):
            problems.append(
                f"blob {sha} does not verify in the destination ({dest.blobs.describe(sha)})"
            )
    return problems


def merge(
    sources: Sequence[str | os.PathLike[str] | Store],
    dest: str | os.PathLike[str] | Store,
    *,
    progress: Progress | None = None,
) -> MergeReport:
    """Bring every session of each source store into *dest*: export, import, then
    verify that each exported session is in *dest* exactly as exported (message
    count and content hash), that the source did not change meanwhile, and that
    every blob verifies.  Idempotent: merging again changes nothing.  The report's
    ``problems`` say what did not verify."""
    from fleetstore.core.targets import resolve_target
    from fleetstore.store.facade import Store as StoreClass
    from fleetstore.store.facade import open as open_store

    def target(s: str | os.PathLike[str] | Store) -> Path:
        return (s.path if isinstance(s, StoreClass) else resolve_target(s)).resolve()

    dest_path = target(dest)
    for src in sources:
        path = target(src)
        if path == dest_path:
            raise errors.InvalidInput(f"{path} is both a source and the destination")
        if not isinstance(src, StoreClass) and not path.exists():
            raise errors.NotFound(f"no store at {path} to merge from")
    with contextlib.ExitStack() as stack:
        dst = dest if isinstance(dest, StoreClass) else stack.enter_context(open_store(dest))
        results: list[SourceResult] = []
        problems: list[str] = []
        for src in sources:
            with contextlib.ExitStack() as inner:
                store = src if isinstance(src, StoreClass) else inner.enter_context(open_store(src))
                fd, tmp = tempfile.mkstemp(
                    prefix=".fleetstore-merge-", suffix=".jsonl.zst", dir=dst.path.parent
                )
                os.close(fd)
                inner.callback(_unlink, tmp)
                exported = export_store(store, tmp, progress=progress)
                imported = import_file(dst, tmp, progress=progress)
                problems.extend(_verify(store, dst, exported, str(store.path)))
                results.append(SourceResult(str(store.path), exported, imported))
        return MergeReport(str(dst.path), tuple(results), tuple(problems))


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


__all__ = [
    "FORMAT",
    "IMPORT_OPS",
    "MAX_LINE",
    "VERSION",
    "ExportSummary",
    "ImportSummary",
    "MergeReport",
    "SessionDigest",
    "SourceResult",
    "export_store",
    "import_file",
    "merge",
    "session_digest",
]
