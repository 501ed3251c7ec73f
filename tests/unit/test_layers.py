"""The import rules between layers (pyproject.toml `[tool.importlinter]`) hold.

The on-disk format imports nothing of the project, the engine imports neither
storage nor any shell, storage imports no shell, the composition root
(`topics.node`) and authentication (`topics.auth`) import no shell, and the HTTP
and Kafka shells import nothing of each other. Checked with import-linter over
the installed source tree.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_layer_contracts_hold() -> None:
    exe = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    if not Path(exe).exists():
        pytest.fail("import-linter is a dev dependency; lint-imports is missing")
    r = subprocess.run(
        [exe, str(ROOT / "pyproject.toml")],
        cwd=ROOT / "src",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout, r.stdout


def test_every_layer_rule_is_a_contract() -> None:
    """The contracts listed in the docstring above are all in pyproject.toml."""
    import tomllib

    with open(ROOT / "pyproject.toml", "rb") as f:
        contracts = tomllib.load(f)["tool"]["importlinter"]["contracts"]
    forbidden = {
        src: set(c["forbidden_modules"])
        for c in contracts
        if c["type"] == "forbidden"
        for src in c["source_modules"]
    }
    shells = {"topics.http", "topics.kafka", "topics.spark", "topics.cli"}
    assert shells <= forbidden["topics.storage"]
    assert shells | {"topics.storage", "topics.node"} <= forbidden["topics.engine"]
    assert shells <= forbidden["topics.node"] and shells <= forbidden["topics.auth"]
    independent = [set(c["modules"]) for c in contracts if c["type"] == "independence"]
    assert {"topics.http", "topics.kafka"} in independent
