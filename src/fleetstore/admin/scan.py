"""``fleetstore scan PATH``: where secrets are kept, found by the redaction rules
(fleetstore.core.redact), strictly read-only.

PATH may be a fleetstore store (its database, blob files and spool journals; a sharded
store's directory), another program's SQLite file (every text and blob column of every
table: opencode, zcode, Codex, LangGraph's and the SDKs' files), a JSONL transcript, or a
directory holding any of these (walked without following links).  SQLite files are read
through fleetstore.files.foreign (no lock file, -wal or -shm created, nothing
checkpointed, a file that changed during an unlocked read read again), in short read
transactions of a few hundred rows each, so a long scan never holds a live store's WAL.

A finding says where (file; table, column and the row's key columns, or line; the JSON
path inside a value) and what kind, never the secret: at most its first 4 characters
and a fingerprint (fleetstore.core.redact.preview, fingerprint).  Text that is JSON is
read as JSON, strings under keys as ``key=value`` (as redaction reads them); a
fleetstore store's streamed text (its ``chunks`` rows) is read part by part as one
stream, so a secret cut across two flushes is still found.

An encrypted store (or a sealed export, blob file or journal line) is read with the
keyring given (``keyring``); without it, it is listed as skipped and says why.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import stat
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, cast

import zstandard

from fleetstore import errors
from fleetstore.core import sealed
from fleetstore.core.keys import Keyring
from fleetstore.core.redact import Finding, Redactor, default_redactor, fingerprint, preview
from fleetstore.core.sealed import is_sealed, open_reader
from fleetstore.core.targets import POSTGRES_SCHEMES, parse_target
from fleetstore.engine.cipher import key_of_file, looks_encrypted
from fleetstore.files.foreign import FileChanged, ForeignFile
from fleetstore.files.inspect import InspectFailed, ReadOnlyDatabase
from fleetstore.store.spool import unseal_text

#: Rows read per read transaction.
BATCH = 256
#: A JSON text longer than this is scanned as text, not parsed.
MAX_JSON = 64 * 1024 * 1024
#: Files a directory walk reads as JSON lines (any file named on the command line is read).
JSON_SUFFIXES = (".jsonl", ".ndjson", ".json", ".jsonl.new")
#: The tables every fleetstore store has (as store/readonly.py knows a store).
STORE_TABLES = frozenset({"sessions", "applied_ops", "fleetstore_migrations"})
#: Columns that name a row well enough to find it, besides its primary key.
IDENTITY = ("session_id", "message_id", "thread_id", "id")
_SQLITE_MAGIC = b"SQLite format 3\x00"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_SIDE_FILES = re.compile(r".*(-wal|-shm|-journal|\.gate)$")
_ATTEMPTS = 5
_JOURNAL_LINE = re.compile(rb"[0-9a-f]{8} ")


@dataclass(frozen=True, slots=True)
class ScanFinding:
    """A secret found: its kind, where, and how to recognise it without seeing it."""

    kind: str
    path: str
    where: dict[str, Any]
    preview: str
    fingerprint: str

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": self.path, **self.where,
                "preview": self.preview, "fingerprint": self.fingerprint}  # fmt: skip


@dataclass
class ScanReport:
    """What a scan found and read."""

    by_kind: Counter[str] = field(default_factory=Counter)
    scanned: Counter[str] = field(default_factory=Counter)
    #: Files not read, and why (a link, an encrypted file, not a kind scan reads).
    skipped: list[dict[str, str]] = field(default_factory=list)
    #: Files (or parts of them) that could not be read, and why.
    errors: list[dict[str, str]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def findings(self) -> int:
        return sum(self.by_kind.values())

    @property
    def exit_code(self) -> int:
        """1 if anything was found, else 3 if something could not be read, else 0."""
        if self.findings:
            return 1
        return 3 if self.errors else 0

    def to_json(self) -> dict[str, Any]:
        return {
            "findings": self.findings,
            "by_kind": dict(sorted(self.by_kind.items())),
            "scanned": dict(sorted(self.scanned.items())),
            "skipped": self.skipped,
            "errors": self.errors,
            "seconds": round(self.seconds, 3),
            "exit_code": self.exit_code,
        }


OnFinding = Callable[[ScanFinding], None]


def scan(
    target: str | os.PathLike[str],
    on_finding: OnFinding,
    redactor: Redactor | None = None,
    keyring: Keyring | None = None,
) -> ScanReport:
    """Scan *target* (see the module docstring), calling *on_finding* for each finding
    as it is found.  ``ConfigError`` for a target scan does not read (a PostgreSQL URL);
    ``NotFound`` if it does not exist.  Everything else that cannot be read is in the
    report's ``errors``; nothing is ever written."""
    started = time.monotonic()
    path = _path_of(target)
    scanner = _Scanner(redactor or default_redactor(), on_finding, keyring)
    if path.is_symlink() and not path.exists():
        raise errors.NotFound(f"{path}: a link to nothing")
    if not path.exists():
        raise errors.NotFound(f"{path}: no such file or directory")
    if path.is_dir() and path.name.endswith(".blobs"):
        scanner.blobs(path, database=path.with_name(path.name.removesuffix(".blobs")))
    elif path.is_dir() and path.name.endswith(".spool"):
        scanner.spool(path)
    elif path.is_dir():
        scanner.directory(path)
    else:
        scanner.file(path, named=True)
    scanner.report.seconds = time.monotonic() - started
    return scanner.report


