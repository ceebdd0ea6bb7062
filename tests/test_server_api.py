"""The server through the official `openai` client, on the embedded SmolLM2 (greedy, few tokens).

The grammar guarantees the shape of what comes back, so these assertions hold whatever the
135M model chooses: a named tool_choice calls that tool with arguments that parse against its
schema, a json_schema answer validates, and so on.
"""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from server_harness import API_KEY, MODEL, TOOLS, live

pytestmark = pytest.mark.model

ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


NAMED = dict(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=20, temperature=0,
             tool_choice={"type": "function", "function": {"name": "get_weather"}})
COUNT = [{"role": "user", "content": "Count from 1 to 20."}]


@pytest.fixture(scope="module")
def named_call(client):
    return client.chat.completions.create(**NAMED)


@pytest.fixture(scope="module")
def counted(client):
    """A greedy free-text answer with logprobs and token ids (reused by several tests)."""
    return client.chat.completions.create(model=MODEL, messages=COUNT, max_tokens=8, temperature=0, logprobs=True,
                                          top_logprobs=3, extra_body={"return_token_ids": True})


def _args_valid(call, tools=TOOLS):
    spec = next(t["function"] for t in tools if t["function"]["name"] == call.function.name)
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, spec["parameters"])
    return args


def test_health_and_models(srv, client):
    h = httpx.get(srv.url + "/health").json()  # no key needed
    assert h["status"] == "ok" and h["model"] == srv.served.name
    models = client.models.list()
    assert [m.id for m in models.data] == [srv.served.name, MODEL]  # the id, then its short name
    doc = httpx.get(srv.url + "/openapi.json").json()
    assert "/v1/chat/completions" in doc["paths"] and "ChatCompletionRequest" in doc["components"]["schemas"]


def test_named_tool_choice_non_streaming(named_call):
    r = named_call
    choice = r.choices[0]
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    city = _args_valid(call)["city"]
    assert isinstance(city, str) and city and city != "?"  # the model wrote it (20 tokens hold the whole call)
    assert choice.finish_reason == "tool_calls"  # whole, inside the budget
    assert r.usage.completion_tokens >= 1 and r.usage.prompt_tokens > 20
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_required_tool_choice_picks_a_listed_tool(client):
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "What is 17 times 23?"}],
                                       tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                                       max_tokens=14, temperature=0, extra_body={"on_length": "close"})
    calls = r.choices[0].message.tool_calls
    assert calls and len(calls) == 1
    assert calls[0].function.name in {"get_weather", "calc"}
    _args_valid(calls[0])


def test_streamed_tool_call_assembles_to_the_same_call(client, named_call):
    whole = named_call.choices[0].message.tool_calls[0]
    stream = client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **NAMED)
    name, args, ids, finish, usage, roles = "", "", set(), None, None, []
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            roles.append(c.delta.role)
            for tc in c.delta.tool_calls or []:
                assert tc.index == 0
                ids.add(tc.id) if tc.id else None
                name += tc.function.name or ""
                args += tc.function.arguments or ""
            finish = c.finish_reason or finish
    assert roles[0] == "assistant"
    assert name == "get_weather" and len(ids) == 1
    assert args == whole.function.arguments  # greedy: the same call, delivered as deltas
    assert finish in ("tool_calls", "length") and usage.completion_tokens >= 1


def test_json_schema_response_validates(client):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 120}},
              "required": ["name", "age"], "additionalProperties": False}
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Invent a person."}], max_tokens=12, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "strict": True, "schema": schema}})
    msg = r.choices[0].message
    assert msg.tool_calls is None
    jsonschema.validate(json.loads(msg.content), schema)


def test_logprobs_and_token_ids(counted):
    r = counted
    choice = r.choices[0]
    entries = choice.logprobs.content
    ids = choice.model_extra["token_ids"]
    assert len(entries) == len(ids) == r.usage.completion_tokens == 8
    assert [e.token for e in entries] == [live().served.vocab.token_text(i) for i in ids]
    prompt_ids = r.model_extra["prompt_token_ids"]
    assert len(prompt_ids) == r.usage.prompt_tokens
    for e in entries:
        assert e.logprob <= 0 and 1 <= len(e.top_logprobs) <= 3
        # greedy: the chosen token is the most likely one, so it heads its own top list
        assert e.top_logprobs[0].token == e.token and e.top_logprobs[0].logprob == pytest.approx(e.logprob)
        assert [t.logprob for t in e.top_logprobs] == sorted((t.logprob for t in e.top_logprobs), reverse=True)
    text = "".join(bytes(e.bytes).decode("utf-8", "replace") for e in entries)
    assert text == choice.message.content


def test_stop_string_ends_and_is_cut(client, counted):
    free = counted.choices[0].message.content
    assert len(free) >= 6, free
    stop = free[len(free) // 2:][:2]  # a stop string from the middle of the greedy answer
    r = client.chat.completions.create(model=MODEL, messages=COUNT, max_tokens=8, temperature=0, stop=[stop, "@@@"])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == free[: free.index(stop)]
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=MODEL, messages=COUNT, max_tokens=8, temperature=0, stop=[stop, "@@@"], stream=True) if c.choices)
    assert streamed == r.choices[0].message.content


def test_history_with_tool_calls_and_results(client):
    msgs = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
    ]
    r = client.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS, tool_choice="none",
                                       max_tokens=2, temperature=0, extra_body={"return_token_ids": True})
    assert r.choices[0].message.tool_calls is None and r.choices[0].message.content
    # the history is in the prompt in the wire format the grammar enforces
    text = client_prompt_text(r.model_extra["prompt_token_ids"])
    assert '{"tool":"get_weather","args":{"city":"Paris"}}' in text and "18 C, sunny" in text


def client_prompt_text(ids):
    return live().served.tokenizer.decode(ids)


def test_wrong_key_is_401_and_health_stays_open(srv):
    import openai

    with pytest.raises(openai.AuthenticationError) as e:
        srv.client(key="wrong").models.list()
    assert e.value.status_code == 401 and e.value.body["code"] == "invalid_api_key"
    r = httpx.post(srv.base_url + "/chat/completions", json={"messages": ASK})
    assert r.status_code == 401 and r.json()["error"]["type"] == "invalid_request_error"
    assert httpx.get(srv.url + "/health").status_code == 200
    assert API_KEY not in r.text
