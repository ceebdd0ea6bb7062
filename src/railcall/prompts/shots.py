"""In-context examples from a tool table: made-up requests, and the calls that answer them.

`railcall eval bfcl --shots k` puts k of these in front of a task's question, as earlier user and
assistant turns. Each is built from the task's tool table alone -- a tool's name, its parameters'
names, types, descriptions and constraints -- never from the task's question or its gold answer,
so an example can teach the call format and how a request maps onto a tool, not the answer.

    request  "Calculate triangle area with base 10 and height 10."   the tool's name, in words,
                                                                      and each argument given
    call     {"tool":"calculate_triangle_area","args":{"base":10,"height":10}}

The call is written by the run's call format (`railcall.grammar.tools.write_calls`: json, openai,
hermes or pythonic), so the example shows exactly what the grammar lets the model write.

Arguments: the required ones only (an optional one the model does not need is a value it can get
wrong), each a placeholder of the right type: an enum's first value, a const, a string from the
parameter's format or the example its description gives ("e.g. San Francisco, CA") or its name
(a city, a date, a name), a number inside the bounds. A tool with a parameter no placeholder fits
for sure (a pattern the value does not match, a $ref) is left out of the examples.

Deterministic: the same table gives the same examples, in any process. The k examples take the
table's tools in order, one each; a table with fewer tools than k gives a tool a second example
with other values. With `pair`, the last example asks for one tool with two sets of values and
answers with two calls ("Get weather with city Paris, and with city Tokyo."). Pure functions,
nothing cached.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Sequence

from railcall.grammar.tools import Tool, write_calls


@dataclass(frozen=True)
class Shot:
    """One example: the made-up request, the call that answers it, and that call as the format
    writes it (the assistant turn)."""

    request: str
    tool: str
    args: dict
    call: str


class NoPlaceholder(ValueError):
    """No value is sure to fit this schema (the tool is left out of the examples)."""


def shots(tools: Sequence[Tool], k: int, fmt: str = "json", *, pair: bool = False) -> list[Shot]:
    """k examples over `tools` in call format `fmt` (fewer when no tool can be filled in).
    `pair`: the last example asks for one tool twice, with two sets of values, and answers with
    both calls in one reply (the format's form for several calls), so the examples show that a
    request for several things gets several calls."""
    if k <= 0:
        return []
    fillable = []
    for t in tools:
        try:
            placeholder_args(t, 0)
        except NoPlaceholder:
            continue
        fillable.append(t)
    out = []
    for i in range(k if fillable else 0):
        tool = fillable[i % len(fillable)]
        variant = i // len(fillable)
        args = placeholder_args(tool, variant)
        out.append(Shot(request(tool, args), tool.name, args, write_calls(tools, [(tool.name, args)], fmt)))
    if pair and out:
        twice = _pair(tools, fillable, fmt)
        if twice is not None:
            out[-1] = twice
    return out


def _pair(tools: Sequence[Tool], fillable: Sequence[Tool], fmt: str) -> Shot | None:
    """The first fillable tool whose first two placeholder sets differ, asked for with both and
    called twice: "Get weather with city Paris, and with city Tokyo." (None: no tool has two)."""
    for tool in fillable:
        first, second = placeholder_args(tool, 0), placeholder_args(tool, 1)
        if first == second:
            continue
        text = request(tool, first)[:-1] + f", and with {_given(second)}."
        return Shot(text, tool.name, first, write_calls(tools, [(tool.name, first), (tool.name, second)], fmt))
    return None


def shot_messages(examples: Sequence[Shot]) -> list[dict]:
    """The examples as chat turns: a user message and the assistant's call, for each."""
    return [m for s in examples for m in ({"role": "user", "content": s.request}, {"role": "assistant", "content": s.call})]


# --- the request ------------------------------------------------------------------------------

def words(name: str) -> str:
    """An identifier as words: `calculate_triangle_area`, `math.factorial`, `getWeather` ->
    "calculate triangle area", "math factorial", "get weather"."""
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", name)
    return " ".join(w.lower() if not w.isupper() else w for w in re.split(r"[\s_.\-/]+", spaced) if w)


def request(tool: Tool, args: dict) -> str:
    """A made-up request for `tool` with `args`: the tool's name in words, then each argument."""
    head = words(tool.name) or tool.name
    head = head[:1].upper() + head[1:]
    return f"{head} with {_given(args)}." if args else head + "."


def _given(args: dict) -> str:
    """"base 10 and height 10": each argument in words, then its value."""
    parts = [f"{words(k) or k} {_say(v)}" for k, v in args.items()]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _say(value) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, list):
        return ", ".join(_say(v) for v in value) if value else "none"
    return json.dumps(value, ensure_ascii=False)


