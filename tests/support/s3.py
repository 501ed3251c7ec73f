"""A local S3-compatible server for tests: moto's standalone server on 127.0.0.1.

:func:`moto_s3` starts one on an ephemeral port, makes the buckets asked for and
sets the standard `AWS_*` variables (endpoint, region, credentials) for as long
as it runs, so both this process and servers or Spark jobs it starts reach it.
"""

from __future__ import annotations

import os
import re
import socket
import threading
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

AWS_TEST_ENV = {
    "AWS_REGION": "us-east-1",
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
}


def make_bucket(endpoint: str, bucket: str) -> None:
    """Create `bucket` on the server at `endpoint` (an `http://host:port` url)."""
    req = urllib.request.Request(f"{endpoint}/{bucket}", method="PUT")
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.status == 200


@contextmanager
def moto_s3(*buckets: str) -> Iterator[str]:
    """A moto S3 server with `buckets` made; yields its endpoint url (AWS_* set meanwhile)."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("AWS_ENDPOINT_URL", url)
            for k, v in AWS_TEST_ENV.items():
                mp.setenv(k, v)
            for b in buckets:
                make_bucket(url, b)
            yield url
    finally:
        server.stop()


def s3_env(endpoint: str) -> dict[str, str]:
    """The `AWS_*` variables a child process needs to reach `endpoint`."""
    return {**os.environ, "AWS_ENDPOINT_URL": endpoint, **AWS_TEST_ENV}


def pump(
    src: socket.socket, dst: socket.socket, seen: Callable[[bytes], None] | None = None
) -> None:
    """Copy bytes from `src` to `dst` until `src` ends (then half-close `dst`),
    handing each chunk to `seen` first."""
    try:
        while chunk := src.recv(65536):
            if seen is not None:
                seen(chunk)
            dst.sendall(chunk)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


class CountingProxy:
    """A TCP forwarder that counts the bytes each way and keeps what clients sent."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.removeprefix("http://").split(":")
        self.upstream = (host, int(port))
        self.lock = threading.Lock()
        self.down = 0  # bytes from the server to the client
        self.sent: list[bytearray] = []  # what the clients sent, per connection
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            self.conns += [client, server]
            up = bytearray()
            with self.lock:
                self.sent.append(up)
            threading.Thread(target=self._pump, args=(client, server, up), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, None), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, up: bytearray | None) -> None:
        def seen(chunk: bytes) -> None:
            with self.lock:
                if up is not None:
                    up.extend(chunk)
                else:
                    self.down += len(chunk)

        pump(src, dst, seen)

    def requests(self) -> list[str]:
        """Request lines seen so far ("GET /bucket/key")."""
        line = re.compile(rb"(?m)^(GET|HEAD|PUT|DELETE|POST) (\S+) HTTP/1\.1\r$")
        with self.lock:
            heads = [h for up in self.sent for h in line.findall(up)]
        return [f"{m.decode()} {p.decode()}" for m, p in heads]

    def sent_bytes(self) -> bytes:
        with self.lock:
            return b"".join(self.sent)

    def reset(self) -> None:
        with self.lock:
            self.down = 0
            for up in self.sent:
                up.clear()

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept() thread
        except OSError:
            pass
        self.sock.close()
        for c in self.conns:
            c.close()


class FaultProxy:
    """A TCP forwarder in front of an S3 endpoint that can be told to misbehave.

    `mode`: "pass" forwards; "500" answers every request on a new connection with
    `500 Internal Server Error`; "hang" accepts and never answers. Setting a mode
    closes the connections open so far, so clients reconnect and see it at once.
    """

    def __init__(self, upstream: str) -> None:
        import socket
        import threading

        host, port = upstream.removeprefix("http://").split(":")
        self.upstream = (host, int(port))
        self._mode = "pass"
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, value: str) -> None:
        assert value in ("pass", "500", "hang")
        with self._lock:
            self._mode = value
            conns, self._conns = self._conns, []
        for c in conns:
            try:
                c.close()
            except OSError:
                pass

    def _accept(self) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            with self._lock:
                mode = self._mode
                self._conns.append(client)
            if mode == "hang":
                continue
            if mode == "500":
                threading.Thread(target=self._fail, args=(client,), daemon=True).start()
                continue
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns.append(server)
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client), daemon=True).start()

    @staticmethod
    def _fail(client: object) -> None:
        import socket

        assert isinstance(client, socket.socket)
        body = b"<Error><Code>InternalError</Code></Error>"
        try:
            while True:
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = client.recv(65536)
                    if not chunk:
                        return
                    head += chunk
                client.sendall(
                    b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: %d\r\n\r\n%s"
                    % (len(body), body)
                )
        except OSError:
            pass

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        pump(src, dst)

    def close(self) -> None:
        import socket

        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self.mode = "pass"
