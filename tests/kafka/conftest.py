from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kafka.support import InProcess, KafkaProcess


@pytest.fixture(scope="module")
def kserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaProcess]:
    """One real `topics serve` (auth off) shared by a test module."""
    srv = KafkaProcess(Path(tmp_path_factory.mktemp("kafka")))
    yield srv
    srv.stop()


@pytest.fixture
def inproc() -> Iterator[InProcess]:
    srv = InProcess()
    yield srv
    srv.close()
