"""OpenAI's Responses API (`POST /v1/responses`) on the chat completion pipeline.

A Responses request is translated into a chat completion request and planned, decoded and parsed
exactly as one (plan.py, the engine, assemble.py's Assembler); only its shape in and out is its own:

    input items              -> chat messages
      message (role, text)      system / developer / user / assistant message
      function_call             an assistant message's tool_calls (consecutive ones: one message)
      function_call_output      a tool message (tool_call_id = call_id)
      custom_tool_call          an assistant message's custom call (call_id, name, input)
      custom_tool_call_output   a tool message (tool_call_id = call_id)
      reasoning                 dropped (a chat history carries no reasoning either)
    instructions             -> a system message first (not carried over by previous_response_id)
    tools (flat function)    -> chat tools ({"type": "function", "function": {...}})
    tools (flat custom)      -> chat custom tools ({"type": "custom", "custom": {name, format}})
    text.format              -> response_format (json_schema, grammar, structural_tag flat)
    max_output_tokens        -> max_tokens

    Assembler deltas         -> output items and stream events
      reasoning_content         a `reasoning` item (reasoning_text)
      content                   a `message` item (output_text)
      tool_calls                one `function_call` item per call (call_id, name, arguments),
                                a `custom_tool_call` item per custom call (call_id, name, input)

A streamed response is `response.created`, `response.in_progress`, then per item
`response.output_item.added`, its deltas (`response.output_text.delta`,
`response.function_call_arguments.delta`, `response.custom_tool_call_input.delta`,
`response.reasoning_text.delta`) and their `.done`
events, `response.output_item.done`, and last `response.completed` (or `response.incomplete`
when max_output_tokens cut it); every event carries its `sequence_number`. A failure after the
stream began is an `error` event.

`previous_response_id` continues a conversation this process answered: `ResponseStore` keeps the
last 256 responses (and at most 64 MiB of their conversations), least recently used out first,
in memory only; an id it does not hold is OpenAI's 404 `previous_response_not_found`.
"""

from __future__ import annotations

import asyncio
import collections
import json
import secrets
import threading
import time
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, model_validator

from railcall.errors import RequestError
from railcall.server.assemble import Assembler, finish_reason, generation_failed, grammar_failure
from railcall.server.schemas import ChatCompletionRequest

PING_SECONDS = 1.0  # a streamed request waiting in the queue sends an SSE comment this often


# -- the request ------------------------------------------------------------------------------

class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Loose(BaseModel):
    model_config = ConfigDict(extra="ignore")


_TEXT_PARTS = ("input_text", "output_text", "text", "refusal")


class ContentPart(_Loose):
    type: str
    text: str | None = None
    refusal: str | None = None

    @model_validator(mode="after")
    def _text_only(self):
        if self.type not in _TEXT_PARTS:
            what = {"input_image": "images", "input_file": "files", "input_audio": "audio"}.get(self.type,
                                                                                              f"{self.type!r} parts")
            raise ValueError(f"{what} are not supported: this server's model reads text only; send input_text parts "
                             "or a string")
        if self.type == "refusal":
            self.text = self.refusal or ""
        if self.text is None:
            raise ValueError(f"a {self.type} part needs its text")
        return self


Text = Union[str, list[ContentPart]]


class MessageItem(_Loose):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: Text


class FunctionCallItem(_Loose):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str = ""


class FunctionCallOutputItem(_Loose):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: Text


