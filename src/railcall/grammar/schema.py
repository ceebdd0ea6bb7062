"""JSON Schema -> grammar IR.

The machine writes compact JSON (or, as an option, JSON with bounded whitespace) with keys in
declared order; the model chooses values. Covered (draft 2020-12; the root's `$schema` selects
draft-04, -06, -07 or 2019-09 instead, see _dialect):

    type (one or a list)   enum, const            anyOf; oneOf where the branches are disjoint
    allOf (merged)         $ref to #..., $defs / definitions, recursion included ($ref with
                           siblings is merged like allOf; up to draft-07 the siblings are ignored)
    strings: minLength, maxLength, pattern (an ECMA regex subset, see railcall.grammar.regex),
             format (date, time, date-time, email, uuid, uri, ipv4, ipv6, hostname)
    integers and numbers: minimum, maximum, exclusiveMinimum, exclusiveMaximum (draft-04
             booleans too); bounded numbers are written without an exponent, bounded
             integers with at most 23 digits (a bound past that is clamped to it)
    arrays: items, prefixItems (draft-07 `items: [...]` + additionalItems), minItems, maxItems
    objects: properties, required, additionalProperties (false, true, a schema),
             patternProperties (up to 5 patterns: undeclared keys split by which patterns they
             match), propertyNames (pattern, minLength, maxLength), minProperties/maxProperties
             where the count is determined by the undeclared members

Two defaults are tighter than JSON Schema, because they make better generation (the model gets
fewer ways to go wrong) and are what tool authors mean: an object that declares `properties` is
written with those properties only unless `additionalProperties` says otherwise (so a tool
without parameters, `"properties": {}`, takes `{}`), and a schema without `type` is read as the
type its keywords imply (`properties` -> object). An object without `properties` is free-form. `SchemaOptions(standard=True)` switches both to JSON
Schema's own semantics (the coverage runner, docs/schema-coverage.md, uses it).

`enum` and `const` offer only the values that satisfy every other keyword that applies to them
(siblings, and what allOf/$ref/anyOf merge in), checked as JSON Schema reads the schema.
OpenAPI's `nullable: true` beside a `type` adds null to it.

A JSON Schema assertion railcall does not enforce (UNENFORCED: `not`, `if`, `multipleOf`, ...)
or an unsatisfiable schema is a SchemaError naming the keyword and its JSON pointer (marked
`empty` where no value fits: an optional property or an anyOf branch that is so is left out);
with `lenient=True` an unenforced keyword is ignored and reported through `warnings` instead.
Every other keyword railcall does not know is an annotation and always ignored, as JSON Schema
says (`description`, `x-*` extensions, `example`, ...), as is a `format` railcall does not know
(format is an annotation in JSON Schema 2020-12), with a warning. Hostile schemas hit limits,
each a clear error: nesting depth, enum size, pattern size and automaton size, and a
compile-time budget.
"""

from __future__ import annotations

import json
import math
import time
import warnings
from dataclasses import dataclass, field

from railcall.errors import GrammarError, SchemaError
from railcall.grammar import ir
from railcall.grammar.regex import RegexError, compile_pattern

ANNOTATIONS = frozenset({
    "description", "title", "default", "examples", "$comment", "$schema", "$id", "deprecated",
    "readOnly", "writeOnly", "$defs", "definitions", "$anchor", "contentMediaType", "contentEncoding",
    "contentSchema", "$vocabulary", "$dynamicAnchor", "$recursiveAnchor",
})
# JSON Schema's assertions and applicators (2020-12 and the drafts before it) that railcall does
# not enforce: each is a SchemaError naming it (or, lenient, ignored with a warning). Any other
# keyword railcall does not know is an annotation and ignored, as the specification says (`self`
# in Snowplow schemas, OpenAPI's `x-*` extensions and `example`, draft-04's `id`, ...).
UNENFORCED = frozenset({
    "not", "divisibleBy", "if", "then", "else", "contains", "minContains", "maxContains",
    "dependentRequired", "dependentSchemas", "dependencies", "unevaluatedProperties", "unevaluatedItems",
    "$dynamicRef", "$recursiveRef", "extends", "disallow",
})
# Keywords railcall enforces. Those that only matter for a type the schema does not allow are
# harmless and enforced where they apply.
HANDLED = frozenset({
    "type", "enum", "const", "properties", "required", "additionalProperties", "items", "prefixItems",
    "additionalItems", "minItems", "maxItems", "minLength", "maxLength", "pattern", "format", "minimum",
    "maximum", "exclusiveMinimum", "exclusiveMaximum", "anyOf", "oneOf", "allOf", "$ref",
    "minProperties", "maxProperties", "uniqueItems", "patternProperties", "propertyNames", "multipleOf",
})

ANY_VALUE = "__any_json_value__"
# The strings a `not: {"enum": [...]}` excludes, as the schema's own keyword once `_handled` has
# read it (a key no user schema can reach: `_handled` keeps only HANDLED keywords before adding it).
NOT_STRINGS = "__not_strings__"

# Each format as a regex over the string's value (anchored). Not expressed: leap seconds at UTC
# offsets other than zero, hostname length limits and IDN rules.
_OCTET = r"(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_IPV4 = rf"{_OCTET}(\.{_OCTET}){{3}}"
_H16 = r"[0-9a-fA-F]{1,4}"
_LS32 = rf"({_H16}:{_H16}|{_IPV4})"
_IPV6 = "(" + "|".join([
    rf"({_H16}:){{6}}{_LS32}",
    rf"::({_H16}:){{5}}{_LS32}",
    rf"({_H16})?::({_H16}:){{4}}{_LS32}",
    rf"(({_H16}:)?{_H16})?::({_H16}:){{3}}{_LS32}",
    rf"(({_H16}:){{0,2}}{_H16})?::({_H16}:){{2}}{_LS32}",
    rf"(({_H16}:){{0,3}}{_H16})?::{_H16}:{_LS32}",
    rf"(({_H16}:){{0,4}}{_H16})?::{_LS32}",
    rf"(({_H16}:){{0,5}}{_H16})?::{_H16}",
    rf"(({_H16}:){{0,6}}{_H16})?::",
]) + ")"
# Days per month, and 29 February only in leap years (divisible by 4, centuries by 400).
_LEAP_YEAR = r"(\d\d(0[48]|[2468][048]|[13579][26])|([02468][048]|[13579][26])00)"
_DATE = (r"(\d{4}-((0[13578]|1[02])-(0[1-9]|[12]\d|3[01])|(0[469]|11)-(0[1-9]|[12]\d|30)|02-(0[1-9]|1\d|2[0-8]))"
         rf"|{_LEAP_YEAR}-02-29)")
# A leap second only where it can be one: 23:59:60 in UTC (other offsets are not expressed).
_OFFSET = r"([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d)"
_TIME = (rf"(([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d+)?{_OFFSET}"
         r"|23:59:60(\.\d+)?([Zz]|[+-]00:00))")
_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]"
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST = rf"{_LABEL}(\.{_LABEL})*"
# RFC 3986: scheme ":" hier-part ["?" query] ["#" fragment], percent-encoding checked.
_PCT = r"%[0-9A-Fa-f]{2}"
_UNRES = r"[A-Za-z0-9\-._~!$&'()*+,;=]"
_PCHAR = rf"({_UNRES}|{_PCT}|[:@])"
_AUTHORITY = rf"(({_UNRES}|{_PCT}|:)*@)?(\[{_IPV6}\]|({_UNRES}|{_PCT})*)(:\d*)?"
_URI = (rf"[A-Za-z][A-Za-z0-9+.\-]*:(//{_AUTHORITY}(/{_PCHAR}*)*|/({_PCHAR}+(/{_PCHAR}*)*)?|{_PCHAR}+(/{_PCHAR}*)*)?"
        rf"(\?({_PCHAR}|[/?])*)?(#({_PCHAR}|[/?])*)?")
FORMATS = {
    "date": rf"^{_DATE}$",
    "time": rf"^{_TIME}$",
    "date-time": rf"^{_DATE}[Tt]{_TIME}$",
    "email": rf'^({_ATEXT}+(\.{_ATEXT}+)*|"([^"\\]|\\.)*")@({_HOST}|\[({_IPV4}|IPv6:{_IPV6})\])$',
    "uuid": r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$",
    "uri": rf"^{_URI}$",
    "ipv4": rf"^{_IPV4}$",
    "ipv6": rf"^{_IPV6}$",
    "hostname": rf"^{_HOST}$",
}


