"""A :class:`~topics.storage.segstore.SegmentStore` over an S3-compatible object store.

The cold tier behind an `s3://bucket/prefix` cold root (docs/FORMATS.md,
"Object-store cold tier"). The objects under the prefix are laid out exactly as
the files under a local cold dir (the names come from
:func:`~topics.storage.segment.topic_dir` and
:func:`~topics.storage.segment.segment_paths`)::

    <prefix>/topics/<topic_id as %016x>/seg-<first_seq as %016d>.data
    <prefix>/topics/<topic_id as %016x>/seg-<first_seq as %016d>.idx

Invariants (the same as :class:`~topics.storage.segstore.LocalSegmentStore`):

* **A segment exists iff both objects exist.** An object PUT is atomic (the
  object appears whole or not at all), :meth:`ObjectSegmentStore.put` uploads
  `.data` before `.idx`, so the `.idx` upload is the commit point, and
  :meth:`ObjectSegmentStore.delete` removes `.data` before `.idx`.
* **Puts are idempotent.** A complete segment is left as it is.
* **Reads are ranged and never short.** :meth:`ObjectSegmentStore.read_range`
  asks for exactly the bytes wanted (an HTTP `Range` GET, never the whole
  object) and raises :class:`~topics.storage.segment.SegmentRangeError` rather
  than return fewer bytes.

Ranges read are kept in a bounded, process-wide LRU (:class:`RangeCache`, by
bytes), dropped for a segment when it is put or deleted.

The client library (`obstore`) is imported on first use, so a server whose cold
dir is local never loads it. Credentials, endpoint and region come from the
standard `AWS_*` environment variables (`AWS_ENDPOINT_URL`, `AWS_REGION`,
`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, ...), read by the library.

Errors: a missing object is `FileNotFoundError`; a store that is down, slow
past the request timeout or answering 5xx (after the bounded retries) is
:class:`ColdStoreError` with status 503; anything else unexpected from the
store is :class:`ColdStoreError` with status 500.
"""

from __future__ import annotations

import builtins
import errno
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, TypeVar

from topics.storage.segment import SegmentRangeError, segment_paths, topic_dir
from topics.storage.segstore import SegmentId, SegmentPart

if TYPE_CHECKING:
    from obstore.store import S3Config, S3Store

    from topics.fs import File, Fs

__all__ = [
    "DEFAULT_CACHE_BYTES",
    "DEFAULT_TIMEOUT_MS",
    "DEFAULT_CONNECT_TIMEOUT_MS",
    "DEFAULT_MAX_RETRIES",
    "DEFAULT_BACKOFF_MS",
    "DEFAULT_RETRY_TIMEOUT_MS",
    "CacheStats",
    "ColdStoreError",
    "RangeCache",
    "ObjectColdRoot",
    "ObjectSegmentStore",
    "ObjectFs",
    "ObjectFile",
    "RoutedFs",
    "cold_root",
    "fs_for",
    "is_object_url",
    "shared_range_cache",
]

#: Default capacity of the process-wide range cache, in bytes (64 MiB).
DEFAULT_CACHE_BYTES = 64 << 20
#: Default whole-request timeout, in ms (connect to last byte; each retry gets its own).
DEFAULT_TIMEOUT_MS = 10_000
#: Default connect timeout, in ms.
DEFAULT_CONNECT_TIMEOUT_MS = 3_000
#: Default number of retries after the first attempt (5xx, connection errors, read timeouts).
DEFAULT_MAX_RETRIES = 3
#: Default wait before the first retry, in ms (doubling, with jitter, up to 2 s).
DEFAULT_BACKOFF_MS = 100
#: Default bound on the time from the first attempt after which no retry starts, in ms.
DEFAULT_RETRY_TIMEOUT_MS = 30_000

_SCHEMES = ("s3://",)
_STATUS_RE = re.compile(r"status code: (\d{3})")
# The client's transport failure kinds (reqwest via object_store): the store is
# unreachable, timed out or dropped the connection, so it is unavailable (503).
_TRANSPORT_RE = re.compile(r"kind: (Connect|Timeout|Request|Interrupted|Decode)\b")

T = TypeVar("T")