class CustomCallItem(_Loose):
    type: Literal["custom_tool_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: str = ""


class CustomCallOutputItem(_Loose):
    type: Literal["custom_tool_call_output"]
    call_id: str = Field(min_length=1)
    output: Text


class ReasoningItem(_Loose):
    type: Literal["reasoning"]


_ITEMS = {"message": MessageItem, "function_call": FunctionCallItem, "function_call_output": FunctionCallOutputItem,
          "custom_tool_call": CustomCallItem, "custom_tool_call_output": CustomCallOutputItem,
          "reasoning": ReasoningItem}


def _item_type(v) -> str | None:
    # a message may leave out its type (OpenAI's EasyInputMessage)
    return v.get("type", "message" if "role" in v else None) if isinstance(v, dict) else getattr(v, "type", None)


# Told apart by `type`; pydantic's error location then names the tag (input[2].function_call.call_id),
# which app._param leaves out.
Item = Annotated[Union[tuple(Annotated[cls, Tag(tag)] for tag, cls in _ITEMS.items())], Discriminator(_item_type)]


class FunctionTool(_Loose):
    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class CustomTool(_Loose):
    """A custom tool: one input text, any (`{"type": "text"}`) or a grammar's
    (`{"type": "grammar", "syntax": "lark" | "regex", "definition": ...}`; railcall also takes
    "gbnf")."""

    type: Literal["custom"]
    name: str
    description: str | None = None
    format: dict[str, Any] | None = None


class NamedTool(_Loose):
    type: Literal["function", "custom"]
    name: str


class TextFormat(_Loose):
    type: Literal["text", "json_object", "json_schema", "grammar", "structural_tag"]
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | bool | None = Field(default=None, alias="schema")
    strict: bool | None = None
    syntax: str | None = None  # type "grammar" (railcall's extension, as response_format's)
    definition: str | None = None
    structures: list[dict[str, Any]] | None = None  # type "structural_tag" (as response_format's)
    triggers: list[str] | None = None


class TextConfig(_Loose):
    format: TextFormat | None = None
    verbosity: str | None = None  # a setting of OpenAI's GPT-5 models: ignored, as the chat field is


_NULL_MEANS_DEFAULT = ("temperature", "top_p", "stream", "parallel_tool_calls", "store", "tool_choice", "tools",
                       "instructions", "max_output_tokens", "text", "previous_response_id")


class ResponsesRequest(_Strict):
    """`POST /v1/responses`: the fields railcall honours, those it accepts and ignores (logged
    once, as the chat endpoint's: schemas.IGNORED), and railcall's extensions; any other is a 400."""

    model: str = ""
    input: list[Item]  # a string is one user message
    instructions: str | None = None
    tools: list[Annotated[Union[FunctionTool, CustomTool], Field(discriminator="type")]] = Field(default_factory=list)
    tool_choice: Union[Literal["none", "auto", "required"], NamedTool, None] = None
    parallel_tool_calls: bool = Field(default=True, strict=True)
    max_output_tokens: int | None = Field(default=None, ge=1, strict=True)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stream: bool = Field(default=False, strict=True)
    text: TextConfig | None = None
    previous_response_id: str | None = None
    store: bool = Field(default=True, strict=True)  # False: the response is not kept for previous_response_id
    # IGNORED (accepted, logged once, not acted on)
    metadata: dict[str, Any] | None = None
    user: str | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    safety_identifier: str | None = None
    reasoning: dict[str, Any] | None = None
    include: list[str] | None = None
    truncation: str | None = None
    stream_options: dict[str, Any] | None = None
    # railcall's extensions, as on the chat endpoint
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1, strict=True)
    top_k: int = Field(default=0, ge=0, strict=True)
    call_format: Literal["json", "openai", "hermes", "pythonic"] | None = None
    routing: Literal["greedy", "scored", "matched"] = "greedy"
    values: Literal["free", "grounded"] = "free"
    on_length: Literal["fit", "cut", "close"] = "fit"
    distinct_calls: bool = Field(default=True, strict=True)

    @model_validator(mode="before")
    @classmethod
    def _shape(cls, data):
        if not isinstance(data, dict):
            return data
        data = {k: v for k, v in data.items() if not (v is None and k in _NULL_MEANS_DEFAULT)}
        if isinstance(data.get("input"), str):
            data["input"] = [{"type": "message", "role": "user", "content": data["input"]}]
        for i, item in enumerate(data.get("input") if isinstance(data.get("input"), list) else ()):
            kind = _item_type(item)
            if kind not in _ITEMS:
                raise RequestError(f"input[{i}]: {kind!r} items are not supported; this server takes "
                                   f"{', '.join(_ITEMS)} items (earlier turns by value, or through "
                                   "previous_response_id)" if kind else
                                   f"input[{i}] must be an object with a type (message, function_call, "
                                   "function_call_output) or a role", param=f"input[{i}]",
                                   code="unsupported_field" if kind else None)
        for i, tool in enumerate(data.get("tools") or ()):
            kind = tool.get("type") if isinstance(tool, dict) else None
            if kind not in ("function", "custom"):
                raise RequestError(f"tools[{i}].type: {kind!r} tools are not supported; this server runs function "
                                   "tools ({\"type\": \"function\", \"name\", \"parameters\"}) and custom tools "
                                   "({\"type\": \"custom\", \"name\", \"format\"}), which your code executes",
                                   param=f"tools[{i}].type", code="unsupported_field")
        return data


