"""The files beside a store, checked before ``fleetstore.open`` uses any of them.

A store in a directory other users can write would otherwise use what they planted
there as found: a ``<db>.blobs`` symlink into their directory (payloads written there,
and read back from there), a spool journal whose operations the next ``open()``
replays (a ``delete_session`` of theirs), a ``.gate``, ``-wal`` or ``-shm`` of theirs.
Every sidecar that exists must be of the kind expected (a directory or a regular
file, never a symbolic link), belong to this process's user (root: also to the
database file's owner) and be writable by nobody else; each journal in the spool
directory too.  SQLite's own files (``-wal``, ``-shm``, ``-journal``) hold the
database's pages, so, like the database file itself (``Database.open``), nobody else
may read them either.  ``UnsafeSidecar`` names the first that is not, and why.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from fleetstore import errors

_FILES = (".gate",)
#: SQLite's files beside the database: what is written into it passes through them.
_PAGES = ("-wal", "-shm", "-journal")
_DIRS = (".blobs", ".spool", ".procs")


def check_sidecars(db: Path) -> None:
    """``UnsafeSidecar`` if a sidecar of the database file *db* is not safe to use."""
    owners = {os.geteuid()}
    if os.geteuid() == 0:
        try:
            owners.add(os.stat(db).st_uid)
        except OSError:
            pass
    base = str(db)
    for suffix in _DIRS:
        _check(Path(base + suffix), owners, directory=True)
    for suffix in _FILES:
        _check(Path(base + suffix), owners, directory=False)
    for suffix in _PAGES:
        _check(Path(base + suffix), owners, directory=False, private=True)
    spool = Path(base + ".spool")
    try:
        names = sorted(os.listdir(spool))
    except (FileNotFoundError, NotADirectoryError):
        return
    for name in names:
        _check(spool / name, owners, directory=None)


def _check(path: Path, owners: set[int], *, directory: bool | None, private: bool = False) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    kind = "a directory" if directory else "a regular file"
    if stat.S_ISLNK(st.st_mode):
        why = f"a symbolic link (to {os.readlink(path)!r}) where {kind} is expected"
    elif directory is True and not stat.S_ISDIR(st.st_mode):
        why = "not a directory"
    elif directory is False and not stat.S_ISREG(st.st_mode):
        why = "not a regular file"
    elif st.st_uid not in owners:
        why = f"owned by uid {st.st_uid}, not by this process's user (uid {os.geteuid()})"
    elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = "others" if st.st_mode & stat.S_IWOTH else "its group"
        why = f"writable by {who} (mode {stat.S_IMODE(st.st_mode):04o})"
    elif private and st.st_mode & (stat.S_IRGRP | stat.S_IROTH):
        who = "others" if st.st_mode & stat.S_IROTH else "its group"
        why = f"readable by {who} (mode {stat.S_IMODE(st.st_mode):04o})"
    else:
        return
    raise errors.UnsafeSidecar(
        f"{path}: {why}: someone else may have put it there; the store was not opened "
        "(remove or fix it: fleetstore makes these itself, 0600/0700, its owner's)"
    )


__all__ = ["check_sidecars"]
