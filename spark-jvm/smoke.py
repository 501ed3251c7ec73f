"""Smoke check of the topics-jvm source against the Python `topics` source.

Usage (from the repo root, venv on PATH, PYTHONPATH=src):
    spark-jvm/build.sh && python spark-jvm/smoke.py

1. XXH3-64 vectors: Python's xxhash against our Java port (Xxh3Check).
2. A data directory written by a real server (tests.support.process.ServerProcess):
   topics with tags, nodes, meta, non-ASCII text, deletes, a cap, odd JSON values,
   small segments, some moved to a cold tier.
3. For value formats json and binary: a plan from the Python planner
   (load_offline + plan_slices), read with format "topics-jvm", compared with the
   Python source's offline read of the same data (exceptAll both ways empty).
   Also a pruned select of three columns in another order.
4. A segment whose listed copy is removed after planning is read from the other tier.
5. Damage in a copy (a flipped payload byte, invalid UTF-8 data under a valid
   checksum, a wrong frame_len, a wrong seq, a cut .idx) must fail a count()
   (every column pruned) with an error naming the topic, the file, the seq and
   the reason.
Exits non-zero on any failure.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import xxhash

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(HERE))

from plan_json import write_plan  # noqa: E402
from tests.spark.support import client, write  # noqa: E402
from tests.support.process import ServerProcess  # noqa: E402

JAR = HERE / "build" / "topics-spark-jvm.jar"
ENV = {
    "TOPICS_SEGMENT_MAX_EVENTS": "50",
    "TOPICS_WAL_SHARDS": "2",
    "TOPICS_HOT_RETAIN_SEGMENTS": "1000000",
}
TOPICS = ["orders", "capped", "plain"]


def check_vectors(tmp: Path, gen: str, main: str) -> None:
    """Vectors from Python (`gen`) checked by a Java main of build/test-classes."""
    vec = tmp / (gen + ".txt")
    subprocess.run(
        [sys.executable, str(HERE / gen), str(vec)], check=True, stdout=subprocess.DEVNULL
    )
    r = subprocess.run(
        [
            "java",
            "-cp",
            f"{HERE / 'build' / 'test-classes'}:{HERE / 'build' / 'classes'}",
            main,
            str(vec),
        ],
        capture_output=True,
        text=True,
    )
    print(r.stdout.strip())
    if r.returncode != 0:
        raise SystemExit(f"FAIL: {main}")


def make_history(tmp: Path) -> tuple[Path, Path]:
    cold = tmp / "cold"
    srv = ServerProcess(tmp, env=dict(ENV, TOPICS_COLD_DIR=str(cold)))
    try:
        with client(srv) as c:
            for b in range(4):
                write(
                    c,
                    "orders",
                    [
                        {
                            "data": {
                                "order": b * 100 + j,
                                "sku": f"S-{j % 7}",
                                "note": "é€😀" * (j % 3),
                            },
                            "tag": f"t{j % 5}",
                            "node": f"gw-{j % 2}-ü",
                            **({"meta": {"trace": f"x{j}", "n": j}} if j % 4 == 0 else {}),
                        }
                        for j in range(100)
                    ],
                )
            assert c.post("/v0/topics/orders/delete", json={"match": "t3"}).status_code == 200
            assert c.post("/v0/topics/orders/delete", json={"before_seq": 20}).status_code == 200
            assert c.put("/v0/topics/capped", json={"cap_records": 120}).status_code in (200, 201)
            for b in range(5):
                write(c, "capped", [{"data": b * 100 + j} for j in range(100)])
            write(
                c,
                "plain",
                [
                    {"data": None},
                    {"data": [1, 2.5, {"x": "y"}]},
                    {"data": 'text with "quotes" and \\ and \n'},
                    {"data": {"nested": {"deep": [True, False, None]}}, "meta": {}},
                    {"data": 12345678901234},
                    {"data": "x" * 5000, "tag": "", "node": ""},
                ],
            )
    finally:
        assert srv.stop() == 0, (tmp / "server.log").read_text()
    # Move the older sealed segments of "orders" to the cold tier (as tests/spark/conftest.py does).
    from topics.spark.segments import load_offline

    data = tmp / "data"
    sealed = [s for s in load_offline(str(data))["orders"].cat.segments if s.sealed]
    for i, s in enumerate(sealed[:-2]):
        for p in (Path(s.data_path), Path(s.idx_path)):
            dst = cold / p.relative_to(data)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, dst)
            if i != 0:
                p.unlink()
    return data, cold


def compare(spark, data: Path, cold: Path, tmp: Path, value_format: str) -> bool:
    plan = tmp / f"plan-{value_format}.json"
    n = write_plan(str(plan), str(data), str(cold), TOPICS, value_format)
    jvm = spark.read.format("topics-jvm").option("plan", str(plan)).load()
    py = (
        spark.read.format("topics")
        .option("path", str(data))
        .option("coldDir", str(cold))
        .option("topics", ",".join(TOPICS))
        .option("valueFormat", value_format)
        .load()
    )
    same_schema = jvm.schema == py.schema
    a, b = jvm.exceptAll(py).count(), py.exceptAll(jvm).count()
    cj, cp = jvm.count(), py.count()
    # Column pruning: a subset, in another order, must equal the same subset of the Python read.
    cols = ["data", "seq", "tag"]
    pa_, pb_ = (
        jvm.select(*cols).exceptAll(py.select(*cols)).count(),
        py.select(*cols).exceptAll(jvm.select(*cols)).count(),
    )
    plan_text = jvm.select(*cols)._jdf.queryExecution().executedPlan().toString()
    scanned = re.search(r"BatchScan topics-jvm\(.*?\)\[(.*?)\]", plan_text)
    pruned = scanned is not None and [c.split("#")[0] for c in scanned.group(1).split(", ")] == [
        "seq",
        "tag",
        "data",
    ]
    ok = (
        same_schema
        and a == 0
        and b == 0
        and cj == cp
        and cj > 0
        and pa_ == 0
        and pb_ == 0
        and pruned
    )
    print(
        f"value_format={value_format}: {n} partitions, jvm rows={cj}, python rows={cp}, "
        f"schema equal={same_schema}, jvm-python={a}, python-jvm={b}, "
        f"pruned select {cols} (pruned in plan={pruned}) differences={pa_}+{pb_} -> {'OK' if ok else 'FAIL'}"
    )
    if not same_schema:
        print(
            "  jvm schema:", jvm.schema.simpleString(), "\n  py schema: ", py.schema.simpleString()
        )
    return ok


def moved(spark, data: Path, cold: Path, tmp: Path) -> bool:
    """A segment whose listed copy is gone after planning is read from the other tier."""
    from topics.spark.segments import load_offline

    copy = tmp / "moved"
    shutil.copytree(data, copy / "data")
    shutil.copytree(cold, copy / "cold")
    plan = tmp / "plan-moved.json"
    write_plan(str(plan), str(copy / "data"), str(copy / "cold"), ["orders"], "json")
    # The first sealed segment of "orders" is in both tiers; the hot copy is listed.
    seg = load_offline(str(copy / "data"), str(copy / "cold"))["orders"].cat.segments[0]
    hot = [Path(seg.data_path), Path(seg.idx_path)]
    if not all(p.is_relative_to(copy / "data") and p.exists() for p in hot):
        print("moved segment: FAIL: expected the first segment of orders in the hot tier")
        return False
    before = spark.read.format("topics-jvm").option("plan", str(plan)).load()
    rows = sorted(before.collect())
    for p in hot:
        p.unlink()
    after = sorted(spark.read.format("topics-jvm").option("plan", str(plan)).load().collect())
    ok = rows == after and len(rows) > 0
    print(
        f"moved segment (hot copy removed after planning, cold copy read): {len(after)} rows -> "
        f"{'OK' if ok else 'FAIL'}"
    )
    return ok


def _flip_checksum(raw: bytearray) -> None:
    raw[37 + 2] ^= 0x01  # a payload byte of the first frame; the checksum no longer matches


def _bad_utf8_data(raw: bytearray) -> None:
    # The first frame of "plain" holds data `null` and no node/tag/meta: make it invalid
    # UTF-8 and write a checksum that matches, so only the UTF-8 check can catch it.
    ln = struct.unpack_from("<I", raw, 0)[0] + 4
    raw[37] = 0xFF
    struct.pack_into("<Q", raw, ln - 8, xxhash.xxh3_64_intdigest(bytes(raw[4 : ln - 8])))


def _frame_len(raw: bytearray) -> None:
    struct.pack_into("<I", raw, 0, struct.unpack_from("<I", raw, 0)[0] + 1)


def _other_seq(raw: bytearray) -> None:
    struct.pack_into("<Q", raw, 13, 999)


# (name, change to .data, keep only this many .idx bytes or None, expected reason, file named)
DAMAGE = [
    ("checksum", _flip_checksum, None, "seq 1: checksum mismatch", "data"),
    ("data not UTF-8", _bad_utf8_data, None, "seq 1: data not UTF-8", "data"),
    ("frame_len", _frame_len, None, "seq 1: frame_len does not match the indexed length", "data"),
    ("seq", _other_seq, None, "seq 1: frame carries another seq", "data"),
    ("short .idx", None, 2 * 20, "seq 3: .idx ends before seq", "idx"),
]


def damaged(spark, data: Path, cold: Path, tmp: Path) -> bool:
    """Each kind of damage fails a count() with topic, file, seq and reason."""
    from topics.spark.segments import load_offline

    ok_all = True
    spark.sparkContext.setLogLevel("OFF")  # the executor's stack traces are expected here
    for k, (name, change, idx_keep, want, which) in enumerate(DAMAGE):
        copy = tmp / f"damaged-{k}"
        shutil.copytree(data, copy / "data")
        shutil.copytree(cold, copy / "cold")
        seg = load_offline(str(copy / "data"), str(copy / "cold"))["plain"].cat.segments[0]
        plan = tmp / f"plan-damaged-{k}.json"
        write_plan(str(plan), str(copy / "data"), str(copy / "cold"), ["plain"], "json")
        if change is not None:
            raw = bytearray(Path(seg.data_path).read_bytes())
            change(raw)
            Path(seg.data_path).write_bytes(bytes(raw))
        if idx_keep is not None:
            Path(seg.idx_path).write_bytes(Path(seg.idx_path).read_bytes()[:idx_keep])
        named = seg.data_path if which == "data" else seg.idx_path
        try:
            n = spark.read.format("topics-jvm").option("plan", str(plan)).load().count()
        except Exception as e:
            text = str(e)
            line = next((ln for ln in text.splitlines() if "FrameCorruptException" in ln), "")
            line = line[line.find("topics.jvm.FrameCorruptException") :].strip()
            ok = f"topic plain, segment {named}, {want}" in line
            print(f"damaged ({name}): {'OK' if ok else 'FAIL'}: {line[:400]}")
        else:
            ok = False
            print(f"damaged ({name}): FAIL: the read succeeded with {n} rows")
        ok_all &= ok
    spark.sparkContext.setLogLevel("ERROR")
    return ok_all


def main() -> None:
    if not JAR.exists():
        raise SystemExit(f"{JAR} missing: run spark-jvm/build.sh first")
    with tempfile.TemporaryDirectory(prefix="topics-jvm-smoke-") as t:
        tmp = Path(t)
        check_vectors(tmp, "xxh3_vectors.py", "topics.jvm.Xxh3Check")
        check_vectors(tmp, "utf8_vectors.py", "topics.jvm.Utf8Check")
        data, cold = make_history(tmp)
        from topics.spark.session import local_session

        spark = local_session("topics-jvm-smoke", conf={"spark.jars": str(JAR)})
        spark.sparkContext.setLogLevel("ERROR")
        try:
            ok = all(
                [
                    compare(spark, data, cold, tmp, "json"),
                    compare(spark, data, cold, tmp, "binary"),
                    moved(spark, data, cold, tmp),
                    damaged(spark, data, cold, tmp),
                ]
            )
        finally:
            spark.stop()
    print("SMOKE", "OK" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    main()
