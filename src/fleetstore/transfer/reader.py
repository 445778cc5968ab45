"""Reading an export file and checking it record by record: the first pass of an
import (``transfer/importing.py``), and how maintain reads its archive back.

Each line parses and is at most ``max_line`` bytes, the header's version is known,
every operation is an import operation with valid arguments, every blob decompresses
to its size and hash, every reference names a blob, session or message earlier in
the file, and the trailer matches.  Nothing here reads or writes a store.
"""

from __future__ import annotations

import base64
import hashlib
import json
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import zstandard

from fleetstore import errors
from fleetstore.core import sealed
from fleetstore.core.keys import Keyring
from fleetstore.core.validate import check_int
from fleetstore.domain import registry
from fleetstore.domain.blobs import check_sha
from fleetstore.domain.imports import (
    IMPORT_OPS,
    PARSERS,
    MessageIn,
    PartIn,
    PartsIn,
    SessionIn,
    StateIn,
    blob_refs,
)
from fleetstore.domain.operations import Operation
from fleetstore.transfer.format import FORMAT, VERSION, WINDOW, check_packed


@dataclass(slots=True)
class BlobItem:
    line: int
    sha256: str
    size: int
    data: IO[bytes]  # the stored (zstd) bytes


@dataclass(slots=True)
class OpItem:
    line: int
    op: Operation
    parsed: Any
    #: import_session whose parent comes earlier in the file (else the store must have it).
    parent_in_file: bool = False


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


class Reader:
    """Reads an export file and checks it record by record, as it streams: at most
    one line (``max_line`` bytes) and one blob piece are held at a time."""

    def __init__(
        self,
        path: Path,
        max_payload: int,
        max_line: int,
        max_total: int,
        keyring: Keyring | None = None,
    ) -> None:
        self.path = path
        #: Opens a sealed export (one written by an encrypted store).
        self.keyring = keyring
        self._tell: Callable[[], int] = lambda: 0
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
        dctx = zstandard.ZstdDecompressor(max_window_size=WINDOW)
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
                self.position = self._tell()
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

    def items(self) -> Iterator[BlobItem | OpItem]:
        with open(self.path, "rb") as raw:
            self._tell = raw.tell
            if not sealed.is_sealed(raw.read(len(sealed.MAGIC))):
                raw.seek(0)
                yield from self._items(raw)
                return
            raw.seek(0)
            if self.keyring is None:
                raise errors.KeyMissing(
                    f"{self.path}: an encrypted export, and no key was given; nothing was "
                    "read (the keyring of the store that wrote it: encryption_key_file, "
                    "FLEETSTORE_ENCRYPTION_KEY_FILE, fleetstore --key-file, or --export-key)"
                )
            try:
                yield from self._items(sealed.open_reader(raw, self.keyring, str(self.path)))
            except errors.SealedCorrupt as exc:
                raise errors.InvalidArchive(str(exc)) from None

    def _items(self, raw: IO[bytes]) -> Iterator[BlobItem | OpItem]:
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
                        problem = check_packed(spool, piece[0], piece[1])
                        if problem:
                            raise self.fail(n, f"blob {piece[0]}: {problem}")
                        blobs[piece[0]] = (piece[1], piece[2])
                        counts["blobs"] += 1
                        spool.seek(0)
                        yield BlobItem(n, piece[0], piece[1], spool)
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
            # (A zstd stream cut inside its first frame reads as no line at all.)
            raise self.fail(0, "empty, or cut short before its first line: not a whole export")
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

    def _op(self, n: int, obj: object) -> OpItem:
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
        return OpItem(n, op, parsed)


__all__ = [
    "BlobItem",
    "OpItem",
    "Reader",
]
