"""ObjectSegmentStore (the s3:// cold tier) against a local S3-compatible server.

A moto server runs in this process on 127.0.0.1 (an ephemeral port) for the
module. A counting TCP proxy in front of it shows what goes over the wire
(ranged GETs, requests saved by the cache); tiny local stubs play a store
that answers 500 or 403, hangs, or is gone.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from tests.support.s3 import CountingProxy, moto_s3
from tests.support.segreader import SegmentReader, sealed_parts

from topics.storage.fs import RealFs
from topics.storage.objstore import (
    ColdStoreError,
    ObjectColdRoot,
    ObjectSegmentStore,
    RangeCache,
    is_object_url,
    shared_range_cache,
)
from topics.storage.segment import SegmentRangeError, segment_paths
from topics.storage.segstore import SegmentPart, SegmentStore

# A moto server and a proxy per module, sixteen tests over HTTP: the full tier's.
pytestmark = [pytest.mark.slow]

DATA, IDX = SegmentPart.DATA, SegmentPart.IDX
BUCKET = "cold-bucket"


# -- servers ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    """A moto S3 server on an ephemeral port, with the bucket made and AWS_* set."""
    with moto_s3(BUCKET) as url:
        yield url


@pytest.fixture
def proxy(endpoint: str) -> Iterator[CountingProxy]:
    p = CountingProxy(endpoint)
    try:
        yield p
    finally:
        p.close()


class Stub(BaseHTTPRequestHandler):
    """Answers every request with the server's `code` (or never answers when `hang`)."""

    def _answer(self) -> None:
        srv = self.server
        assert isinstance(srv, StubServer)
        with srv.lock:
            srv.hits += 1
        body = b"<Error><Code>Stub</Code></Error>"
        self.send_response(srv.code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_HEAD = do_PUT = do_DELETE = do_POST = _answer

    def log_message(self, format: str, *args: object) -> None:
        pass


class StubServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, code: int) -> None:
        super().__init__(("127.0.0.1", 0), Stub)
        self.code = code
        self.hits = 0
        self.lock = threading.Lock()
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, args=(0.02,), daemon=True).start()

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


# -- helpers ----------------------------------------------------------------------

_topic = iter(range(1, 1 << 30))


def fresh(
    endpoint: str | None = None, *, cache: RangeCache | None = None, **kw: int
) -> ObjectSegmentStore:
    """A store for a topic no other test uses (own cache unless given), via `endpoint` if set."""
    root = ObjectColdRoot(
        f"s3://{BUCKET}/cold/",
        cache=cache if cache is not None else RangeCache(1 << 20),
        config={"endpoint": endpoint} if endpoint else None,
        **kw,
    )
    return root.store(next(_topic))


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port: int = s.getsockname()[1]
    s.close()
    return port


# -- the protocol round trip ----------------------------------------------------------


def test_url_parsing_and_layout(endpoint: str) -> None:
    assert is_object_url("s3://b/p") and not is_object_url("/var/cold")
    with pytest.raises(ValueError):
        ObjectColdRoot("/var/cold")
    with pytest.raises(ValueError):
        ObjectColdRoot("s3:///prefix")
    root = ObjectColdRoot("s3://b/some/prefix/", cache=RangeCache(0))
    assert (root.bucket, root.prefix, root.url) == ("b", "some/prefix", "s3://b/some/prefix")
    store: SegmentStore = root.store(0xAB)
    assert isinstance(store, ObjectSegmentStore)
    # the local cold dir's names (segment.py), under the prefix
    assert store.key(42, DATA) == "topics/00000000000000ab/seg-0000000000000042.data"
    assert store.key(42, IDX) == "topics/00000000000000ab/seg-0000000000000042.idx"
    assert store.url == "s3://b/some/prefix/topics/00000000000000ab"


