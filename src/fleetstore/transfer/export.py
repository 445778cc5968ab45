"""``fleetstore export``: a store's sessions, with their messages, state and blobs,
written to an export file (the format is in ``transfer/format.py``)."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, BinaryIO, cast

import zstandard

from fleetstore import errors
from fleetstore.core import sealed
from fleetstore.core.ids import new_id
from fleetstore.core.keys import Keyring
from fleetstore.core.version import __version__
from fleetstore.domain.blobs import fsync_dir
from fleetstore.domain.imports import SESSION_FIELDS
from fleetstore.domain.operations import Operation
from fleetstore.models import USAGE_FIELDS
from fleetstore.transfer.digest import (
    Digest,
    MessageRow,
    PartRow,
    SessionDigest,
    StateRow,
    session_messages,
    session_order,
    session_row,
    state_rows,
)
from fleetstore.transfer.format import (
    BLOB_PIECE,
    FORMAT,
    MAX_LINE,
    VERSION,
    Progress,
    check_packed,
    record_bytes,
)

if TYPE_CHECKING:
    from fleetstore.store.facade import Store

_RECORD_BUDGET = 4 * 1024 * 1024  # an exported record is split beyond this
_INLINE_LIMIT = 1024 * 1024  # larger inline payloads are exported as blobs
_CHUNK_LIMIT = 8 * 1024 * 1024  # a streamed part with a larger chunk is exported whole


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
    def __init__(self, raw: IO[bytes], keyring: Keyring | None = None) -> None:
        self.out = _Counting(raw)
        #: An encrypted store's export is sealed whole (what zstd writes, sealed).
        self._sealer = (
            None if keyring is None else sealed.SealingWriter(cast(BinaryIO, self.out), keyring)
        )
        self._z = zstandard.ZstdCompressor(level=3).stream_writer(
            cast(IO[bytes], self.out if self._sealer is None else self._sealer), closefd=False
        )
        self._sha = hashlib.sha256()
        self.records = self.blobs = self.ops = 0
        self.blob_bytes = 0
        self.stored: dict[str, int] = {}  # blobs written: sha -> stored size

    def _line(self, obj: object, hashed: bool = True) -> None:
        data = record_bytes(obj)
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
        for offset in range(0, len(packed), BLOB_PIECE):
            piece = base64.b64encode(packed[offset : offset + BLOB_PIECE]).decode("ascii")
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
        if self._sealer is not None:
            self._sealer.close()


class _Exporter:
    def __init__(self, store: Store, writer: _Writer) -> None:
        self.store = store
        self.w = writer
        self.messages = 0
        self.states = 0

    def stored_blob(self, sha: str, size: int, owner: str) -> dict[str, Any]:
        if sha not in self.w.stored:
            packed = self.store.blobs.read_stored(sha)
            problem = check_packed(io.BytesIO(packed), sha, size)
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
        if enc != "bytes" and isinstance(body, bytes | bytearray | memoryview):
            # PostgreSQL keeps every body as BYTEA: str(bytes) would export "b'...'".
            body = bytes(body).decode("utf-8")
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

    def part_items(self, p: PartRow, mid: str) -> list[dict[str, Any]]:
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

    def message(self, m: MessageRow) -> None:
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
        used = len(record_bytes(args))
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

    def state(self, sid: str, s: StateRow) -> None:
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
        row = session_row(self.store, sid)
        if row is None:
            return None  # deleted since the list was read
        digest = Digest()
        digest.session(row)
        args = dict(zip(SESSION_FIELDS, _session_columns(row), strict=True))
        args["metadata"] = json.loads(args["metadata"])
        self.w.op("import_session", args)
        for m in session_messages(self.store, sid):
            digest.message(m)
            self.message(m)
        for s in state_rows(self.store, sid):
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
    plain: bool = False,
) -> ExportSummary:
    """Write the store's sessions (all, or *session_ids* with their subagent trees),
    with their messages, state and blobs, to *out*: a path (written to a temporary
    file and renamed, so a failed export leaves nothing) or a binary file.  An
    encrypted store's export is sealed with its current key (any holder of the
    keyring reads it), unless *plain* is asked for."""
    keyring = None if plain else store.keyring

    order = session_order(store, session_ids)
    if isinstance(out, str | os.PathLike):
        target = Path(out)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
        try:
            # Sessions carry secrets: created 0600 (whatever the umask), never widened.
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "wb") as fh:
                summary = _export(
                    store, fh, order, session_ids is None, str(target), progress, keyring
                )
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
            fsync_dir(target.absolute().parent)
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()
        return summary
    name = getattr(out, "name", "<stream>")
    return _export(store, out, order, session_ids is None, str(name), progress, keyring)


def _export(
    store: Store,
    raw: IO[bytes],
    order: list[str],
    whole: bool,
    name: str,
    progress: Progress | None,
    keyring: Keyring | None,
) -> ExportSummary:
    writer = _Writer(raw, keyring)
    writer.header({"fleetstore": __version__, "sessions": len(order), "source": str(store.path)})
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


__all__ = [
    "ExportSummary",
    "export_store",
]
