"""t3code's SQLite effect outbox, as one t3code server runs it, for ``fleetstore stress
--compare`` (target ``t3code``): replayed to compare, never used by fleetstore itself.

Modelled from pingdotgg/t3code (docs/benchmarks.md, "The t3code target", lists what was
read and what was guessed):

* ``packages/shared/src/nodeSqliteClient.ts`` (0634c9f3): one connection per server,
  every statement and every transaction behind one single-permit semaphore; the
  calls are synchronous, so a statement waiting out the busy timeout holds the permit
  (in Node it holds the whole event loop).
* ``apps/server/src/orchestration-v2/EffectOutbox.ts`` (037c0385): the
  ``orchestration_v2_effect_outbox`` table, a claim by ``UPDATE … RETURNING`` that takes
  a lease (``lease_owner``, ``lease_expires_at``) of the oldest claimable row, per-thread
  single-flight lanes (a ``running`` row, or an earlier ``pending`` one, blocks the later
  effects of its thread), settlement fenced on ``lease_owner`` only (no fencing token),
  and ``reconcileAfterProcessLoss``: at a server's boot every ``running`` replay-safe
  row goes back to ``pending`` (whoever holds it); nothing recovers an expired lease at
  run time.
* ``apps/server/src/orchestration-v2/EffectWorker.ts`` (0b60c02a): lease 30 s, 5
  attempts, retry after ``min(30 s, 100 ms * 2**(attempt - 1))``, 4 worker fibers per
  server, woken in-process after a commit, else by a 30 s liveness poll; a failed claim
  cools off 1 s.
* busy_timeout 5000 and deferred ``BEGIN``; settlement retried every 100 ms on a lock
  timeout without a cap, with the statement reset between tries (the seed PR's fix of
  settlements that hit the lock timeout and left the row ``running``): as the issue
  reads them.  apsw resets a statement that failed and every result here is read whole.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

from fleetstore import errors
from fleetstore_stress.patterns.plain import PlainConnection

T3CODE_COMMITS = {
    "packages/shared/src/nodeSqliteClient.ts": "0634c9f378b30696aa2eb4b0f1e22384cdb515e6",
    "apps/server/src/orchestration-v2/EffectOutbox.ts": "037c0385ad4d554ef167bae652cf1cbf7a1ceb5c",
    "apps/server/src/orchestration-v2/EffectWorker.ts": "0b60c02aceddf8676d2bcadef4114d233eb2945f",
}
BUSY_MS = 5000
LEASE_MS = 30_000
MAX_ATTEMPTS = 5
CONCURRENCY = 4
LIVENESS_POLL = 30.0
FAILED_COOL_OFF = 1.0
SETTLE_RETRY = 0.1

OUTBOX_SCHEMA = """
CREATE TABLE orchestration_v2_effect_outbox (
    effect_id TEXT PRIMARY KEY,
    command_id TEXT NOT NULL,
    thread_id TEXT NOT NULL,
    effect_type TEXT NOT NULL,
    payload_json TEXT NOT NULL,
    status TEXT NOT NULL CHECK (
        status IN ('pending', 'running', 'succeeded', 'failed', 'cancelled')),
    attempt_count INTEGER NOT NULL DEFAULT 0,
    available_at TEXT NOT NULL,
    lease_owner TEXT,
    lease_expires_at TEXT,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    completed_at TEXT,
    last_error TEXT);
CREATE INDEX orchestration_v2_effect_outbox_claim_idx
    ON orchestration_v2_effect_outbox(status, available_at, lease_expires_at, created_at);
CREATE INDEX orchestration_v2_effect_outbox_command_idx
    ON orchestration_v2_effect_outbox(command_id, effect_id);
CREATE INDEX orchestration_v2_effect_outbox_thread_status_idx
    ON orchestration_v2_effect_outbox(thread_id, status, effect_type);
"""

_OUTBOX = "orchestration_v2_effect_outbox"
# A candidate is claimable when nothing of its thread runs and no earlier row of its
# thread is still pending (even one waiting out a retry backoff).
_CLAIMABLE = f"""
    candidate.status = 'pending'
    AND NOT EXISTS (
        SELECT 1 FROM {_OUTBOX} AS active
        WHERE active.thread_id = candidate.thread_id
          AND (active.status = 'running'
               OR (active.status = 'pending' AND active.rowid < candidate.rowid)))
