"""A local S3-compatible server for tests: moto's standalone server on 127.0.0.1.

:func:`moto_s3` starts one on an ephemeral port, makes the buckets asked for and
sets the standard `AWS_*` variables (endpoint, region, credentials) for as long
as it runs, so both this process and servers or Spark jobs it starts reach it.
"""

from __future__ import annotations

import os
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

AWS_TEST_ENV = {
    "AWS_REGION": "us-east-1",
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
}


def make_bucket(endpoint: str, bucket: str) -> None:
    """Create `bucket` on the server at `endpoint` (an `http://host:port` url)."""
    req = urllib.request.Request(f"{endpoint}/{bucket}", method="PUT")
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.status == 200


@contextmanager
def moto_s3(*buckets: str) -> Iterator[str]:
    """A moto S3 server with `buckets` made; yields its endpoint url (AWS_* set meanwhile)."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("AWS_ENDPOINT_URL", url)
            for k, v in AWS_TEST_ENV.items():
                mp.setenv(k, v)
            for b in buckets:
                make_bucket(url, b)
            yield url
    finally:
        server.stop()


def s3_env(endpoint: str) -> dict[str, str]:
    """The `AWS_*` variables a child process needs to reach `endpoint`."""
    return {**os.environ, "AWS_ENDPOINT_URL": endpoint, **AWS_TEST_ENV}