def test_put_list_exists_len_read_delete(endpoint: str, tmp_path: Path) -> None:
    store = fresh()
    data, idx = sealed_parts(tmp_path, 101, 3)
    assert store.list() == [] and not store.exists(101, DATA)
    store.put(101, data, idx)
    store.put(1, b"d" * 50, b"i" * 20)
    assert store.list() == [1, 101]
    assert store.exists(101, DATA) and store.exists(101, IDX) and not store.exists(7, DATA)
    assert store.len(101, DATA) == len(data) and store.len(101, IDX) == len(idx) == 60
    assert store.read_range(101, IDX, 0, 60) == idx
    assert store.read_range(101, DATA, 5, 10) == data[5:15]
    assert store.read_range(101, DATA, len(data), 0) == b""
    # the bytes that come back are a readable segment
    out = tmp_path / "back"
    out.mkdir()
    p = segment_paths(str(out), 101)
    Path(p.data).write_bytes(store.read_range(101, DATA, 0, store.len(101, DATA)))
    Path(p.idx).write_bytes(store.read_range(101, IDX, 0, store.len(101, IDX)))
    with SegmentReader(RealFs(), str(out), 101) as r:
        assert r.verify() == 3
    # the keys are the local layout under the prefix
    assert store.key(101, DATA).endswith("/seg-0000000000000101.data")

    store.delete(101)
    assert store.list() == [1]
    assert not store.exists(101, DATA) and not store.exists(101, IDX)
    store.delete(101)  # idempotent
    store.delete(999)  # never existed
    assert store.list() == [1]


def test_range_errors_and_missing_objects(endpoint: str) -> None:
    store = fresh()
    store.put(5, b"0123456789", b"i" * 20)
    with pytest.raises(SegmentRangeError):
        store.read_range(5, DATA, 7, 4)  # ends past the end: never a short read
    with pytest.raises(SegmentRangeError):
        store.read_range(5, DATA, 10, 1)  # starts at the end
    with pytest.raises(SegmentRangeError):
        store.read_range(5, DATA, 50, 1)  # starts past the end
    with pytest.raises(SegmentRangeError):
        store.read_range(5, DATA, 11, 0)
    with pytest.raises(SegmentRangeError):
        store.read_range(5, DATA, -1, 4)
    with pytest.raises(SegmentRangeError):
        store.read_range(5, DATA, 0, -1)
    assert store.read_range(5, DATA, 6, 4) == b"6789"
    with pytest.raises(FileNotFoundError) as e:
        store.read_range(7, DATA, 0, 1)
    assert e.value.filename == f"{store.url}/seg-0000000000000007.data"
    with pytest.raises(FileNotFoundError):
        store.read_range(7, IDX, 0, 0)
    with pytest.raises(FileNotFoundError):
        store.len(7, IDX)


def test_put_is_idempotent(endpoint: str, proxy: CountingProxy) -> None:
    store = fresh(proxy.url)
    store.put(3, b"first data", b"first idx")
    proxy.reset()
    store.put(3, b"other data", b"other idx")  # complete: a no-op
    assert [r.split()[0] for r in proxy.requests()] == ["HEAD", "HEAD"]
    assert store.read_range(3, DATA, 0, 10) == b"first data"
    assert store.list() == [3]


def test_incomplete_segments_are_not_listed(endpoint: str) -> None:
    store = fresh()
    store._put(10, DATA, b"only data")  # a put that stopped before its .idx
    store._put(20, IDX, b"only idx")  # what a delete that stopped half-way leaves
    store.put(30, b"d", b"i")
    assert store.list() == [30]
    assert store.exists(10, DATA) and not store.exists(10, IDX)
    # a put over the halves completes them; the stray .idx is replaced, not paired
    store.put(20, b"new data", b"new idx")
    store.put(10, b"only data", b"its idx")
    assert store.list() == [10, 20, 30]
    assert store.read_range(20, IDX, 0, 7) == b"new idx"


# -- ranged reads and the cache ------------------------------------------------------


