from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.process import ServerProcess


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One `topics serve` per test module (each test uses its own topic names)."""
    s = ServerProcess(tmp_path_factory.mktemp("server"))
    yield s
    assert s.stop() == 0, s.log_text()


@pytest.fixture
def fresh_server(tmp_path: Path) -> Iterator[ServerProcess]:
    """A server of this test alone (for tests that stop or restart it)."""
    s = ServerProcess(tmp_path)
    yield s
    s.stop()