@dataclass
class SchemaOptions:
    """How a schema becomes a grammar.

    required_nonempty: a required string argument must have at least one character (an
        empty required argument is a missing one to every validator downstream).
    lenient: ignore unsupported keywords with a warning instead of failing.
    standard: JSON Schema's own semantics instead of railcall's generation defaults (see the
        module docstring): undeclared properties allowed unless forbidden, untyped schemas admit
        every type, no non-empty rule for required strings.
    whitespace: 0 writes compact JSON; n > 0 allows up to n whitespace bytes around each
        structural character (never unbounded, so a model cannot loop on whitespace).
    max_enum, max_enum_bytes, max_depth, max_pattern, max_min_items, time_budget_s: limits that
        keep a hostile schema from taking the process down, each a clear error (max_enum_bytes:
        the JSON text of one enum's values together, each byte of which costs ~270 B compiled, as
        a trie; max_min_items: the largest minItems accepted; an array that long could not be
        finished within any token budget). A whole grammar is bounded too
        (grammar.program.MAX_GRAMMAR_BYTES).
    """

    required_nonempty: bool = True
    lenient: bool = False
    standard: bool = False
    whitespace: int = 0
    max_enum: int = 100_000
    max_enum_bytes: int = 128 << 10
    max_depth: int = 64
    max_pattern: int = 4_096
    max_min_items: int = 4_096
    time_budget_s: float = 10.0


@dataclass
class _Ctx:
    root: dict
    options: SchemaOptions
    deadline: float
    rules: dict = field(default_factory=dict)  # rule name -> IR node (None while in progress)
    docs: dict = field(default_factory=dict)  # base URI -> the subschema that has that $id
    anchors: dict = field(default_factory=dict)  # (base URI, $anchor) -> subschema
    base_of: dict = field(default_factory=dict)  # id(subschema) -> its base URI
    root_base: str = ""
    indexed: bool = False  # docs, anchors and base_of filled (on the first $ref: see _resolve_ref)
    dialect: int = 2020  # 4, 6, 7, 2019 or 2020: the root's `$schema` (see _dialect)


_NOT_SCHEMAS = frozenset({"enum", "const", "default", "examples"})

# The shape each keyword's value must have, checked before anything reads it.
_SHAPES = {
    "properties": (dict, "an object of schemas"), "$defs": (dict, "an object of schemas"),
    "definitions": (dict, "an object of schemas"), "required": (list, "an array of names"),
    "enum": (list, "an array"), "prefixItems": (list, "an array of schemas"), "allOf": (list, "an array of schemas"),
    "anyOf": (list, "an array of schemas"), "oneOf": (list, "an array of schemas"),
    "items": ((dict, bool, list), "a schema"), "additionalItems": ((dict, bool), "a schema"),
    "additionalProperties": ((dict, bool), "a schema"), "type": ((str, list), "a type name or an array of them"),
    "patternProperties": (dict, "an object of schemas"), "propertyNames": ((dict, bool), "a schema"),
    "$ref": (str, "a URI reference"), "pattern": ((str, tuple), "a regular expression"), "format": (str, "a format name"),
    "uniqueItems": (bool, "a boolean"),
}


_NUMERIC_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength", "minItems",
                     "maxItems", "minProperties", "maxProperties")  # in the order their errors are reported


def _check_shapes(schema: dict, pointer: str) -> None:
    """A keyword whose value has the wrong type is a SchemaError. The schema's own few keys are
    checked first (every schema node is, and most are well formed); only a wrong one runs the
    checks in their fixed order, so the error reported does not depend on key order."""
    for k, v in schema.items():
        spec = _SHAPES.get(k)
        if spec is not None and not isinstance(v, spec[0]):
            break
        if k in _NUMERIC_KEYWORDS and v is not None and not isinstance(v, (int, float)):
            break
        if k == "required" and not (isinstance(v, list) and all(isinstance(r, str) for r in v)):
            break
    else:
        return
    _shape_error(schema, pointer)


def _shape_error(schema: dict, pointer: str) -> None:
    for k, (types, what) in _SHAPES.items():
        if k in schema and not isinstance(schema[k], types):
            raise SchemaError(f"{k} must be {what}, not {schema[k]!r}", pointer=pointer + "/" + k, keyword=k)
    req = schema.get("required")
    if req is not None and not all(isinstance(r, str) for r in req):
        raise SchemaError("required must be an array of names (strings)", pointer=pointer + "/required", keyword="required")
    for k in _NUMERIC_KEYWORDS:
        v = schema.get(k)
        if v is not None and not isinstance(v, (int, float)):
            raise SchemaError(f"{k} must be a number, not {v!r}", pointer=pointer + "/" + k, keyword=k)


_DIALECTS = (("draft-04/", 4), ("draft-06/", 6), ("draft-07/", 7), ("2019-09/", 2019), ("2020-12/", 2020))


def _dialect(schema) -> int:
    """The dialect the root's `$schema` names (draft 2020-12 without one, or for one railcall does
    not know). It decides what a `$ref`'s siblings mean (ignored up to draft-07) and how a
    schema names itself (draft-04's `id`; up to draft-07, a `$id` of `#name` is an anchor)."""
    uri = schema.get("$schema") if isinstance(schema, dict) else None
    if isinstance(uri, str):
        for part, dialect in _DIALECTS:
            if part in uri + "/":
                return dialect
    return 2020


def _id_keyword(ctx: _Ctx) -> str:
    return "id" if ctx.dialect == 4 else "$id"


def _index(ctx: _Ctx, node, base: str) -> None:
    """Record every subschema's base URI, every `$id` and every `$anchor`, so that `$ref`s
    resolve the way 2020-12 says: against the nearest enclosing `$id` (draft-04: `id`; up to
    draft-07 an id that is only a fragment, `#name`, is an anchor)."""
    from urllib.parse import urldefrag, urljoin

    id_kw = _id_keyword(ctx)

    # A loop over an explicit stack, not recursion: this walks the whole document before any
    # depth limit applies (a subschema under $defs is compiled only if referenced), and a
    # document can nest thousands deep.
    root_base = ctx.root_base
    todo = [(node, base)]
    while todo:
        node, base = todo.pop()
        if isinstance(node, list):
            for x in reversed(node):
                if isinstance(x, (dict, list)):
                    todo.append((x, base))
            continue
        if not isinstance(node, dict):
            continue
        sid = node.get(id_kw)
        if ctx.dialect <= 7 and "$ref" in node:
            sid = None  # up to draft-07 a $ref's siblings are ignored, its id among them: no new base
        if isinstance(sid, str) and ctx.dialect <= 7 and sid.startswith("#"):
            ctx.anchors[(base, sid[1:])] = node
        elif isinstance(sid, str):
            base = urldefrag(urljoin(base, sid))[0]
            ctx.docs.setdefault(base, node)
        if base != root_base:  # a lookup defaults to the document's own base
            ctx.base_of[id(node)] = base
        anchor = node.get("$anchor")
        if isinstance(anchor, str):
            ctx.anchors[(base, anchor)] = node
        for k, v in reversed(node.items()):
            if isinstance(v, (dict, list)) and k not in _NOT_SCHEMAS:
                todo.append((v, base))


def schema_to_ir(schema: dict, options: SchemaOptions | None = None, *, required: bool = False) -> tuple[ir.Node, tuple]:
    """Compile `schema`; returns (node, rules) for an ir.Grammar."""
    options = options or SchemaOptions()
    ctx = _Ctx(root=schema, options=options, deadline=time.monotonic() + options.time_budget_s, dialect=_dialect(schema))
    if isinstance(schema, dict):
        from urllib.parse import urldefrag

        sid = schema.get(_id_keyword(ctx))
        ctx.root_base = urldefrag(sid)[0] if isinstance(sid, str) and not sid.startswith("#") else ""
        ctx.docs[ctx.root_base] = schema
    try:
        node = _node(ctx, schema, "", required, 0)
    except RecursionError:
        raise SchemaError("the schema nests or merges too deeply to compile", keyword=None) from None
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
    raise SchemaError(msg, pointer=pointer, keyword=keyword, lenient="ignore")


def _handled(ctx: _Ctx, schema, pointer: str) -> dict:
    """The keywords railcall enforces, after checking the schema's shape; an assertion railcall
    does not enforce (UNENFORCED) is an error (or, lenient, a warning); every other keyword is
    an annotation and dropped. OpenAPI's `nullable: true` beside a `type` adds "null" to it."""
    if not isinstance(schema, dict):
        raise SchemaError(f"a schema must be an object or a boolean, not {type(schema).__name__}", pointer=pointer)
    if ctx.dialect <= 7 and "$ref" in schema:  # up to draft-07, a $ref's siblings are ignored
        schema = {"$ref": schema["$ref"]}
    excluded = _not_strings(schema.get("not"))
    for k in schema:
        if k in UNENFORCED and not (k == "not" and excluded is not None):
            _unsupported(ctx, k, pointer, "only `not` of an enum or const of strings is enforced" if k == "not" else "")
    _check_shapes(schema, pointer)
    out = {k: v for k, v in schema.items() if k in HANDLED or k == NOT_STRINGS}  # a merged schema read again
    if excluded:
        out[NOT_STRINGS] = tuple(dict.fromkeys([*out.get(NOT_STRINGS, ()), *excluded]))
    if schema.get("nullable") is True and isinstance(out.get("type"), (str, list)):
        # OpenAPI 3.0: null joins the types that `type` names (without a `type`, nullable adds
        # nothing); enum and the other keywords still apply to it.
        t = out["type"]
        out["type"] = [t, "null"] if isinstance(t, str) else list(dict.fromkeys([*t, "null"]))
    for ex, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(out.get(ex), bool):
            # Draft-04's boolean form, rewritten as the number form: the flag belongs to its own
            # schema's bound, and an allOf merge must not pair it with another branch's.
            if out.pop(ex) and bound in out:
                out[ex] = out.pop(bound)
    return out


