"""The request bodies the server accepts, as pydantic models (OpenAI's chat completions shape).

Validation here is structural: types, ranges, which fields go together. What needs the model or
the grammar compiler (a tool's JSON Schema, the prompt's length, a logit_bias token id) is checked
in `plan.py`, still before the request is queued. A top-level field is either honoured, or one of
the fields whose absence would not change the answer (`IGNORED`: OpenAI's bookkeeping, settings
of OpenAI's own models; accepted, and logged once per name), or a 400 that names it. Content parts other than text (images, audio, files) are a 400
saying that this server's model reads text only.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from railcall.errors import RequestError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Loose(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TextPart(_Loose):
    type: str
    text: str | None = None

    @model_validator(mode="after")
    def _text_only(self):
        if self.type != "text":
            what = {"image_url": "images", "input_image": "images", "input_audio": "audio", "file": "files"}.get(
                self.type, f"{self.type!r} parts")
            raise ValueError(f"{what} are not supported: this server's model reads text only; send text parts "
                             "({\"type\": \"text\", \"text\": ...}) or a string")
        if self.text is None:
            raise ValueError("a text part needs its text")
        return self


Content = Union[str, list[TextPart], None]


class FunctionCall(_Loose):
    name: str = Field(min_length=1)
    arguments: str = ""  # a JSON string, as OpenAI sends it


class ToolCall(_Loose):
    id: str = ""
    type: Literal["function"] = "function"
    function: FunctionCall


class CustomCall(_Loose):
    name: str = Field(min_length=1)
    input: str = ""


class CustomToolCall(_Loose):
    """An earlier call of a custom tool (its input is one text)."""

    id: str = ""
    type: Literal["custom"]
    custom: CustomCall


AnyToolCall = Annotated[Union[ToolCall, CustomToolCall], Field(discriminator="type")]


class SystemMessage(_Loose):
    role: Literal["system", "developer"]
    content: Union[str, list[TextPart]]
    name: str | None = None


class UserMessage(_Loose):
    role: Literal["user"]
    content: Union[str, list[TextPart]]
    name: str | None = None


class AssistantMessage(_Loose):
    role: Literal["assistant"]
    content: Content = None
    reasoning_content: str | None = None
    tool_calls: list[AnyToolCall] | None = None
    name: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _typed_calls(cls, data):
        # a call without a type is a function call, as OpenAI reads it
        if isinstance(data, dict) and isinstance(data.get("tool_calls"), list):
            data = {**data, "tool_calls": [{**c, "type": "function"} if isinstance(c, dict) and "type" not in c else c
                                           for c in data["tool_calls"]]}
        return data

    @model_validator(mode="after")
    def _something(self):
        if self.content is None and not self.tool_calls:
            raise ValueError("an assistant message needs content or tool_calls")
        return self


class ToolMessage(_Loose):
    role: Literal["tool"]
    content: Union[str, list[TextPart]]
    tool_call_id: str = Field(min_length=1)


Message = Annotated[Union[SystemMessage, UserMessage, AssistantMessage, ToolMessage], Field(discriminator="role")]


class FunctionSpec(_Loose):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str = ""
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionToolSpec(_Loose):
    type: Literal["function"]
    function: FunctionSpec


class GrammarDefinition(_Loose):
    syntax: Literal["lark", "regex", "gbnf"]  # OpenAI's two, and GBNF (railcall's)
    definition: str


class InputFormat(_Loose):
    """A custom tool's input: any text, or a text of a grammar."""

    type: Literal["text", "grammar"]
    grammar: GrammarDefinition | None = None

    @model_validator(mode="after")
    def _grammar_given(self):
        if self.type == "grammar" and self.grammar is None:
            raise ValueError('a format of type grammar needs "grammar": {"syntax": "lark" | "regex" | "gbnf", '
                             '"definition": "..."}')
        return self

    def spec(self) -> dict:
        """The format as `railcall.grammar.tools.Tool.input_format` takes it."""
        if self.type == "text":
            return {"type": "text"}
        return {"type": "grammar", "syntax": self.grammar.syntax, "definition": self.grammar.definition}


class CustomSpec(_Loose):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str = ""
    format: InputFormat | None = None  # None: any text


class CustomToolSpec(_Loose):
    """OpenAI's custom tool: its call carries one input text, under its format's grammar."""

    type: Literal["custom"]
    custom: CustomSpec


