"""A streaming order pipeline on Spark over topics (issue 4 §5).

Reads the topic `orders` from a running topics server as a stream, counts the
orders, units and revenue of each SKU per event-time window, and writes every
closed window twice: as a record to the topic `orders.by_window` and as a row
of a Parquet table. Both outputs are exactly-once across restarts: each query
keeps its own checkpoint, the topics sink sends idempotency keys derived from
the query and micro-batch ids, and Spark's file sink commits per batch.

An order is a JSON object::

    {"order_id": "o-17", "sku": "B-77", "qty": 3, "price": 9.5, "placed_at": 1767225600450}

`placed_at` (ms since the epoch) is the event time; an order without it falls
back to the record's server timestamp. A window is written once the watermark
(the newest event time seen minus `--watermark`) has passed its end.

Run it locally (needs the `spark` extra of `topics-server`, which the venv of `scripts/serve`/`scripts/test` has, and Java 17)::

    python examples/orders_pipeline.py --url http://127.0.0.1:4000 \\
        --parquet ./orders_by_window --checkpoint ./checkpoints/orders

or on a cluster: `spark-submit --master spark://host:7077 examples/orders_pipeline.py ...`
(README "Running on a Spark cluster"). `--available-now` processes what is
there and exits (a batch-style run of the same streaming job).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

ORDER_SCHEMA = "order_id string, sku string, qty long, price double, placed_at long"


def aggregates(
    spark: Any,
    url: str,
    *,
    source: str = "orders",
    token: str | None = None,
    window: str = "1 minute",
    watermark: str = "30 seconds",
    starting: str = "earliest",
    max_per_trigger: int | None = None,
) -> Any:
    """The streaming DataFrame of window aggregates.

    Columns: `window_start`, `window_end` (timestamps), `sku`, `orders`,
    `units` (sum of qty), `revenue` (sum of qty * price).
    """
    from pyspark.sql import functions as F

    reader = (
        spark.readStream.format("topics")
        .option("url", url)
        .option("topics", source)
        .option("startingSeq", starting)
    )
    if token:
        reader = reader.option("token", token)
    if max_per_trigger:
        reader = reader.option("maxRecordsPerTrigger", str(max_per_trigger))
    orders = reader.load().select(
        F.from_json("data", ORDER_SCHEMA).alias("o"), F.col("ts").alias("record_ts")
    )
    event_time = F.coalesce(F.timestamp_millis(F.col("o.placed_at")), F.col("record_ts"))
    return (
        orders.select(event_time.alias("event_time"), "o.*")
        .where(F.col("sku").isNotNull())
        .withWatermark("event_time", watermark)
        .groupBy(F.window("event_time", window), "sku")
        .agg(
            F.count("*").alias("orders"),
            F.sum("qty").alias("units"),
            F.round(F.sum(F.col("qty") * F.col("price")), 2).alias("revenue"),
        )
        .select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "sku",
            "orders",
            "units",
            "revenue",
        )
    )


def start(
    spark: Any,
    url: str,
    *,
    parquet_dir: str,
    checkpoint_dir: str,
    source: str = "orders",
    dest: str = "orders.by_window",
    token: str | None = None,
    window: str = "1 minute",
    watermark: str = "30 seconds",
    available_now: bool = False,
    max_per_trigger: int | None = None,
) -> list[Any]:
    """Start the two streaming queries (topic sink, Parquet sink); returns them."""
    from pyspark.sql import functions as F

    agg = aggregates(
        spark,
        url,
        source=source,
        token=token,
        window=window,
        watermark=watermark,
        max_per_trigger=max_per_trigger,
    )
    as_records = agg.select(
        F.to_json(
            F.struct(
                F.unix_millis("window_start").alias("window_start"),
                F.unix_millis("window_end").alias("window_end"),
                "sku",
                "orders",
                "units",
                "revenue",
            )
        ).alias("data"),
        F.concat_ws("@", "sku", F.unix_millis("window_start").cast("string")).alias("tag"),
    )
    to_topic = (
        as_records.writeStream.format("topics")
        .option("url", url)
        .option("topic", dest)
        .option("checkpointLocation", os.path.join(checkpoint_dir, "to_topic"))
        .outputMode("append")
        .queryName("orders_by_window_to_topic")
    )
    if token:
        to_topic = to_topic.option("token", token)
    to_parquet = (
        agg.writeStream.format("parquet")
        .option("path", parquet_dir)
        .option("checkpointLocation", os.path.join(checkpoint_dir, "to_parquet"))
        .outputMode("append")
        .queryName("orders_by_window_to_parquet")
    )
    if available_now:
        to_topic = to_topic.trigger(availableNow=True)
        to_parquet = to_parquet.trigger(availableNow=True)
    else:
        to_topic = to_topic.trigger(processingTime="5 seconds")
        to_parquet = to_parquet.trigger(processingTime="5 seconds")
    return [to_topic.start(), to_parquet.start()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default=os.environ.get("TOPICS_URL", "http://127.0.0.1:4000"))
    p.add_argument("--token", default=os.environ.get("TOPICS_TOKEN"))
    p.add_argument("--source", default="orders")
    p.add_argument("--dest", default="orders.by_window")
    p.add_argument("--parquet", required=True, help="output directory of the Parquet table")
    p.add_argument("--checkpoint", required=True, help="checkpoint root (one subdir per query)")
    p.add_argument("--window", default="1 minute")
    p.add_argument("--watermark", default="30 seconds")
    p.add_argument("--max-per-trigger", type=int, default=None)
    p.add_argument("--available-now", action="store_true", help="process what is there, then stop")
    p.add_argument(
        "--master",
        default=None,
        help="master of a local run (default local[2]); spark-submit sets its own",
    )
    args = p.parse_args(argv)

    from pyspark.sql import SparkSession

    if "PYSPARK_GATEWAY_PORT" in os.environ:  # under spark-submit: the launcher set it up
        spark = SparkSession.builder.appName("orders-pipeline").getOrCreate()
    else:
        from topics.spark.session import local_session

        spark = local_session("orders-pipeline", master=args.master or "local[2]")
    queries = start(
        spark,
        args.url,
        parquet_dir=args.parquet,
        checkpoint_dir=args.checkpoint,
        source=args.source,
        dest=args.dest,
        token=args.token,
        window=args.window,
        watermark=args.watermark,
        available_now=args.available_now,
        max_per_trigger=args.max_per_trigger,
    )
    try:
        for q in queries:
            q.awaitTermination()
    except KeyboardInterrupt:
        for q in queries:
            q.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
