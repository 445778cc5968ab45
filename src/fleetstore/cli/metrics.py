"""``fleetstore metrics``: a store's figures for Prometheus (the work is in
fleetstore.admin.metrics)."""

from __future__ import annotations

import signal
import sys
from typing import Any

import click

from fleetstore.cli.util import emit_json, existing_store, json_option, store_params
from fleetstore.cli.util import env as _env
from fleetstore.errors import FleetstoreError


def _address(value: str | None) -> tuple[str, int] | None:
    if value is None:
        return None
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise click.BadParameter(
            f"{value!r}: give HOST:PORT (127.0.0.1:9464; port 0 picks a free one)",
            param_hint="--serve",
        )
    return host, int(port)


@click.command(
    epilog="""\b
Exit codes:
  0  the figures were printed; --serve: stopped by SIGINT or SIGTERM
  1  the store could not be opened or read, or --serve could not listen
  2  bad usage, or there is no store at --store (nothing is created)""",
)
@store_params()
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["prometheus", "json"]),
    default="prometheus",
    show_default=True,
    help="Prometheus's text exposition format, or the same figures as one JSON object.",
    **_env("metrics", "format"),
)
@json_option("metrics", what="the same figures as --format json")
@click.option(
    "--serve",
    metavar="HOST:PORT",
    default=None,
    help="Serve the figures on http://HOST:PORT/metrics for a Prometheus server to "
    "scrape (read afresh at every scrape), until SIGINT or SIGTERM.",
    **_env("metrics", "serve"),
)
def metrics_command(store: str | None, fmt: str, as_json: bool, serve: str | None) -> None:
    """The whole store's figures, for Prometheus: every process's (published beside
    the store about once a second, publish_interval), those of the processes that
    closed it, and what the store holds now (effects per state, the age of the oldest
    available effect, the WAL's size).

    Counters count over the store's life, so rate() works across processes that come
    and go; gauges are over the live processes. docs/telemetry.md lists every metric,
    its unit and labels, and the queries to alert on. The store is opened read-only
    (a SQLite store: nothing is written to any file).
    """
    from fleetstore.admin import metrics as figures_of

    address = _address(serve)
    if as_json:
        if (
            fmt == "prometheus"
            and click.get_current_context().get_parameter_source("fmt")
            is click.core.ParameterSource.COMMANDLINE
        ):
            raise click.UsageError("--json is --format json: give one or the other")
        fmt = "json"
    path = existing_store("metrics", store)
    opened = _open(path)
    try:

        def gather() -> figures_of.Figures:
            from fleetstore.store.observe import store_figures

            return figures_of.gather(
                opened.url if opened.dialect == "postgresql" else path,
                opened.path,
                lambda: store_figures(opened),
            )

        if address is None:
            figures = gather()
            if fmt == "json":
                emit_json(figures_of.as_json(figures))
            else:
                click.echo(figures_of.prometheus(figures), nl=False)
            if figures.error is not None:
                click.echo(
                    f"fleetstore metrics: the store could not be read: {figures.error}", err=True
                )
                sys.exit(1)
            return
        _serve(address, lambda: figures_of.prometheus(gather()))
    finally:
        opened.close(timeout=0)


def _open(path: str) -> Any:
    import fleetstore
    from fleetstore.store.readonly import open_read_only

    try:
        if path.startswith(("postgresql://", "postgres://")):
            # (Its own figures are not published: this command is not one of the fleet.)
            return fleetstore.open(path, publish_interval=0)
        return open_read_only(path)
    except (FleetstoreError, OSError) as exc:
        click.echo(f"fleetstore metrics: {exc}", err=True)
        sys.exit(1)


def _serve(address: tuple[str, int], render: Any) -> None:
    from fleetstore.admin.metrics import server

    try:
        httpd = server(address[0], address[1], render)
    except OSError as exc:
        click.echo(
            f"fleetstore metrics: cannot listen on {address[0]}:{address[1]}: {exc}", err=True
        )
        sys.exit(1)

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    host, port = httpd.server_address[:2]
    shown = host.decode() if isinstance(host, bytes) else host
    shown = f"[{shown}]" if ":" in shown else shown  # an IPv6 address
    click.echo(f"fleetstore metrics: serving http://{shown}:{port}/metrics", err=True)
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        httpd.server_close()