def is_object_url(value: str) -> bool:
    """Whether a cold-dir setting names an object store (`s3://...`) rather than a directory."""
    return value.startswith(_SCHEMES)


# -- errors ---------------------------------------------------------------------


class ColdStoreError(OSError):
    """The object store failed a request (docs/FORMATS.md, "Object-store cold tier").

    Attributes:
        status: the HTTP status a caller should answer with: 503 when the store
            is unreachable, timed out or answered 5xx (worth retrying later),
            500 for any other unexpected failure (a 4xx, a bad configuration).
        message: what failed, one line.
    """

    def __init__(self, status: int, message: str) -> None:
        super().__init__(errno.EIO, f"{status}: {message}")
        self.status = status
        self.message = message

    def __str__(self) -> str:
        return f"{self.status}: {self.message}"

    @property
    def retryable(self) -> bool:
        """True for 503 (the store may come back), False for 500."""
        return self.status == 503


def _first_line(exc: BaseException, limit: int = 300) -> str:
    """The exception's first line, at most `limit` characters (the client's
    messages go on with a response body and a debug dump)."""
    text = str(exc).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _classify(exc: Exception, what: str) -> ColdStoreError:
    """Map a client-library exception (other than not-found) to a :class:`ColdStoreError`."""
    text = str(exc)
    m = _STATUS_RE.search(text)
    if m is not None:
        code = int(m.group(1))
        status = 503 if code >= 500 or code == 429 else 500
    elif _TRANSPORT_RE.search(text) is not None:
        status = 503
    else:
        status = 500
    return ColdStoreError(status, f"{what}: {_first_line(exc)}")


# -- range cache ----------------------------------------------------------------

_Seg = tuple[str, SegmentId]
"""A cached segment: (store url, segment id)."""
_Key = tuple[str, SegmentId, str, int, int]
"""A cached range: (store url, segment id, part, offset in bytes, length in bytes)."""


@dataclass(frozen=True, slots=True)
class CacheStats:
    """Counters of a :class:`RangeCache` (bytes are payload bytes held)."""

    hits: int
    misses: int
    entries: int
    bytes: int
    max_bytes: int


class RangeCache:
    """A thread-safe LRU of byte ranges read from cold stores, bounded by bytes.

    Keys are `(store url, segment id, part, offset, len)`. A range larger than
    the whole capacity is not kept; `max_bytes=0` keeps nothing. Inserting
    evicts least recently used ranges until the total fits.
    :meth:`invalidate` drops every range of one segment; a read that was in
    flight across an invalidation does not insert its (possibly older) bytes.
    """

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self._lock = threading.Lock()
        self._max = max_bytes
        self._entries: OrderedDict[_Key, bytes] = OrderedDict()
        self._by_seg: dict[_Seg, set[_Key]] = {}
        self._bytes = 0
        self._epoch = 0
        self._hits = 0
        self._misses = 0

    @property
    def max_bytes(self) -> int:
        """Capacity in bytes."""
        return self._max

    def resize(self, max_bytes: int) -> None:
        """Change the capacity (bytes), evicting down to it at once."""
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        with self._lock:
            self._max = max_bytes
            self._evict()

    def epoch(self) -> int:
        """A token to take before a read and hand to :meth:`insert` after it."""
        with self._lock:
            return self._epoch

    def get(self, key: _Key) -> bytes | None:
        """The cached bytes of `key` (now most recently used), or None."""
        with self._lock:
            data = self._entries.get(key)
            if data is None:
                self._misses += 1
                return None
            self._entries.move_to_end(key)
            self._hits += 1
            return data

    def insert(self, key: _Key, data: bytes, epoch: int) -> None:
        """Keep `data` under `key`, unless an invalidation happened since `epoch`."""
        with self._lock:
            if epoch != self._epoch or len(data) > self._max or key in self._entries:
                return
            self._entries[key] = data
            self._by_seg.setdefault((key[0], key[1]), set()).add(key)
            self._bytes += len(data)
            self._evict()

    def invalidate(self, url: str, id: SegmentId) -> None:
        """Drop every cached range of segment `id` of the store at `url`."""
        with self._lock:
            self._epoch += 1
            for key in self._by_seg.pop((url, id), ()):
                self._bytes -= len(self._entries.pop(key))

    def clear(self) -> None:
        """Drop everything and reset the counters."""
        with self._lock:
            self._epoch += 1
            self._entries.clear()
            self._by_seg.clear()
            self._bytes = self._hits = self._misses = 0

    def stats(self) -> CacheStats:
        """A snapshot of the counters."""
        with self._lock:
            return CacheStats(self._hits, self._misses, len(self._entries), self._bytes, self._max)

    def _evict(self) -> None:
        while self._bytes > self._max:
            key, data = self._entries.popitem(last=False)
            self._bytes -= len(data)
            seg = (key[0], key[1])
            keys = self._by_seg[seg]
            keys.discard(key)
            if not keys:
                del self._by_seg[seg]


