"""The Python examples of the README and of every page in docs/ run, so they cannot drift from
the code. (The vLLM example, a ```python vllm block in docs/vllm.md, runs in `make test-vllm`.)"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def python_blocks() -> list[tuple[str, str]]:
    """(where, code) for each ```python block, named by its page and its place there."""
    blocks = []
    for page in PAGES:
        found = re.findall(r"```python\n(.*?)```", page.read_text(), re.S)
        blocks += [(f"{page.relative_to(ROOT)} example {i}", code) for i, code in enumerate(found)]
    return blocks


def test_readme_and_docs_have_examples():
    where = {w.split(" example")[0] for w, _ in python_blocks()}
    assert {"README.md", "docs/library.md", "docs/agent.md", "docs/json-schema.md", "docs/reasoning.md"} <= where


def test_every_page_links_to_pages_that_exist():
    """A page moved or renamed leaves no dead link behind."""
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.relative_to(ROOT)} links to {target}"


@pytest.mark.model
@pytest.mark.parametrize("where, code", python_blocks(), ids=[w for w, _ in python_blocks()])
def test_example_runs(where, code, capsys):
    exec(compile(code, where, "exec"), {})


def test_the_readme_is_a_front_door():
    """At most 200 lines: what, why, the two commands, one example per surface, one results
    table; the rest lives in docs/."""
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200