# --- placeholder values -----------------------------------------------------------------------

def placeholder_args(tool: Tool, variant: int = 0) -> dict:
    """The tool's required arguments, each a placeholder of its type, in declared order (the
    i-th takes the values one further along, so three numbers read 5, 3, 8 rather than 5, 5, 5)."""
    params = tool.parameters
    props = params.get("properties", {}) or {}
    required = [k for k in props if k in set(params.get("required", []))]
    if set(params.get("required", [])) - set(props):
        raise NoPlaceholder(f"{tool.name}: a required argument has no schema")
    return {k: placeholder(props[k], k, variant + i) for i, k in enumerate(required)}


# Strings by a word of the parameter's name: two plausible values each (the second for a tool's
# second example). First match wins, so the more specific words come first.
_STRINGS = [
    (("email",), ("alice@example.com", "bob@example.org")),
    (("url", "link", "website", "uri"), ("https://example.com", "https://example.org")),
    (("path", "file", "filename", "dir", "folder"), ("notes.txt", "data.csv")),
    (("company", "organization", "organisation", "brand"), ("Acme", "Globex")),
    (("city", "location", "place", "destination", "origin", "address", "venue"), ("Paris", "Tokyo")),
    (("country", "nation"), ("France", "Japan")),
    (("state", "province", "region"), ("California", "Texas")),
    (("language", "lang"), ("English", "Spanish")),
    (("currency",), ("USD", "EUR")),
    (("symbol", "ticker", "stock"), ("AAPL", "MSFT")),
    (("date", "day", "birthday"), ("2024-05-01", "2024-06-15")),
    (("time", "hour"), ("10:00", "14:30")),
    (("year",), ("2024", "2023")),
    (("color", "colour"), ("blue", "red")),
    (("unit", "units"), ("metric", "imperial")),
    (("genre", "category", "type", "kind"), ("general", "other")),
    (("title", "song", "book", "movie", "album"), ("Blue Moon", "Red Sky")),
    (("team", "club"), ("Lakers", "Celtics")),
    (("name", "person", "user", "username", "author", "player", "artist", "owner"), ("Alice", "Bob")),
    (("id", "code", "key", "number", "account"), ("A123", "B456")),
    (("query", "keyword", "keywords", "search", "term", "topic", "text", "message", "content"), ("example", "sample")),
]
_FORMATS = {"date": "2024-05-01", "date-time": "2024-05-01T10:00:00Z", "time": "10:00:00", "email": "alice@example.com",
            "uri": "https://example.com", "url": "https://example.com", "uuid": "123e4567-e89b-12d3-a456-426614174000",
            "ipv4": "192.168.0.1", "hostname": "example.com"}
# "e.g. San Francisco, CA" / "for example 'celsius'": the first example a description gives
_EXAMPLE = re.compile(r"""(?:e\.g\.?|for example|such as)[,:]?\s+(?:'([^'\n]{1,40})'|"([^"\n]{1,40})"|"""
                      r"""([A-Za-z0-9][^,;:()'"\n]{0,30}?))(?=[,;:()'"\n]|\.(?:\s|$)|\s*$)""", re.IGNORECASE)

# Integers and numbers by a word of the name, else the defaults; `variant` walks along each tuple
_INTEGERS = [(("year",), (2024, 2023)), (("month",), (5, 6)), (("day",), (15, 1)), (("age",), (30, 40)),
             (("page", "index", "start"), (1, 2)), (("percent", "percentage"), (10, 20))]
_NUMBERS = [(("lat", "latitude"), (48.85, 35.68)), (("lon", "lng", "longitude"), (2.35, 139.69)),
            (("rate", "ratio", "probability", "fraction"), (0.5, 0.25))]
_INTEGER_DEFAULTS = (5, 3, 8, 2)
_NUMBER_DEFAULTS = (2.5, 4.0, 1.5, 7.5)


def _by_name(table, name: str):
    toks = set(words(name).split())
    for keys, values in table:
        if toks & set(keys):
            return values
    return None