_SHARED_CACHE = RangeCache()


def shared_range_cache() -> RangeCache:
    """The process-wide range cache every store uses unless given another (64 MiB)."""
    return _SHARED_CACHE


# -- stores ---------------------------------------------------------------------


def _parse_url(url: str) -> tuple[str, str]:
    """`s3://bucket/some/prefix` -> ("bucket", "some/prefix"); raises ValueError."""
    if not is_object_url(url):
        raise ValueError(f"not an object-store url (s3://bucket/prefix): {url!r}")
    rest = url.split("://", 1)[1]
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise ValueError(f"no bucket in {url!r}")
    return bucket, prefix.strip("/")


def _endpoint(config: S3Config | None) -> str:
    """The endpoint the client will use: `config`'s, else the environment's, else ""."""
    given = config.get("endpoint") if config else None
    return given or os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT") or ""


class ObjectColdRoot:
    """One `s3://bucket/prefix` cold root: the client its topics' stores share.

    Args:
        url: `s3://bucket` or `s3://bucket/prefix` (a trailing `/` is ignored).
        timeout_ms: whole-request timeout per attempt, in ms.
        connect_timeout_ms: connect timeout per attempt, in ms.
        max_retries: retries after the first attempt of a request that failed
            with a 5xx, a connection error or (for reads) a timeout; 0 = none.
        retry_timeout_ms: no retry starts this many ms after the first attempt.
        backoff_ms: the wait before the first retry, in ms; each later wait
            doubles (with jitter), up to 2 s.
        cache: the range cache; None = the process-wide :func:`shared_range_cache`.
        config: extra client settings (obstore `S3Config` keys such as
            `endpoint` or `region`) that override the `AWS_*` environment.

    A plain-HTTP endpoint (`AWS_ENDPOINT_URL=http://...`, e.g. a local
    S3-compatible server) is allowed; otherwise HTTPS is required.

    Raises ValueError for a malformed url, and ImportError when the object-store
    client library is not installed. No request is made here.
    """

    def __init__(
        self,
        url: str,
        *,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
        connect_timeout_ms: int = DEFAULT_CONNECT_TIMEOUT_MS,
        max_retries: int = DEFAULT_MAX_RETRIES,
        retry_timeout_ms: int = DEFAULT_RETRY_TIMEOUT_MS,
        backoff_ms: int = DEFAULT_BACKOFF_MS,
        cache: RangeCache | None = None,
        config: S3Config | None = None,
    ) -> None:
        from obstore.store import S3Store

        self.bucket, self.prefix = _parse_url(url)
        self.url = f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"
        self.cache = cache if cache is not None else _SHARED_CACHE
        self.endpoint = _endpoint(config)
        allow_http = self.endpoint.startswith("http://") or os.environ.get(
            "AWS_ALLOW_HTTP", ""
        ).lower() in ("1", "true")
        self.client: S3Store = S3Store(
            self.bucket,
            prefix=self.prefix or None,
            config=config,
            client_options={
                "timeout": timedelta(milliseconds=timeout_ms),
                "connect_timeout": timedelta(milliseconds=connect_timeout_ms),
                "allow_http": allow_http,
            },
            retry_config={
                "max_retries": max_retries,
                "retry_timeout": timedelta(milliseconds=retry_timeout_ms),
                "backoff": {
                    "init_backoff": timedelta(milliseconds=backoff_ms),
                    "max_backoff": timedelta(milliseconds=max(backoff_ms, 2_000)),
                    "base": 2,
                },
            },
        )

        self._stores: dict[int, ObjectSegmentStore] = {}
        self._stores_lock = threading.Lock()
        #: A read-only :class:`ObjectFs` over this root (paths are full `s3://` urls).
        self.fs = ObjectFs(self)

    def store(self, topic_id: int) -> ObjectSegmentStore:
        """The segment store of one topic (`<prefix>/topics/<topic_id as %016x>/`), one per
        topic and root (it remembers part sizes)."""
        with self._stores_lock:
            st = self._stores.get(topic_id)
            if st is None:
                st = self._stores[topic_id] = ObjectSegmentStore(self, topic_id)
            return st

    def key_of(self, path: str) -> str:
        """The object key (relative to the prefix) of a full url under this root.

        Raises FileNotFoundError for a path outside the root."""
        if path == self.url:
            return ""
        if not path.startswith(self.url + "/"):
            raise FileNotFoundError(errno.ENOENT, "not under the cold root " + self.url, path)
        return path[len(self.url) + 1 :].strip("/")


