"""``fleetstore worker`` shows its failures, with real worker processes and handlers that
raise (issue 25, tried as a new user would): a handler's ``KeyError`` was never shown and
only ``KeyError: 'missing_key'`` was kept; ``--until-idle`` exited 0 saying "2 retried"
when the effect had gone dead; the worker had no ``--backoff``.

Now: a banner, one line per failed attempt (where it failed, what next), the traceback
kept and printed by ``effects show``, exit 5 with the count when effects went dead,
``--backoff``/``--max-backoff``/``--max-attempts`` (and their ``FLEETSTORE_WORKER_*``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fleetstore

HANDLERS = """\
def tick(effect):
    return {}["missing_key"]


def ok(effect):
    return {"done": effect.payload}


HANDLERS = {"tick": tick, "ok": ok}
"""

#: Safety net for waits on evidence; nothing waits for a duration.
WAIT = 60.0


def environ(**extra: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSTORE_")}
    return {**clean, **extra}


def fleetstore_cli(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleetstore", *args],
        cwd=tmp_path,
        env=environ(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def db(tmp_path: Path) -> Path:
    (tmp_path / "hk.py").write_text(HANDLERS)
    path = tmp_path / "s.db"
    fleetstore.open(path).close()
    return path


def enqueue(db: Path, thread: str, kind: str, **kw: object) -> str:
    with fleetstore.open(db) as opened:
        return opened.effects.enqueue(thread, kind, None, **kw)  # type: ignore[arg-type]


def failure_lines(stderr: str, effect_id: str) -> list[str]:
    return [line for line in stderr.splitlines() if f" {effect_id} " in line]


@pytest.mark.slow
def test_until_idle_exits_5_with_the_count_when_an_effect_went_dead(
    tmp_path: Path, db: Path
) -> None:
    """The run of issue 25: a handler raising KeyError, 2 attempts.  It exited 0 with
    "2 retried" and printed nothing of the error (this test failed so before the fix)."""
    bad = enqueue(db, "th", "tick", max_attempts=2)
    good = enqueue(db, "other", "ok")
    ran = fleetstore_cli(
        tmp_path, "worker", "hk:HANDLERS", "--store", str(db), "--until-idle", "--backoff", "0"
    )
    assert ran.returncode == 5, ran.stderr
    err = ran.stderr
    banner, kinds = err.splitlines()[:2]
    assert banner.startswith("fleetstore worker: ") and f" on {db}: 2 kind(s)" in banner
    assert "concurrency 4" in banner and "lease 30s" in banner and "until idle" in banner
    assert (
        kinds == "  ok, tick: backoff 0s doubling to 300s, max attempts as enqueued, timeout 600s"
    )
    first, last = failure_lines(err, bad)  # one line per failed attempt, no more
    where = "KeyError: 'missing_key' (at hk.py:2 in tick)"
    assert f"tick {bad} (thread th) attempt 1 of 2 failed: {where}; retry in 0s" in first
    assert f"attempt 2 of 2 failed: {where}; dead (attempts_exhausted)" in last
    assert "Traceback" not in err  # one line each: the traceback is in the store
    assert ": 3 claimed, 1 dead, 1 retried, 1 succeeded" in err
    assert "1 effect(s) went dead in this run" in err

    shown = fleetstore_cli(tmp_path, "effects", "show", bad, "--store", str(db))
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert out.count("Traceback (most recent call last):") == 2  # each attempt's
    assert f'File "{tmp_path / "hk.py"}", line 2, in tick' in out
    assert "attempt 1," in out and "attempt 2," in out and "KeyError: 'missing_key'" in out
    assert "domain/worker.py" not in out  # the handler's frames, not the worker's
    as_json = json.loads(
        fleetstore_cli(tmp_path, "effects", "show", bad, "--store", str(db), "--json").stdout
    )
    assert [e["attempt"] for e in as_json["errors"]] == [1, 2]
    assert all(e["traceback"].endswith("KeyError: 'missing_key'\n") for e in as_json["errors"])
    with fleetstore.open(db) as opened:
        assert opened.effects.get(good).state == "succeeded"

    # Nothing dead in a run: 0 (the dead effect of the run before does not count).
    enqueue(db, "th2", "ok")
    again = fleetstore_cli(tmp_path, "worker", "hk:HANDLERS", "--store", str(db), "--until-idle")
    assert again.returncode == 0, again.stderr
    assert "went dead" not in again.stderr


@pytest.mark.slow
def test_json_is_an_event_a_line_started_failed_stopped(tmp_path: Path, db: Path) -> None:
    bad = enqueue(db, "th", "tick", max_attempts=2)
    ran = fleetstore_cli(
        tmp_path,
        "worker",
        "hk:HANDLERS",
        "--store",
        str(db),
        "--until-idle",
        "--json",
        FLEETSTORE_WORKER_BACKOFF="0",
    )
    assert ran.returncode == 5, ran.stderr
    events = [json.loads(line) for line in ran.stdout.splitlines()]
    assert [e["event"] for e in events] == ["started", "failed", "failed", "stopped"]
    started, first, last, stopped = events
    assert started["store"] == str(db) and set(started["kinds"]) == {"ok", "tick"}
    assert started["kinds"]["tick"]["backoff"] == 0.0  # from FLEETSTORE_WORKER_BACKOFF
    assert {k: first[k] for k in ("effect_id", "kind", "thread_key", "attempt", "next")} == {
        "effect_id": bad,
        "kind": "tick",
        "thread_key": "th",
        "attempt": 1,
        "next": "retry",
    }
    assert first["error"] == "KeyError: 'missing_key'" and first["where"] == "hk.py:2 in tick"
    assert first["retry_at"] is not None and first["max_attempts"] == 2
    assert (last["attempt"], last["next"], last["dead_reason"]) == (2, "dead", "attempts_exhausted")
    assert (stopped["exit_code"], stopped["dead"], stopped["stats"]["dead"]) == (5, 1, 1)
    assert not failure_lines(ran.stderr, bad)  # JSON instead of the lines, not as well


@pytest.mark.slow
def test_max_attempts_gives_up_sooner_than_the_effect_and_its_thread_goes_on(
    tmp_path: Path, db: Path
) -> None:
    """The effect allows 5 attempts; the worker's --max-attempts 2 (here from its
    variable) gives up after 2; the thread's next effect runs."""
    bad = enqueue(db, "th", "tick")
    nxt = enqueue(db, "th", "ok")
    ran = fleetstore_cli(
        tmp_path,
        "worker",
        "hk:HANDLERS",
        "--store",
        str(db),
        "--until-idle",
        "--backoff",
        "0",
        FLEETSTORE_WORKER_MAX_ATTEMPTS="2",
    )
    assert ran.returncode == 5, ran.stderr
    assert "max attempts 2" in ran.stderr.splitlines()[1]
    assert len(failure_lines(ran.stderr, bad)) == 2
    with fleetstore.open(db) as opened:
        dead = opened.effects.get(bad)
        assert (dead.state, dead.dead_reason, dead.attempt, dead.max_attempts) == (
            "dead",
            "attempts_exhausted",
            2,
            5,
        )
        assert opened.effects.get(nxt).state == "succeeded"
    for bad_value in ("0", "10001", "x"):
        refused = fleetstore_cli(
            tmp_path, "worker", "hk:HANDLERS", "--store", str(db), "--max-attempts", bad_value
        )
        assert refused.returncode == 2, refused.stderr
    assert (
        fleetstore_cli(
            tmp_path, "worker", "hk:HANDLERS", "--store", str(db), "--backoff", "-1"
        ).returncode
        == 2
    )


