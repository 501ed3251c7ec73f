"""Where a record's bytes live, and how a record is rendered from them.

Every published record is one frame (docs/FORMATS.md): until the checkpointer
copies it into a segment it sits in an in-memory :class:`Chunk` (the WAL
encoding of the write that produced it); afterwards in a segment `.data` file.
A slot's `loc` names the source in the topic's source table, `offset`/`len`
the frame inside it. Reads render the wire object straight from the frame
bytes: `data` and `meta` are spliced as stored, never parsed.

The two frame layouts differ only in the WAL's leading `type` byte, so a source
says where its header ends (`hdr`: 38 for WAL frames, 37 for segment frames);
the three length fields are the last 8 header bytes in both. Sources whose bytes
come from disk set `verify`: each frame read is checked (length prefix, seq,
XXH3-64) and a mismatch raises :class:`FrameCorrupt` (corruption in a
sealed segment is surfaced, never skipped).

Sources whose reads may block on the disk (`blocking`) are never read on the
event loop while :data:`read_ahead` is set: a read that needs their bytes raises
:class:`ColdRead` naming the span, the caller fetches it on a thread
(`source.fetch`), adds it to the :class:`ReadAhead` and runs the read again
(docs/ARCHITECTURE.md, "The read path").
"""

from __future__ import annotations

from collections.abc import Sequence
from contextvars import ContextVar
from typing import Any, Protocol, cast

import numpy as np
import numpy.typing as npt
import orjson

from topics.format.frame import (
    WAL_HDR,
    Buf,
    check_frame,
    frame_fields,
    native_render,
    plain_data,
)

__all__ = [
    "Buf",
    "FrameSource",
    "ColdRead",
    "ReadAhead",
    "read_ahead",
    "span_of",
    "Chunk",
    "FrameCorrupt",
    "render_frames",
    "NATIVE_MIN_RUN",
    "Ints",
    "python_render",
    "collect_fields",
]


#: Parallel per-record columns: a sequence of ints or an int64 array.
Ints = Sequence[int] | npt.NDArray[np.int64]


class FrameCorrupt(Exception):
    """A frame read from disk does not verify (surfaced corruption, never skipped).

    Attributes: `source` (file or chunk name), `seq`, `reason`.
    """

    def __init__(self, source: str, seq: int, reason: str) -> None:
        super().__init__(f"{source}: seq {seq}: {reason}")
        self.source = source
        self.seq = seq
        self.reason = reason


class FrameSource(Protocol):
    """Something holding frames: an in-memory chunk or a segment file.

    `span(lo, hi)` returns `(buf, base)` such that the bytes at source offsets
    `[lo, hi)` are `buf[lo - base : hi - base]`. Raises OSError or FrameCorrupt
    when the bytes cannot be read. A `blocking` source (a file) also has
    `fetch(lo, hi) -> bytes`: the same bytes read with its own handle, safe to
    call from any thread.
    """

    hdr: int
    verify: bool
    blocking: bool
    name: str

    def span(self, lo: int, hi: int) -> tuple[Buf, int]: ...

    def fetch(self, lo: int, hi: int) -> bytes: ...


class ColdRead(Exception):
    """A read needs bytes `[lo, hi)` of a blocking `source` that were not fetched ahead.

    Raised only while :data:`read_ahead` is set, before the read changed
    anything: fetch the span off the loop, add it, and run the read again.
    """

    def __init__(self, source: FrameSource, lo: int, hi: int) -> None:
        super().__init__(f"{source.name}: bytes {lo}..{hi} not fetched ahead")
        self.source = source
        self.lo = lo
        self.hi = hi