class ObjectSegmentStore:
    """A :class:`~topics.storage.segstore.SegmentStore` for one topic under an :class:`ObjectColdRoot`.

    Every call is synchronous and blocking (run it on the blocking/IO pool) and
    safe to issue from several threads at once. A call makes one or two
    requests (none for a cached range); :meth:`list` one per page of 1000 keys,
    :meth:`put` up to five (a part over 5 MiB goes up as a multipart upload,
    which also appears only when complete).
    """

    def __init__(self, root: ObjectColdRoot, topic_id: int) -> None:
        self.root = root
        self.topic_id = topic_id
        # "topics/<topic id hex>", the same helper that names the local dirs
        self._dir = topic_dir("", topic_id).replace(os.sep, "/")
        self.url = f"{root.url}/{self._dir}"
        # cache namespace: the endpoint too, so two stores of one bucket name never mix
        self._ns = f"{root.endpoint}|{self.url}"
        # Sizes of parts seen by a HEAD (dropped by put, delete and replace_idx).
        self._sizes: dict[tuple[SegmentId, str], int] = {}
        #: The read-only :class:`ObjectFs` of the root: `fs.open(self.path(...))` reads a part.
        self.fs: Fs = root.fs

    def path(self, id: SegmentId, part: SegmentPart) -> str:
        """The part's full url (`s3://bucket/prefix/topics/.../seg-....data`), for :attr:`fs`."""
        return f"{self.root.url}/{self.key(id, part)}"

    # -- naming

    def key(self, id: SegmentId, part: SegmentPart) -> str:
        """Object key of one part, relative to the root's prefix."""
        p = segment_paths(self._dir, id)
        return (p.data if part is SegmentPart.DATA else p.idx).replace(os.sep, "/")

    def _where(self, id: SegmentId, part: SegmentPart) -> str:
        return f"{self.root.url}/{self.key(id, part)}"

    @staticmethod
    def _call(what: str, where: str, fn: Callable[[], T]) -> T:
        """Run one client call: not-found -> FileNotFoundError (ENOENT, `where`),
        any other client failure -> ColdStoreError; SegmentRangeError passes."""
        try:
            return fn()
        except FileNotFoundError:
            raise FileNotFoundError(errno.ENOENT, "no such object", where) from None
        except SegmentRangeError:
            raise
        except Exception as e:  # the client's errors (ValueError among them)
            raise _classify(e, f"{what} {where}") from e

    def _head(self, id: SegmentId, part: SegmentPart) -> int:
        import obstore

        known = self._sizes.get((id, part.value))
        if known is not None:
            return known
        key = self.key(id, part)
        meta = self._call(
            "HEAD", self._where(id, part), lambda: obstore.head(self.root.client, key)
        )
        size = int(meta["size"])
        self._sizes[(id, part.value)] = size
        return size

    def remember_size(self, id: SegmentId, part: SegmentPart, size: int) -> None:
        """Keep the size of one part, as a LIST reported it (saves the HEAD of a later open)."""
        self._sizes[(id, part.value)] = size

    def _forget(self, id: SegmentId) -> None:
        for part in SegmentPart:
            self._sizes.pop((id, part.value), None)
        self.root.cache.invalidate(self._ns, id)

    def _put(self, id: SegmentId, part: SegmentPart, payload: bytes) -> None:
        import obstore

        key = self.key(id, part)
        self._call(
            "PUT", self._where(id, part), lambda: obstore.put(self.root.client, key, payload)
        )

    def _delete(self, id: SegmentId, part: SegmentPart) -> None:
        import obstore

        key = self.key(id, part)
        try:
            self._call(
                "DELETE", self._where(id, part), lambda: obstore.delete(self.root.client, key)
            )
        except FileNotFoundError:
            pass  # S3 answers 204 for a missing key; other stores may say 404

    # -- the SegmentStore protocol

    def put(self, id: SegmentId, data: bytes, idx: bytes) -> None:
        """Upload `.data`, then `.idx` (the commit point); a complete segment is a no-op.

        Two HEADs first (idempotency); a stray `.idx` without its `.data` is
        deleted before the new `.data` goes up, so it can never pair with the
        new bytes. Cached ranges of the segment are dropped. Raises
        :class:`ColdStoreError`; after a failure the segment is incomplete (not
        listed) or complete, never half-indexed, and the put may be retried.
        """
        has_data = self.exists(id, SegmentPart.DATA)
        has_idx = self.exists(id, SegmentPart.IDX)
        if has_data and has_idx:
            return
        self._forget(id)
        try:
            if has_idx:
                self._delete(id, SegmentPart.IDX)
            self._put(id, SegmentPart.DATA, data)
            self._put(id, SegmentPart.IDX, idx)
        finally:
            self._forget(id)

    def replace_idx(self, id: SegmentId, idx: bytes) -> None:
        """Overwrite the `.idx` of a complete segment (one PUT, atomic: readers see the
        old or the new object). For delete flags set after relocation
        (docs/FORMATS.md, "Object-store cold tier"). Raises FileNotFoundError when
        the segment's `.data` is gone, :class:`ColdStoreError` on a failure."""
        if not self.exists(id, SegmentPart.DATA):
            raise FileNotFoundError(
                errno.ENOENT, "no such object", self._where(id, SegmentPart.DATA)
            )
        self._forget(id)
        try:
            self._put(id, SegmentPart.IDX, idx)
        finally:
            self._forget(id)

    def read_range(self, id: SegmentId, part: SegmentPart, offset: int, len: int) -> bytes:
        """Exactly `len` bytes of `part` at byte `offset`: one ranged GET, or the cache.

        A zero-length range costs a HEAD (the part must exist, and `offset` must
        not lie past its end).

        Raises:
            SegmentRangeError: negative arguments, or a range past the end of the part.
            FileNotFoundError: the part does not exist.
            ColdStoreError: the store failed (503 unavailable/timeout/5xx, 500 other).
        """
        if offset < 0 or len < 0:
            raise SegmentRangeError(f"bad range offset={offset} len={len}")
        where = self._where(id, part)
        past_end = f"range [{offset}, +{len}) past the end of {where}"
        if len == 0:
            if offset > self._head(id, part):
                raise SegmentRangeError(past_end)
            return b""
        cache = self.root.cache
        ckey: _Key = (self._ns, id, part.value, offset, len)
        hit = cache.get(ckey)
        if hit is not None:
            return hit
        import obstore

        epoch = cache.epoch()
        key = self.key(id, part)

        def get() -> bytes:
            try:
                got = obstore.get_range(self.root.client, key, start=offset, length=len)
            except FileNotFoundError:
                raise
            except Exception as e:
                if "status code: 416" in str(e):  # the range starts at or past the end
                    raise SegmentRangeError(past_end) from None
                raise
            return bytes(got)

        out = self._call("GET", where, get)
        if builtins.len(out) != len:  # a range ending past the end comes back short
            raise SegmentRangeError(past_end)
        cache.insert(ckey, out, epoch)
        return out

    def delete(self, id: SegmentId) -> None:
        """Delete `.data`, then `.idx` (two DELETEs); missing objects are fine (idempotent).

        Cached ranges of the segment are dropped. Raises :class:`ColdStoreError`;
        a failure in between leaves at most the `.idx` (not listed), and the
        delete may be retried.
        """
        self._forget(id)
        try:
            self._delete(id, SegmentPart.DATA)
            self._delete(id, SegmentPart.IDX)
        finally:
            self._forget(id)

    def list(self) -> builtins.list[SegmentId]:
        """Ids with both objects present, ascending (one paginated LIST of the topic's prefix).

        Keys that are not exactly a segment part of this topic are ignored.
        Raises :class:`ColdStoreError`.
        """
        import obstore

        def scan() -> set[str]:
            names: set[str] = set()
            for chunk in obstore.list(self.root.client, self._dir + "/"):
                names.update(meta["path"] for meta in chunk)
            return names

        names = self._call("LIST", f"{self.url}/", scan)
        firsts = {int(m.group(1)) for p in names if (m := _PART_RE.search(p)) is not None}
        return [
            first
            for first in sorted(firsts)
            if self.key(first, SegmentPart.DATA) in names
            and self.key(first, SegmentPart.IDX) in names
        ]

    def exists(self, id: SegmentId, part: SegmentPart) -> bool:
        """Whether the object of `part` exists (one HEAD). Raises :class:`ColdStoreError`."""
        try:
            self._head(id, part)
        except FileNotFoundError:
            return False
        return True

    def len(self, id: SegmentId, part: SegmentPart) -> int:
        """Byte size of `part` (one HEAD).

        Raises FileNotFoundError when it is missing, :class:`ColdStoreError` on a failure.
        """
        return self._head(id, part)


