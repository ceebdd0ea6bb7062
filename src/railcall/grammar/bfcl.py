"""BFCL's parameter dialect -> JSON Schema, the way BFCL's own harness maps it.

BFCL writes `dict` for object, `float` for number, `tuple` for array, `any` for no constraint,
and (in its Java/JavaScript categories) names such as `String`, `HashMap`, `long`, `ArrayList`.
It also marks optional parameters with `"optional": true` (an annotation; `required` is what
counts). The mapping is recursive through properties, items and additionalProperties.
"""

from __future__ import annotations

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
    # BFCL sometimes puts an items-level enum on the array itself (enum of strings, type array);
    # taken literally that allows no value at all, so it is moved to where it was meant.
    if out.get("type") == "array" and "enum" in out and not any(isinstance(x, list) for x in out["enum"]):
        out["items"] = {**out.get("items", {}), "enum": out.pop("enum")}
    return out


def bfcl_tools(functions: list[dict]):
    """BFCL `function` entries -> railcall Tools (names with dots are kept as they are)."""
    from railcall.grammar.tools import Tool

    return [Tool(f["name"], f.get("description", ""), bfcl_to_json_schema(f.get("parameters") or {"type": "dict"}))
            for f in functions]
