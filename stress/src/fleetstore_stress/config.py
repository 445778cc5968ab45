"""The options of ``fleetstore stress`` and the targets it can run."""

from __future__ import annotations

import importlib.util
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import fleetstore
from fleetstore import errors
from fleetstore.core.targets import parse_target

PEERS = ("t3code", "opencode", "zcode", "agents-sdk", "langgraph")
TARGET_NAMES = ("fleetstore", *PEERS)
PEER_NOTES = {
    "fleetstore": "fleetstore: writer gate, blobs, spool, outbox",
    "t3code": "t3code's pattern: one connection per server behind one permit, busy_timeout "
    "5000, deferred BEGIN, events with projections, outbox with lease-owner fencing",
    "opencode": "opencode's pattern: shared WAL, busy_timeout 5000, part rewritten per update",
    "zcode": "zcode's pattern: busy timeout 10 s, deferred transactions",
    "agents-sdk": "OpenAI Agents SDK SQLiteSession (stdlib sqlite3)",
    "langgraph": "LangGraph SqliteSaver under a 3-node graph (stdlib sqlite3)",
}
# What each column replays: the commit of the sources a pattern was modelled from,
# or the library's installed version (filled in by peer_versions()).
PATTERN_VERSIONS = {
    "t3code": "pingdotgg/t3code@0b60c02a (EffectWorker.ts), 037c0385 (EffectOutbox.ts)",
    "opencode": "pattern, no commit pinned (event rows as in opencode 1.17-1.18 reports)",
    "zcode": "pattern, no commit pinned",
}
_DISTRIBUTIONS = {"agents-sdk": "openai-agents", "langgraph": "langgraph-checkpoint-sqlite"}
# A library peer runs when these modules can be imported (looked up, never imported
# here: they would load the stdlib sqlite3 into this process).
_PEER_MODULES = {
    "agents-sdk": ("agents",),
    "langgraph": ("langgraph.graph", "langgraph.checkpoint.sqlite"),
}


class StressError(Exception):
    """The stress run could not be carried out (an agent failed to start, ...)."""


@dataclass(frozen=True, slots=True)
class ExternalLock:
    """``HOLD@AT``: at second AT of the run, hold the write lock for HOLD seconds."""

    hold: float
    at: float

    @classmethod
    def parse(cls, text: str) -> ExternalLock:
        hold_s, sep, at_s = text.strip().partition("@")
        try:
            hold, at = float(hold_s), float(at_s)
        except ValueError:
            hold = at = math.nan
        if not sep or not (math.isfinite(hold) and math.isfinite(at)) or hold <= 0 or at < 0:
            raise ValueError(
                f"{text!r} is not HOLD@AT (seconds, e.g. 3@0.5: hold the lock 3 s "
                "from second 0.5 of the run; HOLD > 0, AT >= 0)"
            )
        return cls(hold, at)

    def __str__(self) -> str:
        return f"{self.hold:g}@{self.at:g}"


@dataclass(frozen=True, slots=True)
class StressConfig:
    agents: int = 16
    duration: float = 10.0
    think_ms: float = 10.0
    url: str | None = None
    directory: str | None = None
    output_bytes: int = 2000
    large_rate: float = 0.02
    large_bytes: int = 8 * 1024 * 1024
    synchronous: str | None = None
    write_budget: float | None = None
    seed: int | None = None
    external_locks: tuple[ExternalLock, ...] = ()
    kill_rate: float = 0.0
    maintain: bool = False
    workers: int = 2
    compare: bool = False
    drop_every: int = 0
    targets: tuple[str, ...] | None = None
    long_replies: bool = False
    hang_worker: bool = False
    #: Seconds the run waits, once the agents stopped, for the outbox workers to settle
    #: what is still pending (the fleetstore target's workers are processes of their own).
    drain_wait: float = 30.0

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first option that cannot be used."""
        if self.agents < 1:
            raise ValueError("--agents must be at least 1")
        if not (math.isfinite(self.duration) and self.duration > 0):
            raise ValueError("--duration must be a number of seconds > 0")
        if not (math.isfinite(self.think_ms) and self.think_ms >= 0):
            raise ValueError("--think-ms must be a number >= 0")
        if self.output_bytes < 1 or self.large_bytes < 0:
            raise ValueError("--output-bytes must be >= 1 and --large-bytes >= 0")
        if not 0 <= self.large_rate <= 1:
            raise ValueError("--large-rate must be between 0 and 1")
        if not (math.isfinite(self.kill_rate) and self.kill_rate >= 0):
            raise ValueError("--kill-rate must be a number >= 0")
        if self.workers < 0 or self.drop_every < 0:
            raise ValueError("--workers and --drop-every must be >= 0")
        if not (math.isfinite(self.drain_wait) and self.drain_wait >= 0):
            raise ValueError("--drain-wait must be a number of seconds >= 0")
        if self.targets is not None:
            unknown = [t for t in self.targets if t not in TARGET_NAMES]
            if unknown or not self.targets:
                raise ValueError(
                    f"--targets: unknown target {', '.join(map(repr, unknown)) or '(none)'}; "
                    f"the targets are {', '.join(TARGET_NAMES)}"
                )
            missing = [t for t in self.targets if t in PEERS and t not in peers_available()]
            if missing:
                raise ValueError(
                    f"--targets: {', '.join(missing)} not installed here (installed: "
                    f"{', '.join(['fleetstore', *peers_available()])})"
                )
        if self.url is not None:
            try:
                parse_target(self.url)
            except errors.ConfigError as exc:
                raise ValueError(f"--url: {exc}") from None
        for lock in self.external_locks:
            if lock.at >= self.duration:
                raise ValueError(
                    f"--external-lock {lock}: starts at {lock.at:g}s, "
                    f"after the run ends ({self.duration:g}s)"
                )


def default_dir() -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return fleetstore.default_data_dir() / "stress" / f"run-{stamp}-{os.getpid()}"


def _installed(module: str) -> bool:
    """Whether *module* can be imported, without importing it or its packages."""
    top, _, rest = module.partition(".")
    spec = importlib.util.find_spec(top)
    if spec is None or not rest:
        return spec is not None
    rel = rest.replace(".", os.sep)
    return any(
        (Path(d) / rel).is_dir() or (Path(d) / f"{rel}.py").is_file()
        for d in spec.submodule_search_locations or ()
    )


def peers_available() -> list[str]:
    """The peers --compare runs: the SQLite patterns always, libraries when installed."""
    return [p for p in PEERS if all(_installed(m) for m in _PEER_MODULES.get(p, ()))]


def peers_to_run(config: StressConfig) -> list[str]:
    """``--targets`` (fleetstore always runs first), else every installed peer with
    ``--compare``, else none."""
    if config.targets is not None:
        return [p for p in PEERS if p in config.targets]
    return peers_available() if config.compare else []


def version_of(target: str) -> str:
    """fleetstore's version, a library peer's installed version, or the commit a
    pattern was modelled from."""
    from importlib import metadata

    if target == "fleetstore":
        return fleetstore.__version__
    if target in _DISTRIBUTIONS:
        try:
            return f"{_DISTRIBUTIONS[target]} {metadata.version(_DISTRIBUTIONS[target])}"
        except metadata.PackageNotFoundError:
            return "not installed"
    return PATTERN_VERSIONS.get(target, "")
