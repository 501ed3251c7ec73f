"""The on-disk format, in one place: pure encoding and decoding, no I/O.

* :mod:`topics.format.frame` -- WAL and segment frames, the flag bits, scanning;
* :mod:`topics.format.idx` -- the 20-byte `.idx` entry and the deleted flag;
* :mod:`topics.format.snapshot` -- the snapshot file's envelope and body codec.

Every other module (engine, storage, tools, the Spark reader) takes header
sizes, offsets and flags from here; docs/FORMATS.md describes the bytes.
"""
