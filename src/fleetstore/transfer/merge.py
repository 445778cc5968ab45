"""``fleetstore merge``: every session of source stores brought into a destination
(an export of each, an import, then a verification of every session's content
digest and every blob)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fleetstore import errors
from fleetstore.core.keys import keyring_of
from fleetstore.core.settings import Settings
from fleetstore.core.targets import resolve_target
from fleetstore.store.facade import Store
from fleetstore.store.facade import open as open_store
from fleetstore.store.readonly import check_store_file
from fleetstore.transfer.digest import session_digest, session_order
from fleetstore.transfer.export import ExportSummary, export_store
from fleetstore.transfer.format import Progress
from fleetstore.transfer.importing import ImportSummary, import_file


@dataclass(frozen=True, slots=True)
class SourceResult:
    source: str
    exported: ExportSummary
    imported: ImportSummary


@dataclass(frozen=True, slots=True)
class MergeReport:
    dest: str
    sources: tuple[SourceResult, ...]
    #: What verification found; empty when the merge is verified.
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def sessions(self) -> int:
        return sum(s.exported.sessions for s in self.sources)

    @property
    def messages(self) -> int:
        return sum(s.exported.messages for s in self.sources)

    @property
    def blobs(self) -> int:
        return len(frozenset().union(*(s.exported.blob_shas for s in self.sources)))

    @property
    def blob_bytes(self) -> int:
        return sum(s.exported.blob_bytes for s in self.sources)


def _verify(source: Store, dest: Store, exported: ExportSummary, name: str) -> list[str]:
    """What differs between the export of *source*, the destination and the source now."""
    problems: list[str] = []
    for sid, want in exported.digests.items():
        got = session_digest(dest, sid)
        if got != want:
            found = (
                "missing" if got is None else f"{got.messages} messages, content {got.sha256[:12]}"
            )
            problems.append(
                f"session {sid}: the destination does not match the export of {name} "
                f"({want.messages} messages, content {want.sha256[:12]}; destination: {found})"
            )
        now = session_digest(source, sid)
        if now != want:
            found = "deleted" if now is None else f"{now.messages} messages"
            problems.append(
                f"session {sid} changed in {name} during the merge (exported with "
                f"{want.messages} messages, now {found}); merge again once its writers stopped"
            )
    if exported.whole_store:
        created = set(session_order(source, None)) - set(exported.digests)
        if created:
            problems.append(
                f"{len(created)} session(s) were created in {name} during the merge "
                f"(e.g. {min(created)}); merge again once its writers stopped"
            )
    for sha in sorted(exported.blob_shas):
        if not dest.blobs.verify(sha):
            problems.append(
                f"blob {sha} does not verify in the destination ({dest.blobs.describe(sha)})"
            )
    return problems


def merge(
    sources: Sequence[str | os.PathLike[str] | Store],
    dest: str | os.PathLike[str] | Store,
    *,
    progress: Progress | None = None,
) -> MergeReport:
    """Bring every session of each source store into *dest*: export, import, then
    verify that each exported session is in *dest* exactly as exported (message
    count and content hash), that the source did not change meanwhile, and that
    every blob verifies.  Idempotent: merging again changes nothing.  The report's
    ``problems`` say what did not verify."""

    def target(s: str | os.PathLike[str] | Store) -> Path:
        return (s.path if isinstance(s, Store) else resolve_target(s)).resolve()

    dest_path = target(dest)
    keyring = keyring_of(Settings.load().encryption_key_file)
    for src in sources:
        path = target(src)
        if path == dest_path:
            raise errors.InvalidInput(f"{path} is both a source and the destination")
        if not isinstance(src, Store) and not path.exists():
            raise errors.NotFound(f"no store at {path} to merge from")
        if not isinstance(src, Store):
            # NotAStore before anything is opened or created.
            check_store_file(path, unless_open_here=True, keyring=keyring)
    if not isinstance(dest, Store) and dest_path.is_file() and dest_path.stat().st_size:
        check_store_file(dest_path, unless_open_here=True, keyring=keyring)
    with contextlib.ExitStack() as stack:
        dst = dest if isinstance(dest, Store) else stack.enter_context(open_store(dest))
        results: list[SourceResult] = []
        problems: list[str] = []
        for src in sources:
            with contextlib.ExitStack() as inner:
                store = src if isinstance(src, Store) else inner.enter_context(open_store(src))
                fd, tmp = tempfile.mkstemp(
                    prefix=".fleetstore-merge-", suffix=".jsonl.zst", dir=dst.path.parent
                )
                os.close(fd)
                inner.callback(_unlink, tmp)
                exported = export_store(store, tmp, progress=progress)
                # (The temporary export is sealed under the source's key, if it has one.)
                imported = import_file(dst, tmp, progress=progress, keyring=store.keyring)
                problems.extend(_verify(store, dst, exported, str(store.path)))
                results.append(SourceResult(str(store.path), exported, imported))
        return MergeReport(str(dst.path), tuple(results), tuple(problems))


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


__all__ = [
    "MergeReport",
    "SourceResult",
    "merge",
]
