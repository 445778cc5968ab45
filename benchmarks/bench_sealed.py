"""What sealing files costs (issue 29): fleetstore.core.sealed (AES-256-GCM through the
``cryptography`` package, a key of its own per file by HKDF), CPU only, best of
``--rounds``:

* a blob: seal and open 64 KiB, 1 MiB and 16 MiB (MB/s; the chunked layout reads and
  writes 64 KiB at a time);
* a spool journal line: one record of ~600 bytes sealed, and a journal of 1,000 records
  opened (µs per record);
* a file's fixed cost: the header (a key derivation) of an empty file.

Results: docs/benchmarks.md, "Encryption at rest: sealed files".

    .venv/bin/python benchmarks/bench_sealed.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

from fleetstore.core import sealed
from fleetstore.core.keys import Key, Keyring

KEYS = Keyring((Key.generate("k1"),))


def best(fn: Callable[[], object], rounds: int, repeat: int = 1) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.process_time()
        for _ in range(repeat):
            fn()
        times.append((time.process_time() - t0) / repeat)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print("| size | seal MB/s | open MB/s | bytes added |\n|---|---|---|---|")
    for size in (64 * 1024, 1024 * 1024, 16 * 1024 * 1024):
        data = os.urandom(size)
        box = sealed.seal(data, KEYS)
        repeat = max(1, (16 * 1024 * 1024) // size)
        t_seal = best(lambda data=data: sealed.seal(data, KEYS), args.rounds, repeat)
        t_open = best(lambda box=box: sealed.unseal(box, KEYS), args.rounds, repeat)
        print(
            f"| {size // 1024:,} KiB | {size / t_seal / 1e6:,.0f} | {size / t_open / 1e6:,.0f} "
            f"| {len(box) - size:,} |"
        )
    empty = best(lambda: sealed.seal(b"", KEYS), args.rounds, 2000)
    line = os.urandom(300).hex().encode()
    sealer = sealed.RecordSealer(KEYS)
    per_record = best(lambda: sealer.seal(line), args.rounds, 5000)
    fresh = sealed.RecordSealer(KEYS)  # record indexes start at 0 in a journal of its own
    journal = fresh.header + b"".join(fresh.seal(line) for _ in range(1000))
    open_journal = best(lambda: sealed.open_records(journal, KEYS), args.rounds, 5)
    print(f"\nan empty file (header, key derivation): {empty * 1e6:.1f} µs")
    print(f"a journal record of {len(line)} bytes: seal {per_record * 1e6:.1f} µs, ", end="")
    print(f"open {open_journal / 1000 * 1e6:.1f} µs per record (1,000 records)")


if __name__ == "__main__":
    main()
