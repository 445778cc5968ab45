"""Notifications between processes: a write transaction rings a channel
(``tx.notify(channel)``), and whoever waits on that channel, in any process, wakes once
the transaction has committed.  The engine knows channels by name only; what a ring
means is decided above (the outbox rings ``fleetstore_effects`` where an effect becomes
claimable: domain/outbox.py).

A ring is a hint, not a message: a waiter that wakes looks for what it waits for and
may find nothing (two channels share a word; an item of a group commit that rang was
rolled back alone).  What is promised is that no ring is lost between a look and the
wait that follows it, and that nobody is woken before the ringing commit is visible:

    token = db.notify_token(channel)          # first
    ... look (a read) ...
    db.notify_wait(channel, timeout, token)   # returns at once if rung since the token

SQLite: each channel rings one of ``NOTIFY_WORDS`` futex words in the gate file's header
page (engine/gate.py's layout), the one its name hashes to.  A transaction that rang
writes, after its COMMIT returned, a value of its process's own to each of its channels'
words (never an increment of the shared value, which another process's could undo: see
``WriterGate._ring``), then FUTEX_WAKEs every sleeper on it.  A group-commit holder's
transaction carries the rings of the items it applied for other processes, so they
ring after the holder's COMMIT.  PostgreSQL (engine/postgres.py): ``NOTIFY`` inside the
transaction, which the server delivers at commit.

A process hears a channel through one listener thread, started by the first token,
wait or subscription: it sleeps on the word (SQLite) or on its ``LISTEN`` connection
(PostgreSQL) and counts the rings it hears.  Threads of the process that wait compare
that count with their token (a condition variable); subscribers (a worker's event loop)
are called back.  So the threads of one process share one wait, and an idle process
costs one thread asleep in the kernel.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any, Protocol

from fleetstore import errors
from fleetstore.core.validate import check_int, check_timeout
from fleetstore.engine.gate import (
    _FUTEX_WAKE,
    _SYS_FUTEX,
    NOTIFY_AT,
    NOTIFY_WORDS,
    WriterGate,
    _syscall,
    _Timespec,
    futex_available,
    futex_wait,
    futex_wake,
)

log = logging.getLogger("fleetstore")

#: A channel name: what PostgreSQL's NOTIFY takes unquoted, at most 63 characters.
_CHANNEL = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_checked: set[str] = set()
#: A listener thread looks again at least this often (nothing depends on it: a close
#: wakes it; it only bounds a thread left behind by a failure nobody saw).
LISTEN_NAP = 5.0
#: After a listener failed (its connection lost), how long before it tries again.
RETRY_PAUSE = 0.25


def check_channel(channel: object) -> str:
    """*channel* if it is a channel name (``InvalidInput`` otherwise)."""
    if channel.__class__ is str and channel in _checked:
        return channel
    if not isinstance(channel, str) or not _CHANNEL.fullmatch(channel):
        raise errors.InvalidInput(
            f"a channel is a name of lowercase letters, digits and _ (at most 63, not "
            f"starting with a digit), not {channel!r:.80}"
        )
    _checked.add(channel)
    return channel


def word_of(channel: str) -> int:
    """The index of the notification word *channel* rings (SQLite)."""
    return zlib.crc32(channel.encode()) % NOTIFY_WORDS


class Source(Protocol):
    """How one process hears one channel: the engine's half of a ``Hearing``."""

    def start(self) -> None:
        """Begin hearing, in the caller's thread: every ring after this returns is
        heard by the ``wait`` calls that follow."""
        ...

    def wait(self, seconds: float) -> bool:
        """Block (the listener thread only) until a ring (True) or *seconds* (False).
        A failure is raised; the listener then counts a ring (one may be lost)."""
        ...

    def interrupt(self) -> None:
        """Make a ``wait`` under way return soon (``close``)."""
        ...

    def stop(self) -> None:
        """Release what the source holds; after its thread ended."""
        ...


