"""The server's API surface on the embedded model, through the official openai client: calls cut by
max_tokens (never complete with invented values), n choices, vLLM's guided fields, penalties,
the metrics endpoint, and the image-part and unknown-field refusals."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from server_harness import API_KEY, MODEL, TOOLS, wait_idle

pytestmark = pytest.mark.model

EMAIL = {"type": "function", "function": {"name": "send_email", "description": "Send an email.", "parameters": {
    "type": "object", "properties": {"to": {"type": "string"}, "subject": {"type": "string"}, "body": {"type": "string"}},
    "required": ["to", "subject", "body"]}}}
ASK = [{"role": "user", "content": "Email bob@example.com that the meeting moved to 3pm."}]
NAMED = {"type": "function", "function": {"name": "send_email"}}


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_cut_by_max_tokens_is_returned_cut(client, stream):
    """max_tokens 8 cannot hold the call: OpenAI's answer is finish 'length' with the arguments
    cut where they were cut, which no framework runs -- never '?' values in a complete call."""
    kw = dict(model=MODEL, messages=ASK, tools=[EMAIL], tool_choice=NAMED, max_tokens=16, temperature=0)
    if not stream:
        r = client.chat.completions.create(**kw)
        choice = r.choices[0]
        [call] = choice.message.tool_calls
        name, args, finish, used = call.function.name, call.function.arguments, choice.finish_reason, r.usage.completion_tokens
    else:
        name = args = ""
        finish = used = None
        for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
            if chunk.usage:
                used = chunk.usage.completion_tokens
            for c in chunk.choices:
                finish = c.finish_reason or finish
                for tc in c.delta.tool_calls or []:
                    name += tc.function.name or ""
                    args += tc.function.arguments or ""
    assert finish == "length" and used <= 16
    assert name == "send_email" and args.startswith('{"to":"')
    with pytest.raises(ValueError):
        json.loads(args)
    assert '"?"' not in args


def test_on_length_close_completes_within_the_budget(client):
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=[EMAIL], tool_choice=NAMED, max_tokens=24,
                                       temperature=0, extra_body={"on_length": "close"})
    [call] = r.choices[0].message.tool_calls
    assert r.usage.completion_tokens <= 24 and r.choices[0].finish_reason == "length"
    assert set(json.loads(call.function.arguments)) == {"to", "subject", "body"}


def test_n_choices_are_rows_of_one_batch(client, srv):
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", n=3,
                                       max_tokens=20, temperature=1.0, seed=5, extra_body={"on_length": "close"})
    assert [c.index for c in r.choices] == [0, 1, 2]
    for c in r.choices:
        [call] = c.message.tool_calls
        assert call.function.name in {"get_weather", "calc"}
        json.loads(call.function.arguments)
    assert r.usage.completion_tokens >= 3 * 4  # every choice's tokens are counted
    streamed: dict[int, str] = {}
    for chunk in client.chat.completions.create(model=MODEL, messages=ASK, n=2, max_tokens=5, temperature=0, stream=True):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + (c.delta.content or "")
    assert sorted(streamed) == [0, 1] and streamed[0] == streamed[1]  # temperature 0: the same text twice


def test_guided_choice_and_guided_json(client):
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Is water wet?"}],
                                       max_tokens=6, temperature=0, extra_body={"guided_choice": ["yes", "no", "maybe"]})
    assert r.choices[0].message.content in {"yes", "no", "maybe"}
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["n"]}
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Pick a number."}],
                                       max_tokens=12, temperature=0, extra_body={"structured_outputs": {"json": schema}})
    assert 1 <= json.loads(r.choices[0].message.content)["n"] <= 9


def test_logit_bias_is_honoured(client, srv):
    tok = srv.served.tokenizer
    first = tok.encode("Paris")[0]
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say hello."}], max_tokens=3,
                                       temperature=0, logit_bias={str(first): 100})
    assert r.choices[0].message.content.startswith(tok.decode([first]))


def test_refusals_name_what_is_wrong(srv):
    def post(body):
        return httpx.post(srv.base_url + "/chat/completions", json=body, headers={"Authorization": f"Bearer {API_KEY}"})

    image = post({"messages": [{"role": "user", "content": [{"type": "text", "text": "what is this?"},
                                                             {"type": "image_url", "image_url": {"url": "data:,"}}]}]})
    err = image.json()["error"]
    assert image.status_code == 400 and err["param"] == "messages[0].content[1]" and "images are not supported" in err["message"]
    unknown = post({"messages": ASK, "max_tokenz": 5})
    err = unknown.json()["error"]
    assert unknown.status_code == 400 and err["param"] == "max_tokenz" and err["code"] == "unsupported_field"
    bookkeeping = post({"messages": ASK, "max_tokens": 1, "user": "u1", "metadata": {"a": "b"}, "store": False})
    assert bookkeeping.status_code == 200  # OpenAI's bookkeeping fields change no output: accepted


def test_metrics_in_prometheus_text(srv, client):
    assert wait_idle(srv.engine)
    client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=2, temperature=0)
    text = httpx.get(srv.url + "/metrics").text
    lines = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert float(lines['railcall_requests_total{outcome="completed"}']) >= 1
    assert float(lines["railcall_generated_tokens_total"]) >= 2
    assert float(lines["railcall_time_to_first_token_seconds_count"]) >= 1 and "railcall_queue_depth" in lines


def test_completions_free_and_constrained(client):
    r = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0)
    assert r.object == "text_completion" and r.choices[0].text and r.usage.completion_tokens <= 4
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0, stream=True) if c.choices)
    assert streamed == r.choices[0].text
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}
    r = client.completions.create(model=MODEL, prompt="A JSON object naming a city: ", max_tokens=20, temperature=0,
                                  extra_body={"guided_json": schema})
    assert isinstance(json.loads(r.choices[0].text)["city"], str)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt=[10**9], max_tokens=2)
    assert e.value.body["param"] == "prompt"


def test_a_cached_prefix_changes_nothing_but_the_prefill(client):
    system = "You answer in one short sentence. " + " ".join(f"Fact {k}: the shop opens at {k % 12 + 1} o'clock." for k in range(30))
    kw = dict(model=MODEL, max_tokens=12, temperature=0, messages=[{"role": "system", "content": system},
                                                                    {"role": "user", "content": "When does the shop open?"}])
    first = client.chat.completions.create(**kw)
    second = client.chat.completions.create(**kw)
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 1 > 100
    assert second.choices[0].message.content == first.choices[0].message.content


def test_a_client_gone_mid_upload_is_one_log_line(srv, caplog):
    import logging
    import socket
    import time

    host, port = srv.url.removeprefix("http://").split(":")
    with caplog.at_level(logging.INFO):
        with socket.create_connection((host, int(port))) as s:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Authorization: Bearer " + API_KEY.encode() + b"\r\nContent-Length: 5000\r\n\r\n{\"messages\":")
            time.sleep(0.3)
        time.sleep(1.0)  # the server notices the closed connection
    gone = [r for r in caplog.records if "went away while sending" in r.getMessage()]
    tracebacks = [r for r in caplog.records if r.exc_info or "Exception in ASGI application" in r.getMessage()]
    assert len(gone) == 1 and not tracebacks
