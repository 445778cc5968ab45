"""Whether a process still runs: the one check behind every owner fleetstore records
(group-commit board slots, sharded intents, spool journals, published figures, doctor).

A PID alone is not enough: PIDs are reused, and a dead process's record would pass for
a live one.  So an owner is recorded as its PID *and* its start time (``/proc/PID/stat``
field 22, clock ticks since boot), and is alive only while a process with that PID
*and* that start time runs.  A record from before start times were kept (a PID only)
gets the PID's answer: alive while any process has that PID, a reused one included.
A zombie (killed, not yet reaped) is dead: it holds nothing and runs nothing.

A process whose ``/proc`` entry cannot be read (another user's, with ``hidepid``) but
that ``kill(pid, 0)`` finds is taken as alive: nothing shows it is a reuse, and taking a
live process's slot or journal is the worse mistake.
"""

from __future__ import annotations

import os


def _stat(pid: int) -> tuple[bytes, int] | None:
    """(state letter, start time) of process *pid*, or None if /proc does not show it."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may contain spaces.
    rest = stat[stat.rfind(b")") + 2 :].split()
    try:
        return rest[0], int(rest[19])
    except (IndexError, ValueError):
        return None


def start_time(pid: int) -> int | None:
    """The start time of process *pid* in clock ticks since boot (None: not known)."""
    found = _stat(pid)
    return None if found is None else found[1]


def alive(pid: object, start: int | None = None, *, bits: int = 0) -> bool:
    """Is the process recorded as (*pid*, *start*) still running?  *start* None: a
    record with a PID only (see the module's doc).  *bits*: only the low *bits* bits of
    the start time were recorded (the board's owner word).  Anything but a positive
    PID (a damaged record) is not alive."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    found = _stat(pid)
    if found is not None:
        state, ticks = found
        if bits:
            ticks &= (1 << bits) - 1
        return state != b"Z" and (start is None or ticks == start)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OverflowError, ValueError):
        return False  # not a PID at all
    return True


def token(pid: int | None = None) -> str:
    """An owner as text, ``PID:START`` (``PID`` if its start time cannot be read);
    default: this process."""
    pid = os.getpid() if pid is None else pid
    start = start_time(pid)
    return f"{pid}" if start is None else f"{pid}:{start}"


def token_alive(text: object) -> bool:
    """Is the owner *text* (``token``: ``PID:START``, or an older ``PID``) alive?"""
    pid_text, _, start_text = str(text).partition(":")
    if not pid_text.isdigit() or not (start_text.isdigit() or not start_text):
        return False
    return alive(int(pid_text), int(start_text) if start_text else None)


__all__ = ["alive", "start_time", "token", "token_alive"]
