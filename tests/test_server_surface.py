"""The server's API surface on the embedded model, through the official openai client: calls cut by
max_tokens (never complete with invented values), n choices, vLLM's guided fields, penalties,
the metrics endpoint, and the image-part and unknown-field refusals."""

from __future__ import annotations

import json
import re

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
    """Under on_length "cut", max_tokens 16 cannot hold the call: OpenAI's answer is finish
    'length' with the arguments cut where they were cut, which no framework runs -- never '?'
    values in a complete call."""
    kw = dict(model=MODEL, messages=ASK, tools=[EMAIL], tool_choice=NAMED, max_tokens=16, temperature=0,
              extra_body={"on_length": "cut"})
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


@pytest.mark.parametrize("max_tokens", [32, 36])
def test_by_default_a_call_closes_by_its_own_tokens_within_the_budget(client, max_tokens):
    """on_length "fit" (the default): the request that "cut" leaves broken at 32 or 36 tokens
    (the shortest call is about 22 tokens) comes back whole, inside max_tokens, as tool_calls."""
    kw = dict(model=MODEL, messages=ASK, tools=[EMAIL], tool_choice=NAMED, max_tokens=max_tokens, temperature=0)
    cut = client.chat.completions.create(**kw, extra_body={"on_length": "cut"})
    assert cut.choices[0].finish_reason == "length"
    with pytest.raises(ValueError):
        json.loads(cut.choices[0].message.tool_calls[0].function.arguments)
    r = client.chat.completions.create(**kw)
    [call] = r.choices[0].message.tool_calls
    args = json.loads(call.function.arguments)
    assert r.usage.completion_tokens <= max_tokens and r.choices[0].finish_reason == "tool_calls"
    assert set(args) == {"to", "subject", "body"} and all(args.values())


def test_a_budget_below_the_shortest_call_is_cut_and_says_so(client):
    """16 tokens cannot hold the shortest send_email call (about 22): cut, finish 'length'."""
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=[EMAIL], tool_choice=NAMED, max_tokens=16,
                                       temperature=0)
    [call] = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens <= 16
    with pytest.raises(ValueError):
        json.loads(call.function.arguments)


def test_no_budget_passes_off_the_grammars_filler_as_a_whole_call(client):
    """At every budget around the shortest call, a reply is either a whole call whose values the
    model ranked (tool_calls) or cut (length): never "?" from the grammar's close in a call
    reported whole."""
    weather = {"type": "function", "function": {"name": "get_weather", "description": "Current weather for a city.",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    seen = set()
    for max_tokens in range(11, 19):
        r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Weather in Paris?"}],
                                           tools=[weather], tool_choice="required", max_tokens=max_tokens, temperature=0)
        choice = r.choices[0]
        seen.add(choice.finish_reason)
        assert r.usage.completion_tokens <= max_tokens
        if choice.finish_reason == "tool_calls":
            [call] = choice.message.tool_calls
            assert json.loads(call.function.arguments)["city"] not in ("", "?"), (max_tokens, call.function.arguments)
        else:
            assert choice.finish_reason == "length", (max_tokens, choice)
    assert seen == {"tool_calls", "length"}  # the range spans both sides of the shortest call


SAVE_NOTE = {"type": "function", "function": {"name": "save_note", "description": "Save a note.", "parameters": {
    "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}


@pytest.mark.parametrize("max_tokens", [40, 64])
def test_parallel_calls_are_distinct_and_close_within_the_budget(client, max_tokens):
    """One tool, tool_choice required and OpenAI's default parallel_tool_calls: no call is the
    same as another, and the reply is whole inside max_tokens (an agent framework runs each)."""
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Save a note: buy milk."}],
                                       tools=[SAVE_NOTE], tool_choice="required", max_tokens=max_tokens, temperature=0)
    calls = [(c.function.name, c.function.arguments) for c in r.choices[0].message.tool_calls]
    assert calls and len(set(calls)) == len(calls), calls
    assert all(json.loads(a)["text"] for _, a in calls)
    assert r.choices[0].finish_reason == "tool_calls" and r.usage.completion_tokens <= max_tokens
    # with distinct_calls off SmolLM2 repeats the call (what an agent framework would run twice)
    off = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Save a note: buy milk."}],
                                         tools=[SAVE_NOTE], tool_choice="required", max_tokens=max_tokens,
                                         temperature=0, extra_body={"distinct_calls": False})
    repeated = [(c.function.name, c.function.arguments) for c in off.choices[0].message.tool_calls]
    assert len(set(repeated)) < len(repeated), repeated


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


DATE = r"20[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
YES_NO_LARK = 'start: ANSWER ", because " REASON "."\nANSWER: "yes" | "no"\nREASON: /[a-z ]{3,40}/\n'
COUNT_GBNF = 'root ::= "Count: " num ("," " "? num){2,4}\nnum ::= [1-9] [0-9]?\n'


@pytest.mark.parametrize("extra, full", [
    ({"guided_regex": DATE}, DATE),
    ({"structured_outputs": {"regex": DATE}}, DATE),
    ({"guided_grammar": YES_NO_LARK}, r"(yes|no), because [a-z ]{3,40}\."),
    ({"structured_outputs": {"grammar": COUNT_GBNF}}, r"Count: [1-9][0-9]?(, ?[1-9][0-9]?){2,4}"),
    ({"response_format": {"type": "grammar", "syntax": "gbnf", "definition": COUNT_GBNF}},
     r"Count: [1-9][0-9]?(, ?[1-9][0-9]?){2,4}"),
    ({"response_format": {"type": "grammar", "syntax": "lark", "definition": YES_NO_LARK}},
     r"(yes|no), because [a-z ]{3,40}\."),
    ({"response_format": {"type": "grammar", "syntax": "regex", "definition": DATE}}, DATE),
])
def test_regex_and_grammar_answers(client, extra, full):
    """The answer is in the grammar's language, whole, streamed or not (max_tokens leaves room:
    a cut answer would be finish_reason "length")."""
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "When did it happen, and why? Answer briefly."}],
              max_tokens=60, temperature=0, extra_body=extra)
    r = client.chat.completions.create(**kw)
    assert r.choices[0].finish_reason == "stop" and re.fullmatch(full, r.choices[0].message.content), r
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(**kw, stream=True)
                       if c.choices)
    assert re.fullmatch(full, streamed), streamed


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
    first = client.chat.completions.create(**kw, logprobs=True, top_logprobs=2)
    second = client.chat.completions.create(**kw, logprobs=True, top_logprobs=2)
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 1 > 100
    # The same greedy reply, token for token -- up to a near-tie: llama.cpp computes the prompt's
    # uncached tail in a batch of another size, which moves logits in their last digits, so the
    # two replies may part only where the first reply's best two tokens were within 0.5 nats.
    a, b = first.choices[0].logprobs.content, second.choices[0].logprobs.content
    for x, y in zip(a, b):
        if x.token != y.token:
            top = sorted((t.logprob for t in x.top_logprobs), reverse=True)
            assert len(top) == 2 and top[0] - top[1] < 0.5, (x, y)
            break
    else:
        assert first.choices[0].message.content == second.choices[0].message.content


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
