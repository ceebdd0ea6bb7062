"""OpenAI custom tools through `railcall serve` and the official `openai` client, on the embedded
SmolLM2 (greedy): a tool whose input is one text under a Lark or regex grammar, beside function
tools, chat and Responses, streamed and not. Every input the server hands out is checked by a
parser railcall does not share (`lark`, `re.fullmatch`), and the streamed pieces add up to the
whole."""

from __future__ import annotations

import re

import httpx
import lark
import pytest

from server_harness import API_KEY, MODEL, WEATHER

pytestmark = pytest.mark.model

QUERY = r'''
start: "SELECT " cols " FROM " NAME where? ";"
cols: NAME (", " NAME)* | "COUNT(*)"
where: " WHERE " NAME OP value
value: STRING | NUMBER
OP: "=" | "<" | ">"
NAME: /[a-z_][a-z0-9_]{0,15}/
STRING: /'[^'\\\n]{0,20}'/
NUMBER: /[0-9]{1,6}/
'''
DATE = r"20[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
RUN_QUERY = {"type": "custom", "custom": {"name": "run_query", "description": "Run one SQL query on the shop database.",
                                          "format": {"type": "grammar", "grammar": {"syntax": "lark", "definition": QUERY}}}}
SET_DATE = {"type": "custom", "custom": {"name": "set_date", "description": "Set the delivery date.",
                                         "format": {"type": "grammar", "grammar": {"syntax": "regex", "definition": DATE}}}}
parse_query = lark.Lark(QUERY, parser="earley", lexer="dynamic_complete").parse
ASK = "How many orders are in the orders table?"


def custom_input(call) -> str:
    assert call.type == "custom", call
    return call.custom.input


@pytest.mark.parametrize("choice", [{"type": "custom", "custom": {"name": "run_query"}}, "required"])
def test_a_custom_call_round_trips_whole_and_streamed(client, choice):
    """The call is OpenAI's custom tool call, its input a text of the grammar; streamed, the
    `custom.input` pieces add up to the same input."""
    kw = dict(model=MODEL, messages=[{"role": "user", "content": ASK}], tools=[RUN_QUERY], tool_choice=choice,
              parallel_tool_calls=False, max_tokens=60, temperature=0)
    r = client.chat.completions.create(**kw)
    (call,) = r.choices[0].message.tool_calls
    text = custom_input(call)
    parse_query(text)
    assert call.custom.name == "run_query" and r.choices[0].finish_reason == "tool_calls", r
    pieces, heads = [], []
    for chunk in client.chat.completions.create(**kw, stream=True):
        for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            extra = d.model_extra or {}
            custom = getattr(d, "custom", None) or extra.get("custom")
            custom = custom if isinstance(custom, dict) else custom.model_dump() if custom is not None else None
            assert custom is not None and d.function is None, d
            if d.id:
                heads.append((d.id, d.type, custom["name"]))
            pieces.append(custom.get("input", ""))
    assert [h[1:] for h in heads] == [("custom", "run_query")] and len(pieces) > 2
    assert "".join(pieces) == text


def test_custom_and_function_tools_in_one_table(client):
    """Under "required" with both kinds, each call is one kind, spelled as that kind; a regex
    tool's input matches it whole."""
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Deliver it on 2026-12-24."}],
                                       tools=[SET_DATE, RUN_QUERY, WEATHER], tool_choice="required", max_tokens=80,
                                       temperature=0)
    calls = r.choices[0].message.tool_calls
    assert calls, r
    for call in calls:
        if call.type == "custom" and call.custom.name == "set_date":
            assert re.fullmatch(DATE, call.custom.input), call
        elif call.type == "custom":
            parse_query(call.custom.input)
        else:
            assert call.function.name == "get_weather" and "city" in call.function.arguments
    one = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Deliver it on 2026-12-24."}],
                                         tools=[SET_DATE, WEATHER], tool_choice={"type": "custom", "custom": {"name": "set_date"}},
                                         max_tokens=30, temperature=0)
    assert re.fullmatch(DATE, custom_input(one.choices[0].message.tool_calls[0]))


def test_a_history_with_a_custom_call_and_its_output(client):
    """An earlier custom call and its result are taken back as the history of a next turn."""
    first = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": ASK}], tools=[RUN_QUERY],
                                           tool_choice="required", parallel_tool_calls=False, max_tokens=60, temperature=0)
    call = first.choices[0].message.tool_calls[0]
    history = [{"role": "user", "content": ASK},
               {"role": "assistant", "content": None, "tool_calls": [{"id": call.id, "type": "custom",
                                                                        "custom": {"name": "run_query", "input": call.custom.input}}]},
               {"role": "tool", "tool_call_id": call.id, "content": "42"}]
    r = client.chat.completions.create(model=MODEL, messages=history, tools=[RUN_QUERY], max_tokens=20, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_responses_custom_tool_call_items_and_events(client):
    """Responses: a `custom_tool_call` item; streamed, `response.custom_tool_call_input.delta`
    events add up to the `.done` event's input and the item's."""
    tool = {"type": "custom", "name": "run_query", "description": "Run one SQL query on the shop database.",
            "format": {"type": "grammar", "syntax": "lark", "definition": QUERY}}
    kw = dict(model=MODEL, input=ASK, tools=[tool], tool_choice={"type": "custom", "name": "run_query"},
              temperature=0, max_output_tokens=60)
    r = client.responses.create(**kw)
    (item,) = [x for x in r.output if x.type == "custom_tool_call"]
    parse_query(item.input)
    assert item.name == "run_query" and item.call_id.startswith("call_") and r.status == "completed"
    events = list(client.responses.create(**kw, stream=True))
    deltas = "".join(e.delta for e in events if e.type == "response.custom_tool_call_input.delta")
    (done,) = [e for e in events if e.type == "response.custom_tool_call_input.done"]
    final = events[-1].response.output
    assert deltas == done.input == item.input == [x for x in final if x.type == "custom_tool_call"][0].input
    follow = client.responses.create(model=MODEL, tools=[tool], max_output_tokens=20, temperature=0, input=[
        {"type": "message", "role": "user", "content": ASK},
        {"type": "custom_tool_call", "call_id": item.call_id, "name": "run_query", "input": item.input},
        {"type": "custom_tool_call_output", "call_id": item.call_id, "output": "42"}])
    assert follow.status in ("completed", "incomplete")


@pytest.mark.parametrize("path, body, param", [
    ("/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tools": [
        {"type": "custom", "custom": {"name": "q", "format": {"type": "grammar", "grammar": {
            "syntax": "lark", "definition": "start: a\na: a \"x\" | \"y\"\n"}}}}]},
     "tools[0].custom.format.grammar.definition"),
    ("/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tools": [RUN_QUERY],
                           "call_format": "pythonic", "tool_choice": "required"}, "call_format"),
    ("/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tools": [RUN_QUERY],
                           "tool_choice": {"type": "function", "function": {"name": "run_query"}}}, "tool_choice"),
    ("/responses", {"input": "hi", "tools": [{"type": "custom", "name": "q", "format": {
        "type": "grammar", "syntax": "regex", "definition": "(a"}}]}, "tools[0].format.definition"),
])
def test_custom_tool_errors_name_the_field(srv, path, body, param):
    r = httpx.post(srv.base_url + path, json={"model": MODEL, **body}, headers={"Authorization": f"Bearer {API_KEY}"})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == param, err
    assert param.split(".")[-1] in err["message"] or "tool_choice" in err["message"] or "pythonic" in err["message"]
