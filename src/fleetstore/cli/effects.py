"""``fleetstore effects list|show|retry|cancel|sweep|enqueue``: inspect and steer a
store's effect outbox."""

from __future__ import annotations

import json
import sys

import click

import fleetstore
from fleetstore.cli.util import check_target as _check_target
from fleetstore.cli.util import cut_note, emit_json, json_option
from fleetstore.cli.util import effect_json as _effect_json
from fleetstore.cli.util import env as _env
from fleetstore.cli.util import open_existing as _open_existing
from fleetstore.cli.util import reading_store as _reading
from fleetstore.cli.util import store_params as _store_params
from fleetstore.core.render import printable
from fleetstore.errors import FleetstoreError
from fleetstore.models import EffectState


def _when(t: float | None) -> str:
    import datetime

    if t is None:
        return "-"
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


_EFFECT_STATES = [s.value for s in EffectState]

#: Effects read per transaction by ``effects list --all``.
PAGE = 1000

_EFFECTS_EXIT = """\b
Exit codes:
  0  done
  1  the store failed, or refused: the effect's state does not allow it (nothing changed)
  2  bad usage, no store at --store (nothing is created), or no such effect"""


@click.group(
    epilog="""\b
States: pending -> running -> succeeded | pending (retry) | dead | cancelled;
docs/outbox.md has the diagram and the rules.
Exit codes (every subcommand):
  0  done
  1  the store failed, or refused: the effect's state does not allow it (nothing changed)
  2  bad usage, no store at --store (nothing is created), or no such effect"""
)
def effects() -> None:
    """Inspect and steer the effect outbox of a store."""


@effects.command(name="list", epilog=_EFFECTS_EXIT)
@click.option(
    "--thread",
    "thread_key",
    default=None,
    help="Only this thread.",
    **_env("effects list", "thread"),
)
@click.option(
    "--state",
    type=click.Choice(_EFFECT_STATES),
    default=None,
    help="Only this state.",
    **_env("effects list", "state"),
)
@click.option("--kind", default=None, help="Only this kind.", **_env("effects list", "kind"))
@click.option(
    "--limit",
    type=click.IntRange(1, 100_000),
    default=100,
    show_default=True,
    help="At most this many (a cut list says so on stderr).",
    **_env("effects list", "limit"),
)
@click.option(
    "--all",
    "every",
    is_flag=True,
    help=f"Every effect, however many (read {PAGE} at a time); --limit is ignored.",
    **_env("effects list", "all"),
)
@json_option("effects list", each="effect")
@_store_params()
def effects_list(
    thread_key: str | None,
    state: str | None,
    kind: str | None,
    limit: int,
    every: bool,
    as_json: bool,
    store: str | None,
) -> None:
    """Effects by thread and sequence, with a count per state on stderr. A list cut at
    --limit says so on stderr; --all lists every effect."""
    rows: list[tuple[str, ...]] = []
    shown, more, after = 0, False, None
    with _reading("effects list", store) as opened:
        try:
            while True:
                want = PAGE if every else min(PAGE, limit - shown)
                page = opened.effects.list(
                    thread_key=thread_key, state=state, kind=kind, limit=want, after=after
                )
                for e in page:
                    if as_json:
                        emit_json(_effect_json(e))
                    else:
                        rows.append(_row(e))
                shown += len(page)
                more, after = page.more, page.next_cursor
                if not more or (not every and shown >= limit):
                    break
            counts = opened.effects.counts()
        except FleetstoreError as exc:
            click.echo(f"fleetstore effects list: {exc}", err=True)
            sys.exit(1)
    if rows:
        from fleetstore.core.render import table

        columns = ("ID", "THREAD#SEQ", "KIND", "STATE", "ATTEMPT", "NOTE")
        click.echo(table(columns, rows, indent=0))
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    click.echo(
        cut_note(shown, "effect(s)", more, f"in the store: {summary or 'no effects'}"), err=True
    )


def _row(e: fleetstore.Effect) -> tuple[str, ...]:
    note = e.dead_reason or e.last_error or ""
    if e.state == "running":
        note = f"{e.lease_owner} until {_when(e.lease_expires_at)}"
    return (
        e.id,
        f"{e.thread_key}#{e.seq}",
        e.kind,
        e.state.value,
        f"{e.attempt}/{e.max_attempts}",
        note[:80],
    )


@effects.command(name="show", epilog=_EFFECTS_EXIT)
@click.argument("effect_id")
@json_option("effects show")
@_store_params()
def effects_show(effect_id: str, as_json: bool, store: str | None) -> None:
    """One effect with its payload, result and every failed attempt kept (the newest
    20), each with its error and, if its handler raised, its traceback (the last 8 KiB)."""
    with _reading("effects show", store) as opened:
        effect = _get_effect(opened, "show", effect_id)
    if as_json:
        emit_json(_effect_json(effect))
        return
    times = {"available_at", "lease_expires_at", "created_at", "updated_at", "started_at"}
    for name, value in _effect_json(effect).items():
        if name in times or name == "finished_at":
            value = _when(value if isinstance(value, float) else None)
        elif name in ("payload", "result"):
            value = json.dumps(value, ensure_ascii=False)
        if name != "errors":
            click.echo(printable(f"{name:>16}: {value}"))
    for err in effect.errors:
        click.echo(
            printable(
                f"{'error':>16}: attempt {err.attempt}, {_when(err.at)}, {err.owner}: {err.error}"
            )
        )
        if err.traceback:
            for line in err.traceback.rstrip("\n").splitlines():
                click.echo(f"{'':>18}{printable(line)}")


