"""The import rules between layers (pyproject.toml `[tool.importlinter]`) hold.

The on-disk format imports nothing of the project, the engine imports neither
storage nor any shell, and storage imports no shell. Checked with import-linter
over the installed source tree.
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