# -- input -> a chat completion request -------------------------------------------------------

def _text(content) -> str:
    return content if isinstance(content, str) else "".join(p.text or "" for p in content)


def to_chat(req: ResponsesRequest, earlier: list[dict]) -> tuple[ChatCompletionRequest, list[str]]:
    """The chat completion request that answers `req` after the conversation `earlier` (input
    items of a stored response), and where each of its messages came from (`instructions`,
    `input[3]`, `previous_response_id`), so that a 400 from planning names the Responses field."""
    messages: list[dict] = []
    where: list[str] = []
    if req.instructions:
        messages.append({"role": "system", "content": req.instructions})
        where.append("instructions")
    items = [(_ITEMS[_item_type(x)].model_validate(x), "previous_response_id") for x in earlier]
    items += [(x, f"input[{i}]") for i, x in enumerate(req.input)]
    for item, at in items:
        if isinstance(item, MessageItem):
            messages.append({"role": item.role, "content": _text(item.content)})
        elif isinstance(item, (FunctionCallItem, CustomCallItem)):
            call = ({"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
                    if isinstance(item, FunctionCallItem) else
                    {"id": item.call_id, "type": "custom", "custom": {"name": item.name, "input": item.input}})
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)  # one turn's calls: one assistant message
                continue
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, (FunctionCallOutputItem, CustomCallOutputItem)):
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": _text(item.output)})
        else:  # reasoning: not shown to the model again, as in a chat history
            continue
        where.append(at)
    if not messages:
        raise RequestError("input holds no message", param="input")
    fmt = req.text.format if req.text is not None else None
    body: dict[str, Any] = {
        "model": req.model, "messages": messages, "stream": req.stream, "temperature": req.temperature,
        "top_p": req.top_p, "parallel_tool_calls": req.parallel_tool_calls, "max_tokens": req.max_output_tokens,
        "seed": req.seed, "top_k": req.top_k, "call_format": req.call_format, "routing": req.routing,
        "values": req.values, "on_length": req.on_length,
        "distinct_calls": req.distinct_calls,
        "tools": [_chat_tool(t) for t in req.tools] or None,
        "tool_choice": ({"type": req.tool_choice.type, req.tool_choice.type: {"name": req.tool_choice.name}}
                        if isinstance(req.tool_choice, NamedTool) else req.tool_choice),
    }
    if fmt is not None and fmt.type == "json_schema":
        if fmt.schema_ is None:
            raise RequestError("text.format of type json_schema needs its schema", param="text.format.schema")
        body["response_format"] = {"type": "json_schema", "json_schema": {
            "name": fmt.name, "description": fmt.description, "schema": fmt.schema_, "strict": fmt.strict}}
    elif fmt is not None and fmt.type == "grammar":
        body["response_format"] = {"type": "grammar", "syntax": fmt.syntax, "definition": fmt.definition}
    elif fmt is not None and fmt.type == "structural_tag":
        body["response_format"] = {"type": "structural_tag", "structures": fmt.structures, "triggers": fmt.triggers}
    elif fmt is not None:
        body["response_format"] = {"type": fmt.type}
    try:
        return ChatCompletionRequest.model_validate(body), where
    except ValidationError as e:  # an item that is no chat message (an assistant message with no text)
        err = e.errors()[0]
        raise RequestError(f"input: {err.get('msg', 'invalid')}", param="input") from None


def _chat_tool(t) -> dict:
    """A Responses tool (flat) as the chat endpoint's (nested; a custom grammar one level deeper)."""
    if t.type == "function":
        return {"type": "function", "function": {"name": t.name, "description": t.description or "",
                                                 "parameters": t.parameters, "strict": t.strict}}
    fmt = t.format
    if isinstance(fmt, dict) and fmt.get("type") == "grammar" and "grammar" not in fmt:
        fmt = {"type": "grammar", "grammar": {k: v for k, v in fmt.items() if k != "type"}}
    return {"type": "custom", "custom": {"name": t.name, "description": t.description or "",
                                         **({"format": fmt} if fmt is not None else {})}}


