"""JSON Schema -> grammar IR.

The machine writes compact JSON with keys in declared order; the model chooses values. This
front end covers what tool arguments use: `type` (one or a list), `enum`, `const`, `properties`
with `required` (optional properties skippable, in order; no other keys), `items`,
`minItems`/`maxItems`, `minLength`/`maxLength`, integer `minimum`/`maximum` (and the exclusive
forms), `anyOf`/`oneOf` (as alternatives), `$ref` to `#/$defs/...` or `#/definitions/...`
(recursion included), and untyped values (any JSON value, depth-limited).

An unsupported keyword is an error naming the keyword and its JSON pointer; with `lenient=True`
it is ignored and reported through `warnings` instead. Annotations (`description`, `title`,
`default`, `examples`, ...) are always ignored.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

from railcall.errors import SchemaError
from railcall.grammar import ir

ANNOTATIONS = frozenset({
    "description", "title", "default", "examples", "$comment", "$schema", "$id", "deprecated",
    "readOnly", "writeOnly", "$defs", "definitions", "$anchor", "contentMediaType", "contentEncoding",
})
# Keywords that only matter for a type the schema does not allow are harmless; these are
# enforced where they apply.
HANDLED = frozenset({
    "type", "enum", "const", "properties", "required", "additionalProperties", "items",
    "minItems", "maxItems", "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", "anyOf", "oneOf", "$ref",
})

ANY_VALUE = "__any_json_value__"


@dataclass
class SchemaOptions:
    """How a schema becomes a grammar.

    required_nonempty: a required string argument must have at least one character (seed 000:
        an empty required argument is a missing one to every validator downstream).
    lenient: ignore unsupported keywords with a warning instead of failing.
    max_enum: the most enum/const choices accepted (a hostile schema must not take the process
        down).
    """

    required_nonempty: bool = True
    lenient: bool = False
    max_enum: int = 100_000
    max_depth: int = 64


@dataclass
class _Ctx:
    root: dict
    options: SchemaOptions
    rules: dict = field(default_factory=dict)  # rule name -> IR node (None while in progress)


def schema_to_ir(schema: dict, options: SchemaOptions | None = None, *, required: bool = False) -> tuple[ir.Node, tuple]:
    """Compile `schema`; returns (node, rules) for an ir.Grammar."""
    ctx = _Ctx(root=schema, options=options or SchemaOptions())
    node = _node(ctx, schema, "", required, 0)
    rules = tuple((k, v) for k, v in ctx.rules.items())
    return node, rules


def schema_grammar(schema: dict, options: SchemaOptions | None = None, name: str = "schema") -> ir.Grammar:
    node, rules = schema_to_ir(schema, options)
    return ir.Grammar(node, rules, name=name)


def _unsupported(ctx: _Ctx, keyword: str, pointer: str, why: str = "") -> None:
    msg = f"is not supported{': ' + why if why else ''}"
    if ctx.options.lenient:
        warnings.warn(f"railcall: ignoring keyword {keyword!r} at {pointer or '/'} ({msg})", stacklevel=3)
        return
    raise SchemaError(msg + "; pass lenient=True to ignore it", pointer=pointer, keyword=keyword)


def _node(ctx: _Ctx, schema, pointer: str, required: bool, depth: int) -> ir.Node:
    if depth > ctx.options.max_depth:
        raise SchemaError(f"nesting deeper than {ctx.options.max_depth} levels", pointer=pointer)
    if schema is True or schema == {}:
        return ir.Ref(_any_rule(ctx))
    if schema is False:
        raise SchemaError("the schema `false` allows no value", pointer=pointer)
    if not isinstance(schema, dict):
        raise SchemaError(f"a schema must be an object or a boolean, not {type(schema).__name__}", pointer=pointer)

    for k in schema:
        if k not in HANDLED and k not in ANNOTATIONS:
            _unsupported(ctx, k, pointer)

    if "$ref" in schema:
        others = [k for k in schema if k in HANDLED and k != "$ref"]
        if others:
            _unsupported(ctx, others[0], pointer, "next to $ref")
        return _ref(ctx, schema["$ref"], pointer + "/$ref", depth)

    if "const" in schema:
        return ir.const(schema["const"])
    if "enum" in schema:
        values = schema["enum"]
        if not isinstance(values, list) or not values:
            raise SchemaError("enum must be a non-empty array", pointer=pointer + "/enum", keyword="enum")
        if len(values) > ctx.options.max_enum:
            raise SchemaError(f"{len(values)} enum values exceed the limit of {ctx.options.max_enum}",
                              pointer=pointer + "/enum", keyword="enum")
        allowed = _types(ctx, schema, pointer)
        if allowed is not None:
            values = [v for v in values if _json_type(v) in allowed or (_json_type(v) == "integer" and "number" in allowed)]
            if not values:
                raise SchemaError("no enum value has an allowed type", pointer=pointer + "/enum", keyword="enum")
        return ir.enum(values)

    for kw in ("anyOf", "oneOf"):
        if kw in schema:
            branches = schema[kw]
            if not isinstance(branches, list) or not branches:
                raise SchemaError(f"{kw} must be a non-empty array", pointer=pointer + "/" + kw, keyword=kw)
            base = {k: v for k, v in schema.items() if k not in (kw, "anyOf", "oneOf") and k not in ANNOTATIONS}
            alts = []
            for i, br in enumerate(branches):
                sub = {**base, **br} if isinstance(br, dict) and base else br
                alts.append(_node(ctx, sub, f"{pointer}/{kw}/{i}", required, depth + 1))
            return ir.Alt(*alts)

    types = _types(ctx, schema, pointer)
    if types is None:
        types = _infer_types(schema)
    alts = [_typed(ctx, schema, t, pointer, required, depth) for t in types]
    return alts[0] if len(alts) == 1 else ir.Alt(*alts)


_ALL_TYPES = ("object", "array", "string", "number", "boolean", "null")


def _types(ctx: _Ctx, schema: dict, pointer: str) -> list[str] | None:
    t = schema.get("type")
    if t is None:
        return None
    ts = [t] if isinstance(t, str) else t
    if not isinstance(ts, list) or not ts:
        raise SchemaError("type must be a string or a non-empty array of strings", pointer=pointer + "/type", keyword="type")
    for x in ts:
        if x not in _ALL_TYPES + ("integer",):
            raise SchemaError(f"unknown type {x!r} (expected one of {', '.join(_ALL_TYPES + ('integer',))})",
                              pointer=pointer + "/type", keyword="type")
    if "number" in ts and "integer" in ts:
        ts = [x for x in ts if x != "integer"]
    return list(dict.fromkeys(ts))


def _infer_types(schema: dict) -> list[str]:
    if any(k in schema for k in ("properties", "required", "additionalProperties")):
        return ["object"]
    if any(k in schema for k in ("items", "minItems", "maxItems")):
        return ["array"]
    if any(k in schema for k in ("minLength", "maxLength")):
        return ["string"]
    if any(k in schema for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")):
        return ["number"]
    return list(_ALL_TYPES)


def _json_type(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "integer" if v.is_integer() else "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object"


def _int_kw(schema: dict, kw: str, pointer: str) -> int | None:
    v = schema.get(kw)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or (isinstance(v, float) and not v.is_integer()):
        raise SchemaError(f"{kw} must be a non-negative integer, not {v!r}", pointer=pointer + "/" + kw, keyword=kw)
    return int(v)


def _typed(ctx: _Ctx, schema: dict, t: str, pointer: str, required: bool, depth: int) -> ir.Node:
    if t == "null":
        return ir.Lit(b"null")
    if t == "boolean":
        return ir.Select(((b"true", ir.Seq()), (b"false", ir.Seq())))
    if t == "string":
        lo = _int_kw(schema, "minLength", pointer) or 0
        hi = _int_kw(schema, "maxLength", pointer)
        if hi is not None and lo > hi:
            raise SchemaError(f"minLength {lo} > maxLength {hi}: no string fits", pointer=pointer, keyword="minLength")
        if required and ctx.options.required_nonempty:
            lo = max(lo, 1) if hi is None or hi >= 1 else lo
        return ir.JsonString(lo, hi)
    if t == "integer":
        return ir.JsonInteger(*_int_bounds(schema, pointer))
    if t == "number":
        bounds = [k for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum") if k in schema]
        if bounds:
            _unsupported(ctx, bounds[0], pointer, "bounds on non-integer numbers are not enforced")
        return ir.JsonNumber()
    if t == "array":
        items = schema.get("items", True)
        if isinstance(items, list):
            _unsupported(ctx, "items", pointer, "tuple-form items (use prefixItems)")
            items = True
        item = _node(ctx, items, pointer + "/items", False, depth + 1)
        lo = _int_kw(schema, "minItems", pointer) or 0
        hi = _int_kw(schema, "maxItems", pointer)
        if hi is not None and lo > hi:
            raise SchemaError(f"minItems {lo} > maxItems {hi}: no array fits", pointer=pointer, keyword="minItems")
        return ir.JsonArray(item, lo, hi)
    if t == "object":
        return _object(ctx, schema, pointer, depth)
    raise SchemaError(f"unknown type {t!r}", pointer=pointer, keyword="type")


def _int_bounds(schema: dict, pointer: str) -> tuple[int | None, int | None]:
    import math

    lo = hi = None
    for kw, is_lo, exclusive in (("minimum", True, False), ("maximum", False, False),
                                 ("exclusiveMinimum", True, True), ("exclusiveMaximum", False, True)):
        v = schema.get(kw)
        if v is None or isinstance(v, bool):
            continue
        if not isinstance(v, (int, float)):
            raise SchemaError(f"{kw} must be a number, not {v!r}", pointer=pointer + "/" + kw, keyword=kw)
        if is_lo:
            b = math.floor(v) + 1 if exclusive and float(v).is_integer() else math.ceil(v)
            if exclusive and not float(v).is_integer():
                b = math.ceil(v)
            lo = b if lo is None else max(lo, b)
        else:
            b = math.ceil(v) - 1 if exclusive and float(v).is_integer() else math.floor(v)
            if exclusive and not float(v).is_integer():
                b = math.floor(v)
            hi = b if hi is None else min(hi, b)
    if lo is not None and hi is not None and lo > hi:
        raise SchemaError(f"no integer lies between the bounds ({lo} > {hi})", pointer=pointer, keyword="minimum")
    return lo, hi


def _object(ctx: _Ctx, schema: dict, pointer: str, depth: int) -> ir.Node:
    props = schema.get("properties", {})
    if not isinstance(props, dict):
        raise SchemaError("properties must be an object", pointer=pointer + "/properties", keyword="properties")
    req = schema.get("required", [])
    if not isinstance(req, list):
        raise SchemaError("required must be an array of names", pointer=pointer + "/required", keyword="required")
    missing = [r for r in req if r not in props]
    if missing:
        # A required name without a schema must still be written; any value is allowed there.
        props = {**props, **{r: True for r in missing}}
    ap = schema.get("additionalProperties", None)
    if ap not in (None, False) and not props:
        _unsupported(ctx, "additionalProperties", pointer, "free-form keys (only declared properties are written)")
    out = []
    for name, sub in props.items():
        is_req = name in req
        node = _node(ctx, sub, f"{pointer}/properties/{_esc(name)}", is_req, depth + 1)
        out.append((name, node, is_req))
    return ir.JsonObject(tuple(out))


def _esc(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def _ref(ctx: _Ctx, ref, pointer: str, depth: int) -> ir.Node:
    if not isinstance(ref, str) or not ref.startswith("#"):
        raise SchemaError(f"only local references (#/...) are supported, not {ref!r}", pointer=pointer, keyword="$ref")
    name = "ref:" + ref
    if name not in ctx.rules:
        target = _resolve_pointer(ctx.root, ref[1:], pointer)
        ctx.rules[name] = None  # in progress: a recursive reference sees the rule name
        ctx.rules[name] = _node(ctx, target, ref[1:], False, depth + 1)
    return ir.Ref(name)


def _resolve_pointer(root, ptr: str, pointer: str):
    cur = root
    if ptr in ("", "/"):
        return root
    for part in ptr.lstrip("/").split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            raise SchemaError(f"$ref target #{ptr} does not exist", pointer=pointer, keyword="$ref")
    return cur


def _any_rule(ctx: _Ctx) -> str:
    """A rule for any JSON value (compact), recursion bounded by the matcher's depth limit."""
    if ANY_VALUE not in ctx.rules:
        v = ir.Ref(ANY_VALUE)
        s = ir.JsonString(0, None)
        member = ir.Seq(s, ir.Lit(b":"), v)
        obj = ir.Alt(ir.Lit(b"{}"), ir.Seq(ir.Lit(b"{"), member, ir.Ref(ANY_VALUE + "obj"), ir.Lit(b"}")))
        ctx.rules[ANY_VALUE] = ir.Alt(
            s, ir.JsonNumber(), ir.Select(((b"true", ir.Seq()), (b"false", ir.Seq()), (b"null", ir.Seq()))),
            ir.JsonArray(v, 0, None), obj,
        )
        ctx.rules[ANY_VALUE + "obj"] = ir.Alt(ir.Seq(), ir.Seq(ir.Seq(ir.Lit(b","), member), ir.Ref(ANY_VALUE + "obj")))
    return ANY_VALUE

