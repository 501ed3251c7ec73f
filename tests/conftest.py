from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.harness import Harness


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness()
    yield harness
    harness.close()
