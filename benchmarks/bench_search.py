"""Search on a store of realistic agent history (issue 30).

Builds a store of ``--messages`` messages (200,000 by default) through the API: turns of
a user message and an assistant reply (text, sometimes reasoning, a tool call and its
output) in sessions of 20 to 80 turns across a few projects.  The text is real: prose
from the docstrings and comments of Python's standard library, tool outputs made from
its files (``cat`` of a file, ``grep -rn`` hits, a ``pytest`` run with a traceback,
``ls -la``, ``git diff`` hunks, JSON responses, shell errors with their codes), 1 in 60
of them 64 KiB or more (a blob file).  Then, on the store as built:

1. **indexing**: the index built from scratch (the backfill, ``store.search.catch_up``),
   its time and CPU, characters of text per second;
2. **sizes**: each search table and index (dbstat), against the bytes of the text it
   covers (every searched text's UTF-8 bytes, as indexed);
3. **queries**: ``--queries`` of each kind, picked from the text written (so each finds
   something): a rare word, a common word, a phrase, a prefix, a boolean query, a
   snake_case identifier and a path as words, a substring of an identifier, of an
   error code, of a path; each with ``limit=20``, newest first, and the words ones best
   first too, and with a project filter; latency p50/p99 (wall clock, the whole call:
   the index, reading the text of each hit, checking and highlighting it).

``--layout`` file (default), sharded or postgresql (``--pg-url``, or a server of its own
from tests/pgserver.py).  The write path's cost with search on and off is
``benchmarks/bench_ops.py --search on|off``.

    .venv/bin/python benchmarks/bench_search.py [--messages 200000] [--layout file]
        [--queries 40] [--keep DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fleetstore
from fleetstore.domain.search_text import part_text
from fleetstore.models import Reasoning, Text, ToolCall, ToolResult

_IDENT = re.compile(r"\b[a-z][a-z0-9]*_[a-z0-9_]+\b")
_WORD = re.compile(r"\b[A-Za-z]{4,}\b")
_SENTENCE = re.compile(r"[A-Z][^.!?\n]{30,200}[.!?]")
_ERRORS = [
    ("ConnectionRefusedError", "[Errno 111] Connection refused", "ECONNREFUSED"),
    ("FileNotFoundError", "[Errno 2] No such file or directory", "ENOENT"),
    ("PermissionError", "[Errno 13] Permission denied", "EACCES"),
    ("TimeoutError", "[Errno 110] Connection timed out", "ETIMEDOUT"),
    ("OSError", "[Errno 28] No space left on device", "ENOSPC"),
    ("BrokenPipeError", "[Errno 32] Broken pipe", "EPIPE"),
    ("KeyError", "'session_id'", "KEY_MISSING"),
    ("AssertionError", "assert 3 == 4", "E_ASSERT"),
]


class Corpus:
    """Text from the standard library's own files."""

    def __init__(self, seed: int) -> None:
        root = Path(sysconfig.get_paths()["stdlib"])
        paths = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
        self.rng = random.Random(seed)
        self.files: list[tuple[str, str]] = []
        for p in paths[:1500]:
            try:
                self.files.append((str(p.relative_to(root)), p.read_text("utf-8")))
            except (UnicodeDecodeError, OSError):
                continue
        text = "\n".join(t for _, t in self.files)
        self.sentences = _SENTENCE.findall(text)
        self.idents = sorted(set(_IDENT.findall(text)))
        self.words = sorted(set(w.lower() for w in _WORD.findall(text)))
        self.lines = [ln for _, t in self.files for ln in t.splitlines() if len(ln.strip()) > 12]

    def prose(self, n: int) -> str:
        return " ".join(self.rng.choice(self.sentences) for _ in range(n))

    def user(self) -> str:
        r = self.rng
        path, _ = r.choice(self.files)
        templates = [
            f"Why does {r.choice(self.idents)} fail in {path}?",
            f"Fix the flaky test around {r.choice(self.idents)}; it says {r.choice(_ERRORS)[1]}.",
            f"Refactor {path} so that {r.choice(self.idents)} is not called twice.",
            f"{self.prose(1)} Can you check {r.choice(self.idents)}?",
        ]
        return r.choice(templates)

    def _file_slice(self, most: int) -> tuple[str, str]:
        path, text = self.rng.choice(self.files)
        start = self.rng.randrange(max(1, len(text) - most))
        return path, text[start : start + self.rng.randint(most // 8, most)]

    def tool(self) -> tuple[str, dict[str, Any], str]:
        r = self.rng
        kind = r.choices(
            ["cat", "grep", "pytest", "ls", "diff", "json", "error"], [5, 4, 3, 2, 2, 2, 2]
        )[0]
        if kind == "cat":
            big = r.random() < 1 / 60
            path, body = self._file_slice(160_000 if big else 6_000)
            while big and len(body) < 70_000:
                body += self._file_slice(60_000)[1]
            return "read_file", {"path": path}, body
        if kind == "grep":
            ident = r.choice(self.idents)
            hits = [
                f"{r.choice(self.files)[0]}:{r.randint(1, 900)}:{r.choice(self.lines)}"
                for _ in range(r.randint(1, 40))
            ]
            return "bash", {"cmd": f"grep -rn {ident} ."}, "\n".join(hits)
        if kind == "pytest":
            path, _ = r.choice(self.files)
            name, message, code = r.choice(_ERRORS)
            tests = r.randint(5, 200)
            lines = [f"collected {tests} items", "." * (tests - 1) + "F"]
            lines += [f"    {r.choice(self.lines).strip()}" for _ in range(r.randint(3, 15))]
            lines += [
                f"E   {name}: {message}",
                f"tests/test_{Path(path).stem}.py:{r.randint(10, 500)}: {name} ({code})",
                f"1 failed, {tests - 1} passed in {r.uniform(0.1, 30):.2f}s",
            ]
            return "bash", {"cmd": f"pytest -x tests/test_{Path(path).stem}.py"}, "\n".join(lines)
        if kind == "ls":
            rows = [
                f"-rw-r--r-- 1 agent agent {r.randint(100, 90000):>6} Jan {r.randint(1, 28):2d} "
                f"{r.randint(0, 23):02d}:{r.randint(0, 59):02d} {r.choice(self.files)[0]}"
                for _ in range(r.randint(3, 60))
            ]
            return "bash", {"cmd": "ls -la"}, "\n".join(rows)
        if kind == "diff":
            path, body = self._file_slice(3_000)
            lines = body.splitlines()
            out = [f"diff --git a/{path} b/{path}", f"--- a/{path}", f"+++ b/{path}", "@@ -1 +1 @@"]
            out += [r.choice("+- ") + ln for ln in lines]
            return "bash", {"cmd": "git diff"}, "\n".join(out)
        if kind == "json":
            data = {
                "id": f"req_{r.getrandbits(48):012x}",
                "status": r.choice(["ok", "error", "pending"]),
                "items": [
                    {"name": r.choice(self.idents), "size": r.randint(0, 10**6)}
                    for _ in range(r.randint(1, 30))
                ],
                "message": self.prose(1),
            }
            return (
                "http_get",
                {"url": f"https://api.example.com/v1/{r.choice(self.idents)}"},
                (json.dumps(data, indent=2)),
            )
        name, message, code = r.choice(_ERRORS)
        return (
            "bash",
            {"cmd": f"python -m {r.choice(self.idents)}"},
            f'Traceback (most recent call last):\n  File "{r.choice(self.files)[0]}", line '
            f"{r.randint(1, 900)}, in {r.choice(self.idents)}\n    {r.choice(self.lines).strip()}\n"
            f"{name}: {message}\nexit status 1 ({code})",
        )


def build(store: fleetstore.Store, messages: int, seed: int, progress: bool) -> dict[str, Any]:
    """Write *messages* messages; the bytes of searched text written."""
    corpus = Corpus(seed)
    r = corpus.rng
    projects = [f"project-{i}" for i in range(8)]
    written = 0
    covered = 0
    started = time.monotonic()
    while written < messages:
        title = f"{r.choice(['Fix', 'Refactor', 'Investigate', 'Port'])} {r.choice(corpus.idents)}"
        session = store.sessions.create(
            title=title,
            project=r.choice(projects),
            metadata={"ticket": f"OPS-{r.randint(1, 9999)}"},
        )
        covered += len(title.encode()) + len(session.metadata["ticket"])
        for _ in range(r.randint(10, 40)):
            if written >= messages:
                break
            user = corpus.user()
            store.messages.append(session.id, "user", user)
            covered += len(user.encode())
            parts: list[Any] = [Text(corpus.prose(r.randint(1, 5)))]
            if r.random() < 0.3:
                parts.insert(0, Reasoning(corpus.prose(r.randint(1, 3))))
            name, args, output = corpus.tool()
            call = ToolCall(name, args)
            parts += [call, ToolResult(call.call_id, output, name=name)]
            store.messages.append(session.id, "assistant", parts, model="m-1")
            for p in parts:
                text = part_text(p) or ""
                covered += len(text.encode())
            written += 2
            if progress and written % 10_000 == 0:
                rate = written / (time.monotonic() - started)
                print(f"  {written:,} messages ({rate:,.0f}/s)", file=sys.stderr, flush=True)
    return {"messages": written, "text_bytes": covered, "corpus": corpus}


def queries(corpus: Corpus, n: int) -> dict[str, list[tuple[str, str]]]:
    """(query, match) per kind, each picked from the text the corpus writes."""
    r = random.Random(7)
    idents = [i for i in corpus.idents if 8 <= len(i) <= 30]
    common = ["return", "self", "error", "none", "value", "test", "file", "import"]
    paths = [p for p, _ in corpus.files]

    def phrase() -> str:
        words = r.choice(corpus.sentences).split()
        at = r.randrange(max(1, len(words) - 2))
        return '"' + " ".join(words[at : at + 2]).replace('"', "") + '"'

    kinds: dict[str, Callable[[], tuple[str, str]]] = {
        "word (rare)": lambda: (r.choice(idents).split("_")[0] + "_" + "x", "words"),
        "word (common)": lambda: (r.choice(common), "words"),
        "phrase": lambda: (phrase(), "words"),
        "prefix": lambda: (r.choice(corpus.words)[:4] + "*", "words"),
        "boolean": lambda: (f"{r.choice(common)} AND {r.choice(corpus.words)} NOT test", "words"),
        "identifier (words)": lambda: (r.choice(idents), "words"),
        "path (words)": lambda: (r.choice(paths), "words"),
        "substring (identifier)": lambda: (_middle(r, r.choice(idents)), "substring"),
        "substring (error code)": lambda: (r.choice(_ERRORS)[2][1:], "substring"),
        "substring (path)": lambda: (_middle(r, r.choice(paths)), "substring"),
    }
    out = {}
    for kind, make in kinds.items():
        picked = [make() for _ in range(n)]
        if kind == "word (rare)":
            picked = [(r.choice(idents), "words") for _ in range(n)]
        out[kind] = picked
    return out


def _middle(r: random.Random, text: str) -> str:
    if len(text) <= 6:
        return text
    start = r.randrange(1, max(2, len(text) // 3))
    return text[start : start + r.randint(5, min(14, len(text) - start))]


def timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def latency(store: fleetstore.Store, picked: list[tuple[str, str]], **kw: Any) -> dict[str, Any]:
    times, hits = [], []
    for q, match in picked:
        page: list[Any] = []

        def run(q: str = q, match: str = match, page: list[Any] = page) -> None:
            page[:] = store.search(q, match=match, limit=20, **kw)

        times.append(timed(run))
        hits.append(len(page))
    times.sort()
    return {
        "p50_ms": round(statistics.median(times) * 1000, 2),
        "p99_ms": round(times[min(len(times) - 1, int(len(times) * 0.99))] * 1000, 2),
        "mean_hits": round(sum(hits) / len(hits), 1),
        "none_found": sum(1 for h in hits if h == 0),
    }


def sizes(store: fleetstore.Store) -> dict[str, int]:
    q = store.queries
    name = "fts5_sizes" if store.dialect == "sqlite" else "tsv_sizes"
    total: dict[str, int] = {}

    def one(db: Any) -> None:
        for table, size in db.read(lambda tx: tx.execute(q[name])):
            total[str(table)] = total.get(str(table), 0) + int(size)

    for key in store.search_files(session_id=None, root_id=None, project=None):
        store.with_file(key, one)
    return total


def _open(layout: str, where: Path, pg_url: str | None, **settings: Any) -> fleetstore.Store:
    if layout == "file":
        return fleetstore.open(where / "s.db", **settings)
    if layout == "sharded":
        return fleetstore.open(f"sqlite+sharded://{where / 'sharded'}", **settings)
    assert pg_url is not None
    return fleetstore.open(pg_url, local_dir=str(where / "pg-local"), **settings)


def _pg_server(layout: str, given: str | None) -> Iterator[str | None]:
    if layout != "postgresql" or given:
        yield given
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests import pgserver

    with pgserver.server() as srv:
        yield srv.create_database("bench")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--layout", choices=["file", "sharded", "postgresql"], default="file")
    ap.add_argument("--pg-url")
    ap.add_argument("--queries", type=int, default=40, help="queries of each kind")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", type=Path, help="build the store here (kept), or reuse it")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-search-") as tmp:
        where = args.keep or Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        for pg_url in _pg_server(args.layout, args.pg_url):
            result = run(args, where, pg_url)
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


def run(args: argparse.Namespace, where: Path, pg_url: str | None) -> dict[str, Any]:
    result: dict[str, Any] = {
        "layout": args.layout,
        "loadavg": os.getloadavg()[0],
        "cpus": os.cpu_count(),
    }
    store = _open(args.layout, where, pg_url, search_index=False)
    try:
        started, cpu = time.monotonic(), time.process_time()
        built = build(store, args.messages, args.seed, progress=True)
        result["build"] = {
            "messages": built["messages"],
            "seconds": round(time.monotonic() - started, 1),
            "cpu_s": round(time.process_time() - cpu, 1),
        }
        result["text_bytes"] = built["text_bytes"]
        print(f"built: {result['build']}", file=sys.stderr, flush=True)
        started, cpu = time.monotonic(), time.process_time()
        sections = store.search.catch_up()
        seconds, cpu_s = time.monotonic() - started, time.process_time() - cpu
        result["indexing"] = {
            "sections": sections,
            "seconds": round(seconds, 1),
            "cpu_s": round(cpu_s, 1),
            "text_mb_per_cpu_s": round(built["text_bytes"] / 1e6 / max(cpu_s, 1e-9), 2),
            "cpu_us_per_message": round(cpu_s / built["messages"] * 1e6, 1),
        }
        print(f"indexed: {result['indexing']}", file=sys.stderr, flush=True)
        found = sizes(store)
        index_bytes = sum(found.values())
        result["sizes"] = {
            "tables": found,
            "index_bytes": index_bytes,
            "ratio_to_text": round(index_bytes / built["text_bytes"], 3),
        }
        print(f"sizes: {result['sizes']}", file=sys.stderr, flush=True)
        picked = queries(built["corpus"], args.queries)
        lat: dict[str, Any] = {}
        for kind, qs in picked.items():
            lat[kind] = latency(store, qs)
            if qs[0][1] == "words":
                lat[kind + ", best first"] = latency(store, qs, order="best")
            lat[kind + ", one project"] = latency(store, qs, project="project-3")
            print(f"{kind:24} {lat[kind]}", file=sys.stderr, flush=True)
        result["latency"] = lat
    finally:
        store.close()
    return result


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
