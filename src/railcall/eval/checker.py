"""Is the output a call, is it valid, is it right: parse, schema validity and BFCL's AST rules.

Three questions, each a superset of the next:

- parses: the whole reply (surrounding whitespace aside) is the wire format: one JSON object
  {"tool": <string>, "args": <object>} with no other keys, or a non-empty JSON array of them
  (several calls). Nothing else counts: not prose around it, not a Markdown code fence.
- valid: it parses, every call names a tool of the task's table and its arguments validate
  against that tool's JSON Schema (BFCL's dialect mapped as `railcall.eval.bfcl_dialect` maps it).
- AST-correct (`check_calls`): BFCL's AST checker rules (bfcl-eval 2026.3.23), written anew
  and tested against BFCL's own checker on every gold answer of every single-turn category:
    * the right function (names compared exactly; dots are part of the name);
    * every parameter the function requires is present, and no parameter that is neither in
      the function's spec nor in the gold answer ("unexpected parameter");
    * each value has the type the spec declares (`any` is a string; an integer is accepted where
      a float is expected, and compared as that float; a boolean is never an integer); a list's
      elements are type-checked one level down. Where the gold answer's values have another type
      than the declared one (the answer names a variable, e.g. a string for an integer), a value
      of the gold answer's type is accepted too, and compared exactly;
    * each value is among the acceptable values: strings after BFCL's normalisation
      (lowercase; spaces and , . / - _ * ^ dropped; ' read as "), also the strings directly
      inside a list or an object; objects key by key; lists of objects element by element;
    * a gold parameter may be omitted only when "" is among its acceptable values (optional);
    * Java and JavaScript (`language`): every value must be a string in the language's syntax,
      turned into a value by BFCL's own converters (from the installed bfcl-eval package), then
      checked as above;
    * several calls (parallel): as many calls as gold calls, in any order; for each gold call in
      turn, the first model call not yet used that fits it (BFCL's greedy rule);
    * a task whose right answer is no call is right when the reply is not a call; one whose right
      answer is any call (BFCL's relevance category), when it is a call.
"""

from __future__ import annotations

import functools
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


# The shapes a free reply's call may take, read as the wire format's {"tool", "args"}: the wire
# format itself, OpenAI's function object, and OpenAI's tool-call object.
_NAME_KEYS = (("tool", "args"), ("name", "arguments"), ("name", "parameters"), ("function", "arguments"))


def _as_call(x) -> dict | None:
    if isinstance(x, dict) and isinstance(x.get("function"), dict) and set(x) <= {"function", "type", "id"}:
        x = x["function"]
    if not isinstance(x, dict):
        return None
    for name, args in _NAME_KEYS:
        if set(x) == {name, args} and isinstance(x[name], str):
            value = x[args]
            if isinstance(value, str):  # OpenAI's arguments are a JSON string
                try:
                    value = json.loads(value)
                except ValueError:
                    return None
            return {"tool": x[name], "args": value} if isinstance(value, dict) else None
    return None


def find_calls(text: str) -> list[dict] | None:
    """The calls a free reply makes, read tolerantly (the baseline's best reading): the first JSON
    value anywhere in the text -- inside prose, a Markdown fence, after a preamble -- that is a
    call or a non-empty array of calls, in the wire format or OpenAI's shapes (`_NAME_KEYS`),
    each returned as {"tool", "args"}. None where the text holds no such value."""
    decoder = json.JSONDecoder()
    for m in re.finditer(r"[\[{]", text):
        try:
            value, _ = decoder.raw_decode(text, m.start())
        except ValueError:
            continue
        one = _as_call(value)
        if one is not None:
            return [one]
        if isinstance(value, list) and value:
            many = [_as_call(c) for c in value]
            if all(c is not None for c in many):
                return many
    return None


