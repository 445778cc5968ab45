"""``fleetstore worker``: run the effects of a store's outbox with the handlers of
MODULE:HANDLERS (the worker is fleetstore.Worker)."""

from __future__ import annotations

import sys

import click

import fleetstore
from fleetstore.admin.worker import HandlersError, load_handlers
from fleetstore.cli.util import env as _env
from fleetstore.cli.util import open_existing as _open_existing
from fleetstore.cli.util import store_option as _store_option
from fleetstore.errors import ConfigError, FleetstoreError


@click.command(
    epilog="""\b
Signals: the first SIGINT/SIGTERM stops claiming, gives back claimed effects
that have not started (no attempt spent) and waits up to --grace seconds for
running ones; a second one stops hard: running effects are settled as
interrupted (replay-safe ones go back to pending, the others to dead).
Exit codes:
  0  stopped after its running effects finished (or, with --until-idle, nothing was left)
  1  the store could not be opened or failed
  2  bad usage: MODULE:HANDLERS cannot be imported or is not a mapping, no store at --store
  3  stopped hard: effects were interrupted
  4  every slot (--concurrency) was held by a handler that ran past --handler-timeout
     and had not returned: restart the process (a thread cannot be stopped)""",
)
@click.argument("handlers", metavar="MODULE:HANDLERS")
@click.option(
    "--concurrency",
    type=click.IntRange(1, 1024),
    default=4,
    show_default=True,
    help="Effects run at once.",
    **_env("worker", "concurrency"),
)
@click.option(
    "--lease",
    type=click.FloatRange(min=0.1),
    default=30.0,
    show_default=True,
    help="Seconds a claim lasts unless renewed (heartbeats renew it every third).",
    **_env("worker", "lease"),
)
@click.option(
    "--handler-timeout",
    type=click.FloatRange(min=0),
    default=600.0,
    show_default=True,
    metavar="SECONDS",
    help="Seconds an attempt of a handler may run (0: no limit; fleetstore.Handler(timeout=...) "
    "sets it per kind). Past it the attempt is settled as timed out (retried if the kind is "
    "replay-safe, else dead) and the handler abandoned: its thread runs on, holding its slot.",
    **_env("worker", "handler-timeout"),
)
@click.option(
    "--grace",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="Seconds running effects get to finish after the first signal.",
    **_env("worker", "grace"),
)
@click.option(
    "--prefetch",
    type=click.IntRange(0, 1024),
    default=0,
    show_default=True,
    help="Effects claimed ahead of a free slot.",
    **_env("worker", "prefetch"),
)
@click.option(
    "--poll-interval",
    type=click.FloatRange(min=0.001),
    default=0.1,
    show_default=True,
    help="The longest an idle worker waits between looks for ready effects "
    "(a random half to whole of it).",
    **_env("worker", "poll-interval"),
)
@click.option(
    "--until-idle",
    is_flag=True,
    help="Stop once no effect of its kinds is pending.",
    **_env("worker", "until-idle"),
)
@_store_option
def worker(
    handlers: str,
    concurrency: int,
    lease: float,
    handler_timeout: float,
    grace: float,
    prefetch: int,
    poll_interval: float,
    until_idle: bool,
    store: str | None,
) -> None:
    """Run effects of the store's outbox with the handlers in MODULE:HANDLERS.

    HANDLERS is a mapping of kind -> function (or fleetstore.Handler, which also
    declares whether the kind is replay-safe); a function taking the Effect, sync
    or async, returning a JSON result. Raising fleetstore.RetryEffect or any error
    retries with backoff, fleetstore.FailEffect fails for good.
    """
    import logging

    try:
        table = load_handlers(handlers)
    except HandlersError as exc:
        raise click.BadParameter(str(exc)) from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    opened = _open_existing("worker", store)
    try:
        runner = fleetstore.Worker(
            opened,
            table,  # type: ignore[arg-type]
            concurrency=concurrency,
            lease=lease,
            handler_timeout=handler_timeout or None,
            grace=grace,
            prefetch=prefetch,
            poll_interval=poll_interval,
            until_idle=until_idle,
        )
    except ConfigError as exc:
        opened.close()
        raise click.BadParameter(str(exc)) from None
    try:
        code = runner.run()
    except FleetstoreError as exc:
        click.echo(f"fleetstore worker: {exc}", err=True)
        code = 1
    finally:
        opened.close()
    stats = ", ".join(f"{n} {k}" for k, n in sorted(runner.stats.items())) or "nothing run"
    click.echo(f"fleetstore worker: {runner.owner}: {stats}", err=True)
    sys.exit(code)
