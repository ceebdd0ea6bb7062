"""Grounded arguments: the numbers a request states as the only numbers a call may write, and
as many calls as those numbers fill.

Under the grammar every call parses; its values are still the model's, and a small model's
numbers are often not the request's. On BFCL's simple_python, SmolLM2-135M wrote `1000` for
"invest $5000", `1` for "the factorial of 5", `100` for "a mass of 20 kg": beside a right tool,
a wrong number is its most common mistake. Most of BFCL's gold numbers for required arguments
are written in the question (285 of 346 in simple_python, 559 of 594 in parallel). Grounding
makes every other number unwritable:

- `stated_numbers(text)`: the numbers a request states, in order. `5,000,000` is one number;
  `12%` may stand for 12 or for 0.12 (APIs differ on which they want); a date, a time, a
  version, a range or a phone number (`2021-01-01`, `10:30`, `3.2.1`, `10-20`, `555-0134`) is
  no number, nor is a digit inside a word (`x2`, `3rd`) or one with a leading zero (`007`).
  `Maroon 5` still is one: nothing in the text tells a name apart.
- `ground_tools(tools, numbers)`: every required top-level argument of type integer or number
  (without an enum or const of its own) becomes an enum of the numbers that fit its type and
  bounds. Optional ones stay free: narrowed, SmolLM2 filled them with the request's numbers
  where their defaults were right. Where no number fits, the argument stays free: the grammar
  never gets an empty choice.
- `calls_needed(tools, stated, listed)`: how many calls the numbers fill. For each tool,
  stated // (its required numeric arguments), or a list's length where a list of numbers
  varies one argument and the others are stated once ("$1000 at 5% for 1, 5 and 10 years": 3);
  the fewest over the table (a tool that takes every number in one call asks for one call); 1
  for a tool without a required numeric argument, or with a required array of numbers (it
  holds any count). On BFCL's gold answers the count is right for 389 of 400 simple_python
  tasks, 200 of 200 multiple and 73 of 200 parallel ones; where it is wrong in parallel it says
  too few, mostly where a request lists names, not numbers ("for Microsoft and Apple").

`ground(tools, text)` does all three, and gives each call its own part of the numbers, so a
call that repeats the one before is unwritable (see `ground`). Its `Grounding` is what the
grammar is built from: `call_sequence_grammar(g.per_call, fmt)` where `g.per_call` (more than
one call), else the usual grammar over `g.tools`. `railcall eval bfcl --values grounded`, and
the server's request extension `"values": "grounded"`, do this. It is a heuristic over the
request's text, measured on BFCL (docs/evaluation.md): a number the right call needs but the
request does not state ("a week" for 7 days) becomes unwritable.

Pure functions of the request and the table: nothing is kept between requests.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Sequence

from railcall.grammar.tools import Tool

# A number as a person writes it: digits with thousands separators or plain, a decimal part, a
# sign where it stands before the digits. Not inside a word or a dotted/dashed/slashed/colon
# run (dates, times, versions, phone numbers, ids), not with a leading zero (an id, `007`).
_NUMBER = re.compile(
    r"(?<![\w.:/\\-])(?<![\w.]-)"  # not glued to what comes before
    r"(?P<sign>-)?"
    r"(?P<digits>(?:0|[1-9]\d{0,2}(?:,\d{3})+|[1-9]\d*)(?:\.\d+)?)"
    r"(?P<pct>\s?%)?"
    r"(?![\w]|[.:/-]\d)"  # not glued to what comes after
)
_JOINED = re.compile(r"\s*(?:,\s*(?:and|or)?|and|or|&)\s*")  # between two numbers of a list
_MAX_NUMBERS = 32  # a request listing more is data, not arguments: its enums would only grow
_MAX_CALLS = 8  # more parallel calls than this from one request is not what the count is for


def stated_numbers(text: str) -> list[tuple]:
    """Each number `text` states, in order, as the values it may stand for: (5,) for "5",
    (12, 0.12) for "12%". A number stated twice is there twice."""
    return [values for values, _ in _stated(text)]


def _stated(text: str, latest: bool = False) -> list[tuple[tuple, re.Match]]:
    """Each number with its match, the first `_MAX_NUMBERS` (the last ones where `latest`)."""
    out = []
    for m in _NUMBER.finditer(text):
        digits = m.group("digits").replace(",", "")
        value: int | float = float(digits) if "." in digits else int(digits)
        if m.group("sign"):
            value = -value
        out.append(((value, _fraction(value)) if m.group("pct") else (value,), m))
    return out[-_MAX_NUMBERS:] if latest else out[:_MAX_NUMBERS]


def listed_numbers(text: str) -> tuple[int, int]:
    """(where it starts, how many) of the longest list of numbers `text` writes: numbers joined
    by nothing but commas, "and", "or" ("for 1, 5 and 10 years"); (0, 1) where there is none."""
    found = _stated(text)
    best, start = (0, 1), 0
    for i in range(1, len(found) + 1):
        if i == len(found) or not _JOINED.fullmatch(text[found[i - 1][1].end():found[i][1].start()]):
            if i - start > best[1]:
                best = (start, i - start)
            start = i
    return best


def request_numbers(text: str) -> list[int | float]:
    """The numbers `text` states, in order, once each (a percentage also as its fraction)."""
    return _distinct(v for values in stated_numbers(text) for v in values)


def _distinct(values) -> list:
    out: list = []
    for v in values:
        if not any(v == o and type(v) is type(o) for o in out):
            out.append(v)
    return out


def _fraction(percent: int | float) -> float:
    return round(percent / 100, 10)


def _fits(value, schema: dict) -> bool:
    kinds = schema.get("type")
    kinds = [kinds] if isinstance(kinds, str) else list(kinds or [])
    if "integer" in kinds and "number" not in kinds:
        if isinstance(value, float):
            if not value.is_integer():
                return False
    lo, hi = schema.get("minimum"), schema.get("maximum")
    xlo, xhi = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    step = schema.get("multipleOf")
    if isinstance(lo, (int, float)) and value < lo or isinstance(hi, (int, float)) and value > hi:
        return False
    if isinstance(xlo, (int, float)) and not isinstance(xlo, bool) and value <= xlo:
        return False
    if isinstance(xhi, (int, float)) and not isinstance(xhi, bool) and value >= xhi:
        return False
    if isinstance(step, (int, float)) and step > 0 and not math.isclose(value / step, round(value / step)):
        return False
    return True


def _numeric(schema) -> bool:
    if not isinstance(schema, dict) or "enum" in schema or "const" in schema:
        return False
    kinds = schema.get("type")
    kinds = [kinds] if isinstance(kinds, str) else kinds
    return bool(kinds) and all(k in ("integer", "number") for k in kinds)


def _ground(parameters: dict, numbers: Sequence[int | float]) -> dict:
    """`parameters` with each required numeric argument narrowed to the `numbers` that fit it
    (a copy; the input is not changed)."""
    props = parameters.get("properties")
    if not isinstance(props, dict):
        return parameters
    narrowed = dict(props)
    for name in parameters.get("required") or []:
        schema = props.get(name)
        if not _numeric(schema):
            continue
        integer = "number" not in ([schema["type"]] if isinstance(schema["type"], str) else schema["type"])
        fit = list(dict.fromkeys(int(v) if integer else v for v in numbers if _fits(v, schema)))
        if fit:
            narrowed[name] = {**schema, "enum": fit}
    return {**parameters, "properties": narrowed}


def ground_tools(tools: Sequence[Tool], numbers: Sequence[int | float]) -> list[Tool]:
    """`tools` with every required numeric argument narrowed to the numbers that fit it (module
    docstring); `tools` themselves are not changed. No numbers: the tools as they are."""
    if not numbers:
        return list(tools)
    return [dataclasses.replace(t, parameters=_ground(t.parameters, numbers)) for t in tools]


def required_numeric(tool: Tool) -> int | None:
    """How many of `tool`'s required top-level arguments are numbers; None where one required
    argument is an array of numbers (it holds any count of them)."""
    props = tool.parameters.get("properties") or {}
    required = [props.get(name) for name in tool.parameters.get("required") or []]
    if any(isinstance(p, dict) and p.get("type") == "array" and _numeric(p.get("items")) for p in required):
        return None
    return sum(1 for p in required if _numeric(p))


def calls_needed(tools: Sequence[Tool], stated: int, listed: int = 1) -> int:
    """How many calls `stated` numbers (as stated_numbers counts them) fill, `listed` of them
    one list (module docstring): at least 1, at most _MAX_CALLS."""
    return max(1, min(min((_calls(k, stated, listed) for k in map(required_numeric, tools)), default=1), _MAX_CALLS))


def _calls(k: int | None, stated: int, listed: int) -> int:
    if not k:
        return 1  # no required number, or an array that holds any count of them
    # a list that varies one argument, the others stated once: "$1000 at 5% for 1, 5 and 10 years"
    by_list = listed if listed > 1 and stated > k and stated - listed == k - 1 else 1
    return max(stated // k, by_list)


@dataclass(frozen=True)
class Grounding:
    tools: list[Tool]  # the table, required numeric arguments narrowed to the request's numbers
    calls: int  # how many calls the reply makes (1: one call, or as many as the grammar allows)
    per_call: list[list[Tool]] | None  # calls > 1: call i's table, its numbers call i's part of the request
    numbers: tuple  # the numbers found, in order, each as the values it may stand for


def ground(tools: Sequence[Tool], text: str, seen: str = "") -> Grounding:
    """The grounding of one request (`text`: what the user wrote) over `tools`. With more than
    one call, each call's numeric arguments take their own part of the numbers: where a list
    varies one argument, the numbers outside the list and the list's item i ("$1000 at 5% for
    1, 5 and 10 years" -> 1000, 5% and 1; then 5; then 10); otherwise consecutive parts of the
    stated numbers, one per call ("5 and 10 ... 20 and 30" -> 5 and 10, then 20 and 30). A call
    that repeats the one before is then unwritable.

    `seen`: the rest of the conversation (earlier user messages, tool results). Its numbers may
    be written too, in every call (an order id a tool returned, a party size said two turns
    ago), but they do not count towards how many calls the request asks for. Where `seen`
    states more numbers than are kept, the latest are kept (the newest tool result)."""
    stated = stated_numbers(text)
    extra = [values for values, _ in _stated(seen, latest=True)] if seen else []
    start, listed = listed_numbers(text)
    calls = calls_needed(tools, len(stated), listed)
    per_call = None
    if calls > 1:
        if calls == listed and calls > calls_needed(tools, len(stated)):
            shared = stated[:start] + stated[start + listed:]
            parts = [shared + [stated[start + i]] for i in range(calls)]
        else:
            cut = [len(stated) * i // calls for i in range(calls + 1)]
            parts = [stated[cut[i]:cut[i + 1]] for i in range(calls)]
        per_call = [ground_tools(tools, _distinct(v for part in p + extra for v in part)) for p in parts]
    numbers = _distinct(v for part in stated + extra for v in part)
    return Grounding(ground_tools(tools, numbers), calls, per_call, tuple(stated + extra))
