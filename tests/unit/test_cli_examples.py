"""Every `topics` command's help shows examples, and every example parses.

The parser is walked in-process (nothing is run): each command and group has
an `examples:` section, and each `topics ...` line in it, taken apart as a
shell would (pipes, variable assignments before the command), is accepted by
the parser of the real command.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import shlex
from collections.abc import Iterator

import pytest

from topics.cli import build_parser


def _commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for name, sub in action.choices.items():
                if id(sub) not in seen:  # an alias maps to the same parser
                    seen.add(id(sub))
                    yield from _commands(sub, (*path, name))


COMMANDS = dict(_commands(build_parser()))


def _examples(help_text: str) -> list[str]:
    _, found, rest = help_text.partition("\nexamples:\n")
    assert found, "no examples section"
    lines = []
    for line in rest.splitlines():
        if not line.startswith("  "):
            break
        lines.append(line.strip())
    return lines


def _invocations(line: str) -> Iterator[list[str]]:
    for part in line.split(" | "):
        words = shlex.split(part, comments=True)
        while words and "=" in words[0] and not words[0].startswith("-"):
            words.pop(0)  # VAR=value before the command
        if words and words[0] == "topics":
            yield words[1:]


@pytest.mark.parametrize("path", sorted(COMMANDS), ids=lambda p: " ".join(p) or "topics")
def test_help_has_examples_that_parse(path: tuple[str, ...]) -> None:
    parser = build_parser()
    examples = _examples(COMMANDS[path].format_help())
    invocations = [words for line in examples for words in _invocations(line)]
    assert invocations, f"no `topics ...` example in {examples}"
    for words in invocations:
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.suppress(SystemExit):
            args, extra = parser.parse_known_args(words)
            assert all("=" in x for x in extra), (words, extra)
            continue
        pytest.fail(f"`topics {shlex.join(words)}` does not parse: {err.getvalue()}")
