"""The ``fleetstore`` command: help, docs and the ``lock`` contract, with real processes.

Every "outside process" here is a separate child: the test process never opens the
database with a second SQLite library (DESIGN.md, "Two SQLite libraries in one process").
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import fleetstore
from fleetstore.cli.main import main
from fleetstore.cli.util import NotInstalled

ROOT = Path(__file__).resolve().parents[2]
CLI_DOC = ROOT / "docs" / "cli.md"

# A raw apsw writer in its own process: "busy" if BEGIN IMMEDIATE fails at once, "ok" if
# it gets the lock.  busy_timeout 0: the answer is about this instant.
PROBE = """
import sys, apsw
conn = apsw.Connection(sys.argv[1], flags=apsw.SQLITE_OPEN_READWRITE)
conn.set_busy_timeout(0)
try:
    conn.execute("BEGIN IMMEDIATE")
except apsw.BusyError:
    print("busy")
else:
    conn.execute("ROLLBACK")
    print("ok")
"""

MAKE_DB = """
import sys, apsw
conn = apsw.Connection(sys.argv[1])
conn.execute("PRAGMA journal_mode=WAL")
conn.execute("CREATE TABLE t(x)")
conn.close()
"""


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("FLEETSTORE_")}


def commands() -> Iterator[tuple[str, click.Command]]:
    """Every command in the tree, by its full name ("fleetstore", "fleetstore lock", ...)."""

    def walk(name: str, cmd: click.Command) -> Iterator[tuple[str, click.Command]]:
        yield name, cmd
        if isinstance(cmd, click.Group):
            # The groups load their commands lazily: list and get them as click does.
            ctx = click.Context(cmd)
            for sub_name in sorted(cmd.list_commands(ctx)):
                sub = cmd.get_command(ctx, sub_name)
                assert sub is not None, f"{name} lists {sub_name} but cannot load it"
                # stress while fleetstore-stress is not installed (tests/cli/test_plugins.py);
                # installed, its help and docs are checked here too.
                if not isinstance(sub, NotInstalled):
                    yield from walk(f"{name} {sub_name}", sub)

    return walk("fleetstore", main)


COMMANDS = dict(commands())


def options(cmd: click.Command) -> list[click.Option]:
    return [p for p in cmd.params if isinstance(p, click.Option) and not p.hidden]


def doc_section(name: str) -> str:
    """The part of docs/cli.md under the heading "`NAME`", up to the next heading of its level."""
    text = CLI_DOC.read_text(encoding="utf-8")
    match = re.search(rf"^(#+) `{re.escape(name)}`\s*$", text, re.M)
    assert match, f"docs/cli.md has no heading for `{name}`"
    level = len(match[1])
    rest = text[match.end() :]
    end = re.search(rf"^#{{1,{level}}} ", rest, re.M)
    return rest[: end.start()] if end else rest


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleetstore", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=clean_env(),
    )


def probe(path: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(path)],
        capture_output=True,
        text=True,
        timeout=30,
        env=clean_env(),
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def readline(proc: subprocess.Popen[str], timeout: float = 15) -> str:
    """The next stdout line of *proc*, failing the test if none comes in *timeout* seconds."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            pytest.fail(f"no output from {proc.args!r} within {timeout}s")
    return proc.stdout.readline().rstrip("\n")


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    path = tmp_path / "held.db"
    subprocess.run([sys.executable, "-c", MAKE_DB, str(path)], check=True, env=clean_env())
    return path


