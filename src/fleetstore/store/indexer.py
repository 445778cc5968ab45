"""This process's search indexer: a thread that keeps the index of the files this
process writes up to date (docs/search.md, "Keeping the index").

It starts with the store's first write (a process that only reads never indexes) when
``search_index`` is on, looks at its files every ``search_interval`` seconds, and, while
one has anything queued (or a backfill to do), indexes it batch after batch, each in a
short write transaction whose size follows its measured hold
(``domain/search_index.py``), resting after each so as to take at most
``search_share`` of the process's time.  The files: the store's one database, or a sharded
store's catalog and the shards this process wrote to (a shard stays on the list until
its queue is found empty).  One process indexes a file at a time (a lease in the file);
the others' threads look and wait.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from fleetstore import errors
from fleetstore.domain.ports import StorePort
from fleetstore.domain.search_index import FIRST_CHARS, Batch, index_batch, next_size, queue_lag
from fleetstore.engine.base import Engine

log = logging.getLogger("fleetstore")

#: Seconds between the indexer's looks at how far its files are behind (for figures).
_LAG_EVERY = 5.0


class Indexer:
    """The indexer thread of one store in one process."""

    def __init__(
        self,
        store: StorePort,
        shard_keys: Callable[[], list[str]] | None,
        on_exit: Callable[[], None],
    ) -> None:
        """*shard_keys*: the shards this process wrote to since it was last called (a
        sharded store); *on_exit*: called when the thread ends (``running`` False)."""
        self._store = store
        self._shard_keys = shard_keys
        self._on_exit = on_exit
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._keys: dict[str | None, int] = {None: FIRST_CHARS}
        self._figures: dict[str, Any] = {
            "search_batches": 0,
            "search_sections": 0,
            "search_chars": 0,
            "search_hold_s": 0.0,
            "search_errors": 0,
            "search_queued": 0,
            "search_lag_s": 0.0,
        }
        self._lag_at = 0.0
        #: The thread is running (maybe inside a batch): close() leaves the closing of
        #: the database to it if it outlives its join (Store._left).
        self.running = False

    def start(self) -> None:
        """Start the thread (once; a store closed or opened read-only starts none)."""
        with self._cond:
            if self._thread is not None or self._stopped:
                return
            self._thread = threading.Thread(
                target=self._main, name="fleetstore-search", daemon=True
            )
            self.running = True
            self._thread.start()

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def stop(self, timeout: float) -> None:
        """Stop the thread, waiting up to *timeout* seconds for the batch under way."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def figures(self) -> dict[str, Any]:
        with self._cond:
            return dict(self._figures)

    def _main(self) -> None:
        try:
            self._run()
        finally:
            self.running = False
            self._on_exit()

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._stopped:
                    return
            busy = False
            try:
                busy = self._round()
            except Exception as exc:  # closing, a file moved away...: try again later
                log.warning("search indexing: %s", exc)
                with self._cond:
                    self._figures["search_errors"] += 1
            with self._cond:
                if self._stopped:
                    return
                if not busy:
                    self._cond.wait(self._store.settings.search_interval)

    def _round(self) -> bool:
        """Index every file that has something to index, until each is done (or another
        process indexes it); whether any batch was written."""
        if self._shard_keys is not None:
            for shard in self._shard_keys():
                self._keys.setdefault(shard, FIRST_CHARS)
        wrote = False
        for key in list(self._keys):
            while not self._stopped:
                chars = self._keys[key]

                def one(db: Engine, chars: int = chars) -> Batch:
                    return index_batch(self._store, db, chars)

                began = time.monotonic()
                try:
                    batch = self._store.with_file(key, one)
                except errors.NotFound:
                    batch = Batch(idle=True)  # the shard was moved away (archived)
                except errors.FleetstoreError as exc:
                    log.warning("search indexing of %s: %s", key or "the store", exc)
                    with self._cond:
                        self._figures["search_errors"] += 1
                    break
                self._count(batch)
                if batch.idle or batch.busy:
                    if batch.idle and key is not None:
                        del self._keys[key]
                    break
                wrote = True
                self._keys[key] = next_size(chars, batch)
                self._rest(time.monotonic() - began)
        self._look_at_lag()
        return wrote

    def _rest(self, spent: float) -> None:
        """After a batch that took *spent* seconds, rest so that the indexer takes at
        most ``search_share`` of this process's time (a ``wake`` does not cut it short:
        only ``stop``)."""
        share = self._store.settings.search_share
        until = time.monotonic() + spent * (1.0 / share - 1.0)
        with self._cond:
            while not self._stopped and (left := until - time.monotonic()) > 0:
                self._cond.wait(left)

    def _count(self, batch: Batch) -> None:
        if not batch.owners:
            return
        with self._cond:
            f = self._figures
            f["search_batches"] += 1
            f["search_sections"] += batch.docs
            f["search_chars"] += batch.chars
            f["search_hold_s"] += batch.hold

    def _look_at_lag(self) -> None:
        now = time.monotonic()
        if now - self._lag_at < _LAG_EVERY:
            return
        self._lag_at = now
        queued, worst = queue_lag(self._store, list(self._keys))
        with self._cond:
            self._figures["search_queued"] = queued
            self._figures["search_lag_s"] = round(worst, 3)


__all__ = ["Indexer"]