"""
_CLAIM = f"""
UPDATE {_OUTBOX}
SET status = 'running', attempt_count = attempt_count + 1, lease_owner = ?,
    lease_expires_at = ?, updated_at = ?, last_error = NULL
WHERE effect_id = (
    SELECT candidate.effect_id FROM {_OUTBOX} AS candidate
    WHERE candidate.available_at <= ? AND {_CLAIMABLE}
    ORDER BY candidate.available_at, candidate.created_at, candidate.effect_id
    LIMIT 1)
RETURNING effect_id, thread_id, effect_type, payload_json, attempt_count
"""
_NEXT_CLAIMABLE = (
    f"SELECT MIN(candidate.available_at) FROM {_OUTBOX} AS candidate WHERE {_CLAIMABLE}"
)
_SUCCEED = f"""
UPDATE {_OUTBOX}
SET status = 'succeeded', lease_owner = NULL, lease_expires_at = NULL, completed_at = ?,
    updated_at = ?, last_error = NULL
WHERE effect_id = ? AND status = 'running' AND lease_owner = ?
RETURNING effect_id
"""
_RETRY = f"""
UPDATE {_OUTBOX}
SET status = 'pending', available_at = ?, lease_owner = NULL, lease_expires_at = NULL,
    updated_at = ?, last_error = ?
WHERE effect_id = ? AND status = 'running' AND lease_owner = ?
RETURNING effect_id
"""
_FAIL = f"""
UPDATE {_OUTBOX}
SET status = 'failed', lease_owner = NULL, lease_expires_at = NULL, completed_at = ?,
    updated_at = ?, last_error = ?
WHERE effect_id = ? AND status = 'running' AND lease_owner = ?
RETURNING effect_id
"""
_REQUEUE_AFTER_LOSS = f"""
UPDATE {_OUTBOX}
SET status = 'pending', lease_owner = NULL, lease_expires_at = NULL, available_at = ?,
    updated_at = ?, last_error = 'Requeued after the previous server process ended.'
WHERE status = 'running'
RETURNING effect_id
"""
ENQUEUE = f"""
INSERT INTO {_OUTBOX} (effect_id, command_id, thread_id, effect_type, payload_json, status,
    attempt_count, available_at, created_at, updated_at)