def _not_strings(body) -> tuple | None:
    """The strings `not: {"enum": [...]}` or `not: {"const": ...}` excludes (annotations beside
    them aside), when each excluded value is a string; None for any other `not`. A value of
    another type is unaffected by such a `not`, so only strings need excluding."""
    if not isinstance(body, dict):
        return None
    asserted = {k: v for k, v in body.items() if k in HANDLED or k in UNENFORCED}
    if set(asserted) == {"enum"} and isinstance(asserted["enum"], list):
        values = asserted["enum"]
    elif set(asserted) == {"const"}:
        values = [asserted["const"]]
    else:
        return None
    if not all(isinstance(v, str) for v in values):
        return None
    return tuple(dict.fromkeys(values))


def _patterns(schema: dict) -> tuple:
    """The patterns a string must match: `pattern` (one, or several gathered by an allOf merge)."""
    p = schema.get("pattern")
    return () if p is None else p if isinstance(p, tuple) else (p,)


def _node(ctx: _Ctx, schema, pointer: str, required: bool, depth: int) -> ir.Node:
    if depth > ctx.options.max_depth:
        raise SchemaError(f"nesting deeper than {ctx.options.max_depth} levels", pointer=pointer, option="max_depth")
    if time.monotonic() > ctx.deadline:
        raise SchemaError(f"compiling took longer than the budget of {ctx.options.time_budget_s} s", pointer=pointer,
                          option="time_budget_s")
    if schema is True or schema == {}:
        return ir.Ref(_any_rule(ctx))
    if schema is False:
        raise SchemaError("the schema `false` allows no value", pointer=pointer, empty=True)
    orig = schema
    schema = _handled(ctx, schema, pointer)
    if not schema:
        return ir.Ref(_any_rule(ctx))

    if "$ref" in schema:
        rest = {k: v for k, v in schema.items() if k != "$ref"}
        if not rest:
            return _ref(ctx, schema["$ref"], pointer + "/$ref", depth, orig)
        # 2019-09 and 2020-12: a $ref beside other keywords applies both, like allOf (up to
        # draft-07 `_handled` has dropped them); properties keep the
        # order the schema writes them in (its own first where `properties` precedes `$ref`)
        target = _resolve_ref(ctx, schema["$ref"], pointer + "/$ref", orig)[1]
        parts = [rest, target] if _own_first(orig, "$ref") else [target, rest]
        return _node(ctx, {"allOf": parts}, pointer, required, depth + 1)

    if "allOf" in schema:
        merged = _merge_allof(ctx, schema, pointer, depth)
        return _node(ctx, merged, pointer, required, depth + 1)

    if "const" in schema or "enum" in schema:
        return _enum(ctx, schema, pointer, depth)

    for kw in ("anyOf", "oneOf"):
        if kw in schema:
            branches = schema[kw]
            if not isinstance(branches, list) or not branches:
                raise SchemaError(f"{kw} must be a non-empty array", pointer=pointer + "/" + kw, keyword=kw)
            base = {k: v for k, v in schema.items() if k != kw}
            branches = [br for br in branches if br is not False]  # `false` matches nothing
            if not branches:
                raise SchemaError(f"every {kw} branch is `false`: no value fits", pointer=pointer + "/" + kw, keyword=kw,
                                  empty=True)
            subs = [{"allOf": [base, br]} if base else br for br in branches]
            only = _one_of_types(ctx, branches) if kw == "oneOf" else None
            if only is not None:
                if not only:
                    raise SchemaError("every type oneOf allows is allowed by two of its branches: no value fits",
                                      pointer=pointer + "/oneOf", keyword="oneOf", empty=True)
                return _node(ctx, {"allOf": [base, {"type": only}]} if base else {"type": only}, pointer, required,
                             depth + 1)
            if kw == "oneOf" and not _pairwise_disjoint(ctx, branches, base):
                if not ctx.options.lenient:
                    raise SchemaError("oneOf branches that may overlap cannot be enforced exactly (a value "
                                      "matching two branches must be rejected); use anyOf, make the branches "
                                      "disjoint (distinct types or const values)", pointer=pointer + "/oneOf",
                                      keyword="oneOf", lenient="anyof")
                warnings.warn(f"railcall: treating oneOf at {pointer or '/'} as anyOf (branches may overlap)",
                              stacklevel=2)
            alts, empty = [], None
            for i, sub in enumerate(subs):
                try:
                    alts.append(_node(ctx, sub, f"{pointer}/{kw}/{i}", required, depth + 1))
                except SchemaError as e:  # a branch no value fits matches nothing: the others stand
                    if not e.empty:
                        raise
                    empty = empty or e
            if not alts:
                raise empty
            return alts[0] if len(alts) == 1 else ir.Alt(*alts)

    types = _types(ctx, schema, pointer)
    if types is None:
        types = list(_ALL_TYPES) if ctx.options.standard else _infer_types(schema)
    alts, empty = [], None
    for t in types:
        try:
            alts.append(_typed(ctx, schema, t, pointer, required, depth))
        except SchemaError as e:  # no value of this type fits: the other types stand
            if not e.empty or len(types) == 1:
                raise
            empty = empty or e
    if not alts:
        raise empty
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
    if any(k in schema for k in ("properties", "required", "additionalProperties", "minProperties", "maxProperties",
                                 "patternProperties", "propertyNames")):
        return ["object"]
    if any(k in schema for k in ("items", "prefixItems", "minItems", "maxItems")):
        return ["array"]
    if any(k in schema for k in ("minLength", "maxLength", "pattern", "format")):
        return ["string"]
    if any(k in schema for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")):
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


# -- enum and const ---------------------------------------------------------------------------------


def _enum(ctx: _Ctx, schema: dict, pointer: str, depth: int) -> ir.Node:
    """The listed values that satisfy every other assertion of `schema` (its siblings of
    `enum`/`const`, which an `allOf` or a `$ref` merged in, and an `anyOf`/`oneOf` beside them),
    as one choice of literals; a SchemaError (empty) if none does. The values are checked the
    way JSON Schema reads the schema (see `_admits`): a value the author listed is offered as
    written, so railcall's generation defaults do not apply to it."""
    if "const" in schema:
        values = [schema["const"]]
        if "enum" in schema:
            if not isinstance(schema["enum"], list) or not any(_json_equal(values[0], e) for e in schema["enum"]):
                raise SchemaError("const is not among the enum values: no value fits", pointer=pointer, keyword="const",
                                  empty=True)
    else:
        values = schema["enum"]
        if not isinstance(values, list):
            raise SchemaError("enum must be an array", pointer=pointer + "/enum", keyword="enum")
        if not values:
            raise SchemaError("an empty enum allows no value", pointer=pointer + "/enum", keyword="enum", empty=True)
    if len(values) > ctx.options.max_enum:
        raise SchemaError(f"{len(values)} enum values exceed the limit of {ctx.options.max_enum}",
                          pointer=pointer + "/enum", keyword="enum", option="max_enum")
    size = sum([len(v) + 2 if isinstance(v, str) else len(json.dumps(v)) for v in values])
    if size > ctx.options.max_enum_bytes:
        where = "enum" if "const" not in schema else "const"
        raise SchemaError(f"the {where} values are {size:,} bytes of JSON text together, over the limit of "
                          f"{ctx.options.max_enum_bytes:,}; use fewer or shorter values (a pattern can stand for a "
                          f"long list)", pointer=pointer + "/" + where, keyword=where, option="max_enum_bytes")
    allowed = _types(ctx, schema, pointer)
    if allowed is not None:
        values = [v for v in values if _json_type(v) in allowed or (_json_type(v) == "integer" and "number" in allowed)]
        if not values:
            raise SchemaError("no enum value has an allowed type", pointer=pointer + "/enum", keyword="enum",
                              empty=True)
    rest = {k: v for k, v in schema.items() if k not in ("enum", "const", "type")}
    if rest:
        values = [v for v in values if _admits(ctx, rest, v, pointer, depth)]
        if not values:
            kw = "const" if "const" in schema else "enum"
            raise SchemaError(f"no {kw} value satisfies the schema's other keywords ({', '.join(rest)}): no value fits",
                              pointer=pointer + "/" + kw, keyword=kw, empty=True)
    # A number equal to an integer has two plain spellings (1 and 1.0); JSON Schema counts them
    # as one value, so under standard semantics both are offered (by default only the one the
    # schema wrote: one spelling per value is what generation wants).
    spelled = []
    for v in values:
        spelled.append(v)
        if not ctx.options.standard:
            continue
        if isinstance(v, float) and v.is_integer() and abs(v) < 1e16:
            spelled.append(int(v))
        elif isinstance(v, int) and not isinstance(v, bool):
            spelled.append(float(v))
    try:
        return ir.enum(spelled)
    except GrammarError as e:
        raise SchemaError(str(e), pointer=pointer, keyword="const" if "const" in schema else "enum") from None


def _admits(ctx: _Ctx, schema, value, pointer: str, depth: int) -> bool:
    """Whether `value` (a JSON value, as json.loads gives it) satisfies `schema`, as JSON Schema
    reads it: each keyword constrains only the type it is about, undeclared properties are
    allowed unless the schema forbids them. Only enum and const values are checked this way (a
    handful of values, at compile time, never per token). A keyword railcall does not enforce is
    reported as it is where the grammar meets it (`_handled`)."""
    if schema is True:
        return True
    if schema is False:
        return False
    if depth > ctx.options.max_depth:
        raise SchemaError(f"nesting deeper than {ctx.options.max_depth} levels", pointer=pointer, option="max_depth")
    orig = schema
    s = _handled(ctx, schema, pointer)
    if "$ref" in s:
        target = _resolve_ref(ctx, s["$ref"], pointer + "/$ref", orig)[1]
        if not _admits(ctx, target, value, pointer + "/$ref", depth + 1):
            return False
    for i, br in enumerate(s.get("allOf", ())):
        if not _admits(ctx, br, value, f"{pointer}/allOf/{i}", depth + 1):
            return False
    if "anyOf" in s and not any(_admits(ctx, br, value, f"{pointer}/anyOf/{i}", depth + 1)
                                for i, br in enumerate(s["anyOf"])):
        return False
    if "oneOf" in s and sum(_admits(ctx, br, value, f"{pointer}/oneOf/{i}", depth + 1)
                            for i, br in enumerate(s["oneOf"])) != 1:
        return False
    if "const" in s and not _json_equal(s["const"], value):
        return False
    if "enum" in s and not any(_json_equal(e, value) for e in s["enum"]):
        return False
    kind = _json_type(value)
    types = _types(ctx, s, pointer)
    if types is not None and kind not in types and not (kind == "integer" and "number" in types):
        return False
    if kind in ("integer", "number"):
        lo, xlo, hi, xhi = _bounds(s, pointer)
        if lo is not None and (value < lo or (xlo and value == lo)):
            return False
        if hi is not None and (value > hi or (xhi and value == hi)):
            return False
        step = _multiple_of(s, pointer)
        if step is not None:
            from fractions import Fraction
            from decimal import Decimal

            return (Fraction(Decimal(str(value))) / Fraction(Decimal(step))).denominator == 1
    elif kind == "string":
        return _admits_string(ctx, s, value, pointer)
    elif kind == "array":
        return _admits_array(ctx, s, value, pointer, depth)
    elif kind == "object":
        return _admits_object(ctx, s, value, pointer, depth)
    return True


def _admits_string(ctx: _Ctx, s: dict, value: str, pointer: str) -> bool:
    n = len(value)  # code points, as JSON Schema counts
    if n < (_int_kw(s, "minLength", pointer) or 0):
        return False
    hi = _int_kw(s, "maxLength", pointer)
    if hi is not None and n > hi:
        return False
    if value in s.get(NOT_STRINGS, ()):
        return False
    for kw, regex in [*(("pattern", p) for p in _patterns(s)), ("format", FORMATS.get(s.get("format")))]:
        if regex is None:
            continue
        try:
            if not compile_pattern(regex, max(256, n)).matches(value):
                return False
        except RegexError as e:
            if not ctx.options.lenient:
                raise SchemaError(str(e), pointer=pointer + "/" + kw, keyword=kw) from None
    return True


def _admits_array(ctx: _Ctx, s: dict, value: list, pointer: str, depth: int) -> bool:
    if len(value) < (_int_kw(s, "minItems", pointer) or 0):
        return False
    hi = _int_kw(s, "maxItems", pointer)
    if hi is not None and len(value) > hi:
        return False
    if s.get("uniqueItems") is True and any(_json_equal(value[i], value[j]) for i in range(len(value))
                                           for j in range(i + 1, len(value))):
        return False
    prefix, items, kw = s.get("prefixItems", []), s.get("items", True), "items"
    if isinstance(items, list):  # draft-07 tuple form
        prefix, items, kw = items, s.get("additionalItems", True), "additionalItems"
    for i, x in enumerate(value):
        sub, where = (prefix[i], f"{pointer}/prefixItems/{i}") if i < len(prefix) else (items, f"{pointer}/{kw}")
        if not _admits(ctx, sub, x, where, depth + 1):
            return False
    return True


def _admits_object(ctx: _Ctx, s: dict, value: dict, pointer: str, depth: int) -> bool:
    if any(r not in value for r in s.get("required", ())):
        return False
    if len(value) < (_int_kw(s, "minProperties", pointer) or 0):
        return False
    hi = _int_kw(s, "maxProperties", pointer)
    if hi is not None and len(value) > hi:
        return False
    props, pprops = s.get("properties", {}), s.get("patternProperties", {})
    names = s.get("propertyNames", True)
    for key, x in value.items():
        if not _admits(ctx, names, key, pointer + "/propertyNames", depth + 1):
            return False
        hits = [p for p in pprops if _pattern_matches(ctx, p, key, f"{pointer}/patternProperties/{_esc(p)}")]
        if key in props and not _admits(ctx, props[key], x, f"{pointer}/properties/{_esc(key)}", depth + 1):
            return False
        for p in hits:
            if not _admits(ctx, pprops[p], x, f"{pointer}/patternProperties/{_esc(p)}", depth + 1):
                return False
        if key not in props and not hits and not _admits(ctx, s.get("additionalProperties", True), x,
                                                         pointer + "/additionalProperties", depth + 1):
            return False
    return True


def _pattern_matches(ctx: _Ctx, pattern: str, text: str, pointer: str) -> bool:
    try:
        return compile_pattern(pattern, max(256, len(text))).matches(text)
    except RegexError as e:
        raise SchemaError(str(e), pointer=pointer, keyword="patternProperties") from None


def _json_equal(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


# -- typed values ---------------------------------------------------------------------------------


def _typed(ctx: _Ctx, schema: dict, t: str, pointer: str, required: bool, depth: int) -> ir.Node:
    if t == "null":
        return ir.Lit(b"null")
    if t == "boolean":
        return ir.Select(((b"true", ir.Seq()), (b"false", ir.Seq())))
    if t == "string":
        return _string(ctx, schema, pointer, required)
    if t == "integer":
        lo, hi = _int_bounds(schema, pointer)
        step = _multiple_of(schema, pointer)
        if step is not None:
            _some_multiple(lo, hi, False, False, step, True, pointer)
        return ir.JsonInteger(lo, hi, multiple_of=step)
    if t == "number":
        return _number(schema, pointer)
    if t == "array":
        return _array(ctx, schema, pointer, depth)
    if t == "object":
        return _object(ctx, schema, pointer, depth)
    raise SchemaError(f"unknown type {t!r}", pointer=pointer, keyword="type")


def _string(ctx: _Ctx, schema: dict, pointer: str, required: bool) -> ir.Node:
    lo = _int_kw(schema, "minLength", pointer) or 0
    hi = _int_kw(schema, "maxLength", pointer)
    if hi is not None and lo > hi:
        raise SchemaError(f"minLength {lo} > maxLength {hi}: no string fits", pointer=pointer, keyword="minLength",
                          empty=True)
    if required and ctx.options.required_nonempty and not ctx.options.standard:
        lo = max(lo, 1) if hi is None or hi >= 1 else lo
    fmt = schema.get("format")
    if fmt is not None:
        if not isinstance(fmt, str):
            raise SchemaError(f"format must be a string, not {fmt!r}", pointer=pointer + "/format", keyword="format")
        if fmt not in FORMATS:
            warnings.warn(f"railcall: format {fmt!r} at {pointer or '/'} is not enforced (known formats: "
                          f"{', '.join(sorted(FORMATS))})", stacklevel=3)
            fmt = None
    # Every pattern (allOf may gather several), the format's, and the strings `not` excludes:
    # one automaton, their product, when there is more than one.
    regexes = []
    for kw, regex in [*(("pattern", p) for p in _patterns(schema)), *([("format", FORMATS[fmt])] if fmt else [])]:
        if not isinstance(regex, str):
            raise SchemaError(f"pattern must be a string, not {regex!r}", pointer=pointer + "/pattern", keyword="pattern")
        if len(regex) > ctx.options.max_pattern:
            raise SchemaError(f"a pattern of {len(regex)} characters exceeds the limit of {ctx.options.max_pattern}",
                              pointer=pointer + "/" + kw, keyword=kw, option="max_pattern")
        try:
            compile_pattern(regex, 256)  # parse and size-check now, to report the pointer
        except RegexError as e:
            if ctx.options.lenient:
                warnings.warn(f"railcall: ignoring {kw} at {pointer or '/'} ({e})", stacklevel=3)
                continue
            raise SchemaError(str(e), pointer=pointer + "/" + kw, keyword=kw) from None
        regexes.append(regex)
    excluded = schema.get(NOT_STRINGS, ())
    if not regexes:
        return ir.JsonPattern("except", excluded, lo, hi) if excluded else ir.JsonString(lo, hi)
    if len(regexes) == 1 and not excluded:
        return ir.JsonPattern("regex", regexes[0], lo, hi)
    return ir.JsonPattern("product", (excluded, tuple((r, True) for r in dict.fromkeys(regexes))), lo, hi)


def _bound(schema: dict, pointer: str, kw: str):
    v = schema.get(kw)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not math.isfinite(v)):
        raise SchemaError(f"{kw} must be a finite number, not {v!r}", pointer=pointer + "/" + kw, keyword=kw)
    return v


def _bounds(schema: dict, pointer: str):
    """(lo, lo exclusive, hi, hi exclusive) from minimum/maximum and the exclusive forms (a
    number, as in 2020-12 and draft-07, or a draft-04 boolean beside minimum/maximum)."""
    lo, hi = _bound(schema, pointer, "minimum"), _bound(schema, pointer, "maximum")
    xlo = xhi = False
    emin, emax = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if emin is True:
        xlo = lo is not None
    elif emin is not None and emin is not False:
        e = _bound(schema, pointer, "exclusiveMinimum")
        if lo is None or e >= lo:
            lo, xlo = e, True
    if emax is True:
        xhi = hi is not None
    elif emax is not None and emax is not False:
        e = _bound(schema, pointer, "exclusiveMaximum")
        if hi is None or e <= hi:
            hi, xhi = e, True
    return lo, xlo, hi, xhi


def _int_bounds(schema: dict, pointer: str) -> tuple[int | None, int | None]:
    lo, xlo, hi, xhi = _bounds(schema, pointer)
    ilo = ihi = None
    if lo is not None:
        ilo = math.floor(lo) + 1 if xlo and float(lo).is_integer() else math.ceil(lo)
    if hi is not None:
        ihi = math.ceil(hi) - 1 if xhi and float(hi).is_integer() else math.floor(hi)
    if ilo is not None and ihi is not None and ilo > ihi:
        raise SchemaError(f"no integer lies between the bounds ({ilo} > {ihi})", pointer=pointer, keyword="minimum",
                          empty=True)
    from railcall.grammar.numbers import JINT_MAX, MAX_NUMBER_CHARS

    # Integers are written with at most 23 digits (the number length cap): a bound past that
    # leaves nothing to write.
    if (ilo is not None and ilo > JINT_MAX) or (ihi is not None and ihi < -JINT_MAX):
        low = ilo is not None and ilo > JINT_MAX
        kw = ("minimum" if "minimum" in schema else "exclusiveMinimum") if low else \
            ("maximum" if "maximum" in schema else "exclusiveMaximum")
        raise SchemaError(f"no integer of at most {MAX_NUMBER_CHARS - 1} digits (what railcall writes) lies within "
                          "the bounds", pointer=pointer, keyword=kw, empty=True)
    return ilo, ihi


def _multiple_of(schema: dict, pointer: str) -> str | None:
    """multipleOf as a decimal string (exact: 0.01 is not the float's binary fraction); None
    where it is not given."""
    v = schema.get("multipleOf")
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise SchemaError(f"multipleOf must be a number above 0, not {v!r}", pointer=pointer + "/multipleOf",
                          keyword="multipleOf")
    return _decimal_text(v)


def _some_multiple(lo, hi, xlo: bool, xhi: bool, step: str, integer: bool, pointer: str) -> None:
    """A SchemaError (empty: no value fits) where no multiple of `step` that railcall writes
    lies within the bounds, so that an optional property or a branch is left out, not the
    schema refused."""
    from decimal import Decimal

    from railcall.grammar.numbers import MAX_NUMBER_CHARS, JDec

    dec = JDec(None if lo is None else Decimal(_decimal_text(lo)), None if hi is None else Decimal(_decimal_text(hi)),
               xlo, xhi, None, step=Decimal(step), frac=not integer)
    if not dec._feasible(""):
        raise SchemaError(f"no {'integer' if integer else 'number'} of at most {MAX_NUMBER_CHARS} characters within "
                          f"the bounds is a multiple of {step}", pointer=pointer, keyword="multipleOf", empty=True)


def _number(schema: dict, pointer: str) -> ir.Node:
    lo, xlo, hi, xhi = _bounds(schema, pointer)
    step = _multiple_of(schema, pointer)
    if lo is None and hi is None and step is None:
        return ir.JsonNumber()
    if lo is not None and hi is not None and (lo > hi or (lo == hi and (xlo or xhi))):
        raise SchemaError(f"no number lies between the bounds {lo} and {hi}", pointer=pointer, keyword="minimum",
                          empty=True)
    if step is not None:
        _some_multiple(lo, hi, xlo, xhi, step, False, pointer)
        return ir.JsonNumber(None if lo is None else _decimal_text(lo), None if hi is None else _decimal_text(hi),
                             xlo, xhi, multiple_of=step)
    return ir.JsonNumber(None if lo is None else _decimal_text(lo), None if hi is None else _decimal_text(hi), xlo, xhi)


def _decimal_text(v) -> str:
    return str(v) if isinstance(v, int) else repr(float(v))


def _array(ctx: _Ctx, schema: dict, pointer: str, depth: int) -> ir.Node:
    if schema.get("uniqueItems") is True:
        _unsupported(ctx, "uniqueItems", pointer, "uniqueness across items is not a regular property")
    prefix_s = schema.get("prefixItems")
    items = schema.get("items", True)
    kw_items = "items"
    if isinstance(items, list):  # draft-07 tuple form
        prefix_s, items, kw_items = items, schema.get("additionalItems", True), "additionalItems"
    prefix = ()
    if prefix_s is not None:
        if not isinstance(prefix_s, list):
            raise SchemaError("prefixItems must be an array of schemas", pointer=pointer + "/prefixItems", keyword="prefixItems")
        if False in prefix_s:  # no item may stand at a `false` position: the array ends before it
            prefix_s, items = prefix_s[: prefix_s.index(False)], False
        prefix = tuple(_node(ctx, s, f"{pointer}/prefixItems/{i}", False, depth + 1) for i, s in enumerate(prefix_s))
    item = None if items is False else _node(ctx, items, f"{pointer}/{kw_items}", False, depth + 1)
    lo = _int_kw(schema, "minItems", pointer) or 0
    hi = _int_kw(schema, "maxItems", pointer)
    if hi is not None and lo > hi:
        raise SchemaError(f"minItems {lo} > maxItems {hi}: no array fits", pointer=pointer, keyword="minItems",
                          empty=True)
    if lo > ctx.options.max_min_items:
        raise SchemaError(f"minItems {lo} asks for more items than railcall writes in one array "
                          f"(at most {ctx.options.max_min_items}): lower minItems",
                          pointer=pointer, keyword="minItems", option="max_min_items")
    if item is None and lo > len(prefix):
        raise SchemaError(f"minItems {lo} but only {len(prefix)} items are allowed", pointer=pointer, keyword="minItems",
                          empty=True)
    return ir.JsonArray(item, lo, hi, prefix, ctx.options.whitespace)


MAX_PATTERN_PROPERTIES = 5  # undeclared keys fall into 2^n classes (which patterns they match)


def _object(ctx: _Ctx, schema: dict, pointer: str, depth: int) -> ir.Node:
    props = schema.get("properties", {})
    req = schema.get("required", [])
    ap = schema.get("additionalProperties")
    if ap is None:
        free = ctx.options.standard or "properties" not in schema
        ap = True if free else False
    pprops = schema.get("patternProperties", {})
    if not isinstance(pprops, dict):
        raise SchemaError("patternProperties must be an object of schemas", pointer=pointer + "/patternProperties",
                          keyword="patternProperties")
    if len(pprops) > MAX_PATTERN_PROPERTIES:
        _unsupported(ctx, "patternProperties", pointer, f"more than {MAX_PATTERN_PROPERTIES} patterns")
        pprops = {}
    pnames = _property_names(ctx, schema.get("propertyNames", True), pointer)
    matchers = {}
    for pat in pprops:
        try:
            matchers[pat] = compile_pattern(pat)
        except RegexError as e:
            raise SchemaError(str(e), pointer=f"{pointer}/patternProperties/{_esc(pat)}", keyword="patternProperties") from None
    missing = [r for r in req if r not in props]
    if missing:
        for r in missing:
            hits = [pprops[p] for p in pprops if matchers[p].matches(r)]
            if not hits and ap is False:
                raise SchemaError(f"required {r!r} is neither declared nor allowed as an additional property",
                                  pointer=pointer + "/required", keyword="required", empty=True)
        # A required name without its own schema must still be written, with the schema that
        # applies to it as an undeclared key.
        props = {**props, **{r: True for r in missing}}
    out = []
    for name, sub in props.items():
        # A declared key also answers to every pattern it matches (and, if it was only named by
        # `required`, to additionalProperties when no pattern matches it).
        hits = [pprops[p] for p in pprops if matchers[p].matches(name)]
        if name in missing and not hits:
            hits = [ap]
        subs = [x for x in [sub] + hits if x is not True]
        ok = pnames is None or (pnames[0].matches(name) and pnames[1] <= len(name)
                                and (pnames[2] is None or len(name) <= pnames[2]))
        if False in subs or not ok:
            if name in req:
                raise SchemaError(f"property {name!r} is required but its schema (or propertyNames) forbids it",
                                  pointer=pointer, keyword="required")
            continue
        sub = True if not subs else subs[0] if len(subs) == 1 else {"allOf": subs}
        is_req = name in req
        try:
            node = _node(ctx, sub, f"{pointer}/properties/{_esc(name)}", is_req, depth + 1)
        except SchemaError as e:
            if not e.empty or is_req:  # a required property no value fits: no object fits either
                raise
            continue  # an optional one is left out (an object without it is valid)
        out.append((name, node, is_req))
    extras = _extra_classes(ctx, tuple(props), pprops, ap, pnames, pointer, depth)
    n_req = sum(1 for _, _, r in out if r)
    min_p = _int_kw(schema, "minProperties", pointer)
    max_p = _int_kw(schema, "maxProperties", pointer)
    max_extra = None
    if min_p or max_p is not None:
        if max_p is not None and max_p < n_req:
            raise SchemaError(f"maxProperties {max_p} < the {n_req} required properties", pointer=pointer,
                              keyword="maxProperties", empty=True)
        if len(out) != n_req:
            # Optional declared members: the object counts its members as it writes them (a
            # state per count), with undeclared ones only where the required members alone meet
            # minProperties (a repeated undeclared key would count twice towards a minimum).
            if extras and (min_p or 0) > n_req:
                _unsupported(ctx, "minProperties", pointer,
                             "a minimum above the required properties, with optional and undeclared ones")
                return ir.JsonObject(tuple(out), extras, None, ctx.options.whitespace, 0, max_p)  # lenient
            if not extras and (min_p or 0) > len(out):
                raise SchemaError(f"minProperties {min_p} > the {len(out)} properties allowed", pointer=pointer,
                                  keyword="minProperties", empty=True)
            return ir.JsonObject(tuple(out), extras, None, ctx.options.whitespace, min_p or 0, max_p)
        else:
            room = None if max_p is None else max_p - n_req
            need = max(0, (min_p or 0) - n_req)
            if not extras:
                if need:
                    raise SchemaError(f"minProperties {min_p} needs undeclared properties, which are not allowed",
                                      pointer=pointer, keyword="minProperties")
            else:
                max_extra = room
                if need:
                    return _min_extra_object(ctx, out, extras, need, room)
    return ir.JsonObject(tuple(out), extras, max_extra, ctx.options.whitespace)


def _property_names(ctx: _Ctx, s, pointer: str):
    """propertyNames as (CharDFA, minLength, maxLength), None when it allows every name.
    Supported: a schema with pattern / minLength / maxLength (type string implied), or false."""
    if s is True or s == {}:
        return None
    where = pointer + "/propertyNames"
    if s is False:
        return (compile_pattern(""), 1, 0, "")  # no name at all: no length fits
    if not isinstance(s, dict) or any(k in HANDLED | UNENFORCED and k not in {"pattern", "minLength", "maxLength", "type"}
                                      for k in s) or s.get("type", "string") != "string":
        _unsupported(ctx, "propertyNames", pointer, "only pattern, minLength and maxLength are enforced on names")
        return None
    try:
        dfa = compile_pattern(s.get("pattern", ""))
    except RegexError as e:
        raise SchemaError(str(e), pointer=where + "/pattern", keyword="propertyNames") from None
    return (dfa, _int_kw(s, "minLength", where) or 0, _int_kw(s, "maxLength", where), s.get("pattern", ""))


def _extra_classes(ctx: _Ctx, declared: tuple, pprops: dict, ap, pnames, pointer: str, depth: int) -> tuple:
    """The (key node, value node) classes of undeclared members: one per set of patterns a key
    matches (its value must satisfy all of their schemas), and the keys that match none (the
    additionalProperties schema). Classes no key can fall into are left out."""
    names_pat = () if pnames is None else ((pnames[3], True),) if pnames[3] else ()
    lo, hi = (0, None) if pnames is None else (pnames[1], pnames[2])
    pats = list(pprops)
    out = []
    for mask in range(1 << len(pats)):
        chosen = [pats[i] for i in range(len(pats)) if mask >> i & 1]
        schemas = [pprops[p] for p in chosen] if chosen else [ap]
        if False in schemas:
            continue
        spec = (declared, tuple((p, bool(mask >> i & 1)) for i, p in enumerate(pats)) + names_pat)
        if not spec[1] and not declared and lo == 0 and hi is None:
            key: ir.Node = ir.JsonString(0, None)
        else:
            try:
                from railcall.grammar.strings import char_dfa

                if not char_dfa("product", spec, 256).can_end_within(lo, 256 if hi is None else hi):
                    continue
            except RegexError:
                continue  # no key falls into this class
            key = ir.JsonPattern("product", spec, lo, hi)
        subs = [x for x in schemas if x is not True]
        value = True if not subs else subs[0] if len(subs) == 1 else {"allOf": subs}
        where = f"{pointer}/patternProperties" if chosen else f"{pointer}/additionalProperties"
        out.append((key, _node(ctx, value, where, False, depth + 1)))
    return tuple(out)


def _min_extra_object(ctx: _Ctx, out: list, extras: tuple, need: int, room) -> ir.Node:
    """An object that must have at least `need` undeclared members (minProperties with every
    declared member required): the declared members, `need` mandatory extra members, then up
    to `room - need` more (any number if room is None)."""
    if ctx.options.whitespace:
        _unsupported(ctx, "minProperties", "", "together with flexible whitespace")
    if room is not None and room < need:
        raise SchemaError(f"minProperties needs {need} undeclared members but maxProperties allows {room}",
                          keyword="maxProperties")
    member = ir.Alt(*[ir.Seq(key, ir.Lit(b":"), value) for key, value in extras])
    parts: list = [ir.Lit(b"{")]
    for i, (name, node, _req) in enumerate(out):
        parts += [ir.Lit((b"," if i else b"") + ir.json_literal(name) + b":"), node]
    for j in range(need):
        if out or j:
            parts.append(ir.Lit(b","))
        parts.append(_distinct_member(ctx, extras, j, need) if need > 1 else member)
    more = None if room is None else room - need
    if more is None:
        parts.append(ir.Ref(_extra_tail_rule(ctx, member)))
    else:
        if more > 64:
            _unsupported(ctx, "maxProperties", "", f"{more} optional undeclared members after minProperties")
            more = 0
        opt: ir.Node = ir.Seq()
        for _ in range(more):
            opt = ir.Alt(ir.Seq(), ir.Seq(ir.Lit(b","), member, opt))
        parts.append(opt)
    parts.append(ir.Lit(b"}"))
    return ir.Seq(*parts)


def _distinct_member(ctx: _Ctx, extras: tuple, slot: int, need: int) -> ir.Node:
    """The `slot`-th of `need` mandatory undeclared members, its key unable to repeat another's.

    JSON lets a key repeat (`{"a":1,"a":2}`); a parser keeps one of them (`json.loads` the
    last), so the object has one member fewer than it was written with, and minProperties,
    counted on the written members, let through objects one short. Which members were already
    written is not something a grammar can remember, so the mandatory keys are kept apart by
    their length instead: the key of slot j has (j + 1) mod `need` characters, modulo `need`
    (slot 0 of two: 1, 3, 5 ...; slot 1: 2, 4 ...), and two keys of different lengths differ.
    The members after the mandatory ones may still repeat a key: the distinct mandatory keys
    already meet minProperties, and a repeat only lowers the count maxProperties bounds. Keys of
    a class that has no length of this slot's residue leave the class out of the slot; where no
    class has one (keys of a single length), the schema is refused as unsupported."""
    cycle = f"^(?:[\\s\\S]{{{need}}})*[\\s\\S]{{{(slot + 1) % need}}}$"
    from railcall.grammar.strings import char_dfa

    members = []
    for key, value in extras:
        if isinstance(key, ir.JsonString):  # any string: only the length class is added
            spec = ((), ((cycle, True),))
        else:
            names, pats = key.arg
            spec = (names, pats + ((cycle, True),))
        lo, hi = key.min_len, key.max_len
        try:
            if not char_dfa("product", spec, 256).can_end_within(lo, 256 if hi is None else hi):
                continue
        except RegexError:
            continue  # no key of this class has a length of this slot's residue
        members.append(ir.Seq(ir.JsonPattern("product", spec, lo, hi), ir.Lit(b":"), value))
    if not members:  # lenient: the plain member, whose key may repeat another's
        _unsupported(ctx, "minProperties", "", f"{need} distinct undeclared keys are kept apart by their lengths, "
                     "and the keys allowed here cannot vary enough in length")
        return ir.Alt(*[ir.Seq(key, ir.Lit(b":"), value) for key, value in extras])
    return ir.Alt(*members)


def _extra_tail_rule(ctx: _Ctx, member) -> str:
    name = f"__extra_tail_{len(ctx.rules)}"
    ctx.rules[name] = ir.Alt(ir.Seq(), ir.Seq(ir.Lit(b","), member, ir.Ref(name)))
    return name


def _esc(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


# -- references ------------------------------------------------------------------------------------


def _ref(ctx: _Ctx, ref, pointer: str, depth: int, holder=None) -> ir.Node:
    uri, target = _resolve_ref(ctx, ref, pointer, holder)
    # A target that is only another $ref (an alias) is followed here, not made a rule of its
    # own: each rule is a level of reference nesting, and a chain of aliases would otherwise
    # run into the matcher's depth limit (MAX_DEPTH) with nothing nested at all. A cycle of aliases is
    # left as it is written (it has no value, and is refused as such, naming its links).
    seen, end = {uri}, (uri, target)
    while isinstance(end[1], dict) and "$ref" in end[1] and (ctx.dialect <= 7 or not any(
            k in HANDLED or k in UNENFORCED for k in end[1] if k != "$ref")):
        end = _resolve_ref(ctx, end[1]["$ref"], end[0].partition("#")[2] + "/$ref", end[1])
        if end[0] in seen:
            end = (uri, target)
            break
        seen.add(end[0])
    uri, target = end
    name = "ref:" + uri
    if name not in ctx.rules:
        ctx.rules[name] = None  # in progress: a recursive reference sees the rule name
        ctx.rules[name] = _node(ctx, target, uri.partition("#")[2] or "/", False, depth + 1)
    return ir.Ref(name)


def _resolve_ref(ctx: _Ctx, ref, pointer: str, holder=None):
    """(absolute URI, target subschema) of `ref`, resolved against the base URI of the schema
    that holds it. Only targets inside this document (its `$id`s, `$anchor`s and JSON pointers)
    resolve; a remote schema must be inlined."""
    from urllib.parse import urldefrag, urljoin

    if not isinstance(ref, str):
        raise SchemaError(f"$ref must be a string, not {ref!r}", pointer=pointer, keyword="$ref")
    if not ctx.indexed:  # the whole document, once, and only if something refers into it
        _index(ctx, ctx.root, ctx.root_base)
        ctx.indexed = True
    base = ctx.base_of.get(id(holder), ctx.root_base) if holder is not None else ctx.root_base
    if ref.startswith("#") or not base:
        uri = base + ref  # urljoin does not know URN bases; a fragment only replaces the fragment
    elif ":" in ref.split("/", 1)[0]:
        uri = ref  # already absolute (http:, urn:, ...)
    else:
        uri = urljoin(base, ref)
    if ref.startswith("#") and "#" not in base:
        doc_uri, frag = base, ref[1:]  # what urldefrag returns, without parsing the URI
    else:
        doc_uri, frag = urldefrag(uri)
    doc = ctx.docs.get(doc_uri)
    if doc is None:
        raise SchemaError(f"$ref {ref!r} points outside this schema ({doc_uri}); railcall resolves only references "
                          "inside the schema ($defs, $id, $anchor): inline the remote schema", pointer=pointer,
                          keyword="$ref")
    if frag == "" or frag.startswith("/"):
        return doc_uri + "#" + frag, _resolve_pointer(doc, frag, pointer)
    target = ctx.anchors.get((doc_uri, frag))
    if target is None:
        raise SchemaError(f"$ref {ref!r}: no $anchor {frag!r} in {doc_uri or 'this schema'}", pointer=pointer,
                          keyword="$ref")
    return doc_uri + "#" + frag, target


def _resolve_pointer(root, ptr: str, pointer: str):
    cur = root
    if ptr in ("", "/"):
        return root
    from urllib.parse import unquote

    for part in unquote(ptr).lstrip("/").split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            raise SchemaError(f"$ref target #{ptr} does not exist", pointer=pointer, keyword="$ref")
    return cur


# -- allOf: merging subschemas ---------------------------------------------------------------------

_MAX_KEYS = ("maxLength", "maxItems", "maxProperties")
_MIN_KEYS = ("minLength", "minItems", "minProperties")


def _merge_allof(ctx: _Ctx, schema: dict, pointer: str, depth: int) -> dict:
    """One schema equivalent to `schema`'s allOf (and its own keywords), or a SchemaError naming
    what cannot be combined."""
    branches = schema["allOf"]
    if not isinstance(branches, list) or not branches:
        raise SchemaError("allOf must be a non-empty array", pointer=pointer + "/allOf", keyword="allOf")
    own: dict = {k: v for k, v in schema.items() if k != "allOf"}
    acc = own if _own_first(schema, "allOf") else {}
    for i, br in enumerate(branches):
        acc = _merge(ctx, acc, br, f"{pointer}/allOf/{i}", depth)
    return acc if acc is own or not own else _merge(ctx, acc, own, pointer, depth)


def _own_first(schema: dict, kw: str) -> bool:
    """Whether a schema's own `properties` come before those that keyword `kw` ($ref, allOf)
    merges in: declared order across a merge is the order the schema is written in."""
    keys = list(schema)
    return "properties" not in schema or keys.index("properties") < keys.index(kw)


def _expand(ctx: _Ctx, s, pointer: str, depth: int) -> dict:
    """A branch as a plain dict of handled keywords: $refs followed (a recursive one errors via
    the depth limit), nested allOf merged, booleans turned into dicts."""
    if depth > ctx.options.max_depth:
        raise SchemaError(f"allOf/$ref nesting deeper than {ctx.options.max_depth} levels", pointer=pointer, keyword="allOf")
    if s is True:
        return {}
    if s is False:
        return {"enum": []}
    orig = s
    s = _handled(ctx, s, pointer)
    if "$ref" in s:
        target = _expand(ctx, _resolve_ref(ctx, s["$ref"], pointer + "/$ref", orig)[1], pointer + "/$ref", depth + 1)
        rest = {k: v for k, v in s.items() if k != "$ref"}
        s = _merge(ctx, target, rest, pointer, depth + 1) if rest else target
    if "allOf" in s:
        s = _merge_allof(ctx, s, pointer, depth + 1)
    return s


def _merge(ctx: _Ctx, a: dict, b, pointer: str, depth: int) -> dict:
    a = _expand(ctx, a, pointer, depth + 1)
    b = _expand(ctx, b, pointer, depth + 1)
    if a.get("enum") == [] or b.get("enum") == []:
        raise SchemaError("allOf contains `false`: no value fits", pointer=pointer, keyword="allOf", empty=True)
    for kw in ("anyOf", "oneOf"):  # distribute: allOf(A, anyOf(B1, B2)) = anyOf(A+B1, A+B2)
        for x, y in ((a, b), (b, a)):
            if kw in x:
                rest = {k: v for k, v in x.items() if k != kw}
                return {kw: [{"allOf": [{**rest}, y, br]} for br in x[kw]]}
    out = dict(a)
    for k, vb in b.items():
        if k not in out:
            out[k] = vb
            continue
        va = out[k]
        if _json_equal(va, vb):
            continue
        if k == "type":
            ta = {va} if isinstance(va, str) else set(va)
            tb = {vb} if isinstance(vb, str) else set(vb)
            both = (ta & tb) | ({"integer"} if ("integer" in ta and "number" in tb) or ("number" in ta and "integer" in tb) else set())
            if not both:
                raise SchemaError(f"allOf requires types {sorted(ta)} and {sorted(tb)} at once: no value fits",
                                  pointer=pointer, keyword="type", empty=True)
            out[k] = sorted(both)
        elif k in _MAX_KEYS:
            out[k] = min(va, vb)
        elif k in _MIN_KEYS:
            out[k] = max(va, vb)
        elif k in ("minimum", "exclusiveMinimum"):
            out[k] = max(va, vb)
        elif k in ("maximum", "exclusiveMaximum"):
            out[k] = min(va, vb)
        elif k == "required":
            out[k] = list(dict.fromkeys(list(va) + list(vb)))
        elif k == "enum":
            out[k] = [x for x in va if any(_json_equal(x, y) for y in vb)]
            if not out[k]:
                raise SchemaError("allOf enums have no value in common", pointer=pointer, keyword="enum", empty=True)
        elif k == "const":
            raise SchemaError(f"allOf requires two different constants {va!r} and {vb!r}", pointer=pointer, keyword="const")
        elif k in ("items", "additionalItems", "prefixItems"):
            continue  # merged below, position by position
        elif k in ("properties", "additionalProperties"):
            continue  # merged below, together
        elif k == "pattern":  # both must match: the string's automaton is their product
            out[k] = tuple(dict.fromkeys([*_patterns(out), *_patterns(b)]))
        elif k == NOT_STRINGS:
            out[k] = tuple(dict.fromkeys([*va, *vb]))
        elif k == "multipleOf" and all(isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0
                                       for x in (va, vb)):
            out[k] = _common_multiple(va, vb)
        else:
            raise SchemaError(f"allOf branches give {k!r} two different values ({va!r}, {vb!r}), which railcall "
                              "cannot combine", pointer=pointer, keyword=k)
    if "enum" in out and "const" in out:
        if not any(_json_equal(out["const"], e) for e in out["enum"]):
            raise SchemaError("const is not among the enum values", pointer=pointer, keyword="const")
    if any(k in a or k in b for k in ("properties", "additionalProperties")):
        _merge_properties(a, b, out, pointer)
    if any(k in a and k in b for k in ("items", "prefixItems")) or (
            ("prefixItems" in a or "prefixItems" in b) and ("items" in a or "items" in b)):
        _merge_items(a, b, out)
    return out


def _common_multiple(a, b):
    """The least common multiple of two multipleOf values, exactly (p1/q1 and p2/q2 in lowest
    terms: lcm(p1, p2) / gcd(q1, q2)), as an int where it is whole, else a float of its decimal."""
    from decimal import Decimal
    from fractions import Fraction

    x, y = Fraction(Decimal(str(a))), Fraction(Decimal(str(b)))
    num = x.numerator * y.numerator // math.gcd(x.numerator, y.numerator)
    m = Fraction(num, math.gcd(x.denominator, y.denominator))
    return int(m) if m.denominator == 1 else float(Decimal(m.numerator) / Decimal(m.denominator))


def _merge_items(a: dict, b: dict, out: dict) -> None:
    """Each array position must satisfy both sides' schema for that position (a side's
    prefixItems entry there, else its items)."""
    pa, pb = a.get("prefixItems", []), b.get("prefixItems", [])
    ia, ib = a.get("items", True), b.get("items", True)

    def both(x, y):
        return y if x is True else x if y is True else {"allOf": [x, y]}

    n = max(len(pa), len(pb))
    prefix = [both(pa[i] if i < len(pa) else ia, pb[i] if i < len(pb) else ib) for i in range(n)]
    out.pop("prefixItems", None)
    if prefix:
        out["prefixItems"] = prefix
    out["items"] = both(ia, ib)


def _merge_properties(a: dict, b: dict, out: dict, pointer: str) -> None:
    """Each key is allowed by both sides (its own schema, or that side's additionalProperties)."""
    pa, pb = a.get("properties", {}), b.get("properties", {})
    apa, apb = a.get("additionalProperties", True), b.get("additionalProperties", True)
    req = set(out.get("required", []))
    props = {}
    for key in list(dict.fromkeys(list(pa) + list(pb))):
        sa, sb = pa.get(key, apa), pb.get(key, apb)
        if sa is False or sb is False:
            if key in req:
                raise SchemaError(f"allOf requires {key!r} but a branch forbids it", pointer=pointer, keyword="required")
            continue
        props[key] = sa if sb is True else sb if sa is True else {"allOf": [sa, sb]}
    out["properties"] = props
    if apa is False or apb is False:
        out["additionalProperties"] = False
    elif apa is True:
        out["additionalProperties"] = apb
    elif apb is True:
        out["additionalProperties"] = apa
    else:
        out["additionalProperties"] = {"allOf": [apa, apb]}
    if "additionalProperties" not in a and "additionalProperties" not in b:
        del out["additionalProperties"]


# -- oneOf: disjointness ---------------------------------------------------------------------------


def _one_of_types(ctx: _Ctx, branches: list) -> list[str] | None:
    """The types a oneOf of branches that only name types allows: those exactly one branch
    names (Kubernetes' int-or-string is `oneOf: [{type: [string, null]}, {type: [integer, null]}]`,
    so null, in both, is not allowed). None when a branch says more than its type, or when the
    answer is "numbers that are not integers" (a number branch beside an integer one), which
    no type list can say."""
    counts: dict[str, int] = {}
    for br in branches:
        try:
            s = _expand(ctx, br, "", 0) if isinstance(br, (dict, bool)) else None
        except GrammarError:
            return None
        if not s or set(s) != {"type"}:
            return None
        for t in set(s["type"] if isinstance(s["type"], list) else [s["type"]]):
            counts[t] = counts.get(t, 0) + 1
    numbers, integers = counts.get("number", 0), counts.get("number", 0) + counts.get("integer", 0)
    if numbers == 1 and integers > 1:
        return None
    out = [t for t in ("object", "array", "string", "boolean", "null") if counts.get(t) == 1]
    if integers == 1:
        out.append("number" if numbers else "integer")
    return out


def _pairwise_disjoint(ctx: _Ctx, branches: list, base: dict) -> bool:
    sigs = []
    for br in branches:
        try:
            s = _expand(ctx, br, "", 0) if isinstance(br, (dict, bool)) else None
        except GrammarError:
            return False
        if s is None:
            return False
        sigs.append(s)
    for i in range(len(sigs)):
        for j in range(i + 1, len(sigs)):
            if not _disjoint(sigs[i], sigs[j]):
                return False
    return True


def _type_set(s: dict):
    t = s.get("type")
    if "const" in s:
        return {_json_type(s["const"])}
    if "enum" in s and isinstance(s["enum"], list):
        return {_json_type(v) for v in s["enum"]}
    if t is None:
        return None
    return {t} if isinstance(t, str) else set(t)


def _disjoint(a: dict, b: dict) -> bool:
    """A sufficient test that no value satisfies both a and b: distinct types, distinct
    constant values, or an object property both require with distinct constant values."""
    ta, tb = _type_set(a), _type_set(b)
    if ta is not None and tb is not None:
        ea = ta | ({"integer"} if "number" in ta else set())
        eb = tb | ({"integer"} if "number" in tb else set())
        if not (ea & eb) and not ("integer" in ea and "number" in eb) and not ("number" in ea and "integer" in eb):
            return True
    va, vb = _values(a), _values(b)
    if va is not None and vb is not None:
        return not any(_json_equal(x, y) for x in va for y in vb)
    pa, pb = a.get("properties", {}), b.get("properties", {})
    if isinstance(pa, dict) and isinstance(pb, dict):
        ra, rb = set(a.get("required", [])), set(b.get("required", []))
        for k in set(pa) & set(pb) & ra & rb:
            if isinstance(pa[k], dict) and isinstance(pb[k], dict):
                xa, xb = _values(pa[k]), _values(pb[k])
                if xa is not None and xb is not None and not any(_json_equal(x, y) for x in xa for y in xb):
                    return True
    return False


def _values(s: dict):
    if "const" in s:
        return [s["const"]]
    if "enum" in s and isinstance(s["enum"], list):
        return s["enum"]
    return None


# -- any JSON value --------------------------------------------------------------------------------


def _any_rule(ctx: _Ctx) -> str:
    """A rule for any JSON value (compact), recursion bounded by the matcher's depth limit."""
    if ANY_VALUE not in ctx.rules:
        v = ir.Ref(ANY_VALUE)
        s = ir.JsonString(0, None)
        ws = ctx.options.whitespace
        ctx.rules[ANY_VALUE] = ir.Alt(
            s, ir.JsonNumber(), ir.Select(((b"true", ir.Seq()), (b"false", ir.Seq()), (b"null", ir.Seq()))),
            ir.JsonArray(v, 0, None, (), ws), ir.JsonObject((), ((s, v),), None, ws),
        )
    return ANY_VALUE


def dumps_compact(value) -> str:
    """`value` as railcall writes it: compact separators, UTF-8 as is."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
