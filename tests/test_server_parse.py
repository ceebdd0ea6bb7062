"""Request bodies the server must answer with a 400 that names the field (or accept), checked
without a model: what json.loads and pydantic let through that later stages could not handle."""

from __future__ import annotations

import json

import pytest
import torch

from railcall.errors import MatcherError, RequestError
from railcall.server import app

USER = [{"role": "user", "content": "hi"}]


def parse(body: dict):
    return app._parse(json.dumps(body).encode())


@pytest.mark.parametrize("body, param", [
    ({"messages": [{"role": "user", "content": "hi \ud800"}]}, "messages[0].content"),
    ({"messages": USER, "stop": ["a\udc00"]}, "stop[0]"),
    ({"messages": USER, "tools": [{"type": "function", "function": {"name": "f", "description": "d\udfff",
                                                                   "parameters": {"type": "object"}}}]},
     "tools[0].function.description"),
    ({"messages": USER, "tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"\ud800x": {"type": "string"}}}}}]},
     "tools[0].function.parameters.properties (a key)"),
])
def test_a_lone_surrogate_is_a_400_naming_where_it_is(body, param):
    with pytest.raises(RequestError) as e:
        parse(body)
    assert e.value.status == 400 and e.value.param == param and "lone surrogate" in str(e.value)


def test_a_surrogate_pair_is_one_character_and_fine():
    req = parse({"messages": [{"role": "user", "content": "smile \U0001F600"}]})
    assert req.messages[0].content == "smile \U0001F600"


def test_null_means_the_default_as_in_openais_api():
    req = parse({"messages": USER, "temperature": None, "top_p": None, "n": None, "stream": None,
                 "logprobs": None, "parallel_tool_calls": None})
    assert (req.temperature, req.top_p, req.n, req.stream, req.logprobs, req.parallel_tool_calls) == \
        (1.0, 1.0, 1, False, False, True)


@pytest.mark.parametrize("seed", [2**64, -(2**63) - 1])
def test_a_seed_outside_int64_is_a_400(seed):
    with pytest.raises(RequestError) as e:
        parse({"messages": USER, "seed": seed})
    assert e.value.param == "seed"
    assert parse({"messages": USER, "seed": 2**63 - 1}).seed == 2**63 - 1


def test_the_hf_processor_follows_each_row_by_its_own_tokens(bytes_vocab):
    """Rows are matched by the tokens they generated, not by position: any number of rows, a
    reordered row keeps its grammar state, a refused token names its row, a shorter call starts a
    new generate() and a prompt of another length is refused with what to do."""
    from railcall.grammar.tools import Tool, tool_grammar
    from railcall.integrations.hf import RailcallLogitsProcessor
    from railcall.bitmask import allocate_bitmask, apply_bitmask
    from railcall.matcher import Matcher, compiled_grammar

    v = bytes_vocab
    cg = compiled_grammar(tool_grammar([Tool("f", "", {"type": "object", "properties": {}})]), v)
    proc = RailcallLogitsProcessor(cg, prompt_len=1)
    brace = v.lookup[b"{"]
    legal = lambda row: torch.isfinite(row).nonzero().flatten().tolist()

    def expected(tokens):
        m = Matcher(cg)
        assert all(m.consume_token(t) for t in tokens)
        scores = torch.zeros(1, v.logits_width)
        bm = allocate_bitmask(v.logits_width)
        m.fill_bitmask(bm)
        apply_bitmask(scores, bm)
        return legal(scores[0])

    first = proc(torch.zeros(3, 1, dtype=torch.long), torch.zeros(3, v.logits_width))
    assert brace in legal(first[0]) and legal(first[0]) == legal(first[2]) == expected([])  # three rows
    # next step: two rows, different histories, in either order (beam search reorders rows)
    opened = v.lookup[b'{"']
    for ids in ([[0, brace], [0, opened]], [[0, opened], [0, brace]]):
        proc(torch.zeros(2, 1, dtype=torch.long), torch.zeros(2, v.logits_width))  # a new generate()
        second = proc(torch.tensor(ids), torch.zeros(2, v.logits_width))
        assert [legal(r) for r in second] == [expected([row[1]]) for row in ids]
    assert expected([brace]) != expected([opened])
    bad = torch.tensor([[0, brace, v.lookup[b'"']], [0, brace, v.lookup[b"x"]]])
    with pytest.raises(MatcherError, match=r"row 1: generated token .* refused"):
        proc(bad, torch.zeros(2, v.logits_width))
    # a call no longer than the last one is a new generate(): fresh matchers, the prompt checked
    again = proc(torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, v.logits_width))
    assert legal(again[0]) == expected([])
    with pytest.raises(MatcherError, match="built for prompts of 1 tokens.*prompt_len=2"):
        RailcallLogitsProcessor(cg, prompt_len=1)(torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, v.logits_width))