def test_range_read_fetches_only_the_range(endpoint: str, proxy: CountingProxy) -> None:
    big = bytes(range(251)) * (24 << 10)  # ~6 MiB: uploaded in multipart pieces
    store = fresh(proxy.url)
    store.put(0, big, b"x" * 20)
    assert any(r.startswith("POST ") and "?uploads" in r for r in proxy.requests())
    assert store.len(0, DATA) == len(big)
    proxy.reset()
    off = (5 << 20) - 50  # across the first multipart piece's end
    assert store.read_range(0, DATA, off, 100) == big[off : off + 100]
    sent = proxy.sent_bytes().lower()
    assert [r.split()[0] for r in proxy.requests()] == ["GET"]
    assert b"\r\nrange: bytes=5242830-5242929\r\n" in sent
    # 100 bytes of body plus the response head, not 6 MiB
    assert proxy.down < 4096, proxy.down


def test_cache_serves_repeats_and_is_invalidated(endpoint: str, proxy: CountingProxy) -> None:
    cache = RangeCache(1 << 20)
    store = fresh(proxy.url, cache=cache)
    store.put(1, b"A" * 1000, b"i" * 20)
    proxy.reset()
    assert store.read_range(1, DATA, 100, 50) == b"A" * 50
    assert len(proxy.requests()) == 1
    for _ in range(3):
        assert store.read_range(1, DATA, 100, 50) == b"A" * 50
    assert len(proxy.requests()) == 1  # the repeats never reached the store
    st = cache.stats()
    assert (st.hits, st.misses, st.entries, st.bytes) == (3, 1, 1, 50)
    assert store.read_range(1, DATA, 100, 51) == b"A" * 51  # another range: a GET
    assert len(proxy.requests()) == 2

    store.delete(1)
    assert cache.stats().entries == 0
    with pytest.raises(FileNotFoundError):
        store.read_range(1, DATA, 100, 50)

    # a put drops what was cached for the segment too (here: a lone .data that was read)
    store._put(2, DATA, b"B" * 100)
    assert store.read_range(2, DATA, 0, 10) == b"B" * 10
    store._delete(2, DATA)
    store.put(2, b"C" * 100, b"i" * 20)
    assert store.read_range(2, DATA, 0, 10) == b"C" * 10


def test_range_cache_lru_by_bytes() -> None:
    cache = RangeCache(100)
    e = cache.epoch()
    cache.insert(("u", 1, "data", 0, 40), b"a" * 40, e)
    cache.insert(("u", 2, "data", 0, 40), b"b" * 40, e)
    assert cache.get(("u", 1, "data", 0, 40)) == b"a" * 40  # 1 is now the most recent
    cache.insert(("u", 3, "data", 0, 40), b"c" * 40, e)  # evicts 2, the least recent
    assert cache.get(("u", 2, "data", 0, 40)) is None
    assert cache.stats().bytes == 80
    cache.insert(("u", 4, "data", 0, 101), b"d" * 101, e)  # bigger than the cache
    assert cache.get(("u", 4, "data", 0, 101)) is None
    # a read that raced an invalidation does not insert its bytes
    stale = cache.epoch()
    cache.invalidate("u", 9)
    cache.insert(("u", 9, "data", 0, 1), b"z", stale)
    assert cache.get(("u", 9, "data", 0, 1)) is None
    cache.invalidate("u", 1)
    assert cache.get(("u", 1, "data", 0, 40)) is None and cache.stats().bytes == 40
    cache.resize(0)
    assert cache.stats().entries == 0
    assert isinstance(shared_range_cache(), RangeCache)
    assert shared_range_cache().max_bytes == 64 << 20


def test_concurrent_reads_share_a_bounded_cache(endpoint: str) -> None:
    cache = RangeCache(4096)
    store = fresh(cache=cache)
    blob = os.urandom(64 << 10)
    store.put(0, blob, b"i" * 20)

    def read(i: int) -> bool:
        off = (i * 997) % (len(blob) - 512)
        return store.read_range(0, DATA, off, 512) == blob[off : off + 512]

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(read, range(200)))
    st = cache.stats()
    assert st.bytes <= 4096 and st.hits + st.misses == 200


