"""`topics --help` and the commands' help: descriptions, examples, the environment."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.cli.support import run
from topics.cli import SERVE_ENV

# Every test runs the `topics` command as a process: the full tier's, like the other CLI tests.
pytestmark = [pytest.mark.e2e]

README = Path(__file__).resolve().parents[2] / "README.md"


def test_top_level_help_lists_commands_and_client_env() -> None:
    p = run("--help")
    assert p.returncode == 0
    for word in (
        "serve",
        "produce",
        "consume (tail)",
        "watch",
        "routers",
        "queue",
        "TOPICS_URL",
        "TOPICS_TOKEN",
        "examples:",
    ):
        assert word in p.stdout


def test_serve_help_names_every_configuration_variable() -> None:
    out = run("serve", "--help").stdout
    assert "environment" in out and "examples:" in out
    section = README.read_text().split("## Configuration", 1)[1].split("\n## ", 1)[0]
    in_readme = set(re.findall(r"`(TOPICS_[A-Z0-9_]+)`", section))
    assert in_readme, "README's Configuration table moved"
    missing = sorted(v for v in in_readme if v not in out)
    assert not missing, f"serve --help lacks {missing}"
    assert {name for name, _d, _m in SERVE_ENV} <= set(re.findall(r"TOPICS_[A-Z0-9_]+", out))


@pytest.mark.parametrize(
    "cmd",
    [
        ["produce"],
        ["consume"],
        ["tail"],
        ["watch"],
        ["topic", "ls"],
        ["ls"],
        ["create"],
        ["config"],
        ["delete"],
        ["routers", "put"],
        ["queue", "claim"],
    ],
)
def test_client_command_help(cmd: list[str]) -> None:
    p = run(*cmd, "--help")
    assert p.returncode == 0
    assert "--url" in p.stdout and "--token" in p.stdout and "TOPICS_URL" in p.stdout
    assert "examples:" in p.stdout


def test_usage_errors_exit_2() -> None:
    p = run("produce")
    assert p.returncode == 2 and "the following arguments are required: TOPIC" in p.stderr
    p = run("consume", "t", "--from-seq", "-1")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    p = run("ls", "stray")
    assert p.returncode == 2 and "unrecognized arguments: stray" in p.stderr
