"""The request bodies the server accepts, as pydantic models (OpenAI's chat completions shape).

Validation here is structural: types, ranges, which fields go together. What needs the model or
the grammar compiler (a tool's JSON Schema, the prompt's length) is checked in `plan.py`, still
before the request is queued. Unknown top-level fields are ignored, as OpenAI's API does with
fields it does not know; fields railcall knows but cannot honour (`n` > 1, penalties, logit bias)
are a 400 naming the field rather than silently ignored.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Loose(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TextPart(_Loose):
    type: Literal["text"]
    text: str


Content = Union[str, list[TextPart], None]


class FunctionCall(_Loose):
    name: str = Field(min_length=1)
    arguments: str = ""  # a JSON string, as OpenAI sends it


class ToolCall(_Loose):
    id: str = ""
    type: Literal["function"] = "function"
    function: FunctionCall


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
    tool_calls: list[ToolCall] | None = None
    name: str | None = None

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


class ToolSpec(_Loose):
    type: Literal["function"]
    function: FunctionSpec


class NamedFunction(_Loose):
    name: str


class NamedToolChoice(_Loose):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Union[Literal["none", "auto", "required"], NamedToolChoice]


class JsonSchemaFormat(_Loose):
    name: str = Field(default="response", max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | bool = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Loose):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self):
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("response_format of type json_schema needs a json_schema object")
        return self


class StreamOptions(_Loose):
    include_usage: bool = False


_NULL_MEANS_DEFAULT = ("temperature", "top_p", "n", "stream", "logprobs", "parallel_tool_calls", "top_k",
                       "return_token_ids", "frequency_penalty", "presence_penalty")


class ChatCompletionRequest(_Loose):
    model: str = ""
    messages: list[Message] = Field(min_length=1)
    tools: list[ToolSpec] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = Field(default=True, strict=True)
    response_format: ResponseFormat | None = None
    stream: bool = Field(default=False, strict=True)
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1, strict=True)
    max_completion_tokens: int | None = Field(default=None, ge=1, strict=True)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1, strict=True)
    stop: str | list[str] | None = None
    logprobs: bool = Field(default=False, strict=True)
    top_logprobs: int | None = Field(default=None, ge=0, le=20, strict=True)
    n: int = Field(default=1, strict=True)
    frequency_penalty: float | None = 0.0
    presence_penalty: float | None = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # extensions
    return_token_ids: bool = Field(default=False, strict=True)
    top_k: int = Field(default=0, ge=0, strict=True)

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

    @field_validator("n")
    @classmethod
    def _one_choice(cls, v):
        if v != 1:
            raise ValueError("only n=1 is supported (one choice per request)")
        return v

    @field_validator("frequency_penalty", "presence_penalty")
    @classmethod
    def _no_penalty(cls, v):
        if v not in (None, 0, 0.0):
            raise ValueError("penalties are not supported; leave this field at 0")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, v):
        if v:
            raise ValueError("logit_bias is not supported")
        return v

    @model_validator(mode="after")
    def _together(self):
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    """OpenAI's error format."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
