"""railcall's BFCL checker against BFCL's own, on every single-turn category of the installed
bfcl-eval package: every gold answer passes both, and on replies changed in each way a model
gets things wrong (another function, a missing or extra parameter, another value, another type,
calls in another order) the two give the same verdict.

BFCL's checker is imported from the installed wheel as an oracle. Its module imports the
leaderboard's model table (and through it every provider's SDK), which the checker uses only to
ask whether a model writes dots in names as underscores; that one module is replaced by a table
that says no for every model. Nothing else of BFCL's is changed.
"""

from __future__ import annotations

import copy
import json
import sys
import types

import pytest

from railcall.data import bfcl_data
from railcall.eval import bfcl
from railcall.eval.checker import check_calls

DATA = bfcl_data()


@pytest.fixture(scope="module")
def oracle():
    class _NoDots:
        underscore_to_dot = False

    stub = types.ModuleType("bfcl_eval.constants.model_config")
    stub.MODEL_CONFIG_MAPPING = type("Always", (dict,), {"__missing__": lambda self, k: _NoDots()})()
    saved = {k: sys.modules.get(k) for k in ("bfcl_eval.constants.model_config", "bfcl_eval.eval_checker.ast_eval.ast_checker")}
    sys.modules["bfcl_eval.constants.model_config"] = stub
    sys.modules.pop("bfcl_eval.eval_checker.ast_eval.ast_checker", None)
    from bfcl_eval.constants.enums import Language
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker

    langs = {"python": Language.PYTHON, "java": Language.JAVA, "javascript": Language.JAVASCRIPT}

    def verdict(task: bfcl.Task, calls: list[dict] | None) -> bool:
        if task.expects != "calls":  # BFCL's relevance rule: a non-empty list of calls or not
            return bool(calls) == (task.expects == "any")
        if not calls:
            return False
        out = [{c["tool"]: c["args"]} for c in calls]
        return bool(ast_checker(task.functions, out, task.ground_truth, langs[task.language], task.category,
                                "railcall")["valid"])

    yield verdict
    for k, mod in saved.items():
        if mod is None:
            sys.modules.pop(k, None)
        else:
            sys.modules[k] = mod


# --- gold answers written as replies -------------------------------------------------------------

def _first(acceptable):
    """The first acceptable value other than "" (omission), with nested acceptable lists made plain
    (deeper in an object, BFCL writes plain values rather than lists of them)."""
    if not isinstance(acceptable, list):
        return _plain(acceptable)
    return _plain(next(x for x in acceptable if x != ""))


def _plain(v):
    if isinstance(v, dict):  # an object's keys hold acceptable lists; optional ones are left out
        return {k: _first(x) for k, x in v.items() if not (isinstance(x, list) and "" in x)}
    return [_plain(x) for x in v] if isinstance(v, list) else v


def _java(v, kind: str, items: str | None = None) -> str:
    """A gold value in Java syntax, as the declared type asks for it."""
    if isinstance(v, str) or kind in ("String", "any", "char"):
        return v if isinstance(v, str) else json.dumps(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if kind == "long":
        return f"{v}L"
    if kind == "float":
        return f"{float(v)}f"
    if kind == "double":
        return str(float(v))
    if kind == "ArrayList":
        return "new ArrayList<>(Arrays.asList(" + ", ".join(json.dumps(x) if items == "String" else _java(x, items or "any")
                                                            for x in v) + "))"
    if kind == "Array":
        return f"new {items or 'Object'}[]{{" + ", ".join(_java(x, items or "any") for x in v) + "}"
    if kind == "HashMap":
        puts = " ".join(f'put("{k}", {json.dumps(x) if isinstance(x, str) else _java(x, "any")});' for k, x in v.items())
        return f"new HashMap<String, Object>() {{{{ {puts} }}}}"
    return str(v)


def _js(v, kind: str, items: str | None = None) -> str:
    """A gold value in JavaScript syntax."""
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if kind == "Bigint":
        return f"{v}n"
    if kind == "float":
        return str(float(v))
    if isinstance(v, list):
        return "[" + ", ".join(json.dumps(x) if isinstance(x, str) else _js(x, items or "any") for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_js(x, 'any') if not isinstance(x, str) else x}" for k, x in v.items()) + "}"
    return str(v)


