"""Option parsing for the `topics` Spark source and sink, and for `topics spark-export`.

Spark hands every option over as a string (keys case-insensitive); this module
turns them into typed values and raises :class:`OptionError` naming the option
and the values it accepts when one does not parse (docs/SPARK.md,
"Options"). No pyspark import here: the export tool
uses it without a JVM.

Seq positions follow Spark's Kafka source (docs/SPARK.md, "Options"):

* `startingSeq`: the first seq read, inclusive. `"earliest"` (each topic's
  first live seq), `"latest"` (only records written after the query starts;
  streaming only), an integer (the same first seq for every topic), or a JSON
  object `{"topic": seq}` where `-2` means earliest and `-1` latest (Kafka's
  convention); topics missing from the object use the default.
* `endingSeq` (batch only): the end, **exclusive** like Kafka's
  `endingOffsets`. `"latest"` (default), an integer, or a JSON object.
* `startingTimestamp` / `endingTimestamp` (offline batch only): ms since the
  epoch; a record is read when `startingTimestamp <= ts < endingTimestamp`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import orjson

__all__ = [
    "OptionError",
    "MODES",
    "check_known",
    "EARLIEST",
    "LATEST",
    "SeqSpec",
    "parse_seq_spec",
    "parse_bool",
    "parse_int",
    "parse_topics",
    "parse_choice",
    "TopicSelector",
    "VALUE_FORMATS",
    "READERS",
]

EARLIEST = -2
LATEST = -1

VALUE_FORMATS = ("json", "binary")
#: Option `reader`: which reader runs an offline read (docs/SPARK.md, "Two readers").
READERS = ("auto", "jvm", "python")


class OptionError(ValueError):
    """An option is missing, unknown in combination, or does not parse.

    The message names the option and the accepted values.
    """


def _get(options: Mapping[str, str], name: str) -> str | None:
    """Case-insensitive lookup (Spark's options are; a plain dict may not be)."""
    if name in options:
        return options[name]
    low = name.lower()
    for k, v in options.items():
        if k.lower() == low:
            return v
    return None


def parse_bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    """`true`/`false` (any case); raises OptionError otherwise."""
    raw = _get(options, name)
    if raw is None:
        return default
    v = str(raw).strip().lower()
    if v in ("true", "1", "yes"):
        return True
    if v in ("false", "0", "no"):
        return False
    raise OptionError(f"option {name}={raw!r} is not a boolean; accepted: true, false")


def parse_int(
    options: Mapping[str, str],
    name: str,
    default: int | None,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
) -> int | None:
    """An integer option within `[minimum, maximum]`; raises OptionError otherwise."""
    raw = _get(options, name)
    if raw is None:
        return default
    try:
        v = int(str(raw).strip())
    except ValueError:
        raise OptionError(f"option {name}={raw!r} is not an integer") from None
    if minimum is not None and v < minimum:
        raise OptionError(f"option {name}={v} is below the minimum {minimum}")
    if maximum is not None and v > maximum:
        raise OptionError(f"option {name}={v} is above the maximum {maximum}")
    return v


def parse_choice(
    options: Mapping[str, str], name: str, default: str, accepted: tuple[str, ...]
) -> str:
    """One of `accepted` (case-insensitive); raises OptionError naming them otherwise."""
    raw = _get(options, name)
    if raw is None:
        return default
    v = str(raw).strip().lower()
    if v not in accepted:
        raise OptionError(
            f"option {name}={raw!r} is not accepted; use one of: {', '.join(accepted)}"
        )
    return v


@dataclass(frozen=True, slots=True)
class SeqSpec:
    """A parsed `startingSeq`/`endingSeq`: a default position plus per-topic overrides.

    Positions are seqs (>= 0) or :data:`EARLIEST` / :data:`LATEST`.
    """

    default: int
    per_topic: tuple[tuple[str, int], ...] = ()

    def for_topic(self, topic: str) -> int:
        for name, v in self.per_topic:
            if name == topic:
                return v
        return self.default


_SEQ_ACCEPTED = (
    'earliest, latest, a seq >= 0, or a JSON object {"topic": seq} (-2 earliest, -1 latest)'
)


def parse_seq_spec(options: Mapping[str, str], name: str, default: int) -> SeqSpec:
    """Parse a seq position option (module docstring); raises OptionError."""
    raw = _get(options, name)
    if raw is None:
        return SeqSpec(default)
    text = str(raw).strip()
    low = text.lower()
    if low == "earliest":
        return SeqSpec(EARLIEST)
    if low == "latest":
        return SeqSpec(LATEST)
    if text.startswith("{"):
        try:
            obj = orjson.loads(text)
        except orjson.JSONDecodeError:
            raise OptionError(
                f"option {name}={raw!r} is not valid JSON; accepted: {_SEQ_ACCEPTED}"
            ) from None
        if not isinstance(obj, dict):
            raise OptionError(f"option {name}={raw!r}: accepted: {_SEQ_ACCEPTED}")
        per: list[tuple[str, int]] = []
        for k, v in obj.items():
            if isinstance(v, bool) or not isinstance(v, int) or v < -2:
                raise OptionError(
                    f"option {name}: topic {k!r} has position {v!r}; accepted: {_SEQ_ACCEPTED}"
                )
            per.append((str(k), v))
        return SeqSpec(default, tuple(per))
    try:
        v = int(text)
    except ValueError:
        raise OptionError(f"option {name}={raw!r} is not accepted; use {_SEQ_ACCEPTED}") from None
    if v < -2:
        raise OptionError(f"option {name}={v} is not accepted; use {_SEQ_ACCEPTED}")
    return SeqSpec(v)


@dataclass(frozen=True, slots=True)
class TopicSelector:
    """Which topics a read covers: an explicit list (`topics`) or a regex (`topicPattern`)."""

    names: tuple[str, ...] | None
    pattern: str | None

    def matches(self, name: str) -> bool:
        if self.names is not None:
            return name in self.names
        assert self.pattern is not None
        return re.fullmatch(self.pattern, name) is not None


def parse_topics(options: Mapping[str, str]) -> TopicSelector:
    """`topics` (comma-separated names, or a JSON array) or `topicPattern` (a Python regex,
    matched against the whole name). Exactly one is needed.

    Raises OptionError when both or neither is set, when the list is empty, or when
    the pattern does not compile.
    """
    raw_list = _get(options, "topics")
    if raw_list is None:
        raw_list = _get(options, "topic")  # the sink's single-topic option, also fine on reads
    raw_pat = _get(options, "topicPattern")
    if raw_list is not None and raw_pat is not None:
        raise OptionError("set only one of the options topics and topicPattern")
    if raw_list is None and raw_pat is None:
        raise OptionError(
            "set one of the options topics (comma-separated topic names) "
            "or topicPattern (a regex matched against whole topic names)"
        )
    if raw_list is not None:
        text = str(raw_list).strip()
        names: list[str]
        if text.startswith("["):
            try:
                parsed = orjson.loads(text)
            except orjson.JSONDecodeError:
                raise OptionError(f"option topics={raw_list!r} is not a valid JSON array") from None
            if not isinstance(parsed, list) or not all(isinstance(x, str) for x in parsed):
                raise OptionError("option topics: a JSON array must hold topic name strings")
            names = [x.strip() for x in parsed]
        else:
            names = [x.strip() for x in text.split(",")]
        names = [n for n in names if n]
        if not names:
            raise OptionError("option topics is empty; give at least one topic name")
        return TopicSelector(tuple(dict.fromkeys(names)), None)
    try:
        re.compile(str(raw_pat))
    except re.error as e:
        raise OptionError(f"option topicPattern={raw_pat!r} is not a valid regex: {e}") from None
    return TopicSelector(None, str(raw_pat))


def get(options: Mapping[str, str], name: str) -> str | None:
    """The raw value of option `name` (case-insensitive), or None."""
    return _get(options, name)


# -- which options apply where (docs/SPARK.md, "Options") -------------------------

_READS = ("topics", "topic", "topicPattern", "startingSeq", "valueFormat", "reader")
_SERVER = ("url", "token", "timeoutMs")
#: The options each use of the source takes, by mode.
MODES: dict[str, tuple[str, ...]] = {
    "offline read": (
        *_READS,
        "path",
        "coldDir",
        "endingSeq",
        "startingTimestamp",
        "endingTimestamp",
        "filterPushdown",
        "batchRows",
    ),
    "server read": (
        *_READS,
        *_SERVER,
        "endingSeq",
        "maxSeqsPerPartition",
        "failOnDataLoss",
    ),
    "stream": (
        *_READS,
        *_SERVER,
        "maxRecordsPerTrigger",
        "maxSeqsPerPartition",
        "failOnDataLoss",
    ),
    "sink": (
        *_SERVER,
        "topic",
        "idempotencyKey",
        "maxRecordsPerRequest",
        "maxBytesPerRequest",
    ),
}
#: Options Spark itself reads and passes along to every source (never ours to refuse).
_SPARK_OWN = ("checkpointLocation", "queryName")
#: Spark's Kafka source names, and what this source calls the same thing. Refused with
#: the right name rather than taken as aliases: positions here are seqs, and a Kafka
#: offset is seq - 1, so an alias would be off by one.
_KAFKA_NAMES = {
    "startingOffsets": "startingSeq",
    "endingOffsets": "endingSeq",
    "maxOffsetsPerTrigger": "maxRecordsPerTrigger",
    "minOffsetsPerTrigger": "maxRecordsPerTrigger",
    "subscribe": "topics",
    "subscribePattern": "topicPattern",
    "assign": "topics",
    "kafka.bootstrap.servers": "url",
    "startingOffsetsByTimestamp": "startingTimestamp",
    "endingOffsetsByTimestamp": "endingTimestamp",
    "minPartitions": "maxSeqsPerPartition",
}


def check_known(options: Mapping[str, str], mode: str) -> None:
    """Refuse an option that `mode` (a key of :data:`MODES`) does not take.

    The message names the option and says what to use instead: the topics name
    of a Kafka source option, the closest known name for a misspelling, or the
    modes an option belongs to when it is one of ours used in the wrong place.
    Raises OptionError.
    """
    allowed = {n.lower() for n in (*MODES[mode], *_SPARK_OWN)}
    everything = {n.lower(): n for names in MODES.values() for n in names}
    for key in options:
        low = key.lower()
        if low in allowed:
            continue
        kafka = {k.lower(): (k, v) for k, v in _KAFKA_NAMES.items()}.get(low)
        if kafka is not None:
            raise OptionError(
                f"option {kafka[0]} is the Kafka source's; the topics source takes "
                f"{kafka[1]} (positions are seqs: a Kafka offset is seq - 1; docs/SPARK.md)"
            )
        if low in everything:
            where = [m for m, names in MODES.items() if everything[low] in names]
            raise OptionError(
                f"option {everything[low]} applies to {' and '.join(where)}, not to {mode}"
            )
        import difflib

        close = difflib.get_close_matches(low, list(allowed), n=1, cutoff=0.75)
        hint = ""
        if close:
            name = next(n for n in (*MODES[mode], *_SPARK_OWN) if n.lower() == close[0])
            hint = f"; did you mean {name}?"
        raise OptionError(
            f"unknown option {key} for {mode}{hint} (the options are listed in docs/SPARK.md)"
        )
