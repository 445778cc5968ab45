"""The run: opening both stores (``identity``, what names a store), then schema,
claim, copy and verification in turn (``migrate``), or the comparison alone
(``verify_report``, ``verify``)."""

from __future__ import annotations

import contextlib
import os
import resource
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fleetstore import errors
from fleetstore.core.targets import CATALOG, SHARDED_SCHEME, parse_target, url_servers
from fleetstore.domain import session_jobs
from fleetstore.store.facade import open as open_store
from fleetstore.transfer.migrate.copying import _Copier
from fleetstore.transfer.migrate.progress import STALE, _claim, _now_text, _set_item
from fleetstore.transfer.migrate.report import (
    DEFAULT_BATCH_ROWS,
    DestinationNotEmpty,
    Guard,
    MigrateReport,
    Progress,
    SourceInUse,
    TableReport,
    VerificationFailed,
)
from fleetstore.transfer.migrate.schema import Table, _compare, _read_schema, copy_order
from fleetstore.transfer.migrate.side import _counts, _Side
from fleetstore.transfer.migrate.verification import _verify

# -- opening ---------------------------------------------------------------------------------


def identity(url_or_path: str | os.PathLike[str]) -> str:
    """What names a store for ``migrate``: ``sqlite:/absolute/path``,
    ``sqlite+sharded:/absolute/directory`` or ``postgresql://host:port/database``
    (no user, no password)."""
    kind, target = parse_target(url_or_path)
    if isinstance(target, Path):
        return f"{SHARDED_SCHEME if kind == 'sharded' else 'sqlite'}:" + str(
            target.expanduser().resolve()
        )
    parts = urlsplit(str(target))
    database = parts.path.lstrip("/") or parts.username or "postgres"
    hosts = ",".join(f"{(h or 'localhost').lower()}:{p}" for h, p in url_servers(str(target)))
    return f"{kind}://{hosts}/{database}"


def _target(url_or_path: str | os.PathLike[str], must_exist: bool, what: str) -> Path | str:
    """What to open: a SQLite file's path, a sharded store's URL, a PostgreSQL URL."""
    kind, target = parse_target(url_or_path)
    if kind == "sharded":
        assert isinstance(target, Path)
        directory = target.expanduser().absolute()
        if must_exist and not (directory / CATALOG).is_file():
            raise errors.NotFound(
                f"{what}: no sharded store at {directory} (no {CATALOG}; nothing was created)"
            )
        if (
            not must_exist
            and directory.is_dir()
            and not (directory / CATALOG).exists()
            and any(directory.iterdir())
        ):
            raise DestinationNotEmpty(
                f"{what}: {directory} holds other files and no sharded store; give a new or "
                "empty directory. Nothing was written."
            )
        return f"{SHARDED_SCHEME}://{directory}"
    if isinstance(target, Path) and must_exist and not target.is_file():
        raise errors.NotFound(f"{what}: no store at {target} (nothing was created)")
    return target


