"""A process of the delete/fork tests (tests/domain/test_session_jobs.py).

``python tests/agents/jobs_agent.py delete URL SID --batch N [--kill-after K]`` deletes
the session SID with purge batches of N rows; ``fork URL SID --id FID --batch N
[--kill-after K]`` forks it into FID with batches of N messages.  With ``--kill-after K``
the process SIGKILLs itself right after its K-th batch committed (a crash mid-way).
Prints ``ready``, then ``batch I`` after each batch, then ``done``.

``python tests/agents/jobs_agent.py watch URL --doomed SID --fork FID --stop FILE``
is another writer of the store, until FILE exists: it appends a message to a session
of its own, and right after that commit looks at the big session being deleted and
at the fork being made, twice: the rows the files hold (a raw count, past what reads
show) and what the API shows (``messages.list``: NotFound, or every message).  One
line a round: ``seen {"doomed_rows": n, "doomed_api": n|null, "fork_rows": n,
"fork_api": n|null}``.  A raw count strictly between none and all, read right after
its own commit, shows that its write went in between two batches.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from typing import Any

import fleetstore
from fleetstore import errors

try:
    from fleetstore.domain import session_jobs
except ImportError:  # a fleetstore from before batched deletes and forks: one transaction
    session_jobs = None  # type: ignore[assignment]


def say(*words: object) -> None:
    print(*words, flush=True)


def count(store: fleetstore.Store, sql: str, sid: str) -> int:
    """A raw count over the whole store (every file of a sharded one)."""
    total = 0

    def one(_key: Any, db: Any) -> None:
        nonlocal total
        total += int(db.read(lambda tx: tx.execute(sql, (sid,)))[0][0])

    if store.router is not None:
        store.router.each(one)
    else:
        one(None, store.db)
    return total


def api_messages(store: fleetstore.Store, sid: str) -> int | None:
    try:
        return len(store.messages.list(sid))
    except errors.NotFound:
        return None


def counted_batches(kill_after: int | None) -> None:
    """Say ``batch I`` after each batch (and die after the K-th, with --kill-after)."""
    submit = session_jobs._submit
    done = 0

    def counted(store: Any, name: str, args: dict[str, Any]) -> dict[str, Any]:
        nonlocal done
        result = submit(store, name, args)
        done += 1
        say("batch", done)
        if kill_after is not None and done >= kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    session_jobs._submit = counted  # type: ignore[assignment]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="jobs_agent")
    sub = parser.add_subparsers(dest="mode", required=True)
    for mode in ("delete", "fork"):
        p = sub.add_parser(mode)
        p.add_argument("url")
        p.add_argument("sid")
        p.add_argument("--id")
        p.add_argument("--batch", type=int, required=True)
        p.add_argument("--kill-after", type=int)
    w = sub.add_parser("watch")
    w.add_argument("url")
    w.add_argument("--doomed", required=True)
    w.add_argument("--fork", required=True)
    w.add_argument("--stop", required=True)
    args = parser.parse_args(argv)
    store = fleetstore.open(args.url)
    if args.mode == "watch":
        mine = store.sessions.create(title="another writer").id
        say("ready")
        rounds = 0
        while not os.path.exists(args.stop):
            store.messages.append(mine, "user", f"written between batches {rounds}")
            seen = {
                "doomed_rows": count(
                    store, "SELECT count(*) FROM messages WHERE session_id = ?", args.doomed
                ),
                "doomed_api": api_messages(store, args.doomed),
                "fork_rows": count(
                    store, "SELECT count(*) FROM messages WHERE session_id = ?", args.fork
                ),
                "fork_api": api_messages(store, args.fork),
            }
            say("seen", json.dumps(seen))
            rounds += 1
            time.sleep(0.001)
        store.close()
        return 0
    if session_jobs is not None:
        session_jobs.PURGE_ROWS = args.batch
        session_jobs.FORK_MESSAGES = args.batch
        counted_batches(args.kill_after)
    say("ready")
    if args.mode == "delete":
        store.sessions.delete(args.sid)
    else:
        store.sessions.fork(args.sid, id=args.id)
    say("done")
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
