"""BFCL files -> Tasks: the shared categories, categories not seen before (hand-made ones in the
same format), the decoding mode per category, and the one prompt every category gets."""

from __future__ import annotations

from pathlib import Path

import pytest

from railcall.eval import bfcl
from railcall.eval.runner import call_grammar
from railcall.grammar.tools import Tool

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "bfcl"
TINY = Path(__file__).resolve().parent / "data" / "bfcl"


@pytest.mark.parametrize("category, n", [("simple_python", 400), ("multiple", 200), ("parallel", 200), ("live_simple", 258)])
def test_shared_categories_load_whole_with_gold_calls(category, n):
    tasks = bfcl.load_category(SHARED, category)
    assert len(tasks) == n and len({t.id for t in tasks}) == n
    assert all(t.ground_truth and t.functions and t.messages for t in tasks)
    assert bfcl.tool_choice(tasks) == "required"
    assert len(bfcl.load_category(SHARED, category, limit=3)) == 3
    if category == "parallel":
        assert all(len(t.ground_truth) >= 2 for t in tasks)


def test_categories_listed_from_the_folder():
    assert set(bfcl.categories(SHARED)) == set(bfcl.SHARED_CATEGORIES)
    assert bfcl.categories(TINY) == ["tiny_irrelevance", "tiny_parallel_multiple"]


def test_unknown_category_names_what_is_there():
    with pytest.raises(FileNotFoundError, match="simple_python"):
        bfcl.load_category(SHARED, "simple_java")


def test_a_category_without_answers_expects_no_call():
    tasks = bfcl.load_category(TINY, "tiny_irrelevance")
    assert [t.ground_truth for t in tasks] == [[], []]
    assert bfcl.tool_choice(tasks) == "auto"


def test_unseen_parallel_multiple_category_with_a_system_message():
    (t,) = bfcl.load_category(TINY, "tiny_parallel_multiple")
    assert len(t.ground_truth) == 2 and [x.name for x in t.tools] == ["get_weather", "get_time"]
    assert bfcl.tool_choice([t]) == "required"
    assert [m["role"] for m in t.messages] == ["system", "user"]


def test_the_prompt_is_the_same_for_every_category(tmp_path):
    """Only the tools and the question change between categories: the instructions are one text."""
    a = bfcl.system_prompt([Tool("f", "Do f.", {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]})])
    b = bfcl.system_prompt([Tool("g", "Do g.", {"type": "object", "properties": {}})])
    tail = a[a.index("To call a tool"):]
    assert tail == b[b.index("To call a tool"):]
    assert "several calls" in tail and "plain text" in tail
    assert "x (integer, required)" in a


def test_prompt_ids_merge_the_tasks_own_system_message():
    from railcall.models.store import load_tokenizer

    tok = load_tokenizer()
    (t,) = bfcl.load_category(TINY, "tiny_parallel_multiple")
    text = tok.decode(bfcl.prompt_ids(tok, t))
    assert text.count("<|im_start|>system") == 1
    assert "- get_weather: Current weather for a city." in text and "Be brief." in text
    assert text.index("Be brief.") > text.index("get_time") and text.rstrip().endswith("<|im_start|>assistant")


def test_call_grammar_takes_one_call_or_an_array(bytes_vocab):
    from railcall.matcher import Matcher, compiled_grammar

    tools = bfcl.load_category(TINY, "tiny_parallel_multiple")[0].tools
    g = compiled_grammar(call_grammar(tools), bytes_vocab)
    for text, ok in [(b'{"tool":"get_time","args":{"city":"Rome"}}', True),
                     (b'[{"tool":"get_weather","args":{"city":"Paris"}},{"tool":"get_weather","args":{"city":"Rome","unit":"celsius"}}]', True),
                     (b'[{"tool":"get_time","args":{"city":"Rome"}}]', True),
                     (b'[]', False),
                     (b'{"tool":"get_weather","args":{"city":"Rome","unit":"kelvin"}}', False),
                     (b'{"tool":"get_date","args":{}}', False)]:
        m = Matcher(g)
        assert (m.consume_bytes(text) and m.is_accepting()) is ok, text