# Chat request fields and the Responses fields they came from, for a 400 raised while planning.
_PARAMS = (("max_completion_tokens", "max_output_tokens"), ("max_tokens", "max_output_tokens"),
           ("response_format.json_schema.schema", "text.format.schema"),
           ("response_format.definition", "text.format.definition"), ("response_format", "text.format"))


def in_responses_terms(e: RequestError, where: list[str]) -> RequestError:
    """A planning error about the chat request, said of the Responses request it came from."""
    param, message = e.param or "", str(e)
    if param.startswith("messages["):
        k = int(param[len("messages["):param.index("]")])
        here = where[k] if k < len(where) else "input"
        param = here + param[param.index("]") + 1:].replace(".tool_call_id", ".call_id")
        message = message.replace(f"messages[{k}]", here).replace("tool_call_id", "call_id")
    elif param.startswith("tools[") and (".function." in param or ".custom." in param):
        old = param  # the chat tool's nesting (function., custom., format.grammar.) is flat here
        param = param.replace(".function.", ".", 1).replace(".custom.", ".", 1).replace(".format.grammar.", ".format.", 1)
        message = message.replace(old, param)
    else:
        for old, new in _PARAMS:
            if param.startswith(old):
                message = message.replace(old, new)
                param = new + param[len(old):]
                break
    return RequestError(message, status=e.status, type=e.type, param=param or None, code=e.code, headers=e.headers)


# -- the stored responses (previous_response_id) ----------------------------------------------

class ResponseStore:
    """The responses a process answered, for `previous_response_id` and `GET /v1/responses/{id}`.
    Built once per app. Each entry is the response and its whole conversation as input items (its
    earlier turns, its input, its output), so a follow-up needs no chain of entries. Bounded by
    count and by the conversations' JSON size, least recently used out first (a 256-turn agent
    loop re-sending its history would otherwise hold every prefix of it)."""

    def __init__(self, max_responses: int = 256, max_bytes: int = 64 << 20):
        self.max_responses, self.max_bytes = max_responses, max_bytes
        self._entries: collections.OrderedDict[str, tuple[dict, list[dict], int]] = collections.OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def put(self, response: dict, conversation: list[dict]) -> None:
        size = len(json.dumps(conversation, separators=(",", ":"))) + len(json.dumps(response, separators=(",", ":")))
        with self._lock:
            if size > self.max_bytes:
                return
            self._entries[response["id"]] = (response, conversation, size)
            self._bytes += size
            while len(self._entries) > self.max_responses or self._bytes > self.max_bytes:
                _, (_, _, dropped) = self._entries.popitem(last=False)
                self._bytes -= dropped

    def get(self, rid: str, param: str = "previous_response_id") -> tuple[dict, list[dict]]:
        with self._lock:
            entry = self._entries.get(rid)
            if entry is not None:
                self._entries.move_to_end(rid)
        if entry is None:
            raise RequestError(f"Previous response with id {rid!r} not found: this server keeps the last "
                               f"{self.max_responses} responses it answered with store true, in memory, until "
                               "it restarts; send the earlier turns in input instead", status=404, param=param,
                               code="previous_response_not_found")
        return entry[0], entry[1]

    def delete(self, rid: str) -> bool:
        with self._lock:
            entry = self._entries.pop(rid, None)
            if entry is not None:
                self._bytes -= entry[2]
        return entry is not None


def as_input(items: list[dict]) -> list[dict]:
    """Output items as the input items of a next turn (reasoning is not shown again)."""
    out = []
    for item in items:
        if item["type"] == "message":
            out.append({"type": "message", "role": "assistant", "content": item["content"]})
        elif item["type"] == "function_call":
            out.append({k: item[k] for k in ("type", "call_id", "name", "arguments")})
        elif item["type"] == "custom_tool_call":
            out.append({k: item[k] for k in ("type", "call_id", "name", "input")})
    return out


# -- the response object ---------------------------------------------------------------------

def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


