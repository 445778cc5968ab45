"""What the ``fleetstore`` commands share: option helpers, opening an existing store,
sizes, an effect as JSON, progress bars."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

import fleetstore
from fleetstore.core.units import size
from fleetstore.errors import FleetstoreError

STORE_HELP = (
    "The store: its file, a directory holding fleetstore.db, sqlite:///absolute/path, or "
    "a sharded store (sqlite+sharded:///absolute/dir, or the directory holding its "
    "catalog.db). Default: $FLEETSTORE_URL, else DATA_DIR/fleetstore.db."
)
store_option = click.option(
    "--store",
    metavar="PATH",
    default=None,
    envvar="FLEETSTORE_URL",
    show_envvar=True,
    help=STORE_HELP,
)


def existing_store(command: str, store: str | None, *, server: bool = True) -> str:
    """What to pass to ``fleetstore.open``: the store file's path, a sharded store's
    ``sqlite+sharded:///DIR`` URL (it exists iff ``DIR/catalog.db`` is a file), or a
    PostgreSQL store's URL (where *server*); exit 2 if there is no store (commands
    that read a store never create one)."""
    from fleetstore.core.targets import CATALOG, SHARDED_SCHEME, parse_target
    from fleetstore.errors import ConfigError

    try:
        kind, target = parse_target(store)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    if kind == "sharded":
        assert not isinstance(target, str)
        directory = target.expanduser().absolute()
        if not (directory / CATALOG).is_file():
            click.echo(
                f"fleetstore {command}: no sharded store at {directory} (no {CATALOG}; "
                "nothing was created)",
                err=True,
            )
            sys.exit(2)
        _check_store(command, directory / CATALOG)
        return f"{SHARDED_SCHEME}://{directory}"
    if isinstance(target, str):
        if not server:
            click.echo(
                f"fleetstore {command}: works on SQLite store files, not on a PostgreSQL "
                "store (see docs/postgresql.md)",
                err=True,
            )
            sys.exit(2)
        return target
    path = target
    if not path.is_file():
        click.echo(f"fleetstore {command}: no store at {path} (nothing was created)", err=True)
        sys.exit(2)
    _check_store(command, path)
    return str(path)


def check_target(
    command: str, store: str | None, *, foreign_ok: bool = False, hint: str = ""
) -> None:
    """For a command that creates the store if missing: exit 1, nothing written, if
    *store* names an existing SQLite file (or a sharded store's catalog) that is not a
    fleetstore store, unless *foreign_ok*; an empty file may become a store."""
    from fleetstore.core.targets import CATALOG, parse_target
    from fleetstore.errors import ConfigError

    try:
        kind, target = parse_target(store)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    if isinstance(target, str) or foreign_ok:
        return
    path = target / CATALOG if kind == "sharded" else target
    if path.is_file() and path.stat().st_size > 0:
        _check_store(command, path, hint)


def _check_store(command: str, path: Path, hint: str = "") -> None:
    """Exit 1, the file unchanged, unless *path* is a fleetstore store: a command
    that works on an existing store never converts another program's file."""
    from fleetstore.store.readonly import check_store_file

    try:
        check_store_file(path)
    except (FleetstoreError, OSError) as exc:
        click.echo(f"fleetstore {command}: {exc}{hint}", err=True)
        sys.exit(1)


def open_existing(command: str, store: str | None) -> fleetstore.Store:
    """The existing store at *store* (see ``existing_store``), opened; exit 1 if it
    cannot be opened."""
    path = existing_store(command, store)
    try:
        return fleetstore.open(path)
    except (FleetstoreError, OSError) as exc:
        click.echo(f"fleetstore {command}: {exc}", err=True)
        sys.exit(1)


@contextmanager
def reading_store(command: str, store: str | None) -> Iterator[fleetstore.Store]:
    """``using_store`` for a command that only reads: a SQLite store (a file or a
    sharded directory) is opened strictly read-only, so no file is written, created
    or converted (store/readonly.py); a PostgreSQL store is opened as usual."""
    from fleetstore.store.readonly import open_read_only

    path = existing_store(command, store)
    try:
        if path.startswith(("postgresql://", "postgres://")):
            opened = fleetstore.open(path)
        else:
            opened = open_read_only(path)
    except (FleetstoreError, OSError) as exc:
        click.echo(f"fleetstore {command}: {exc}", err=True)
        sys.exit(1)
    try:
        yield opened
    except (FleetstoreError, OSError) as exc:
        click.echo(f"fleetstore {command}: {exc}", err=True)
        sys.exit(1)
    finally:
        opened.close(timeout=0)


@contextmanager
def using_store(command: str, store: str | None) -> Iterator[fleetstore.Store]:
    """The existing store (exit 2 if there is none: nothing is created), open for the
    ``with`` block: exit 1 if it cannot be opened or the block raises a fleetstore
    error; closed without waiting for spooled writes."""
    path = existing_store(command, store)
    try:
        opened = fleetstore.open(path)
    except (FleetstoreError, OSError) as exc:
        click.echo(f"fleetstore {command}: {exc}", err=True)
        sys.exit(1)
    try:
        yield opened
    except FleetstoreError as exc:
        click.echo(f"fleetstore {command}: {exc}", err=True)
        sys.exit(1)
    finally:
        opened.close(timeout=0)


def effect_json(effect: fleetstore.Effect) -> dict[str, object]:
    """An outbox effect as the ``--json`` of the effects commands print it: every field,
    the state as its name, a bytes payload as ``{"base64": ...}``."""
    import base64
    import dataclasses

    data = dataclasses.asdict(effect)
    data["state"] = effect.state.value
    if isinstance(effect.payload, bytes):
        data["payload"] = {"base64": base64.b64encode(effect.payload).decode("ascii")}
    return data


def when(t: float | None) -> str:
    """A time for a table: ``2025-01-31 09:30`` (UTC), ``-`` for none."""
    import datetime

    if t is None:
        return "-"
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%d %H:%M")


def env(command: str, option: str) -> dict[str, Any]:
    """``envvar``/``show_envvar`` for an option: FLEETSTORE_<COMMAND>_<OPTION>."""
    name = f"FLEETSTORE_{command}_{option}".upper().replace("-", "_").replace(" ", "_")
    return {"envvar": name, "show_envvar": True}


class ProgressBars:
    """A click progress bar per stage, on stderr, only when stderr is a terminal."""

    def __init__(self) -> None:
        self.enabled = sys.stderr.isatty()
        self._bar: Any = None
        self._stage = ""
        self._pos = 0

    def __call__(self, stage: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        if stage != self._stage:
            self.close()
            self._bar = click.progressbar(length=max(total, 1), label=stage, file=sys.stderr)
            self._stage, self._pos = stage, 0
        self._bar.update(max(done - self._pos, 0))
        self._pos = max(done, self._pos)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.render_finish()
            self._bar = None
            self._stage = ""


__all__ = [
    "STORE_HELP",
    "ProgressBars",
    "check_target",
    "effect_json",
    "env",
    "existing_store",
    "open_existing",
    "reading_store",
    "size",
    "store_option",
    "using_store",
    "when",
]
