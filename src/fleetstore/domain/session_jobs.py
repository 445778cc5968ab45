"""Deleting and forking sessions in short transactions, and finishing what a crash
left half done.

A delete hides the session at once (``delete_session``) and then removes its rows
batch by batch (``purge_session``, ``PURGE_ROWS`` rows a transaction); a fork is
made hidden with its first batch of messages (``fork_session``) and seen once
``fork_copy`` has put the last batch in (``FORK_MESSAGES`` messages a
transaction).  Between batches other writers take the lock, so the longest hold
is one batch, whatever the session's size (docs/design.md, "Deleting and forking
large sessions").

What a process started and could not finish is finished by ``finish_jobs``, which
the store runs in a thread of its own: after ``open`` (a process killed mid-way),
after a delete whose purge met a store busy past the write budget, and after a
spooled delete is replayed.  A delete is always carried to its end (its session
is gone for every reader already; any process may help).  A fork is undone
rather than finished (``abandon_fork``, then purged like a delete): its caller
got an error or nothing at all, and a retry makes it again; so a fork is given
up only when nobody copies it any more: its process is gone (same host), or it
made no progress for ``stall_seconds`` (another host, or a reused pid).
tests/domain/test_session_jobs.py
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator

from fleetstore import errors
from fleetstore.core import liveness
from fleetstore.core.ids import new_id
from fleetstore.core.logs import logger
from fleetstore.domain.history_ops import FORK_MESSAGES, PURGE_ROWS
from fleetstore.domain.operations import Delivery, Operation
from fleetstore.domain.ports import StorePort

log = logger("fleetstore")

#: Jobs read per round of ``finish_jobs``.
_PAGE = 100

_lock = threading.Lock()
#: The forks this process is copying now: never given up by its own job thread.
_copying: set[str] = set()


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()
    _copying.clear()  # the child copies none of its parent's forks


os.register_at_fork(after_in_child=_after_fork_in_child)


def job_owner() -> str:
    """This process, as a fork's ``job_owner`` names it: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def stall_seconds(write_budget: float) -> float:
    """How long a fork may go without a batch before it is taken for abandoned: a live
    copier's batch waits at most one write budget for the lock, then it gives the fork
    up itself."""
    return max(60.0, 4 * write_budget)


@contextlib.contextmanager
def _copying_now(fork_id: str) -> Iterator[None]:
    with _lock:
        _copying.add(fork_id)
    try:
        yield
    finally:
        with _lock:
            _copying.discard(fork_id)


def _submit(store: StorePort, name: str, args: dict[str, object]) -> dict[str, object]:
    # Independent: a batch checks in its own transaction that its job is still there,
    # so it neither waits behind this process's spooled writes nor is ever spooled.
    result = store.submit(Operation(name, args, new_id()), Delivery.INDEPENDENT)
    assert result is not None
    return result


def purge(
    store: StorePort,
    session_id: str,
    *,
    hand_over: bool = True,
    stop: Callable[[], bool] = lambda: False,
) -> bool:
    """Remove the rows of *session_id*, deleted already (hidden from every read), one
    batch a transaction; True once they are gone (False: *stop* said so between two
    batches).  A batch that fails (the store stays locked past the write budget, the
    disk is full): with *hand_over* the store's job thread carries on and False is
    returned (the delete has taken effect), else the error is raised."""
    while not stop():
        try:
            result = _submit(store, "purge_session", {"id": session_id, "limit": PURGE_ROWS})
        except errors.FleetstoreError as exc:
            if not hand_over:
                raise
            log.warning(
                "session %s is deleted; removing its rows stopped (%s): the store carries on",
                session_id,
                exc,
            )
            store.finish_jobs()
            return False
        if result.get("done"):
            return True
    return False


def copy_fork(store: StorePort, fork_id: str, source_id: str) -> None:
    """Copy the rest of the fork *fork_id* (made by ``fork_session`` with its first
    batch), batch by batch, until it is whole and seen.  If it cannot be finished
    (``NotFound``: *source_id* was deleted meanwhile; the store busy or failing), it is
    given up and its rows purged, and the error raised: a fork that raised leaves
    nothing to be seen."""
    with _copying_now(fork_id):
        try:
            while True:
                result = _submit(store, "fork_copy", {"id": fork_id, "limit": FORK_MESSAGES})
                if result.get("done"):
                    return
                if result.get("abandoned"):
                    raise errors.NotFound(
                        f"session {source_id!r} was deleted while it was being forked"
                    )
        except BaseException:
            abandon_fork(store, fork_id)
            raise


def abandon_fork(store: StorePort, fork_id: str) -> None:
    """Give up the fork *fork_id* and purge what was copied; if the store does not
    let it now, its job thread does it (a fork no process copies is given up)."""
    try:
        if _submit(store, "abandon_fork", {"id": fork_id}).get("purge"):
            purge(store, fork_id)
    except errors.FleetstoreError as exc:
        log.warning("fork %s: giving it up failed (%s): the store carries on", fork_id, exc)
        store.finish_jobs()


def _abandoned(owner: object, updated_at: float, fork_id: str, stall: float) -> bool:
    """Is nobody copying the fork *fork_id* any more?"""
    stalled = time.time() - updated_at > stall
    host, _, pid_text = str(owner).rpartition(":")
    if owner is None or not pid_text.isdigit():
        return True
    pid = int(pid_text)
    if host != socket.gethostname():
        return stalled
    if pid == os.getpid():
        with _lock:
            return fork_id not in _copying
    # The owner records a PID only (an older version's reader parses it): alive, or
    # its PID reused by another process, the fork is given up once it stalls.
    return not liveness.alive(pid) or stalled


def finish_jobs(store: StorePort, stop: Callable[[], bool] = lambda: False) -> int:
    """One round over the deletes and forks under way: every delete is purged to its
    end, every fork nobody copies any more is given up and purged.  Returns how many
    are left (forks being copied by live processes); raises what a batch raised."""
    q = store.queries
    rows = store.read(lambda tx: tx.execute(q["session_jobs"], (_PAGE,)))
    stall = stall_seconds(store.settings.write_budget)
    left = 0
    for sid, job, owner, updated_at in rows:
        if stop():
            return len(rows)
        sid = str(sid)
        if job == "fork":
            if not _abandoned(owner, float(updated_at), sid, stall):
                left += 1
                continue
            log.warning("fork %s: its process (%s) stopped copying it; giving it up", sid, owner)
            if not _submit(store, "abandon_fork", {"id": sid}).get("purge"):
                continue
        if not purge(store, sid, hand_over=False, stop=stop):
            return len(rows)
    return left + (len(rows) == _PAGE)


__all__ = [
    "FORK_MESSAGES",
    "PURGE_ROWS",
    "abandon_fork",
    "copy_fork",
    "finish_jobs",
    "job_owner",
    "purge",
    "stall_seconds",
]