_PART_RE = re.compile(r"/seg-(\d{16})\.(?:data|idx)$")
_SEG_KEY_RE = re.compile(r"^topics/([0-9a-f]{16})/seg-(\d{16})\.(data|idx)$")


# -- a read-only Fs over a cold root ----------------------------------------------


def _read_only(path: str) -> OSError:
    return OSError(
        errno.EROFS, "the object-store cold tier is written through its segment store", path
    )


class ObjectFile:
    """One object opened through :class:`ObjectFs` (the read side of :class:`topics.fs.File`).

    `pread` is a ranged GET (short at the end of the object, like `pread(2)`);
    parts of segments go through their :class:`ObjectSegmentStore`, so the
    range cache and the remembered sizes serve them. Writes raise OSError (EROFS).
    """

    __slots__ = ("_fs", "_key", "_seg", "_size")

    #: Reads cross a network: a reader asks for a whole span at once.
    remote = True

    def __init__(self, fs: ObjectFs, key: str) -> None:
        self._fs = fs
        self._key = key
        m = _SEG_KEY_RE.match(key)
        self._seg: tuple[ObjectSegmentStore, SegmentId, SegmentPart] | None = None
        if m is not None:
            st = fs.root.store(int(m.group(1), 16))
            self._seg = (st, int(m.group(2)), SegmentPart(m.group(3)))
        self._size: int | None = None

    def size(self) -> int:
        """Object size in bytes (one HEAD, remembered). Raises FileNotFoundError, ColdStoreError."""
        if self._size is None:
            if self._seg is not None:
                st, id, part = self._seg
                self._size = st.len(id, part)
            else:
                import obstore

                where = f"{self._fs.root.url}/{self._key}"
                meta = ObjectSegmentStore._call(
                    "HEAD", where, lambda: obstore.head(self._fs.root.client, self._key)
                )
                self._size = int(meta["size"])
        return self._size

    def pread(self, size: int, offset: int) -> bytes:
        """Up to `size` bytes at `offset` (fewer only at the end of the object)."""
        n = max(0, min(size, self.size() - offset))
        if n == 0:
            return b""
        if self._seg is not None:
            st, id, part = self._seg
            return st.read_range(id, part, offset, n)
        import obstore

        where = f"{self._fs.root.url}/{self._key}"
        got = ObjectSegmentStore._call(
            "GET",
            where,
            lambda: obstore.get_range(self._fs.root.client, self._key, start=offset, length=n),
        )
        return bytes(got)

    def map(self) -> None:
        """Objects are never mapped (reads go through `pread`)."""
        return None

    def no_readahead(self) -> None:
        """Nothing to do: a ranged GET reads exactly what is asked."""

    def close(self) -> None:
        """Nothing held between requests."""

    def pwrite(self, data: object, offset: int) -> int:
        raise _read_only(self._key)

    def fdatasync(self) -> None:
        raise _read_only(self._key)

    def fsync(self) -> None:
        raise _read_only(self._key)

    def truncate(self, size: int) -> None:
        raise _read_only(self._key)

    def lock(self) -> bool:
        raise _read_only(self._key)

    def unlock(self) -> None:
        raise _read_only(self._key)


