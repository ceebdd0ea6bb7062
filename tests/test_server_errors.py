"""Every error case answers in OpenAI's error format, with the right status, before any
generation: a broken schema names its keyword and JSON pointer, a bad request names the field."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from server_harness import API_KEY, MAX_BODY, MODEL, TOOLS, wait_idle

pytestmark = pytest.mark.model

ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
HEADERS = {"Authorization": f"Bearer {API_KEY}"}


def post(srv, body, **kw):
    return httpx.post(srv.base_url + "/chat/completions", headers=HEADERS, timeout=30, **kw,
                      **({"json": body} if isinstance(body, dict) else {"content": body}))


def error_of(r, status):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


def test_broken_tool_schema_names_keyword_and_pointer(client):
    tools = [TOOLS[0], {"type": "function", "function": {"name": "bad", "parameters": {
        "type": "object", "properties": {"n": {"type": "array", "contains": {"type": "integer"}}}}}}]
    t0 = time.monotonic()
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=ASK, tools=tools, max_tokens=4)
    assert time.monotonic() - t0 < 5  # answered at validation, not after generating
    err = e.value.body
    assert e.value.status_code == 400 and err["param"] == "tools[1].function.parameters" and err["code"] == "invalid_schema"
    assert "'contains'" in err["message"] and "/properties/n" in err["message"]


def test_broken_response_schema_names_keyword_and_pointer(client):
    schema = {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True, "items": {"type": "string"}}}}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=4, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "strict": True, "schema": schema}})
    assert e.value.body["param"] == "response_format.json_schema.schema"
    assert "'uniqueItems'" in e.value.body["message"] and "/properties/tags" in e.value.body["message"]
    # not strict: the keyword the grammar cannot enforce is ignored instead (as OpenAI does)
    r = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=2, response_format={
        "type": "json_schema", "json_schema": {"name": "x", "strict": False, "schema": schema}})
    assert r.choices[0].message.content.startswith("{")


def test_unknown_tool_in_tool_choice(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=4,
                                       tool_choice={"type": "function", "function": {"name": "send_email"}})
    assert e.value.body["param"] == "tool_choice" and "send_email" in e.value.body["message"]
    assert "get_weather" in e.value.body["message"]  # and says what is known
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=ASK, tool_choice="required", max_tokens=4)
    assert e.value.body["param"] == "tool_choice"


@pytest.mark.parametrize("messages, param", [
    ([], "messages"),
    ([{"role": "wizard", "content": "hi"}], "messages[0]"),
    ([{"role": "user"}], "messages[0].content"),
    ([{"role": "user", "content": 5}], "messages[0].content"),
    ([{"role": "assistant"}], "messages[0]"),
    ([{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "call_9", "content": "x"}], "messages[1].tool_call_id"),
    ([{"role": "user", "content": "hi"},
      {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}],
     "messages[1].tool_calls[0].function.arguments"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "messages[0].content"),
])
def test_malformed_messages(srv, messages, param):
    err = error_of(post(srv, {"model": MODEL, "messages": messages, "max_tokens": 4}), 400)
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param or (err["param"] or "").startswith(param), err


@pytest.mark.parametrize("body, param", [
    ({"messages": ASK, "max_tokens": 0}, "max_tokens"),
    ({"messages": ASK, "temperature": 3}, "temperature"),
    ({"messages": ASK, "n": 17}, "n"),
    ({"messages": ASK, "user": 5}, "user"),
    ({"messages": ASK, "top_logprobs": 2}, "top_logprobs"),
    ({"messages": ASK, "best_of": 2}, "best_of"),
    ({"messages": ASK, "logit_bias": {"99999999": 1}}, "logit_bias"),
    ({"messages": ASK, "guided_regex": "(?<=a)b"}, "guided_regex"),
    ({"messages": ASK, "guided_grammar": "start: start \"a\" | \"b\""}, "guided_grammar"),
    ({"messages": ASK, "response_format": {"type": "grammar", "syntax": "gbnf", "definition": "root ::= [z-a]"}},
     "response_format.definition"),
    ({"messages": ASK, "response_format": {"type": "grammar", "syntax": "lark"}}, "response_format"),
    ({"messages": ASK, "guided_json": {"type": "object"}, "response_format": {"type": "json_object"}}, "guided_json"),
    ({"messages": ASK, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"messages": ASK, "response_format": {"type": "json_schema"}}, "response_format"),
    ({"messages": ASK, "tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
    ({"messages": ASK, "tools": [TOOLS[0], TOOLS[0]]}, "tools[1].function.name"),
    ({"messages": ASK, "max_tokens": 10**9}, "max_tokens"),
])
def test_bad_fields_are_400_naming_the_field(srv, body, param):
    err = error_of(post(srv, body), 400)
    if param:
        assert err["param"] == param, err


def test_body_that_is_not_a_json_object(srv):
    assert error_of(post(srv, b"{not json"), 400)["code"] == "invalid_json"
    assert error_of(post(srv, b"[1, 2]"), 400)["code"] == "invalid_json"
    assert error_of(post(srv, "[" * 100000 + "]" * 100000), 400)


def test_oversized_body_is_413(srv, client):
    big = "x" * (MAX_BODY + 1)
    err = error_of(post(srv, {"messages": [{"role": "user", "content": big}]}), 413)
    assert err["code"] == "request_too_large"
    with pytest.raises(openai.APIStatusError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": big}], max_tokens=4)
    assert e.value.status_code == 413

    def chunked():  # no Content-Length: counted while read
        for _ in range(MAX_BODY // 1024 + 2):
            yield b" " * 1024

    assert error_of(post(srv, chunked()), 413)


def test_full_queue_is_429_and_stopped_engine_is_503(srv, client):
    engine = srv.engine
    assert wait_idle(engine)
    saved = engine.max_pending
    engine.max_pending = 0
    try:
        with pytest.raises(openai.RateLimitError) as e:
            client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=4)
        assert e.value.status_code == 429 and e.value.body["type"] == "rate_limit_error"
        assert int(e.value.response.headers["retry-after"]) >= 1  # when to come back
    finally:
        engine.max_pending = saved
    engine.stop()
    try:
        with pytest.raises(openai.InternalServerError) as e:
            client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=4)
        assert e.value.status_code == 503
    finally:
        engine.start()
    r = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=1)  # serving again
    assert r.usage.completion_tokens == 1


def test_unknown_paths_and_methods_in_openai_format(srv):
    assert error_of(httpx.get(srv.base_url + "/nothing", headers=HEADERS), 404)["type"] == "not_found_error"
    assert error_of(httpx.get(srv.base_url + "/chat/completions", headers=HEADERS), 405)
    assert error_of(httpx.get(srv.base_url + "/models/gpt-9", headers=HEADERS), 404)["param"] == "model"
