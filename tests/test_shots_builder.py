"""In-context examples (railcall.prompts.shots): every example call is one its format's grammar
accepts and its tool's schema validates; examples come from the tool table alone; the same table
gives the same examples in any process."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from railcall.data import bfcl_data
from railcall.errors import GrammarError
from railcall.eval import bfcl
from railcall.grammar.tools import FORMATS, Tool, tool_grammar
from railcall.matcher import Matcher, compiled_grammar
from railcall.prompts.shots import NoPlaceholder, placeholder, placeholder_args, request, shot_messages, shots, words
from railcall.vocab import Vocabulary

from toolgen import random_tools

BFCL = bfcl_data()
CATEGORIES = ["simple_python", "multiple", "parallel", "parallel_multiple", "live_simple", "live_multiple",
              "simple_java", "simple_javascript"]
WEATHER = Tool("get_weather", "Current weather.", {
    "type": "object",
    "properties": {"city": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"},
                   "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                   "days": {"type": "integer", "minimum": 1, "maximum": 3}},
    "required": ["city", "unit"]})


@pytest.fixture(scope="module")
def byte_vocab():
    # one token per byte and no special tokens: hermes' tags are written as text
    return Vocabulary.from_pieces([bytes([b]) for b in range(256)], name="bytes-256")


def test_placeholders_follow_the_schema():
    a = placeholder_args(WEATHER)
    assert a == {"city": "San Francisco", "unit": "celsius"}  # required only; the description's example; enum[0]
    assert list(a) == ["city", "unit"]
    assert placeholder({"type": "integer", "minimum": 10, "maximum": 12}, "n") == 10
    assert placeholder({"type": "integer", "exclusiveMaximum": 0}, "n") == -1
    assert placeholder({"type": "number", "minimum": 0, "maximum": 1}, "x") == 1
    assert placeholder({"type": "string", "format": "date"}, "when") == "2024-05-01"
    assert placeholder({"type": "string"}, "email") == "alice@example.com"
    assert placeholder({"type": "string", "maxLength": 3}, "city") == "Par"
    assert placeholder({"type": "string", "pattern": "^[A-Z]"}, "city") == "Paris"
    assert placeholder({"type": "array", "items": {"type": "string"}, "minItems": 2}, "cities") == ["Paris", "Tokyo"]
    assert placeholder({"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"type": "null"}},
                        "required": ["b"]}, "o") == {"b": None}
    assert placeholder({"anyOf": [{"type": "string", "pattern": "^[0-9]+$"}, {"type": "integer"}]}, "n") == 5
    assert placeholder({"type": ["null", "boolean"]}, "flag") is True
    for bad in ({"$ref": "#/defs/x"}, {"type": "string", "pattern": "^[0-9]+$"}, {"enum": []},
                {"type": "integer", "minimum": 1.2, "maximum": 1.8}):
        with pytest.raises(NoPlaceholder):
            placeholder(bad, "x")


def test_requests_name_the_tool_and_give_each_argument():
    assert words("calculate_triangle_area") == "calculate triangle area"
    assert words("math.factorial") == "math factorial"
    assert words("getWeather") == "get weather"
    assert request(WEATHER, {"city": "Paris", "unit": "celsius"}) == "Get weather with city Paris and unit celsius."
    assert request(Tool("ping"), {}) == "Ping."
    s = shots([WEATHER], 2)
    assert [x.request for x in s] == ["Get weather with city San Francisco and unit celsius.",
                                      "Get weather with city Tokyo and unit celsius."]  # a second example differs
    assert shot_messages(s[:1]) == [{"role": "user", "content": s[0].request}, {"role": "assistant", "content": s[0].call}]


def test_a_tool_no_placeholder_fits_is_left_out():
    odd = Tool("odd", "", {"type": "object", "properties": {"z": {"$ref": "#/$defs/z"}}, "required": ["z"]})
    assert [s.tool for s in shots([odd, WEATHER], 2)] == ["get_weather", "get_weather"]
    assert shots([odd], 3) == [] and shots([WEATHER], 0) == []


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_bfcl_examples_are_valid_calls_of_their_tools(byte_vocab, fmt):
    """The first tasks of eight BFCL categories: every example call is accepted by the format's
    grammar over the task's table and its arguments validate against the tool's schema."""
    seen = 0
    for cat in CATEGORIES:
        for task in bfcl.load_category(BFCL, cat, 6):
            tools = task.tools
            try:
                grammar = compiled_grammar(tool_grammar(tools, fmt), byte_vocab)
            except GrammarError:  # pythonic refuses names and keys Python cannot spell
                continue
            by_name = {t.name: t for t in tools}
            examples = shots(tools, 3, fmt)
            assert len(examples) == 3, task.id
            for s in examples:
                m = Matcher(grammar)
                assert m.consume_bytes(s.call.encode()) and m.is_accepting(), (task.id, s.call)
                jsonschema.validate(s.args, by_name[s.tool].parameters)
                seen += 1
            assert len({s.tool for s in examples}) == min(3, len(tools))  # the table's tools in turn
    assert seen >= 100


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_a_paired_example_asks_for_two_things_and_makes_both_calls(byte_vocab, fmt):
    """shots(..., pair=True): the last example names the tool with two sets of values and its
    reply is the two calls in the format's form for several calls, accepted by the grammar that
    allows several calls (each call's arguments valid) and read back as two calls; the examples
    before it are unchanged."""
    from railcall.eval.runner import read_calls

    tools = [WEATHER, Tool("ping", "Ping.", {"type": "object", "properties": {}})]
    plain, paired = shots(tools, 2, fmt), shots(tools, 2, fmt, pair=True)
    assert paired[0] == plain[0] and paired[1] != plain[1]
    last = paired[1]
    assert last.request == ("Get weather with city San Francisco and unit celsius, "
                            "and with city Tokyo and unit celsius.")
    m = Matcher(compiled_grammar(tool_grammar(tools, fmt, parallel=True), byte_vocab))
    assert m.consume_bytes(last.call.encode()) and m.is_accepting(), last.call
    calls, _ = read_calls(byte_vocab, list(last.call.encode()), fmt, "required")
    assert calls == [{"tool": "get_weather", "args": {"city": "San Francisco", "unit": "celsius"}},
                     {"tool": "get_weather", "args": {"city": "Tokyo", "unit": "celsius"}}]
    # no tool with two different sets of values (ping has no arguments): no pair, the plain examples
    assert shots([tools[1]], 2, fmt, pair=True) == shots([tools[1]], 2, fmt)
    assert shots(tools, 0, fmt, pair=True) == []


@pytest.mark.parametrize("seed", range(30))
def test_random_tables_give_valid_examples(byte_vocab, seed):
    rng = random.Random(seed)
    tools = random_tools(rng, rng.randint(1, 3))
    grammar = compiled_grammar(tool_grammar(tools, "json"), byte_vocab)
    by_name = {t.name: t for t in tools}
    for s in shots(tools, 4):
        m = Matcher(grammar)
        assert m.consume_bytes(s.call.encode()) and m.is_accepting(), s.call
        jsonschema.validate(s.args, by_name[s.tool].parameters)


def test_examples_come_from_the_tool_table_alone():
    """Two tasks with the same tools but other questions and gold answers get the same examples;
    the runner's examples are the builder's over the task's tools."""
    from railcall.eval.runner import examples

    task = bfcl.load_category(BFCL, "multiple", 1)[0]
    other = bfcl.Task(task.category, "other", [{"role": "user", "content": "something else entirely"}],
                      task.functions, [{"nothing": {"x": [1]}}])
    assert examples(task, 2) == examples(other, 2) == shot_messages(shots(task.tools, 2))
    asked = json.dumps(task.messages) + json.dumps(task.ground_truth)
    for m in examples(task, 2):
        assert m["content"] not in asked


def test_the_same_table_gives_the_same_examples_in_another_process():
    tasks = [t for cat in ("multiple", "live_multiple") for t in bfcl.load_category(BFCL, cat, 5)]
    here = [[s.call for s in shots(t.tools, 3, fmt)] for t in tasks for fmt in ("json", "pythonic")]
    code = ("import json; from railcall.data import bfcl_data; from railcall.eval import bfcl; "
            "from railcall.prompts.shots import shots; "
            "ts = [t for c in ('multiple', 'live_multiple') for t in bfcl.load_category(bfcl_data(), c, 5)]; "
            "print(json.dumps([[s.call for s in shots(t.tools, 3, f)] for t in ts for f in ('json', 'pythonic')]))")
    env = {**os.environ, "PYTHONHASHSEED": "12345",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1] / "src"), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == here