class ObjectFs:
    """A read-mostly :class:`topics.fs.Fs` over one :class:`ObjectColdRoot`.

    Paths are full urls under the root (`s3://bucket/prefix/topics/<id>/seg-...`);
    a "directory" is a key prefix, which exists while any object is under it. It
    lets code written against an `Fs` (segment reads, recovery's listing, the
    offline readers) read the object-store tier. Supported: `open` (read-only),
    `listdir`, `exists`, `lexists`, `isdir`, `unlink` (a DELETE) and `rmtree`;
    directory operations (`mkdir`, `makedirs`, `rmdir`, `fsync_dir`) are no-ops,
    since prefixes need no creating; `replace` and opening for writing raise
    OSError (EROFS): segments are written through :class:`ObjectSegmentStore`.
    """

    def __init__(self, root: ObjectColdRoot) -> None:
        self.root = root

    def open(
        self, path: str, *, create: bool = False, write: bool = False, exclusive: bool = False
    ) -> ObjectFile:
        if create or write or exclusive:
            raise _read_only(path)
        key = self.root.key_of(path)
        f = ObjectFile(self, key)
        f.size()  # FileNotFoundError now, like open(2)
        return f

    def _listing(self, path: str) -> tuple[list[str], list[str]]:
        """(object names, sub-prefix names) directly under `path`."""
        import obstore

        key = self.root.key_of(path)
        prefix = key + "/" if key else None
        got = ObjectSegmentStore._call(
            "LIST",
            path,
            lambda: obstore.list_with_delimiter(self.root.client, prefix),
        )
        files = [str(m["path"]).rsplit("/", 1)[-1] for m in got["objects"]]
        dirs = [str(p).rstrip("/").rsplit("/", 1)[-1] for p in got["common_prefixes"]]
        # The LIST already gave each segment part's size: opening one later then
        # needs no HEAD (a planner listing a big archive makes one request, not one
        # per segment).
        for m in got["objects"]:
            seg = _SEG_KEY_RE.match(str(m["path"]))
            if seg is not None:
                st = self.root.store(int(seg.group(1), 16))
                st.remember_size(int(seg.group(2)), SegmentPart(seg.group(3)), int(m["size"]))
        return files, dirs

    def listdir(self, path: str) -> list[str]:
        """Names of the objects and sub-prefixes directly under `path`, sorted."""
        files, dirs = self._listing(path)
        if not files and not dirs:
            raise FileNotFoundError(errno.ENOENT, "no such prefix", path)
        return sorted({*files, *dirs})

    def isdir(self, path: str) -> bool:
        files, dirs = self._listing(path)
        return bool(files or dirs)

    def exists(self, path: str) -> bool:
        try:
            ObjectFile(self, self.root.key_of(path)).size()
            return True
        except FileNotFoundError:
            pass
        return self.isdir(path)

    def lexists(self, path: str) -> bool:
        return self.exists(path)

    def unlink(self, path: str) -> None:
        """DELETE one object (a missing one is fine, as S3 answers)."""
        import obstore

        key = self.root.key_of(path)
        m = _SEG_KEY_RE.match(key)
        if m is not None:
            st = self.root.store(int(m.group(1), 16))
            st._forget(int(m.group(2)))
        try:
            ObjectSegmentStore._call("DELETE", path, lambda: obstore.delete(self.root.client, key))
        except FileNotFoundError:
            pass

    def rmtree(self, path: str) -> None:
        """DELETE every object under `path`."""
        files, dirs = self._listing(path)
        for name in dirs:
            self.rmtree(f"{path.rstrip('/')}/{name}")
        for name in files:
            self.unlink(f"{path.rstrip('/')}/{name}")

    def mkdir(self, path: str) -> None:
        """Nothing to do: a prefix exists once an object is under it."""

    def makedirs(self, path: str) -> None:
        """Nothing to do: a prefix exists once an object is under it."""

    def rmdir(self, path: str) -> None:
        """Nothing to do: a prefix goes with its last object."""

    def fsync_dir(self, path: str) -> None:
        """Nothing to do: an object PUT or DELETE is durable when it returns."""

    def replace(self, src: str, dst: str) -> None:
        raise _read_only(src)


