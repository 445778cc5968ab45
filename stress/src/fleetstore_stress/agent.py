"""The processes of ``fleetstore stress``: one agent, one outbox worker, or the
verification of one target, each run as ``python -m fleetstore_stress.child
--agent|--worker|--verify CONFIG_JSON``.

The workload is a function of (seed, agent, turn): every target replays the same
turns.  A turn is a user message, a streamed assistant reply with a tool call whose
output size is heavy-tailed (bytes to megabytes), usage, a state checkpoint and an
outbox effect.  An agent appends one JSON line per turn to its journal once the turn
is acknowledged (every write of it returned) or failed; a restarted agent (after
``--kill-rate``'s SIGKILL) reads it and goes on after the interrupted turn.  Ids are
derived from (run, agent, turn), so the verifier knows what must be there.

Each target runs in its own process tree: the Agents SDK's ``SQLiteSession`` and
LangGraph's ``SqliteSaver`` use the stdlib ``sqlite3``, which must never share a
process with fleetstore's apsw connections (DESIGN.md, "Two SQLite libraries in one
process"); this module never imports it itself (tests/test_layers.py).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fleetstore.core.ids import derived_id
from fleetstore_stress.growth import Streamed, effect_time, note_stats, ran

TARGETS = ("fleetstore", "opencode", "zcode", "agents-sdk", "langgraph")
# Share of large outputs (--large-rate) are log-uniform between these; the others are
# log-normal around --output-bytes, capped so they stay "small".
_LARGE_MIN = 1 << 20
_SMALL_CAP = 256 * 1024
EFFECT_KIND = "stress.notify"
WORKER_LEASE = 5.0  # seconds: the stress workers' lease
# Effects each worker process runs at once: two workers serve 16 lanes, as t3code's 4
# fibers in each of 16 servers do (with 2 each, 4 in all, 16 agents' effects fell
# 15 s behind in make demo, settling 56 a second).
WORKER_CONCURRENCY = 8


# --------------------------------------------------------------------------- workload


class Turn:
    """What agent *agent* does in turn *n*; the same for every target."""

    __slots__ = ("deltas", "n", "output_size", "think", "tool_think", "usage", "user")

    def __init__(self, cfg: dict[str, Any], agent: int, n: int) -> None:
        rng = random.Random(f"{cfg['seed']}/{agent}/{n}")
        self.n = n
        think = cfg["think_ms"] / 1000.0
        self.think = rng.expovariate(1.0 / think) if think > 0 else 0.0
        self.tool_think = rng.expovariate(1.0 / think) if think > 0 else 0.0
        self.user = f"turn {n} of agent {agent}: " + "please look at this " * rng.randint(1, 20)
        self.deltas = [
            "".join(rng.choices("abcdefghij klmnop ", k=rng.randint(8, 60)))
            for _ in range(rng.randint(3, 12))
        ]
        large = cfg["large_bytes"]
        if cfg["large_rate"] > 0 and rng.random() < cfg["large_rate"] and large > 0:
            low = min(_LARGE_MIN, large)
            self.output_size = int(math.exp(rng.uniform(math.log(low), math.log(large))))
        else:
            median = max(1, cfg["output_bytes"])
            size = rng.lognormvariate(math.log(median), 1.2)
            self.output_size = max(1, min(_SMALL_CAP, int(size)))
        self.usage = {
            "input_tokens": rng.randint(100, 20_000),
            "output_tokens": rng.randint(5, 800),
        }

    def output(self, cfg: dict[str, Any], agent: int) -> str:
        # Hex text: compresses like tool output does (about 2:1), cheap to make.
        rng = random.Random(f"{cfg['seed']}/{agent}/{self.n}/out")
        return rng.randbytes((self.output_size + 1) // 2).hex()[: self.output_size]


@functools.lru_cache(maxsize=256)
def _session_id(run_id: str, target: str, agent: int) -> str:
    return derived_id(f"stress/{run_id}/{target}", str(agent), "session")


def ids(cfg: dict[str, Any], agent: int, n: int | None = None) -> tuple[str, str, str]:
    """(session, user message, assistant message) ids of agent *agent*'s turn *n*.

    Message ids ascend with the turn, as the tools' own do (fleetstore's UUIDv7,
    opencode's ``Identifier.ascending``): random ids (uuid5, as here before) put
    every insert on a random page of every index, which doubled the pages a
    turn's commit writes for every target and is not what either tool does."""
    sid = _session_id(cfg["run_id"], cfg["target"], agent)
    if n is None:
        return sid, "", ""
    hx = sid.replace("-", "")  # UUID-shaped, as benchmarks/bench_write_path.py expects
    head, tail = f"{n:08x}-{agent % 0x10000:04x}", f"{hx[:3]}-{hx[3:7]}-{hx[7:19]}"
    return sid, f"{head}-a{tail}", f"{head}-b{tail}"