class Hearing:
    """One channel as this process hears it: the rings counted by a listener thread,
    the threads that wait on the count, and the subscribers called back."""

    def __init__(self, channel: str, source: Source) -> None:
        self.channel = channel
        self._source = source
        self._cond = threading.Condition(threading.Lock())
        self._count = 0
        self._thread: threading.Thread | None = None
        self._closed = False
        self._stopping = threading.Event()
        #: Per thread: the count as of its last token or wait (a wait without a token).
        self._seen = threading.local()
        self._subscribers: list[Callable[[], None]] = []

    def _started(self) -> None:
        """Start hearing, if not yet (``_cond`` held)."""
        if self._thread is not None or self._closed:
            return
        try:
            self._source.start()
        except Exception as exc:
            # (PostgreSQL without a connection now.)  The thread tries again, and
            # counts a ring once it hears: a waiter looks again then.
            log.info("notifications of %s: not heard yet: %s", self.channel, exc)
            self._count += 1
        self._thread = threading.Thread(
            target=self._listen, name=f"fleetstore-listen-{self.channel}", daemon=True
        )
        self._thread.start()

    def token(self) -> int:
        """The count of rings heard so far: take it before looking."""
        with self._cond:
            self._started()
            self._seen.count = self._count
            return self._count

    def wait(self, token: int | None, timeout: float) -> bool:
        """Wait until a ring after *token* is heard, at most *timeout* seconds; True if
        one was.  Without a token: a ring since this thread's last ``token`` or
        ``wait`` (its last look), or, in a thread that never took one, from now."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._started()
            if token is None:
                token = getattr(self._seen, "count", self._count)
            try:
                while self._count == token:
                    left = deadline - time.monotonic()
                    if left <= 0 or self._closed:
                        return False
                    self._cond.wait(left)
                return True
            finally:
                self._seen.count = self._count

    def subscribe(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Call *fn* (in the listener thread: it must be quick) after each ring heard
        from now on; returns the function that stops it."""
        with self._cond:
            self._started()
            self._subscribers = [*self._subscribers, fn]

        def unsubscribe() -> None:
            with self._cond:
                self._subscribers = [f for f in self._subscribers if f is not fn]

        return unsubscribe

    def _listen(self) -> None:
        failures = 0
        while not self._closed:
            try:
                rung = self._source.wait(LISTEN_NAP)
            except Exception as exc:
                # (PostgreSQL: the connection lost.)  Heard again once it is back, and
                # then counted as a ring: whatever came meanwhile is looked for.
                if self._closed:
                    return
                failures += 1
                (log.warning if failures == 1 else log.debug)(
                    "notifications of %s: %s (listening again)", self.channel, exc
                )
                self._stopping.wait(min(RETRY_PAUSE * 2 ** min(failures - 1, 5), 5.0))
                continue
            failures = 0
            if rung and not self._closed:
                with self._cond:
                    self._count += 1
                    self._cond.notify_all()
                    subscribers = self._subscribers
                for fn in subscribers:
                    try:
                        fn()
                    except Exception as exc:
                        log.error("notifications of %s: a subscriber failed: %s", self.channel, exc)

    def forget(self) -> None:
        """In a forked child, where its thread does not exist: release the source."""
        self._closed = True
        self._source.stop()

    def close(self) -> None:
        """Stop the listener (waiters return False) and release the source."""
        with self._cond:
            self._closed = True
            self._stopping.set()
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            # Again until it is out: a wake-up that comes just before the thread goes
            # to sleep again wakes nobody.
            deadline = time.monotonic() + LISTEN_NAP + 1.0
            while thread.is_alive() and time.monotonic() < deadline:
                self._source.interrupt()
                thread.join(0.05)
        self._source.stop()


class _Word:
    """A notification word of the gate file, mapped (the views dropped before the gate
    unmaps the file: ``Notifier.close``)."""

    __slots__ = ("addr", "view")

    def __init__(self, mapping: Any, index: int) -> None:
        self.view = ctypes.c_uint32.from_buffer(mapping, NOTIFY_AT + 4 * index)
        self.addr = ctypes.c_void_p(ctypes.addressof(self.view))


class _WordSource:
    """A SQLite channel heard from its futex word.  It keeps the word's address, not a
    view of the mapping: in a forked child the parent's listener thread is gone but its
    frames may stay referenced, and a view there would keep the gate file from being
    unmapped (``BufferError``).  Its thread is joined before the gate unmaps the file."""

    def __init__(self, word: _Word) -> None:
        self._addr: ctypes.c_void_p | None = ctypes.c_void_p(word.addr.value)
        self._seen = 0
        self._spec = _Timespec(0, 0)

    def _value(self) -> int:
        assert self._addr is not None and self._addr.value is not None
        return ctypes.c_uint32.from_address(self._addr.value).value

    def start(self) -> None:
        self._seen = self._value()

    def wait(self, seconds: float) -> bool:
        addr = self._addr
        if addr is None:
            return False
        futex_wait(addr, self._seen, seconds, self._spec)
        if self._addr is None:
            return False  # stopped while it slept (close): the mapping may be going
        now = self._value()
        if now == self._seen:
            return False
        self._seen = now
        return True

    def interrupt(self) -> None:
        # Every sleeper on the word wakes (other processes' listeners too, once: they
        # find the value unchanged and sleep again); ours sees that it is closed.
        if self._addr is not None:
            futex_wake(self._addr, 0x7FFFFFFF)

    def stop(self) -> None:
        self._addr = None


