"""What encrypting the SQLite file costs: apsw-sqlite3mc against stock apsw (issue 29).

SQLite3 Multiple Ciphers is a build of apsw whose SQLite encrypts every page of the
database and of its WAL.  It provides the ``apsw`` module, as stock apsw does, so the
two cannot be installed in one environment: install it in a throwaway virtualenv and
give both interpreters here (never into the project's venv)::

    python3 -m venv /tmp/mc && /tmp/mc/bin/pip install apsw-sqlite3mc
    .venv/bin/python benchmarks/bench_sqlite3mc.py --mc-python /tmp/mc/bin/python

Each configuration runs in a process of its own (one apsw per process), on a fresh file
in WAL mode with ``synchronous=NORMAL`` (fleetstore's default), through raw apsw so that
only the library differs:

* ``stock``: stock apsw (the interpreter running this script), no encryption;
* ``mc-plain``: the sqlite3mc build, no key (its VFS shim alone);
* ``mc-<cipher>``: the sqlite3mc build, a raw 32-byte key (``PRAGMA key='raw:<hex>'``,
  no key derivation) with that cipher (chacha20 is sqlite3mc's default).

Per configuration: a table of ``--rows`` rows of ~500 bytes is filled, then

* ``write``: ``BEGIN IMMEDIATE``, one 500-byte INSERT and one UPDATE of a small row,
  ``COMMIT`` (a small write transaction, as one agent operation is);
* ``read``: a point read of a random row in its own read transaction, with a 2 MB page
  cache (the file is larger, so most reads decrypt pages read from the OS cache);
* ``scan``: 50 consecutive rows of one session;
* ``open``: open, key, first read (``raw`` key; ``passphrase``: the same with the
  PBKDF2 key derivation a passphrase costs, for comparison);
* ``checkpoint``: ``wal_checkpoint(TRUNCATE)`` after the writes;
* ``delete``: one transaction deleting one session's ~200 rows (sqlite3mc's SQLite is
  built with ``SECURE_DELETE``, which zeroes freed pages; stock apsw's is not);
* the marker check: a string written in every row is searched for in the bytes of the
  database and its WAL (found in the plain files, never in the encrypted ones), and a
  wrong key's first read must raise ``NotADBError``.

Results: docs/benchmarks.md, "Encryption at rest: SQLite".  ``--json FILE`` keeps them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MARKER = "MARKER-5e1f7c-plaintext"


def child(config: str, rows: int, ops: int, directory: str) -> dict[str, Any]:
    """One configuration, measured in this process (``--child``)."""
    import apsw

    mc = getattr(apsw, "mc_version", None)
    cipher = config.removeprefix("mc-") if config.startswith("mc-") else None
    if cipher == "plain":
        cipher = None
    if config.startswith("mc-") and mc is None:
        raise SystemExit(f"{config} needs apsw-sqlite3mc; this interpreter has stock apsw")
    key = os.urandom(32)
    path = os.path.join(directory, f"{config}.db")

    def connect(with_key: bytes | None = key) -> Any:
        conn = apsw.Connection(path)
        if cipher is not None and with_key is not None:
            # The cipher first, then the key: sqlite3mc reads its settings at the key.
            if conn.pragma("cipher", cipher) != cipher:
                raise SystemExit(f"cipher {cipher} refused")
            if conn.pragma("key", "raw:" + with_key.hex()) != "ok":
                raise SystemExit("key refused")
        conn.pragma("synchronous", "NORMAL")
        conn.pragma("cache_size", -2000)
        return conn

    conn = connect()
    conn.pragma("journal_mode", "wal")
    conn.execute(
        "CREATE TABLE messages(id INTEGER PRIMARY KEY, session TEXT NOT NULL, seq INTEGER,"
        " body TEXT); CREATE INDEX by_session ON messages(session, seq);"
        "CREATE TABLE sessions(id TEXT PRIMARY KEY, n INTEGER NOT NULL DEFAULT 0)"
    )
    sessions = [f"s{i:04d}" for i in range(200)]
    body = (MARKER + " " + "lorem ipsum dolor sit amet " * 20)[:500]
    with conn:
        conn.executemany("INSERT INTO sessions(id) VALUES (?)", [(s,) for s in sessions])
        conn.executemany(
            "INSERT INTO messages(session, seq, body) VALUES (?, ?, ?)",
            [(sessions[i % 200], i // 200, body) for i in range(rows)],
        )
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    rng = random.Random(7)

    def timed(fn: Any, n: int) -> dict[str, float]:
        times = []
        cpu0 = time.process_time()
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        cpu = time.process_time() - cpu0
        times.sort()
        return {
            "p50_us": round(statistics.median(times) * 1e6, 1),
            "p99_us": round(times[int(len(times) * 0.99) - 1] * 1e6, 1),
            "mean_us": round(statistics.fmean(times) * 1e6, 1),
            "cpu_us": round(cpu / n * 1e6, 1),
        }

    seq = [rows]

    def write() -> None:
        s = sessions[rng.randrange(200)]
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO messages(session, seq, body) VALUES (?, ?, ?)", (s, seq[0], body))
        conn.execute("UPDATE sessions SET n = n + 1 WHERE id = ?", (s,))
        conn.execute("COMMIT")
        seq[0] += 1

    out: dict[str, Any] = {"config": config, "mc_version": mc, "sqlite": apsw.sqlite_lib_version()}
    out["write"] = timed(write, ops)
    wal_bytes = Path(path + "-wal").read_bytes()
    t0 = time.perf_counter()
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    out["checkpoint_ms"] = round((time.perf_counter() - t0) * 1e3, 2)
    total = seq[0]

    def read() -> None:
        conn.execute(
            "SELECT body FROM messages WHERE id = ?", (rng.randrange(1, total),)
        ).fetchall()

    def scan() -> None:
        conn.execute(
            "SELECT body FROM messages WHERE session = ? ORDER BY seq LIMIT 50",
            (sessions[rng.randrange(200)],),
        ).fetchall()

    out["read"] = timed(read, ops * 4)
    out["scan"] = timed(scan, ops)
    doomed = iter(sessions[:100])

    def delete() -> None:
        # sqlite3mc builds SQLite with SECURE_DELETE: freed pages are zeroed.
        with conn:
            conn.execute("DELETE FROM messages WHERE session = ?", (next(doomed),))

    out["delete"] = timed(delete, 100)
    out["secure_delete"] = conn.pragma("secure_delete")
    conn.close()

    def open_read(how: str) -> None:
        c = apsw.Connection(path)
        if cipher is not None:
            c.pragma("cipher", cipher)
            c.pragma("key", "raw:" + key.hex() if how == "raw" else "a passphrase")
        c.execute("SELECT count(*) FROM sessions").fetchall()
        c.close()

    out["open"] = timed(lambda: open_read("raw"), 50)
    if cipher is not None:
        # A passphrase-keyed file of its own (the KDF runs at every open).
        pass_path = path + ".pass"
        p = apsw.Connection(pass_path)
        p.pragma("cipher", cipher)
        p.pragma("key", "a passphrase")
        p.execute("CREATE TABLE sessions(id)")
        p.close()
        saved, path = path, pass_path
        out["open_passphrase"] = timed(lambda: open_read("passphrase"), 10)
        path = saved
        wrong = apsw.Connection(path)
        wrong.pragma("cipher", cipher)
        wrong.pragma("key", "raw:" + os.urandom(32).hex())
        try:
            wrong.execute("SELECT count(*) FROM sessions").fetchall()
            out["wrong_key"] = "read succeeded"
        except apsw.NotADBError:
            out["wrong_key"] = "NotADBError at the first read"
        except apsw.Error as exc:  # reported, not hidden
            out["wrong_key"] = f"{type(exc).__name__}: {exc}"
        wrong.close()
    db_bytes = Path(path).read_bytes()
    needle = MARKER.encode()
    out["file_mb"] = round(len(db_bytes) / 1e6, 1)
    out["marker_in_db"] = needle in db_bytes
    out["marker_in_wal"] = needle in wal_bytes
    out["plain_header"] = db_bytes[:16] == b"SQLite format 3\x00"
    return out


def child_fleetstore(config: str, ops: int, directory: str) -> dict[str, Any]:
    """The same comparison one level up: ``store.messages.append`` (one operation: the
    gate, a transaction, applied_ops) and ``store.messages.list`` through fleetstore,
    whose connections are keyed here by a subclass of ``apsw.Connection`` installed
    before fleetstore is imported (the engine does not take a key yet: the wiring is
    issue 29's next step; this measures what it will cost)."""
    import apsw

    cipher = config.removeprefix("mc-") if config.startswith("mc-") else None
    cipher = None if cipher == "plain" else cipher
    key = os.urandom(32)
    if cipher is not None:
        base = apsw.Connection

        class Keyed(base):  # type: ignore[misc, valid-type]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                self.pragma("cipher", cipher)
                self.pragma("key", "raw:" + key.hex())

        apsw.Connection = Keyed  # type: ignore[misc]
    import fleetstore

    path = Path(directory) / "fs.db"
    text = (MARKER + " " + "lorem ipsum dolor sit amet " * 20)[:500]
    out: dict[str, Any] = {"config": config, "sqlite": apsw.sqlite_lib_version()}
    with fleetstore.open(path) as store:
        sessions = [store.sessions.create(title=f"s{i}").id for i in range(50)]
        for i in range(2000):
            store.messages.append(sessions[i % 50], "user", text)
        rng = random.Random(7)

        def timed(fn: Any, n: int) -> dict[str, float]:
            times = []
            cpu0 = time.process_time()
            for _ in range(n):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            cpu = time.process_time() - cpu0
            times.sort()
            return {
                "p50_us": round(statistics.median(times) * 1e6, 1),
                "p99_us": round(times[int(len(times) * 0.99) - 1] * 1e6, 1),
                "mean_us": round(statistics.fmean(times) * 1e6, 1),
                "cpu_us": round(cpu / n * 1e6, 1),
            }

        out["append"] = timed(
            lambda: store.messages.append(sessions[rng.randrange(50)], "user", text), ops
        )
        out["list"] = timed(lambda: store.messages.list(sessions[rng.randrange(50)], limit=20), ops)
    data = path.read_bytes()
    wal = Path(str(path) + "-wal")
    out["marker_in_db"] = MARKER.encode() in data
    out["marker_in_wal"] = wal.exists() and MARKER.encode() in wal.read_bytes()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mc-python", help="an interpreter with apsw-sqlite3mc installed")
    parser.add_argument("--ciphers", default="chacha20,aegis,sqlcipher")
    parser.add_argument("--rows", type=int, default=40_000)
    parser.add_argument("--ops", type=int, default=3_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument(
        "--fleetstore-src",
        help="also measure through fleetstore (its src/ directory, put on the children's "
        "PYTHONPATH; the mc interpreter needs click and zstandard)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-fleetstore", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_fleetstore:
        with tempfile.TemporaryDirectory(prefix="bench-mc-") as directory:
            print(json.dumps(child_fleetstore(args.child_fleetstore, args.ops, directory)))
        return
    if args.child:
        with tempfile.TemporaryDirectory(prefix="bench-mc-") as directory:
            print(json.dumps(child(args.child, args.rows, args.ops, directory)))
        return
    plan = [("stock", sys.executable)]
    if args.mc_python:
        plan.append(("mc-plain", args.mc_python))
        plan += [(f"mc-{c}", args.mc_python) for c in args.ciphers.split(",") if c]
    results: list[dict[str, Any]] = []
    fs_results: list[dict[str, Any]] = []
    for round_no in range(args.rounds):
        # Reversed every other round, so no configuration always runs first.
        for config, python in plan if round_no % 2 == 0 else plan[::-1]:
            done = subprocess.run(
                [python, __file__, "--child", config, "--rows", str(args.rows),
                 "--ops", str(args.ops)],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            if done.returncode != 0:
                raise SystemExit(f"{config}: {done.stderr[-2000:]}")
            result = json.loads(done.stdout)
            result["round"] = round_no
            results.append(result)
            if args.fleetstore_src:
                env = dict(os.environ, PYTHONPATH=args.fleetstore_src)
                done = subprocess.run(
                    [python, __file__, "--child-fleetstore", config, "--ops", str(args.ops)],
                    capture_output=True, text=True, check=False, env=env,
                )  # fmt: skip
                if done.returncode != 0:
                    raise SystemExit(f"{config} (fleetstore): {done.stderr[-2000:]}")
                fs = json.loads(done.stdout)
                fs["round"] = round_no
                fs_results.append(fs)
            print(f"round {round_no} {config}: done", file=sys.stderr)
    rows = []
    for config, _ in plan:
        mine = [r for r in results if r["config"] == config]

        def best(name: str, field: str, mine: list[dict[str, Any]] = mine) -> float:
            return min(r[name][field] for r in mine if name in r)

        rows.append(
            {
                "config": config,
                "write_p50_us": best("write", "p50_us"),
                "write_p99_us": best("write", "p99_us"),
                "write_cpu_us": best("write", "cpu_us"),
                "read_p50_us": best("read", "p50_us"),
                "read_cpu_us": best("read", "cpu_us"),
                "scan_p50_us": best("scan", "p50_us"),
                "open_p50_us": best("open", "p50_us"),
                "open_passphrase_p50_us": best("open_passphrase", "p50_us")
                if any("open_passphrase" in r for r in mine)
                else None,
                "checkpoint_ms": min(r["checkpoint_ms"] for r in mine),
                "delete_p50_us": best("delete", "p50_us"),
                "secure_delete": mine[0]["secure_delete"],
                "marker_in_db": mine[0]["marker_in_db"],
                "marker_in_wal": mine[0]["marker_in_wal"],
                "wrong_key": mine[0].get("wrong_key", ""),
                "file_mb": mine[0]["file_mb"],
            }
        )
    base = rows[0]
    print(
        f"\n{platform.node()} {platform.machine()} python {platform.python_version()}; "
        f"{args.rows:,} rows, {args.ops:,} ops, best of {args.rounds} rounds\n"
    )
    head = (
        "| config | write p50 µs | write p99 µs | write CPU µs | read p50 µs | read CPU µs "
        "| scan 50 p50 µs | open µs (raw key) | open µs (passphrase) | checkpoint ms "
        "| delete ~200 rows µs (secure_delete) | marker in db / WAL |"
    )
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for row in rows:
        ratio = row["write_p50_us"] / base["write_p50_us"]
        rratio = row["read_p50_us"] / base["read_p50_us"]
        passphrase = row["open_passphrase_p50_us"]
        print(
            f"| {row['config']} | {row['write_p50_us']:.0f} ({ratio:.2f}x) "
            f"| {row['write_p99_us']:.0f} | {row['write_cpu_us']:.0f} "
            f"| {row['read_p50_us']:.1f} ({rratio:.2f}x) | {row['read_cpu_us']:.1f} "
            f"| {row['scan_p50_us']:.0f} | {row['open_p50_us']:.0f} "
            f"| {'' if passphrase is None else f'{passphrase:,.0f}'} | {row['checkpoint_ms']:.1f} "
            f"| {row['delete_p50_us']:,.0f} ({row['secure_delete']}) "
            f"| {'yes' if row['marker_in_db'] else 'no'} / {'yes' if row['marker_in_wal'] else 'no'} |"
        )
    for row in rows:
        if row["wrong_key"]:
            print(f"{row['config']}: a wrong key: {row['wrong_key']}")
    fs_rows = []
    for config, _ in plan if fs_results else []:
        mine = [r for r in fs_results if r["config"] == config]
        fs_rows.append(
            {
                "config": config,
                "append_p50_us": min(r["append"]["p50_us"] for r in mine),
                "append_p99_us": min(r["append"]["p99_us"] for r in mine),
                "append_cpu_us": min(r["append"]["cpu_us"] for r in mine),
                "list_p50_us": min(r["list"]["p50_us"] for r in mine),
                "list_cpu_us": min(r["list"]["cpu_us"] for r in mine),
                "marker_in_db": mine[0]["marker_in_db"],
                "marker_in_wal": mine[0]["marker_in_wal"],
            }
        )
    if fs_rows:
        print("\nThrough fleetstore (messages.append of 500 bytes; messages.list of 20):\n")
        head = (
            "| config | append p50 µs | append p99 µs | append CPU µs | list p50 µs "
            "| list CPU µs | marker in db / WAL |"
        )
        print(head)
        print("|" + "---|" * (head.count("|") - 1))
        for row in fs_rows:
            ratio = row["append_p50_us"] / fs_rows[0]["append_p50_us"]
            lratio = row["list_p50_us"] / fs_rows[0]["list_p50_us"]
            print(
                f"| {row['config']} | {row['append_p50_us']:.0f} ({ratio:.2f}x) "
                f"| {row['append_p99_us']:.0f} | {row['append_cpu_us']:.0f} "
                f"| {row['list_p50_us']:.0f} ({lratio:.2f}x) | {row['list_cpu_us']:.0f} "
                f"| {'yes' if row['marker_in_db'] else 'no'} / "
                f"{'yes' if row['marker_in_wal'] else 'no'} |"
            )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"rows": rows, "fleetstore_rows": fs_rows, "runs": results + fs_results}, indent=2
            )
        )


if __name__ == "__main__":
    main()