def skeleton(req: ResponsesRequest, rid: str, model: str) -> dict:
    """The response object as `response.created` shows it: the request's settings, no output."""
    fmt = req.text.format if req.text is not None and req.text.format is not None else None
    return {
        "id": rid, "object": "response", "created_at": int(time.time()), "status": "in_progress", "model": model,
        "output": [], "error": None, "incomplete_details": None, "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens, "parallel_tool_calls": req.parallel_tool_calls,
        "previous_response_id": req.previous_response_id, "store": req.store, "temperature": req.temperature,
        "top_p": req.top_p, "metadata": req.metadata or {}, "truncation": "disabled",
        "tool_choice": (req.tool_choice.model_dump() if isinstance(req.tool_choice, NamedTool)
                        else req.tool_choice or ("auto" if req.tools else "none")),
        "tools": [t.model_dump(exclude_none=True) for t in req.tools],
        "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"}},
        "reasoning": {"effort": None, "summary": None}, "usage": None, "user": req.user,
    }


def usage(prompt: int, cached: int, output: int) -> dict:
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached}, "output_tokens": output,
            "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": prompt + output}


def finished(response: dict, output: list[dict], cut: bool, use: dict) -> dict:
    """The response once generation ended: `cut` by max_output_tokens makes it incomplete."""
    return {**response, "status": "incomplete" if cut else "completed", "output": output, "usage": use,
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None}


def from_chat(response: dict, chat: dict) -> dict:
    """A whole (non-streamed) response from the chat completion the pipeline answered."""
    choice = chat["choices"][0]
    msg, cut = choice["message"], choice["finish_reason"] == "length"
    status = "incomplete" if cut else "completed"
    output = []
    if msg.get("reasoning_content"):
        output.append({"type": "reasoning", "id": new_id("rs_"), "summary": [], "status": status,
                       "content": [{"type": "reasoning_text", "text": msg["reasoning_content"]}]})
    if msg.get("content"):
        output.append({"type": "message", "id": new_id("msg_"), "role": "assistant", "status": status,
                       "content": [{"type": "output_text", "text": msg["content"], "annotations": [], "logprobs": []}]})
    for call in msg.get("tool_calls") or ():
        output.append(call_item(call, status))
    u = chat["usage"]
    return finished(response, output, cut, usage(u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"],
                                                 u["completion_tokens"]))


def call_item(call: dict, status: str) -> dict:
    """A chat tool call as its output item: `function_call` (arguments) or `custom_tool_call`
    (input), with the ids OpenAI gives them (fc_..., ctc_...)."""
    suffix = call["id"].removeprefix("call_")
    if call.get("type") == "custom":
        return {"type": "custom_tool_call", "id": "ctc_" + suffix, "call_id": call["id"], "name": call["custom"]["name"],
                "input": call["custom"].get("input", ""), "status": status}
    return {"type": "function_call", "id": "fc_" + suffix, "call_id": call["id"], "name": call["function"]["name"],
            "arguments": call["function"].get("arguments", ""), "status": status}


# -- the event stream ---------------------------------------------------------------------------

