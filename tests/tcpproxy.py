"""A threaded TCP proxy for fault tests: clients connect to ``127.0.0.1:proxy.port`` and
the proxy forwards every byte to the target and back.

``cut()`` kills every live connection both ways with a reset (``SO_LINGER`` 0, so the
peers see ``ECONNRESET`` at once, not an orderly end); connections made afterwards work
again.  ``pause()`` freezes the network: nothing is forwarded and new connections are
accepted but not connected onward, as behind a partition; ``resume()`` lets everything
through again.  ``close()`` stops the proxy and resets whatever is still connected.

    with TcpProxy("127.0.0.1", 5432) as proxy:
        url = f"postgresql://postgres@127.0.0.1:{proxy.port}/db"
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
from types import TracebackType

_TICK = 0.02  # how often a pump looks at its flags when nothing arrives


def _reset(sock: socket.socket) -> None:
    """Close *sock* with a TCP reset rather than a FIN."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


class _Link:
    """One client connection and its upstream twin, pumped by one thread."""

    def __init__(self, proxy: TcpProxy, client: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.upstream: socket.socket | None = None
        self.cut = threading.Event()
        self.thread = threading.Thread(target=self._run, name="tcpproxy-link", daemon=True)

    def _run(self) -> None:
        try:
            # Paused: hold the client without connecting onward (a partition).
            while not self.proxy._forwarding.wait(_TICK):
                if self.cut.is_set():
                    return
            if self.cut.is_set():
                return
            try:
                self.upstream = socket.create_connection(self.proxy.target, timeout=10)
            except OSError:
                return
            self.upstream.settimeout(None)
            self._pump(self.client, self.upstream)
        finally:
            _reset(self.client)
            if self.upstream is not None:
                _reset(self.upstream)
            self.proxy._forget(self)

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        peer = {a: b, b: a}
        while not self.cut.is_set():
            if not self.proxy._forwarding.is_set():
                self.proxy._forwarding.wait(_TICK)
                continue
            readable, _, _ = select.select([a, b], [], [], _TICK)
            for sock in readable:
                try:
                    data = sock.recv(65536)
                except OSError:
                    return
                if not data:
                    return  # one side ended: end both
                try:
                    peer[sock].sendall(data)
                except OSError:
                    return
                self.proxy._count(len(data))


class TcpProxy:
    """Forward ``127.0.0.1:<port>`` to *host*:*port*; see the module's docstring."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self._listener.settimeout(_TICK * 5)
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._links: set[_Link] = set()
        self._forwarding = threading.Event()
        self._forwarding.set()
        self._closed = threading.Event()
        #: Connections accepted, connections reset by ``cut()``, bytes forwarded.
        self.accepted = 0
        self.cuts = 0
        self.bytes = 0
        self._acceptor = threading.Thread(target=self._accept, name="tcpproxy-accept", daemon=True)
        self._acceptor.start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            link = _Link(self, client)
            with self._lock:
                if self._closed.is_set():
                    _reset(client)
                    return
                self._links.add(link)
                self.accepted += 1
            link.thread.start()

    def _forget(self, link: _Link) -> None:
        with self._lock:
            self._links.discard(link)

    def _count(self, n: int) -> None:
        with self._lock:
            self.bytes += n

    @property
    def live(self) -> int:
        """Connections open through the proxy now."""
        with self._lock:
            return len(self._links)

    def cut(self) -> int:
        """Reset every live connection, both ways; returns how many there were.  Returns
        once they are closed; new connections are forwarded as before."""
        with self._lock:
            links = list(self._links)
            self.cuts += len(links)
        for link in links:
            link.cut.set()
        for link in links:
            link.thread.join(5)
        return len(links)

    def pause(self) -> None:
        """Forward nothing, and connect nothing onward, until ``resume()``."""
        self._forwarding.clear()

    def resume(self) -> None:
        self._forwarding.set()

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        self._acceptor.join(5)
        self._forwarding.set()
        self.cut()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


__all__ = ["TcpProxy"]
