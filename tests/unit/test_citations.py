"""Comments and docstrings cite this repo's docs, never outside documents.

Code may point at docs/*.md files or README sections. It may not cite the external
contract documents ("API §4", "SEMANTICS §12.3", "DESIGN §3"), the design seeds
("seed 2 §3.6", "seed:"), notes files or issue numbers. "XXH3-64 (hash seed 0)"
names the hash function's seed and is allowed.
"""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "topics"

EXCLUDED: tuple[Path, ...] = ()

CITATION = re.compile(
    r"SEMANTICS §|API §|DESIGN §|seed [0-9]|seed:|seeds|notes/|reliability anchors"
    r"|issue [0-9]|§",
    re.IGNORECASE,
)
ALLOWED = re.compile(r"hash seed [0-9]", re.IGNORECASE)


def _sources() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if not any(p.is_relative_to(d) for d in EXCLUDED))


def test_sources_found() -> None:
    assert len(_sources()) > 20


def test_no_external_citations() -> None:
    found = []
    for path in _sources():
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if CITATION.search(ALLOWED.sub("", line)):
                found.append(f"{path.relative_to(SRC.parent.parent)}:{n}: {line.strip()}")
    assert not found, "cite docs/ or README sections instead:\n" + "\n".join(found)
