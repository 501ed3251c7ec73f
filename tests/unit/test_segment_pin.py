"""A pinned SegmentSource keeps reading the file it pinned after a rewrite renames
new bytes over its name (docs/FORMATS.md, "Reclaim")."""

from __future__ import annotations

import os
from pathlib import Path

from topics.storage.fs import RealFs
from topics.storage.topicstore import SegmentSource, open_files


def _write(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(".new")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def test_pinned_source_reads_the_old_file_until_closed(tmp_path: Path) -> None:
    path = tmp_path / "seg-0000000000000001.data"
    _write(path, b"old-bytes-" * 10)
    fs = RealFs()
    src = SegmentSource(fs, str(path), sealed=True)
    buf, base = src.span(0, 10)
    assert bytes(buf[0 - base : 10 - base]) == b"old-bytes-"
    src.pin()
    _write(path, b"NEW-BYTES-" * 20)
    open_files.clear()  # the pool lets go of every handle: the pin holds its own
    buf, base = src.span(0, 10)
    assert bytes(buf[0 - base : 10 - base]) == b"old-bytes-"
    assert src.fetch(90, 200) == b"old-bytes-"  # short at the old end of file
    src.close()
    fresh = SegmentSource(fs, str(path), sealed=True)
    assert fresh.fetch(0, 10) == b"NEW-BYTES-"
    buf, base = src.span(0, 10)  # a closed source reopens by name
    assert bytes(buf[0 - base : 10 - base]) == b"NEW-BYTES-"
    src.close()
    fresh.close()
