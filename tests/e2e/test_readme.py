"""The README works as written: every shell and Python block runs against a real server.

The blocks are taken from README.md in order and run as a user would after the two
commands: shell blocks with `bash -e` in a directory laid out like the checkout
(`scripts/`, `.venv/`, `examples/`, ... linked in) whose `./topics-data` is the data
directory of a real `topics serve`, Python blocks as a file given to
`.venv/bin/python`. `PATH` does not hold `.venv/bin`: the README never relies on
an activated virtualenv.

What differs from a user's run, and why:

* the server is started by the test, on ephemeral ports (tests never bind 4000 or
  9092): `localhost:4000`, `127.0.0.1:4000` and `127.0.0.1:9092` in a block are
  rewritten to them, and a `scripts/serve &` line is left out (the server is up);
* it checkpoints every second instead of every minute, so the offline Spark read
  sees the Quickstart's records without waiting (the README says when offline
  reads see new records).

A comment directly before a block steers it: `<!-- readme-test: skip <why> -->`,
`<!-- readme-test: stopped -->` (run with the server stopped, as the README says).
Expected output written in a block is checked: a shell comment line `# {...}` after
a command must match that command's output, and a `print(...)  # expected` in Python
must print it (`...` matches anything).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.kafka.support import free_port
from tests.support.process import ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DIRECTIVE = re.compile(r"<!--\s*readme-test:\s*(\w+)\s*(.*?)\s*-->")


@dataclass
class Block:
    lang: str
    text: str
    line: int  # where it starts in README.md (1-based)
    directive: str = ""  # "", "skip", "stopped"
    why: str = ""


def readme_blocks(text: str) -> list[Block]:
    """Every fenced block with a language, with the directive comment before it."""
    out: list[Block] = []
    lines = text.splitlines()
    i = 0
    pending: tuple[str, str] | None = None
    while i < len(lines):
        m = DIRECTIVE.search(lines[i])
        if m:
            pending = (m.group(1), m.group(2))
            i += 1
            continue
        if lines[i].startswith("```"):
            lang = lines[i][3:].strip()
            start = i + 1
            j = start
            while not lines[j].startswith("```"):
                j += 1
            if lang:
                d, why = pending or ("", "")
                out.append(Block(lang, "\n".join(lines[start:j]) + "\n", start, d, why))
            pending = None
            i = j + 1
            continue
        if lines[i].strip():
            pending = None
        i += 1
    return out


def test_the_readme_has_blocks_and_every_one_is_run_or_says_why() -> None:
    blocks = readme_blocks(README.read_text())
    assert len(blocks) >= 8
    for b in blocks:
        assert b.lang in ("sh", "python"), f"README.md:{b.line}: block language {b.lang!r}"
        assert b.directive in ("", "skip", "stopped"), f"README.md:{b.line}: {b.directive}"
        if b.directive == "skip":
            assert b.why, f"README.md:{b.line}: a skipped block says why"


def _rewrite(text: str, http: int, kafka: int) -> str:
    text = re.sub(r"\b(localhost|127\.0\.0\.1):4000\b", f"127.0.0.1:{http}", text)
    text = re.sub(r"\b127\.0\.0\.1:9092\b", f"127.0.0.1:{kafka}", text)
    return "\n".join(ln for ln in text.splitlines() if ln.strip() != "scripts/serve &") + "\n"


def _pattern(expected: str) -> re.Pattern[str]:
    parts = [re.escape(p) for p in expected.strip().split("...")]
    return re.compile(".*".join(parts), re.S)


def _shell_expectations(text: str) -> list[tuple[str, str]]:
    """(command, expected output) pairs: a `# {...}`/`# [...]` comment after a command."""
    out: list[tuple[str, str]] = []
    cmd: list[str] = []
    for ln in text.splitlines():
        s = ln.strip()
        if s.startswith(("# {", "# [")) and cmd:
            out.append(("\n".join(cmd), s[2:]))
            cmd = []
        elif s and not s.startswith("#"):
            cmd.append(ln)
        elif not s:
            cmd = []
    return out


def _python_expectations(text: str) -> list[str]:
    return [
        m.group(1).strip()
        for m in re.finditer(r"^\s*print\(.*\)\s+#\s*(.+)$", text, re.M)
        if not m.group(1).strip().startswith(("the ", "over "))
    ]


class Site:
    """A directory laid out like the checkout, with `./topics-data` the server's."""

    def __init__(self, tmp: Path) -> None:
        self.dir = tmp / "site"
        self.dir.mkdir()
        for entry in ROOT.iterdir():
            if entry.name in ("topics-data", ".git") or entry.name.startswith("."):
                if entry.name != ".venv":
                    continue
            (self.dir / entry.name).symlink_to(entry)
        self.env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("TOPICS_", "VIRTUAL_ENV", "PYSPARK_", "PYTHON"))
        }
        self.env["PATH"] = os.pathsep.join(
            p for p in os.environ.get("PATH", "").split(os.pathsep) if ".venv" not in p
        )
        self.env["SPARK_LOCAL_IP"] = "127.0.0.1"

    def run(self, b: Block, http: int, kafka: int, timeout: float = 300) -> str:
        text = _rewrite(b.text, http, kafka)
        if b.lang == "sh":
            script = self.dir / f"block-{b.line}.sh"
            script.write_text("set -o pipefail\n" + text)
            argv = ["bash", "-e", str(script)]
        else:
            script = self.dir / f"block-{b.line}.py"
            script.write_text(text)
            argv = [str(self.dir / ".venv" / "bin" / "python"), str(script)]
        r = subprocess.run(
            argv, cwd=self.dir, env=self.env, capture_output=True, text=True, timeout=timeout
        )
        assert r.returncode == 0, (
            f"README.md:{b.line} ({b.lang}) exited {r.returncode}\n--- block\n{text}"
            f"--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-3000:]}"
        )
        return r.stdout


def test_every_readme_block_runs_as_written(tmp_path: Path) -> None:
    if shutil.which("java") is None:
        pytest.skip("the README's Spark blocks need Java")
    blocks = readme_blocks(README.read_text())
    site = Site(tmp_path)
    kafka = free_port()
    env = {
        "TOPICS_DATA_DIR": str(site.dir / "topics-data"),
        "TOPICS_KAFKA_PORT": str(kafka),
        "TOPICS_CHECKPOINT_INTERVAL_MS": "1000",
    }
    srv: ServerProcess | None = ServerProcess(tmp_path, env)
    ran = 0
    try:
        for b in blocks:
            if b.directive == "skip":
                continue
            if b.directive == "stopped" and srv is not None:
                assert srv.stop() == 0
                srv = None
            if b.directive != "stopped" and srv is None:
                srv = ServerProcess(tmp_path, env)
            assert srv is not None or b.directive == "stopped"
            http = srv.port if srv is not None else 1
            out = site.run(b, http, kafka)
            ran += 1
            if b.lang == "sh":
                for cmd, want in _shell_expectations(_rewrite(b.text, http, kafka)):
                    assert _pattern(want).search(out), (
                        f"README.md:{b.line}: `{cmd.strip()}` printed no {want!r}\n{out[-2000:]}"
                    )
            else:
                for want in _python_expectations(b.text):
                    assert _pattern(want).search(out), (
                        f"README.md:{b.line}: printed no {want!r}\n{out[-2000:]}"
                    )
    finally:
        if srv is not None:
            srv.stop()
    assert ran >= 6
