"""What a reply is read into (`ToolCall`, `Delta`, `ParsedOutput`), and a finished call body
read as calls: the JSON-object formats (`parse_calls`) and the pythonic list (`parse_pythonic`),
parsed, never evaluated. Numbers keep the text they were written with."""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from typing import Literal

@dataclass(frozen=True)
class ToolCall:
    """One parsed call: the tool's name and its arguments as JSON text -- the text the model
    wrote, whitespace outside strings removed (numbers and escapes as written). `complete` is
    False for a call the output ended inside (cut by max_tokens): its arguments stop where the
    output stopped and are not valid JSON, so no client can mistake them for a call to run."""

    name: str
    arguments: str
    complete: bool = True

    @property
    def input(self) -> str:
        """A custom tool's input text: its arguments are one JSON string (`OutputParser`'s
        `text_tools`). ValueError for a call whose arguments are not one."""
        value = json.loads(self.arguments)
        if not isinstance(value, str):
            raise ValueError(f"the call of {self.name!r} has arguments, not an input text")
        return value


@dataclass(frozen=True)
class Delta:
    """A piece of output. `kind` is "reasoning" or "content" (with `text`); "tool_call" (with
    `call` and its `index` in the turn) once a call's end is seen; and, with `stream_calls`,
    "call_name" (`text` the name, as soon as it is complete) and "call_args" (`text` the next
    piece of the arguments) before it. The pieces of a call's arguments add up to its
    `ToolCall.arguments`."""

    kind: Literal["reasoning", "content", "tool_call", "call_name", "call_args"]
    text: str = ""
    call: ToolCall | None = None
    index: int = 0



@dataclass
class ParsedOutput:
    """The whole turn. `content` is "" when it held only whitespace (e.g. between calls)."""

    reasoning_content: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)


class _Number(str):
    """A JSON number as it was written. Arguments are re-serialised with their numbers' own
    text: through a float, `1e999` would come back as `Infinity` (not JSON) and
    `0.10000000000000000001` as `0.1`."""


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def read_json(text: str):
    """JSON text -> its value, numbers kept as written (`_Number`); ValueError if it is not JSON."""
    return json.loads(text, parse_float=_Number, parse_int=_Number, parse_constant=_no_constant)


def _is_text(x) -> bool:
    return isinstance(x, str) and not isinstance(x, _Number)


def _compact(value) -> str:
    """Compact JSON of a value read by `read_json`, numbers as written."""
    if isinstance(value, _Number):
        return str(value)
    if isinstance(value, dict):
        return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + _compact(v) for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_compact(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def parse_calls(body: str, fmt: str, keys: tuple[str, str] = ("tool", "args"),
                 text_tools: frozenset[str] = frozenset()) -> list[ToolCall] | None:
    """A finished JSON call body -> its calls, or None where it is not a call of format `fmt`:
    Hermes' `{"name", "arguments"}` object, or the JSON formats' object (or, for "json", an
    array of them) with the names in `keys`. A custom tool's (`text_tools`) arguments are one
    string; the others' an object (or an object written as a JSON string)."""
    try:
        value = read_json(body)
    except ValueError:
        return None
    name_key, args_key = ("name", "arguments") if fmt == "hermes" else keys
    items = value if isinstance(value, list) and fmt == "json" else [value]
    calls = []
    for item in items:
        if not isinstance(item, dict) or not _is_text(item.get(name_key)):
            return None
        args = item.get(args_key, {})
        if item[name_key] in text_tools:  # a custom tool: one input text
            if not _is_text(args):
                return None
            calls.append(ToolCall(item[name_key], json.dumps(args, ensure_ascii=False)))
            continue
        if _is_text(args):  # some templates write arguments as a JSON string
            try:
                args = read_json(args)
            except ValueError:
                return None
        if not isinstance(args, dict):
            return None
        calls.append(ToolCall(item[name_key], _compact(args)))
    return calls or None


# -- pythonic calls ---------------------------------------------------------------------------

_JSON_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")


def parse_pythonic(text: str) -> list[ToolCall] | None:
    """`[f(a=1), g.h(b="x")]` -> ToolCalls, or None where `text` is not such a list. Parsed with
    `ast.parse` and read node by node (as `ast.literal_eval` reads, never evaluated): a call of
    a name or dotted name with keyword arguments only, each value a literal JSON can hold."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if not isinstance(tree.body, ast.List):
        return None
    src = text.strip()
    calls = []
    for item in tree.body.elts:
        if not isinstance(item, ast.Call) or item.args:
            return None
        name = _dotted(item.func)
        if name is None:
            return None
        members = {}
        try:
            for kw in item.keywords:
                if kw.arg is None or kw.arg in members:  # **kwargs; a repeated keyword (a SyntaxError to Python)
                    return None
                members[kw.arg] = _py_json(kw.value, src)
        except (ValueError, RecursionError):
            return None
        args = "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + v for k, v in members.items()) + "}"
        calls.append(ToolCall(name, args))
    return calls or None


def _dotted(node) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return None if head is None else head + "." + node.attr
    return None


def _py_json(node, src: str) -> str:
    """A Python literal's node as compact JSON text; ValueError for anything JSON cannot hold
    (tuples, sets, bytes, complex numbers, names, calls, a lone surrogate)."""
    if isinstance(node, ast.Constant):
        v = node.value
        if v is None or isinstance(v, bool):
            return {None: "null", True: "true", False: "false"}[v]
        if isinstance(v, str):
            if any("\ud800" <= c <= "\udfff" for c in v):
                raise ValueError("a lone surrogate")
            return json.dumps(v, ensure_ascii=False)
        if isinstance(v, (int, float)):
            return _number(node, v, src)
        raise ValueError(f"{type(v).__name__} is not JSON")
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)) and isinstance(
            node.operand, ast.Constant) and type(node.operand.value) in (int, float):
        v = node.operand.value
        return _number(node, -v if isinstance(node.op, ast.USub) else v, src)
    if isinstance(node, ast.List):
        return "[" + ",".join(_py_json(x, src) for x in node.elts) + "]"
    if isinstance(node, ast.Dict):
        members = {}
        for k, v in zip(node.keys, node.values):
            if not (isinstance(k, ast.Constant) and isinstance(k.value, str)):
                raise ValueError("a dict key that is not a string")
            members[k.value] = _py_json(v, src)
        return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + v for k, v in members.items()) + "}"
    raise ValueError(f"{type(node).__name__} is not a literal")


def _number(node, value, src: str) -> str:
    """A number as written where JSON spells it alike (`1e999` stays `1e999`, not Infinity),
    else its value (`0x1F`, `1_000`, `.5`)."""
    seg = ast.get_source_segment(src, node)
    if seg is not None and _JSON_NUMBER.fullmatch(seg):
        return seg
    out = json.dumps(value, allow_nan=False)  # ValueError for inf/nan
    return out
