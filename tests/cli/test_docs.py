"""The examples of docs/CLI.md and docs/CLIENT.md run as written, in order, against
one fresh server (only TOPICS_URL points them at it)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.process import ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

DOCS = Path(__file__).resolve().parents[2] / "docs"
BIN = Path(sys.executable).parent


def blocks(doc: str, lang: str) -> list[str]:
    text = (DOCS / doc).read_text()
    return re.findall(rf"^```{lang}\n(.*?)^```$", text, flags=re.M | re.S)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    s = ServerProcess(tmp_path_factory.mktemp("docs"))
    yield s
    assert s.stop() == 0, s.log_text()


def _env(server: ServerProcess) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOPICS_")}
    env["TOPICS_URL"] = server.base
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"  # `topics` as installed
    return env


def test_cli_md_examples_run(server: ServerProcess, tmp_path: Path) -> None:
    found = blocks("CLI.md", "sh")
    assert len(found) >= 8
    for block in found:
        p = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", block],
            env=_env(server),
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert p.returncode == 0, f"{block}\n--- stdout\n{p.stdout}\n--- stderr\n{p.stderr}"
        assert "Traceback" not in p.stderr, p.stderr


def test_client_md_examples_run(server: ServerProcess, tmp_path: Path) -> None:
    found = blocks("CLIENT.md", "python")
    assert len(found) >= 6
    for block in found:
        p = subprocess.run(
            [sys.executable, "-c", block],
            env=_env(server),
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert p.returncode == 0, f"{block}\n--- stdout\n{p.stdout}\n--- stderr\n{p.stderr}"
        assert "Traceback" not in p.stderr, f"{block}\n--- stderr\n{p.stderr}"