@pytest.mark.parametrize("extra, param", [({"max_tokens": True}, "max_tokens"), ({"max_tokens": "5"}, "max_tokens"),
                                          ({"stream": "yes"}, "stream"), ({"n": 1.0}, "n"),
                                          ({"logprobs": 1}, "logprobs")])
def test_a_value_of_the_wrong_json_type_is_not_coerced(extra, param):
    with pytest.raises(RequestError) as e:
        parse({"messages": USER, **extra})
    assert e.value.param == param


@pytest.mark.parametrize("choice", [{"type": "function"}, "maybe", {"type": "function", "function": {}}])
def test_a_malformed_tool_choice_is_told_both_forms(choice):
    with pytest.raises(RequestError) as e:
        parse({"messages": USER, "tool_choice": choice})
    assert e.value.param == "tool_choice" and "'required'" in str(e.value) and '"function": {"name"' in str(e.value)


def test_json_nested_too_deeply_is_not_called_invalid():
    with pytest.raises(RequestError, match="nests arrays or objects too deeply") as e:
        app._parse(b'{"messages":[],"x":' + b"[" * 5000 + b"]" * 5000 + b"}")
    assert "not valid JSON" not in str(e.value)


def test_schema_errors_say_once_where_and_what_an_http_client_can_do():
    from railcall.server.plan import _response_grammar, _tools

    bad = {"type": "object", "properties": {"a": {"type": "array", "contains": {"type": "integer"}}}}
    req = parse({"messages": USER, "tools": [{"type": "function", "function": {"name": "f", "parameters": bad}}]})
    with pytest.raises(RequestError) as e:
        _tools(req)
    msg = str(e.value)
    assert msg.count("contains") == 1 and "tool 'f': keyword 'contains' at /properties/a" in msg
    assert "lenient" not in msg and "remove it from the schema" in msg
    req = parse({"messages": USER, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "strict": True, "schema": {"type": "array", "minItems": 9999, "items": bad}}}})
    with pytest.raises(RequestError) as e:
        _response_grammar(req)
    assert "SchemaOptions" not in str(e.value) and e.value.param == "response_format.json_schema.schema"
    req = parse({"messages": USER, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "strict": True, "schema": bad}}})
    with pytest.raises(RequestError, match="set response_format.json_schema.strict to false"):
        _response_grammar(req)


def test_an_overlapping_one_of_is_explained_in_http_terms():
    """The compiler's remedy is structured (SchemaError.lenient / .option), so each caller words
    it: a library caller is told about lenient=True, a tools entry gets no remedy it cannot use,
    and a response_format is told to set strict to false."""
    from railcall.errors import SchemaError
    from railcall.grammar.schema import schema_grammar
    from railcall.server.plan import _response_grammar, _tools

    overlap = {"type": "object", "properties": {"v": {"oneOf": [{"type": "integer"}, {"type": "number"}]}}}
    with pytest.raises(SchemaError) as lib:
        schema_grammar(overlap)
    assert lib.value.lenient == "anyof" and str(lib.value).endswith("or pass lenient=True to treat it as anyOf")
    req = parse({"messages": USER, "tools": [{"type": "function", "function": {"name": "f", "parameters": overlap}}]})
    with pytest.raises(RequestError) as e:
        _tools(req)
    assert "tool 'f': keyword 'oneOf' at /properties/v/oneOf" in str(e.value)
    assert "lenient" not in str(e.value) and str(e.value).endswith("(distinct types or const values)")
    req = parse({"messages": USER, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "strict": True, "schema": overlap}}})
    with pytest.raises(RequestError) as e:
        _response_grammar(req)
    assert str(e.value).endswith("or set response_format.json_schema.strict to false to treat it as anyOf")


def test_a_schema_limit_names_its_option_to_a_library_caller_only():
    from railcall.errors import SchemaError
    from railcall.grammar.schema import SchemaOptions, schema_grammar
    from railcall.server.plan import _response_grammar

    big = {"type": "array", "items": {"type": "integer"}, "minItems": 9999}
    with pytest.raises(SchemaError) as lib:
        schema_grammar(big, SchemaOptions())
    assert lib.value.option == "max_min_items" and "(SchemaOptions.max_min_items)" in str(lib.value)
    assert lib.value.with_context("tool 'g'").option == "max_min_items"
    req = parse({"messages": USER, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "strict": True, "schema": big}}})
    with pytest.raises(RequestError) as e:
        _response_grammar(req)
    assert "SchemaOptions" not in str(e.value) and "lower minItems" in str(e.value)
