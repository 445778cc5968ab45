"""What the ``fleetstore`` commands share: the store they work on (``--store``), the
``--json`` flag and its one shape, opening an existing store, sizes, an effect as
JSON, progress bars.

Imported by every command module, so by ``fleetstore --help``: nothing here loads
the store, apsw, zstandard or rich at import (tests/cli/test_startup.py).
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from click.core import ParameterSource

import fleetstore
from fleetstore.core.units import size

if TYPE_CHECKING:
    from fleetstore.core.keys import Keyring
from fleetstore.errors import FleetstoreError

F = TypeVar("F", bound=Callable[..., Any])

STORE_ENV = "FLEETSTORE_URL"
#: The keyring of an encrypted store (the setting encryption_key_file).
KEY_FILE_ENV = "FLEETSTORE_ENCRYPTION_KEY_FILE"
STORE_HELP = (
    "The store: its file, a directory holding fleetstore.db, sqlite:///absolute/path, a "
    "sharded store (sqlite+sharded:///absolute/dir, or the directory holding its "
    "catalog.db) or postgresql://... Default: $FLEETSTORE_URL, else DATA_DIR/fleetstore.db."
)


def store_params(*, legacy_argument: bool = False, help: str = STORE_HELP) -> Callable[[F], F]:
    """The one way every command names its store: ``--store PATH``, else the group's
    ``fleetstore --store PATH COMMAND``, else ``$FLEETSTORE_URL``, else the default
    store.  *legacy_argument*: the command took the store as an argument before
    (``doctor PATH``); that still works, deprecated (a note on stderr).  The command
    function receives the result as ``store`` (None: the default store)."""

    def decorate(f: F) -> F:
        @functools.wraps(f)
        def command(*args: Any, **kwargs: Any) -> Any:
            given, legacy = kwargs.pop("store"), kwargs.pop("legacy_path", None)
            kwargs["store"] = resolve_store(click.get_current_context(), given, legacy)
            return f(*args, **kwargs)

        wrapped = click.option(
            "--store",
            metavar="PATH",
            default=None,
            envvar=STORE_ENV,
            show_envvar=True,
            help=help,
        )(command)
        if legacy_argument:
            wrapped = click.argument("legacy_path", metavar="[PATH]", required=False, default=None)(
                wrapped
            )
        return wrapped  # type: ignore[return-value]

    return decorate


def resolve_store(ctx: click.Context, given: str | None, legacy: str | None) -> str | None:
    """``--store`` on the command line (the command's, then the group's), the
    deprecated PATH argument, ``$FLEETSTORE_URL``, or None (the default store)."""
    on_line = ctx.get_parameter_source("store") is ParameterSource.COMMANDLINE
    if legacy is not None:
        if on_line and given != legacy:
            raise click.UsageError(f"the store is named twice: PATH {legacy} and --store {given}")
        click.echo(
            f"{ctx.command_path}: the store as an argument is deprecated; write --store {legacy}",
            err=True,
        )
        return legacy
    if on_line:
        return given
    group = ctx.find_root().params.get("store")
    return group if group is not None else given


def json_option(command: str, *, each: str | None = None, what: str = "") -> Callable[[F], F]:
    """``--json``, in one of the two shapes every command's JSON has: JSON lines, one
    object per *each* (a list: sessions, effects, frames), or one JSON object (on one
    line; *what* says what it holds when the command prints more than one thing)."""
    help = (
        f"JSON lines on stdout, one object per {each}, instead of text."
        if each
        else "One JSON object on stdout instead of text" + (f": {what}." if what else ".")
    )
    option: Callable[[F], F] = click.option(
        "--json", "as_json", is_flag=True, default=False, help=help, **env(command, "json")
    )
    return option


def emit_json(value: object, *, err: bool = False) -> None:
    """*value* as one line of JSON (a list's items go one per call)."""
    click.echo(json.dumps(value, ensure_ascii=False, default=str), err=err)


class LazyGroup(click.Group):
    """A command group whose commands are imported when first used: *lazy* maps a
    name to ``module:attribute``.  ``fleetstore --help`` imports every command module
    (for its short help); a command runs with its own module only, and each module
    imports what its work needs inside the command (click's lazy-group pattern).

    *plugins* names an entry-point group where other distributions add commands; it is
    read only when a name not in *lazy* is asked for or the commands are listed
    (``importlib.metadata`` and the scan of the installed distributions cost about
    15 ms of CPU, docs/cli.md "Start-up").  *optional* maps the commands fleetstore names
    but does not ship to the extra that installs each: while it is not installed the
    command is a stand-in that says so in one line and exits 2 (``NotInstalled``)."""

    def __init__(
        self,
        *args: Any,
        lazy: dict[str, str] | None = None,
        plugins: str | None = None,
        optional: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})
        self.plugins = plugins
        self.optional = dict(optional or {})
        self._entry_points: dict[str, Any] | None = None

    def entry_points(self) -> dict[str, Any]:
        """The *plugins* group's entry points by name, read once."""
        if self._entry_points is None:
            found: dict[str, Any] = {}
            if self.plugins:
                from importlib.metadata import entry_points

                found = {ep.name: ep for ep in entry_points(group=self.plugins)}
            self._entry_points = found
        return self._entry_points

    def list_commands(self, ctx: click.Context) -> list[str]:
        names = {*super().list_commands(ctx), *self.lazy, *self.optional}
        return sorted(names | set(self.entry_points()))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands:
            if cmd_name in self.lazy:
                import importlib

                module, _, attr = self.lazy[cmd_name].partition(":")
                self.add_command(getattr(importlib.import_module(module), attr), cmd_name)
            else:
                found = self._plugin(cmd_name)
                if found is not None:
                    self.add_command(found, cmd_name)
        return super().get_command(ctx, cmd_name)

    def _plugin(self, name: str) -> click.Command | None:
        extra = self.optional.get(name)
        ep = self.entry_points().get(name) if self.plugins else None
        if ep is None:
            return None if extra is None else NotInstalled(name, extra)
        try:
            command = ep.load()
        except ModuleNotFoundError as exc:
            # The distribution's record is there but not its package (uninstalled by
            # hand, or hidden: tests/cli/test_plugins.py): the same as not installed.
            from fleetstore.core.extras import EXTRAS

            missing = (exc.name or "").split(".")[0]
            if extra is None or missing not in EXTRAS[extra]:
                raise
            return NotInstalled(name, extra)
        if not isinstance(command, click.Command):
            raise TypeError(f"entry point {ep.value!r} ({self.plugins}) is not a click command")
        return command