def placeholder(schema, name: str = "", variant: int = 0):
    """A value that fits `schema` (one property's JSON Schema), plausible for a parameter called
    `name`; `variant` picks another value where there is a choice. NoPlaceholder if none is sure to."""
    if not isinstance(schema, dict):
        if schema is True or schema is None:
            return _string({}, name, variant)
        raise NoPlaceholder(f"{name}: the schema {schema!r} allows nothing")
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list):
        if not schema["enum"]:
            raise NoPlaceholder(f"{name}: an empty enum")
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            rest = {k: v for k, v in schema.items() if k != key}
            for branch in schema[key]:
                try:
                    return placeholder({**rest, **branch} if isinstance(branch, dict) else branch, name, variant)
                except NoPlaceholder:
                    continue
            raise NoPlaceholder(f"{name}: no {key} branch can be filled")
    if "$ref" in schema or "allOf" in schema or "not" in schema:
        raise NoPlaceholder(f"{name}: $ref, allOf and not are not filled in")
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"] or kind
        kind = kinds[0] if kinds else None
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else "string"
    if kind == "string":
        return _string(schema, name, variant)
    if kind == "integer":
        values = _by_name(_INTEGERS, name) or _INTEGER_DEFAULTS
        return _bounded(schema, values[variant % len(values)], integer=True)
    if kind == "number":
        values = _by_name(_NUMBERS, name) or _NUMBER_DEFAULTS
        return _bounded(schema, values[variant % len(values)], integer=False)
    if kind == "boolean":
        return variant % 2 == 0
    if kind == "null":
        return None
    if kind == "array":
        items = schema.get("items", {})
        if isinstance(schema.get("prefixItems"), list) or isinstance(items, list):
            raise NoPlaceholder(f"{name}: tuple arrays are not filled in")
        lo, hi = int(schema.get("minItems", 0)), schema.get("maxItems")
        n = max(lo, 1) if hi is None else min(max(lo, 1), int(hi))
        singular = re.sub(r"ies$", "y", name) if name.endswith("ies") else re.sub(r"(?<=[a-z])(?<!s)s$", "", name)
        value = [placeholder(items, singular, variant + j) for j in range(n)]
        if schema.get("uniqueItems") and len({json.dumps(v, sort_keys=True) for v in value}) < len(value):
            raise NoPlaceholder(f"{name}: no {n} distinct items")
        return value
    if kind == "object":
        props = schema.get("properties", {}) or {}
        req = set(schema.get("required", []))
        if req - set(props):
            raise NoPlaceholder(f"{name}: a required property has no schema")
        if int(schema.get("minProperties", 0)) > len(req):
            raise NoPlaceholder(f"{name}: minProperties asks for more than the required properties")
        return {k: placeholder(p, k, variant) for k, p in props.items() if k in req}
    raise NoPlaceholder(f"{name}: unknown type {kind!r}")


def _string(schema: dict, name: str, variant: int) -> str:
    fmt = [_FORMATS[schema["format"]]] if schema.get("format") in _FORMATS else []
    m = _EXAMPLE.search(" ".join(str(schema.get("description", "")).split()))
    described = [next(g for g in m.groups() if g).strip()] if m else []
    by_name = _by_name(_STRINGS, name)
    named = [by_name[variant % 2]] if by_name else []
    fallback = [("example " + words(name)).strip() if name else "example"]
    # a second example of a tool prefers the name's second value to the description's example again
    candidates = fmt + (named + described if variant % 2 else described + named) + fallback
    lo, hi = int(schema.get("minLength", 1)), schema.get("maxLength")
    pattern = schema.get("pattern")
    for c in candidates:
        if len(c) < lo:
            c = c + "x" * (lo - len(c))
        if hi is not None and len(c) > int(hi):
            c = c[: int(hi)]
        if not c and lo > 0:
            continue
        if pattern is not None:
            try:
                if re.search(pattern, c) is None:
                    continue
            except re.error:
                raise NoPlaceholder(f"{name}: a pattern Python cannot read") from None
        return c
    raise NoPlaceholder(f"{name}: no placeholder matches {pattern!r}")


def _bounded(schema: dict, value, *, integer: bool):
    """`value` moved inside the schema's bounds (and onto its multipleOf)."""
    lo, hi = schema.get("minimum"), schema.get("maximum")
    xlo, xhi = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    step = schema.get("multipleOf")
    if isinstance(xlo, bool) or isinstance(xhi, bool):  # draft 4's boolean exclusives
        xlo, lo = (lo, None) if xlo else (None, lo)
        xhi, hi = (hi, None) if xhi else (None, hi)
    nudge = 1 if integer else 0.5
    if lo is not None and value < lo:
        value = lo
    if xlo is not None and value <= xlo:
        value = xlo + nudge
    if hi is not None and value > hi:
        value = hi
    if xhi is not None and value >= xhi:
        value = xhi - nudge
    if step:
        value = round(value / step) * step
    if integer:
        if value != int(value):
            raise NoPlaceholder("no integer fits the bounds")
        value = int(value)
    ok = ((lo is None or value >= lo) and (hi is None or value <= hi) and (xlo is None or value > xlo)
          and (xhi is None or value < xhi) and (not step or abs(value / step - round(value / step)) < 1e-9))
    if not ok:
        raise NoPlaceholder("no value fits the bounds")
    return value
