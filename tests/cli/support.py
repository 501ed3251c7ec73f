"""Running `python -m topics ...` as a subprocess, and masking what changes per run."""

from __future__ import annotations

import os
import re
import subprocess
import sys

__all__ = ["run", "mask"]


def run(
    *args: str,
    url: str | None = None,
    input: str | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 30,
) -> subprocess.CompletedProcess[str]:
    """`topics ARGS` with TOPICS_URL set to `url`; stdout and stderr as text."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("TOPICS_")}
    if url is not None:
        full["TOPICS_URL"] = url
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "topics", *args],
        input=input,
        capture_output=True,
        text=True,
        env=full,
        timeout=timeout,
    )


_TS_JSON = re.compile(r'"\$ts":\d+')
_TS_TEXT = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def mask(text: str) -> str:
    """Timestamps (JSON `$ts` and the text format's ISO times) replaced by fixed marks."""
    return _TS_TEXT.sub("TIME", _TS_JSON.sub('"$ts":TS', text))