def _open_files() -> int:
    try:
        return int(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    except (OSError, ValueError):
        return 1024


@contextmanager
def _opened(target: Path | str, settings: dict[str, Any]) -> Iterator[Any]:
    settings = dict(settings)
    if (
        isinstance(target, str)
        and target.startswith(SHARDED_SCHEME)
        and "max_open_shards" not in settings
        and not os.environ.get("FLEETSTORE_MAX_OPEN_SHARDS")
    ):
        # Each batch of rows in key order spans many trees: with the store's usual bound
        # (64) every batch closed and reopened shards (12 ms each: a copy of 300 trees
        # took 26 s, 6.8 s with all of them open).  As many as the file limit allows,
        # about 20 descriptors a shard (writer, reader, checkpointer, gate).
        settings["max_open_shards"] = max(64, min(4096, _open_files() // 20))
    store = open_store(target, **settings)
    try:
        # Deletes and forks a crashed process left half done are finished first: the
        # store's job thread would otherwise purge rows under the copy (its verification
        # then failed on every run).
        session_jobs.finish_jobs(store)
        yield store
    finally:
        store.close()


def _pair(
    src: str | os.PathLike[str], dst: str | os.PathLike[str], dst_must_exist: bool
) -> tuple[Path | str, Path | str, str, str]:
    src_id, dst_id = identity(src), identity(dst)
    src_target = _target(src, True, "SRC")
    same = src_id == dst_id
    dst_path = parse_target(dst)[1]
    src_path = parse_target(src)[1]
    if isinstance(src_path, Path) and isinstance(dst_path, Path) and dst_path.exists():
        same = same or os.path.samefile(src_path, dst_path)
    if same:
        raise errors.InvalidInput(f"SRC and DST are the same store ({src_id}); nothing was done")
    dst_target = _target(dst, dst_must_exist, "DST")
    return src_target, dst_target, src_id, dst_id


# -- the public functions --------------------------------------------------------------------


def _check_batch(batch_rows: int) -> None:
    if (
        not isinstance(batch_rows, int)
        or isinstance(batch_rows, bool)
        or not 0 < batch_rows <= 100_000
    ):
        raise errors.InvalidInput(
            f"batch_rows must be an integer in [1, 100000], not {batch_rows!r}"
        )


def _plan(src: Any, dst: Any, report: MigrateReport) -> list[Table]:
    report.src_schema, report.dst_schema = src.db.schema_version, dst.db.schema_version
    report.src_layout, report.dst_layout = src.layout, dst.layout
    src_tables = _read_schema(src)
    _compare(src_tables, _read_schema(dst), src.url, dst.url)
    return copy_order(src_tables)


def migrate(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    progress: Progress | None = None,
    verify: bool = True,
    settings: dict[str, Any] | None = None,
    guard: Guard | None = None,
) -> MigrateReport:
    """Copy every table of the store *src* into *dst* (created if it does not
    exist; it must be empty, or hold an interrupted migrate of *src*, which this
    run continues), then verify the copy (``VerificationFailed`` on a difference).
    *src* and *dst*: a path, ``sqlite:///absolute/path``,
    ``sqlite+sharded:///absolute/directory`` or ``postgresql://...``.
    *settings*: ``Settings`` fields for opening both stores.  *guard* (reshard's):
    called between batches (``force`` False) and before the copy is recorded as
    whole and verified (True); it raises ``SourceInUse`` when another process could
    write to SRC.  With a guard, a run that found SRC in use, or a copy that no longer
    fits SRC (an ``IntegrityError``: a row whose parent row SRC did not hold when its
    table was copied; ``VerificationFailed``), records DST as ``stale``: what it holds
    cannot be carried on, and the caller starts over."""
    _check_batch(batch_rows)
    started = time.monotonic()
    src_target, dst_target, src_id, _ = _pair(src, dst, dst_must_exist=False)
    config = dict(settings or {})
    with _opened(src_target, config) as s, _opened(dst_target, config) as d:
        source, dest = _Side(s), _Side(d)
        report = MigrateReport(str(s.url), str(d.url), s.dialect, d.dialect)
        order = _plan(s, d, report)
        report.resumed, items = _claim(dest, order, src_id)
        counts = _counts(source, order)
        report.tables = [TableReport(t.name, counts[t.name]) for t in order]
        try:
            if items.get("state") not in ("copied", "done"):
                copier = _Copier(
                    source, dest, {t.name: t for t in order}, items, batch_rows, progress, report
                )
                copier.guard = guard
                for part in source.parts():
                    copier.part(part, order, report.tables)
                if dest.sharded:
                    copier.index()
                if guard is not None:
                    guard(True)
                _set_item(d, "state", "copied")
            report.src_shards, report.dst_shards = source.shard_count(), dest.shard_count()
            if verify:
                _verify(source, dest, order, report, batch_rows, progress)
                if guard is not None:
                    guard(True)
            report.seconds = time.monotonic() - started
            if report.problems:
                raise VerificationFailed(
                    f"DST {d.url} does not equal SRC {s.url}: " + "; ".join(report.problems),
                    report.problems,
                    report,
                )
        except (SourceInUse, errors.IntegrityError, VerificationFailed) as exc:
            # A verified copy (done) stays as it is: the fleet may be using it now.
            if guard is None or items.get("state") == "done":
                raise
            with contextlib.suppress(errors.FleetstoreError):
                _set_item(d, "state", STALE)
            if not isinstance(exc, SourceInUse):
                guard(True)  # a writer that came since the last look explains it: say so
            raise
        if verify:
            _set_item(d, "state", "done")
            _set_item(d, "finished", _now_text())
    return report


def verify_report(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    progress: Progress | None = None,
    settings: dict[str, Any] | None = None,
) -> MigrateReport:
    """Compare two existing stores as ``migrate`` verifies a copy, changing
    neither (beyond the schema migrations ``fleetstore.open`` applies).  The
    report's ``problems`` list every difference; ``SchemaMismatch`` if the
    schemas differ."""
    _check_batch(batch_rows)
    started = time.monotonic()
    src_target, dst_target, _, _ = _pair(src, dst, dst_must_exist=True)
    config = dict(settings or {})
    with _opened(src_target, config) as s, _opened(dst_target, config) as d:
        source, dest = _Side(s), _Side(d)
        report = MigrateReport(str(s.url), str(d.url), s.dialect, d.dialect, copied=False)
        order = _plan(s, d, report)
        counts = _counts(source, order)
        report.tables = [TableReport(t.name, counts[t.name]) for t in order]
        report.src_shards, report.dst_shards = source.shard_count(), dest.shard_count()
        _verify(source, dest, order, report, batch_rows, progress)
    report.seconds = time.monotonic() - started
    return report


def verify(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    progress: Progress | None = None,
    settings: dict[str, Any] | None = None,
) -> list[str]:
    """Every difference between the stores *src* and *dst* (empty: equal):
    per table its row count and a SHA-256 of its rows, and every blob of *dst*
    (and, when either is sharded, every session's content digest)."""
    return verify_report(src, dst, progress=progress, settings=settings).problems


__all__ = ["identity", "migrate", "verify", "verify_report"]