class ReadAhead:
    """Spans of blocking sources fetched off the loop for one read (bytes, by source)."""

    __slots__ = ("_spans", "_sources", "nbytes")

    def __init__(self) -> None:
        self._spans: dict[int, list[tuple[int, bytes]]] = {}
        self._sources: dict[int, FrameSource] = {}
        self.nbytes = 0

    def add(self, source: FrameSource, lo: int, buf: bytes) -> None:
        """Keep `buf`, the bytes of `source` starting at offset `lo`."""
        self._spans.setdefault(id(source), []).append((lo, buf))
        self._sources[id(source)] = source
        self.nbytes += len(buf)

    def cold_sources(self) -> int:
        """How many of the sources read are in the cold tier (their `cold` is true)."""
        return sum(1 for s in self._sources.values() if getattr(s, "cold", False))

    def get(self, source: FrameSource, lo: int, hi: int) -> tuple[bytes, int] | None:
        """`(buf, base)` covering `[lo, hi)` of `source`, or None when not fetched."""
        for base, buf in self._spans.get(id(source), ()):
            if base <= lo and hi <= base + len(buf):
                return buf, base
        return None


#: Set (to the read's :class:`ReadAhead`) while a read runs on the event loop:
#: blocking sources are then served from it or raise :class:`ColdRead`.
read_ahead: ContextVar[ReadAhead | None] = ContextVar("topics_read_ahead", default=None)


def span_of(src: FrameSource, lo: int, hi: int) -> tuple[Buf, int]:
    """`src.span(lo, hi)`, or the bytes fetched ahead when :data:`read_ahead` is set.

    Raises ColdRead when a blocking source's span was not fetched ahead; OSError
    or FrameCorrupt from the source.
    """
    if src.blocking:
        ahead = read_ahead.get()
        if ahead is not None:
            got = ahead.get(src, lo, hi)
            if got is None:
                raise ColdRead(src, lo, hi)
            return got
    return src.span(lo, hi)


class Chunk:
    """WAL-encoded frames of one write (or a replayed WAL file) held in memory.

    `first_seq`/`last_seq` bound the seqs whose slots point here; the topic
    frees the chunk once none does.
    """

    __slots__ = ("buf", "first_seq", "last_seq")

    hdr = WAL_HDR
    verify = False
    blocking = False
    name = "memory"

    def __init__(self, buf: Buf, first_seq: int, last_seq: int) -> None:
        self.buf = buf
        self.first_seq = first_seq
        self.last_seq = last_seq

    def span(self, lo: int, hi: int) -> tuple[Buf, int]:
        return self.buf, 0

    def fetch(self, lo: int, hi: int) -> bytes:
        return bytes(self.buf[lo:hi])


def _span(src: FrameSource, offs: Ints, lens: Ints) -> tuple[Buf, int]:
    """One `span` of `src` covering every frame of a run."""
    if isinstance(offs, np.ndarray):
        return span_of(src, int(offs.min()), int((offs + lens).max()))
    return span_of(src, min(offs), max(o + ln for o, ln in zip(offs, lens, strict=True)))


#: Shortest run the compiled renderer takes: below it, its fixed cost (about 3 µs
#: of argument conversion) is more than the Python loop spends (live delivery to a
#: watcher is usually a run of one or two records).
NATIVE_MIN_RUN = 8


