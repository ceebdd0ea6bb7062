"""The README's Python examples run, so they cannot drift from the code."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_readme_has_examples():
    assert python_blocks()


@pytest.mark.model
@pytest.mark.parametrize("i", range(len(python_blocks())))
def test_readme_example_runs(i, capsys):
    exec(compile(python_blocks()[i], f"README.md example {i}", "exec"), {})