def gold_reply(task: bfcl.Task) -> list[dict]:
    calls = []
    for g in task.ground_truth:
        (name, params), = g.items()
        spec = next(f for f in task.functions if f["name"] == name)
        props = spec["parameters"].get("properties", {})
        required = set(spec["parameters"].get("required", []))
        args = {}
        for k, acc in params.items():
            if not any(x != "" for x in acc) or ("" in acc and k not in required):
                continue  # optional: left out, as a model may
            v = _first(acc)
            p = props.get(k, {})
            kind, items = p.get("type", "any"), (p.get("items") or {}).get("type")
            args[k] = _java(v, kind, items) if task.language == "java" else _js(v, kind, items) \
                if task.language == "javascript" else v
        calls.append({"tool": name, "args": args})
    return calls


# --- the ways a reply goes wrong -----------------------------------------------------------------

def _other(v):
    if isinstance(v, bool):
        return not v
    if isinstance(v, int):
        return v + 1
    if isinstance(v, float):
        return v + 0.5
    if isinstance(v, str):
        return v + " zz"
    if isinstance(v, list):
        return v + v[:1] if v else ["zz"]
    if isinstance(v, dict):
        return {**v, "zz": 1}
    return v


def _retyped(v):
    return str(v) if not isinstance(v, str) else (7 if not v.isdigit() else int(v))


def variants(calls: list[dict]):
    """(what changed, the changed reply) for one gold reply."""
    yield "reversed", calls[::-1]
    yield "no call", None
    yield "renamed", [{**calls[0], "tool": calls[0]["tool"] + "_x"}] + calls[1:]
    yield "extra parameter", [{**calls[0], "args": {**calls[0]["args"], "zz_extra": 1}}] + calls[1:]
    yield "one more call", calls + calls[:1]
    for i, c in enumerate(calls[:2]):
        for k in list(c["args"])[:3]:
            for what, change in (("dropped", None), ("other value", _other), ("other type", _retyped)):
                changed = copy.deepcopy(calls)
                if change is None:
                    del changed[i]["args"][k]
                else:
                    changed[i]["args"][k] = change(changed[i]["args"][k])
                yield f"{what} {k}", changed


@pytest.mark.parametrize("category", bfcl.SINGLE_TURN)
def test_railcalls_checker_agrees_with_bfcls_on_every_category(category, oracle):
    tasks = bfcl.load_category(DATA, category)
    assert tasks, category
    compared = disagreements = 0
    gold_passed = 0
    unreachable = []
    for t in tasks:
        if t.expects != "calls":
            for calls in (None, [{"tool": t.functions[0]["name"] if t.functions else "f", "args": {}}]):
                ours = check_calls(t.functions, calls, t.ground_truth, language=t.language, expects=t.expects).ok
                assert ours == oracle(t, calls), (t.id, calls)
            continue
        gold = gold_reply(t)
        theirs = oracle(t, gold)
        ours = check_calls(t.functions, gold, t.ground_truth, language=t.language).ok
        assert ours == theirs, (t.id, json.dumps(gold))
        if theirs:
            gold_passed += 1
        else:
            unreachable.append(t.id)
        for what, calls in variants(gold):
            compared += 1
            ours = check_calls(t.functions, calls, t.ground_truth, language=t.language).ok
            if ours != oracle(t, calls):
                disagreements += 1
                pytest.fail(f"{t.id}, {what}: railcall says {ours}, BFCL the opposite; reply {json.dumps(calls)}")
    if tasks[0].expects == "calls":
        # Gold answers BFCL's own checker refuses however they are written: a parameter with no
        # acceptable value at all (two live_simple tasks); a Java list of `any` whose gold elements
        # are numbers or booleans, which BFCL's converter reads back as strings (simple_java_36,
        # _65); an object whose gold values are not lists of acceptable values (simple_java_64).
        assert len(unreachable) <= 3, unreachable
        assert compared > 3 * len(tasks) and disagreements == 0


def test_no_call_and_any_call_categories_are_told_apart():
    irr = bfcl.load_category(DATA, "live_irrelevance", limit=5)
    rel = bfcl.load_category(DATA, "live_relevance", limit=5)
    assert {t.expects for t in irr} == {"none"} and {t.expects for t in rel} == {"any"}
    assert bfcl.tool_choice(irr) == bfcl.tool_choice(rel) == "auto"
    call = [{"tool": rel[0].functions[0]["name"], "args": {}}]
    assert check_calls(rel[0].functions, call, [], expects="any").ok
    assert not check_calls(rel[0].functions, None, [], expects="any").ok
    assert not check_calls(irr[0].functions, call, [], expects="none").ok
