"""Settings: keyword arguments, each with a ``FLEETSTORE_*`` environment variable.

Precedence: an explicit keyword argument, then the environment, then the default.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from fleetstore.core.validate import INT_MAX, MAX_INLINE, MAX_WAIT, check_number
from fleetstore.errors import ConfigError, InvalidInput

SYNCHRONOUS_MODES = ("NORMAL", "FULL", "EXTRA")
ON_BUSY = ("spool", "raise")
#: The number settings and their ranges (seconds).
_NUMBERS = {
    "write_budget": (0.0, MAX_WAIT),
    "stream_flush_interval": (0.001, MAX_WAIT),
    "publish_interval": (0.0, MAX_WAIT),
    "search_interval": (0.01, MAX_WAIT),
}
#: The integer settings and their largest values.
_INTEGERS = {
    "busy_timeout_ms": 2**31 - 1,  # SQLite takes a C int
    "checkpoint_bytes": INT_MAX,
    "truncate_bytes": INT_MAX,
    "blob_threshold": MAX_INLINE,  # a smaller payload is stored inline, in its row
    "max_payload_bytes": INT_MAX,
    "stream_flush_bytes": INT_MAX,
    "pool_size": 10_000,
    "max_open_shards": 1_000_000,
    "search_part_chars": INT_MAX,
}


@dataclass(frozen=True, slots=True)
class Settings:
    """How a store writes.  Every field can be set as ``FLEETSTORE_<NAME>``."""

    #: Seconds a write may wait for the lock (gate plus SQLite) before it gives up.
    write_budget: float = 60.0
    #: SQLite ``synchronous``: NORMAL (default; a power loss may drop the last
    #: commits, never corrupt) or FULL (every commit fsynced) or EXTRA.
    synchronous: str = "NORMAL"
    #: busy_timeout on every connection, the backstop when a lock is met
    #: outside the gate (reads, processes that do not use fleetstore).
    busy_timeout_ms: int = 5000
    #: Run a passive checkpoint after a commit once the WAL holds this many bytes.
    checkpoint_bytes: int = 4 * 1024 * 1024
    #: Try a truncating checkpoint (only when no reader blocks it) past this size.
    truncate_bytes: int = 64 * 1024 * 1024
    #: Take the cross-process writer gate (a flock on ``<db>.gate``) before BEGIN.
    #: Turning it off is for benchmarks; writers then queue on SQLite alone.
    gate: bool = True
    #: What a write does when the budget runs out: ``spool`` (append it, fsynced,
    #: to this process's journal and return; replayed in order when the lock
    #: frees) or ``raise`` (``StoreBusy``).
    on_busy: str = "spool"
    #: Payloads (a part body, a state value) of at least this many bytes are
    #: compressed and written as blob files before the transaction.
    blob_threshold: int = 64 * 1024
    #: The largest payload accepted (``PayloadTooLarge`` beyond it).
    max_payload_bytes: int = 256 * 1024 * 1024
    #: A streamed reply's pending text is written after this many seconds...
    stream_flush_interval: float = 0.5
    #: ...or once this many bytes are pending, and when the stream ends.
    stream_flush_bytes: int = 32 * 1024
    #: Seconds between this process's published figures (``<db>.procs/<pid>.json``,
    #: read by ``fleetstore top``); 0 publishes nothing.
    publish_interval: float = 1.0
    #: PostgreSQL: connections this process's pool may open (opened on demand,
    #: closed after 5 idle minutes).  processes x pool_size must stay under the
    #: server's max_connections.
    pool_size: int = 4
    #: PostgreSQL: where this host keeps the spool journals and published figures of
    #: the store (default ``<data dir>/postgres/<host>_<port>_<database>``).
    local_dir: str = ""
    #: Sharded stores (``sqlite+sharded:///DIR``): shard files this process keeps
    #: open at once (idle ones beyond it are closed, least recently used first).
    max_open_shards: int = 64
    #: With an OpenTelemetry SDK installed, keep the trace context an effect is
    #: enqueued in with the effect, so that its handler's span joins that trace
    #: (docs/telemetry.md).  Off by default: the context is written to the store.
    trace_effects: bool = False
    #: The keyring file (fleetstore.core.keys) of a store encrypted at rest; "" for
    #: none.  Given, the SQLite files and everything written beside them (blobs, spool
    #: journals, archives, exports, backups) are encrypted (docs/secrets.md).
    encryption_key_file: str = ""
    #: Secrets in what is written (messages, parts, streamed text, tool arguments and
    #: outputs, state values, effect payloads) are replaced by ``[REDACTED:kind]``
    #: before they are stored (docs/secrets.md, "Redaction").
    redaction: bool = True
    #: A rules file of your own (TOML, docs/secrets.md "Adding rules"): rules added to
    #: the built-in ones, built-in kinds disabled, strings allowed.  "" for none.
    redaction_rules_file: str = ""
    #: Keep the search index up to date from this process: a thread of its own takes what
    #: the writes queued, in batches (docs/search.md).  Off, this process's writes are
    #: still queued, and indexed by another process (or ``fleetstore index``).
    search_index: bool = True
    #: Seconds between the indexer's looks at the queue when it is empty: the lag of a
    #: write that finds it idle.
    search_interval: float = 0.5
    #: The share of its time this process's search indexer may take while there is
    #: work (after each batch it rests nine times as long at 0.1): a fleet of writers
    #: on few cores keeps the rest (the index took two thirds of the turns of `make
    #: demo` unbounded).  The index falls behind while the writes outpace it, visibly
    #: (``store.search.status()``, ``top``); ``fleetstore index`` catches up unbounded.
    search_share: float = 0.1
    #: A part's text longer than this (characters) is searched by its first and its last
    #: half of it only.
    search_part_chars: int = 1024 * 1024

    def __post_init__(self) -> None:
        for name, (minimum, maximum) in _NUMBERS.items():
            value = getattr(self, name)
            try:
                check_number(value, name, minimum=minimum, maximum=maximum)
            except InvalidInput:
                raise ConfigError(
                    f"{name} must be a finite number of seconds from {minimum:g} to "
                    f"{maximum:g}, not {value!r:.80}"
                ) from None
        try:
            check_number(self.search_share, "search_share", minimum=0.01, maximum=1.0)
        except InvalidInput:
            raise ConfigError(
                f"search_share must be a fraction from 0.01 to 1, not {self.search_share!r:.80}"
            ) from None
        if (
            not isinstance(self.synchronous, str)
            or self.synchronous.upper() not in SYNCHRONOUS_MODES
        ):
            raise ConfigError(
                f"synchronous must be one of {', '.join(SYNCHRONOUS_MODES)}, "
                f"not {self.synchronous!r:.80}"
            )
        object.__setattr__(self, "synchronous", self.synchronous.upper())
        if not isinstance(self.on_busy, str) or self.on_busy not in ON_BUSY:
            raise ConfigError(
                f"on_busy must be one of {', '.join(ON_BUSY)}, not {self.on_busy!r:.80}"
            )
        for name, maximum in _INTEGERS.items():
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= maximum:
                raise ConfigError(
                    f"{name} must be a positive integer of at most {maximum:,}, not {value!r:.80}"
                )
        if not isinstance(self.local_dir, str) or (self.local_dir and "\x00" in self.local_dir):
            raise ConfigError(f"local_dir must be a directory path, not {self.local_dir!r:.80}")
        try:
            self.local_dir.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            raise ConfigError(f"local_dir is not a valid path: {self.local_dir!r:.80}") from None
        if not isinstance(self.encryption_key_file, str) or "\x00" in self.encryption_key_file:
            raise ConfigError(
                f"encryption_key_file must be a file path, not {self.encryption_key_file!r:.80}"
            )
        if not isinstance(self.redaction_rules_file, str) or "\x00" in self.redaction_rules_file:
            raise ConfigError(
                f"redaction_rules_file must be a file path, not {self.redaction_rules_file!r:.80}"
            )
        for name in ("gate", "trace_effects", "search_index", "redaction"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, not {getattr(self, name)!r:.80}")

    @classmethod
    def load(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Defaults, then ``FLEETSTORE_*`` variables from *env* (default ``os.environ``),
        then *overrides*.  Unknown names and unparsable values raise ``ConfigError``."""
        env = os.environ if env is None else env
        if not isinstance(env, Mapping):
            raise ConfigError(f"env must be a mapping of variables, not {type(env).__name__}")
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(overrides) - set(known))
        if unknown:
            raise ConfigError(
                f"unknown setting(s): {', '.join(unknown)}; known: {', '.join(known)}"
            )
        values: dict[str, Any] = {}
        for name, field in known.items():
            var = env_var(name)
            if name in overrides:
                values[name] = overrides[name]
            elif var in env:
                values[name] = _parse(var, env[var], field.type)
        return cls(**values)

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)


def default_data_dir() -> Path:
    """Where fleetstore keeps its files when no path is given: ``$FLEETSTORE_DATA_DIR``,
    else ``$XDG_DATA_HOME/fleetstore``, else ``~/.local/share/fleetstore``."""
    explicit = os.environ.get("FLEETSTORE_DATA_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "share"
    return base / "fleetstore"


def env_var(name: str) -> str:
    """The environment variable for setting *name*: ``write_budget`` → ``FLEETSTORE_WRITE_BUDGET``."""
    return "FLEETSTORE_" + name.upper()


def _parse(var: str, raw: object, type_name: object) -> Any:
    if not isinstance(raw, str):
        raise ConfigError(f"{var} must be text, not {type(raw).__name__}")
    text = raw.strip()
    try:
        if type_name in (float, "float"):
            return float(text)
        if type_name in (int, "int"):
            return int(text)
        if type_name in (bool, "bool"):
            lowered = text.lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
    except ValueError:
        raise ConfigError(f"{var}={raw!r} is not a valid {type_name}") from None
    return text


__all__ = ["ON_BUSY", "SYNCHRONOUS_MODES", "Settings", "default_data_dir", "env_var"]
