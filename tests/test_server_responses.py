"""`POST /v1/responses` through the official `openai` client and openai-agents, on the embedded
SmolLM2 (greedy, few tokens): the client's own types parse every response and event, a tool
round trip (function_call, function_call_output, the final message) completes by value and
through previous_response_id, and errors name the Responses field at fault."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
from openai.types.responses import (Response, ResponseCompletedEvent, ResponseCreatedEvent,
                                    ResponseFunctionCallArgumentsDeltaEvent, ResponseFunctionCallArgumentsDoneEvent,
                                    ResponseFunctionToolCall, ResponseInProgressEvent, ResponseOutputItemAddedEvent,
                                    ResponseOutputItemDoneEvent, ResponseOutputMessage, ResponseTextDeltaEvent)

from server_harness import API_KEY, MODEL, WEATHER

pytestmark = pytest.mark.model

TOOL = {"type": "function", **WEATHER["function"]}  # Responses' flat function tool
ASK = "What is the weather in Paris?"


@pytest.fixture(scope="module")
def called(client):
    """A required call, not streamed (reused by the round trips)."""
    return client.responses.create(model=MODEL, input=ASK, tools=[TOOL], tool_choice="required", temperature=0,
                                   max_output_tokens=24)


def test_a_call_parses_as_the_clients_types(called):
    r = called
    assert isinstance(r, Response) and r.object == "response" and r.status == "completed" and r.id.startswith("resp_")
    [call] = r.output
    assert isinstance(call, ResponseFunctionToolCall) and call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), WEATHER["function"]["parameters"])
    assert r.usage.input_tokens > 20 and 1 <= r.usage.output_tokens <= 24
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.tools[0].name == "get_weather" and r.tool_choice == "required"


def by_value_input(call, result) -> list:
    return [{"role": "user", "content": ASK},
            {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments}, result]


def test_tool_round_trip_by_value_and_by_previous_response_id(client, called):
    call = called.output[0]
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}
    by_value = client.responses.create(model=MODEL, input=by_value_input(call, result), tools=[TOOL], temperature=0,
                                       max_output_tokens=24)
    chained = client.responses.create(model=MODEL, previous_response_id=called.id, input=[result], tools=[TOOL],
                                      temperature=0, max_output_tokens=24)
    again = client.responses.create(  # by value once more: now, like `chained`, its whole prompt is cached
        model=MODEL, input=by_value_input(call, result), tools=[TOOL], temperature=0, max_output_tokens=24)
    assert chained.previous_response_id == called.id
    for r in (by_value, chained):
        message = r.output[0]
        assert isinstance(message, ResponseOutputMessage) and r.output_text and message.content[0].type == "output_text"
    # The same conversation, kept or sent: the same prompt, and the same greedy reply where the
    # cache stands the same (a cold and a warm prompt may part at a near-tie: docs/server.md).
    assert chained.usage.input_tokens == by_value.usage.input_tokens == again.usage.input_tokens
    assert chained.output_text == again.output_text


def test_streamed_call_events_parse_and_add_up(client, called):
    kw = dict(model=MODEL, input=ASK, tools=[TOOL], tool_choice="required", temperature=0, max_output_tokens=24)
    events = list(client.responses.create(**kw, stream=True))  # `called` cached the prompt
    plain = client.responses.create(**kw)  # and so it finds the cache as the stream did
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert isinstance(events[0], ResponseCreatedEvent) and events[0].response.status == "in_progress"
    assert isinstance(events[1], ResponseInProgressEvent) and isinstance(events[-1], ResponseCompletedEvent)
    added = [e for e in events if isinstance(e, ResponseOutputItemAddedEvent)]
    assert len(added) == 1 and added[0].item.type == "function_call" and added[0].item.name == "get_weather"
    pieces = "".join(e.delta for e in events if isinstance(e, ResponseFunctionCallArgumentsDeltaEvent))
    [done] = [e for e in events if isinstance(e, ResponseFunctionCallArgumentsDoneEvent)]
    [item_done] = [e for e in events if isinstance(e, ResponseOutputItemDoneEvent)]
    final = events[-1].response.output[0]
    assert pieces == done.arguments == item_done.item.arguments == final.arguments == plain.output[0].arguments
    assert item_done.item.call_id == final.call_id == added[0].item.call_id


def test_streamed_text_events_parse_and_add_up(client):
    kw = dict(model=MODEL, input="Say hello.", max_output_tokens=6, temperature=0, instructions="Be brief.")
    client.responses.create(**kw)  # caches the prompt: the streamed and the plain request below both find it
    events = list(client.responses.create(**kw, stream=True))
    plain = client.responses.create(**kw)
    kinds = [e.type for e in events]
    assert kinds[:5] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added", "response.output_text.delta"]
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    text = "".join(e.delta for e in events if isinstance(e, ResponseTextDeltaEvent))
    assert text == events[-1].response.output_text == plain.output_text
    if plain.status == "incomplete":  # six tokens cut it: said as OpenAI says it
        assert kinds[-1] == "response.incomplete" and plain.incomplete_details.reason == "max_output_tokens"


def test_json_schema_text_format(client):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"],
              "additionalProperties": False}
    r = client.responses.create(model=MODEL, input="Name a city in France.", temperature=0, max_output_tokens=20,
                                text={"format": {"type": "json_schema", "name": "city", "schema": schema, "strict": True}})
    jsonschema.validate(json.loads(r.output_text), schema)


def test_previous_response_id_kept_or_said_not_kept(srv, client, called):
    assert client.responses.retrieve(called.id).id == called.id
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model=MODEL, previous_response_id="resp_gone", input="Hi.", max_output_tokens=1)
    assert e.value.body["code"] == "previous_response_not_found" and e.value.body["param"] == "previous_response_id"
    unkept = client.responses.create(model=MODEL, input="Hi.", max_output_tokens=1, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unkept.id)


def test_the_store_is_bounded():
    from railcall.server.responses import ResponseStore

    store = ResponseStore(max_responses=3, max_bytes=10_000)
    for i in range(5):
        store.put({"id": f"r{i}"}, [{"role": "user", "content": "x"}])
    store.get("r2")  # used: kept over r3
    store.put({"id": "r5"}, [])
    kept = [i for i in range(6) if f"r{i}" in store._entries]
    assert kept == [2, 4, 5]
    store.put({"id": "big"}, [{"content": "x" * 9_960}])  # pushes out the rest by size
    assert list(store._entries) == ["big"]


def post(srv, body):
    return httpx.post(srv.base_url + "/responses", json=body, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60)


@pytest.mark.parametrize("body,param", [
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": "x", "tools": [{**TOOL, "parameters": {"type": "object", "properties": {"a": {"type": "strin"}}}}]},
     "tools[0].parameters"),
    ({"input": [{"type": "function_call_output", "call_id": "nope", "output": "1"}]}, "input[0].call_id"),
    ({"input": [{"type": "function_call", "name": "f"}]}, "input[0].call_id"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]}, "input[0].content[0]"),
    ({"input": [{"type": "web_search_call", "id": "w"}]}, "input[0]"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "a", "schema": {"type": "nothing"}}}},
     "text.format.schema"),
    ({"input": "x", "conversation": "conv_1"}, "conversation"),
])
def test_errors_name_the_responses_field(srv, body, param):
    r = post(srv, {"model": MODEL, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()


def test_openai_agents_round_trip_plain_and_streamed(srv):
    """openai-agents on its default path (the Responses API, through set_default_openai_client):
    the tool is called, its result goes back as a function_call_output with the call before it,
    and the agent ends on the model's message. The 135M model does not choose well on its own:
    under the SDK's default tool_choice (auto) it answers in prose without calling, and after a
    result it calls again until max_turns. So the agent requires the call, and a hook turns
    tool_choice to "none" once the tool has run (OpenAI's own models need neither)."""
    agents = pytest.importorskip("agents")
    import asyncio

    calls = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        calls.append(city)
        return f"sunny, 21 C in {city}"

    class AnswerAfterTheTool(agents.RunHooks):
        async def on_tool_end(self, context, agent, tool, result):
            agent.model_settings = agent.model_settings.resolve(agents.ModelSettings(tool_choice="none"))

    def agent():
        return agents.Agent(name="weather", model=MODEL, tools=[get_weather], reset_tool_choice=False,
                            model_settings=agents.ModelSettings(tool_choice="required", temperature=0))

    async def run():
        agents.set_tracing_disabled(True)  # no trace export to OpenAI's platform (offline)
        agents.set_default_openai_client(openai.AsyncOpenAI(base_url=srv.base_url, api_key=API_KEY, max_retries=0,
                                                            timeout=600))
        plain = await agents.Runner.run(agent(), ASK, max_turns=3, hooks=AnswerAfterTheTool())
        streamed = agents.Runner.run_streamed(agent(), ASK, max_turns=3, hooks=AnswerAfterTheTool())
        async for _ in streamed.stream_events():
            pass
        return plain, streamed

    plain, streamed = asyncio.run(run())
    assert calls == ["Paris", "Paris"]
    for r in (plain, streamed):
        kinds = [item.type for item in r.new_items]
        assert kinds == ["tool_call_item", "tool_call_output_item", "message_output_item"], kinds
        assert isinstance(r.final_output, str) and r.final_output


def test_grammar_text_format(client):
    import re

    lark = 'start: "Paris is in " COUNTRY "."\nCOUNTRY: "France" | "Italy" | "Spain"\n'
    r = client.responses.create(model=MODEL, input="Where is Paris?", temperature=0, max_output_tokens=20,
                                text={"format": {"type": "grammar", "syntax": "lark", "definition": lark}})
    assert re.fullmatch(r"Paris is in (France|Italy|Spain)\.", r.output_text), r.output_text
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=MODEL, input="x", max_output_tokens=4,
                                text={"format": {"type": "grammar", "syntax": "gbnf", "definition": "root ::= [z-a]"}})
    assert e.value.body["param"] == "text.format.definition" and "line 1, column 10" in e.value.body["message"]


def test_structural_tag_text_format(client):
    """A structural tag as the Responses API's text.format: free text whose tagged parts follow
    their schema (a conversation of examples leads SmolLM2 to write one)."""
    import json
    import re

    tag = {"type": "structural_tag", "triggers": ["<city="],
           "structures": [{"begin": "<city=", "end": ">", "schema": {"enum": ["Paris", "Rome", "Oslo"]}}]}
    shots = [{"role": "user", "content": "Where is the Louvre?"}, {"role": "assistant", "content": '<city="Paris">'},
             {"role": "user", "content": "Where is the Colosseum?"}, {"role": "assistant", "content": '<city="Rome">'},
             {"role": "user", "content": "Where is the Eiffel Tower?"}]
    r = client.responses.create(model=MODEL, temperature=0, max_output_tokens=12, text={"format": tag}, input=shots)
    parts = re.findall(r'<city=(.*?)>', r.output_text)
    assert parts and all(json.loads(p) in ("Paris", "Rome", "Oslo") for p in parts), r.output_text
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=MODEL, input="x", max_output_tokens=4,
                                text={"format": {**tag, "triggers": ["<town="]}})
    assert e.value.body["param"] == "text.format" and "starts with none" in e.value.body["message"]
