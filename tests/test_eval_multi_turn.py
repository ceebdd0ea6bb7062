"""BFCL's multi-turn tasks on the agent loop: the live table is the simulated services' functions
bound to the task's own instances, each turn an episode, the calls scored by BFCL's own checker.
The model is a scripted test double (a byte vocabulary whose logits prefer a scripted reply; the
grammar still decides every byte)."""

from __future__ import annotations

import ast
import inspect
import json

import pytest
from agentkit import scripted_model

from railcall.data import bfcl_data
from railcall.runtime.decode import SamplingParams
from railcall.eval import multi_turn as mt

DATA = bfcl_data()
BYTES = SamplingParams(max_tokens=400)  # the scripted vocabulary spells a call byte by byte


def as_call(text: str, table) -> dict:
    """A gold call (`sort('final_report.pdf')`) as a railcall call, positional arguments named."""
    node = ast.parse(text, mode="eval").body
    name = node.func.id
    handler = table.entry(name).handler
    target = handler.__defaults__[0] if handler.__defaults__ else handler  # the bound method behind the lambda
    args = inspect.signature(target).bind_partial(*[ast.literal_eval(a) for a in node.args],
                                                  **{k.arg: ast.literal_eval(k.value) for k in node.keywords}).arguments
    return {"tool": name, "args": dict(args)}


def reply(call: dict) -> str:
    return json.dumps(call, separators=(",", ":"), ensure_ascii=False)


@pytest.mark.parametrize("category", mt.MULTI_TURN)
def test_every_gold_trajectory_passes_bfcls_checker_and_an_empty_one_fails(category):
    tasks = mt.load(DATA, category)
    assert len(tasks) == 200
    for t in tasks:
        gold = [[[c] for c in turn] for turn in t.ground_truth]
        assert mt.score(t, gold) == (True, ""), t.id
        ok, why = mt.score(t, [[] for _ in gold])
        assert not ok and why


def test_the_table_is_the_tasks_functions_bound_to_its_own_state():
    (t,) = mt.load(DATA, "multi_turn_base", limit=1)
    assert t.involved == ["TwitterAPI", "GorillaFileSystem"] and "cp" in t.entry["excluded_function"]
    a, b = mt.backends(t), mt.backends(t)
    table = mt.tool_table(mt.function_docs(DATA, t), a)
    assert "cp" not in table and {"mv", "cd", "post_tweet", "answer"} <= set(table.names())
    table.entry("cd").call({"folder": "document"})
    assert a["GorillaFileSystem"]._current_dir.name == "document"
    assert b["GorillaFileSystem"]._current_dir.name == "workspace"  # another instance, untouched
    assert mt.call_text({"tool": "mv", "args": {"source": "a.pdf", "destination": "temp", "n": 2, "f": True}}) == \
        "mv(source='a.pdf', destination='temp', n=2, f=True)"
    with pytest.raises(ValueError, match="not a multi-turn category"):
        mt.load(DATA, "multi_turn_miss_func")


def _script(t, table, wrong_turn: int | None = None) -> list[str]:
    """The gold calls of each turn, then `answer`; in `wrong_turn` the first call's arguments changed."""
    out = []
    for i, turn in enumerate(t.ground_truth):
        for j, text in enumerate(turn):
            call = as_call(text, table)
            if i == wrong_turn and j == 0:
                call["args"] = {k: (v + "_x" if isinstance(v, str) else v) for k, v in call["args"].items()}
            out.append(reply(call))
        out.append(reply({"tool": "answer", "args": {"text": "done"}}))
    return out


def test_episodes_of_the_gold_calls_are_right_and_a_wrong_call_is_not():
    (t,) = mt.load(DATA, "multi_turn_base", limit=1)
    table = mt.tool_table(mt.function_docs(DATA, t), mt.backends(t))
    good = mt.run_task(scripted_model(_script(t, table)), t, DATA, params=BYTES)
    assert good["ok"], good["reason"]
    assert good["turns_answered"] == good["turns"] == 4
    assert [len(turn) for turn in good["calls"]] == [len(turn) for turn in t.ground_truth]
    assert good["calls"][0][0] == ["cd(folder='document')"]
    bad = mt.run_task(scripted_model(_script(t, table, wrong_turn=0)), t, DATA, params=BYTES)
    assert not bad["ok"] and bad["reason"]


def test_later_turns_see_the_earlier_ones():
    (t,) = mt.load(DATA, "multi_turn_base", limit=1)
    table = mt.tool_table(mt.function_docs(DATA, t), mt.backends(t))
    renders: list = []
    mt.run_task(scripted_model(_script(t, table), renders), t, DATA, params=BYTES)
    last = renders[-1]  # the messages of the last step: system, earlier turns, this turn, its steps
    # a user message right after one of this turn's calls is its observation; the others are requests
    requests = [m["content"] for prev, m in zip([None] + last, last) if m["role"] == "user"
                and not (prev and prev["role"] == "assistant" and prev["content"] != "done")]
    assert requests == [turn[0]["content"] for turn in t.turns]
    assert [m["content"] for m in last if m["role"] == "assistant"][:3] == ["done"] * 3  # the earlier answers


def test_a_torn_results_line_is_mended_and_its_task_run_again(tmp_path, monkeypatch):
    """`run` appends a line per task; resumed, it skips those done and repairs a torn last line."""
    (t1, t2) = mt.load(DATA, "multi_turn_base", limit=2)
    done = {"category": t1.category, "id": t1.id, "ok": True, "reason": "", "calls": [], "turns": 4,
            "turns_answered": 4, "steps": 5, "seconds": 1.0}
    (tmp_path / "results.jsonl").write_text(json.dumps(done) + "\n" + '{"category": "multi_turn_base", "id": "multi')
    ran = []

    def fake_task(model, task, data, **kw):
        ran.append(task.id)
        return {**done, "id": task.id, "ok": False}

    monkeypatch.setattr(mt, "run_task", fake_task)
    monkeypatch.setattr("railcall.agent.loop.AgentModel.load", classmethod(lambda cls, m=None: scripted_model([])))
    summary = mt.run(["multi_turn_base"], tmp_path, data=DATA, limit=2, resume=True)
    assert ran == [t2.id]
    assert summary["categories"]["multi_turn_base"]["n"] == 2 and summary["categories"]["multi_turn_base"]["accuracy"] == 0.5