def _path_of(target: str | os.PathLike[str]) -> Path:
    text = os.fspath(target)
    if "://" in text:
        scheme = text.partition("://")[0]
        if scheme in POSTGRES_SCHEMES:
            raise errors.ConfigError(
                "scan reads files: a PostgreSQL store's content is read by its server; "
                "export it (fleetstore export) and scan the export, or scan the server's "
                "disk with the server's tools"
            )
        _, where = parse_target(text)
        assert isinstance(where, Path)
        return where
    return Path(text)


#: Bytes read to tell a file's kind: a text file (read line by line in a directory) holds
#: no NUL in them.
_TEXT_PROBE = 8192


class _Scanner:
    def __init__(
        self, redactor: Redactor, on_finding: OnFinding, keyring: Keyring | None = None
    ) -> None:
        self.redactor = redactor
        self.on_finding = on_finding
        self.keyring = keyring
        self.report = ScanReport()

    # -- what a path is -----------------------------------------------------------------

    def directory(self, root: Path) -> None:
        for here, dirs, files in os.walk(root, followlinks=False):
            base = Path(here)
            dirs.sort()
            for name in list(dirs):
                sub = base / name
                if sub.is_symlink():
                    self.skip(sub, "a symbolic link (not followed)")
                    dirs.remove(name)
                elif name.endswith(".blobs"):
                    self.blobs(sub, database=base / name.removesuffix(".blobs"))
                    dirs.remove(name)
                elif name.endswith(".spool"):
                    self.spool(sub)
                    dirs.remove(name)
                elif name.endswith(".procs"):
                    dirs.remove(name)  # published figures: numbers, no content
            for name in sorted(files):
                self.file(base / name, named=False)

    def file(self, path: Path, *, named: bool) -> None:
        try:
            st = path.lstat()
        except OSError as exc:
            self.error(path, exc)
            return
        if stat.S_ISLNK(st.st_mode) and not named:
            self.skip(path, "a symbolic link (not followed)")
            return
        if _SIDE_FILES.fullmatch(path.name) and not named:
            return  # read with its database (or a lock file)
        if named:
            try:
                st = path.stat()
            except OSError as exc:
                self.error(path, exc)
                return
        if not stat.S_ISREG(st.st_mode):
            # A FIFO or a device would block the scan, or never end.  Named, it is what
            # was asked for, and unread: not known to be clean (exit 3, not 0).
            if named:
                self.error(path, errors.InvalidInput("not a regular file: not read"))
            else:
                self.skip(path, "not a regular file")
            return
        try:
            with path.open("rb") as f:
                head = f.read(_TEXT_PROBE)
        except OSError as exc:
            self.error(path, exc)
            return
        if head[:16] == _SQLITE_MAGIC or looks_encrypted(head):
            if looks_encrypted(head) and self.keyring is None:
                # (Not read, so not known to be clean: an error, exit 3, not a skip.)
                self.error(
                    path, errors.KeyMissing(_NO_KEY.format(what="an encrypted SQLite database"))
                )
            else:
                self.sqlite(path, sidecars=named)
        elif is_sealed(head):
            if self.keyring is None:
                self.error(path, errors.KeyMissing(_NO_KEY.format(what="sealed (encrypted)")))
            else:
                self.lines(path)
        elif named or path.name.endswith(JSON_SUFFIXES) or b"\0" not in head:
            # Any text file in a directory too (a .log, a .env, notes): skipped, a
            # directory of logs full of keys scanned "clean".
            if not head:
                self.report.scanned["files"] += 1
                return
            self.lines(path)
        else:
            self.skip(path, "a binary file, not a SQLite database")

    def skip(self, path: Path, why: str) -> None:
        self.report.skipped.append({"path": str(path), "why": why})

    def error(self, path: Path, exc: BaseException) -> None:
        message = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        self.report.errors.append({"path": str(path), "error": message})

    # -- findings -------------------------------------------------------------------------

    def found(self, kind: str, path: Path, where: dict[str, Any], secret: str) -> None:
        # A location is data too (a key column may hold a token): redacted before shown.
        shown = {k: self._clean(v) for k, v in where.items()}
        self.report.by_kind[kind] += 1
        self.on_finding(ScanFinding(kind, str(path), shown, preview(secret), fingerprint(secret)))

    def _clean(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.redactor.redact(value).text
        if isinstance(value, dict):
            return {self._clean(k): self._clean(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._clean(v) for v in value]
        if isinstance(value, bytes):
            return self.redactor.redact(value.decode("latin-1")).text
        return value

    def text(self, path: Path, where: dict[str, Any], value: str | bytes) -> None:
        """The findings of one value: JSON walked with its keys, else text."""
        text = value if isinstance(value, str) else _decode(value)
        self.report.scanned["values"] += 1
        if text.lstrip()[:1] in ("{", "["):
            parsed = _json(text)
            if parsed is not None:
                for json_path, string, f in self.redactor.find_in_value(parsed):
                    self.found(
                        f.kind, path, {**where, "json_path": json_path, "offset": f.start},
                        string[f.start : f.end],
                    )  # fmt: skip
                return
        for f in self.redactor.find(text):
            self.found(f.kind, path, {**where, "offset": f.start}, text[f.start : f.end])

    # -- SQLite files ---------------------------------------------------------------------

    def sqlite(self, path: Path, *, sidecars: bool) -> None:
        try:
            reader = _Reader(path, self.keyring)
            tables = reader.read(_tables)
        except (errors.FleetstoreError, OSError) as exc:
            self.error(path, exc)
            return
        self.report.scanned["databases"] += 1
        store = {t for t, _ in tables} >= STORE_TABLES
        for table, without_rowid in tables:
            try:
                if store and table == "chunks":
                    self.chunks(reader, path)
                else:
                    self.table(reader, path, table, without_rowid)
            except (errors.FleetstoreError, OSError) as exc:
                self.error(path, errors.DatabaseError(f"table {table}: {exc}"))
        if store and sidecars:
            blobs, spool = Path(f"{path}.blobs"), Path(f"{path}.spool")
            if blobs.is_dir() and not blobs.is_symlink():
                self.blobs(blobs, database=path)
            if spool.is_dir() and not spool.is_symlink():
                self.spool(spool)

    def table(self, reader: _Reader, path: Path, table: str, without_rowid: bool) -> None:
        columns = reader.columns(table)
        keys = [c for c, pk in sorted(columns, key=lambda c: c[1]) if pk]
        names = [c for c, _ in columns]
        ident = keys + [c for c in IDENTITY if c in names and c not in keys]
        alias = _rowid_alias(names)
        # By rowid; a WITHOUT ROWID table (or one whose columns hide every rowid name)
        # by its primary key.
        order = keys if without_rowid or alias is None else []
        select = ", ".join(_q(c) for c in names)
        self.report.scanned["tables"] += 1
        for row in _pages(reader, table, select, order, alias):
            self.report.scanned["rows"] += 1
            values = dict(zip(names, row[1:] if not order else row, strict=True))
            where_row = {c: values[c] for c in ident if c in values}
            if not where_row and not order:
                where_row = {"rowid": row[0]}
            for column, value in values.items():
                if isinstance(value, str | bytes) and value:
                    self.text(path, {"table": table, "column": column, "row": where_row}, value)

    def chunks(self, reader: _Reader, path: Path) -> None:
        """A fleetstore store's streamed text: each part's chunks as one stream."""
        self.report.scanned["tables"] += 1
        part: _Part | None = None
        select = "message_id, part_seq, seq, text"
        for message_id, part_seq, seq, text in _pages(
            reader, "chunks", select, ["message_id", "part_seq", "seq"], None
        ):
            self.report.scanned["rows"] += 1
            self.report.scanned["values"] += 1
            if part is None or part.key != (message_id, part_seq):
                if part is not None:
                    self._chunk_findings(path, part, part.finish())
                part = _Part((message_id, part_seq), self.redactor)
            value = text if isinstance(text, str) else _decode(text)
            self._chunk_findings(path, part, part.feed(seq, value))
        if part is not None:
            self._chunk_findings(path, part, part.finish())

    def _chunk_findings(
        self, path: Path, part: _Part, found: list[tuple[Finding, int, int, str]]
    ) -> None:
        for f, seq, offset, secret in found:
            row = {"message_id": part.key[0], "part_seq": part.key[1], "seq": seq}
            where = {"table": "chunks", "column": "text", "row": row, "offset": offset}
            self.found(f.kind, path, where, secret)

    # -- a store's blob files and spool journals ----------------------------------------

    def blobs(self, directory: Path, database: Path) -> None:
        """Each blob file (``<dir>/<sha[:2]>/<sha>``, zstd), read in pieces as one stream."""
        for sub in sorted(directory.iterdir()):
            if sub.is_symlink() or not sub.is_dir():
                continue
            for blob in sorted(sub.iterdir()):
                if blob.is_symlink() or not blob.is_file() or blob.name.startswith("."):
                    continue
                try:
                    found = self._blob(blob)
                except (OSError, zstandard.ZstdError) as exc:
                    self.error(blob, exc)
                    continue
                self.report.scanned["blobs"] += 1
                if found:
                    refs = _references(database, blob.name, self.keyring)
                    for f, secret in found:
                        self.found(
                            f.kind, blob,
                            {"blob": blob.name, "offset": f.start, "referenced_by": refs},
                            secret,
                        )  # fmt: skip

    def _blob(self, blob: Path) -> list[tuple[Finding, str]]:
        with blob.open("rb") as f:
            head = f.read(len(_ZSTD_MAGIC) * 2)
            f.seek(0)
            source: Any = f
            if is_sealed(head):
                if self.keyring is None:
                    self.error(blob, errors.KeyMissing(_NO_KEY.format(what="sealed (encrypted)")))
                    return []
                source = open_reader(f, self.keyring, str(blob))
                head = source.read(len(_ZSTD_MAGIC))
                source = _Prefixed(head, source)
            stream: Any = (
                zstandard.ZstdDecompressor().stream_reader(source)
                if head.startswith(_ZSTD_MAGIC)
                else source
            )
            text_stream = _TextStream(self.redactor)
            found: list[tuple[Finding, str]] = []
            while piece := stream.read(1024 * 1024):
                found += text_stream.feed(piece.decode("latin-1"))
            found += text_stream.finish()
            self.report.scanned["bytes"] += text_stream.length
        return found

    def spool(self, directory: Path) -> None:
        for journal in sorted(directory.iterdir()):
            if journal.is_symlink() or not journal.is_file():
                continue
            self.lines(journal, spool=True)

    # -- text files -----------------------------------------------------------------------

    def lines(self, path: Path, *, spool: bool = False) -> None:
        """A file line by line: each line that is JSON (a spool line after its checksum)
        walked as JSON, the others as text."""
        try:
            with self._opened(path) as f:
                for number, raw in enumerate(f, 1):
                    line = raw.rstrip(b"\r\n")
                    if spool and _JOURNAL_LINE.match(line):
                        line = line[9:]  # "<crc32 in hex> <json>" (store/spool.py)
                    if spool and line.startswith(b"!"):  # a sealed line (store/spool.py)
                        try:
                            line = unseal_text(line, self.keyring, f"{path}, line {number}")
                        except errors.KeyMissing:
                            self.error(path, errors.KeyMissing(_NO_KEY.format(what="sealed lines")))
                            return
                        except errors.FleetstoreError as exc:
                            self.error(path, exc)
                            continue
                    self.report.scanned["lines"] += 1
                    self.report.scanned["bytes"] += len(raw)
                    if line:
                        self.text(path, {"line": number}, line)
        except (OSError, errors.FleetstoreError, zstandard.ZstdError) as exc:
            self.error(path, exc)
            return
        self.report.scanned["journals" if spool else "files"] += 1

    @contextlib.contextmanager
    def _opened(self, path: Path) -> Iterator[Any]:
        """*path* to read line by line: a sealed file (an encrypted store's export)
        unsealed with the keyring, a zstd stream (an export) decompressed."""
        with path.open("rb") as f:
            source: Any = f
            head = f.read(len(sealed.MAGIC))
            f.seek(0)
            if is_sealed(head) and self.keyring is not None:
                source = open_reader(f, self.keyring, str(path))
            first = source.read(len(_ZSTD_MAGIC))
            if first == _ZSTD_MAGIC:
                stream = zstandard.ZstdDecompressor().stream_reader(
                    cast(IO[bytes], _Prefixed(first, source)), read_across_frames=True
                )
                yield io.BufferedReader(cast(Any, stream))
            else:
                yield io.BufferedReader(_Prefixed(first, source))


class _Prefixed(io.RawIOBase):
    """*head* (bytes already read) then the rest of *rest*."""

    def __init__(self, head: bytes, rest: Any) -> None:
        self._head = head
        self._rest = rest

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        if self._head:
            n = min(len(b), len(self._head))
            b[:n] = self._head[:n]
            self._head = self._head[n:]
            return n
        data = self._rest.read(len(b))
        b[: len(data)] = data
        return len(data)


_NO_KEY = (
    "{what}: nothing read without its key (give the store's keyring: fleetstore "
    "--key-file FILE scan, or FLEETSTORE_ENCRYPTION_KEY_FILE)"
)


class _TextStream:
    """A text read in pieces: its findings, each with its secret cut out before the
    pieces it lies in are dropped (memory: what the matcher holds, plus one piece)."""

    def __init__(self, redactor: Redactor) -> None:
        self._matcher = redactor.matcher()
        self._pieces: list[tuple[int, str]] = []  # (offset, text) not yet decided past
        self.length = 0

    def feed(self, text: str) -> list[tuple[Finding, str]]:
        self._pieces.append((self.length, text))
        self.length += len(text)
        return self._cut(self._matcher.feed(text))

    def finish(self) -> list[tuple[Finding, str]]:
        return self._cut(self._matcher.finish())

    def _cut(self, found: list[Finding]) -> list[tuple[Finding, str]]:
        out = []
        if found:
            base = self._pieces[0][0]
            joined = "".join(t for _, t in self._pieces)
            out = [(f, joined[f.start - base : f.end - base]) for f in found]
        decided = self._matcher.decided
        self._pieces = [(o, t) for o, t in self._pieces if o + len(t) > decided]
        return out


class _Part:
    """One streamed part of a fleetstore store: its chunks (by seq) as one text."""

    def __init__(self, key: tuple[Any, Any], redactor: Redactor) -> None:
        self.key = key
        self._stream = _TextStream(redactor)
        self._starts: list[tuple[int, int]] = []  # (offset of a chunk in the part, its seq)

    def feed(self, seq: int, text: str) -> list[tuple[Finding, int, int, str]]:
        self._starts.append((self._stream.length, seq))
        return self._place(self._stream.feed(text))

    def finish(self) -> list[tuple[Finding, int, int, str]]:
        return self._place(self._stream.finish())

    def _place(self, found: list[tuple[Finding, str]]) -> list[tuple[Finding, int, int, str]]:
        """Each finding with the seq of the chunk it starts in and its offset there."""
        out = []
        for f, secret in found:
            start, seq = next((o, s) for o, s in reversed(self._starts) if o <= f.start)
            out.append((f, seq, f.start - start, secret))
        return out


class _Reader:
    """Short read transactions on one SQLite file, each through its own strictly
    read-only connection; a file that changed during an unlocked read is read again."""

    def __init__(self, path: Path, keyring: Keyring | None = None) -> None:
        self.path = str(path)
        self._key = key_of_file(self.path, keyring, strict=False)
        self._foreign = ForeignFile(self.path, self._key)

    def read(self, fn: Callable[[ReadOnlyDatabase], Any]) -> Any:
        for attempt in range(_ATTEMPTS):
            try:
                return self._foreign.read(fn)
            except FileChanged:
                if attempt == _ATTEMPTS - 1:
                    raise
                self._foreign = ForeignFile(self.path, self._key)
        raise AssertionError("unreachable")

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        rows: list[Any] = self.read(lambda db: db.query(sql, params))
        return rows

    def columns(self, table: str) -> list[tuple[str, int]]:
        found: list[tuple[str, int]] = self.read(lambda db: _columns(db, table))
        return found


def _tables(db: ReadOnlyDatabase) -> list[tuple[str, bool]]:
    rows = db.query(
        "SELECT name, wr FROM pragma_table_list WHERE schema = 'main' "
        "AND type IN ('table', 'shadow') AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' "
        "ORDER BY name"
    )
    return [(str(name), bool(wr)) for name, wr in rows]


def _columns(db: ReadOnlyDatabase, table: str) -> list[tuple[str, int]]:
    rows = db.query("SELECT name, pk FROM pragma_table_info(?) ORDER BY cid", (table,))
    columns = [(str(name), int(pk)) for name, pk in rows]
    by_pk = sorted((pk, name) for name, pk in columns if pk)
    order = {name: i + 1 for i, (_, name) in enumerate(by_pk)}
    return [(name, order.get(name, 0)) for name, _ in columns]


def _rowid_alias(names: Sequence[str]) -> str | None:
    lowered = {n.lower() for n in names}
    return next((a for a in ("rowid", "_rowid_", "oid") if a not in lowered), None)


def _pages(
    reader: _Reader, table: str, select: str, order: list[str], alias: str | None
) -> Iterator[tuple[Any, ...]]:
    """Every row of *table*: by rowid (first column), or by the *order* columns (a
    WITHOUT ROWID table's key), BATCH rows per read transaction."""
    name = _q(table)
    if order:
        keys = ", ".join(_q(c) for c in order)
        first = f"SELECT {select}, {keys} FROM {name} ORDER BY {keys} LIMIT {BATCH}"
        after = (
            f"SELECT {select}, {keys} FROM {name} WHERE ({keys}) > "
            f"({', '.join('?' for _ in order)}) ORDER BY {keys} LIMIT {BATCH}"
        )
        params: tuple[Any, ...] | None = None
        while True:
            sql, args = (first, ()) if params is None else (after, params)
            rows = reader.query(sql, args)
            for row in rows:
                yield tuple(row[: len(row) - len(order)])
            if len(rows) < BATCH:
                return
            params = tuple(rows[-1][len(rows[-1]) - len(order) :])
    elif alias is not None:
        sql = (
            f"SELECT {alias}, {select} FROM {name} WHERE {alias} > ? ORDER BY {alias} LIMIT {BATCH}"
        )
        last: Any = None
        while True:
            rows = reader.query(sql, (-(2**63) if last is None else last,))
            yield from (tuple(r) for r in rows)
            if len(rows) < BATCH:
                return
            last = rows[-1][0]
    else:  # no rowid to page by and no key: one read
        yield from ((None, *r) for r in reader.query(f"SELECT {select} FROM {name}"))


def _references(database: Path, sha: str, keyring: Keyring | None) -> list[dict[str, Any]]:
    """The rows of *database* (and, for a sharded store's catalog, of its shards) that
    refer to blob *sha*: their table and key columns."""
    files = [database]
    shards = database.parent / "shards"
    if database.name == "catalog.db" and shards.is_dir():
        files += sorted(p for p in shards.rglob("*.db") if p.is_file() and not p.is_symlink())
    refs: list[dict[str, Any]] = []
    for file in files:
        try:
            reader = _Reader(file, keyring)
            for table, _ in reader.read(_tables):
                columns = reader.columns(table)
                names = [c for c, _ in columns]
                if "blob_sha" not in names or table == "blobs":
                    continue
                ident = [c for c, pk in columns if pk] + [
                    c for c in IDENTITY if c in names and not dict(columns).get(c)
                ]
                sql = f"SELECT {', '.join(_q(c) for c in ident)} FROM {_q(table)} WHERE blob_sha = ? LIMIT 20"
                for row in reader.query(sql, (sha,)):
                    refs.append({"table": table, "row": dict(zip(ident, row, strict=True))})
        except (errors.FleetstoreError, OSError, InspectFailed):
            continue
    return refs


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _decode(data: bytes) -> str:
    """Bytes as text: UTF-8 if they are, else one character per byte (ASCII tokens in
    binary data, a pickled or msgpack'd checkpoint, still show)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def _json(text: str) -> Any:
    if len(text) > MAX_JSON:
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict | list) else None


__all__ = ["ScanFinding", "ScanReport", "scan"]