class _Tok:
    chat_template = "{{ messages }}"

    def __init__(self):
        self.messages = None

    def apply_chat_template(self, messages, **kw):
        self.messages = messages
        return [1]


def test_examples_are_turns_before_the_question():
    task = bfcl.load_category(BFCL, "simple_python", 1)[0]
    tok = _Tok()
    from railcall.eval.runner import examples

    bfcl.prompt_ids(tok, task, examples=examples(task, 2))
    roles = [m["role"] for m in tok.messages]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user"]
    assert tok.messages[-1]["content"] == task.messages[-1]["content"]
    assert tok.messages[2]["content"].startswith('{"tool":"' + task.tools[0].name)
    bfcl.prompt_ids(tok, task)
    assert [m["role"] for m in tok.messages] == ["system", "user"]


def test_shots_go_in_the_prompt_and_the_settings(tmp_path, monkeypatch, smollm2_tokenizer):
    """--shots 2: each prompt holds two example turns built from its task's tools, run.json says
    shots 2, and a resumed run with other shots is refused; a run.json from before --shots
    (no shots field) resumes as shots 0."""
    import types

    import railcall.runtime.batch
    from railcall.eval.runner import examples, run_bfcl
    from railcall.models import store

    from railcall.vocab import Vocabulary

    lm = types.SimpleNamespace(tokenizer=smollm2_tokenizer, name="stub",
                               model=types.SimpleNamespace(config=types.SimpleNamespace(vocab_size=len(smollm2_tokenizer))),
                               vocabulary=lambda: Vocabulary.from_hf(smollm2_tokenizer, logits_width=len(smollm2_tokenizer),
                                                                     name="stub"))
    monkeypatch.setattr(store, "load_model", lambda model=None, device=None, **kw: lm)
    seen = []

    def nothing_decoded(model, vocab, requests, params, **kw):
        seen.extend(p for p, _ in requests)
        return iter(())

    monkeypatch.setattr(railcall.runtime.batch, "decode_stream", nothing_decoded)
    run_bfcl(["multiple"], tmp_path, data=BFCL, limit=2, grammar=False, bfcl_prompt=False, shots=2)
    tasks = bfcl.load_category(BFCL, "multiple", 2)
    assert sorted(seen) == sorted(bfcl.prompt_ids(smollm2_tokenizer, t, examples=examples(t, 2)) for t in tasks)
    text = smollm2_tokenizer.decode(bfcl.prompt_ids(smollm2_tokenizer, tasks[0], examples=examples(tasks[0], 2)))
    turns = examples(tasks[0], 2)
    assert [m["role"] for m in turns] == ["user", "assistant"] * 2
    assert all(m["content"] in text for m in turns) and tasks[0].messages[-1]["content"] in text
    assert json.loads((tmp_path / "run.json").read_text())["settings"]["shots"] == 2
    with pytest.raises(ValueError, match="shots"):
        run_bfcl(["multiple"], tmp_path, data=BFCL, limit=2, grammar=False, bfcl_prompt=False, shots=0, resume=True)
    settings = json.loads((tmp_path / "run.json").read_text())
    del settings["settings"]["shots"]
    (tmp_path / "run.json").write_text(json.dumps(settings))
    run_bfcl(["multiple"], tmp_path, data=BFCL, limit=2, grammar=False, bfcl_prompt=False, resume=True)  # shots 0: as before
    with pytest.raises(ValueError, match="shots must be 0 or more"):
        run_bfcl(["multiple"], tmp_path, data=BFCL, limit=2, shots=-1)
    # --shot-pair: the last example of each prompt is the pair, and a setting of the run
    seen.clear()
    run_bfcl(["multiple"], tmp_path, data=BFCL, limit=2, grammar=False, bfcl_prompt=False, shots=2, shot_pair=True)
    assert sorted(seen) == sorted(bfcl.prompt_ids(smollm2_tokenizer, t, examples=examples(t, 2, "json", True))
                                  for t in tasks)
    assert examples(tasks[0], 2, "json", True)[-1]["content"].startswith("[")  # two calls: a JSON array
    assert json.loads((tmp_path / "run.json").read_text())["settings"]["shot_pair"] is True
    with pytest.raises(ValueError, match="shot_pair"):
        run_bfcl(["multiple"], tmp_path, data=BFCL, limit=2, grammar=False, bfcl_prompt=False, shots=2, resume=True)