ToolSpec = Annotated[Union[FunctionToolSpec, CustomToolSpec], Field(discriminator="type")]


class NamedFunction(_Loose):
    name: str


class NamedToolChoice(_Loose):
    type: Literal["function"]
    function: NamedFunction


class NamedCustomChoice(_Loose):
    type: Literal["custom"]
    custom: NamedFunction


ToolChoice = Union[Literal["none", "auto", "required"],
                   Annotated[Union[NamedToolChoice, NamedCustomChoice], Field(discriminator="type")]]


class JsonSchemaFormat(_Loose):
    name: str = Field(default="response", max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | bool = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class TagStructure(_Strict):
    """One structure of a structural tag: `begin`, a JSON value under `schema`, `end`."""

    begin: str = Field(min_length=1)
    schema_: dict[str, Any] | bool = Field(default=True, alias="schema")
    end: str


class StructuralTag(_Loose):
    """The structural-tag format (vLLM's and SGLang's response_format, after XGrammar): free
    text in which each trigger starts one of the structures that begin with it."""

    structures: list[TagStructure] = Field(min_length=1)
    triggers: list[str] = Field(min_length=1)


class ResponseFormat(_Loose):
    """OpenAI's formats; railcall's `grammar` (an extension, shaped as OpenAI's custom tool
    format): {"type": "grammar", "syntax": "lark" | "gbnf" | "regex", "definition": "..."}; and
    `structural_tag` (vLLM's): {"type": "structural_tag", "structures": [{"begin", "schema",
    "end"}], "triggers": [...]}."""

    type: Literal["text", "json_object", "json_schema", "grammar", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None
    syntax: Literal["lark", "gbnf", "regex"] | None = None
    definition: str | None = None
    structures: list[TagStructure] | None = None
    triggers: list[str] | None = None
    format: Any = None  # the newer structural-tag form, refused with what to send instead

    @model_validator(mode="after")
    def _schema_given(self):
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("response_format of type json_schema needs a json_schema object")
        if self.type == "grammar" and (self.syntax is None or self.definition is None):
            raise ValueError('response_format of type grammar needs "syntax" ("lark", "gbnf" or "regex") and '
                             '"definition" (the grammar\'s text)')
        if self.type == "structural_tag":
            if self.format is not None:
                raise ValueError('response_format of type structural_tag is taken in its "structures" and "triggers" '
                                 'form; the "format" form is not: send "structures": [{"begin", "schema", "end"}] '
                                 'and "triggers"')
            if not self.structures or not self.triggers:
                raise ValueError('response_format of type structural_tag needs "structures" ([{"begin", "schema", '
                                 '"end"}, ...]) and "triggers" (texts each begin starts with)')
        return self

    def structural_tag(self) -> StructuralTag:
        return StructuralTag(structures=self.structures, triggers=self.triggers)


class StreamOptions(_Loose):
    include_usage: bool = False


_NULL_MEANS_DEFAULT = ("temperature", "top_p", "n", "stream", "logprobs", "parallel_tool_calls", "top_k",
                       "return_token_ids", "frequency_penalty", "presence_penalty", "repetition_penalty",
                       "min_tokens", "on_length", "distinct_calls", "routing", "values")

# OpenAI request fields that are accepted and not acted on, each with why ignoring it leaves the
# answer as it would be: OpenAI's bookkeeping, and settings that do nothing on a small open
# model. The server logs each name once (app.py) so an operator sees what clients send. A field
# whose honouring is impossible and whose dropping would change the answer (audio output, web
# search) is refused instead (`modalities` with "audio", `audio`).
IGNORED = {
    "user": "OpenAI's end-user id for abuse monitoring",
    "metadata": "OpenAI's tags for stored completions",
    "store": "OpenAI's storage for distillation and evals",
    "service_tier": "OpenAI's processing tier; one tier here",
    "prompt_cache_key": "OpenAI's cache routing hint; railcall's prefix cache needs no key",
    "safety_identifier": "OpenAI's end-user id for abuse monitoring",
    "reasoning_effort": "a setting of OpenAI's reasoning models; the served model reasons (or not) as it was trained",
    "verbosity": "a setting of OpenAI's GPT-5 models; the served model has none",
    "modalities": "text is the only output modality, and the one asked for",
    "prediction": "predicted outputs only speed up OpenAI's decoding; the answer is the same without",
    # the Responses API's (responses.py)
    "reasoning": "a setting of OpenAI's reasoning models; the served model reasons (or not) as it was trained",
    "include": "extra output OpenAI can attach (encrypted reasoning, logprobs); the answer is the same without",
    "truncation": "the conversation is never truncated here; one past the context is a 400",
    "prompt_cache_retention": "OpenAI's cache lifetime; railcall's prefix cache keeps what fits its budget",
}


class StructuredOutputs(_Strict):
    """vLLM's `structured_outputs` (and its older top-level `guided_*` fields)."""

    json_: dict[str, Any] | bool | None = Field(default=None, alias="json")
    choice: list[str] | None = Field(default=None, min_length=1)
    regex: str | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | dict[str, Any] | None = None  # vLLM sends it as a JSON text


class _Request(_Strict):
    """What both endpoints take: the token budget, sampling, stop strings, streaming, the
    constraints on the answer (one of response_format, structured_outputs, guided_*), and
    railcall's `on_length` and `return_token_ids`."""

    model: str = ""
    max_tokens: int | None = Field(default=None, ge=1, strict=True)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1, strict=True)
    stop: str | list[str] | None = None
    n: int = Field(default=1, ge=1, le=16, strict=True)
    stream: bool = Field(default=False, strict=True)
    stream_options: StreamOptions | None = None
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    user: str | None = None  # IGNORED: accepted, logged once, not acted on
    # vLLM's sampling extensions
    top_k: int = Field(default=0, ge=0, strict=True)
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=10.0)
    min_tokens: int = Field(default=0, ge=0, strict=True)
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | bool | None = None
    guided_choice: list[str] | None = Field(default=None, min_length=1)
    guided_regex: str | None = None
    guided_grammar: str | None = None
    # What a call or JSON answer that max_tokens would cut becomes: "fit" (near the ceiling only
    # tokens after which the grammar's shortest close still fits are legal, so the model's own
    # tokens close it inside max_tokens; cut only where not even the shortest call fits), "cut" (as
    # OpenAI: it ends where it was cut, finish_reason "length", a call's arguments incomplete) or
    # "close" (the grammar writes its shortest close while it still fits; values it has to fill
    # are "?"; finish_reason "length")
    on_length: Literal["fit", "cut", "close"] = "fit"
    # A call identical (name and arguments) to an earlier call of the same reply is unspellable
    distinct_calls: bool = Field(default=True, strict=True)
    return_token_ids: bool = Field(default=False, strict=True)

    @model_validator(mode="before")
    @classmethod
    def _nulls_are_defaults(cls, data):
        # OpenAI's API takes null for these as "the default", and some clients send it
        if isinstance(data, dict) and any(data.get(k, 0) is None for k in _NULL_MEANS_DEFAULT):
            data = {k: v for k, v in data.items() if not (v is None and k in _NULL_MEANS_DEFAULT)}
        return data

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > 4:
            raise ValueError("at most 4 stop strings")
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        return stops

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, v):
        for k, b in (v or {}).items():
            if not k.isdigit():
                raise ValueError(f"logit_bias keys are token ids (as strings), not {k!r}")
            if not -100 <= b <= 100:
                raise ValueError(f"logit_bias values lie in [-100, 100]; token {k} has {b}")
        return v

    @model_validator(mode="after")
    def _one_constraint(self):
        given = [k for k in ("response_format", "structured_outputs", "guided_json", "guided_choice", "guided_regex",
                             "guided_grammar") if getattr(self, k) is not None and
                 not (k == "response_format" and self.response_format.type == "text")]
        if len(given) > 1:
            raise RequestError(f"{given[0]} and {given[1]} both constrain the answer; send one of them",
                               param=given[1])
        so = self.structured_outputs
        if so is not None and sum(x is not None and x is not False for x in (so.json_, so.choice, so.regex, so.grammar,
                                                                                 so.json_object, so.structural_tag)) != 1:
            raise RequestError("structured_outputs takes exactly one of json, choice, regex, grammar, json_object, "
                               "structural_tag", param="structured_outputs")
        return self


