"""Help texts describe what a flag does, never a measured figure: a suite result quoted in
--help goes stale with the next run (the figures live in docs/, beside their runs)."""

from __future__ import annotations

import re

import typer

from railcall.cli import app

FIGURE = re.compile(r"\b\d+ of \d+\b|\b\d+(?:\.\d+)?% (?:of|parse|AST|solved)")


def _walk(cmd, path=()):
    yield path, cmd
    for name, sub in getattr(cmd, "commands", {}).items():
        yield from _walk(sub, path + (name,))


def test_no_help_text_quotes_a_suite_figure():
    found = []
    for path, cmd in _walk(typer.main.get_command(app)):
        texts = [cmd.help or ""] + [getattr(p, "help", None) or "" for p in cmd.params]
        found += [(" ".join(path), m.group()) for t in texts for m in FIGURE.finditer(t)]
    assert not found, found
