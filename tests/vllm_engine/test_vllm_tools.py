"""railcall's vLLM tool parser (railcall.integrations.vllm_tools): the spec adjust_request builds from an OpenAI
request, the parser on text (whole and streamed; streamed pieces add up to the whole), and, end to
end, vLLM's own OpenAI server with the plugin answering the official openai client with
`tool_calls` that validate against their schemas."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import re
import urllib.request
from pathlib import Path

import jsonschema
import pytest

from scenario import WEATHER

CALENDAR_EVENT = {"type": "object", "properties": {"title": {"type": "string"}, "date": {"type": "string"},
                                                    "minutes": {"type": "integer", "minimum": 1, "maximum": 480}},
                  "required": ["title", "date", "minutes"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": WEATHER[0].description,
                                      "parameters": WEATHER[0].parameters}},
    {"type": "function", "function": {"name": "create_event", "description": "Put an event in the calendar.",
                                      "parameters": CALENDAR_EVENT}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def _request(**kw):
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], tools=TOOLS, **kw)


def _parser():
    from railcall.integrations.vllm_tools import RailcallToolParser

    return RailcallToolParser(None)


# -- the spec ---------------------------------------------------------------------------------


@pytest.mark.parametrize("choice, parallel, mode, names, par", [
    ("required", True, "required", ["get_weather", "create_event"], True),
    ("required", False, "required", ["get_weather", "create_event"], False),
    ({"type": "function", "function": {"name": "create_event"}}, True, "required", ["create_event"], None),
    ("auto", True, "auto", ["get_weather", "create_event"], None),
])
def test_adjust_request_writes_the_spec(choice, parallel, mode, names, par):
    from railcall.integrations.vllm import RailcallLogitsProcessor

    req = _parser().adjust_request(_request(tool_choice=choice, parallel_tool_calls=parallel))
    spec = json.loads(req.vllm_xargs["railcall"])
    assert spec["mode"] == mode and [t["function"]["name"] for t in spec["tools"]] == names
    assert spec.get("parallel") == par
    # vLLM's own structured outputs stay off: the grammar is railcall's alone
    params = req.to_sampling_params(64, {})
    assert params.structured_outputs is None and json.loads(params.extra_args["railcall"]) == spec
    RailcallLogitsProcessor.validate_params(params)  # the processor accepts the spec


def test_adjust_request_leaves_none_and_a_clients_own_spec():
    req = _parser().adjust_request(_request(tool_choice="none"))
    assert not req.vllm_xargs
    own = json.dumps({"tools": TOOLS[:1], "read_only": True})
    req = _parser().adjust_request(_request(tool_choice="required", vllm_xargs={"railcall": own}))
    assert req.vllm_xargs["railcall"] == own


# -- the parser on text -----------------------------------------------------------------------

ONE = '{"tool":"get_weather","args":{"city":"Paris","unit":"celsius"}}'
TWO = ('[{"tool":"get_weather","args":{"city":"Oslo","unit":"celsius"}},'
       '{"tool":"create_event","args":{"title":"Call Ana","date":"2025-03-04","minutes":30}}]')


@pytest.mark.parametrize("choice, text, content, calls", [
    ("required", ONE, None, [("get_weather", '{"city":"Paris","unit":"celsius"}')]),
    ("required", TWO, None, [("get_weather", '{"city":"Oslo","unit":"celsius"}'),
                             ("create_event", '{"title":"Call Ana","date":"2025-03-04","minutes":30}')]),
    ("auto", "Sure. " + ONE, "Sure. ", [("get_weather", '{"city":"Paris","unit":"celsius"}')]),
    ("auto", "No tool is needed.", "No tool is needed.", []),
])
def test_extract_tool_calls(choice, text, content, calls):
    info = _parser().extract_tool_calls(text, _request(tool_choice=choice))
    assert info.tools_called == bool(calls)
    assert [(c.function.name, c.function.arguments) for c in info.tool_calls] == calls
    assert all(c.id and c.type == "function" for c in info.tool_calls)
    assert info.content == content


def _stream(choice, text, step):
    """Feed `text` in pieces of `step` characters; the deltas, as vLLM would send them."""
    parser, req, prev, out = _parser(), _request(tool_choice=choice), "", []
    for i in range(0, len(text), step):
        piece = text[i:i + step]
        out.append(parser.extract_tool_calls_streaming(prev, prev + piece, piece, [], [], [], req))
        prev += piece
    out.append(parser.finish_streaming())
    return [m for m in out if m is not None]


@pytest.mark.parametrize("choice, text", [("required", ONE), ("required", TWO), ("auto", "Sure. " + ONE)])
@pytest.mark.parametrize("step", [1, 3, 1000])
def test_streamed_pieces_add_up_to_the_whole(choice, text, step):
    whole = _parser().extract_tool_calls(text, _request(tool_choice=choice))
    calls: dict[int, dict] = {}
    content = ""
    for m in _stream(choice, text, step):
        content += m.content or ""
        for d in m.tool_calls:
            c = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
            if d.function.name is not None:  # the name comes first, with the id, once
                assert c["name"] is None and c["arguments"] == "" and d.id and d.type == "function"
                c["id"], c["name"] = d.id, d.function.name
            else:
                assert c["name"] is not None and d.id is None
            c["arguments"] += d.function.arguments or ""
    assert [(c["name"], c["arguments"]) for _, c in sorted(calls.items())] == \
        [(c.function.name, c.function.arguments) for c in whole.tool_calls]
    assert (content or None) == whole.content


def test_the_plugin_registers_by_module_path():
    """`--tool-parser-plugin railcall.integrations.vllm_tools` imports the module; `--tool-call-parser railcall`
    then finds the parser."""
    from vllm.tool_parsers.abstract_tool_parser import ToolParserManager

    ToolParserManager.import_tool_parser("railcall.integrations.vllm_tools")
    from railcall.integrations.vllm_tools import RailcallToolParser

    assert ToolParserManager.get_tool_parser("railcall") is RailcallToolParser


# -- end to end: vLLM's OpenAI server, the openai client ---------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(folder, tmp_path_factory):
    """vLLM's OpenAI server with railcall's processor, parser and chat template -- the command
    docs/vllm.md gives -- in a process group of its own, ended with the module."""
    from railcall.integrations.vllm_tools import chat_template_path

    port = _free_port()
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", folder,
         "--logits-processors", "railcall.integrations.vllm:RailcallLogitsProcessor",
         "--tool-parser-plugin", "railcall.integrations.vllm_tools", "--tool-call-parser", "railcall",
         "--enable-auto-tool-choice", "--chat-template", str(chat_template_path()),
         "--host", "127.0.0.1", "--port", str(port), "--enforce-eager", "--max-model-len", "2048",
         "--dtype", "float32", "--max-num-seqs", "4"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"})
    try:
        deadline = time.monotonic() + 420
        while True:
            assert proc.poll() is None, log_path.read_text()[-3000:]
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
                break
            except OSError:
                assert time.monotonic() < deadline, "vLLM's server did not come up"
                time.sleep(2)
        yield f"http://127.0.0.1:{port}/v1", folder
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


ASK = "What's the weather in Paris, in celsius?"
NAMED = {"type": "function", "function": {"name": "create_event"}}


def _valid(name: str, arguments: str) -> None:
    assert name in SCHEMAS, name
    jsonschema.validate(json.loads(arguments), SCHEMAS[name])


@pytest.mark.parametrize("choice", ["required", "named"])
def test_openai_client_gets_tool_calls(server, choice):
    from openai import OpenAI

    url, model = server
    client = OpenAI(base_url=url, api_key="-")
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": ASK}], tools=TOOLS, temperature=0, max_tokens=96,
        tool_choice=NAMED if choice == "named" else "required", parallel_tool_calls=False)
    choice_ = reply.choices[0]
    calls = choice_.message.tool_calls
    assert choice_.finish_reason in ("tool_calls", "stop") and calls and len(calls) == 1, choice_
    assert not choice_.message.content
    for c in calls:
        assert c.id and c.type == "function"
        _valid(c.function.name, c.function.arguments)
    if choice == "named":
        assert calls[0].function.name == "create_event"
    # with "required" the 135M model picks create_event for this question, at temperature 0, as
    # railcall's own loop does on the same prompt: the grammar makes the call valid, not wise


def test_the_server_shows_the_model_its_tools(server):
    """The prompt vLLM renders for a request with tools is railcall's template with the tool
    instruction (what railcall's own server writes), token for token."""
    from transformers import AutoTokenizer

    from railcall.integrations.vllm_tools import chat_template_path

    url, model = server
    messages = [{"role": "user", "content": ASK}]
    body = json.dumps({"model": model, "messages": messages, "tools": TOOLS}).encode()
    with urllib.request.urlopen(urllib.request.Request(url.removesuffix("/v1") + "/tokenize", body,
                                                       {"Content-Type": "application/json"}), timeout=60) as r:
        served = json.loads(r.read())["tokens"]
    tok = AutoTokenizer.from_pretrained(model)
    text = tok.apply_chat_template(messages, tools=TOOLS, chat_template=chat_template_path().read_text(),
                                   add_generation_prompt=True, tokenize=False)
    assert "- get_weather: " in text and "- create_event: " in text
    assert served == tok(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("choice", ["required", "named"])
def test_openai_client_streams_tool_calls(server, choice):
    from openai import OpenAI

    url, model = server
    client = OpenAI(base_url=url, api_key="-")
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": ASK}], tools=TOOLS, temperature=0, max_tokens=96,
        tool_choice=NAMED if choice == "named" else "required", stream=True)
    calls: dict[int, dict] = {}
    content, pieces = "", 0
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for d in delta.tool_calls or []:
            c = calls.setdefault(d.index, {"name": None, "arguments": ""})
            if d.function and d.function.name:
                assert c["name"] is None and d.id
                c["name"] = d.function.name
            if d.function and d.function.arguments:
                assert c["name"] is not None  # the name comes first
                c["arguments"] += d.function.arguments
                pieces += 1
    assert calls and not content.strip(), (calls, content)
    assert pieces > 1  # the arguments arrive as written, not in one piece at the end
    for c in calls.values():
        _valid(c["name"], c["arguments"])
    if choice == "named":
        assert [c["name"] for c in calls.values()] == ["create_event"]


def test_the_docs_client_example_runs(server, capsys):
    """docs/vllm.md's openai client example (its ```python openai block), against this server."""
    page = Path(__file__).resolve().parents[2] / "docs" / "vllm.md"
    (block,) = re.findall(r"```python openai\n(.*?)```", page.read_text(), re.S)
    url, _ = server
    assert "http://localhost:8000/v1" in block
    exec(compile(block.replace("http://localhost:8000/v1", url), "docs/vllm.md", "exec"), {})
    name, arguments = capsys.readouterr().out.strip().splitlines()[-1].split(" ", 1)
    assert name == "get_weather" and isinstance(json.loads(arguments)["city"], str)
