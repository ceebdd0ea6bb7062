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


def test_the_hf_processor_refuses_more_rows_than_it_has_matchers(bytes_vocab):
    from railcall.grammar.tools import Tool, tool_grammar
    from railcall.integrations.hf import RailcallLogitsProcessor
    from railcall.matcher import compiled_grammar

    cg = compiled_grammar(tool_grammar([Tool("f", "", {"type": "object", "properties": {}})]), bytes_vocab)
    proc = RailcallLogitsProcessor(cg, prompt_len=1)
    scores = torch.zeros(2, bytes_vocab.logits_width)
    with pytest.raises(MatcherError, match="built for 1 row.*passed 2.*batch_size=2"):
        proc(torch.zeros(2, 1, dtype=torch.long), scores)
    ok = RailcallLogitsProcessor(cg, prompt_len=1, batch_size=2)(torch.zeros(2, 1, dtype=torch.long), scores)
    assert torch.isinf(ok).any(dim=1).all()  # both rows masked


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

    bad = {"type": "object", "properties": {"a": {"type": "string", "multipleOf": 3}}}
    req = parse({"messages": USER, "tools": [{"type": "function", "function": {"name": "f", "parameters": bad}}]})
    with pytest.raises(RequestError) as e:
        _tools(req)
    msg = str(e.value)
    assert msg.count("multipleOf") == 1 and "tool 'f': keyword 'multipleOf' at /properties/a" in msg
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