_ROOTS: dict[str, ObjectColdRoot] = {}
_ROOTS_LOCK = threading.Lock()


def _env_ms(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected a whole number") from None
    if value < 0:
        raise ValueError(f"{name}={raw!r}: must be >= 0")
    return value


def cold_root(url: str) -> ObjectColdRoot:
    """The process's :class:`ObjectColdRoot` for `url` (made on first use, then shared).

    Timeouts and retries come from `TOPICS_COLD_TIMEOUT_MS`,
    `TOPICS_COLD_CONNECT_TIMEOUT_MS` and `TOPICS_COLD_RETRIES` when set (README
    "Configuration"), the `AWS_*` variables from the client. Raises ValueError
    for a malformed url or setting, ImportError without the client library.
    """
    bucket, prefix = _parse_url(url)
    norm = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
    key = f"{_endpoint(None)}|{norm}"
    with _ROOTS_LOCK:
        root = _ROOTS.get(key)
        if root is None:
            root = _ROOTS[key] = ObjectColdRoot(
                norm,
                timeout_ms=_env_ms("TOPICS_COLD_TIMEOUT_MS", DEFAULT_TIMEOUT_MS),
                connect_timeout_ms=_env_ms(
                    "TOPICS_COLD_CONNECT_TIMEOUT_MS", DEFAULT_CONNECT_TIMEOUT_MS
                ),
                max_retries=_env_ms("TOPICS_COLD_RETRIES", DEFAULT_MAX_RETRIES),
            )
        return root


class RoutedFs:
    """An :class:`topics.fs.Fs` that sends paths under object-store roots to their
    :class:`ObjectFs` and every other path to `local`.

    For code that takes one `Fs` for a data dir and a cold root that may be an
    `s3://` url (the offline readers, `topics verify`, `topics dump`).
    """

    def __init__(self, local: Fs, roots: builtins.list[ObjectColdRoot]) -> None:
        self.local = local
        self.roots = roots

    def _fs(self, path: str) -> Fs:
        for r in self.roots:
            if path == r.url or path.startswith(r.url + "/"):
                return r.fs
        return self.local

    def open(
        self, path: str, *, create: bool = False, write: bool = False, exclusive: bool = False
    ) -> File:
        return self._fs(path).open(path, create=create, write=write, exclusive=exclusive)

    def replace(self, src: str, dst: str) -> None:
        self._fs(src).replace(src, dst)

    def unlink(self, path: str) -> None:
        self._fs(path).unlink(path)

    def rmdir(self, path: str) -> None:
        self._fs(path).rmdir(path)

    def rmtree(self, path: str) -> None:
        self._fs(path).rmtree(path)

    def listdir(self, path: str) -> builtins.list[str]:
        return self._fs(path).listdir(path)

    def mkdir(self, path: str) -> None:
        self._fs(path).mkdir(path)

    def makedirs(self, path: str) -> None:
        self._fs(path).makedirs(path)

    def exists(self, path: str) -> bool:
        return self._fs(path).exists(path)

    def lexists(self, path: str) -> bool:
        return self._fs(path).lexists(path)

    def isdir(self, path: str) -> bool:
        return self._fs(path).isdir(path)

    def fsync_dir(self, path: str) -> None:
        self._fs(path).fsync_dir(path)


def fs_for(local: Fs, *roots: str | None) -> Fs:
    """`local` itself when no root in `roots` is an `s3://` url, else a :class:`RoutedFs`
    sending those roots to their :func:`cold_root`'s :class:`ObjectFs`."""
    objs = [cold_root(r) for r in roots if r and is_object_url(r)]
    return RoutedFs(local, objs) if objs else local
