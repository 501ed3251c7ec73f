"""The example pipeline (examples/orders_pipeline.py) end to end against a real server."""

from __future__ import annotations

import importlib.util
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests.spark.support import client, diff_all, write
from tests.support.process import ServerProcess

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "orders_pipeline.py"
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z, ms
MINUTE = 60_000


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("orders_pipeline", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _orders(first: int, n: int, start: int = T0) -> list[dict[str, Any]]:
    """`n` orders placed 300 ms apart from T0 on (in event-time order), SKUs A/B/C."""
    out = []
    for i in range(first, first + n):
        out.append(
            {
                "data": {
                    "order_id": f"o-{i}",
                    "sku": "ABC"[i % 3],
                    "qty": 1 + i % 4,
                    "price": 2.5 + i % 5,
                    "placed_at": start + (i - first) * 300,
                }
            }
        )
    return out


def _expected(orders: list[dict[str, Any]]) -> dict[tuple[int, str], tuple[int, int, float]]:
    acc: dict[tuple[int, str], list[float]] = defaultdict(lambda: [0, 0, 0.0])
    for o in orders:
        d = o["data"]
        w = d["placed_at"] - (d["placed_at"] - T0) % MINUTE
        a = acc[(w, d["sku"])]
        a[0] += 1
        a[1] += d["qty"]
        a[2] += d["qty"] * d["price"]
    return {k: (int(v[0]), int(v[1]), round(v[2], 2)) for k, v in acc.items()}


def _flush(at: int) -> dict[str, Any]:
    return {
        "data": {"order_id": f"flush-{at}", "sku": "A", "qty": 1, "price": 1.0, "placed_at": at}
    }


def _check(spark: Any, srv: ServerProcess, parquet: Path, want: dict[Any, Any]) -> None:
    """The topic and the Parquet table hold exactly the closed windows of `want`, once each
    (the newest window is still open: the watermark has not passed it)."""
    closed = {k: v for k, v in want.items() if k[0] < max(w for w, _ in want)}
    with client(srv) as c:
        out = diff_all(c, "orders.by_window")
    got_topic = {
        (r["data"]["window_start"], r["data"]["sku"]): (
            r["data"]["orders"],
            r["data"]["units"],
            r["data"]["revenue"],
        )
        for r in out
    }
    rows = spark.read.parquet(str(parquet)).collect()
    got_parquet = {
        (int(r["window_start"].timestamp() * 1000), r["sku"]): (
            r["orders"],
            r["units"],
            r["revenue"],
        )
        for r in rows
    }
    assert got_topic == closed
    assert got_parquet == closed
    assert len(out) == len(rows) == len(closed)  # each window written once
    assert {r["$tag"] for r in out} == {f"{s}@{w}" for (w, s) in closed}


def test_orders_pipeline_end_to_end(spark: Any, tmp_path: Path) -> None:
    ex = _example()
    srv = ServerProcess(tmp_path)
    parquet, ckpt = tmp_path / "by_window", tmp_path / "ckpt"
    try:
        orders = _orders(0, 600)
        with client(srv) as c:
            write(c, "orders", orders[:300])
            write(c, "orders", orders[300:])
            # An order ten minutes on moves the watermark past the first three windows.
            write(c, "orders", [_flush(T0 + 10 * MINUTE)])

        def run() -> None:
            queries = ex.start(
                spark,
                srv.base,
                parquet_dir=str(parquet),
                checkpoint_dir=str(ckpt),
                available_now=True,
                max_per_trigger=250,
            )
            for q in queries:
                q.awaitTermination(180)
                assert q.exception() is None, q.exception()

        run()
        _check(spark, srv, parquet, _expected([*orders, _flush(T0 + 10 * MINUTE)]))
        # Later orders, a second run from the checkpoints: only the new windows are added.
        more = _orders(600, 400, T0 + 11 * MINUTE)
        with client(srv) as c:
            write(c, "orders", more)
            write(c, "orders", [_flush(T0 + 20 * MINUTE)])
        run()
        flushes = [_flush(T0 + 10 * MINUTE), _flush(T0 + 20 * MINUTE)]
        _check(spark, srv, parquet, _expected([*orders, *more, *flushes]))
    finally:
        assert srv.stop() == 0, srv.log_text()
