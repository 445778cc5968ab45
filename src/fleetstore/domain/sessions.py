"""``store.sessions``: create, read, list, fork, archive and delete sessions (a tree of
subagents under its root; forks and deletes that take long are finished by
``session_jobs``).  Their messages: ``fleetstore.domain.history``."""

from __future__ import annotations

import builtins
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fleetstore import errors
from fleetstore.core.ids import new_id
from fleetstore.core.validate import (
    INT_MAX,
    check_bool,
    check_id,
    check_int,
    check_opt_id,
    check_opt_str,
)
from fleetstore.domain import session_jobs
from fleetstore.domain.history import (
    LISTING_SYNC_WAIT,
    metadata_arg,
    session_from_row,
    title_arg,
)
from fleetstore.domain.operations import Delivery, Operation
from fleetstore.domain.outbox import prepare_effects
from fleetstore.domain.ports import StorePort
from fleetstore.models import NewEffect, Page, Session, Usage

if TYPE_CHECKING:
    from fleetstore.engine.base import Tx


class Sessions:
    """``store.sessions``: create, read, list, fork, archive and delete sessions."""

    def __init__(self, store: StorePort) -> None:
        self._store = store

    def create(
        self,
        title: str | None = None,
        *,
        project: str | None = None,
        parent_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        id: str | None = None,
        effects: Sequence[NewEffect] = (),
    ) -> Session:
        """A new session; with *parent_id*, a subagent's session in its parent's tree.
        *effects* are enqueued in the same transaction (the transactional outbox)."""
        sid = new_id() if id is None else check_id(id, "id")
        check_opt_id(parent_id, "parent_id")
        title = title_arg(self._store, title)
        check_opt_str(project, "project")
        meta = metadata_arg(self._store, metadata)
        effect_list = prepare_effects(self._store, effects).write()
        now = time.time()
        args: dict[str, Any] = {
            "id": sid,
            "parent_id": parent_id,
            "project": project,
            "title": title,
            "metadata": meta,
            "created_at": now,
        }
        if effect_list:
            args["effects"] = effect_list
        if self._store.submit(Operation("create_session", args, new_id(), True)) is None:
            return Session(
                id=sid,
                root_id=sid if parent_id is None else "",
                parent_id=parent_id,
                project=project,
                title=title,
                metadata=meta,
                created_at=now,
                updated_at=now,
                version=0,
            )
        return self.get(sid)

    def get(self, session_id: str) -> Session:
        """The session (``NotFound`` if there is none)."""
        check_id(session_id, "session_id")
        self._store.check_visible(session_id)
        rows = self._store.read(
            lambda tx: tx.execute(self._store.queries["session_get"], (session_id,)),
            session_id=session_id,
        )
        if not rows:
            raise errors.NotFound(f"no session {session_id!r}")
        return session_from_row(rows[0])

    def list(
        self,
        *,
        project: str | None = None,
        parent_id: str | None = None,
        root_id: str | None = None,
        include_archived: bool = False,
        limit: int = 100,
        before: str | None = None,
    ) -> Page[Session, str]:
        """Sessions, newest first: at most *limit*, in a ``Page`` whose ``more`` says
        there are older ones; ``before=page.next_cursor`` (a session id) lists them."""
        check_int(limit, "limit", minimum=1)
        check_opt_str(project, "project")
        for name, value in (("parent_id", parent_id), ("root_id", root_id), ("before", before)):
            check_opt_id(value, name)
        check_bool(include_archived, "include_archived")
        self._store.check_visible(None)
        params = {
            "project": project,
            "parent_id": parent_id,
            "root_id": root_id,
            "include_archived": include_archived,
            "before": before,
            # One more than asked for: whether there is more is then known.
            "limit": min(limit, INT_MAX - 1) + 1,
        }
        # A sharded store lists from its catalog: first bring this process's own
        # writes' updated_at into it.
        self._store.sync_catalog(LISTING_SYNC_WAIT)
        rows = self._store.read(lambda tx: tx.execute(self._store.queries["session_list"], params))
        found = [session_from_row(r) for r in rows[:limit]]
        more = len(rows) > limit
        return Page(found, more=more, next_cursor=found[-1].id if more else None)

    def children(self, session_id: str) -> builtins.list[Session]:
        """The subagent sessions spawned by *session_id*."""
        check_id(session_id, "session_id")
        return self.list(parent_id=session_id, include_archived=True, limit=INT_MAX)

    def update(
        self,
        session_id: str,
        *,
        title: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        expected_version: int | None = None,
        effects: Sequence[NewEffect] = (),
    ) -> Session:
        """Change the title and/or metadata; with *expected_version*, only if
        nobody changed the session since (``VersionConflict``).  *effects* are
        enqueued in the same transaction.  Never spooled (see ``_unspooled``)."""
        args: dict[str, Any] = {"id": check_id(session_id, "session_id")}
        if title is not None:
            args["title"] = title_arg(self._store, title)
        if metadata is not None:
            args["metadata"] = metadata_arg(self._store, metadata)
        if expected_version is not None:
            args["expected_version"] = check_int(expected_version, "expected_version", minimum=1)
        effect_list = prepare_effects(self._store, effects).write()
        if effect_list:
            args["effects"] = effect_list
        return self._unspooled(Operation("update_session", args, new_id(), True), session_id)

    def fork(
        self,
        session_id: str,
        *,
        at_message_id: str | None = None,
        title: str | None = None,
        id: str | None = None,
    ) -> Session:
        """A new session holding a copy of *session_id*'s messages up to and
        including *at_message_id* (all of them by default).  Never spooled."""
        new = new_id() if id is None else check_id(id, "id")
        check_id(session_id, "session_id")
        check_opt_id(at_message_id, "at_message_id")
        title = title_arg(self._store, title)
        at_seq = None
        if at_message_id is not None:
            # Only its seq: reading the whole message would read (and verify) its blobs.
            self._store.check_visible(session_id)
            q = self._store.queries
            found = self._store.read(
                lambda tx: tx.execute(q["message_identity"], (at_message_id,)),
                session_id=session_id,
            )
            if not found or found[0][0] != session_id:
                raise errors.NotFound(f"session {session_id!r} has no message {at_message_id!r}")
            at_seq = found[0][1]
        args = {
            "id": new,
            "source_id": check_id(session_id, "session_id"),
            "at_seq": at_seq,
            "title": title,
            "owner": session_jobs.job_owner(),
            "limit": session_jobs.FORK_MESSAGES,
            "created_at": time.time(),
        }
        # The first batch of messages goes with the fork's row, hidden; a large
        # session's next batches each in a transaction of their own, and the fork is
        # seen once the last one is in (never half copied).
        op = Operation("fork_session", args, new_id(), True)
        result = self._store.submit(op, Delivery.NOW)
        if result is not None and not result.get("done"):
            session_jobs.copy_fork(self._store, new, session_id)
        return self.get(new)

    def archive(self, session_id: str, archived: bool = True) -> Session:
        """Archive a session (``archived=False`` restores it); its history is kept.
        Never spooled."""
        args = {
            "id": check_id(session_id, "session_id"),
            "archived": check_bool(archived, "archived"),
        }
        return self._unspooled(Operation("archive_session", args, new_id(), True), session_id)

    def delete(self, session_id: str) -> None:
        """Delete a session with its subagent sessions, messages, parts, usage and state.
        Gone for every reader at once; its rows are then removed in short transactions
        before this returns (past the write budget, by the store's job thread)."""
        args = {"id": check_id(session_id, "session_id")}
        if self._store.submit(Operation("delete_session", args, new_id(), True)) is not None:
            session_jobs.purge(self._store, session_id)

    def usage(self, session_id: str) -> Usage:
        """Tokens and cost summed over the session's messages."""
        check_id(session_id, "session_id")
        self._store.check_visible(session_id)
        q = self._store.queries

        def run(tx: Tx) -> Usage:
            if not tx.execute(q["session_exists"], (session_id,)):
                raise errors.NotFound(f"no session {session_id!r}")
            row = tx.execute(q["usage_total"], (session_id,))[0]
            return Usage(row[1], row[2], row[3], row[4], row[5], row[6])

        return self._store.read(run, session_id=session_id)

    def _unspooled(self, op: Operation, session_id: str) -> Session:
        """Apply *op* now and return the session as stored.  These writes return what
        they made, so they are not spooled: past the budget ``StoreBusy``, behind
        spooled writes ``SpoolPending``, both with nothing written.  Spooling them and
        raising afterwards made a caller's retry apply them twice (a second fork)."""
        self._store.submit(op, Delivery.NOW)
        return self.get(session_id)


__all__ = ["Sessions"]
