"""The structural-tag response format through `railcall serve` and the official `openai` client,
on the embedded SmolLM2 (greedy): free text in which a trigger starts a tagged part under its
schema (vLLM's `response_format` shape and its `structured_outputs.structural_tag`), on the chat
and completions endpoints, streamed and not, beside tool calls under tool_choice auto; and the
400s that say what to send instead. Every tagged part is read back with `json` and checked
with `jsonschema`."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import pytest

from server_harness import API_KEY, MODEL, WEATHER

pytestmark = pytest.mark.model

CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
        "additionalProperties": False}
TAG = {"type": "structural_tag",
       "structures": [{"begin": "<function=get_weather>", "schema": CITY, "end": "</function>"}],
       "triggers": ["<function="]}
PART = re.compile(r"<function=get_weather>(.*?)</function>", re.S)
FEW_SHOT = ('Q: What is the weather in Oslo?\nA: <function=get_weather>{"city":"Oslo"}</function>\n'
            'Q: What is the weather in Rome?\nA: <function=get_weather>{"city":"Rome"}</function>\n'
            'Q: What is the weather in Paris?\nA:')


def parts(text: str) -> list[dict]:
    found = [json.loads(p) for p in PART.findall(text)]
    for value in found:
        jsonschema.validate(value, CITY)
    rest = PART.sub("", text)
    assert "<function=" not in rest or rest.rstrip().endswith(tuple("<function="[:i] for i in range(1, 11))), text
    return found


def test_completions_write_a_tagged_part_under_its_schema(client):
    r = client.completions.create(model=MODEL, prompt=FEW_SHOT, max_tokens=24, temperature=0,
                                  extra_body={"response_format": TAG, "stop": ["\nQ:"]})
    found = parts(r.choices[0].text)
    assert found and found[0]["city"] == "Paris", r.choices[0].text


def test_structured_outputs_takes_the_tag_as_json_text(client):
    tag = {k: v for k, v in TAG.items() if k != "type"}
    r = client.completions.create(model=MODEL, prompt=FEW_SHOT, max_tokens=24, temperature=0,
                                  extra_body={"structured_outputs": {"structural_tag": json.dumps(tag)}})
    assert parts(r.choices[0].text), r.choices[0].text


@pytest.mark.parametrize("stream", [False, True])
def test_chat_text_with_tags_streamed_and_whole(client, stream):
    shots = [{"role": "user", "content": "What is the weather in Oslo?"},
             {"role": "assistant", "content": '<function=get_weather>{"city":"Oslo"}</function>'},
             {"role": "user", "content": "What is the weather in Rome?"},
             {"role": "assistant", "content": '<function=get_weather>{"city":"Rome"}</function>'},
             {"role": "user", "content": "What is the weather in Paris?"}]
    kw = dict(model=MODEL, temperature=0, max_tokens=60, response_format=TAG, messages=shots)
    whole = client.chat.completions.create(**kw).choices[0].message.content
    assert parts(whole), whole  # the examples lead SmolLM2 to write a part
    if stream:
        text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(**kw, stream=True)
                       if c.choices)
        assert text == whole


def test_tags_beside_tool_calls_under_auto(client):
    r = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=60, response_format=TAG,
                                       tools=[WEATHER], tool_choice="auto",
                                       messages=[{"role": "user", "content": "What is the weather in Paris?"}])
    msg = r.choices[0].message
    parts(msg.content or "")
    for call in msg.tool_calls or []:
        json.loads(call.function.arguments)


@pytest.mark.parametrize("body, param, says", [
    ({"response_format": {**TAG, "triggers": ["<tool="]}}, "response_format", "starts with none of the triggers"),
    ({"response_format": {**TAG, "structures": [{"begin": "<function=x>", "schema": {"type": "nonsense"}, "end": ">"}]}},
     "response_format.structures[0].schema", "nonsense"),
    ({"response_format": {"type": "structural_tag", "format": {"type": "triggered_tags"}}}, None, '"format" form'),
    ({"structured_outputs": {"structural_tag": "{not json"}}, "structured_outputs.structural_tag", "not a structural tag"),
    ({"response_format": TAG, "tools": [WEATHER], "tool_choice": "required"}, "response_format", "tool_choice auto"),
])
def test_refusals_name_the_field_and_the_fix(srv, body, param, says):
    r = httpx.post(f"{srv.url}/v1/chat/completions", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60,
                   json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert says in err["message"], err
    if param is not None:
        assert err["param"] == param, err


def test_a_part_that_spells_the_call_trigger_is_not_a_call(client):
    """Call format openai: a call starts with `{"name":"`, and so does this part's JSON. The
    reply's reader takes a call only where the grammar started one, so the part stays text and
    no phantom call reaches the client."""
    person = {"type": "structural_tag", "triggers": ["<person>"], "structures": [
        {"begin": "<person>", "end": "</person>", "schema": {
            "type": "object", "properties": {"name": {"type": "string", "maxLength": 12}}, "required": ["name"],
            "additionalProperties": False}}]}
    shots = [{"role": "user", "content": "Who wrote Hamlet?"},
             {"role": "assistant", "content": '<person>{"name":"Shakespeare"}</person>'},
             {"role": "user", "content": "Who painted the Mona Lisa?"},
             {"role": "assistant", "content": '<person>{"name":"Leonardo"}</person>'},
             {"role": "user", "content": "Who wrote Faust?"}]
    for stream in (False, True):
        kw = dict(model=MODEL, temperature=0, max_tokens=24, response_format=person, tools=[WEATHER],
                  tool_choice="auto", messages=shots, extra_body={"call_format": "openai"})
        if not stream:
            msg = client.chat.completions.create(**kw).choices[0].message
            content, calls = msg.content or "", msg.tool_calls or []
        else:
            content, calls = "", []
            for c in client.chat.completions.create(**kw, stream=True):
                if c.choices:
                    content += c.choices[0].delta.content or ""
                    calls += c.choices[0].delta.tool_calls or []
        assert '<person>{"name":"' in content, content  # the examples lead SmolLM2 to a part
        assert not calls, calls
