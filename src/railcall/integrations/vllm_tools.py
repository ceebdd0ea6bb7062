"""railcall's calls as OpenAI `tool_calls` from vLLM's own OpenAI server: a vLLM tool parser.

    python -m vllm.entrypoints.openai.api_server --model MODEL \\
        --logits-processors railcall.integrations.vllm:RailcallLogitsProcessor \\
        --tool-parser-plugin railcall.integrations.vllm_tools --tool-call-parser railcall \\
        --enable-auto-tool-choice --chat-template PATH_OF(railcall/integrations/vllm_tools_template.jinja)

(see docs/vllm.md, "OpenAI-native"). Two vLLM hooks, both on the API server's side:

- `adjust_request(request)`: vLLM calls it per chat request, after the chat template has rendered
  the prompt and before the request becomes SamplingParams. It turns the request's `tools`,
  `tool_choice` (auto / required / a named function; "none" is left alone) and
  `parallel_tool_calls` into railcall's spec (the one railcall.integrations.vllm documents) and writes it, as
  JSON text, into `request.vllm_xargs["railcall"]`; vLLM copies vllm_xargs into the
  SamplingParams' extra args, where the logits processor (loaded with --logits-processors, in
  the engine worker) finds it. vLLM's own structured outputs are not set for the tools: the
  grammar is railcall's alone.
- `extract_tool_calls` / `extract_tool_calls_streaming`: railcall's own OutputParser (the JSON
  call format, {"tool":…,"args":…}; parallel calls as an array) reads the output back into
  vLLM's tool-call objects; streamed, a call's name comes first and its arguments follow in the
  pieces the model writes them in.

The prompt: adjust_request runs after the template has rendered, so it cannot show the model its
tools. A model whose chat template renders `tools` sees them there (but is then told its own
call format, not railcall's). SmolLM2's template does not render tools; the template shipped
beside this module (`chat_template_path()`) is SmolLM2's ChatML with the tool instruction
railcall's own server writes (railcall.server.plan.tools_instruction), for `--chat-template`.

`supports_required_and_named = False`: vLLM then parses required and named calls through this
parser (as for "auto") instead of expecting its own JSON list format, which railcall does not
write. vLLM routes those through the parser only with --enable-auto-tool-choice.

Lifecycle: vLLM builds one parser per request (per choice), so the streaming state lives on the
instance; the OutputParser is built on the first streamed piece.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vllm.entrypoints.generate.base.protocol import (
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    ExtractedToolCallInformation,
    FunctionCall,
    ToolCall,
)
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.renderers.chat_utils import make_tool_call_id
from vllm.tool_parsers.abstract_tool_parser import ToolParser, ToolParserManager

from railcall.output import Delimiters, OutputParser
from railcall.integrations.vllm import EXTRA_ARGS_KEY

PARSER_NAME = "railcall"
TEMPLATE = Path(__file__).with_name("vllm_tools_template.jinja")


def chat_template_path() -> Path:
    """The ChatML template that shows the model its tools (for `--chat-template`)."""
    return TEMPLATE


def _choice(request: ChatCompletionRequest) -> tuple[str, str | None]:
    """("auto" | "required" | "named" | "none", the named function or None)."""
    tc = request.tool_choice
    if tc is None:
        return ("auto" if request.tools else "none"), None
    if isinstance(tc, str):
        return tc, None
    return "named", tc.function.name


def railcall_spec(request: ChatCompletionRequest) -> dict[str, Any] | None:
    """railcall's spec for a chat request's tools, or None when railcall has nothing to enforce
    (no tools, or tool_choice "none").

    As in railcall's own server: "required" is one call, or an array of calls with
    parallel_tool_calls (vLLM's default is true); a named function is one call to it; "auto"
    leaves the model free to write text, and each call's opening ({"tool":") starts the grammar
    for one call (several calls are several openings)."""
    choice, name = _choice(request)
    if not request.tools or choice == "none":
        return None
    tools = [t.model_dump(exclude_none=True) for t in request.tools]
    if choice == "named":
        tools = [t for t in tools if t["function"]["name"] == name]
        return {"tools": tools, "mode": "required"}
    if choice == "required":
        return {"tools": tools, "mode": "required", "parallel": bool(request.parallel_tool_calls)}
    return {"tools": tools, "mode": "auto"}


class RailcallToolParser(ToolParser):
    """railcall's spec in, railcall's calls out (see the module docstring). One per request."""

    supports_required_and_named = False

    def __init__(self, tokenizer, tools=None):
        super().__init__(tokenizer, tools)
        self._stream: OutputParser | None = None
        self._ids: dict[int, str] = {}  # the turn's call index -> the id sent with its name

    # the request ---------------------------------------------------------------------------------

    def adjust_request(self, request):
        if not isinstance(request, ChatCompletionRequest):
            return request  # the Responses API: not wired
        spec = railcall_spec(request)
        if spec is None:
            return request
        xargs = dict(request.vllm_xargs or {})
        # a spec the client wrote itself (vllm_xargs) is kept: it asked for something particular
        xargs.setdefault(EXTRA_ARGS_KEY, json.dumps(spec))
        request.vllm_xargs = xargs
        # vLLM's own structured outputs are not set for the tools (the base class would);
        # a response_format beside them is refused by railcall's processor (HTTP 400).
        return request

    def _parser(self, request) -> OutputParser:
        choice, _ = _choice(request)
        return OutputParser(Delimiters(), call_format="json",
                            tool_choice="auto" if choice == "auto" else "required", stream_calls=True)

    # the whole output ----------------------------------------------------------------------------

    def extract_tool_calls(self, model_output: str, request) -> ExtractedToolCallInformation:
        parser = self._parser(request)
        parser.feed(-1, model_output)
        parser.finish()
        r = parser.result()
        # a call cut by max_tokens (complete=False) is returned as written: finish_reason says
        # "length" and its arguments are not valid JSON, so no client runs it by mistake
        calls = [ToolCall(id=make_tool_call_id(), type="function",
                          function=FunctionCall(name=c.name, arguments=c.arguments)) for c in r.tool_calls]
        return ExtractedToolCallInformation(tools_called=bool(calls), tool_calls=calls, content=r.content or None)

    # streamed ------------------------------------------------------------------------------------

    def extract_tool_calls_streaming(self, previous_text: str, current_text: str, delta_text: str,
                                     previous_token_ids: Sequence[int], current_token_ids: Sequence[int],
                                     delta_token_ids: Sequence[int], request) -> DeltaMessage | None:
        if self._stream is None:
            self._stream = self._parser(request)
        deltas = self._stream.feed(-1, delta_text) if delta_text else []
        return self._message(deltas)

    def finish_streaming(self) -> DeltaMessage | None:
        """Text the parser still held at the end of the stream (a partial call opening in auto
        mode that never completed). vLLM has no end-of-stream hook for legacy parsers, so this is
        for callers that drive the parser themselves (the tests); under the server every byte of
        a call is released as it is written, and a held prefix of `{"tool":"` is at most 9
        characters of content."""
        if self._stream is None:
            return None
        return self._message(self._stream.finish())

    def _message(self, deltas) -> DeltaMessage | None:
        content, calls = "", []
        for d in deltas:
            if d.kind == "content":
                content += d.text
            elif d.kind == "call_name":
                self._ids[d.index] = make_tool_call_id()
                self.current_tool_id = d.index
                self.prev_tool_call_arr.append({"name": d.text, "arguments": ""})
                self.streamed_args_for_tool.append("")
                calls.append(DeltaToolCall(index=d.index, id=self._ids[d.index], type="function",
                                           function=DeltaFunctionCall(name=d.text).model_dump(exclude_none=True)))
            elif d.kind == "call_args":
                self.prev_tool_call_arr[d.index]["arguments"] += d.text
                self.streamed_args_for_tool[d.index] += d.text
                calls.append(DeltaToolCall(index=d.index,
                                           function=DeltaFunctionCall(arguments=d.text).model_dump(exclude_none=True)))
            # "tool_call" (a call's end): its name and arguments went out already
        if not content and not calls:
            return None
        return DeltaMessage(content=content or None, tool_calls=calls)


ToolParserManager.register_module(PARSER_NAME, module=RailcallToolParser)