class NotInstalled(click.Command):
    """The stand-in for command *name* while *extra* is not installed: it takes any
    arguments (``--help`` included) and says in one line what to install, exit 2 (the
    command does not exist here, as an unknown one; nothing ran)."""

    def __init__(self, name: str, extra: str) -> None:
        from fleetstore.core.extras import install_hint

        hint = install_hint(extra)

        def run(args: tuple[str, ...]) -> None:
            click.echo(
                f"fleetstore {name}: not installed: {hint} (in a checkout of fleetstore: "
                "make venv)",
                err=True,
            )
            sys.exit(2)

        super().__init__(
            name,
            callback=run,
            params=[click.Argument(["args"], nargs=-1, type=click.UNPROCESSED)],
            short_help=f"(not installed: {hint})",
            help=f"Not installed: {hint}.",
            context_settings={"ignore_unknown_options": True, "help_option_names": []},
            add_help_option=False,
        )


def existing_store(
    command: str, store: str | None, *, server: bool = True, plain_ok: bool = False
) -> str:
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
        _check_store(command, directory / CATALOG, plain_ok=plain_ok)
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
    _check_store(command, path, plain_ok=plain_ok)
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


def _check_store(command: str, path: Path, hint: str = "", *, plain_ok: bool = False) -> None:
    """Exit 1, the file unchanged, unless *path* is a fleetstore store: a command
    that works on an existing store never converts another program's file."""
    from fleetstore.store.readonly import check_store_file

    try:
        check_store_file(path, keyring=settings_keyring(), plain_ok=plain_ok)
    except (FleetstoreError, OSError) as exc:
        click.echo(f"fleetstore {command}: {exc}{hint}", err=True)
        sys.exit(1)


def settings_keyring() -> Keyring | None:
    """The keyring the settings name (``--key-file``, ``$FLEETSTORE_ENCRYPTION_KEY_FILE``):
    for the commands that read files without opening a store (doctor, scan).  Only that
    variable is read: doctor reports the other settings' bad values as findings
    (settings-invalid) rather than refuse to run."""
    from fleetstore.core.keys import keyring_of

    return keyring_of(os.environ.get(KEY_FILE_ENV, ""))


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
    """``progress(stage, done, total)`` for admin and transfer: a rich bar per stage on
    stderr, only when stderr is a terminal."""

    def __init__(self) -> None:
        from fleetstore.core.render import Bar

        self._bar = Bar(sys.stderr)
        self.enabled = self._bar.enabled

    def __call__(self, stage: str, done: int, total: int) -> None:
        self._bar.update(stage, done, total)

    def close(self) -> None:
        self._bar.close()


def cut_note(shown: int, noun: str, more: bool, extra: str = "") -> str:
    """The footer of a list (stderr): how many were shown and, when the list was
    cut at --limit, that it was and how to see the rest."""
    note = f"-- {shown} {noun} shown"
    if more:
        note += f"; more not shown (cut at --limit {shown}: --all lists every one)"
    return note + (f"; {extra}" if extra else "")


__all__ = [
    "STORE_ENV",
    "LazyGroup",
    "NotInstalled",
    "STORE_HELP",
    "ProgressBars",
    "check_target",
    "cut_note",
    "effect_json",
    "emit_json",
    "env",
    "existing_store",
    "json_option",
    "open_existing",
    "reading_store",
    "resolve_store",
    "size",
    "store_params",
    "using_store",
    "when",
]
