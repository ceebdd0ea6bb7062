"""The episode loop on a scripted model: the grammar steers, the gate decides, failures are
observations, every step is a trace line, and the table is read fresh at every step."""

from __future__ import annotations

import json

import pytest

from agentkit import scripted_model

from railcall.agent.builtins import calc
from railcall.agent.loop import Agent
from railcall.agent.policy import Approver, Policy
from railcall.agent.progress import Helps
from railcall.runtime.decode import SamplingParams


def call(tool, **args) -> str:
    return json.dumps({"tool": tool, "args": args}, separators=(",", ":"))


def make(tmp_path, replies, renders=None, **kw):
    (tmp_path / "notes.txt").write_text("Meeting on Thursday.")
    (tmp_path / "docs").mkdir(exist_ok=True)
    (tmp_path / "docs" / "plan.md").write_text("plan")
    kw.setdefault("trace", tmp_path / "trace.jsonl")
    # the loop's mechanics on a script: calc as written (not joined from numbers seen), and values
    # token by token (the legal counts per token are part of what is checked)
    kw.setdefault("helps", Helps.off("copied_numbers", "scored_values"))
    return Agent.for_workspace(tmp_path, scripted_model(replies, renders), **kw)


def trace(tmp_path):
    return [json.loads(line) for line in (tmp_path / "trace.jsonl").read_text().splitlines()]


