"""Write a topics-jvm plan (JSON) from the Python planner.

`write_plan(path, data_dir, cold_dir, topics, value_format)` runs
`topics.spark.segments.load_offline` + `plan_slices` and writes one partition per
SegmentSlice, in the shape `topics.jvm.Plan` reads (see spark-jvm/README.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from topics.spark.segments import Bounds, load_offline, plan_slices


def slice_entry(sl: Any, value_format: str) -> dict[str, Any]:
    return {
        "topic": sl.topic,
        "first_seq": sl.first_seq,
        "lo": sl.lo,
        "hi": sl.hi,
        "data_path": sl.data_path,
        "idx_path": sl.idx_path,
        "alt_data_path": sl.alt_data_path,
        "alt_idx_path": sl.alt_idx_path,
        "ts_lo": sl.ts_lo,
        "ts_hi": sl.ts_hi,
        "keep_from_ts": sl.keep_from_ts,
        "deleted": sorted(sl.deleted),
        "value_format": value_format,
    }


def write_plan(
    path: str,
    data_dir: str,
    cold_dir: str | None,
    topics: Iterable[str] | None = None,
    value_format: str = "json",
) -> int:
    """Plan the read and write it to `path`; returns the number of partitions."""
    offline = load_offline(data_dir, cold_dir)
    names = list(topics) if topics is not None else sorted(offline)
    slices = plan_slices(offline, {t: Bounds() for t in names}, data_dir, cold_dir)
    body = {
        "value_format": value_format,
        "partitions": [slice_entry(s, value_format) for s in slices],
    }
    with open(path, "w") as f:
        json.dump(body, f, indent=1)
    return len(slices)