def bfcl_calls(text: str, language: str = "python") -> list[dict] | None:
    """The calls of a reply in BFCL's own prompt-mode format (`[f(a=1), g(b="x")]`, the format
    its system prompt asks for), read by BFCL's own decoder from the bfcl-eval wheel
    (`default_decode_ast_prompting`, Java and JavaScript by its tree-sitter parsers), each as
    {"tool", "args"}; None where the decoder reads no call."""
    from bfcl_eval.constants.enums import ReturnFormat
    from bfcl_eval.model_handler.utils import default_decode_ast_prompting

    fmt = {"java": ReturnFormat.JAVA, "javascript": ReturnFormat.JAVASCRIPT}.get(language, ReturnFormat.PYTHON)
    try:
        decoded = default_decode_ast_prompting(text, fmt)
    except Exception:  # noqa: BLE001 -- BFCL scores any failure of its decoder as "not a call", as here
        return None
    if not isinstance(decoded, list) or not all(isinstance(d, dict) and len(d) == 1 for d in decoded):
        return None
    calls = [{"tool": name, "args": args} for d in decoded for name, args in d.items()]
    return calls if calls and all(isinstance(c["args"], dict) for c in calls) else None


def decided(text: str, stop: Sequence[str] = ()) -> bool:
    """True once `text` can never become a call by appending more: the reply does not start
    with { or [, or a complete JSON value is followed by more text or is not a call. Used to
    end a free-running reply early without changing any verdict. Text at the end that may be
    the start of one of the reply's `stop` strings is not counted yet: the stop string would end
    the reply before it ("}\nQues" may be a base model's next turn, "\nQuestion", on its way)."""
    held = max((n for st in stop for n in range(1, min(len(st), len(text)) + 1) if text.endswith(st[:n])), default=0)
    if held:
        text = text[:-held]
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


# BFCL's Python types (its harness sends `any` as a string, and its checker expects one)
_PYTHON_TYPES = {"string": str, "integer": int, "float": float, "boolean": bool, "array": list, "tuple": list,
                 "dict": dict, "any": str}
_LISTS = ("array", "tuple", "Array", "ArrayList")


@functools.lru_cache(maxsize=None)
def _language_types(language: str):
    """(declared type -> Python type, converter from a string in the language's syntax) for Java
    and JavaScript, from the installed bfcl-eval package (BFCL's own conversion rules). Looked up
    once per language, not per value."""
    from railcall.data import bfcl_data

    bfcl_data()  # a DataError saying how to install the package, if it is not
    from bfcl_eval.constants.type_mappings import JAVA_TYPE_CONVERSION, JS_TYPE_CONVERSION

    if language == "java":
        from bfcl_eval.eval_checker.ast_eval.type_convertor.java_type_converter import java_type_converter
        return JAVA_TYPE_CONVERSION, java_type_converter
    from bfcl_eval.eval_checker.ast_eval.type_convertor.js_type_converter import js_type_converter
    return JS_TYPE_CONVERSION, js_type_converter


def _std(x):
    return normalise(x) if isinstance(x, str) else x


def _answer_type(acceptable: list):
    return next((type(a) for a in acceptable if a != ""), None)


def _type_ok(value, acceptable: list, expected, nested) -> tuple[bool, bool]:
    """(the value's type is right, it stands for a variable): the declared type (`expected`, one
    level of `nested` element type for lists), or else the gold answer's own type."""
    answer = _answer_type(acceptable)
    variable = answer is not None and answer is not expected
    if type(value) is expected:
        if nested is None:
            return True, variable
        for acc in acceptable:  # the elements fit the element type, or that acceptable list's own
            if not isinstance(acc, list) or all(_type_ok(x, acc, nested, None)[0] for x in value):
                return True, variable
    if answer is not None and type(value) is answer:
        return True, True
    return False, False


def _dict_ok(value: dict, acceptable: list) -> bool:
    """An object against acceptable objects whose values are acceptable-value lists."""
    for acc in acceptable:
        if acc == "" or not isinstance(acc, dict):
            continue
        if all(k in acc and _std(v) in [_std(a) for a in acc[k]] for k, v in value.items()) and \
                all(k in value or "" in vals for k, vals in acc.items()):
            return True
    return False


