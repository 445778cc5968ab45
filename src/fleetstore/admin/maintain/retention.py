"""Retention: the ``archive`` step (export the session trees not written since the
horizon, read the archive back whole, then delete exactly what was archived) and the
``delete`` step (delete them without an archive).

A tree is a top-level session with its subagent sessions; it is deleted in short
batches (``delete_tree``, the ``mnt_delete_tree`` operation, through the router on a
sharded store), each re-checking that nothing was written to the tree since the
horizon: a tree written to meanwhile is kept, or left partly deleted (the step then
fails and says so)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetstore import errors
from fleetstore.admin.maintain.report import Progress, Step
from fleetstore.admin.maintain.writer import Batch, Writer
from fleetstore.admin.stats import message_counts
from fleetstore.core.units import size as _size
from fleetstore.engine.base import Tx
from fleetstore.transfer.digest import session_digest
from fleetstore.transfer.export import export_store
from fleetstore.transfer.format import MAX_LINE, MAX_TOTAL
from fleetstore.transfer.reader import OpItem, Reader


@dataclass(frozen=True, slots=True)
class Tree:
    """A top-level session (no parent) with its subagent sessions."""

    id: str
    sessions: tuple[str, ...]
    newest: float


def session_trees(store: Any, older_than: float | None = None) -> list[Tree]:
    """Every top-level session's tree, with its newest write (sessions and state);
    with *older_than*, only the trees whose newest write is before it.

    A sharded store lists the trees from its catalog's index, whose ``updated_at``
    may lag the shards' (by about a second, longer after a writer was killed) and
    which holds no state of sharded sessions: so each tree the index shows as old
    enough is looked at again in its own file (``mnt_tree_freshness``), and the
    tree's newest write is the later of the two.  The deletion re-checks the tree's
    shard in every batch anyway."""
    q = store.queries

    def run(tx: Tx) -> tuple[list[tuple[Any, ...]], dict[str, float]]:
        rows = tx.execute(q["mnt_session_tree_rows"])
        state = {str(s): float(t) for s, t in tx.execute(q["mnt_state_newest"])}
        return rows, state

    rows, state = store.read(run)
    children: dict[str | None, list[str]] = {}
    fresh: dict[str, float] = {}
    for sid, parent, newest, _status in rows:
        children.setdefault(parent, []).append(sid)
        fresh[sid] = max(float(newest), state.get(sid, 0.0))
    trees = []
    for root in sorted(children.get(None, [])):
        members: list[str] = []
        stack = [root]
        while stack:
            sid = stack.pop()
            members.append(sid)
            stack.extend(children.get(sid, []))
        trees.append(Tree(root, tuple(members), max(fresh[m] for m in members)))
    if older_than is not None:
        trees = [t for t in trees if t.newest < older_than]
    if store.spans_files:
        trees = [_in_its_file(store, t) for t in trees]
        if older_than is not None:
            trees = [t for t in trees if t.newest < older_than]
    return trees


def _in_its_file(store: Any, tree: Tree) -> Tree:
    """*tree* with its newest write as its own file (a shard, or the catalog) has it."""
    q = store.queries

    def run(tx: Tx) -> tuple[Any, ...]:
        return tuple(tx.execute(q["mnt_tree_freshness"], {"id": tree.id})[0])

    _count, newest_session, newest_state = store.read(run, session_id=tree.id)
    newest = max(tree.newest, float(newest_session or 0.0), float(newest_state or 0.0))
    return Tree(tree.id, tree.sessions, newest)


@dataclass(slots=True)
class Deleted:
    messages: int = 0
    states: int = 0
    sessions: int = 0
    #: "deleted", "gone" (there was nothing), or "written" (written to since: stopped)
    outcome: str = "deleted"


def delete_tree(
    writer: Writer,
    step: Step,
    session_id: str,
    written_before: float | None = None,
    batch: Batch | None = None,
) -> Deleted:
    """Delete the session *session_id* with its subagents, messages and state, in
    transactions of about ``TARGET_HOLD`` each.  With *written_before*: stop (outcome
    "written") as soon as the tree shows a write at or after it; a tree stopped after
    its first batch is left partly deleted (the outcome says so)."""
    batch = batch or Batch(200, 50_000)
    total = Deleted()
    first = True
    while True:
        args: dict[str, Any] = {"id": session_id, "limit": batch.size}
        if written_before is not None:
            args["written_before"] = written_before
        result = writer.apply(step, "mnt_delete_tree", args)
        if result.get("skipped"):
            total.outcome = "written"
            return total
        if result.get("gone") and first:
            total.outcome = "gone"
            return total
        first = False
        total.messages += result["messages"]
        total.states += result["states"]
        total.sessions += result["sessions"]
        batch.update(result["messages"] + result["states"], step.last_hold)
        if result["done"] or result.get("gone"):
            return total


def _old_trees(store: Any, cutoff: float) -> list[Tree]:
    return session_trees(store, older_than=cutoff)


def _describe(store: Any, trees: Sequence[Tree]) -> tuple[int, int]:
    counts = message_counts(store, [t.id for t in trees] if store.spans_files else None)
    sessions = sum(len(t.sessions) for t in trees)
    messages = sum(counts.get(s, 0) for t in trees for s in t.sessions)
    return sessions, messages


def archive(
    store: Any,
    writer: Writer,
    step: Step,
    cutoff: float,
    target: str,
    dry_run: bool,
    progress: Progress | None,
) -> None:

    trees = _old_trees(store, cutoff)
    sessions, messages = _describe(store, trees)
    step.detail.update(trees=len(trees), sessions=sessions, messages=messages, file=target)
    if not trees:
        step.status = "nothing"
        step.summary = "no session tree older than the horizon"
        return
    what = f"{len(trees)} session tree(s) ({sessions} sessions, {messages} messages)"
    if dry_run:
        step.status = "dry-run"
        step.summary = f"would archive {what} to {target}, verify it, then delete them"
        return
    summary = export_store(store, target, [t.id for t in trees], progress=progress)
    step.detail["file_bytes"] = summary.file_bytes
    verify_archive(store, target, summary)
    step.detail["verified"] = True
    deleted, written, partial = _delete_trees(store, writer, step, trees, cutoff, summary, progress)
    step.summary = (
        f"archived {what} to {target} ({_size(summary.file_bytes)}), verified; deleted "
        f"{deleted} tree(s)"
    )
    _note_written(step, written, partial)


def _note_written(step: Step, written: list[str], partial: list[str]) -> None:
    step.detail.update(written_since=written, partly_deleted=partial)
    if written:
        step.summary += f"; {len(written)} tree(s) written to since, kept"
    if partial:
        step.status = "failed"
        step.summary += (
            f"; {len(partial)} tree(s) were written to while being deleted and are left "
            f"partly deleted: {', '.join(partial[:5])}"
        )


def verify_archive(store: Any, path: str, summary: Any) -> None:
    """Read the archive back whole, as ``fleetstore import`` would check it (every
    record, every blob's hash and size, the trailer's counts and checksum), and check
    it holds every exported session with its messages.  ``InvalidArchive`` if not."""
    reader = Reader(
        Path(path), store.settings.max_payload_bytes, MAX_LINE, MAX_TOTAL, store.keyring
    )
    sessions: set[str] = set()
    messages: dict[str, int] = {}
    for item in reader.items():
        if isinstance(item, OpItem):
            if item.op.name == "import_session":
                sessions.add(item.parsed.id)
            elif item.op.name == "import_message":
                sid = item.parsed.session_id
                messages[sid] = messages.get(sid, 0) + 1
    for sid, digest in summary.digests.items():
        if sid not in sessions or messages.get(sid, 0) != digest.messages:
            raise errors.InvalidArchive(
                f"{path}: reading the archive back, session {sid} is missing or incomplete "
                f"({messages.get(sid, 0)} of {digest.messages} messages); nothing was deleted"
            )


def _delete_trees(
    store: Any,
    writer: Writer,
    step: Step,
    trees: Sequence[Tree],
    cutoff: float,
    summary: Any,
    progress: Progress | None,
) -> tuple[int, list[str], list[str]]:

    batch = Batch(200, 50_000)
    deleted = 0
    written: list[str] = []
    partial: list[str] = []
    for i, tree in enumerate(trees):
        # Exactly what was archived, or it stays: compare the whole content.
        if summary is not None and any(
            session_digest(store, s) != summary.digests.get(s) for s in tree.sessions
        ):
            written.append(tree.id)
            continue
        result = delete_tree(writer, step, tree.id, cutoff, batch)
        if result.outcome == "written":
            (partial if result.messages or result.states else written).append(tree.id)
        else:
            deleted += 1
            step.detail["deleted_messages"] = step.detail.get("deleted_messages", 0) + (
                result.messages
            )
        if progress is not None:
            progress("delete", i + 1, len(trees))
    return deleted, written, partial


def delete_old(
    store: Any,
    writer: Writer,
    step: Step,
    cutoff: float,
    dry_run: bool,
    progress: Progress | None,
) -> None:
    trees = _old_trees(store, cutoff)
    sessions, messages = _describe(store, trees)
    step.detail.update(trees=len(trees), sessions=sessions, messages=messages)
    if not trees:
        step.status = "nothing"
        step.summary = "no session tree older than the horizon"
        return
    what = f"{len(trees)} session tree(s) ({sessions} sessions, {messages} messages)"
    if dry_run:
        step.status = "dry-run"
        step.summary = f"would delete {what}"
        return
    deleted, written, partial = _delete_trees(store, writer, step, trees, cutoff, None, progress)
    step.summary = f"deleted {deleted} of {what}"
    _note_written(step, written, partial)


__all__ = [
    "Deleted",
    "Tree",
    "archive",
    "delete_old",
    "delete_tree",
    "session_trees",
    "verify_archive",
]