@pytest.fixture
def lock_proc(db_path: Path) -> Iterator[subprocess.Popen[str]]:
    """`fleetstore lock` holding db_path for a long time; killed at the end whatever happens."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleetstore", "lock", "--store", str(db_path), "--hold", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


# --- help and docs --------------------------------------------------------------------------


def test_version() -> None:
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"fleetstore {fleetstore.__version__}"


def test_python_dash_m_runs_the_cli() -> None:
    done = run_cli("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"fleetstore {fleetstore.__version__}"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_has_help_with_env_vars_and_exit_codes(name: str) -> None:
    cmd = COMMANDS[name]
    result = CliRunner().invoke(main, [*name.split()[1:], "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert cmd.help, f"{name} has no help text"
    assert "Exit codes" in result.output
    for opt in options(cmd):
        if opt.name in ("help", "version"):
            continue
        assert isinstance(opt.envvar, str) and opt.envvar.startswith("FLEETSTORE_"), opt.name
        assert opt.show_envvar, f"{name} {opt.opts[0]}: env var not shown in --help"
        assert opt.envvar in result.output, f"{name} --help does not mention {opt.envvar}"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_and_option_is_in_docs(name: str) -> None:
    cmd = COMMANDS[name]
    # The group's own options (--version) and the common exit codes sit above the sections.
    section = CLI_DOC.read_text(encoding="utf-8") if name == "fleetstore" else doc_section(name)
    assert "Exit code" in section, f"docs/cli.md: no exit codes for {name}"
    for opt in options(cmd):
        if opt.name == "help":
            continue
        longest = max(opt.opts, key=len)
        assert longest in section, f"docs/cli.md: {name} does not document {longest}"
        if isinstance(opt.envvar, str):
            assert opt.envvar in section, f"docs/cli.md: {name} does not name {opt.envvar}"


def test_env_vars_are_read() -> None:
    result = CliRunner(env={"FLEETSTORE_WRITE_BUDGET": "-1"}).invoke(main, ["recover"])
    assert result.exit_code == 2
    assert "FLEETSTORE_WRITE_BUDGET" in result.output


# --- lock -----------------------------------------------------------------------------------


def test_lock_on_a_missing_file_exits_2_and_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "absent.db"
    done = run_cli("lock", "--store", str(missing), "--hold", "1")
    assert done.returncode == 2
    assert str(missing) in done.stderr and "never creates" in done.stderr
    assert done.stdout == ""
    assert list(tmp_path.iterdir()) == []


def test_lock_on_a_file_that_is_not_a_database_exits_1(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_text("not a database, just text " * 100)
    done = run_cli("lock", "--store", str(junk), "--hold", "1")
    assert done.returncode == 1
    assert "not a database" in done.stderr


@pytest.mark.timing
@pytest.mark.slow
def test_lock_holds_the_write_lock_until_it_says_released(db_path: Path) -> None:
    assert probe(db_path) == "ok"
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleetstore", "lock", "--store", str(db_path), "--hold", "1.5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )
    try:
        assert readline(proc) == f"locked {db_path} pid={proc.pid}"
        assert probe(db_path) == "busy"
        released = readline(proc)
        assert re.fullmatch(rf"released {re.escape(str(db_path))} after \d+\.\d\ds", released)
        held = float(released.rsplit(" ", 1)[1].rstrip("s"))
        assert 1.5 <= held < 5
        assert proc.wait(15) == 0
        assert probe(db_path) == "ok"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_releases_the_lock_early_with_exit_0(
    db_path: Path, lock_proc: subprocess.Popen[str], sig: signal.Signals
) -> None:
    assert readline(lock_proc).startswith(f"locked {db_path} pid=")
    assert probe(db_path) == "busy"
    sent = time.monotonic()
    lock_proc.send_signal(sig)
    assert readline(lock_proc).startswith(f"released {db_path} after ")
    assert lock_proc.wait(15) == 0
    assert time.monotonic() - sent < 5  # not the 60 s hold
    assert probe(db_path) == "ok"


def test_lock_not_taken_within_wait_exits_3_naming_the_holder(
    db_path: Path, lock_proc: subprocess.Popen[str]
) -> None:
    assert readline(lock_proc).startswith("locked ")
    started = time.monotonic()
    done = run_cli("lock", "--store", str(db_path), "--hold", "1", "--wait", "0.3")
    assert done.returncode == 3
    assert time.monotonic() - started < 10
    assert done.stdout == ""
    assert "not taken within 0.3s" in done.stderr
    if sys.platform.startswith("linux"):
        assert f"pid {lock_proc.pid}" in done.stderr


def test_lock_waits_for_an_outside_holder_then_takes_the_lock(
    db_path: Path, lock_proc: subprocess.Popen[str]
) -> None:
    assert readline(lock_proc).startswith("locked ")
    second = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fleetstore",
            "lock",
            "--store",
            str(db_path),
            "--hold",
            "0",
            "--exclusive",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )
    try:
        time.sleep(0.5)
        assert second.poll() is None  # still waiting
        lock_proc.send_signal(signal.SIGTERM)
        assert readline(second).startswith(f"locked {db_path} pid={second.pid}")
        assert second.wait(15) == 0
    finally:
        if second.poll() is None:
            second.kill()
        second.communicate()