def _list_of_dicts_ok(value: list, acceptable: list) -> bool:
    return any(len(value) == len(acc) and all(_dict_ok(v, [a]) for v, a in zip(value, acc))
               for acc in acceptable if isinstance(acc, (list, str)))


def _list_ok(value: list, acceptable: list) -> bool:
    return [_std(x) for x in value] in [[_std(y) for y in acc] for acc in acceptable if isinstance(acc, (list, str))]


def _check_value(k: str, value, acceptable: list, spec: dict, language: str) -> str:
    """Why `value` of parameter `k` fails (empty: it passes)."""
    kind = spec.get("type") if isinstance(spec, dict) else None
    items = spec.get("items") if isinstance(spec, dict) and isinstance(spec.get("items"), dict) else {}
    if language in ("java", "javascript"):
        table, convert = _language_types(language)
        if kind not in table:
            return ""  # BFCL has no rule for this type
        if not isinstance(value, str):
            return f"type of {k!r}: {json.dumps(value)} is not a string in {language} syntax"
        expected = table[kind]
        nested = table.get(items.get("type")) if kind in _LISTS else None
        try:
            value = convert(value, kind, items.get("type")) if nested else convert(value, kind)
        except Exception as e:  # BFCL's converters raise on some strings; a reply never crashes the run
            return f"value of {k!r}: {value!r} cannot be read as {language} {kind} ({type(e).__name__}: {e})"
    else:
        if kind not in _PYTHON_TYPES:
            return ""
        expected = _PYTHON_TYPES[kind]
        nested = _PYTHON_TYPES.get(items.get("type")) if kind in ("array", "tuple") else None
        if kind == "float" and type(value) is int:
            value = float(value)
    type_ok, variable = _type_ok(value, acceptable, expected, nested)
    if not type_ok:
        return f"type of {k!r}: {json.dumps(value)} is not {kind}"
    if variable:
        ok = value in acceptable
    elif expected is dict:
        ok = isinstance(value, dict) and _dict_ok(value, acceptable)
    elif expected is list and nested is dict:
        ok = _list_of_dicts_ok(value, acceptable)
    elif expected is str:
        ok = normalise(value) in [normalise(a) for a in acceptable if isinstance(a, str)]
    elif expected is list:
        ok = _list_ok(value, acceptable)
    else:
        ok = value in acceptable
    return "" if ok else f"value of {k!r}: {json.dumps(value)} not among {json.dumps(acceptable)}"


def check_call(functions: Sequence[dict], call: dict, gold: dict, language: str = "python") -> Verdict:
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
        why = _check_value(k, v, answers[k], props[k], language)
        if why:
            return Verdict(False, why)
    for k, acc in answers.items():
        if k not in args and "" not in acc:
            return Verdict(False, f"missing parameter {k!r} (not optional in the gold answer)")
    return Verdict(True)


def check_calls(functions: Sequence[dict], calls: Sequence[dict] | None, ground_truth: Sequence[dict], *,
                language: str = "python", expects: str = "calls") -> Verdict:
    """The reply's calls (None: not a call) against the gold calls, in any order. `expects`:
    "calls" (the gold calls), "none" (no call is right) or "any" (any call is right)."""
    if expects == "any":
        return Verdict(bool(calls), "" if calls else "no call; the right answer is a call")
    if not ground_truth:
        return Verdict(not calls, "" if not calls else "a call was made; the right answer is no call")
    if not calls:
        return Verdict(False, "no call")
    if len(calls) != len(ground_truth):
        return Verdict(False, f"{len(calls)} calls, expected {len(ground_truth)}")
    used: set[int] = set()
    for g, gold in enumerate(ground_truth):
        verdicts = [(c, check_call(functions, call, gold, language)) for c, call in enumerate(calls) if c not in used]
        match = next((c for c, v in verdicts if v.ok), None)
        if match is None:
            if len(ground_truth) == 1:
                return verdicts[0][1]
            first = next((v for c, v in verdicts if calls[c]["tool"] == next(iter(gold))), None)
            return Verdict(False, f"gold call {g + 1} unmatched: {first.reason if first else 'no call to this function'}")
        used.add(match)
    return Verdict(True)
