"""PostgreSQL's half of notifications (engine/notify.py): a channel heard on a connection
of its own that LISTENs, outside the pool, read by the channel's listener thread.  The
NOTIFY itself goes with the ringing transaction's COMMIT (engine/postgres.py)."""

from __future__ import annotations

import contextlib
import os
import select
from typing import Any

from fleetstore import errors
from fleetstore.core.extras import requires

with requires("postgres", "a PostgreSQL store"):
    import psycopg

#: Connections inherited through fork: never used nor closed by the child (closing
#: would end the parent's session on the shared socket), kept referenced.
_inherited: list[Any] = []


class ListenSource:
    """A channel heard on a connection of its own (``LISTEN``): the listener thread
    waits on its socket and on a pipe that ``interrupt`` writes to."""

    def __init__(self, url: str, channel: str) -> None:
        self._url = url
        self._channel = channel
        self._pid = os.getpid()
        self._conn: psycopg.Connection[Any] | None = None
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)

    def start(self) -> None:
        conn = psycopg.connect(self._url, autocommit=True, connect_timeout=5)
        try:
            conn.execute(f"LISTEN {self._channel}")
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    def wait(self, seconds: float) -> bool:
        if self._conn is None:
            self.start()  # raises while the server is away; the listener tries again
            return True  # a NOTIFY while nobody listened is lost: look again
        try:
            pgconn = self._conn.pgconn
            sock = pgconn.socket
            poller = select.poll()  # (not select(): a descriptor past 1024 is refused)
            poller.register(sock, select.POLLIN)
            poller.register(self._wake_r, select.POLLIN)
            ready = {fd for fd, _ in poller.poll(max(int(seconds * 1000), 0))}
            if self._wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(self._wake_r, 64)
            if sock not in ready:
                return False
            pgconn.consume_input()  # raises once the connection is lost
            heard = False
            while (note := pgconn.notifies()) is not None:
                heard = heard or note.relname.decode() == self._channel
            if pgconn.status != psycopg.pq.ConnStatus.OK:
                raise errors.DatabaseError(f"the connection listening to {self._channel} is lost")
            return heard
        except BaseException:
            self._drop()
            raise

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if os.getpid() != self._pid:
            # A forked child: closing would end the parent's session on the shared socket.
            _inherited.append(conn)
            return
        with contextlib.suppress(Exception):
            conn.close()

    def interrupt(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def stop(self) -> None:
        self._drop()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._wake_r = self._wake_w = -1


__all__ = ["ListenSource"]