def test_episode_trace_and_learned_skill(tmp_path):
    a = make(tmp_path, [call("read_file", path="notes.txt"), call("calc", expr="6*7"), call("answer", text="42")])
    ep = a.run("read and compute")
    assert ep.success and ep.answer == "42" and [c["tool"] for c in ep.calls] == ["read_file", "calc", "answer"]
    rows = trace(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[1]["result"] == "42"
    r = rows[0]
    assert r["call"] == {"tool": "read_file", "args": {"path": "notes.txt"}} and r["result"] == "Meeting on Thursday."
    assert r["approval"] == {"mode": "none", "approved": True, "reason": ""}
    assert len(r["legal"]) == r["tokens"] and r["forced"] > 0 and max(x for x in r["legal"] if x) > 1
    # the request asks for no change: under task_files no file tool that writes is offered
    assert r["name_position"]["spellable"] == r["view"] and "read_file" in r["view"] and "write_file" not in r["view"]
    # the episode succeeded with every call ok: its calls (not the answer) are a skill now
    assert ep.skill and a.skills.load(ep.skill).steps == tuple(c for c in ep.calls[:2])


def test_read_only_steers_a_write_away_and_runs_nothing(tmp_path):
    a = make(tmp_path, [call("write_file", path="x.txt", text="hi")] * 2, policy=Policy(read_only=True), max_steps=2)
    ep = a.run("write something")
    for s in ep.steps:
        assert s["call"]["tool"] not in ("write_file", "remember")
        assert "write_file" not in s["name_position"]["spellable"] and s["name_position"]["excluded_tokens_legal"] == 0
    assert not (tmp_path / "x.txt").exists()


def test_enumerated_paths_only_spell_existing_files(tmp_path):
    a = make(tmp_path, [call("read_file", path="does-not-exist.txt"), call("list_dir", path="nowhere")], max_steps=2)
    ep = a.run("read")
    assert ep.calls[0]["tool"] == "read_file" and ep.calls[0]["args"]["path"] in ("docs/plan.md", "notes.txt")
    assert ep.calls[1]["args"]["path"] in (".", "docs")
    assert all(s["ok"] for s in ep.steps)


def test_denied_call_is_an_observation_and_nothing_runs(tmp_path):
    renders = []
    a = make(tmp_path, [call("write_file", path="x.txt", text="hi"), call("answer", text="ok")], renders,
             approver=Approver(lambda prompt: False))
    ep = a.run("save hi")
    s = ep.steps[0]
    assert s["approval"]["mode"] == "ask" and not s["approval"]["approved"]
    assert s["result"].startswith("denied:") and not (tmp_path / "x.txt").exists()
    assert "denied:" in renders[1][-1]["content"]  # the model sees the denial on the next step
    assert ep.success and ep.skill is None  # an episode with a denied call teaches nothing


def test_a_raising_tool_is_an_error_observation(tmp_path):
    a = make(tmp_path, [call("boom", x="1"), call("answer", text="ok")])

    def boom(x: str) -> str:
        """Fail."""
        raise RuntimeError("kaput")

    a.table.register(boom)
    ep = a.run("explode")
    assert ep.steps[0]["result"] == "error: RuntimeError: kaput" and not ep.steps[0]["ok"] and ep.success


def test_a_tool_added_mid_episode_is_callable_on_the_next_step(tmp_path):
    renders = []
    a = make(tmp_path, [call("calc", expr="1"), call("greet", name="Ada")], renders, max_steps=2)

    def greet(name: str) -> str:
        """Greet someone."""
        return f"hello {name}"

    def add_after_first(rec):
        if rec["step"] == 1:
            a.table.register(greet)

    a.on_step = add_after_first
    ep = a.run("greet Ada")
    assert ep.calls[0]["tool"] == "calc" and "greet" not in ep.steps[0]["view"]
    assert ep.calls[1] == {"tool": "greet", "args": {"name": "Ada"}} and ep.steps[1]["result"] == "hello Ada"
    assert "- greet: Greet someone." in renders[1][0]["content"] and "greet" not in renders[0][0]["content"]


def test_a_tool_removed_mid_episode_is_unspellable_at_once(tmp_path):
    a = make(tmp_path, [call("calc", expr="1+1")] * 2, max_steps=2)
    a.on_step = lambda rec: a.table.remove("calc") if rec["step"] == 1 else None
    ep = a.run("add")
    assert ep.calls[0]["tool"] == "calc" and ep.calls[1]["tool"] != "calc"
    assert "calc" not in ep.steps[1]["name_position"]["spellable"]


def test_a_skill_added_mid_episode_is_runnable_on_the_next_step(tmp_path):
    a = make(tmp_path, [call("calc", expr="1")], max_steps=2, policy=Policy(approve="auto"))
    skill = {}

    def store(rec):
        if rec["step"] == 1:
            skill["name"] = a.skills.save("earlier", [{"tool": "calc", "args": {"expr": "2*21"}}]).name
            a.model.backend.replies = [call("run", name=skill["name"])]

    a.on_step = store
    ep = a.run("use the skill")
    assert "run" not in ep.steps[0]["view"]
    assert ep.calls[1] == {"tool": "run", "args": {"name": skill["name"]}} and ep.steps[1]["result"] == "[1] calc: 42"


def test_step_limit_and_memory(tmp_path):
    renders = []
    # the same call three times: spellable only with the repeat exclusion off (Helps.none)
    a = make(tmp_path, [call("remember", text="milk")] * 5, renders, max_steps=3, policy=Policy(approve="auto"),
             helps=Helps.none())
    ep = a.run("remember milk")
    assert len(ep.steps) == 3 and not ep.success and a.memory.items() == ["milk"] * 3
    assert "Notes saved with remember" not in renders[0][0]["content"] and '- "milk"' in renders[1][0]["content"]


def test_cut_calls_are_finished_by_the_grammar(tmp_path):
    a = make(tmp_path, [call("answer", text="x" * 200)], params=SamplingParams(max_tokens=30, cut="complete"))
    ep = a.run("long")
    assert ep.steps[0]["cut"] and ep.calls[0]["tool"] == "answer"


def test_a_long_answer_closes_in_budget_and_a_long_write_is_not_run(tmp_path):
    """Under "fit" (the default) the model's own tokens close a call inside max_tokens: an answer
    cut short is still an answer, but a changing call the budget closed early is never run."""
    a = make(tmp_path, [call("answer", text="x" * 200)], params=SamplingParams(max_tokens=48))
    ep = a.run("long")
    assert ep.steps[0]["fitted"] and not ep.steps[0]["cut"] and ep.steps[0]["ok"]
    assert ep.calls[0]["tool"] == "answer" and ep.calls[0]["args"]["text"].startswith("xxx")
    long = call("write_file", path="out.txt", text="x" * 200)
    a = make(tmp_path, [long], params=SamplingParams(max_tokens=64), max_steps=1, approver=Approver("auto"))
    ep = a.run("write a long file")
    assert ep.steps[0]["fitted"] and not ep.steps[0]["ok"] and "was not run" in ep.steps[0]["result"]
    assert not (tmp_path / "out.txt").exists()


def test_calc_is_safe():
    assert calc("17*23") == "391" and calc("17 x 23") == "391" and calc("7/2") == "3.5" and calc("2**10") == "1024"
    for bad in ["__import__('os')", "9**9**9", "((9**100)**100)**100", "1/0", "a+1", "1e308*10", "x" * 300]:
        assert calc(bad).startswith("error:")


def test_a_torn_trace_line_is_mended_and_a_huge_record_is_bounded(tmp_path):
    from railcall.agent.loop import TRACE_RECORD_LIMIT

    (tmp_path / "trace.jsonl").write_text(json.dumps({"step": 1}) + "\n" + '{"step": 2, "text": "' + "x" * (2 << 20))
    a = make(tmp_path, [call("answer", text="ok")])
    a.run("t" * (3 << 20))  # a 3 MB task: its record would be 3 MB
    lines = (tmp_path / "trace.jsonl").read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) == 3  # the torn record was cut off, the new one is whole
    rec = json.loads(lines[1])
    assert rec["call"]["tool"] == "answer" and len(lines[1]) <= TRACE_RECORD_LIMIT
    assert rec["task"]["cut"] > 3_000_000  # says what was left out, and how much


