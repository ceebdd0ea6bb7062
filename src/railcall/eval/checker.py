"""Is the output a call, is it valid, is it right: parse, schema validity and BFCL's AST rules.

Three questions, each a superset of the next:

- parses: the whole reply (surrounding whitespace aside) is the wire format: one JSON object
  {"tool": <string>, "args": <object>} with no other keys, or a non-empty JSON array of them
  (several calls). Nothing else counts: not prose around it, not a Markdown code fence.
- valid: it parses, every call names a tool of the task's table and its arguments validate
  against that tool's JSON Schema (BFCL's dialect mapped as `railcall.grammar.bfcl` maps it).
- AST-correct (`check_calls`), BFCL's AST checker rules, written from their description:
    * the right function (names compared exactly; dots are part of the name);
    * every parameter the function requires is present, and no parameter that is neither in
      the function's spec nor in the gold answer ("unexpected parameter");
    * each value has the type the spec declares -- except that an integer is accepted where a
      float is expected (and is compared as that float); a boolean is never an integer;
      arrays' items are type-checked the same way;
    * each value is among the acceptable values: strings after BFCL's normalisation
      (lowercase; spaces and , . / - _ * ^ dropped; ' read as "), lists element by element
      (in order), objects key by key against the acceptable objects;
    * a gold parameter may be omitted only when "" is among its acceptable values (optional);
    * several calls (parallel): as many calls as gold calls, matched in any order. Where BFCL
      takes, for each gold call, the first unused model call that fits, this checker finds a
      full matching (augmenting paths); the two agree unless one model call fits several gold
      calls, where the greedy choice can miss a matching that exists.
    * a task whose gold answer is no call is right when the reply is not a call.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Sequence

_STRIP = re.compile(r"[ ,./\-_*^]")


def normalise(s: str) -> str:
    """BFCL's string normalisation: drop spaces and , . / - _ * ^, lowercase, ' -> "."""
    return _STRIP.sub("", s).lower().replace("'", '"')


# --- parsing -------------------------------------------------------------------------------------

def _is_call(x) -> bool:
    return isinstance(x, dict) and set(x) == {"tool", "args"} and isinstance(x["tool"], str) \
        and isinstance(x["args"], dict)


def parse_calls(text: str) -> list[dict] | None:
    """The calls in `text` if the whole reply is the wire format (one call or an array); else None."""
    try:
        value = json.loads(text.strip())
    except ValueError:
        return None
    if _is_call(value):
        return [value]
    if isinstance(value, list) and value and all(_is_call(c) for c in value):
        return value
    return None


def decided(text: str) -> bool:
    """True once `text` can never become a call by appending more: the reply does not start
    with { or [, or a complete JSON value is followed by more text or is not a call. Used to
    end a free-running reply early without changing any verdict."""
    s = text.lstrip()
    if not s:
        return False
    if s[0] not in "{[":
        return True
    try:
        value, end = json.JSONDecoder().raw_decode(s)
    except ValueError:
        return False  # incomplete (or invalid in a way only more text would show)
    if s[end:].strip():
        return True
    return parse_calls(s) is None


# --- validity ------------------------------------------------------------------------------------

def valid_calls(calls: Sequence[dict] | None, tools) -> bool:
    """Every call names a tool of `tools` and its args validate against the tool's schema."""
    if not calls:
        return False
    from jsonschema import Draft202012Validator

    by_name = {t.name: t for t in tools}
    for c in calls:
        tool = by_name.get(c["tool"])
        if tool is None:
            return False
        if not Draft202012Validator(tool.parameters).is_valid(c["args"]):
            return False
    return True


# --- the AST checker -----------------------------------------------------------------------------

@dataclass
class Verdict:
    ok: bool
    reason: str = ""  # why not, for the first gold call that failed


_INT = {"integer", "int", "long", "short", "byte", "Integer", "Long", "BigInteger"}
_FLOAT = {"float", "number", "double", "Double", "Float"}
_STR = {"string", "String", "char", "Character"}
_BOOL = {"boolean", "bool", "Boolean"}
_LIST = {"array", "tuple", "list", "ArrayList", "List", "Array", "Set"}
_DICT = {"dict", "object", "HashMap", "Hashtable", "Map"}


