"""Fuzzed request bodies never produce a 500: every answer is a 200 or a 4xx in OpenAI's error
format. Bodies are a valid request with random mutations (fields replaced by random JSON,
removed, or added; random messages; random tool and response schemas built from real JSON
Schema keywords), plus raw random JSON.

The main run holds the queue closed (max_pending 0): a body is read, validated and planned --
prompt built, tool and response grammars compiled -- and then, if all of that passed, answered
429 instead of generating. A smaller run lets bodies through to the model (max_tokens 1), so
that whatever a strange but valid grammar does during decoding is covered too."""

from __future__ import annotations

import collections
import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server_harness import API_KEY, MODEL

pytestmark = pytest.mark.model

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40), st.floats(allow_nan=False, allow_infinity=False),
                    st.text(max_size=12))
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                            st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                           max_leaves=12)

KEYWORDS = ["type", "properties", "required", "items", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "$defs",
            "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum", "minItems", "maxItems", "pattern",
            "format", "additionalProperties", "not", "if", "prefixItems", "multipleOf", "description"]
TYPES = st.sampled_from(["object", "array", "string", "integer", "number", "boolean", "null", "date", 7])
schemas = st.recursive(
    st.fixed_dictionaries({"type": TYPES}),
    lambda inner: st.one_of(
        st.dictionaries(st.sampled_from(KEYWORDS), st.one_of(inner, json_values, TYPES, st.lists(inner, max_size=3),
                                                             st.dictionaries(st.text(max_size=5), inner, max_size=3),
                                                             st.sampled_from(["#", "#/$defs/a", "#/properties", "http://x"])),
                        max_size=5),
        st.fixed_dictionaries({"type": st.just("object"), "properties": st.dictionaries(st.text(max_size=5), inner, max_size=3),
                               "required": st.lists(st.text(max_size=5), max_size=3)})),
    max_leaves=10)

roles = st.sampled_from(["system", "user", "assistant", "tool", "developer", "function", ""])
messages = st.lists(st.one_of(
    st.fixed_dictionaries({"role": roles, "content": st.one_of(st.text(max_size=30), json_values)}),
    st.fixed_dictionaries({"role": st.just("assistant"), "tool_calls": st.lists(st.fixed_dictionaries({
        "id": st.text(max_size=5), "type": st.just("function"),
        "function": st.fixed_dictionaries({"name": st.text(max_size=8), "arguments": st.one_of(st.text(max_size=20), json_values)})}),
        max_size=2)}),
    st.fixed_dictionaries({"role": st.just("tool"), "tool_call_id": st.text(max_size=5), "content": st.text(max_size=10)}),
), min_size=0, max_size=4)
tools = st.lists(st.fixed_dictionaries({"type": st.sampled_from(["function", "other"]), "function": st.fixed_dictionaries(
    {"name": st.sampled_from(["f", "g", "get_weather", "a b", ""]), "parameters": st.one_of(schemas, json_values)})}),
    max_size=3)
tool_choice = st.one_of(st.sampled_from(["none", "auto", "required", "any"]), json_values,
                        st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
                            {"name": st.sampled_from(["f", "g", "zzz"])})}))
response_format = st.one_of(json_values, st.fixed_dictionaries({"type": st.sampled_from(["text", "json_object", "json_schema", "xml", "grammar"])}),
                            st.fixed_dictionaries({"type": st.just("grammar"), "syntax": st.sampled_from(["lark", "gbnf", "regex", "x"]),
                                                   "definition": st.one_of(json_values, st.text(max_size=12))}),
                            st.fixed_dictionaries({"type": st.just("json_schema"), "json_schema": st.fixed_dictionaries(
                                {"name": st.text(max_size=5), "strict": st.booleans(), "schema": st.one_of(schemas, json_values)})}))
FIELDS = {
    "messages": messages, "tools": tools, "tool_choice": tool_choice, "response_format": response_format,
    "parallel_tool_calls": json_values, "stream": st.booleans(), "temperature": json_values, "top_p": json_values,
    "seed": json_values, "stop": st.one_of(json_values, st.lists(st.text(max_size=3), max_size=5)),
    "logprobs": json_values, "top_logprobs": json_values, "n": json_values, "max_tokens": json_values,
    "max_completion_tokens": json_values, "return_token_ids": json_values, "stream_options": json_values,
    "logit_bias": json_values, "frequency_penalty": json_values, "presence_penalty": json_values,
    "repetition_penalty": json_values, "min_tokens": json_values, "on_length": st.one_of(json_values, st.sampled_from(["fit", "cut", "close"])),
    "distinct_calls": json_values,
    "guided_json": st.one_of(schemas, json_values), "guided_choice": st.one_of(json_values, st.lists(st.text(max_size=4), max_size=3)),
    "structured_outputs": json_values, "guided_regex": st.one_of(json_values, st.text(max_size=6)),
    "guided_grammar": st.one_of(json_values, st.text(max_size=12), st.just('start: "a"+')),
}


@st.composite
def bodies(draw):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "temperature": 0}
    for key in draw(st.lists(st.sampled_from(sorted(FIELDS)), max_size=4, unique=True)):
        body[key] = draw(FIELDS[key])
    if draw(st.booleans()):
        body.pop(draw(st.sampled_from(sorted(body))), None)
    if draw(st.integers(0, 9)) == 0:
        body[draw(st.text(max_size=6))] = draw(json_values)
    # whatever else changed, a request that passes validation generates at most one token
    if isinstance(body.get("max_tokens"), int) or "max_tokens" not in body:
        body["max_tokens"] = 1
    body.pop("max_completion_tokens", None)
    return body


STATUSES: collections.Counter = collections.Counter()


@pytest.fixture
def closed_queue(srv):
    saved = srv.engine.max_pending
    srv.engine.max_pending = 0
    yield
    srv.engine.max_pending = saved


@pytest.fixture(scope="module")
def http(srv):
    with httpx.Client(base_url=srv.base_url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60) as c:
        yield c


def check(response):
    STATUSES[response.status_code] += 1
    assert response.status_code != 500 and response.status_code < 500 or response.status_code == 503, response.text
    if response.status_code >= 400:
        err = response.json()["error"]
        assert isinstance(err["message"], str) and err["message"] and err["type"]
    elif response.headers["content-type"].startswith("text/event-stream"):
        lines = [x for x in response.text.split("\n") if x.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        for x in lines[:-1]:
            assert "error" not in json.loads(x[6:]), x
    else:
        assert response.json()["choices"][0]["message"]["role"] == "assistant"


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(body=bodies())
def test_fuzzed_bodies_never_500(http, closed_queue, body):
    check(http.post("/chat/completions", json=body))


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(raw=st.one_of(json_values.map(json.dumps), st.binary(max_size=64).map(bytes)))
def test_raw_bodies_never_500(http, closed_queue, raw):
    check(http.post("/chat/completions", content=raw, headers={"Content-Type": "application/json"}))


def test_the_fuzz_reached_both_sides_of_validation():
    # 429: the body passed validation and planning and was about to be queued
    assert STATUSES[400] >= 20 and STATUSES[429] >= 20 and STATUSES[500] == 0, STATUSES


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(body=bodies())
def test_fuzzed_bodies_through_the_model_never_500(http, body):
    check(http.post("/chat/completions", json=body))
