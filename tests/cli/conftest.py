from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.process import ServerProcess


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One `topics serve` per test module (each test uses its own topic names)."""
    s = ServerProcess(tmp_path_factory.mktemp("server"))
    yield s
    assert s.stop() == 0, s.log_text()
