"""Every install hint names the distribution `topics-server`, never `topics`.

The import package and the command are `topics`, but on the public index the
distribution `topics` is somebody else's project: a hint such as
`pip install 'topics[spark]'` would install that instead.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: `topics` with one of our extras, or pinned, as a requirement in prose or code.
WRONG = re.compile(r"(?<![\w./-])topics(\[(spark|dev)(,\s*(spark|dev))*\]|[=<>]=\d)")


def test_the_distribution_is_topics_server() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "topics-server"
    assert project["scripts"]["topics"].startswith("topics.")


def test_no_install_hint_names_the_other_distribution() -> None:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    files += sorted((ROOT / "src" / "topics").rglob("*.py"))
    files += [ROOT / "spark-jvm" / "README.md"]
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in files
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if WRONG.search(line)
    ]
    assert not found, "\n".join(found)
