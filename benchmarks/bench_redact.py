"""What redaction costs (issue 29): per typical operation, per MB of tool output, streamed,
and on inputs built to make a regex engine backtrack.

Everything runs in this process on the built-in rules (fleetstore.core.redact), CPU
only, best of ``--rounds``:

* typical operations: a user message, an assistant reply, a tool call's arguments (a
  JSON value, walked with its keys), a tool output, and a tool output holding secrets;
* per MB of tool output: prose, source code, a test log, minified JSON, base64, hex, and
  an environment dump with a secret every ~1 KB;
* streamed: 1 MB of a reply in 100-character deltas through ``StreamRedactor``;
* pathological: 1 MB and 4 MB of inputs made of rule prefixes (``sk-proj-`` repeated,
  private key headers without an END, ``://`` before long runs, ...); the 4 MB / 1 MB
  ratio shows the cost stays linear (4 is linear).

Results: docs/benchmarks.md, "Redaction".

    .venv/bin/python benchmarks/bench_redact.py [--rounds 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import random
import string
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.secret_samples import samples  # noqa: E402

from fleetstore.core.redact import default_redactor  # noqa: E402

MB = 1_000_000
R = default_redactor()


def best(fn: Callable[[], object], rounds: int, repeat: int = 1) -> float:
    """Seconds of CPU per call, the best of *rounds* (each *repeat* calls)."""
    times = []
    for _ in range(rounds):
        t0 = time.process_time()
        for _ in range(repeat):
            fn()
        times.append((time.process_time() - t0) / repeat)
    return min(times)


def fill(piece: Callable[[], str], size: int) -> str:
    out, n = [], 0
    while n < size:
        s = piece()
        out.append(s)
        n += len(s)
    return "".join(out)[:size]


def corpora(rng: random.Random) -> dict[str, str]:
    words = [
        "the", "build", "failed", "because", "a", "test", "reads", "file", "another",
        "deletes", "so", "we", "retry", "it", "with", "fixture", "that", "copies",
        "directory", "first", "and", "then", "suite", "passed", "in", "under", "minute",
    ]  # fmt: skip
    source = (ROOT / "src" / "fleetstore" / "engine" / "sqlite.py").read_text()
    secrets = [s.text for s in samples()]
    env_lines = [
        "HOME=/home/agent", "PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8",
        "TERM=xterm-256color", "SHELL=/bin/bash", "PWD=/work/repo", "SHLVL=1",
    ]  # fmt: skip

    def log_line() -> str:
        n = rng.randrange(10_000)
        return f"tests/test_{n % 97}.py::test_case_{n} PASSED [{n % 100:3d}%]\n"

    def json_record() -> str:
        return json.dumps(
            {"id": rng.randrange(10**9), "name": rng.choice(words), "tags": words[:3]},
            separators=(",", ":"),
        )

    def env_block() -> str:
        block = [rng.choice(env_lines) for _ in range(30)]
        block.insert(rng.randrange(30), rng.choice(secrets))
        return "\n".join(block) + "\n"

    return {
        "prose": fill(lambda: rng.choice(words) + " ", MB),
        "source code": fill(lambda: source, MB),
        "test log": fill(log_line, MB),
        "minified JSON": fill(json_record, MB),
        "base64": fill(lambda: "".join(rng.choices(string.ascii_letters + "+/", k=76)) + "\n", MB),
        "hex": fill(lambda: "".join(rng.choices("0123456789abcdef", k=64)) + "\n", MB),
        "env dump, a secret per ~1 KB": fill(env_block, MB),
    }


def pathological(size: int) -> dict[str, str]:
    b64 = (string.ascii_letters + string.digits + "+/") * 2
    return {
        "sk-proj- repeated": fill(lambda: "sk-proj-", size),
        "sk-proj- + 400 token chars, repeated": fill(lambda: "sk-proj-" + "a" * 400 + " ", size),
        "ghp_ repeated": fill(lambda: "ghp_", size),
        "BEGIN header repeated": fill(lambda: "-----BEGIN RSA PRIVATE KEY-----\n", size),
        "BEGIN header then base64, no END": "-----BEGIN RSA PRIVATE KEY-----\n"
        + fill(lambda: b64[:64] + "\n", size),
        ":// + 120 chars, repeated": fill(lambda: "://" + "a" * 120, size),
        "eyJ + 4000 chars, repeated": fill(lambda: "eyJ" + "A" * 4000 + ".", size),
        "Authorization: Bearer repeated": fill(lambda: "Authorization: Bearer ", size),
        "PASSWORD= repeated": fill(lambda: "PASSWORD=", size),
        "?token= repeated": fill(lambda: "?token=", size),
        "AKIA repeated": fill(lambda: "AKIA", size),
        "one letter": "a" * size,
        "non-ASCII text": fill(lambda: "Grüße, 世界! İstanbul ", size),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    rng = random.Random(29)
    secrets = samples()
    reply = (
        "The test fails because `tmp_path` is shared. I changed the fixture:\n\n```python\n"
        + (ROOT / "src" / "fleetstore" / "core" / "units.py").read_text()[:900]
        + "\n```\n\nRun `pytest -k fixture` again; it passes now.\n"
    )
    typical: dict[str, Callable[[], object]] = {
        "user message (200 B)": lambda: R.redact(reply[:200]),
        "assistant reply (1.5 KB)": lambda: R.redact(reply[:1500]),
        "tool call arguments (JSON, 300 B)": lambda: R.redact_value(
            {
                "cmd": "pytest -k fixture -x",
                "cwd": "/work/repo",
                "env": {"CI": "1", "HOME": "/h"},
                "timeout": 120,
                "description": reply[:150],
            }
        ),
        "tool output (4 KB)": lambda: R.redact(corpora_cache["test log"][:4000]),
        "tool output with 3 secrets (4 KB)": lambda: R.redact(
            corpora_cache["env dump, a secret per ~1 KB"][:4000]
        ),
        "empty text": lambda: R.redact(""),
    }
    corpora_cache = corpora(rng)
    results: dict[str, Any] = {"typical_us": {}, "per_mb_ms": {}, "pathological": {}}
    print("\n| typical operation | µs |\n|---|---|")
    for name, fn in typical.items():
        us = best(fn, args.rounds, repeat=2000) * 1e6
        results["typical_us"][name] = round(us, 1)
        print(f"| {name} | {us:.1f} |")
    print("\n| 1 MB of | ms | findings |\n|---|---|---|")
    for name, text in corpora_cache.items():
        ms = best(lambda text=text: R.find(text), args.rounds) * 1e3
        found = len(R.find(text))
        results["per_mb_ms"][name] = {"ms": round(ms, 1), "findings": found}
        print(f"| {name} | {ms:.1f} | {found:,} |")
    reply_mb = corpora_cache["prose"]

    def streamed() -> str:
        stream = R.stream()
        out = [stream.feed(reply_mb[i : i + 100]) for i in range(0, len(reply_mb), 100)]
        out.append(stream.finish())
        return "".join(out)

    assert streamed() == R.redact(reply_mb).text
    stream_ms = best(streamed, args.rounds) * 1e3
    whole_ms = best(lambda: R.redact(reply_mb), args.rounds) * 1e3
    results["stream_ms_per_mb"] = {
        "deltas_of_100": round(stream_ms, 1),
        "whole": round(whole_ms, 1),
    }
    print(
        f"\nstreamed: 1 MB of prose in 10,000 deltas of 100 characters {stream_ms:.1f} ms "
        f"(redacted whole: {whole_ms:.1f} ms)"
    )
    one, four = pathological(MB), pathological(4 * MB)
    print("\n| pathological input | ms per MB (1 MB) | ms per MB (4 MB) | 4 MB / 1 MB |")
    print("|---|---|---|---|")
    for name in one:
        t1 = best(lambda name=name: R.find(one[name]), max(args.rounds // 2, 1))
        t4 = best(lambda name=name: R.find(four[name]), max(args.rounds // 2, 1))
        results["pathological"][name] = {
            "ms_per_mb_1": round(t1 * 1e3, 1),
            "ms_per_mb_4": round(t4 / 4 * 1e3, 1),
            "ratio": round(t4 / t1, 2),
        }
        print(f"| {name} | {t1 * 1e3:.1f} | {t4 / 4 * 1e3:.1f} | {t4 / t1:.2f} |")
    print(f"\n{len(secrets)} sample secrets, {len(R.ruleset.rules)} rules")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