class _Events:
    """Per streamed response: Assembler deltas in, Responses events out (bytes of SSE), with the
    output items as they stand."""

    def __init__(self):
        self.seq = 0
        self.output: list[dict] = []
        self.open: dict | None = None  # the item receiving deltas (a reasoning, message or call item)
        self.calls: dict[int, dict] = {}  # the Assembler's call index -> its function_call item

    def event(self, kind: str, **fields) -> bytes:
        body = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        data = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
        return f"event: {kind}\ndata: {data}\n\n".encode("utf-8")

    def _add(self, item: dict) -> list[bytes]:
        out = self.close()
        self.output.append(item)
        self.open = item
        out.append(self.event("response.output_item.added", output_index=len(self.output) - 1, item=dict(item)))
        if item["type"] == "message":
            out.append(self.event("response.content_part.added", item_id=item["id"], output_index=len(self.output) - 1,
                                  content_index=0, part={"type": "output_text", "text": "", "annotations": [],
                                                         "logprobs": []}))
        return out

    def close(self, status: str = "completed") -> list[bytes]:
        """End the open item: its `.done` events and `response.output_item.done`."""
        item, self.open = self.open, None
        if item is None:
            return []
        at, out = self.output.index(item), []
        item["status"] = status
        if item["type"] == "message":
            part = item["content"][0]
            out.append(self.event("response.output_text.done", item_id=item["id"], output_index=at, content_index=0,
                                  text=part["text"], logprobs=[]))
            out.append(self.event("response.content_part.done", item_id=item["id"], output_index=at, content_index=0,
                                  part=part))
        elif item["type"] == "reasoning":
            out.append(self.event("response.reasoning_text.done", item_id=item["id"], output_index=at, content_index=0,
                                  text=item["content"][0]["text"]))
        elif item["type"] == "custom_tool_call":
            out.append(self.event("response.custom_tool_call_input.done", item_id=item["id"], output_index=at,
                                  input=item["input"]))
        else:
            out.append(self.event("response.function_call_arguments.done", item_id=item["id"], output_index=at,
                                  name=item["name"], arguments=item["arguments"]))
        out.append(self.event("response.output_item.done", output_index=at, item=item))
        return out

    def feed(self, delta: dict) -> list[bytes]:
        out: list[bytes] = []
        if "reasoning_content" in delta:
            if self.open is None or self.open["type"] != "reasoning":
                out += self._add({"type": "reasoning", "id": new_id("rs_"), "summary": [], "status": "in_progress",
                                  "content": [{"type": "reasoning_text", "text": ""}]})
            self.open["content"][0]["text"] += delta["reasoning_content"]
            out.append(self.event("response.reasoning_text.delta", item_id=self.open["id"],
                                  output_index=len(self.output) - 1, content_index=0, delta=delta["reasoning_content"]))
        if delta.get("content"):
            if self.open is None or self.open["type"] != "message":
                out += self._add({"type": "message", "id": new_id("msg_"), "role": "assistant", "status": "in_progress",
                                  "content": [{"type": "output_text", "text": "", "annotations": [], "logprobs": []}]})
            self.open["content"][0]["text"] += delta["content"]
            out.append(self.event("response.output_text.delta", item_id=self.open["id"],
                                  output_index=len(self.output) - 1, content_index=0, delta=delta["content"], logprobs=[]))
        for call in delta.get("tool_calls") or ():
            fn = call.get("function", {})
            if "id" in call:  # a new call: its name is complete (its input or arguments follow)
                head = {**call, "custom": {"name": call["custom"]["name"]}} if "custom" in call else \
                    {**call, "function": {"name": fn.get("name", "")}}
                item = call_item(head, "in_progress")
                self.calls[call["index"]] = item
                out += self._add(item)
            item = self.calls[call["index"]]
            piece = call.get("custom", {}).get("input")
            if piece:
                item["input"] += piece
                out.append(self.event("response.custom_tool_call_input.delta", item_id=item["id"],
                                      output_index=self.output.index(item), delta=piece))
            if fn.get("arguments"):
                item["arguments"] += fn["arguments"]
                out.append(self.event("response.function_call_arguments.delta", item_id=item["id"],
                                      output_index=self.output.index(item), delta=fn["arguments"]))
        return out


async def stream(job, asm: Assembler, plan, response: dict, keep, on_error=None):
    """The SSE events of one streamed response; `keep(response)` is called with the finished one,
    `on_error(status, code)` with a failure sent as an `error` event."""
    ev = _Events()

    def _error(e: RequestError) -> bytes:
        if on_error is not None:
            on_error(e.status, e.code)
        asm.cancel()
        return ev.event("error", code=e.code or e.type, message=str(e), param=e.param)

    yield ev.event("response.created", response=response)
    yield ev.event("response.in_progress", response=response)
    try:
        gen = None
        while gen is None:
            try:
                kind, value = await asyncio.wait_for(job.events.get(), PING_SECONDS)
            except asyncio.TimeoutError:
                yield b": ping\n\n"
                continue
            if kind == "step":
                for delta in asm.feed(value[1]):
                    for chunk in ev.feed(delta):
                        yield chunk
            elif kind == "error":
                yield _error(generation_failed(value))
                return
            else:
                gen = value[1]
        failed = grammar_failure(gen)
        if failed is not None:
            yield _error(failed)
            return
        for delta in asm.finish(gen):
            for chunk in ev.feed(delta):
                yield chunk
        cut = finish_reason(gen, asm) == "length"
        for chunk in ev.close("incomplete" if cut else "completed"):
            yield chunk
        done = finished(response, ev.output, cut, usage(len(plan.prompt), gen.prompt_cached, len(gen.tokens)))
        keep(done)
        yield ev.event("response.incomplete" if cut else "response.completed", response=done)
    finally:
        job.cancel()  # a client that went away stops its generation at the next token

