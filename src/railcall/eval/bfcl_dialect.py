"""BFCL's parameter dialect -> JSON Schema, the way BFCL's own harness maps it.

BFCL writes `dict` for object, `float` for number, `tuple` for array, and (in its Java/JavaScript
categories) names such as `String`, `HashMap`, `long`, `ArrayList`. `any` becomes a string, as
BFCL's harness sends it to models and as its checker expects it (a value of type `any` must be a
string). Optional parameters are marked `"optional": true` (an annotation; `required` is what
counts). The mapping is recursive through properties, items and additionalProperties.

In the Java and JavaScript categories BFCL asks for every parameter as a string in the
language's own syntax: `bfcl_tools(..., language="java")` makes each parameter a string and adds
BFCL's hints to the descriptions (what type the string stands for, and the element type of a list).
"""

from __future__ import annotations

import json

_TYPES = {
    "dict": "object", "object": "object", "HashMap": "object", "Hashtable": "object", "Map": "object",
    "float": "number", "number": "number", "double": "number", "Double": "number", "Float": "number",
    "integer": "integer", "int": "integer", "long": "integer", "Long": "integer", "short": "integer",
    "byte": "integer", "Integer": "integer", "BigInteger": "integer",
    "string": "string", "String": "string", "char": "string", "Character": "string",
    "boolean": "boolean", "Boolean": "boolean", "bool": "boolean",
    "array": "array", "tuple": "array", "ArrayList": "array", "List": "array", "Array": "array", "Set": "array",
    "null": "null",
}
_DROP = {"optional", "default", "format"}  # annotations, and formats BFCL's checker never enforces


def _has_type(value, kind: str) -> bool:
    if kind == "integer":
        return type(value) is int
    if kind == "number":
        return type(value) in (int, float)
    return {"string": str, "boolean": bool, "object": dict, "null": type(None)}.get(kind, object) is type(value)


def bfcl_to_json_schema(schema):
    """Map one BFCL parameter schema (usually the `parameters` object) to JSON Schema."""
    if not isinstance(schema, dict):
        return schema
    out = {}
    for k, v in schema.items():
        if k in _DROP:
            continue
        if k == "type":
            if v == "any":
                out["type"] = "string"
                continue
            out["type"] = _TYPES.get(v, v) if isinstance(v, str) else [_TYPES.get(x, x) for x in v]
        elif k == "properties" and isinstance(v, dict):
            out[k] = {name: bfcl_to_json_schema(p) for name, p in v.items()}
        elif k in ("items", "additionalProperties") and isinstance(v, dict):
            out[k] = bfcl_to_json_schema(v)
        elif k in ("anyOf", "oneOf", "allOf") and isinstance(v, list):
            out[k] = [bfcl_to_json_schema(x) for x in v]
        else:
            out[k] = v
    # BFCL sometimes declares a type none of its enum's values has (a "boolean" whose enum is
    # "True", "False", "dontcare"); its checker then accepts the enum's own type (the gold
    # answers are those strings), so the enum decides and the declared type is dropped.
    if isinstance(out.get("type"), str) and isinstance(out.get("enum"), list) and out["enum"] and \
            not any(_has_type(x, out["type"]) for x in out["enum"]) and out["type"] != "array":
        del out["type"]
    # BFCL sometimes puts an items-level enum on the array itself (enum of strings, type array);
    # taken literally that allows no value at all, so it is moved to where it was meant.
    if out.get("type") == "array" and "enum" in out and not any(isinstance(x, list) for x in out["enum"]):
        out["items"] = {**out.get("items", {}), "enum": out.pop("enum")}
    return out


_LANGUAGE_NAME = {"java": "Java", "javascript": "JavaScript"}
_SYNTAX_HINT = {"java": " Note that the provided function is in Java 8 SDK syntax.",
                "javascript": " Note that the provided function is in JavaScript syntax."}


def as_strings(parameters: dict, language: str) -> dict:
    """A Java/JavaScript parameters object with every parameter a string in that language's syntax,
    its declared type (and a list's element type) said in its description, as BFCL's harness asks."""
    lang = _LANGUAGE_NAME[language]
    props = {}
    for name, p in (parameters.get("properties") or {}).items():
        p = dict(p) if isinstance(p, dict) else {}
        kind = p.get("type", "any")
        desc = str(p.get("description", ""))
        if kind == "any":
            desc += f" This parameter can be of any type of {lang} object in string representation."
        else:
            desc += f" This is {lang} {kind} type parameter in string representation."
        if kind in ("ArrayList", "Array", "array") and isinstance(p.get("items"), dict):
            desc += f" The list elements are of type {p['items'].get('type')}; they are not in string representation."
        if language == "javascript" and kind == "dict" and isinstance(p.get("properties"), dict):
            desc += (" The dictionary entries have the following schema; they are not in string representation. "
                     + json.dumps(p["properties"]))
        props[name] = {"type": "string", "description": desc}
    out = {"type": "object", "properties": props}
    if parameters.get("required"):
        out["required"] = list(parameters["required"])
    return out


def bfcl_tools(functions: list[dict], language: str = "python"):
    """BFCL `function` entries -> railcall Tools (names with dots are kept as they are). In the
    Java and JavaScript categories (`language`) every parameter is a string (`as_strings`)."""
    from railcall.grammar.tools import Tool

    tools = []
    for f in functions:
        params = f.get("parameters") or {"type": "dict"}
        if language in _LANGUAGE_NAME:
            tools.append(Tool(f["name"], f.get("description", "") + _SYNTAX_HINT[language], as_strings(params, language)))
        else:
            tools.append(Tool(f["name"], f.get("description", ""), bfcl_to_json_schema(params)))
    return tools