def _type_ok(value, spec) -> bool:
    """The value has the type `spec` declares (int accepted for float; no declared type: any)."""
    kind = spec.get("type") if isinstance(spec, dict) else None
    if not isinstance(kind, str) or kind == "any":
        return True
    if kind in _INT:
        return type(value) is int
    if kind in _FLOAT:
        return type(value) in (int, float)
    if kind in _STR:
        return isinstance(value, str)
    if kind in _BOOL:
        return isinstance(value, bool)
    if kind in _LIST:
        items = spec.get("items")
        return isinstance(value, list) and all(_type_ok(v, items) for v in value)
    if kind in _DICT:
        return isinstance(value, dict)
    return True


def _value_ok(value, acceptable) -> bool:
    """`value` equals one acceptable value (BFCL's normalisation for strings)."""
    return any(_same(value, a) for a in acceptable)


def _same(v, a) -> bool:
    if isinstance(v, str):
        return isinstance(a, str) and normalise(v) == normalise(a)
    if isinstance(v, bool) or isinstance(a, bool):
        return type(v) is type(a) and v == a
    if isinstance(v, (int, float)):
        return isinstance(a, (int, float)) and float(v) == float(a)
    if isinstance(v, list):
        return isinstance(a, list) and len(v) == len(a) and all(_same(x, y) for x, y in zip(v, a))
    if isinstance(v, dict):
        return isinstance(a, dict) and _dict_ok(v, a)
    return v == a


def _dict_ok(v: dict, a: dict) -> bool:
    """An object argument against one acceptable object whose values are acceptable-value
    lists (BFCL nests them) or plain values."""
    for k, x in v.items():
        if k not in a:
            return False
        if not (_value_ok(x, a[k]) if isinstance(a[k], list) else _same(x, a[k])):
            return False
    for k, acc in a.items():
        if k not in v and not (isinstance(acc, list) and "" in acc):
            return False
    return True


def check_call(functions: Sequence[dict], call: dict, gold: dict) -> Verdict:
    """One model call against one gold call {name: {param: [acceptable values]}}."""
    (name, answers), = gold.items()
    if call["tool"] != name:
        return Verdict(False, f"wrong function: {call['tool']!r}, expected {name!r}")
    spec = next((f for f in functions if f["name"] == name), None)
    params = ((spec or {}).get("parameters") or {})
    props = params.get("properties") or {}
    args = call["args"]
    for r in params.get("required") or []:
        if r not in args:
            return Verdict(False, f"missing required parameter {r!r}")
    for k, v in args.items():
        if k not in props or k not in answers:
            return Verdict(False, f"unexpected parameter {k!r}")
        if not _type_ok(v, props[k]):
            return Verdict(False, f"type of {k!r}: {json.dumps(v)} is not {props[k].get('type')}")
        if not _value_ok(v, answers[k]):
            return Verdict(False, f"value of {k!r}: {json.dumps(v)} not among {json.dumps(answers[k])}")
    for k, acc in answers.items():
        if k not in args and "" not in acc:
            return Verdict(False, f"missing parameter {k!r} (not optional in the gold answer)")
    return Verdict(True)


def check_calls(functions: Sequence[dict], calls: Sequence[dict] | None, ground_truth: Sequence[dict]) -> Verdict:
    """The reply's calls (None: not a call) against the gold calls, in any order."""
    if not ground_truth:
        return Verdict(not calls, "" if not calls else "a call was made; the right answer is no call")
    if not calls:
        return Verdict(False, "no call")
    if len(calls) != len(ground_truth):
        return Verdict(False, f"{len(calls)} calls, expected {len(ground_truth)}")
    if len(ground_truth) == 1:
        return check_call(functions, calls[0], ground_truth[0])
    fits = [[check_call(functions, c, g).ok for c in calls] for g in ground_truth]  # (gold, model)
    owner = [-1] * len(calls)  # model call -> the gold call it is matched to

    def augment(g: int, seen: set) -> bool:
        for c, ok in enumerate(fits[g]):
            if ok and c not in seen:
                seen.add(c)
                if owner[c] < 0 or augment(owner[c], seen):
                    owner[c] = g
                    return True
        return False

    for g in range(len(ground_truth)):
        if not augment(g, set()):
            first = next((check_call(functions, c, ground_truth[g]) for c in calls
                          if c["tool"] == next(iter(ground_truth[g]))), None)
            why = first.reason if first else "no call to this function"
            return Verdict(False, f"gold call {g + 1} unmatched: {why}")
    return Verdict(True)
