"""What a store URL or path names: one SQLite file, a sharded directory or a
PostgreSQL database.  Every command and the facade resolve targets here, and only
here; nothing is opened or created."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from fleetstore import errors
from fleetstore.core.settings import Settings, default_data_dir
from fleetstore.core.validate import check_path

#: The file a directory names, and the default store under the data directory.
DEFAULT_FILENAME = "fleetstore.db"
#: A sharded store's directory holds CATALOG and the SHARDS folder.
CATALOG = "catalog.db"
SHARDS = "shards"
POSTGRES_SCHEMES = ("postgresql", "postgres")
SHARDED_SCHEME = "sqlite+sharded"


def redact(url: str) -> str:
    """A store URL without its password, for messages and reports.

    >>> redact("postgresql://app:secret@db:5432/agents")
    'postgresql://app:***@db:5432/agents'
    """
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


def parse_target(url_or_path: str | os.PathLike[str] | None) -> tuple[str, Path | str]:
    """``("sqlite", Path)``, ``("sharded", directory Path)`` or ``("postgresql", url)``
    for a path or store URL (``None``: ``$FLEETSTORE_URL``, else
    ``<data dir>/fleetstore.db``).  A directory holding a sharded store's
    ``catalog.db`` is that sharded store."""
    if url_or_path is None:
        url_or_path = os.environ.get("FLEETSTORE_URL") or None
    if url_or_path is None:
        return "sqlite", default_data_dir() / DEFAULT_FILENAME
    text = check_path(url_or_path, "the store path or URL")
    if "://" in text:
        scheme, _, rest = text.partition("://")
        if scheme in POSTGRES_SCHEMES:
            return "postgresql", text
        if scheme not in ("sqlite", SHARDED_SCHEME):
            raise errors.ConfigError(
                f"unsupported store URL scheme {scheme!r} in {redact(text)!r}: use a path, "
                "sqlite:///absolute/path, sqlite+sharded:///absolute/directory or "
                "postgresql://user@host:port/database"
            )
        if not rest.startswith("/"):
            raise errors.ConfigError(f"{text!r}: write {scheme}:///absolute/path (three slashes)")
        if not rest.strip("/"):
            # "sqlite:///" used to name the root directory: a store at /fleetstore.db.
            raise errors.ConfigError(
                f"{text!r}: an empty store path; write {scheme}:///absolute/path"
            )
        if scheme == SHARDED_SCHEME:
            directory = Path(rest)
            if directory.exists() and not directory.is_dir():
                raise errors.ConfigError(f"{text!r}: a sharded store is a directory, not a file")
            if (directory / DEFAULT_FILENAME).exists() and not (directory / CATALOG).exists():
                # (It made an empty sharded store beside the file store, writes went there.)
                raise errors.ConfigError(
                    f"{text!r}: {directory} holds a single-file store ({DEFAULT_FILENAME}); "
                    f"open it by its path, or convert it: fleetstore reshard"
                )
            return "sharded", directory
        text = rest
    if not text:
        raise errors.ConfigError("an empty store path")
    path = Path(text).expanduser()
    if path.is_dir():
        if (path / CATALOG).is_file() and not (path / DEFAULT_FILENAME).exists():
            return "sharded", path
        path = path / DEFAULT_FILENAME
    if path.name == CATALOG and (path.parent / SHARDS).is_dir():
        return "sharded", path.parent
    return "sqlite", path


def refuse_shard(path: Path) -> None:
    """``ConfigError`` if *path* is a shard file of a sharded store: opened alone as a
    store, it took writes the sharded store never showed (doctor may still read it)."""
    root = path.parent.parent.parent
    if path.parent.parent.name == SHARDS and (root / CATALOG).is_file():
        raise errors.ConfigError(
            f"{path}: a shard of the sharded store at {root}; open sqlite+sharded://{root}"
        )


def resolve_target(url_or_path: str | os.PathLike[str] | None) -> Path:
    """The SQLite file a URL or path names.  ``None``: ``$FLEETSTORE_URL``, else
    ``<data dir>/fleetstore.db``.  A directory means ``<dir>/fleetstore.db``.
    A PostgreSQL URL or a sharded store raises ``ConfigError`` (this is for
    file-level commands)."""
    kind, target = parse_target(url_or_path)
    if kind == "sharded":
        raise errors.ConfigError(
            f"{target}: a sharded store (a directory of SQLite files); "
            "this works on single SQLite store files only"
        )
    if kind != "sqlite":
        raise errors.ConfigError(
            f"{target}: a PostgreSQL store; this works on SQLite store files only"
        )
    assert isinstance(target, Path)
    return target


def sharded_url(directory: Path) -> str:
    """The URL ``fleetstore.open`` takes for the sharded store in *directory*."""
    return f"{SHARDED_SCHEME}://{directory.expanduser().absolute()}"


def sharded_root(url_or_path: str) -> Path | None:
    """The directory of the sharded store *url_or_path* names (a
    ``sqlite+sharded://`` URL, its directory, or its ``catalog.db``), else None.
    Checks the file system only where the text alone does not tell."""
    if url_or_path.startswith(("postgresql://", "postgres://")):
        return None
    try:
        kind, target = parse_target(url_or_path)
    except errors.ConfigError:
        return None
    return target if kind == "sharded" and isinstance(target, Path) else None


def url_servers(url: str) -> list[tuple[str | None, int]]:
    """The (host, port) pairs a PostgreSQL URL names, in order: one, or several in a
    multi-host URL (``postgresql://u@h1:5432,h2:5433/db``: libpq tries them in turn,
    for failover).  Host None: none in the URL; port 5432 where none is given.

    >>> url_servers("postgresql://u:pw@db1:5433,db2/agents")
    [('db1', 5433), ('db2', 5432)]
    """
    pairs: list[tuple[str | None, int]] = []
    for entry in urlsplit(url).netloc.rpartition("@")[2].split(","):
        one = urlsplit("//" + entry)
        try:
            pairs.append((one.hostname, one.port or 5432))
        except ValueError as exc:
            raise errors.ConfigError(f"{redact(url)}: {entry!r}: {exc}") from None
    return pairs


def local_base(url: str, settings: Settings) -> Path:
    """Where this host keeps a PostgreSQL store's spool and figures: the base path
    (``<base>.spool/``, ``<base>.procs/``), named after the server(s) and database."""
    if settings.local_dir:
        return Path(settings.local_dir).expanduser() / "store"
    parts = urlsplit(url)
    dbname = parts.path.lstrip("/") or (parts.username or "postgres")
    servers = "_".join(f"{host or 'local'}_{port}" for host, port in url_servers(url))
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{servers}_{dbname}")
    return default_data_dir() / "postgres" / name


__all__ = [
    "CATALOG",
    "DEFAULT_FILENAME",
    "POSTGRES_SCHEMES",
    "SHARDED_SCHEME",
    "SHARDS",
    "local_base",
    "parse_target",
    "redact",
    "refuse_shard",
    "resolve_target",
    "sharded_root",
    "sharded_url",
    "url_servers",
]