class ChatCompletionRequest(_Request):
    """`POST /v1/chat/completions`: messages in, a message (text, reasoning, tool calls) out."""

    messages: list[Message] = Field(min_length=1)
    tools: list[ToolSpec] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = Field(default=True, strict=True)
    max_completion_tokens: int | None = Field(default=None, ge=1, strict=True)
    logprobs: bool = Field(default=False, strict=True)
    top_logprobs: int | None = Field(default=None, ge=0, le=20, strict=True)
    # IGNORED (accepted, logged once, not acted on); their types are still checked
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    modalities: list[str] | None = None
    prediction: dict[str, Any] | None = None
    # railcall's: the call format this request's tool calls are written in (grammar, prompt and
    # parser; default: the served model's, `railcall serve --format`), and how the tool name is
    # chosen ("greedy": token by token under the mask; "scored": by the likelihood of each whole
    # name, railcall.heuristics.routing, one extra forward pass per call)
    call_format: Literal["json", "openai", "hermes", "pythonic"] | None = None
    routing: Literal["greedy", "scored", "matched"] = "greedy"  # matched: scored among the tools whose
    # words the last user message shares most (railcall.heuristics.routing.matching_tools)
    # railcall's: "grounded" narrows each required numeric argument to the numbers the
    # conversation states (user and assistant text, tool results) and, with parallel_tool_calls
    # under tool_choice "required", makes as many calls as the last user message's numbers fill
    # (railcall.heuristics.grounding); "free": the schema alone
    values: Literal["free", "grounded"] = "free"

    @field_validator("modalities")
    @classmethod
    def _text_out(cls, v):
        other = [m for m in v or () if m != "text"]
        if other:
            raise ValueError(f"this server's model writes text only, not {', '.join(map(repr, other))}; send "
                             "modalities [\"text\"] or leave it out")
        return v

    @field_validator("top_logprobs")
    @classmethod
    def _top_needs_logprobs(cls, v, info):
        if v and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs logprobs: true")
        return v

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_Request):
    """`POST /v1/completions`: a prompt in, text out (no chat template), optionally under a
    grammar (`response_format`, or vLLM's guided fields)."""

    prompt: str | list[int] = Field(min_length=1)

    # what plan.py reads of a chat request, for the parts both share
    max_completion_tokens: ClassVar[None] = None
    logprobs: ClassVar[bool] = False
    top_logprobs: ClassVar[None] = None

    @property
    def token_limit(self) -> int | None:
        return self.max_tokens


