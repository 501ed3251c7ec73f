"""Which options each use of the Spark source takes, checked without a JVM
(docs/SPARK.md, "Options"): unknown, misspelled, Kafka-named and misplaced options
are refused with a message naming them; so is a batch range that runs backwards."""

from __future__ import annotations

import pytest

from topics.spark.options import OptionError, check_known


@pytest.mark.parametrize(
    ("options", "mode", "match"),
    [
        ({"startingOffsets": "earliest"}, "stream", "startingOffsets is the Kafka.*startingSeq"),
        ({"maxOffsetsPerTrigger": "10"}, "stream", "maxRecordsPerTrigger"),
        ({"subscribe": "a"}, "server read", "subscribe is the Kafka.*takes topics"),
        ({"kafka.bootstrap.servers": "h:9092"}, "stream", "takes url"),
        (
            {"startingseqq": "1"},
            "offline read",
            "unknown option startingseqq.*did you mean startingSeq",
        ),
        ({"banana": "1"}, "sink", "unknown option banana for sink"),
        ({"endingSeq": "9"}, "stream", "endingSeq applies to offline read and server read"),
        ({"coldDir": "/x"}, "server read", "coldDir applies to offline read, not to server read"),
        ({"maxRecordsPerRequest": "9"}, "offline read", "applies to sink"),
    ],
)
def test_refused_with_the_option_named(options: dict[str, str], mode: str, match: str) -> None:
    with pytest.raises(OptionError, match=match):
        check_known(options, mode)


@pytest.mark.parametrize(
    ("options", "mode"),
    [
        ({"PATH": "/d", "Topics": "a", "STARTINGSEQ": "3", "batchRows": "9"}, "offline read"),
        ({"url": "u", "topic": "a", "checkpointLocation": "/c"}, "sink"),
        (
            {"url": "u", "topicPattern": "a.*", "maxRecordsPerTrigger": "5", "queryName": "q"},
            "stream",
        ),
    ],
)
def test_what_a_mode_takes_passes(options: dict[str, str], mode: str) -> None:
    check_known(options, mode)


def test_a_backwards_batch_range_is_refused() -> None:
    pytest.importorskip("pyspark")
    from topics.spark.source import _batch_range

    with pytest.raises(OptionError, match="startingSeq=9 is past endingSeq=5"):
        _batch_range({"startingSeq": "9", "endingSeq": "5"})
    with pytest.raises(OptionError, match="for topic b"):
        _batch_range({"startingSeq": '{"b": 7}', "endingSeq": "3"})
    _batch_range({"startingSeq": "5", "endingSeq": "5"})  # empty, not backwards
