"""The two conventions every ``fleetstore`` command keeps, over the whole parser: the
store is ``--store PATH`` (else the group's ``--store``, else ``$FLEETSTORE_URL``),
and ``--json`` prints one of two shapes (JSON lines for a list, one object otherwise).

Issue 28: three ways to name the store (``doctor/top/recover [PATH]``, ``maintain
PATH`` and ``lock PATH`` ignoring ``$FLEETSTORE_URL``, ``--store`` elsewhere), eight
commands without ``--json``, and shapes that varied.  A new command fails here until
it keeps both.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import fleetstore
from fleetstore.cli.main import main
from fleetstore.cli.util import NotInstalled

#: Commands that take two stores name both as arguments (SRC... DST): neither is "the
#: store", and a copy's direction is never taken from the environment.
TWO_STORES = {"merge", "migrate", "reshard"}
#: stress runs against a target of its own (--url, default a fresh store): a benchmark
#: writing thousands of sessions never goes to $FLEETSTORE_URL's store unless named.
OWN_TARGET = {"stress"}


def leaves() -> dict[str, click.Command]:
    found: dict[str, click.Command] = {}

    def walk(name: str, cmd: click.Command) -> Iterator[None]:
        if isinstance(cmd, click.Group):
            ctx = click.Context(cmd)
            for sub_name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, sub_name)
                assert sub is not None, f"{name} {sub_name} cannot be loaded"
                # stress while fleetstore-stress is not installed (tests/cli/test_plugins.py).
                if not isinstance(sub, NotInstalled):
                    yield from walk(f"{name} {sub_name}".strip(), sub)
        else:
            found[name] = cmd
            yield

    list(walk("", main))
    return found


LEAVES = leaves()


def help_text(name: str) -> str:
    done = CliRunner().invoke(main, [*name.split(), "--help"], terminal_width=200)
    assert done.exit_code == 0, done.output
    return done.output


def test_the_walk_finds_every_command() -> None:
    assert len(LEAVES) >= 20
    assert {"doctor", "lock", "maintain", "sessions list", "effects enqueue", "worker"} <= set(
        LEAVES
    )


@pytest.mark.parametrize("name", sorted(LEAVES))
def test_every_command_names_its_store_with_store_and_honours_fleetstore_url(name: str) -> None:
    cmd = LEAVES[name]
    store = [p for p in cmd.params if p.name == "store"]
    if name in TWO_STORES | OWN_TARGET:
        assert store == [], f"{name} names its stores otherwise; see this file's sets"
        return
    assert len(store) == 1, f"{name} has no --store (cli/util.store_params)"
    (opt,) = store
    assert isinstance(opt, click.Option)
    assert opt.opts == ["--store"] and opt.envvar == "FLEETSTORE_URL" and opt.show_envvar
    shown = help_text(name)
    assert "--store PATH" in shown and "FLEETSTORE_URL" in shown
    # A positional store is only the deprecated spelling of the commands that had one.
    positional = [p.name for p in cmd.params if isinstance(p, click.Argument)]
    assert "legacy_path" not in positional or name in {
        "doctor",
        "lock",
        "maintain",
        "recover",
        "top",
    }


@pytest.mark.parametrize("name", sorted(LEAVES))
def test_every_command_has_json_in_one_of_the_two_shapes(name: str) -> None:
    flags = [p for p in LEAVES[name].params if isinstance(p, click.Option) and "--json" in p.opts]
    assert len(flags) == 1, f"{name} has no --json (cli/util.json_option)"
    (flag,) = flags
    assert flag.name == "as_json" and flag.is_flag
    assert isinstance(flag.help, str)
    assert flag.help.startswith(
        ("JSON lines on stdout, one object per ", "One JSON object on stdout")
    ), f"{name} --json: {flag.help!r}"
    assert flag.help.split(",")[0].split(" instead")[0] in " ".join(help_text(name).split())


# --- which store: one resolution for every command ---------------------------------------


@pytest.fixture
def two_stores(tmp_path: Path) -> tuple[str, str]:
    stores = []
    for name in ("a", "b"):
        path = tmp_path / f"{name}.db"
        with fleetstore.open(path) as opened:
            opened.effects.enqueue("th", name, None)
        stores.append(str(path))
    return stores[0], stores[1]


def kinds(output: str) -> list[str]:
    return [json.loads(line)["kind"] for line in output.splitlines()]


def run(args: list[str], env: dict[str, str] | None = None) -> tuple[int, str, str]:
    done = CliRunner(env=env).invoke(main, args)
    return done.exit_code, done.stdout, done.stderr


def test_store_on_the_command_beats_the_group_beats_fleetstore_url(
    two_stores: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = two_stores
    monkeypatch.delenv("FLEETSTORE_URL", raising=False)
    url = {"FLEETSTORE_URL": a}
    assert kinds(run(["effects", "list", "--json"], url)[1]) == ["a"]
    assert kinds(run(["effects", "list", "--json", "--store", b], url)[1]) == ["b"]
    assert kinds(run(["--store", b, "effects", "list", "--json"], url)[1]) == ["b"]
    assert kinds(run(["--store", a, "effects", "list", "--json", "--store", b])[1]) == ["b"]


def test_the_old_positional_store_still_works_deprecated(two_stores: tuple[str, str]) -> None:
    a, b = two_stores
    code, out, err = run(["recover", a, "--json"])
    assert code == 0 and json.loads(out)["store"] == a
    assert "deprecated" in err and f"--store {a}" in err
    # Named twice, differently: refused before anything runs.
    code, _, err = run(["recover", a, "--store", b])
    assert code == 2 and "named twice" in err


def test_lock_and_maintain_honour_fleetstore_url(tmp_path: Path) -> None:
    """They required PATH and ignored $FLEETSTORE_URL: now they find the store there."""
    path = tmp_path / "s.db"
    with fleetstore.open(path) as opened:
        opened.sessions.create(title="t")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSTORE_")}
    env["FLEETSTORE_URL"] = str(path)
    for args in (["lock", "--hold", "0", "--json"], ["maintain", "--dry-run", "--json"]):
        done = subprocess.run(
            [sys.executable, "-m", "fleetstore", *args],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert done.returncode == 0, done.stderr
        first = json.loads(done.stdout.splitlines()[0])
        assert first.get("path") == str(path) or first.get("event") == "locked", first


def test_the_groups_store_before_a_command_without_one_is_bad_usage(
    two_stores: tuple[str, str], tmp_path: Path
) -> None:
    a, _ = two_stores
    code, _, err = run(["--store", a, "migrate", a, str(tmp_path / "c.db")])
    assert code == 2 and "does not take --store" in err
    assert not (tmp_path / "c.db").exists()


# --- the shapes, printed ----------------------------------------------------------------


def cli(*args: str, cwd: Path | None = None) -> list[dict[str, object]]:
    """Run the command in a process of its own; its stdout as JSON lines (each line one
    object, or the test fails)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSTORE_")}
    done = subprocess.run(
        [sys.executable, "-m", "fleetstore", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=cwd,
    )
    assert done.returncode == 0, (args, done.stderr)
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert all(isinstance(line, dict) for line in lines), done.stdout
    return lines


@pytest.mark.slow
def test_the_commands_that_had_no_json_print_the_documented_shapes(tmp_path: Path) -> None:
    """The eight commands issue 28 found without --json: export, import, merge, lock,
    worker, effects enqueue/cancel/retry, sessions rm."""
    (tmp_path / "jh.py").write_text("HANDLERS = {'k': lambda effect: {'done': True}}\n")
    db, other, merged = (str(tmp_path / n) for n in ("s.db", "o.db", "m.db"))
    with fleetstore.open(db) as opened:
        session = opened.sessions.create(title="t")
        opened.messages.append(session.id, "user", "hi")

    (effect,) = cli("effects", "enqueue", "th", "k", '{"n": 1}', "--store", db)
    assert effect["state"] == "pending" and effect["payload"] == {"n": 1}
    (cancelled,) = cli("effects", "cancel", str(effect["id"]), "--store", db)
    assert cancelled["state"] == "cancelled"
    (retried,) = cli("effects", "retry", str(effect["id"]), "--store", db)
    assert retried["state"] == "pending"
    started, ran = cli("worker", "jh:HANDLERS", "--store", db, "--until-idle", cwd=tmp_path)
    assert started["event"] == "started" and started["kinds"] == {
        "k": {
            "replay_safe": True,
            "timeout": 600.0,
            "backoff": 1.0,
            "max_backoff": 300.0,
            "max_attempts": None,
        }
    }
    assert ran["event"] == "stopped" and ran["exit_code"] == 0
    assert ran["stats"]["succeeded"] == 1  # type: ignore[index]

    (exported,) = cli("export", "-o", str(tmp_path / "e.zst"), "--store", db)
    assert exported["sessions"] == 1 and exported["messages"] == 1
    (imported,) = cli("import", str(tmp_path / "e.zst"), "--store", other)
    assert imported["sessions"] == 1 and imported["inserted"] == 2
    (report,) = cli("merge", db, other, merged)
    assert report["ok"] is True and report["sessions"] == 2

    (removed,) = cli("sessions", "rm", session.id, "--yes", "--store", db)
    assert removed == {"id": session.id, "sessions": 1, "messages": 1, "states": 0}
    locked, released = cli("lock", "--store", db, "--hold", "0")
    assert locked["event"] == "locked" and released["event"] == "released"
