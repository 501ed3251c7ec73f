"""The PySpark data source `topics`: batch and streaming reads, batch and streaming writes.

See docs/SPARK.md. Built on the Python Data Source API (`pyspark.sql.datasource`,
pyspark >= 4.1 for filter pushdown, 4.2 for `latestOffset(start, limit)`).
Register it with :func:`topics.spark.register` or rely on the automatic
registration of the `pyspark_topics` module installed with the `spark` extra of `topics-server`.

Reads (schema :data:`~topics.spark.segments.DDL_SCHEMA`):

* `path` (a data directory; plus `coldDir`, a directory or an
  `s3://bucket/prefix` url): offline batch read of segment files, one
  partition per segment (:mod:`topics.spark.segments`).
* `url` (plus `token`): batch or streaming read through a running server's
  `diff` (:mod:`topics.spark.server`), offsets `{"topic": seq}`.

Writes: `url` (plus `token`); the DataFrame carries `data` (JSON text, string
or binary) and optionally `topic` (else the `topic` option), `tag`, `node`,
`meta` (a JSON object as text); other columns are ignored, so a DataFrame read
from this source can be written back as is.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import BinaryType, StringType, StructType

from topics.spark import options as opt
from topics.spark.options import EARLIEST, LATEST, OptionError, SeqSpec
from topics.spark.segments import (
    DDL_SCHEMA,
    Bounds,
    SegmentSlice,
    load_offline,
    plan_slices,
    read_slice,
    select_topics,
)
from topics.spark.server import (
    Client,
    DataLossError,
    RecordSink,
    SinkStats,
    TopicRange,
    check_topic_name,
    read_range,
)
from topics.storage.objstore import cold_root, is_object_url

__all__ = ["TopicsDataSource"]

log = logging.getLogger(__name__)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)


def _schema_ddl(value_format: str) -> str:
    if value_format == "binary":
        return DDL_SCHEMA.replace("data string", "data binary")
    return DDL_SCHEMA


class TopicsDataSource(DataSource):
    """Format `"topics"`. Options are listed in docs/SPARK.md; a bad one raises OptionError."""

    @classmethod
    def name(cls) -> str:
        return "topics"

    def _value_format(self) -> str:
        return opt.parse_choice(self.options, "valueFormat", "json", opt.VALUE_FORMATS)

    def schema(self) -> str:
        return _schema_ddl(self._value_format())

    def _check_schema(self, schema: StructType) -> None:
        want = list(_COLUMNS)
        got = [f.name for f in schema.fields]
        if got != want:
            raise OptionError(
                f"the topics source has the fixed schema ({self.schema()}); "
                f"a user-given schema with columns {got} is not supported"
            )

    def _check_reader(self) -> None:
        """Option `reader=jvm` reaching this (Python) source: the session lacks the jar."""
        if opt.parse_choice(self.options, "reader", "auto", opt.READERS) == "jvm":
            raise OptionError(
                "option reader=jvm: the JVM reader is not on this session (its jar is added "
                "by topics.spark.local_session, spark.jars or topics.spark.add_jar; "
                'docs/SPARK.md, "Two readers")'
            )

    def reader(self, schema: StructType) -> DataSourceReader:
        self._check_schema(schema)
        self._check_reader()
        path = opt.get(self.options, "path")
        url = opt.get(self.options, "url")
        if path and url:
            raise OptionError("set only one of the options path (offline) and url (server)")
        if path:
            opt.check_known(self.options, "offline read")
            if opt.parse_bool(self.options, "filterPushdown", False):
                return _OfflinePushdownReader(self.options, self._value_format())
            return _OfflineReader(self.options, self._value_format())
        if url:
            opt.check_known(self.options, "server read")
            return _ServerBatchReader(self.options, self._value_format())
        raise OptionError(
            "set the option path (a topics data directory, read offline) "
            "or url (a running server, e.g. http://127.0.0.1:4000)"
        )

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        self._check_schema(schema)
        self._check_reader()
        if opt.get(self.options, "path"):
            raise OptionError(
                "streaming reads go through a server: set the option url instead of path"
            )
        if not opt.get(self.options, "url"):
            raise OptionError("streaming reads need the option url (e.g. http://127.0.0.1:4000)")
        opt.check_known(self.options, "stream")
        return _StreamReader(self.options, self._value_format())

    def writer(self, schema: StructType, overwrite: bool) -> _BatchWriter:
        if overwrite:
            raise OptionError(
                "the topics sink only appends: use mode('append') (records are never replaced)"
            )
        opt.check_known(self.options, "sink")
        return _BatchWriter(_SinkConfig.parse(self.options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> _StreamWriter:
        if overwrite:
            raise OptionError("the topics sink only appends: use outputMode('append' or 'update')")
        opt.check_known(self.options, "sink")
        return _StreamWriter(_SinkConfig.parse(self.options, schema))


_COLUMNS = ("topic", "seq", "ts", "tag", "node", "meta", "data")


# -- offline batch read -------------------------------------------------------------


@dataclass(frozen=True)
class _SlicePartition(InputPartition):
    slice: SegmentSlice


def _ts_us(v: Any, option: str) -> int | None:
    """A pushed-down timestamp literal as µs since the epoch (None: not understood)."""
    if isinstance(v, datetime):
        if v.tzinfo is None:
            v = v.astimezone()  # pyspark hands naive datetimes in the local zone
        return (v - _EPOCH) // _US
    return None


def _ceil_div(a: int, b: int) -> int:
    return -((-a) // b)


class _Pushdown:
    """Seq and ts bounds (inclusive; ts in ms) and topic names collected from filters."""

    def __init__(self) -> None:
        self.seq_lo = 1
        self.seq_hi: int | None = None
        self.ts_lo: int | None = None
        self.ts_hi: int | None = None
        self.topics: set[str] | None = None

    def _seq(self, lo: int | None, hi: int | None) -> None:
        if lo is not None:
            self.seq_lo = max(self.seq_lo, lo)
        if hi is not None:
            self.seq_hi = hi if self.seq_hi is None else min(self.seq_hi, hi)

    def _ts(self, lo: int | None, hi: int | None) -> None:
        if lo is not None:
            self.ts_lo = lo if self.ts_lo is None else max(self.ts_lo, lo)
        if hi is not None:
            self.ts_hi = hi if self.ts_hi is None else min(self.ts_hi, hi)

    def absorb(self, f: Filter) -> bool:
        """Apply `f`; True when it is applied exactly (Spark need not re-check it)."""
        col = getattr(f, "attribute", None)
        if col == ("topic",):
            if isinstance(f, EqualTo) and isinstance(f.value, str):
                names = {f.value}
            elif isinstance(f, In) and all(isinstance(v, str) for v in f.value):
                names = set(f.value)
            else:
                return False
            self.topics = names if self.topics is None else self.topics & names
            return True
        if col == ("seq",):
            v = getattr(f, "value", None)
            if isinstance(f, In):
                vals = [x for x in f.value if isinstance(x, int) and not isinstance(x, bool)]
                if len(vals) == len(f.value) and vals:
                    self._seq(min(vals), max(vals))  # narrows; Spark still checks membership
                return False
            if isinstance(v, bool) or not isinstance(v, int):
                return False
            if isinstance(f, EqualTo):
                self._seq(v, v)
            elif isinstance(f, GreaterThan):
                self._seq(v + 1, None)
            elif isinstance(f, GreaterThanOrEqual):
                self._seq(v, None)
            elif isinstance(f, LessThan):
                self._seq(None, v - 1)
            elif isinstance(f, LessThanOrEqual):
                self._seq(None, v)
            else:
                return False
            return True
        if col == ("ts",):
            if isinstance(f, In):
                return False
            us = _ts_us(getattr(f, "value", None), "ts")
            if us is None:
                return False
            # Stored ts are whole ms; turn a µs comparison into inclusive ms bounds.
            if isinstance(f, EqualTo):
                if us % 1000:
                    self._ts(1, 0)  # nothing is stored at a fractional ms
                else:
                    self._ts(us // 1000, us // 1000)
            elif isinstance(f, GreaterThan):
                self._ts(us // 1000 + 1, None)
            elif isinstance(f, GreaterThanOrEqual):
                self._ts(_ceil_div(us, 1000), None)
            elif isinstance(f, LessThan):
                self._ts(None, _ceil_div(us, 1000) - 1)
            elif isinstance(f, LessThanOrEqual):
                self._ts(None, us // 1000)
            else:
                return False
            return True
        return False


def _batch_range(options: Mapping[str, str]) -> tuple[SeqSpec, SeqSpec]:
    """`startingSeq` (default earliest) and `endingSeq` (default latest) of a batch read.

    Raises OptionError for `startingSeq=latest` (streams only) and `endingSeq=earliest`.
    """
    starting = opt.parse_seq_spec(options, "startingSeq", EARLIEST)
    ending = opt.parse_seq_spec(options, "endingSeq", LATEST)
    if starting.default == LATEST or any(v == LATEST for _, v in starting.per_topic):
        raise OptionError(
            "startingSeq=latest is for streaming reads; a batch read needs "
            "earliest, a seq or a JSON object of seqs"
        )
    if ending.default == EARLIEST or any(v == EARLIEST for _, v in ending.per_topic):
        raise OptionError("endingSeq=earliest is not accepted; use latest, a seq or a JSON object")
    names = {n for n, _ in (*starting.per_topic, *ending.per_topic)}
    for topic in (None, *sorted(names)):
        s = starting.default if topic is None else starting.for_topic(topic)
        e = ending.default if topic is None else ending.for_topic(topic)
        if s >= 0 and e >= 0 and s > e:
            where = "" if topic is None else f" for topic {topic}"
            raise OptionError(
                f"startingSeq={s} is past endingSeq={e}{where} (endingSeq is exclusive: "
                "a range that reads nothing has startingSeq == endingSeq)"
            )
    return starting, ending


def _ms_option(options: Mapping[str, str], name: str) -> int | None:
    return opt.parse_int(options, name, None, minimum=0)


def _cold_dir(options: Mapping[str, str]) -> str | None:
    """Option `coldDir`: a directory, or an `s3://bucket/prefix` url checked for its
    shape only (no request; each process builds its own client from its `AWS_*`
    environment, docs/SPARK.md "Cold tier in an object store")."""
    value = opt.get(options, "coldDir")
    if value is None:
        return None
    if is_object_url(value):
        try:
            cold_root(value)
        except ValueError as e:
            raise OptionError(f"option coldDir: {e}") from None
        except ImportError as e:
            raise OptionError(
                f"option coldDir: an s3:// cold tier needs the obstore package ({e})"
            ) from None
    elif "://" in value:
        raise OptionError(
            f"option coldDir: {value!r}: a cold tier is a directory or an s3://bucket/prefix "
            "url (s3a:// and other schemes are not read)"
        )
    return value


class _OfflineReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str], value_format: str) -> None:
        self.data_dir = str(opt.get(options, "path"))
        self.cold_dir = _cold_dir(options)
        self.value_format = value_format
        self.selector = opt.parse_topics(options)
        self.starting, self.ending = _batch_range(options)
        self.ts_start = _ms_option(options, "startingTimestamp")
        self.ts_end = _ms_option(options, "endingTimestamp")
        self.batch_rows = opt.parse_int(options, "batchRows", 32768, minimum=1, maximum=1 << 20)
        self.pushed = _Pushdown()

    def _bounds(self, topic: str) -> Bounds:
        p = self.pushed
        lo = p.seq_lo
        s = self.starting.for_topic(topic)
        if s >= 0:
            lo = max(lo, s)
        hi = p.seq_hi
        e = self.ending.for_topic(topic)
        if e >= 0:
            hi = e - 1 if hi is None else min(hi, e - 1)
        ts_lo = p.ts_lo
        if self.ts_start is not None:
            ts_lo = self.ts_start if ts_lo is None else max(ts_lo, self.ts_start)
        ts_hi = p.ts_hi
        if self.ts_end is not None:
            ts_hi = self.ts_end - 1 if ts_hi is None else min(ts_hi, self.ts_end - 1)
        return Bounds(lo, hi, ts_lo, ts_hi)

    def partitions(self) -> Sequence[InputPartition]:
        topics = load_offline(self.data_dir, self.cold_dir)
        names = select_topics(topics, self.selector.names, self.selector.pattern)
        if self.selector.names is not None:
            unknown = [n for n in self.selector.names if n not in topics]
            if unknown:
                raise OptionError(
                    f"topic {unknown[0]} is not in the data directory {self.data_dir} "
                    "(its newest snapshot does not name it: it does not exist, or was "
                    "created after the last checkpoint)"
                )
        if self.pushed.topics is not None:
            names = [n for n in names if n in self.pushed.topics]
        slices = plan_slices(
            topics, {n: self._bounds(n) for n in names}, self.data_dir, self.cold_dir
        )
        return [_SlicePartition(s) for s in slices]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, _SlicePartition):
            return  # no partitions planned: Spark still runs one task, with None
        yield from read_slice(partition.slice, self.value_format, self.batch_rows or 32768)


class _OfflinePushdownReader(_OfflineReader):
    """The offline reader plus `pushFilters` (option `filterPushdown=true`).

    Spark raises DATA_SOURCE_PUSHDOWN_DISABLED for a reader that defines
    `pushFilters` unless `spark.sql.python.filterPushdown.enabled=true`, and
    (Spark 4.3) keeps the scan planned for the last filtered query of a loaded
    DataFrame for later queries of that DataFrame without filters. Hence opt-in:
    see docs/SPARK.md "Filter pushdown".
    """

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        for f in filters:
            if not self.pushed.absorb(f):
                yield f


# -- server reads -------------------------------------------------------------------


@dataclass(frozen=True)
class _RangePartition(InputPartition):
    range: TopicRange


class _ServerOptions:
    def __init__(self, options: Mapping[str, str], value_format: str) -> None:
        self.url = str(opt.get(options, "url"))
        self.token = opt.get(options, "token")
        self.value_format = value_format
        self.selector = opt.parse_topics(options)
        self.fail_on_data_loss = opt.parse_bool(options, "failOnDataLoss", True)
        self.max_seqs_per_partition = opt.parse_int(
            options, "maxSeqsPerPartition", 100_000, minimum=1
        )
        self.timeout_s = (opt.parse_int(options, "timeoutMs", 30_000, minimum=1) or 30_000) / 1000
        for name in ("startingTimestamp", "endingTimestamp", "coldDir"):
            if opt.get(options, name) is not None:
                raise OptionError(f"option {name} applies to offline reads (path), not to url")
        Client(self.url).close()  # validates the url early (no request is made)

    def client(self) -> Client:
        return Client(self.url, self.token, timeout_s=self.timeout_s)

    def topics(self, client: Client) -> list[str]:
        if self.selector.names is not None:
            return list(self.selector.names)
        return sorted(n for n in client.list_topics() if self.selector.matches(n))

    def ranges(self, start: Mapping[str, int], end: Mapping[str, int]) -> list[_RangePartition]:
        step = self.max_seqs_per_partition or 100_000
        out: list[_RangePartition] = []
        for topic in sorted(end):
            if topic not in start:
                continue  # first seen in this batch: its range starts with the next one
            s, e = int(start[topic]), int(end[topic])
            if e < s:
                s = 0  # the topic was recreated (failOnDataLoss=false): read the new instance
            for a in range(s, e, step):
                out.append(_RangePartition(TopicRange(topic, a, min(a + step, e))))
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, _RangePartition):
            return  # no partitions planned: Spark still runs one task, with None
        with self.client() as c:
            yield from read_range(
                c, partition.range, self.value_format, fail_on_data_loss=self.fail_on_data_loss
            )


def _start_cursor(spec: int, state: Mapping[str, Any]) -> int:
    """The cursor (`from_seq`) a position resolves to for a topic in `state`.

    See docs/API.md, "6.2 `GET /v0/topics/:topic`".
    """
    if spec == EARLIEST:
        return max(int(state["earliest_seq"]) - 1, 0)
    if spec == LATEST:
        return int(state["head_seq"])
    return max(spec - 1, 0)


class _ServerBatchReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str], value_format: str) -> None:
        self.o = _ServerOptions(options, value_format)
        self.starting, self.ending = _batch_range(options)

    def partitions(self) -> Sequence[InputPartition]:
        start: dict[str, int] = {}
        end: dict[str, int] = {}
        with self.o.client() as c:
            for t in self.o.topics(c):
                st = c.topic_state(t)
                if st is None:
                    raise OptionError(f"topic {t} does not exist on {self.o.url}")
                start[t] = _start_cursor(self.starting.for_topic(t), st)
                e = self.ending.for_topic(t)
                head = int(st["head_seq"])
                end[t] = head if e < 0 else min(max(e - 1, 0), head)
                end[t] = max(end[t], start[t])
        return self.o.ranges(start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self.o.read(partition)


class _StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over `(start, end]` per topic; offsets `{"topic": seq}`.

    A topic that appears later (a `topicPattern` match, or a listed topic that
    is created) is added with its `startingSeq` position resolved when first
    seen; its records are read from the following micro-batch on.
    """

    def __init__(self, options: Mapping[str, str], value_format: str) -> None:
        self.o = _ServerOptions(options, value_format)
        self.starting = opt.parse_seq_spec(options, "startingSeq", LATEST)
        if opt.get(options, "endingSeq") is not None:
            raise OptionError("endingSeq applies to batch reads; a stream has no end")
        self.max_per_trigger = opt.parse_int(options, "maxRecordsPerTrigger", None, minimum=1)
        self._until: dict[str, int] | None = None

    def _heads(self, c: Client) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for t in self.o.topics(c):
            st = c.topic_state(t)
            if st is not None:
                out[t] = st
        return out

    def initialOffset(self) -> dict[str, int]:
        with self.o.client() as c:
            return {
                t: _start_cursor(self.starting.for_topic(t), st) for t, st in self._heads(c).items()
            }

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.max_per_trigger:
            return ReadMaxRows(self.max_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        with self.o.client() as c:
            self._until = {t: int(st["head_seq"]) for t, st in self._heads(c).items()}

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        with self.o.client() as c:
            states = self._heads(c)
        end: dict[str, int] = {}
        lags: dict[str, int] = {}
        for t, s in start.items():
            st = states.get(t)
            if st is None:
                err = DataLossError(t, int(s) + 1, int(s) + 1, "deleted")
                if self.o.fail_on_data_loss:
                    raise err
                log.warning("%s (failOnDataLoss=false: kept at its offset)", err)
                end[t] = int(s)
                continue
            head = int(st["head_seq"])
            if self._until is not None:
                head = min(head, self._until.get(t, int(s)))
            if head < int(s):
                err = DataLossError(t, 1, int(s), "recreated")
                if self.o.fail_on_data_loss:
                    raise err
                log.warning("%s (failOnDataLoss=false: reading the new topic from seq 1)", err)
            end[t] = head
            lags[t] = max(head - int(s), 0) if head >= int(s) else head
        for t, st in states.items():
            if t not in start:
                if self._until is not None and t not in self._until:
                    continue  # appeared after the AvailableNow cut-off
                # Created after the query started: all of it is new (Kafka reads new
                # partitions from the earliest offset too).
                end[t] = _start_cursor(EARLIEST, st)
        if isinstance(limit, ReadMaxRows):
            end = _cap(start, end, lags, int(limit.max_rows))
        return end

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        return self.o.ranges(start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self.o.read(partition)

    def commit(self, end: dict[str, int]) -> None:
        pass  # the server keeps no cursor; the checkpoint is the only state


def _cap(
    start: Mapping[str, int], end: dict[str, int], lags: Mapping[str, int], max_rows: int
) -> dict[str, int]:
    """Share `max_rows` seqs among the topics in proportion to their lag (as Kafka does)."""
    total = sum(lags.values())
    if total <= max_rows:
        return end
    out = dict(end)
    left = max_rows
    for t in sorted(lags, key=lambda k: -lags[k]):
        lag = lags[t]
        if lag <= 0:
            continue
        share = max(1, min(lag, left, (lag * max_rows) // total)) if left else 0
        s = int(start[t])
        base = 0 if end[t] < s else s
        out[t] = base + share
        left -= share
    return out


# -- writes -------------------------------------------------------------------------


@dataclass(frozen=True)
class _SinkConfig:
    url: str
    token: str | None
    topic: str | None
    key: str | None
    max_records: int
    max_bytes: int
    timeout_s: float
    columns: tuple[str, ...]

    @staticmethod
    def parse(options: Mapping[str, str], schema: StructType) -> _SinkConfig:
        url = opt.get(options, "url")
        if not url:
            raise OptionError("the topics sink needs the option url (e.g. http://127.0.0.1:4000)")
        Client(url).close()
        topic = opt.get(options, "topic")
        if topic is not None:
            try:
                check_topic_name(topic)
            except ValueError as e:
                raise OptionError(f"option topic: {e}") from None
        types = {f.name: f.dataType for f in schema.fields}
        if "data" not in types:
            raise OptionError("the DataFrame written to topics needs a data column (JSON text)")
        if not isinstance(types["data"], StringType | BinaryType):
            raise OptionError(
                f"column data must be string or binary holding JSON text, not "
                f"{types['data'].simpleString()}; use to_json(...) to serialise a struct"
            )
        for c in ("topic", "tag", "node", "meta"):
            if c in types and not isinstance(types[c], StringType):
                raise OptionError(f"column {c} must be a string, not {types[c].simpleString()}")
        if topic is None and "topic" not in types:
            raise OptionError("set the option topic or give the DataFrame a topic column")
        max_records = opt.parse_int(options, "maxRecordsPerRequest", 5000, minimum=1, maximum=10000)
        max_bytes = opt.parse_int(options, "maxBytesPerRequest", 4 << 20, minimum=1024)
        timeout = opt.parse_int(options, "timeoutMs", 30_000, minimum=1)
        cols = tuple(c for c in ("topic", "data", "tag", "node", "meta") if c in types)
        return _SinkConfig(
            str(url),
            opt.get(options, "token"),
            topic,
            opt.get(options, "idempotencyKey"),
            int(max_records or 5000),
            int(max_bytes or (4 << 20)),
            (timeout or 30_000) / 1000,
            cols,
        )


@dataclass
class _Commit(WriterCommitMessage):
    partition: int
    stats: SinkStats


def _record_json(data: Any, tag: Any, node: Any, meta: Any, row: int) -> bytes:
    if data is None:
        d = b"null"
    else:
        d = data if isinstance(data, bytes) else data.encode()
        try:
            orjson.loads(d)
        except orjson.JSONDecodeError as e:
            raise ValueError(f"row {row}: column data is not JSON text ({e}): {d[:80]!r}") from None
    parts = [b'{"data":', d]
    if tag is not None:
        parts += [b',"tag":', orjson.dumps(tag)]
    if node is not None:
        parts += [b',"node":', orjson.dumps(node)]
    if meta is not None:
        try:
            orjson.loads(meta)
        except orjson.JSONDecodeError as e:
            raise ValueError(f"row {row}: column meta is not JSON text ({e})") from None
        parts += [b',"meta":', meta.encode()]
    parts.append(b"}")
    return b"".join(parts)


def _write_partition(
    cfg: _SinkConfig, batches: Iterator[pa.RecordBatch], key_prefix: str
) -> SinkStats:
    with Client(cfg.url, cfg.token, timeout_s=cfg.timeout_s) as client:
        sink = RecordSink(client, key_prefix, max_records=cfg.max_records, max_bytes=cfg.max_bytes)
        row = 0
        for batch in batches:
            cols = {name: batch.column(name).to_pylist() for name in cfg.columns}
            n = batch.num_rows
            none = [None] * n
            topics = cols.get("topic", none) if cfg.topic is None else [cfg.topic] * n
            data = cols["data"]
            tags = cols.get("tag", none)
            nodes = cols.get("node", none)
            metas = cols.get("meta", none)
            for i in range(n):
                t = topics[i]
                if t is None:
                    raise ValueError(
                        f"row {row + i}: the topic column is null and no topic option is set"
                    )
                sink.add(t, _record_json(data[i], tags[i], nodes[i], metas[i], row + i))
            row += n
        return sink.flush()


class _BatchWriter(DataSourceArrowWriter):
    """`df.write.format("topics")`: each task posts its partition in keyed chunks.

    The key prefix is the `idempotencyKey` option, or a UUID made once per
    write job on the driver, plus the partition id: a retried task (same job)
    sends the same keys, so the server dedupes its replayed chunks.
    """

    def __init__(self, cfg: _SinkConfig) -> None:
        self.cfg = cfg
        self.job = cfg.key or f"spark-{uuid.uuid4()}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> _Commit:
        ctx = TaskContext.get()
        pid = ctx.partitionId() if ctx is not None else 0
        stats = _write_partition(self.cfg, iterator, f"{self.job}:{pid}")
        return _Commit(pid, stats)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _log_commit(self.job, messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        log.warning(
            "write job %s aborted; records posted by finished tasks stay in their topics "
            "(a rerun with the same idempotencyKey within the idempotency window dedupes them)",
            self.job,
        )


class _StreamWriter(DataSourceStreamArrowWriter):
    """`writeStream.format("topics")`: keys from the query id, the batch id and the partition.

    The query id is the one kept in the checkpoint (stable across restarts);
    the `idempotencyKey` option replaces it. A micro-batch re-run after a
    failure or restart sends the same keys and is deduped by the server.
    """

    def __init__(self, cfg: _SinkConfig) -> None:
        self.cfg = cfg

    def write(self, iterator: Iterator[pa.RecordBatch]) -> _Commit:
        ctx = TaskContext.get()
        pid = ctx.partitionId() if ctx is not None else 0
        query = self.cfg.key or (ctx.getLocalProperty("sql.streaming.queryId") if ctx else None)
        batch = ctx.getLocalProperty("streaming.sql.batchId") if ctx else None
        if not query or batch is None:
            raise RuntimeError(
                "the topics stream sink cannot see the query or batch id of this task "
                "(TaskContext local properties sql.streaming.queryId / streaming.sql.batchId)"
            )
        stats = _write_partition(self.cfg, iterator, f"{query}:{batch}:{pid}")
        return _Commit(pid, stats)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _log_commit(f"micro-batch {batchId}", messages)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("micro-batch %s aborted; it is re-run with the same keys", batchId)


def _log_commit(what: str, messages: Sequence[WriterCommitMessage | None]) -> None:
    recs = sum(m.stats.records for m in messages if isinstance(m, _Commit))
    dd = sum(m.stats.deduped for m in messages if isinstance(m, _Commit))
    log.info("topics sink %s: %d records posted, %d requests deduped", what, recs, dd)