class Notifier:
    """A SQLite database's notifications in this process: rings after COMMIT, and one
    ``Hearing`` per channel listened to.  Without a futex or a mapped gate file nothing
    rings and a wait sleeps its timeout (``available`` is False)."""

    def __init__(self, gate: WriterGate) -> None:
        self._gate = gate
        self._lock = threading.Lock()
        self._words: dict[str, _Word] = {}
        self._hearings: dict[str, Hearing] = {}
        # Each ring writes a value of this process's own (see the module doc).
        self._value = (os.getpid() * 2654435761 + 0x9E3779B9) & 0xFFFFFFFF
        self.available = gate.mapping is not None and futex_available()

    def _word(self, channel: str) -> _Word | None:
        word = self._words.get(channel)
        if word is None and self.available:
            mapping = self._gate.mapping
            if mapping is None:
                return None
            with self._lock:
                word = self._words.get(channel)
                if word is None:
                    word = self._words[channel] = _Word(mapping, word_of(channel))
        return word

    def ring(self, channels: set[str]) -> None:
        """After a COMMIT that rang *channels*: write each word, wake its sleepers."""
        if not self.available:
            return
        for channel in channels:
            word = self._words.get(channel) or self._word(channel)
            if word is None:
                continue
            self._value = value = (self._value + 1) & 0xFFFFFFFF
            word.view.value = value
            # Every sleeper: at most one listener thread per process sleeps on a word.
            _syscall(_SYS_FUTEX, word.addr, _FUTEX_WAKE, 0x7FFFFFFF, None, None, 0)  # type: ignore[misc]

    def hearing(self, channel: str) -> Hearing | None:
        """This process's ``Hearing`` of *channel* (None: nothing can be heard)."""
        hearing = self._hearings.get(channel)
        if hearing is None:
            word = self._word(channel)
            if word is None:
                return None
            with self._lock:
                hearing = self._hearings.get(channel)
                if hearing is None:
                    hearing = self._hearings[channel] = Hearing(channel, _WordSource(word))
        return hearing

    def close(self) -> None:
        """Stop every listener and drop every view of the mapping (before the gate
        unmaps it: a view left would make that fail, a thread left asleep on a word
        would touch unmapped memory when it woke)."""
        with self._lock:
            hearings = list(self._hearings.values())
            self._hearings.clear()
        for hearing in hearings:
            hearing.close()
        self.forget()

    def forget(self) -> None:
        """In a forked child (no listener thread exists here): drop the views."""
        self.available = False
        with self._lock:
            hearings = list(self._hearings.values())
            self._hearings.clear()
            self._words.clear()
        for hearing in hearings:
            hearing.forget()


class Notifications:
    """``Database``'s notifications (engine/sqlite.py): a mixin, the attributes are
    Database's."""

    _notifier: Notifier

    def _check_process(self) -> None: ...

    @property
    def notifies(self) -> bool:
        """Whether a ring of another process wakes ``notify_wait`` (a futex word in the
        gate file); else (no futex, an unmapped gate file) a wait sleeps its timeout."""
        return self._notifier.available

    def _hearing(self, channel: str) -> Hearing | None:
        check_channel(channel)
        self._check_process()
        return self._notifier.hearing(channel)

    def notify_token(self, channel: str) -> int:
        """The token of ``notify_wait``: take it before looking for what a ring of
        *channel* announces, so that a ring between the look and the wait is not lost."""
        hearing = self._hearing(channel)
        return 0 if hearing is None else hearing.token()

    def notify_wait(self, channel: str, timeout: float, token: int | None = None) -> bool:
        """Wait up to *timeout* seconds for a ring of *channel* after *token* (from
        ``notify_token``; None: rings since this thread's last look), by any process's
        committed ``tx.notify``; True if one came.  Where nothing can be heard
        (``notifies`` False) it sleeps the timeout and returns False."""
        check_timeout(timeout)
        if token is not None:
            check_int(token, "token", minimum=0)
        hearing = self._hearing(channel)
        if hearing is None:
            time.sleep(timeout)
            return False
        return hearing.wait(token, timeout)

    def listen(self, channel: str, fn: Callable[[], None]) -> Callable[[], None]:
        """Call *fn* (in a listener thread: it must return quickly) after each ring of
        *channel* heard from now on; returns the function that stops it.  Nothing is
        ever called where nothing can be heard (``notifies`` False)."""
        if not callable(fn):
            raise errors.InvalidInput(f"fn must be callable, not {fn!r:.80}")
        hearing = self._hearing(channel)
        if hearing is None:
            return lambda: None
        return hearing.subscribe(fn)


__all__ = [
    "LISTEN_NAP",
    "Hearing",
    "Notifications",
    "Notifier",
    "Source",
    "check_channel",
    "word_of",
]