def _get_effect(opened: fleetstore.Store, command: str, effect_id: str) -> fleetstore.Effect:
    try:
        return opened.effects.get(effect_id)
    except (fleetstore.NotFound, fleetstore.InvalidInput) as exc:  # (not an id: bad usage)
        click.echo(f"fleetstore effects {command}: {exc}", err=True)
        sys.exit(2)
    except FleetstoreError as exc:
        click.echo(f"fleetstore effects {command}: {exc}", err=True)
        sys.exit(1)


@effects.command(name="retry", epilog=_EFFECTS_EXIT)
@click.argument("effect_id")
@json_option("effects retry")
@_store_params()
def effects_retry(effect_id: str, as_json: bool, store: str | None) -> None:
    """Run a dead or cancelled effect again (at the end of its thread, with fresh
    attempts), or a pending one now."""
    _steer("retry", effect_id, store, as_json)


@effects.command(name="cancel", epilog=_EFFECTS_EXIT)
@click.argument("effect_id")
@json_option("effects cancel")
@_store_params()
def effects_cancel(effect_id: str, as_json: bool, store: str | None) -> None:
    """Cancel a pending or running effect (a worker running it is told at its next
    heartbeat); its thread moves on to its next effect."""
    _steer("cancel", effect_id, store, as_json)


def _steer(command: str, effect_id: str, store: str | None, as_json: bool) -> None:
    with _open_existing(f"effects {command}", store) as opened:
        _get_effect(opened, command, effect_id)
        try:
            effect = getattr(opened.effects, command)(effect_id)
        except FleetstoreError as exc:
            click.echo(f"fleetstore effects {command}: {exc}", err=True)
            sys.exit(1)
    if as_json:
        emit_json(_effect_json(effect))
    else:
        click.echo(f"{effect.id}: {effect.state.value} ({effect.thread_key}#{effect.seq})")


@effects.command(name="sweep", epilog=_EFFECTS_EXIT)
@json_option("effects sweep", each="swept effect (id, state)")
@_store_params()
def effects_sweep(as_json: bool, store: str | None) -> None:
    """Take effects whose lease expired from their lost workers: back to pending
    (replay-safe, attempts left) or to dead, with the reason. Workers also do this
    on their own, every half lease."""
    with _open_existing("effects sweep", store) as opened:
        try:
            swept = opened.effects.sweep()
        except FleetstoreError as exc:
            click.echo(f"fleetstore effects sweep: {exc}", err=True)
            sys.exit(1)
    if as_json:
        for s in swept:
            emit_json({"id": s.id, "state": s.state.value})
        return
    for s in swept:
        click.echo(f"{s.id}: {s.state.value}")
    click.echo(f"-- swept {len(swept)} effect(s)", err=True)


@effects.command(
    name="enqueue",
    epilog="""\b
Exit codes:
  0  enqueued (or the idempotency key was used before: nothing new); the id is printed
  1  the store failed, or the key names an effect of another thread or kind
  2  bad usage: PAYLOAD is not JSON, an empty THREAD_KEY or KIND""",
)
@click.argument("thread_key")
@click.argument("kind")
@click.argument("payload", required=False, default="null")
@click.option(
    "--idempotency-key",
    default=None,
    help="Enqueue nothing if this key was used.",
    **_env("effects enqueue", "idempotency-key"),
)
@click.option(
    "--delay",
    type=click.FloatRange(min=0),
    default=0.0,
    help="Seconds before it may run.",
    **_env("effects enqueue", "delay"),
)
@click.option(
    "--max-attempts",
    type=click.IntRange(1, 10_000),
    default=5,
    show_default=True,
    help="Attempts before it is dead.",
    **_env("effects enqueue", "max-attempts"),
)
@click.option(
    "--replay-safe/--not-replay-safe",
    default=None,
    help="May it run again after its worker was lost? Default: as its kind is declared.",
    **_env("effects enqueue", "replay-safe"),
)
@json_option("effects enqueue")
@_store_params()
def effects_enqueue(
    thread_key: str,
    kind: str,
    payload: str,
    idempotency_key: str | None,
    delay: float,
    max_attempts: int,
    replay_safe: bool | None,
    as_json: bool,
    store: str | None,
) -> None:
    """Add an effect of KIND at the end of THREAD_KEY; PAYLOAD is JSON. Prints its id
    (--json: the effect).
    The store is created if missing (a file that is not a fleetstore store is
    refused, unchanged)."""
    try:
        value = json.loads(payload)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="PAYLOAD") from None
    _check_target("effects enqueue", store)
    try:
        with fleetstore.open(store) as opened:
            effect_id = opened.effects.enqueue(
                thread_key,
                kind,
                value,
                idempotency_key=idempotency_key,
                delay=delay,
                max_attempts=max_attempts,
                replay_safe=replay_safe,
            )
            effect = opened.effects.get(effect_id) if as_json else None
    except fleetstore.AlreadyExists as exc:
        click.echo(f"fleetstore effects enqueue: {exc}", err=True)
        sys.exit(1)
    except fleetstore.InvalidInput as exc:
        raise click.BadParameter(str(exc)) from None
    except (FleetstoreError, OSError) as exc:
        click.echo(f"fleetstore effects enqueue: {exc}", err=True)
        sys.exit(1)
    if effect is not None:
        emit_json(_effect_json(effect))
    else:
        click.echo(effect_id)
