"""``--long-replies``: the growth scenario.  The same turns, but each reply is
streamed in hundreds of deltas (a few milliseconds apart) and each tool output
arrives in tens of chunks as it grows, so the patterns that rewrite a whole part or
log a full snapshot on every update show what users report of them (opencode
databases of 13 GB and more, 64 GB of a 73 GB file in its event table).  Derived
from the turn's seed: every target streams the same deltas and chunks."""

from __future__ import annotations

import json
import os
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

_DELTAS = (200, 400)
_CHUNKS = (20, 60)
_GAP_MS = 3.0  # mean pause between two deltas or chunks (exponential)


class Streamed:
    """How turn *t* of agent *agent* streams: its deltas, the pauses between them
    and its tool output's chunks."""

    __slots__ = ("chunk_count", "deltas", "long", "rng")

    def __init__(self, cfg: dict[str, Any], agent: int, t: Any) -> None:
        # t: an agent.Turn (not imported: agent imports this module)
        self.long = bool(cfg.get("long_replies"))
        self.rng = random.Random(f"{cfg['seed']}/{agent}/{t.n}/long")
        if not self.long:
            self.deltas = t.deltas
            self.chunk_count = 1
            return
        self.deltas = [
            "".join(self.rng.choices("abcdefghij klmnop ", k=self.rng.randint(8, 60)))
            for _ in range(self.rng.randint(*_DELTAS))
        ]
        self.chunk_count = self.rng.randint(*_CHUNKS)

    def pause(self) -> None:
        """Before a delta or a chunk: the model's (or the tool's) time to produce it."""
        if self.long:
            time.sleep(self.rng.expovariate(1000.0 / _GAP_MS))

    def chunks(self, output: str) -> list[str]:
        """*output* as it arrives: whole, or in ``chunk_count`` pieces."""
        if self.chunk_count <= 1 or len(output) < self.chunk_count:
            return [output]
        step = -(-len(output) // self.chunk_count)
        return [output[i : i + step] for i in range(0, len(output), step)]

    def wait_deltas(self) -> None:
        """The time the reply takes to stream, for a target that writes it whole."""
        for _ in self.deltas[:-1]:
            self.pause()

    def wait_chunks(self, output: str) -> None:
        """The time the output takes to grow, for a target that writes it whole."""
        for _ in self.chunks(output)[1:]:
            self.pause()

    def text(self) -> str:
        return "".join(self.deltas)


def effect_time(cfg: dict[str, Any], thread: str, turn: int) -> float:
    """How long a turn's side effect takes, the same on every target that has an
    outbox: exponential, mean --think-ms."""
    mean = cfg["think_ms"] / 1000.0
    rng = random.Random(f"{cfg['seed']}/{thread}/{turn}/effect")
    return rng.expovariate(1.0 / mean) if mean > 0 else 0.0


def executions_path(cfg: dict[str, Any]) -> Path:
    """Where the handlers of a target's effects note each execution (one id a line)."""
    where = cfg.get("journal") or cfg.get("figures") or cfg["journals"][0]
    return Path(where).with_name("executions.log")


def ran(cfg: dict[str, Any], effect_id: str) -> None:
    """Note that an execution of *effect_id* starts (``O_APPEND``: one line at once)."""
    fd = os.open(executions_path(cfg), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{effect_id}\n".encode())
    finally:
        os.close(fd)


def run_twice(cfg: dict[str, Any]) -> tuple[int, int]:
    """(executions, effects executed more than once)."""
    try:
        lines = executions_path(cfg).read_text().split()
    except FileNotFoundError:
        return 0, 0
    counts = Counter(lines)
    return len(lines), sum(1 for n in counts.values() if n > 1)


def note_stats(cfg: dict[str, Any], role: str, stats: dict[str, int]) -> None:
    """A process's outbox counters at its end (t3code's settlements that met the lock
    timeout, fleetstore's that went to the spool, ...), one JSON line each."""
    line = json.dumps({"role": role, "pid": os.getpid(), **stats}) + "\n"
    with open(executions_path(cfg).with_name("outbox-stats.jsonl"), "a") as f:
        f.write(line)


def read_stats(tdir: Path) -> dict[str, int]:
    """The counters of every process of a target that lived to its end, summed."""
    total: Counter[str] = Counter()
    try:
        text = (tdir / "outbox-stats.jsonl").read_text()
    except FileNotFoundError:
        return {}
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        total.update({k: int(v) for k, v in row.items() if k not in ("role", "pid")})
    return dict(total)