def guided(req):
    """vLLM's structured_outputs / guided_* fields as (kind, value, param): kind "json" (a
    schema), "json_object", "choice" (a list of strings), "regex" (a pattern), "grammar" (Lark or
    GBNF text), "structural_tag" (a StructuralTag); None when none is given."""
    so = req.structured_outputs
    if so is not None and so.structural_tag is not None:
        where = "structured_outputs.structural_tag"
        value = so.structural_tag
        try:
            if isinstance(value, str):
                value = json.loads(value)
            if isinstance(value, dict) and value.get("format") is not None:
                raise ValueError('the "format" form is not taken; send "structures" and "triggers"')
            return "structural_tag", StructuralTag.model_validate(value), where
        except (ValueError, ValidationError) as e:
            raise RequestError(f"{where}: not a structural tag ({_first_line(e)}); send a JSON object "
                               '{"structures": [{"begin", "schema", "end"}, ...], "triggers": [...]}',
                               param=where) from None
    if so is not None:
        if so.json_ is not None:
            return "json", so.json_, "structured_outputs.json"
        if so.json_object:
            return "json_object", None, "structured_outputs.json_object"
        if so.choice is not None:
            return "choice", so.choice, "structured_outputs.choice"
        if so.regex is not None:
            return "regex", so.regex, "structured_outputs.regex"
        return "grammar", so.grammar, "structured_outputs.grammar"
    for kind in ("json", "choice", "regex", "grammar"):
        value = getattr(req, f"guided_{kind}")
        if value is not None:
            return kind, value, f"guided_{kind}"
    return None


def _first_line(e: Exception) -> str:
    if isinstance(e, ValidationError) and e.errors():
        err = e.errors()[0]
        return f"{'.'.join(str(p) for p in err['loc']) or 'the object'}: {err['msg']}"
    return str(e).splitlines()[0]


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    """OpenAI's error format."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
