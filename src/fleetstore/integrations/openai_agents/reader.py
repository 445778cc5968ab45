"""Reading an Agents SDK ``SQLiteSession`` file (tables ``agent_sessions`` and
``agent_messages``), for ``fleetstore import --from openai-agents-sqlite``
(``fleetstore.integrations.openai_agents.importer``, which imports what it reads).

Does not need the SDK installed.  The file is read strictly read-only, in one
read transaction (``fleetstore.files.foreign``: no journal mode switch, no
``-wal``/``-shm`` created), so the SDK's own processes may keep using it.

``read_agents_source(path, use)`` calls ``use(source)`` inside that transaction:
``source.sessions()`` checks the file session by session (the SDK's tables; every
session id one the store accepts; every row's ``message_data`` a JSON object the
store accepts, unless skipped), and ``source.rows()`` reads a session's rows again,
so that *use* may write each batch to the store as it reads it instead of holding
the file in memory.  A file that is not what the SDK writes raises
``InvalidArchive``; after a read without locks of a file that changed meanwhile,
``FileChanged``, whatever *use* returned.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from fleetstore import errors
from fleetstore.domain import openai_agents as agents_ops
from fleetstore.files import foreign, inspect

T = TypeVar("T")

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_SDK_TIME = "%Y-%m-%d %H:%M:%S"


@dataclass(frozen=True, slots=True)
class AgentsRow:
    """A row of the messages table: its id, the item it holds (None: not a JSON
    object), and when the SDK wrote it (None: unknown)."""

    row_id: int
    item: dict[str, Any] | None
    created_at: float | None


@dataclass(frozen=True, slots=True)
class AgentsSession:
    """A session of the file, checked: its rows (their ids, and each item's
    ``item_hash``) in row order, and the rows skipped as invalid."""

    session_id: str
    created_at: float | None
    row_ids: tuple[int, ...]
    hashes: tuple[str, ...]
    skipped: tuple[int, ...] = ()


def item_hash(item: object) -> str:
    """SHA-256 of an item's canonical JSON (sorted keys, no spaces)."""
    text = json.dumps(item, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _sdk_time(value: object) -> float | None:
    """A SQLite ``CURRENT_TIMESTAMP`` (UTC text) as seconds since the epoch."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.datetime.strptime(value[:19], _SDK_TIME)
    except ValueError:
        return None
    return parsed.replace(tzinfo=datetime.UTC).timestamp()


def check_table_name(name: str, what: str) -> str:
    """*name*, if it can name a table in SQL; else ``InvalidInput``."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise errors.InvalidInput(f"{what} must be an SQL table name, not {name!r}")
    return name


def _bad(path: str, why: str) -> errors.InvalidArchive:
    return errors.InvalidArchive(
        f"{path}: not an Agents SDK SQLiteSession database ({why}); nothing was imported"
    )


def _parse(data: Any) -> dict[str, Any] | None:
    """The item a row holds, or None if it holds none (not JSON, not an object)."""
    try:
        item = json.loads(data)
    except (TypeError, ValueError):
        return None
    return item if isinstance(item, dict) else None


class AgentsSource:
    """The SDK file, open read-only inside one read transaction (only inside the
    *use* of ``read_agents_source``)."""

    def __init__(
        self,
        db: inspect.ReadOnlyDatabase,
        path: str,
        sessions_table: str,
        messages_table: str,
        skip_invalid: bool,
    ) -> None:
        self.db, self.path, self.skip_invalid = db, path, skip_invalid
        self.sessions_table, self.messages_table = sessions_table, messages_table

    def sessions(self) -> Iterator[AgentsSession]:
        """Each session of the file, checked when it is reached: ``InvalidArchive``
        for a session id that is not one, or a row that is not a JSON object (unless
        *skip_invalid*: then it is skipped, as the SDK's own reads do) or not an
        item the store accepts."""
        for session_id, created_at in self._session_ids():
            if not isinstance(session_id, str):
                raise _bad(self.path, f"a session_id that is not text: {session_id!r}")
            try:
                agents_ops.check_session_id(session_id)
            except errors.InvalidInput as exc:
                raise _bad(self.path, str(exc)) from None
            row_ids: list[int] = []
            hashes: list[str] = []
            skipped: list[int] = []
            for row in self.rows(session_id):
                if row.item is None:
                    if self.skip_invalid:
                        skipped.append(row.row_id)
                        continue
                    raise _bad(
                        self.path, f"row {row.row_id} of {self.messages_table} is not a JSON object"
                    )
                try:
                    agents_ops.encode_item(row.item, row.row_id)
                except errors.InvalidInput as exc:
                    raise _bad(self.path, f"row {row.row_id}: {exc}") from None
                row_ids.append(row.row_id)
                hashes.append(item_hash(row.item))
            yield AgentsSession(
                session_id, created_at, tuple(row_ids), tuple(hashes), tuple(skipped)
            )

    def _session_ids(self) -> list[tuple[Any, float | None]]:
        rows = self.db.query(
            f"SELECT session_id, created_at FROM {self.sessions_table} "
            f"UNION ALL SELECT DISTINCT session_id, NULL FROM {self.messages_table} "
            f"WHERE session_id NOT IN (SELECT session_id FROM {self.sessions_table})"
        )
        return [(r[0], _sdk_time(r[1])) for r in rows]

    def rows(self, session_id: str, after: int = -(2**63)) -> Iterator[AgentsRow]:
        """The session's rows after row id *after*, in order, read a page at a time."""
        last = after
        while True:
            page = self.db.query(
                f"SELECT id, message_data, created_at FROM {self.messages_table} "
                "WHERE session_id = ? AND id > ? ORDER BY id LIMIT 1000",
                (session_id, last),
            )
            for row_id, data, at in page:
                yield AgentsRow(row_id, _parse(data), _sdk_time(at))
            if len(page) < 1000:
                return
            last = page[-1][0]


def _open_source(path: str) -> foreign.ForeignFile:
    """*path*, resolved, ready to be read read-only."""
    real = os.path.realpath(path)
    if not os.path.isfile(real):
        raise errors.NotFound(f"{path}: no such file")
    try:
        source = foreign.ForeignFile(real)
    except inspect.InspectFailed as exc:
        if exc.reason == "empty":
            raise _bad(path, "an empty file") from None
        raise _bad(path, "not a SQLite file") from exc
    if source.mode is None:
        raise errors.DatabaseError(
            f"{path}: cannot be read without changing it: {source.why}; open it once with "
            "the SDK (or any SQLite program) and import again; nothing was imported"
        )
    return source


def read_agents_source(
    path: str,
    use: Callable[[AgentsSource], T],
    *,
    sessions_table: str = "agent_sessions",
    messages_table: str = "agent_messages",
    skip_invalid: bool = False,
) -> T:
    """``use(source)`` on the SDK file *path*, inside one read transaction, and its
    result (see the module doc).  ``NotFound``: no such file; ``InvalidArchive``:
    not an SDK file; ``DatabaseError``: it cannot be read without writing beside
    it; ``FileChanged``: it changed during a read without locks (its message asks
    for the import to be run again, *use* having perhaps written)."""
    sessions_table = check_table_name(sessions_table, "sessions_table")
    messages_table = check_table_name(messages_table, "messages_table")
    file = _open_source(path)

    def read(db: inspect.ReadOnlyDatabase) -> T:
        tables = {str(r[0]) for r in db.query("SELECT name FROM sqlite_schema")}
        for table, columns in (
            (sessions_table, {"session_id", "created_at"}),
            (messages_table, {"id", "session_id", "message_data", "created_at"}),
        ):
            if table not in tables:
                raise _bad(path, f"no table {table}")
            have = {str(r[1]) for r in db.query(f"PRAGMA table_info({table})")}
            if not columns <= have:
                missing = ", ".join(sorted(columns - have))
                raise _bad(path, f"table {table} has no column {missing}")
        return use(AgentsSource(db, path, sessions_table, messages_table, skip_invalid))

    try:
        return file.read(read)
    except foreign.FileChanged as exc:
        # *use* may have written during the read (the importer does, a batch per
        # transaction): what it wrote stays, and a rerun continues from there.
        raise foreign.FileChanged(
            path, f"{path} changed while it was read; import it again"
        ) from exc.__cause__
    except inspect.InspectFailed as exc:
        if exc.reason in ("not-a-database", "corrupt"):
            raise _bad(path, exc.reason) from exc
        raise


__all__ = [
    "AgentsRow",
    "AgentsSession",
    "AgentsSource",
    "check_table_name",
    "item_hash",
    "read_agents_source",
]
