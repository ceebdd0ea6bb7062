"""A Python function -> the JSON Schema of its arguments, and back from JSON values to Python.

A tool is a function plus a schema (STYLE.md); writing the schema by hand next to the function
is a second copy that drifts, so the schema is read off the function: its type hints say the
types, its defaults say what is optional, its docstring says what the tool and each argument do.

    def read_file(path: str, limit: int = 2000) -> str:
        '''Read a text file of the workspace.

        Args:
            path: the file, relative to the workspace.
            limit: the most characters returned.
        '''

    -> {"type": "object",
        "properties": {"path": {"type": "string", "description": "the file, ..."},
                       "limit": {"type": "integer", "default": 2000, "description": "..."}},
        "required": ["path"]}

Types understood: str, int, float, bool, None, list[T] / tuple[T, ...], Literal[...], Enum
subclasses, Optional[T] / T | None (anyOf with null), Annotated[T, "description"] (and
Annotated[T, {"pattern": ...}]: a dict's JSON Schema keywords join the type's), and pydantic
models (their own `model_json_schema()`, with `$defs` hoisted to the top). Anything else is an
error that names the parameter and its type, because a guessed schema would be a grammar that
spells calls the function cannot take.
"""

from __future__ import annotations

import enum
import inspect
import re
import types
import typing
from typing import Any, Callable

from railcall.errors import GrammarError

_SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null"}


def function_schema(fn: Callable) -> tuple[str, dict]:
    """(description, parameters schema) of `fn`, read from its signature and docstring."""
    summary, arg_docs = parse_docstring(inspect.getdoc(fn) or "")
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as e:  # an unresolvable forward reference
        raise GrammarError(f"tool {fn.__name__!r}: cannot read its type hints ({e})") from None
    props: dict[str, dict] = {}
    required: list[str] = []
    defs: dict[str, dict] = {}
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise GrammarError(f"tool {fn.__name__!r}: *{p.name} has no schema; name every argument")
        if p.name not in hints:
            raise GrammarError(f"tool {fn.__name__!r}: argument {p.name!r} needs a type hint (e.g. `{p.name}: str`)")
        try:
            schema = type_schema(hints[p.name], defs)
        except GrammarError as e:
            raise GrammarError(f"tool {fn.__name__!r}, argument {p.name!r}: {e}") from None
        if p.name in arg_docs and "description" not in schema:
            schema["description"] = arg_docs[p.name]
        if p.default is p.empty:
            required.append(p.name)
        elif _jsonable(p.default):
            schema["default"] = p.default
        props[p.name] = schema
    params: dict[str, Any] = {"type": "object", "properties": props, "required": required}
    if defs:
        params["$defs"] = defs
    return summary, params


def type_schema(tp, defs: dict) -> dict:
    """The JSON Schema of one annotation; pydantic models put their sub-models into `defs`."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        schema = type_schema(args[0], defs)
        notes = [a for a in args[1:] if isinstance(a, str)]
        if notes:
            schema["description"] = " ".join(notes)
        for extra in (a for a in args[1:] if isinstance(a, dict)):  # JSON Schema keywords: {"pattern": ...}
            schema.update(extra)
        return schema
    if tp in _SCALARS:
        return {"type": _SCALARS[tp]}
    if tp is Any:
        return {}
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin in (typing.Union, types.UnionType):
        alts = [type_schema(a, defs) for a in args]
        return alts[0] if len(alts) == 1 else {"anyOf": alts}
    if origin in (list, tuple) or tp in (list, tuple):
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            raise GrammarError(f"{tp} has a fixed shape; use tuple[T, ...] or list[T]")
        return {"type": "array", "items": type_schema(args[0], defs) if args else {}}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"enum": [m.value for m in tp]}
    if isinstance(tp, type) and hasattr(tp, "model_json_schema"):  # a pydantic model
        schema = tp.model_json_schema(ref_template="#/$defs/{model}")
        defs.update(schema.pop("$defs", {}))
        return schema
    raise GrammarError(f"type {tp!r} has no JSON Schema here; use str, int, float, bool, list[T], "
                       "Literal, an Enum, Optional[T] or a pydantic model")


def to_python(tp, value):
    """A JSON argument value as the function's annotation asks for it (Enum members, pydantic
    models, tuples); plain JSON types pass through."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        return to_python(args[0], value)
    if value is None:
        return None
    if origin in (typing.Union, types.UnionType):
        for a in args:
            if a is not type(None):
                try:
                    return to_python(a, value)
                except Exception:
                    continue
        return value
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(value)
    if isinstance(tp, type) and hasattr(tp, "model_validate"):
        return tp.model_validate(value)
    if (origin in (list, tuple)) and args and isinstance(value, list):
        items = [to_python(args[0], v) for v in value]
        return tuple(items) if origin is tuple else items
    return value


_SECTION = re.compile(r"^(Args|Arguments|Parameters|Params):\s*$")
_ARG_LINE = re.compile(r"^(\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """(summary, {argument: description}) from a Google-style docstring ("Args:" section, one
    `name: text` line per argument, continuation lines indented deeper)."""
    summary_lines, args, current, in_args, arg_indent = [], {}, None, False, None
    for line in doc.splitlines():
        stripped = line.strip()
        if _SECTION.match(stripped):
            in_args, current, arg_indent = True, None, None
            continue
        if not in_args:
            if not stripped and summary_lines:
                in_args = None  # the summary is the first paragraph
            if in_args is False:
                summary_lines.append(stripped)
            continue
        if not stripped:
            continue
        indent = len(line) - len(line.lstrip())
        if arg_indent is not None and indent < arg_indent:
            in_args = None  # a dedented line ("Returns:") starts another section
            continue
        m = _ARG_LINE.match(stripped)
        if m and (arg_indent is None or indent == arg_indent):
            arg_indent = indent
            current = m.group(1)
            args[current] = m.group(3).strip()
        elif current:
            args[current] = (args[current] + " " + stripped).strip()
    return " ".join(summary_lines).strip(), args


def _jsonable(v) -> bool:
    return v is None or isinstance(v, (str, int, float, bool))