VALUES (?, ?, ?, ?, ?, 'pending', 0, ?, ?, ?)
ON CONFLICT(effect_id) DO NOTHING
"""


def iso(at: float | None = None) -> str:
    """``DateTime.formatIso``: UTC, milliseconds, ``Z``."""
    moment = datetime.fromtimestamp(time.time() if at is None else at, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_iso(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _later(ms: float) -> str:
    return iso(time.time() + ms / 1000)


class ServerDb:
    """A t3code server's one connection: ``busy_timeout`` 5000, WAL, and a
    single permit that every statement and every transaction takes."""

    def __init__(self, path: str, *, synchronous: str = "NORMAL", schema: str | None = None):
        self.conn = PlainConnection(path, busy_ms=BUSY_MS, synchronous=synchronous, schema=schema)
        self.permit = threading.Lock()

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self.permit:
            return self.conn.execute(sql, params)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[PlainConnection]:
        """``BEGIN`` (deferred) … ``COMMIT`` under the permit."""
        with self.permit, self.conn.transaction("DEFERRED") as tx:
            yield tx

    def close(self) -> None:
        self.conn.close()


class Claimed:
    __slots__ = ("attempt", "effect_id", "payload", "thread_id", "type")

    def __init__(self, row: tuple[Any, ...]) -> None:
        self.effect_id, self.thread_id, self.type = str(row[0]), str(row[1]), str(row[2])
        self.payload, self.attempt = str(row[3]), int(row[4])


class EffectWorker:
    """A server's effect worker: ``concurrency`` threads (t3code's fibers) claiming
    from the shared table, running *execute*, settling fenced on the owner."""

    def __init__(
        self,
        db: ServerDb,
        execute: Callable[[Claimed], None],
        *,
        owner: str,
        concurrency: int = CONCURRENCY,
    ) -> None:
        self.db = db
        self.execute = execute
        self.owner = owner
        self.concurrency = concurrency
        self.stats: Counter[str] = Counter()
        self._wake = threading.Condition()
        self._notified = 0
        self._stopping = threading.Event()
        self._busy = 0  # threads between a claim and its settlement
        self._threads: list[threading.Thread] = []

    def reconcile_after_process_loss(self) -> int:
        """At boot: every ``running`` row back to ``pending``, whoever holds it."""
        now = iso()
        rows = self._settling(lambda: self.db.execute(_REQUEUE_AFTER_LOSS, (now, now)))
        self.notify(len(rows))
        return len(rows)

    def start(self) -> None:
        for i in range(self.concurrency):
            t = threading.Thread(target=self._run, name=f"t3code-effects-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def notify(self, count: int = 1) -> None:
        """After a commit: wake up to *count* idle fibers."""
        with self._wake:
            self._notified = min(64, self._notified + count)
            self._wake.notify(count)

    def stop(self, grace: float) -> int:
        """Stop claiming; wait up to *grace* s for what runs.  Returns how many
        claims were still unsettled (a server that stops leaves them ``running``)."""
        self._stopping.set()
        with self._wake:
            self._wake.notify_all()
        deadline = time.monotonic() + grace
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return self._busy

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                worked = self._run_once()
            except errors.FleetstoreError:
                self.stats["failed_passes"] += 1
                self._stopping.wait(FAILED_COOL_OFF)
                continue
            if not worked:
                self._idle()

    def _idle(self) -> None:
        try:
            rows = self.db.execute(_NEXT_CLAIMABLE)
        except errors.FleetstoreError:
            rows = []
        wait = LIVENESS_POLL
        if rows and rows[0][0] is not None:
            until = parse_iso(str(rows[0][0])) - time.time()
            wait = min(LIVENESS_POLL, until if until > 0 else 0.025)
        with self._wake:
            if self._notified == 0 and not self._stopping.is_set():
                self._wake.wait(wait)
            self._notified = max(0, self._notified - 1)

    def _run_once(self) -> bool:
        now = iso()
        rows = self.db.execute(_CLAIM, (self.owner, _later(LEASE_MS), now, now))
        if not rows:
            return False
        claim = Claimed(rows[0])
        self._busy += 1
        self.stats["claimed"] += 1
        try:
            try:
                self.execute(claim)
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
                if claim.attempt >= MAX_ATTEMPTS:
                    landed = self.fail(claim.effect_id, error)
                else:
                    landed = self.retry(
                        claim.effect_id, min(30_000, 100 * 2 ** max(0, claim.attempt - 1)), error
                    )
                self.stats["retried" if landed else "lease_lost"] += 1
                return True
            if self.succeed(claim.effect_id):
                self.stats["succeeded"] += 1
            else:
                # "The worker no longer owns the effect lease": requeue it (refused too).
                self.stats["lease_lost"] += 1
                self.retry(claim.effect_id, 0, "lease lost")
            return True
        finally:
            self._busy -= 1

    # Each settlement is fenced on this worker's owner only; True when it applied.
    def succeed(self, effect_id: str) -> bool:
        now = iso()
        return self._settle(_SUCCEED, (now, now, effect_id, self.owner))

    def retry(self, effect_id: str, delay_ms: float, error: str) -> bool:
        return self._settle(_RETRY, (_later(delay_ms), iso(), error, effect_id, self.owner))

    def fail(self, effect_id: str, error: str) -> bool:
        now = iso()
        return self._settle(_FAIL, (now, now, error, effect_id, self.owner))

    def _settle(self, sql: str, args: tuple[Any, ...]) -> bool:
        return len(self._settling(lambda: self.db.execute(sql, args))) == 1

    def _settling(self, write: Callable[[], list[tuple[Any, ...]]]) -> list[tuple[Any, ...]]:
        """The seed PR's fix: a settlement that meets the lock timeout is tried again
        every 100 ms, without a cap (until the server stops)."""
        while True:
            try:
                return write()
            except errors.StoreBusy:
                self.stats["settle_busy"] += 1
                if self._stopping.wait(SETTLE_RETRY) and self._stopping.is_set():
                    raise


__all__ = [
    "CONCURRENCY",
    "ENQUEUE",
    "LEASE_MS",
    "OUTBOX_SCHEMA",
    "T3CODE_COMMITS",
    "Claimed",
    "EffectWorker",
    "ServerDb",
    "iso",
    "parse_iso",
]
