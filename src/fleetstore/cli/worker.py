"""``fleetstore worker``: run the effects of a store's outbox with the handlers of
MODULE:HANDLERS (the worker is fleetstore.Worker).

It says what it does: a banner when it starts (the store, the kinds, the settings),
a line per failed attempt (the worker's log record of it, on stderr, or a JSON line
with ``--json``), and at the end a count of what it did and of the effects that went
dead.  Issue 25: a handler's ``KeyError`` was never shown, and ``--until-idle`` exited
0 saying "2 retried" when the effect had gone dead (tests/cli/test_worker_failures.py).
"""

from __future__ import annotations

import logging
import signal
import sys
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

import click

from fleetstore.cli.util import emit_json, json_option
from fleetstore.cli.util import env as _env
from fleetstore.cli.util import open_existing as _open_existing
from fleetstore.cli.util import store_params as _store_params
from fleetstore.errors import ConfigError, FleetstoreError

if TYPE_CHECKING:
    from fleetstore.domain.worker import Worker

_SIGNALS = (signal.SIGINT, signal.SIGTERM)

#: The exit code of ``--until-idle`` when effects went dead in its run.
EXIT_DEAD = 5


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
Output: a banner on stderr when it starts (the store, kinds and settings), a line
per failed attempt (what failed, where, and what next: retry in S seconds or
dead; `fleetstore effects show ID` prints its traceback), and a count at the end.
Exit codes:
  0  stopped after its running effects finished (or, with --until-idle, nothing was
     left and no effect went dead in its run)
  1  the store could not be opened or failed, or an optional dependency is missing
  2  bad usage: MODULE:HANDLERS cannot be imported or is not a mapping, no store at --store
  3  stopped hard: effects were interrupted
  4  every slot (--concurrency) was held by a handler that ran past --handler-timeout
     and had not returned: restart the process (a thread cannot be stopped)
  5  --until-idle: nothing was left, but effects went dead in its run (their count is
     printed; fleetstore effects list --state dead)""",
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
    "--backoff",
    type=click.FloatRange(min=0),
    default=1.0,
    show_default=True,
    metavar="SECONDS",
    help="Seconds before a failed attempt runs again, doubled at each attempt (±10 %), at "
    "most --max-backoff (fleetstore.Handler(backoff=...) sets it per kind; a handler's "
    "RetryEffect(delay=...) wins).",
    **_env("worker", "backoff"),
)
@click.option(
    "--max-backoff",
    type=click.FloatRange(min=0),
    default=300.0,
    show_default=True,
    metavar="SECONDS",
    help="The longest wait between two attempts.",
    **_env("worker", "max-backoff"),
)
@click.option(
    "--max-attempts",
    type=click.IntRange(1, 10_000),
    default=None,
    metavar="N",
    help="Give an effect up (dead, attempts_exhausted) after N failed attempts, if that is "
    "fewer than its own max_attempts (set when enqueued, 5 by default); "
    "fleetstore.Handler(max_attempts=...) sets it per kind. Default: the effect's.",
    **_env("worker", "max-attempts"),
)
@click.option(
    "--until-idle",
    is_flag=True,
    help="Stop once no effect of its kinds is pending; exit 5 if effects went dead meanwhile.",
    **_env("worker", "until-idle"),
)
@json_option("worker", each="event (started, failed: one per failed attempt, stopped)")
@_store_params()
def worker(
    handlers: str,
    concurrency: int,
    lease: float,
    handler_timeout: float,
    grace: float,
    prefetch: int,
    poll_interval: float,
    backoff: float,
    max_backoff: float,
    max_attempts: int | None,
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
            as_json,
            concurrency=concurrency,
            lease=lease,
            handler_timeout=handler_timeout or None,
            grace=grace,
            prefetch=prefetch,
            poll_interval=poll_interval,
            backoff=backoff,
            max_backoff=max_backoff,
            max_attempts=max_attempts,
            until_idle=until_idle,
        )
        dead = stats.get("dead", 0)
        if until_idle and code == 0 and dead:
            code = EXIT_DEAD
        if as_json:
            emit_json(
                {
                    "event": "stopped",
                    "owner": owner,
                    "stats": stats,
                    "dead": dead,
                    "exit_code": code,
                }
            )
        done = ", ".join(f"{n} {k}" for k, n in sorted(stats.items())) or "nothing run"
        click.echo(f"fleetstore worker: {owner}: {done}", err=True)
        if dead:
            click.echo(
                f"fleetstore worker: {dead} effect(s) went dead in this run "
                "(fleetstore effects list --state dead; effects show ID for their errors)",
                err=True,
            )
    sys.exit(code)


class _Lines(logging.Handler):
    """The worker's log on stderr; a failed attempt's record as one line (or, with
    ``--json``, a JSON line on stdout), without its traceback, which the store
    keeps (``effects show``)."""

    def __init__(self, as_json: bool) -> None:
        super().__init__(logging.INFO)
        self.as_json = as_json
        self.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            failure = getattr(record, "failure", None)
            if not isinstance(failure, dict):
                click.echo(self.format(record), err=True)
            elif self.as_json:
                emit_json({"event": "failed", "at": record.created, **failure})
            else:
                click.echo(f"fleetstore worker: {record.getMessage()}", err=True)
        except Exception:
            self.handleError(record)


def _banner(runner: Worker, url: str) -> dict[str, Any]:
    """What the worker runs, and how: the ``started`` event."""
    from fleetstore.core.targets import redact

    kinds: dict[str, dict[str, Any]] = {}
    for kind, handler in sorted(runner.handlers.items()):
        policy = runner.policies[kind]
        kinds[kind] = {
            "replay_safe": handler.replay_safe,
            "timeout": runner.timeouts.get(kind),
            "backoff": policy.backoff,
            "max_backoff": policy.max_backoff,
            "max_attempts": policy.max_attempts,
        }
    return {
        "event": "started",
        "store": redact(url),
        "owner": runner.owner,
        "kinds": kinds,
        "concurrency": runner.concurrency,
        "prefetch": runner.prefetch,
        "lease": runner.lease,
        "until_idle": runner.until_idle,
    }


def _banner_text(started: dict[str, Any]) -> str:
    """The banner: a line for the worker, one per set of kinds that share settings."""
    shared: dict[str, list[str]] = {}
    for name, k in started["kinds"].items():
        timeout = "no timeout" if k["timeout"] is None else f"timeout {k['timeout']:g}s"
        how = (
            f"backoff {k['backoff']:g}s doubling to {k['max_backoff']:g}s, "
            f"max attempts {k['max_attempts'] or 'as enqueued'}, {timeout}"
            + ("" if k["replay_safe"] else ", not replay-safe")
        )
        shared.setdefault(how, []).append(name)
    head = (
        f"fleetstore worker: {started['owner']} on {started['store']}: "
        f"{len(started['kinds'])} kind(s), concurrency {started['concurrency']}, "
        f"prefetch {started['prefetch']}, lease {started['lease']:g}s"
        + (", until idle" if started["until_idle"] else "")
    )
    return "\n".join([head, *(f"  {', '.join(names)}: {how}" for how, names in shared.items())])


def _run(
    signals: _Signals, handlers: str, store: str | None, as_json: bool, **options: object
) -> tuple[int, str, dict[str, int]]:
    """Load the handlers, open the store, run the worker: (exit code, owner, stats)."""
    import fleetstore
    from fleetstore.admin.handler_modules import HandlersError, load_handlers
    from fleetstore.cli import logs

    try:
        table = load_handlers(handlers)
    except HandlersError as exc:
        raise click.BadParameter(str(exc)) from None
    # What the worker does, at INFO unless -v/-q chose (the group's log handler gives
    # way to the worker's, on the root logger: the handlers' own logs are shown too).
    logs.take_over(_Lines(as_json), logging.INFO)
    opened = _open_existing("worker", store)
    try:
        runner = fleetstore.Worker(opened, table, **options)  # type: ignore[arg-type]
    except ConfigError as exc:
        opened.close()
        raise click.BadParameter(str(exc)) from None
    signals.attach(runner)
    started = _banner(runner, opened.url)
    if as_json:
        emit_json(started)
    else:
        click.echo(_banner_text(started), err=True)
    try:
        code = runner.run()
    except FleetstoreError as exc:
        click.echo(f"fleetstore worker: {exc}", err=True)
        code = 1
    finally:
        opened.close()
    return code, runner.owner, dict(runner.stats)
