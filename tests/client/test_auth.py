"""Errors of an authenticated server, as the client raises them: 401, 403, and a real
429 from a resource cap (not retried forever)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.process import ServerProcess
from topics.client import Client, Forbidden, Throttled, Unauthorized

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    s = ServerProcess(
        tmp_path_factory.mktemp("auth"),
        {"TOPICS_API_KEYS": "adm1n,read3r:r,tenant:rw+a:t1.", "TOPICS_MAX_TOPICS": "2"},
    )
    yield s
    assert s.stop() == 0, s.log_text()


def test_auth_errors_and_a_real_throttle(server: ServerProcess) -> None:
    with Client(server.base, token="adm1n") as admin:
        admin.append("t1.a", [1])
        with Client(server.base) as anon, pytest.raises(Unauthorized) as un:
            anon.get_topic("t1.a")
        assert un.value.status == 401 and un.value.code == "unauthorized"
        with Client(server.base, token="read3r") as reader:
            assert reader.get_topic("t1.a").count == 1
            with pytest.raises(Forbidden) as fb:
                reader.append("t1.a", [2])
            assert fb.value.status == 403
        with Client(server.base, token="tenant") as tenant:
            with pytest.raises(Forbidden):
                tenant.get_topic("other")
            assert [t.topic for t in tenant.list_topics()] == ["t1.a"]
        admin.put_topic("t1.b")
        with Client(server.base, token="adm1n", retries=1) as c, pytest.raises(Throttled) as th:
            c.put_topic("t1.c")  # a third topic passes TOPICS_MAX_TOPICS=2
        e = th.value
        assert e.status == 429 and e.detail == {"limit": "max_topics", "max": 2}
        assert e.retry_after == 1.0
