"""The directories fleetstore makes and the database files it opens: a store is one
user's, and nobody else may read it (docs/design.md, "Files and permissions").

* ``private_dirs``: every directory fleetstore makes is 0700, whatever the umask.
  ``os.makedirs(mode=0o700)`` gives that mode to the last directory only; the parents
  it makes follow the umask (0777 under ``umask 000``), and the umask also takes bits
  from the last one (0500 under ``umask 277``).
* ``check_private_file``: a database file that exists must be a regular file of this
  process's user that its group and others can neither read nor write.  Another user
  who could create files in the directory (``/tmp``, a shared project folder) would
  otherwise pre-create a 0666 ``team.db`` and read every session written into it.

tests/store/test_open_hostile.py
"""

from __future__ import annotations

import os
import stat

from fleetstore import errors

#: Permission bits that let the group or others read or write a file.
_SHARED_BITS = stat.S_IRGRP | stat.S_IWGRP | stat.S_IROTH | stat.S_IWOTH


def private_dirs(path: str | os.PathLike[str]) -> None:
    """Make the directory *path* and each missing parent, every one mode 0700 whatever
    the umask; directories that exist are left as they are.  ``FileExistsError`` if
    *path* (or a parent) exists and is not a directory, as ``os.makedirs`` raises."""
    missing: list[str] = []
    here = os.path.abspath(path)
    while not os.path.isdir(here):
        missing.append(here)
        parent = os.path.dirname(here)
        if parent == here:
            break
        here = parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            if not os.path.isdir(directory):
                raise
            continue  # made meanwhile by another process: not ours to change
        # The umask took bits from 0700, never added any: set exactly 0700 on the
        # directory just made (by descriptor: a name swapped meanwhile is not followed).
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.fchmod(fd, 0o700)
        finally:
            os.close(fd)


def check_private_file(path: str, st: os.stat_result) -> None:
    """``UnsafeFile`` unless *st* (``lstat`` or ``fstat`` of the database file *path*)
    is a regular file that this process's user owns and that neither its group nor
    others can read or write.  Root may use another user's file in a directory that
    user owns (root maintaining that user's store), not one in a directory of anyone
    else's (``/tmp``: another user's file there is a plant)."""
    euid = os.geteuid()
    fix = ""
    if stat.S_ISLNK(st.st_mode):
        why = "a symbolic link; open the file it points to"
    elif not stat.S_ISREG(st.st_mode):
        why = f"not a regular file ({_kind(st.st_mode)})"
    elif st.st_uid != euid and (euid != 0 or _directory_owner(path) != st.st_uid):
        why = f"owned by uid {st.st_uid}, not by this process's user (uid {euid})"
        if euid == 0:
            why += f", in a directory that uid {st.st_uid} does not own"
        fix = (
            "; another user may have put it there to read what is written into it. "
            "A store is one user's: run every process that uses it as its owner"
        )
    elif st.st_mode & _SHARED_BITS:
        why = f"{_access(st.st_mode)} (mode {stat.S_IMODE(st.st_mode):04o})"
        fix = (
            "; another user may have made it to read what is written into it, or it "
            "was copied without its mode. If it is yours, `chmod 600` it (and its "
            "-wal and -shm); fleetstore makes its files 0600"
        )
    else:
        return
    raise errors.UnsafeFile(f"{path}: {why}; it was not opened, nothing was changed{fix}")


def _access(mode: int) -> str:
    """What *mode* lets its group and others do, e.g. ``readable by others``."""
    what = " and ".join(
        name
        for name, bits in (
            ("readable", stat.S_IRGRP | stat.S_IROTH),
            ("writable", stat.S_IWGRP | stat.S_IWOTH),
        )
        if mode & bits
    )
    who = " and ".join(
        name
        for name, bits in (
            ("its group", stat.S_IRGRP | stat.S_IWGRP),
            ("others", stat.S_IROTH | stat.S_IWOTH),
        )
        if mode & bits
    )
    return f"{what} by {who}"


def _directory_owner(path: str) -> int:
    try:
        return os.stat(os.path.dirname(os.path.abspath(path))).st_uid
    except OSError:
        return -1


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return f"mode {mode:o}"


__all__ = ["check_private_file", "private_dirs"]