def render_frames(
    src: FrameSource,
    seqs: Ints,
    offs: Ints,
    lens: Ints,
    tss: Ints,
    out: list[bytes],
    node_json: dict[bytes, bytes],
    *,
    include_tags: bool = False,
    include_meta: bool = True,
    include_data: bool = True,
) -> None:
    """Append the wire object (docs/API.md, "4. Records") of each record to `out`.

    The four sequences run in parallel, one entry per record of `src`
    (`offs`/`lens` locate its frame in bytes, `tss` its ts in ms); numpy int64
    arrays avoid a conversion. What a record carries is read from its frame's
    own flags byte (a slot's flags, loaded from `.idx`, are a hint that a torn
    delete flip can spoil).
    One `span` covers the run. Raises FrameCorrupt when a verified source holds
    a bad frame, OSError when it cannot be read.
    """
    n = len(seqs)
    if not n:
        return
    if native_render is not None and n >= NATIVE_MIN_RUN:
        buf, base = _span(src, offs, lens)
        bad = native_render(
            out,
            buf,
            base,
            np.asarray(seqs, np.int64),
            np.asarray(offs, np.int64),
            np.asarray(lens, np.int64),
            np.asarray(tss, np.int64),
            src.hdr,
            src.verify,
            include_tags,
            include_meta,
            include_data,
        )
        if bad is not None:
            i, why = bad
            raise FrameCorrupt(src.name, int(seqs[i]), why)
        return
    offs_l, lens_l = _list(offs), _list(lens)
    buf, base = _span(src, offs_l, lens_l)
    python_render(
        src,
        buf,
        base,
        _list(seqs),
        offs_l,
        lens_l,
        _list(tss),
        out,
        node_json,
        include_tags=include_tags,
        include_meta=include_meta,
        include_data=include_data,
    )


def _list(xs: Ints) -> Sequence[int]:
    return xs.tolist() if isinstance(xs, np.ndarray) else xs


def python_render(
    src: FrameSource,
    buf: Buf,
    base: int,
    seqs: Sequence[int],
    offs: Sequence[int],
    lens: Sequence[int],
    tss: Sequence[int],
    out: list[bytes],
    node_json: dict[bytes, bytes],
    *,
    include_tags: bool,
    include_meta: bool,
    include_data: bool,
) -> None:
    """The reference renderer: :func:`render_frames` in Python, over `buf` at `base`.

    Used where the compiled renderer (`topics.format._render`) is not built, and
    by the tests that hold both to the same bytes.
    """
    n = len(seqs)
    hdr = src.hdr
    verify = src.verify
    plain_ok = include_data and not include_tags
    for i in range(n):
        o = offs[i] - base
        ln = lens[i]
        seq = seqs[i]
        if verify:
            why = check_frame(buf, o, ln, seq, hdr)
            if why is not None:
                raise FrameCorrupt(src.name, seq, why)
        if plain_ok:
            plain = plain_data(buf, o, ln, hdr)
            if plain is not None:
                out.append(b'{"$seq":%d,"$ts":%d,"data":%b}' % (seq, tss[i], cast(bytes, plain)))
                continue
        node, tag, data, meta = frame_fields(buf, o, ln, hdr)
        parts = [b'{"$seq":%d,"$ts":%d' % (seq, tss[i])]
        if node is not None:
            nb = node.encode()
            j = node_json.get(nb)
            if j is None:
                j = orjson.dumps(node)
                if len(node_json) < 100_000:
                    node_json[nb] = j
            parts.append(b',"$node":' + j)
        if include_tags and tag is not None:
            parts.append(b',"$tag":' + orjson.dumps(tag))
        if include_data:
            parts.append(b',"data":' + data)
        if include_meta and meta is not None:
            parts.append(b',"meta":' + meta)
        parts.append(b"}")
        out.append(b"".join(parts))


def collect_fields(
    src: FrameSource,
    seqs: Sequence[int],
    offs: Sequence[int],
    lens: Sequence[int],
    tss: Sequence[int],
    out: list[Any],
) -> None:
    """Append `(seq, ts, node, tag, data, meta)` of each record to `out` (no JSON rendering).

    Same inputs and errors as :func:`render_frames`; for protocol bridges (Kafka)
    that re-encode records themselves.
    """
    n = len(seqs)
    if not n:
        return
    buf, base = _span(src, offs, lens)
    hdr = src.hdr
    for i in range(n):
        o = offs[i] - base
        ln = lens[i]
        seq = seqs[i]
        if src.verify:
            why = check_frame(buf, o, ln, seq, hdr)
            if why is not None:
                raise FrameCorrupt(src.name, seq, why)
        node, tag, data, meta = frame_fields(buf, o, ln, hdr)
        out.append((seq, tss[i], node, tag, data, meta))