@pytest.mark.slow
def test_backoff_sets_when_a_failed_effect_runs_again(tmp_path: Path, db: Path) -> None:
    """--backoff 1000: after its first failure the effect waits 1000 s (±10 %): read
    from the store once the worker has said the attempt failed; then SIGTERM, exit 0."""
    bad = enqueue(db, "th", "tick")
    backoff = ("--backoff", "1000", "--max-backoff", "5000")
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleetstore", "worker", "hk:HANDLERS", "--store", str(db), *backoff],
        cwd=tmp_path,
        env=environ(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        lines: list[str] = []
        deadline = time.monotonic() + WAIT
        while not any(f" {bad} " in line for line in lines):
            line = proc.stderr.readline()
            assert line and time.monotonic() < deadline, lines
            lines.append(line)
        assert "backoff 1000s doubling to 5000s" in "".join(lines)
        with fleetstore.open(db) as opened:
            got = opened.effects.get(bad)
        assert (got.state, got.attempt) == ("pending", 1)
        waits = got.available_at - got.errors[0].at
        assert 900 <= waits <= 1100, waits
        os.kill(proc.pid, signal.SIGTERM)
        _, rest = proc.communicate(timeout=WAIT)
        assert proc.returncode == 0, rest  # not --until-idle, and nothing went dead
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_a_module_or_factory_that_names_no_handlers_is_bad_usage(tmp_path: Path, db: Path) -> None:
    """A path-like or relative module name raised a raw TypeError (exit 1); a
    HANDLERS() factory whose own body raised TypeError was reported as one that
    "takes arguments"."""
    (tmp_path / "fk.py").write_text(
        "def WITH_ARG(x):\n    return {}\n"
        "def BROKEN():\n    raise TypeError('inside the factory')\n"
    )
    for spec, says in (
        ("../etc:x", "is not a module name"),
        (".hk:HANDLERS", "is not a module name"),
        ("fk:WITH_ARG", "takes arguments"),
    ):
        done = fleetstore_cli(tmp_path, "worker", spec, "--store", str(db), "--until-idle")
        assert done.returncode == 2 and says in done.stderr, (spec, done.stderr)
        assert "Traceback" not in done.stderr
    done = fleetstore_cli(tmp_path, "worker", "fk:BROKEN", "--store", str(db), "--until-idle")
    assert done.returncode == 1 and "inside the factory" in done.stderr, done.stderr
    assert "takes arguments" not in done.stderr
