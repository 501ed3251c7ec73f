"""Format "topics" is known to every new SparkSession without a register() call."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql.datasource import DataSource

from tests.spark.conftest import History

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]


class _OnlyRegisteredByHand(DataSource):
    @classmethod
    def name(cls) -> str:
        return "topics_test_by_hand"


def test_format_is_auto_registered_through_pyspark_topics(spark: Any, history: History) -> None:
    spark.dataSource.register(_OnlyRegisteredByHand)
    # A new session shares the SparkContext but not the sources registered by hand in
    # another session: what it knows beyond the built-ins came from auto-registration.
    fresh = spark.newSession()
    manager = fresh._jsparkSession.sessionState().dataSourceManager()
    assert not manager.dataSourceExists("topics_test_by_hand")
    assert manager.dataSourceExists("topics")
    df = fresh.read.format("topics").option("path", str(history.data_dir)).option("topics", "plain")
    assert df.load().count() == len(history.diff["plain"])