# -- failures -----------------------------------------------------------------------


def test_unreachable_store_is_503_quickly(endpoint: str) -> None:
    stub = StubServer(200)
    stub.stop()  # a store that was there and is gone
    store = fresh(stub.url, timeout_ms=300, connect_timeout_ms=300, max_retries=1, backoff_ms=5)
    t0 = time.monotonic()
    with pytest.raises(ColdStoreError) as e:
        store.read_range(1, DATA, 0, 10)
    assert e.value.status == 503 and e.value.retryable
    with pytest.raises(ColdStoreError) as e:
        store.list()
    assert e.value.status == 503
    assert time.monotonic() - t0 < 3


def test_hanging_store_times_out_as_503(endpoint: str) -> None:
    lsock = socket.create_server(("127.0.0.1", 0))  # accepts (the backlog), never answers
    try:
        url = f"http://127.0.0.1:{lsock.getsockname()[1]}"
        store = fresh(url, timeout_ms=200, connect_timeout_ms=200, max_retries=1)
        t0 = time.monotonic()
        with pytest.raises(ColdStoreError) as e:
            store.len(1, DATA)
        elapsed = time.monotonic() - t0
        assert e.value.status == 503, e.value
        assert 0.2 <= elapsed < 3, elapsed
    finally:
        lsock.close()


@pytest.mark.parametrize(("code", "status"), [(500, 503), (503, 503), (403, 500), (400, 500)])
def test_store_errors_map_to_a_status(endpoint: str, code: int, status: int) -> None:
    stub = StubServer(code)
    try:
        store = fresh(stub.url, max_retries=2, backoff_ms=5)
        for call in (
            lambda: store.read_range(1, DATA, 0, 1),
            lambda: store.put(1, b"d", b"i"),
            lambda: store.delete(1),
            lambda: store.list(),
        ):
            with pytest.raises(ColdStoreError) as e:
                call()
            assert e.value.status == status, e.value
            assert "s3://cold-bucket/cold/topics/" in e.value.message
        if code >= 500:  # retried, boundedly: 1 + 2 attempts for each of the 4 calls
            assert stub.hits == 4 * 3
        else:
            assert stub.hits == 4
    finally:
        stub.stop()


def test_the_client_library_is_imported_lazily() -> None:
    code = (
        "import sys, topics.storage.objstore, topics.storage.segstore\n"
        "assert 'obstore' not in sys.modules, 'obstore imported eagerly'\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=60)


def test_a_listing_saves_the_heads_of_later_opens(endpoint: str, proxy: CountingProxy) -> None:
    """A planner lists a topic's prefix, then opens each part: the LIST gave the sizes,
    so the opens send no HEAD, only the ranged GETs of what is read."""
    writer = fresh(endpoint)
    for first in (1, 11, 21):
        writer.put(first, b"d" * (100 + first), b"i" * 20)
    reader = ObjectColdRoot(
        f"s3://{BUCKET}/cold/",
        cache=RangeCache(1 << 20),
        config={"endpoint": proxy.url},
    )
    fs = reader.fs
    topic_url = writer.url
    proxy.reset()
    names = fs.listdir(topic_url)
    assert len(names) == 6
    sizes = [fs.open(f"{topic_url}/{n}").size() for n in names if n.endswith(".data")]
    assert sizes == [101, 111, 121]
    f = fs.open(f"{topic_url}/seg-{11:016d}.data")
    assert f.pread(20, 100) == b"d" * 11  # short at the end of the object
    methods = [r.split()[0] for r in proxy.requests()]
    assert "HEAD" not in methods, methods
    assert methods.count("GET") >= 2  # the LIST, then the ranged read
