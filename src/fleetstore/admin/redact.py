"""``fleetstore redact``: the secrets a store already holds (written before redaction,
with it off, imported, or found by rules added since) replaced by their markers.

Every part body (inline or a blob), every streamed part of a message no longer being
streamed (its chunks read as one text, so a secret cut by a flush is caught, and put
back as one chunk), every state value, every effect's payload, result and errors,
every session's title and metadata (in the file that holds the session) and every
message's metadata and error is read in pages of short read transactions and redacted
with the store's rules (built-in, plus ``redaction_rules_file``).  Each row that
changes is rewritten by one logged operation (``mnt_redact``, ``mnt_redact_effect``)
whose id is derived from the row and what it held: applied exactly once, and only if
the row still holds what was read (a row written meanwhile is left for the next run).
Killed (``kill -9``), a run again carries on: what was rewritten reads clean and is
skipped.

What a rewrite does not reach by itself: the blob files of the payloads replaced (no
row refers to them any more: ``fleetstore maintain`` deletes them, after its grace),
exports and backups made before, and the frameworks' own bodies (LangGraph
checkpoints, Agents SDK items and ADK events are serialized bytes: see
docs/secrets.md).  SQLite's freed pages are zeroed (the driver's SECURE_DELETE) and the
WAL is checkpointed and truncated at the end when nobody reads an old snapshot.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from fleetstore import errors
from fleetstore.core.ids import derived_id
from fleetstore.core.redact import WriteRedaction, write_redaction
from fleetstore.core.validate import MAX_ERROR_TEXT, MAX_SHORT
from fleetstore.domain.codec import prepare_payload, write_payload
from fleetstore.domain.maintenance import stored_digest
from fleetstore.domain.operations import Operation
from fleetstore.domain.outbox_ops import MAX_ERROR
from fleetstore.store.facade import Store

#: Rows read per read transaction.
PAGE = 256
Progress = Callable[[str, int], None]


@dataclass
class RedactReport:
    """What a run found and did."""

    store: str
    dry_run: bool
    #: Rows read, by table.
    scanned: Counter[str] = field(default_factory=Counter)
    #: Rows rewritten (or, in a dry run, that would be), by table.
    rewritten: Counter[str] = field(default_factory=Counter)
    #: Secrets replaced, by kind.
    by_kind: Counter[str] = field(default_factory=Counter)
    #: Rows written by someone else between the read and the rewrite: left as they are.
    changed_meanwhile: int = 0
    #: Rows rewritten by an earlier run the operation log remembers.
    already: int = 0
    #: Blob files of replaced payloads (no row refers to them now): left for
    #: ``fleetstore maintain``'s blob collection, after its grace.
    left_blobs: set[str] = field(default_factory=set)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "store": self.store,
            "dry_run": self.dry_run,
            "scanned": dict(self.scanned),
            "rewritten": dict(self.rewritten),
            "by_kind": dict(self.by_kind),
            "secrets": sum(self.by_kind.values()),
            "changed_meanwhile": self.changed_meanwhile,
            "already": self.already,
            "left_blobs": len(self.left_blobs),
            "seconds": round(self.seconds, 3),
        }


def redact_store(
    store: Store, *, dry_run: bool = False, progress: Progress | None = None
) -> RedactReport:
    """Redact what *store* holds (see the module docstring) and report."""
    started = time.monotonic()
    # The store's own rules, whether it redacts as it writes or not (the point here).
    redaction = write_redaction(store.settings.redaction_rules_file)
    run = _Run(store, redaction, dry_run, progress)
    for key, read in _files(store):
        run.sessions(read, key)
        run.messages(read)
        run.parts(read)
        run.streamed(read)
        run.states(read)
        run.effects(read)
    refreshed = 0
    if store.router is not None and not dry_run:
        # The catalog's copies of the rows rewritten in shards (and of rows a run
        # before this one rewrote): a CLI run closes without the background refresh,
        # and the titles stayed in catalog.db, listed, scanned and backed up.
        refreshed = store.router.resync(run.stale_copies)
    report = run.report
    report.by_kind = Counter(redaction.counts)
    if not dry_run and store.dialect == "sqlite" and (report.rewritten or refreshed):
        # Old page images leave the WAL (SECURE_DELETE zeroed them in the file).
        for db in _engines(store):
            try:
                db.checkpoint(truncate=True)
            except errors.FleetstoreError:
                pass  # a reader holds an old snapshot: the next checkpoint does it
    report.seconds = time.monotonic() - started
    return report


Read = Callable[[str, dict[str, Any]], list[Any]]


def _engines(store: Store) -> list[Any]:
    found: list[Any] = []
    store.backend.each(lambda _key, db: found.append(db))
    return found


def _files(store: Store) -> Iterator[tuple[str | None, Read]]:
    """Each database file of *store*: its key, and a reader ``read(query name, params)``."""
    q = store.queries

    def reader(db: Any) -> Read:
        return lambda name, params: db.read(lambda tx: tx.execute(q[name], params))

    for key in store.backend.file_keys():
        with store.backend.use(key) as db:
            yield key, reader(db)


class _Run:
    def __init__(
        self, store: Store, redaction: WriteRedaction, dry_run: bool, progress: Progress | None
    ) -> None:
        self.store = store
        self.redaction = redaction
        self.dry_run = dry_run
        self.progress = progress
        self.report = RedactReport(str(store.url), dry_run)
        #: Shards whose sessions' copies in a sharded catalog hold a secret.
        self.stale_copies: set[str] = set()

    def _apply(
        self, table: str, name: str, args: dict[str, Any], old_blob: str | None, *ident: str
    ) -> None:
        self.report.rewritten[table] += 1
        if old_blob is not None:
            self.report.left_blobs.add(old_blob)
        if self.dry_run:
            return
        op_id = derived_id("redact", name, *ident, args["expect"])
        result = self.store.apply(Operation(name, args, op_id))
        if result.get("duplicate"):
            self.report.already += 1
        elif result.get("changed"):
            self.report.rewritten[table] -= 1
            self.report.changed_meanwhile += 1

    def _tick(self, table: str) -> None:
        self.report.scanned[table] += 1
        if self.progress is not None:
            self.progress(table, self.report.scanned[table])

    def _value(self, enc: str, body: Any, sha: str | None, size: int) -> tuple[Any, Any]:
        """(the stored value, its redacted form) of an encoded row."""
        if sha is not None:
            raw: Any = self.store.blobs.get(sha, size)
        else:
            raw = body if not isinstance(body, memoryview) else bytes(body)
        if enc == "bytes":
            data = bytes(raw or b"")
            return data, self.redaction.data(data)
        text = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw or "")
        if self.redaction.screen(text) is None:
            return text, text
        new = self.redaction.json_text(text) if enc == "json" else self.redaction.text(text)
        return text, new

    def _encoded(self, new: Any, enc: str) -> dict[str, Any]:
        if self.dry_run:
            return {}
        return write_payload(self.store, prepare_payload(self.store, new, enc))

    def parts(self, read: Read) -> None:
        after: tuple[str, int] = ("", -1)
        while rows := read("red_parts_page", {"m": after[0], "after_seq": after[1], "limit": PAGE}):
            for mid, seq, sid, enc, body, sha, size in rows:
                self._tick("parts")
                old, new = self._value(enc, body, sha, size)
                if new != old:
                    args = {
                        "what": "part",
                        "session_id": sid,
                        "message_id": mid,
                        "seq": seq,
                        "expect": stored_digest(enc, body, sha),
                        "value": self._encoded(new, enc),
                    }
                    self._apply("parts", "mnt_redact", args, sha, mid, str(seq))
            after = (str(rows[-1][0]), int(rows[-1][1]))

    def streamed(self, read: Read) -> None:
        after: tuple[str, int] = ("", -1)
        while rows := read(
            "red_streamed_page", {"m": after[0], "after_seq": after[1], "limit": PAGE}
        ):
            for mid, seq, sid in rows:
                self._tick("chunks")
                chunks = read("red_chunks", {"message_id": mid, "part_seq": seq})
                text = "".join(str(c[1]) for c in chunks)
                if not text or self.redaction.screen(text) is None:
                    continue
                new = self.redaction.text(text)
                if new != text:
                    args = {
                        "what": "chunks",
                        "session_id": sid,
                        "message_id": mid,
                        "seq": seq,
                        "expect": stored_digest(text),
                        "text": new,
                    }
                    self._apply("chunks", "mnt_redact", args, None, mid, str(seq))
            after = (str(rows[-1][0]), int(rows[-1][1]))

    def states(self, read: Read) -> None:
        after = ("", "", "")
        while rows := read(
            "red_state_page", {"s": after[0], "n": after[1], "k": after[2], "limit": PAGE}
        ):
            for sid, ns, key, enc, value, sha, size in rows:
                self._tick("state")
                old, new = self._value(enc, value, sha, size)
                if new != old:
                    args = {
                        "what": "state",
                        "session_id": sid,
                        "namespace": ns,
                        "key": key,
                        "expect": stored_digest(enc, value, sha),
                        "value": self._encoded(new, enc),
                    }
                    self._apply("state", "mnt_redact", args, sha, sid, ns, key)
            after = (str(rows[-1][0]), str(rows[-1][1]), str(rows[-1][2]))

    def _text(self, text: str | None, limit: int) -> str | None:
        """*text* redacted (within *limit*: a marker may be longer than its secret)."""
        if text is None or self.redaction.screen(text) is None:
            return text
        return self.redaction.text(text)[:limit]

    def _json(self, text: str) -> str:
        if self.redaction.screen(text) is None:
            return text
        return self.redaction.json_text(text)

    def _metadata(self, text: str) -> tuple[str, dict[str, Any] | None]:
        """Metadata's JSON redacted, and the object it is now (None: not a JSON object,
        which no write of fleetstore's makes: the row is left as it is)."""
        new = self._json(text)
        try:
            value = json.loads(new)
        except ValueError:
            return text, None
        return (new, value) if isinstance(value, dict) else (text, None)

    def sessions(self, read: Read, key: str | None) -> None:
        """Titles and metadata, each in the file that holds the session (a sharded
        catalog also keeps a copy of its shards' rows, refreshed from them)."""
        after = ""
        homed = key is None and self.store.backend.file_keys() != [None]
        while rows := read("red_sessions_page", {"id": after, "limit": PAGE}):
            for sid, title, metadata in rows:
                self._tick("sessions")
                home = self.store.backend.home(sid) if homed else None
                if home is not None:  # the catalog's copy of a shard's row: refreshed
                    screen = self.redaction.screen  # (counts nothing: the shard's row does)
                    if screen(title or "") is not None or screen(metadata) is not None:
                        self.stale_copies.add(home)
                    continue
                new_meta, meta = self._metadata(metadata)
                new_title = self._text(title, MAX_SHORT)
                if meta is not None and (new_title, new_meta) != (title, metadata):
                    args = {
                        "what": "session",
                        "session_id": sid,
                        "expect": stored_digest(title, metadata),
                        "title": new_title,
                        "metadata": meta,
                    }
                    self._apply("sessions", "mnt_redact", args, None, sid)
            after = str(rows[-1][0])

    def messages(self, read: Read) -> None:
        """Messages' metadata and errors (a stream's error is an exception's message)."""
        after = ""
        while rows := read("red_messages_page", {"id": after, "limit": PAGE}):
            for mid, sid, metadata, error in rows:
                self._tick("messages")
                new_meta, meta = self._metadata(metadata)
                new_error = self._text(error, MAX_ERROR_TEXT)
                if meta is not None and (new_meta, new_error) != (metadata, error):
                    args = {
                        "what": "message",
                        "session_id": sid,
                        "message_id": mid,
                        "expect": stored_digest(metadata, error),
                        "metadata": meta,
                        "error": new_error,
                    }
                    self._apply("messages", "mnt_redact", args, None, mid)
            after = str(rows[-1][0])

    def effects(self, read: Read) -> None:
        after = ""
        while rows := read("red_effects_page", {"id": after, "limit": PAGE}):
            for eid, enc, payload, sha, size, result, last_error, kept in rows:
                self._tick("effects")
                old, new = self._value(enc, payload, sha, size)
                new_result = result if result is None else self._json(result)
                new_last, new_kept = self._text(last_error, MAX_ERROR), self._json(kept)
                if not _a_list(new_kept):
                    if not _a_list(kept):
                        continue  # no write of fleetstore's makes this: left as it is
                    new_kept = kept
                if (new, new_result, new_last, new_kept) != (old, result, last_error, kept):
                    args = {
                        "id": eid,
                        "expect": stored_digest(enc, payload, sha, result, last_error, kept),
                        "value": self._encoded(new, enc),
                        "result": new_result,
                        "last_error": new_last,
                        "errors": new_kept,
                    }
                    self._apply("effects", "mnt_redact_effect", args, sha, eid)
            after = str(rows[-1][0])


def _a_list(text: str) -> bool:
    try:
        return isinstance(json.loads(text), list)
    except ValueError:
        return False


__all__ = ["RedactReport", "redact_store"]
