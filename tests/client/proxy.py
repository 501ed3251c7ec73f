"""A TCP proxy between a client under test and a server, which a test can make
misbehave: drop every open connection, or swallow the next answer after the
server has acted on the request."""

from __future__ import annotations

import socket
import threading

__all__ = ["Proxy"]


class Proxy:
    """Listens on 127.0.0.1 (an ephemeral port) and forwards each connection to
    127.0.0.1:`upstream_port` (changeable with :meth:`retarget`)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self._lsock = socket.create_server(("127.0.0.1", 0))
        self.port = self._lsock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._swallow = 0
        self.swallowed = 0
        self.accepted = 0
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def retarget(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port

    def swallow_next_response(self) -> None:
        """The next chunk the server sends back is dropped and both sides closed."""
        with self._lock:
            self._swallow += 1

    def drop_all(self) -> int:
        """Close every open connection (both sides); returns how many."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for a, b in pairs:
            _kill(a)
            _kill(b)
        return len(pairs)

    def close(self) -> None:
        self._closed = True
        self._lsock.close()
        self.drop_all()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._lsock.accept()
            except OSError:
                return
            try:
                up = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=5)
                up.settimeout(None)
            except OSError:
                _kill(client)
                continue
            with self._lock:
                self._pairs.append((client, up))
                self.accepted += 1
            threading.Thread(target=self._pump, args=(client, up, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, from_server: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if from_server:
                    with self._lock:
                        swallow = self._swallow > 0
                        if swallow:
                            self._swallow -= 1
                            self.swallowed += 1
                    if swallow:
                        break
                dst.sendall(data)
        except OSError:
            pass
        _kill(src)
        _kill(dst)


def _kill(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        s.close()
    except OSError:
        pass