def test_a_symlink_loop_in_the_workspace_does_not_stop_the_agent(tmp_path):
    a = make(tmp_path, [call("read_file", path="notes.txt"), call("answer", text="ok")])
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    ep = a.run("read")
    assert ep.success and ep.steps[0]["result"] == "Meeting on Thursday."
    assert a.workspace.files() == ["notes.txt", "trace.jsonl", "docs/plan.md"]
    assert a.table.entry("list_dir").call({"path": "."}) == "a, b, docs/, loop, notes.txt, trace.jsonl"


def test_a_call_cut_by_the_token_limit_never_runs(tmp_path):
    """The grammar closes a call max_tokens cut (its values filled in with "?"); the agent runs
    no such call: the step is an error observation and the file is not written."""
    long = call("write_file", path="out.txt", text="x" * 200)
    a = make(tmp_path, [long, long], params=SamplingParams(max_tokens=40), max_steps=2,
             approver=Approver("auto"))
    ep = a.run("write a long file")
    assert all(s["cut"] and not s["ok"] and "was not run" in s["result"] for s in ep.steps)
    assert not (tmp_path / "out.txt").exists()


FORMATTED = {
    "openai": ['{"name":"read_file","arguments":{"path":"notes.txt"}}', '{"name":"answer","arguments":{"text":"Thursday"}}'],
    "hermes": ['<tool_call>{"name":"read_file","arguments":{"path":"notes.txt"}}</tool_call>',
               '<tool_call>{"name":"answer","arguments":{"text":"Thursday"}}</tool_call>'],
    "pythonic": ['[read_file(path="notes.txt")]', '[answer(text="Thursday")]'],
}


@pytest.mark.parametrize("fmt", list(FORMATTED))
@pytest.mark.parametrize("routing", ["greedy", "scored"])
def test_the_call_format_and_routing_are_the_agents(tmp_path, fmt, routing):
    """The grammar, the prompt (the format's skeleton) and the reading of each step follow
    `call_format`; scored routing writes the same calls on this script."""
    renders = []
    a = make(tmp_path, FORMATTED[fmt], renders, call_format=fmt, routing=routing,
             params=SamplingParams(max_tokens=128))  # a byte per token: the Hermes tags are long
    ep = a.run("when is the meeting?")
    assert ep.success and ep.answer == "Thursday", [s.get("result") for s in ep.steps]
    assert [c["tool"] for c in ep.calls] == ["read_file", "answer"]
    assert ep.steps[0]["call"] == {"tool": "read_file", "args": {"path": "notes.txt"}}
    system = renders[0][0]["content"]
    from railcall.prompts.chat import skeleton

    assert skeleton(fmt, quoted=True) in system and '"tool"' not in system
    assert ep.steps[0]["name_position"]["spellable"]
    if routing == "scored":
        assert all(s["routed"] == 1 for s in ep.steps)


def test_an_unknown_format_or_routing_is_refused(tmp_path):
    with pytest.raises(ValueError, match="call format"):
        make(tmp_path, [], call_format="xml")
    with pytest.raises(ValueError, match="routing"):
        make(tmp_path, [], routing="best")
