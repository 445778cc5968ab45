"""Run the frameworks' own session and checkpointer tests against fleetstore's adapters.

    .venv/bin/python frameworks/run.py [agents] [langgraph] [-- PYTEST ARGS]

(``make frameworks`` runs both.)  For each suite: the framework's released source
package, at the version pinned below (the one fleetstore's dev environment
installs), is downloaded from PyPI (once, into ``build/frameworks/``), its
``tests/`` unpacked afresh, and the selected test files run with pytest and our
plugin (``plugin_<suite>.py``), which swaps the fixture that builds the store for
fleetstore's adapter; ``expected.py`` lists the tests that fail, each with its
reason.  Any other failure exits non-zero.

The tests run in ``build/frameworks/venv``: a venv that sees ``.venv``'s packages
(fleetstore, the frameworks) and adds what the suites need (``requirements.txt``).
ADK is not here: its released packages carry no tests (they are in its source
repository only, which CI cannot fetch); docs/integrations-adk.md says how its
session service contract tests were run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import time
import urllib.request
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BUILD = ROOT / "build" / "frameworks"
VENV = BUILD / "venv"
PYPI = "https://pypi.org/simple"


@dataclasses.dataclass(frozen=True)
class Suite:
    name: str
    package: str  # on PyPI
    version: str
    files: tuple[str, ...]  # under the package's tests/
    env: tuple[tuple[str, str], ...] = ()


SUITES = {
    s.name: s
    for s in (
        Suite(
            "agents",
            "openai-agents",
            "0.24.0",
            (
                "memory/test_session.py",
                "memory/test_session_limit.py",
                "memory/test_compaction_suffix.py",
                "memory/test_compaction_model_visibility.py",
                "memory/test_openai_responses_compaction_session.py",
                "extensions/memory/test_encrypt_session.py",
            ),
        ),
        Suite(
            "langgraph",
            "langgraph",
            "1.2.24",
            # Every file whose tests take the sync_checkpointer / async_checkpointer
            # fixture; the plugin keeps those tests only.
            (
                "test_checkpoint_migration.py",
                "test_delta_channel_exit_mode.py",
                "test_delta_channel_fork.py",
                "test_delta_channel_parallel_order.py",
                "test_delta_channel_subgraph.py",
                "test_delta_channel_to_plain.py",
                "test_delta_channel_update_state.py",
                "test_interrupt_state.py",
                "test_interruption.py",
                "test_large_cases.py",
                "test_large_cases_async.py",
                "test_pregel.py",
                "test_pregel_async.py",
                "test_pydantic.py",
                "test_strict_resume.py",
                "test_subgraph_persistence.py",
                "test_subgraph_persistence_async.py",
                "test_time_travel.py",
                "test_time_travel_async.py",
            ),
            # No servers: LangGraph's Postgres and Redis parameters are left out.
            (("NO_DOCKER", "true"),),
        ),
    )
}


def run(*cmd: str | Path, **kw: Any) -> None:
    subprocess.run([str(c) for c in cmd], check=True, **kw)


def venv() -> Path:
    """build/frameworks/venv, made (again) when requirements.txt changes."""
    requirements = HERE / "requirements.txt"
    digest = hashlib.sha256(requirements.read_bytes()).hexdigest()[:16]
    stamp = VENV / f".requirements-{digest}"
    python = VENV / "bin" / "python"
    if not stamp.exists():
        shutil.rmtree(VENV, ignore_errors=True)
        run(sys.executable, "-m", "venv", VENV)
        run(python, "-m", "pip", "install", "--quiet", "--no-input", "-r", requirements)
        stamp.touch()
    purelib = Path(sysconfig.get_path("purelib", vars={"base": str(VENV), "platbase": str(VENV)}))
    # The venv sees .venv's packages (fleetstore, the frameworks) after its own, as a
    # site directory: its own .pth files are read too, and fleetstore's editable install
    # is one (a bare path line would add the directory but not what its .pth files add:
    # "No module named 'fleetstore'").
    (purelib / "_fleetstore_dev.pth").write_text(
        f"import site; site.addsitedir({sysconfig.get_path('purelib')!r})\n"
    )
    return python


def download_sdist(package: str, archive: Path) -> None:
    """The release's source archive from PyPI's simple index (PEP 691 JSON), checked
    against the index's sha256.  Not ``pip download --no-binary :all:``: that builds
    the sdist's metadata, and its build backend's dependencies from source too, which
    failed on a fresh machine (hatchling's backend dependencies would not build)."""
    index = f"{PYPI}/{package}/"
    request = urllib.request.Request(
        index, headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        files = json.load(response)["files"]
    found = [f for f in files if f["filename"] == archive.name]
    if not found:
        sys.exit(f"frameworks/run.py: no {archive.name} in {index}")
    entry = found[0]
    with urllib.request.urlopen(entry["url"], timeout=120) as response:
        data = response.read()
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry["hashes"]["sha256"]:
        sys.exit(
            f"frameworks/run.py: {entry['url']}: sha256 {digest}, the index says {entry['hashes']['sha256']}"
        )
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(archive.name + ".part")
    partial.write_bytes(data)
    partial.replace(archive)


def unpack(suite: Suite) -> Path:
    """The package's tests/ (and pyproject.toml, its pytest settings), unpacked afresh."""
    sdists = BUILD / "sdist"
    stem = f"{suite.package.replace('-', '_')}-{suite.version}"
    archive = sdists / f"{stem}.tar.gz"
    if not archive.exists():
        download_sdist(suite.package, archive)
    target = BUILD / stem
    shutil.rmtree(target, ignore_errors=True)
    with tarfile.open(archive) as tar:
        wanted = [
            m
            for m in tar.getmembers()
            if m.name.startswith(f"{stem}/tests/") or m.name == f"{stem}/pyproject.toml"
        ]
        tar.extractall(BUILD, members=wanted, filter="data")
    return target


def check_version(suite: Suite) -> None:
    installed = metadata.version(suite.package)
    if installed != suite.version:
        sys.exit(
            f"frameworks/run.py: .venv has {suite.package} {installed}, the suite is pinned "
            f"to {suite.version}: change the pin in frameworks/run.py (and frameworks/expected.py)"
        )


def main(argv: list[str]) -> int:
    extra: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, extra = argv[:at], argv[at + 1 :]
    names = argv or list(SUITES)
    unknown = [n for n in names if n not in SUITES]
    if unknown:
        sys.exit(f"frameworks/run.py: no suite {unknown}; suites: {', '.join(SUITES)}")
    BUILD.mkdir(parents=True, exist_ok=True)
    python = venv()
    failed = []
    for name in names:
        suite = SUITES[name]
        check_version(suite)
        where = unpack(suite)
        env = {**os.environ, **dict(suite.env)}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
        cmd = [
            str(python), "-m", "pytest", "-p", f"plugin_{name}",
            "-c", str(where / "pyproject.toml"), "--rootdir", str(where),
            "-o", "addopts=", "-p", "no:cacheprovider", "-q", "-rfE", "-n", "2",
            "--timeout", "60", "--timeout-method", "thread",
            *[f"tests/{f}" for f in suite.files], *extra,
        ]  # fmt: skip
        print(f"== {suite.package} {suite.version}: {len(suite.files)} test files", flush=True)
        started = time.monotonic()
        code = subprocess.run(cmd, cwd=where, env=env).returncode
        print(f"== {suite.package}: exit {code} in {time.monotonic() - started:.0f} s", flush=True)
        if code != 0:
            failed.append(name)
    if failed:
        print(f"frameworks/run.py: failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
