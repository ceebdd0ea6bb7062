"""BFCL files -> Tasks: the shared categories, categories not seen before (hand-made ones in the
same format), the decoding mode per category, and the one prompt every category gets."""

from __future__ import annotations

from pathlib import Path

import pytest

from railcall.eval import bfcl
from railcall.eval.runner import call_grammar
from railcall.grammar.tools import Tool
from railcall.prompts.chat import system_prompt
from railcall.data import bfcl_data

SHARED = bfcl_data()  # the installed bfcl-eval package's data
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
    assert set(bfcl.SHARED_CATEGORIES) < set(bfcl.categories(SHARED))
    assert bfcl.single_turn_categories(SHARED) == bfcl.SINGLE_TURN  # 'all': BFCL's order, nothing multi-turn
    assert bfcl.categories(TINY) == ["tiny_irrelevance", "tiny_parallel_multiple"]
    assert bfcl.single_turn_categories(TINY) == ["tiny_irrelevance", "tiny_parallel_multiple"]


@pytest.mark.parametrize("category, n, expects", [
    ("simple_java", 100, "calls"), ("simple_javascript", 50, "calls"), ("parallel_multiple", 200, "calls"),
    ("live_multiple", 1053, "calls"), ("live_parallel", 16, "calls"), ("live_parallel_multiple", 24, "calls"),
    ("irrelevance", 240, "none"), ("live_irrelevance", 884, "none"), ("live_relevance", 16, "any")])
def test_every_single_turn_category_loads(category, n, expects):
    tasks = bfcl.load_category(SHARED, category)
    assert len(tasks) == n and len({t.id for t in tasks}) == n
    assert {t.expects for t in tasks} == {expects}
    assert bfcl.tool_choice(tasks) == ("required" if expects == "calls" else "auto")


def test_java_and_javascript_parameters_are_strings_in_the_languages_syntax():
    (java,) = bfcl.load_category(SHARED, "simple_java", limit=1)
    assert java.language == "java"
    (tool,) = java.tools
    assert "Java 8 SDK syntax" in tool.description
    props = tool.parameters["properties"]
    assert {p["type"] for p in props.values()} == {"string"}
    assert all("in string representation" in p["description"] for p in props.values())
    (py,) = bfcl.load_category(SHARED, "simple_python", limit=1)
    assert py.language == "python" and "syntax" not in py.tools[0].description


def test_unknown_category_names_what_is_there(tmp_path):
    with pytest.raises(FileNotFoundError, match="simple_python"):
        bfcl.load_category(SHARED, "simple_cobol")
    with pytest.raises(ValueError, match="multi-turn"):
        bfcl.load_category(SHARED, "multi_turn_base")


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
    a = system_prompt([Tool("f", "Do f.", {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]})], purpose="bfcl")
    b = system_prompt([Tool("g", "Do g.", {"type": "object", "properties": {}})], purpose="bfcl")
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


def test_an_enum_none_of_whose_values_has_the_declared_type_decides():
    """BFCL's live data declares `"type": "boolean"` with the enum "True", "False", "dontcare"; its
    gold answers are those strings, so the enum is kept and the declared type dropped."""
    from railcall.eval.bfcl_dialect import bfcl_to_json_schema

    p = {"type": "dict", "properties": {"free": {"type": "boolean", "enum": ["True", "False", "dontcare"]},
                                        "n": {"type": "integer", "enum": [1, 2]}}}
    out = bfcl_to_json_schema(p)["properties"]
    assert out["free"] == {"enum": ["True", "False", "dontcare"]}
    assert out["n"] == {"type": "integer", "enum": [1, 2]}
