"""``fleetstore worker``: run the effects of a store's outbox with the handlers of
MODULE:HANDLERS (the worker is fleetstore.Worker)."""

from __future__ import annotations

import signal
import sys
from types import FrameType, TracebackType
from typing import TYPE_CHECKING

import click

from fleetstore.cli.util import emit_json, json_option
from fleetstore.cli.util import env as _env
from fleetstore.cli.util import open_existing as _open_existing
from fleetstore.cli.util import store_params as _store_params
from fleetstore.errors import ConfigError, FleetstoreError

if TYPE_CHECKING:
    from fleetstore.domain.worker import Worker

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _Signals:
    """SIGINT/SIGTERM from the command's first line to its last, never Python's
    ``KeyboardInterrupt`` (click's ``Aborted!``, exit 1: issue 28, 1 run in 3 under
    ``timeout -s INT``).  Before the worker exists (loading the handlers, opening
    the store) the first signal is kept, and the worker then stops before claiming
    anything (exit 0); a second one stops at once, hard (exit 3).  Once it exists, a
    signal stops it (``Worker.stop``; ``Worker.run`` has its own handlers meanwhile
    and puts these back when it returns, so one arriving while it shuts down, or
    while the store closes, changes nothing), and after the command, while the
    process exits, signals are ignored."""

    def __init__(self) -> None:
        self.count = 0
        self.runner: Worker | None = None

    def __enter__(self) -> _Signals:
        for sig in _SIGNALS:
            signal.signal(sig, self._on_signal)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # The worker has stopped and its exit code is decided; what is left is the
        # interpreter's exit.  A signal now (timeout's second one, to the group, a few
        # ms late) would end the process with -SIGINT instead of that code: ignore it.
        for sig in _SIGNALS:
            signal.signal(sig, signal.SIG_IGN)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if self.runner is not None:
            self.runner.stop()
        elif self.count > 1:
            click.echo(
                f"fleetstore worker: {signal.Signals(signum).name} again: stopping", err=True
            )
            sys.exit(3)

    def attach(self, runner: Worker) -> None:
        self.runner = runner
        if self.count:
            runner.stop()  # a signal came during start-up: claim nothing


@click.command(
    epilog="""\b
Signals: the first SIGINT/SIGTERM stops claiming, gives back claimed effects
that have not started (no attempt spent) and waits up to --grace seconds for
running ones; a second one stops hard: running effects are settled as
interrupted (replay-safe ones go back to pending, the others to dead).
Exit codes:
  0  stopped after its running effects finished (or, with --until-idle, nothing was left)
  1  the store could not be opened or failed, or an optional dependency is missing
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
@json_option("worker")
@_store_params()
def worker(
    handlers: str,
    concurrency: int,
    lease: float,
    handler_timeout: float,
    grace: float,
    prefetch: int,
    poll_interval: float,
    until_idle: bool,
    as_json: bool,
    store: str | None,
) -> None:
    """Run effects of the store's outbox with the handlers in MODULE:HANDLERS.

    HANDLERS is a mapping of kind -> function (or fleetstore.Handler, which also
    declares whether the kind is replay-safe); a function taking the Effect, sync
    or async, returning a JSON result. Raising fleetstore.RetryEffect or any error
    retries with backoff, fleetstore.FailEffect fails for good.
    """
    with _Signals() as signals:
        code, owner, stats = _run(
            signals,
            handlers,
            store,
            concurrency=concurrency,
            lease=lease,
            handler_timeout=handler_timeout or None,
            grace=grace,
            prefetch=prefetch,
            poll_interval=poll_interval,
            until_idle=until_idle,
        )
        if as_json:
            emit_json({"owner": owner, "stats": stats, "exit_code": code})
        done = ", ".join(f"{n} {k}" for k, n in sorted(stats.items())) or "nothing run"
        click.echo(f"fleetstore worker: {owner}: {done}", err=True)
    sys.exit(code)


def _run(
    signals: _Signals, handlers: str, store: str | None, **options: object
) -> tuple[int, str, dict[str, int]]:
    """Load the handlers, open the store, run the worker: (exit code, owner, stats)."""
    import logging

    import fleetstore
    from fleetstore.admin.worker import HandlersError, load_handlers
    from fleetstore.cli import logs

    try:
        table = load_handlers(handlers)
    except HandlersError as exc:
        raise click.BadParameter(str(exc)) from None
    logs.default_level(logging.INFO)  # what the worker does, unless -v/-q chose
    opened = _open_existing("worker", store)
    try:
        runner = fleetstore.Worker(opened, table, **options)  # type: ignore[arg-type]
    except ConfigError as exc:
        opened.close()
        raise click.BadParameter(str(exc)) from None
    signals.attach(runner)
    try:
        code = runner.run()
    except FleetstoreError as exc:
        click.echo(f"fleetstore worker: {exc}", err=True)
        code = 1
    finally:
        opened.close()
    return code, runner.owner, dict(runner.stats)
