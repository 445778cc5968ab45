"""The Store: one object per open store, holding the engine, the blob files,
the spool and the domain APIs (``sessions``, ``messages``, ``state``).

Every write goes through ``Store.submit(operation)``: applied now within the
write budget, or, past it, appended to this process's spool and applied later
in order (``on_busy="spool"``, the default) or refused with ``StoreBusy``
(``on_busy="raise"``).  Once anything is spooled, later writes of the process
queue behind it, so a process's writes land in the order it made them.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from fleetstore import errors, operations, sql
from fleetstore.blobs import BlobStore
from fleetstore.engine.base import Tx
from fleetstore.engine.sqlite import Database, Migration
from fleetstore.history import Messages, Sessions, Stream
from fleetstore.operations import Operation
from fleetstore.settings import Settings, default_data_dir
from fleetstore.spool import Recovered, Spool, journals, recover_journal, reject
from fleetstore.state import State

T = TypeVar("T")
log = logging.getLogger("fleetstore")

DEFAULT_FILENAME = "fleetstore.db"


def resolve_target(url_or_path: str | os.PathLike[str] | None) -> Path:
    """The SQLite file a URL or path names.  ``None``: ``$FLEETSTORE_URL``, else
    ``<data dir>/fleetstore.db``.  A directory means ``<dir>/fleetstore.db``."""
    if url_or_path is None:
        url_or_path = os.environ.get("FLEETSTORE_URL") or None
    if url_or_path is None:
        return default_data_dir() / DEFAULT_FILENAME
    text = os.fspath(url_or_path)
    if "://" in text:
        scheme, _, rest = text.partition("://")
        if scheme != "sqlite":
            raise errors.ConfigError(
                f"unsupported store URL scheme {scheme!r} in {text!r}: this version opens "
                "SQLite stores (a path, or sqlite:///absolute/path)"
            )
        if not rest.startswith("/"):
            raise errors.ConfigError(f"{text!r}: write sqlite:///absolute/path (three slashes)")
        text = rest
    if not text:
        raise errors.ConfigError("an empty store path")
    path = Path(text).expanduser()
    if path.is_dir():
        path = path / DEFAULT_FILENAME
    return path


def migrations(dialect: str = "sqlite") -> list[Migration]:
    return [Migration(m.version, m.name, m.sql) for m in sql.migrations(dialect)]


_live: weakref.WeakSet[Store] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for store in list(_live):
        store._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


class Store:
    """An open fleetstore store.  Use ``fleetstore.open()``; thread-safe."""

    def __init__(self, db: Database, settings: Settings) -> None:
        self.db = db
        self.settings = settings
        self.path = Path(db.path)
        self.queries = sql.queries("sqlite")
        self.blobs = BlobStore(str(self.path) + ".blobs", settings.max_payload_bytes)
        self.spool_dir = Path(str(self.path) + ".spool")
        self.sessions = Sessions(self)
        self.messages = Messages(self)
        self.state = State(self)
        self._closed = False
        self._op_counts: collections.Counter[str] = collections.Counter()
        self._rejected = 0
        self._init_process()
        _live.add(self)

    def _init_process(self) -> None:
        self.spool = Spool(self.spool_dir)
        self._cond = threading.Condition()
        self._streams: set[Stream] = set()
        self._thread: threading.Thread | None = None
        self._stop = False

    def _after_fork(self) -> None:
        # Threads do not survive a fork: a child starts its own spool and flusher.
        self._init_process()

    # -- writing ---------------------------------------------------------------------------

    def submit(self, op: Operation, *, spool: bool = True) -> dict[str, Any] | None:
        """Apply *op*; returns its result, or None if it went to the spool."""
        self._check_open()
        self._op_counts[op.name] += 1
        may_spool = spool and self.settings.on_busy == "spool"
        if len(self.spool):
            if not may_spool:
                raise errors.SpoolPending(
                    f"{len(self.spool)} earlier write(s) of this process wait in its spool; "
                    f"a {op.name} that must not be spooled cannot overtake them; "
                    "retry after store.flush()"
                )
            self._spool(op)
            return None
        try:
            return self.apply(op)
        except errors.StoreBusy:
            if not may_spool:
                raise
            self._spool(op)
            return None

    def apply(self, op: Operation) -> dict[str, Any]:
        """Apply *op* now, in its own write transaction (``StoreBusy`` past the budget)."""
        with self.db.write() as tx:
            return operations.apply(tx, self.queries, op, time.time())

    def _spool(self, op: Operation) -> None:
        self.spool.append(op)
        log.warning(
            "%s: the write lock stayed taken past the %.1fs budget; %s spooled (%d waiting)",
            self.path,
            self.settings.write_budget,
            op.name,
            len(self.spool),
        )
        self._wake()

    def spooled_for(self, session_id: str) -> bool:
        return bool(len(self.spool)) and session_id in self.spool.session_ids()

    def check_visible(self, session_id: str | None) -> None:
        """Raise ``SpoolPending`` if a read of *session_id* (None: of anything) would
        miss writes of this process still in its spool."""
        pending = len(self.spool)
        if not pending:
            return
        if session_id is not None and session_id not in self.spool.session_ids():
            return
        raise errors.SpoolPending(
            f"{pending} write(s) of this process wait in its spool"
            + (f", some to session {session_id!r}" if session_id else "")
            + "; this read would not see them. store.flush() waits until they are applied."
        )

    def flush(self, timeout: float | None = None) -> bool:
        """Write pending stream text and wait until this process's spool is empty
        (at most *timeout* seconds; default: the write budget).  True if it is."""
        for stream in list(self._streams):
            stream.flush()
        deadline = time.monotonic() + (self.settings.write_budget if timeout is None else timeout)
        while len(self.spool):
            if self._thread is None or not self._thread.is_alive():
                self._wake()
            with self._cond:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(min(remaining, 0.05))
        return True

    # -- reading ---------------------------------------------------------------------------

    def read(self, fn: Callable[[Tx], T]) -> T:
        self._check_open()
        return self.db.read(fn)

    # -- background work: the spool drain and timed stream flushes -------------------------

    def streams_opened(self, stream: Stream) -> None:
        with self._cond:
            self._streams.add(stream)
        self._wake()

    def streams_closed(self, stream: Stream) -> None:
        with self._cond:
            self._streams.discard(stream)

    def _wake(self) -> None:
        with self._cond:
            if self._thread is None or not self._thread.is_alive():
                self._stop = False
                self._thread = threading.Thread(
                    target=self._background, name="fleetstore-background", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()

    def _background(self) -> None:
        while True:
            with self._cond:
                if self._stop:
                    return
                op = self.spool.head()
                due = [d for s in self._streams if (d := s.due()) is not None]
                if op is None:
                    now = time.monotonic()
                    wait = (min(due) - now) if due else None
                    if wait is None and not self._streams:
                        return  # nothing to do: the next write or stream starts us again
                    if wait is None or wait > 0:
                        self._cond.wait(wait if wait is not None else 1.0)
                        continue
                ready = [
                    s for s in self._streams if (d := s.due()) is not None and d <= time.monotonic()
                ]
            for stream in ready:
                try:
                    stream.flush()
                except errors.FleetstoreError as exc:
                    log.error("%s: timed flush of message %s failed: %s", self.path, stream.id, exc)
            if op is not None:
                self._replay(op)

    def _replay(self, op: Operation) -> None:
        try:
            self.apply(op)
        except errors.TransientError:
            return  # still locked: the next pass tries again (the gate wait is the backoff)
        except errors.StoreClosed:
            with self._cond:
                self._stop = True
            return
        except errors.PermanentError as exc:
            # It can never apply (e.g. its session was deleted meanwhile): keep it
            # with the reason in rejected.jsonl, loudly; never drop it silently.
            reject(self.spool_dir, op, exc)
            self._rejected += 1
            log.error("%s: spooled %s rejected on replay: %s", self.path, op.name, exc)
        self.spool.done(op)
        with self._cond:
            self._cond.notify_all()

    def recover(self) -> list[Recovered]:
        """Replay the journals of processes that died with writes in their spool."""
        self._check_open()
        results = []
        for path in journals(self.spool_dir):
            if self.spool._path is not None and path == self.spool._path:
                continue
            results.append(recover_journal(path, self.apply))
        return results

    # -- observing and closing -------------------------------------------------------------

    def metrics(self) -> dict[str, Any]:
        """This process's figures: the engine's, plus operations, spool and streams."""
        return {
            **self.db.metrics(),
            "operations": dict(self._op_counts),
            "spool_pending": len(self.spool),
            "spooled": self.spool.spooled_total,
            "replayed": self.spool.replayed_total,
            "rejected": self._rejected,
            "open_streams": len(self._streams),
        }

    def _check_open(self) -> None:
        if self._closed:
            raise errors.StoreClosed(f"{self.path}: the store was closed")

    def close(self, timeout: float | None = None) -> None:
        """Flush open streams, wait (up to *timeout*, default the write budget) for the
        spool to drain, and close.  Writes still spooled stay in the journal, for
        ``fleetstore recover`` or the next ``fleetstore.open``.  Idempotent."""
        if self._closed:
            return
        try:
            if not self.flush(timeout):
                log.error(
                    "%s: closing with %d write(s) still in the spool journal %s; "
                    "`fleetstore recover` or the next open applies them",
                    self.path,
                    len(self.spool),
                    self.spool._path,
                )
        finally:
            with self._cond:
                self._stop = True
                self._cond.notify_all()
            thread = self._thread
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=self.settings.write_budget + 1)
            self._closed = True
            self.spool.close()
            self.db.close()
            _live.discard(self)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<fleetstore.Store {str(self.path)!r}{' closed' if self._closed else ''}>"


def open(url_or_path: str | os.PathLike[str] | None = None, **settings: Any) -> Store:
    """Open (creating if needed) a store.  *url_or_path*: a file path, a directory,
    or ``sqlite:///absolute/path``; default ``$FLEETSTORE_URL``, else
    ``<data dir>/fleetstore.db``.  *settings* are ``Settings`` fields (each also
    ``FLEETSTORE_<NAME>``).  Journals left by processes that died are replayed."""
    config = Settings.load(**settings)
    path = resolve_target(url_or_path)
    db = Database.open(path, migrations(), **dataclasses.asdict(config))
    store = Store(db, config)
    try:
        if any(True for _ in journals(store.spool_dir)):
            for result in store.recover():
                if result.status not in ("replayed", "busy"):
                    log.error(
                        "%s: recovering %s: %s %s",
                        path,
                        result.journal,
                        result.status,
                        result.detail,
                    )
    except errors.TransientError as exc:
        log.error("%s: journals of dead processes not replayed yet: %s", path, exc)
    except BaseException:
        store.close(timeout=0)
        raise
    return store


__all__ = ["DEFAULT_FILENAME", "Store", "open", "resolve_target"]