def sha(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


class Clock:
    """Time spent inside the target's calls during one turn (think time excluded)."""

    __slots__ = ("longest", "total", "writes")

    def __init__(self) -> None:
        self.total = self.longest = 0.0
        self.writes = 0

    @contextmanager
    def __call__(self) -> Iterator[None]:
        began = time.monotonic()
        try:
            yield
        finally:
            spent = time.monotonic() - began
            self.total += spent
            self.longest = max(self.longest, spent)
            self.writes += 1


# --------------------------------------------------------------------------- targets
# (the peers' targets are in fleetstore_stress.peers)


class _Target:
    def __init__(self, cfg: dict[str, Any], agent: int) -> None:
        self.cfg = cfg
        self.agent = agent
        self.sid = ids(cfg, agent)[0]

    def turn(self, t: Turn, clock: Clock) -> str:
        """Write turn *t*; returns the sha256 of the tool output as written."""
        raise NotImplementedError

    def figures(self) -> dict[str, Any] | None:
        """The engine's write figures so far (fleetstore only)."""
        return None

    def close(self) -> None:
        pass


class _Fleetstore(_Target):
    def __init__(self, cfg: dict[str, Any], agent: int) -> None:
        super().__init__(cfg, agent)
        import fleetstore

        self.store = fleetstore.open(cfg["url"], **cfg["settings"])
        self.drop_every: int = cfg.get("drop_every") or 0
        self.counted = 0
        try:
            # A restarted agent's session is there: reading it writes nothing, so a
            # restart is ready even while the disk is full (its turns wait or fail).
            self.store.sessions.get(self.sid)
        except fleetstore.NotFound:
            with contextlib_suppress_exists():
                self.store.sessions.create(title=f"stress agent {agent}", id=self.sid)

    def _dropped(self) -> bool:
        # --drop-every: a deliberately broken target that acknowledges a write it
        # never made, so the run can prove its verifier sees the loss.
        self.counted += 1
        return bool(self.drop_every) and self.counted % self.drop_every == 0

    def turn(self, t: Turn, clock: Clock) -> str:
        """A user message (one transaction) and the reply, whose end commits with the
        turn's state checkpoint and its outbox effect (one transaction when the reply
        is produced within a flush window)."""
        from fleetstore.models import NewEffect

        _, uid, aid = ids(self.cfg, self.agent, t.n)
        store = self.store
        # "fused": the state and the effect ride on the reply's last write; "natural":
        # the same turn as separate calls, as most programs write it (issue 24).
        natural = self.cfg.get("shape") == "natural"
        if not self._dropped():
            with clock():
                store.messages.append(self.sid, "user", t.user, id=uid)
        output = t.output(self.cfg, self.agent)
        with clock():
            stream = store.messages.stream(self.sid, "assistant", model="stress", id=aid)
            reply = stream.__enter__()
        streamed = Streamed(self.cfg, self.agent, t)
        try:
            for d in streamed.deltas[:-1]:
                streamed.pause()
                with clock():
                    reply.text(d)
            with clock():
                call = reply.tool_call("bash", {"cmd": f"run {t.n}"})
            if t.tool_think:
                time.sleep(t.tool_think)
            streamed.wait_chunks(output)  # --long-replies: kept until it is whole
            with clock():
                call.result(output)
            with clock():
                reply.text(streamed.deltas[-1])
                reply.usage(
                    input_tokens=t.usage["input_tokens"], output_tokens=t.usage["output_tokens"]
                )
                # --drop-every: a broken target that says it saved what it did not.
                if not natural and not self._dropped():
                    reply.put_state("checkpoint", {"turn": t.n, "output": sha(output)})
                if not natural and not self._dropped():
                    reply.enqueue(
                        NewEffect(
                            self.sid,
                            EFFECT_KIND,
                            {"turn": t.n},
                            idempotency_key=f"{self.sid}/{t.n}",
                        )
                    )
        except BaseException as exc:
            stream.__exit__(type(exc), exc, exc.__traceback__)
            raise
        with clock():
            stream.__exit__(None, None, None)
        if natural:
            with clock():
                if not self._dropped():
                    store.state.put(self.sid, "checkpoint", {"turn": t.n, "output": sha(output)})
                if not self._dropped():
                    store.effects.enqueue(
                        self.sid, EFFECT_KIND, {"turn": t.n}, idempotency_key=f"{self.sid}/{t.n}"
                    )
        return sha(output)

    def figures(self) -> dict[str, Any] | None:
        return store_figures(self.store)

    def close(self) -> None:
        self.store.close()


#: The counters of ``store.metrics()`` a run sums over every process.
COUNTERS = ("writes", "busy_timeouts", "spooled", "replayed", "recovered", "rejected")


def store_figures(store: Any) -> dict[str, Any]:
    """A fleetstore's write counters and raw lock histograms in this process (every
    file of a sharded store: they share one set of figures)."""
    m = store.metrics()
    return {**{k: int(m.get(k, 0)) for k in COUNTERS}, "histograms": store.db.histograms()}


@contextmanager
def contextlib_suppress_exists() -> Iterator[None]:
    from fleetstore import errors

    try:
        yield
    except errors.AlreadyExists:
        pass  # a restarted agent: its session is there


# ----------------------------------------------------------------------------- agent


def read_journal(path: Path) -> list[dict[str, Any]]:
    """The lines of an agent's journal; a line cut by SIGKILL is skipped."""
    lines = []
    try:
        text = path.read_text()
    except OSError:
        return []
    for line in text.splitlines():
        try:
            lines.append(json.loads(line))
        except ValueError:
            continue
    return lines


def _error_name(exc: BaseException) -> str:
    cls = type(exc)
    if cls.__module__.startswith("fleetstore"):
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


def agent_main(cfg: dict[str, Any], make_target: Callable[[dict[str, Any], int], _Target]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when agents stop
    agent: int = cfg["agent"]
    journal_path = Path(cfg["journal"])
    past = read_journal(journal_path)
    # A restarted agent skips the turn it was killed in: it may be half written.
    first = max((int(e["n"]) for e in past), default=0) + (2 if past or cfg["restart"] else 1)
    target = make_target(cfg, agent)
    figures = Figures(cfg, "agent", agent, target.figures)
    if cfg["restart"]:
        figures.start()  # its whole life is in the run: what its open() replayed too
    print("ready", flush=True)
    line = sys.stdin.readline().split()
    if len(line) != 3 or line[0] != "start":
        return 1
    start, end = float(line[1]), float(line[2])
    with open(journal_path, "a") as journal:
        if journal.tell() and not journal_path.read_bytes().endswith(b"\n"):
            journal.write("\n")
        if cfg["restart"]:
            journal.write(json.dumps({"n": first - 1, "killed": True}) + "\n")
            journal.flush()
        _sleep_until(start)
        if not cfg["restart"]:
            figures.start()  # after its set-up
        n = first
        parent = os.getppid()
        while os.getppid() == parent:
            t = Turn(cfg, agent, n)
            wake = time.monotonic() + t.think
            if wake + t.tool_think >= end:
                break
            _sleep_until(wake)
            clock = Clock()
            began = time.monotonic()
            entry: dict[str, Any] = {"n": n}
            try:
                entry["sha"] = target.turn(t, clock)
            except Exception as exc:
                entry["fail"] = _error_name(exc)
                entry["msg"] = str(exc)[:300]
            entry.update(
                t=round(time.monotonic() - start, 4),
                began=round(began - start, 4),
                lat=round(clock.total, 6),
                w=round(clock.longest, 6),
                size=t.output_size,
            )
            journal.write(json.dumps(entry) + "\n")
            journal.flush()
            n += 1
    figures.stop()
    target.close()
    return 0


def figures_dir(workdir: str | Path) -> Path:
    """Where each process of a target keeps its figures, one file per process."""
    return Path(workdir) / "figures"


#: Seconds between rewrites of a process's figures file: what a process killed by
#: --kill-rate had done until then is in it (all but its last half second).
FIGURES_EVERY = 0.5


class Figures:
    """This process's CPU time over its part of the run and, on fleetstore, its
    engine's write figures (counters, lock wait and hold histograms) accrued over it,
    in a file of its own (``figures/ROLE-INDEX-PID.json``) rewritten every half second
    and at its end.  Every process of the run is counted, killed ones too: when only
    the processes alive at the end reported, a soak whose agents had all been
    restarted since their writes spooled said 0 spooled (issue 23).  A restarted
    process's part of the run is its whole life; an original one's begins at the
    common start, after its set-up."""

    def __init__(
        self,
        cfg: dict[str, Any],
        role: str,
        index: int,
        figures: Callable[[], dict[str, Any] | None],
    ) -> None:
        self._figures = figures
        # The run's figures folder; an agent started on its own (a test) keeps them
        # beside its journal.
        where = cfg.get("figures") or Path(cfg.get("journal") or ".").parent / "figures"
        folder = Path(where)
        folder.mkdir(exist_ok=True)
        self.path = folder / f"{role}-{index}-{os.getpid()}.json"
        self._base: dict[str, Any] = {"role": role, "index": index, "pid": os.getpid()}
        self._restart = bool(cfg.get("restart"))
        self._before: dict[str, Any] | None = None
        self._cpu_began = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """The run begins for this process: take the baseline, write the file."""
        self._cpu_began = 0.0 if self._restart else time.process_time()
        self._before = None if self._restart else self._figures()
        self.write(finished=False)
        self._thread = threading.Thread(target=self._run, name="stress-figures", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(FIGURES_EVERY):
            self.write(finished=False)

    def stop(self) -> None:
        """This process's run ended: its last figures, marked finished."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.write(finished=True)

    def write(self, *, finished: bool) -> None:
        line = {
            **self._base,
            "cpu_s": time.process_time() - self._cpu_began,
            "finished": finished,
        }
        after = self._figures()
        if after is not None:
            before = self._before or {}
            for key in COUNTERS:
                line[key] = after[key] - before.get(key, 0)
            line["histograms"] = after["histograms"]
            line["histograms_before"] = before.get("histograms", {})
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        try:
            tmp.write_text(json.dumps(line))
            os.replace(tmp, self.path)  # a reader sees the whole of one version
        except OSError:
            pass  # a full disk (a fault the run may inject): the last version stays


def read_figures(workdir: str | Path) -> list[dict[str, Any]]:
    """The figures of every process of a target's run, killed ones included."""
    rows = []
    for path in sorted(figures_dir(workdir).glob("*.json")):
        try:
            rows.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return rows


def worker_main(cfg: dict[str, Any]) -> int:
    import fleetstore

    hang = [bool(cfg.get("hang_worker")) and cfg.get("worker") == 0]

    def notify(effect: fleetstore.Effect) -> dict[str, Any]:
        if hang[0]:
            hang[0] = False
            os.kill(os.getpid(), signal.SIGSTOP)  # --hang-worker: the whole worker hangs
        ran(cfg, effect.id)
        time.sleep(effect_time(cfg, effect.thread_key, int(effect.payload["turn"])))
        return {"turn": effect.payload["turn"]}

    with fleetstore.open(cfg["url"], **cfg["settings"]) as store:
        worker = fleetstore.Worker(
            store, {EFFECT_KIND: notify}, concurrency=WORKER_CONCURRENCY, lease=WORKER_LEASE
        )
        figures = Figures(cfg, "worker", cfg.get("worker", 0), lambda: store_figures(store))
        figures.start()
        print("ready", flush=True)
        code = worker.run()
        note_stats(cfg, "worker", dict(worker.stats))
        figures.stop()
        return code


def _sleep_until(when: float) -> None:
    delay = when - time.monotonic()
    if delay > 0:
        time.sleep(delay)
