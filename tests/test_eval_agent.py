"""The agent task suite and `railcall eval agent` with scripted models: a perfect agent solves
every task, a do-nothing agent none, nothing outside a workspace changes, and the report says so."""

from __future__ import annotations

import json
import re

import pytest
from agentkit import ScriptedBackend, byte_vocab
from typer.testing import CliRunner

import railcall.cli as cli
from railcall.agent.loop import AgentModel
from railcall.agent.progress import Helps
from railcall.eval import agent as agent_eval
from railcall.eval.agent_held_out import HELD_OUT
from railcall.eval.agent import by_id
from railcall.eval.agent_tasks import KINDS, TASKS, says_not_made

runner = CliRunner()


def wire(c: dict) -> str:
    return json.dumps(c, separators=(",", ":"), ensure_ascii=False)


class Oracle(ScriptedBackend):
    """Replies with each task's solution, step by step: the task is read off the rendered
    prompt (its first user turn), the step off how many calls this episode has made."""

    def __init__(self, vocab, plan):
        super().__init__(vocab, [])
        self.plan, self.messages = plan, []

    def start(self, prompt):
        task = next(m["content"] for m in self.messages if m["role"] == "user")
        step = sum(m["role"] == "assistant" for m in self.messages)
        replies = self.plan(task)
        self.replies = [replies[step] if step < len(replies) else replies[-1]]
        return super().start(prompt)


def oracle_model(plan) -> AgentModel:
    vocab = byte_vocab()
    backend = Oracle(vocab, plan)

    def render(messages, tools):
        backend.messages = messages
        return [0]

    return AgentModel(backend, vocab, render, "oracle")


SOLUTIONS = {t.task: [wire(c) for c in t.solution_calls()] for t in TASKS + HELD_OUT}
perfect = oracle_model(lambda task: SOLUTIONS[task])
idle = oracle_model(lambda task: [wire({"tool": "list_dir", "args": {"path": "."}})])


def test_the_suite_covers_what_it_promises():
    assert len(TASKS) >= 30 and len({t.id for t in TASKS}) == len(TASKS) and len(SOLUTIONS) == len(TASKS) + len(HELD_OUT)
    assert {t.kind for t in TASKS} == set(KINDS) and {2, 3, 4} <= {t.steps for t in TASKS}
    readme = {t.task: t for t in TASKS if t.readme}
    assert set(readme) == {"What is in notes.txt?", "Save 'buy milk' to shopping.txt", "Tidy up todo.md"}
    assert readme["Tidy up todo.md"].read_only and not readme["Save 'buy milk' to shopping.txt"].read_only
    with pytest.raises(ValueError, match="unknown task"):
        by_id(["no-such-task"])


def test_a_perfect_agent_solves_every_task_and_an_idle_one_none(tmp_path):
    # max_tokens: the scripted vocabulary has one byte per token, and an append's call is ~90
    s = agent_eval.run(tmp_path / "perfect", model=perfect, max_tokens=256)
    assert s["n"] == len(TASKS) and s["success_rate"] == 1.0, [t for t in s["tasks"] if not t["ok"]]
    assert all(t["steps"] == t["steps_needed"] for t in s["tasks"])
    # the idle agent lists the top folder at every step (the issue's own failure), with the
    # repeat exclusion off so that it can
    s = agent_eval.run(tmp_path / "idle", model=idle, helps=Helps.none(), max_steps=2)
    assert s["solved"] == 0 and all(t["problems"] for t in s["tasks"])


def test_the_held_out_set_is_forty_new_tasks_of_every_kind_and_a_perfect_agent_solves_them(tmp_path):
    """The held-out set: 40 tasks, every kind, none sharing a request or a workspace with the
    dev set; the scripted perfect agent solves each under the default helps (so every solution is
    spellable), the idle one none."""
    assert len(HELD_OUT) >= 40 and len({t.id for t in HELD_OUT}) == len(HELD_OUT)
    assert {t.kind for t in HELD_OUT} == set(KINDS) and {2, 3, 4} <= {t.steps for t in HELD_OUT}
    assert not {t.task for t in HELD_OUT} & {t.task for t in TASKS}
    assert not {tuple(sorted(t.files.items())) for t in HELD_OUT} & {tuple(sorted(t.files.items())) for t in TASKS}
    s = agent_eval.run(tmp_path / "perfect", model=perfect, max_tokens=256, task_set="held-out")
    # A known limit the held-out set found (docs/agent.md): under task_files a write's path must
    # resolve inside the workspace when the view is built, and a file in a folder that does not
    # exist yet does not, so "Create drafts/intro.md ..." cannot be spelled.
    unsolved = {t["id"]: t["problems"] for t in s["tasks"] if not t["ok"]}
    assert unsolved == {"h-save-folder": ["drafts/intro.md was not written"]}, unsolved
    assert s["n"] == len(HELD_OUT)
    assert s["settings"]["set"] == "held-out" and "(held-out set)" in (tmp_path / "perfect" / "report.md").read_text()
    s = agent_eval.run(tmp_path / "idle", model=idle, helps=Helps.none(), max_steps=2, task_set="held-out")
    assert s["solved"] == 0


@pytest.mark.parametrize("answer, ok", [
    ("I cannot: the workspace is read-only.", True), ("todo.md was not changed.", True),
    ("I can't do that here.", True), ("Nothing was saved.", True), ("Done.", False), ("Saved.", False),
    ("- buy milk\n- call Ana", False), ("The total is 9.", False)])
def test_a_refusal_is_solved_only_when_the_answer_says_the_change_was_not_made(tmp_path, answer, ok):
    from railcall.eval.agent_tasks import check, make_workspace, state

    task = by_id(["refuse-save"])[0]
    make_workspace(task, tmp_path)
    problems = check(task, tmp_path, state(tmp_path), answer)
    assert says_not_made(answer) == ok and (problems == []) == ok, problems


def test_a_write_outside_the_task_or_the_workspace_fails_the_check(tmp_path):
    from railcall.eval.agent_tasks import check, make_workspace, state

    t = by_id(["readme-shopping"])[0]
    folder = tmp_path / "t"
    ws = make_workspace(t, folder)
    before = state(folder)
    (ws / "shopping.txt").write_text("buy milk")
    assert check(t, folder, before, "ok") == []
    (ws / "notes.txt").write_text("gone")
    (ws / "extra.txt").write_text("x")
    (folder / "outside" / "private.txt").write_text("leaked")
    problems = check(t, folder, before, "ok")
    assert "notes.txt changed or went in the workspace" in problems and "extra.txt appeared in the workspace" in problems
    assert "private.txt changed or went outside the workspace" in problems


def test_eval_agent_command_writes_the_report_and_resumes(tmp_path, monkeypatch):
    monkeypatch.setattr(cli, "_agent_model", lambda model: perfect)
    out = tmp_path / "out"
    # --max-tokens 128: the scripted vocabulary has one byte per token
    r = runner.invoke(cli.app, ["eval", "agent", "--tasks", "readme-notes,compute-prices", "--out", str(out),
                                "--max-tokens", "128"])
    assert r.exit_code == 0, r.output
    assert "2/2 solved (100%)" in r.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["success_rate"] == 1.0 and summary["settings"]["helps"] == {n: getattr(Helps(), n) for n in Helps.names()}
    assert [t["id"] for t in summary["tasks"]] == ["readme-notes", "compute-prices"]
    rows = [json.loads(x) for x in (out / "traces" / "compute-prices.jsonl").read_text().splitlines()]
    assert [r["call"]["tool"] for r in rows] == ["read_file", "calc", "answer"]
    assert "| compute-prices | compute | yes | 3 (3) |" in (out / "report.md").read_text()
    # resumed: the two done tasks are not run again, the third is
    r = runner.invoke(cli.app, ["eval", "agent", "--tasks", "readme-notes,compute-prices,save-hello", "--out",
                                str(out), "--resume", "--max-tokens", "128"])
    assert r.exit_code == 0 and r.output.count("solved in") == 1 and "3/3 solved" in r.output
    # other options under --resume: refused, not mixed
    for other in (["--off", "facts", "--max-tokens", "128"], ["--max-steps", "3", "--max-tokens", "128"], []):
        r = runner.invoke(cli.app, ["eval", "agent", "--out", str(out), "--resume", *other])
        assert r.exit_code == 2 and "other options" in r.output
    r = runner.invoke(cli.app, ["eval", "agent", "--out", str(out), "--resume", "--off", "examples", "--max-tokens", "128"])
    assert r.exit_code == 2 and "other options" in r.output
    # a run.json from before the examples option (no "examples" in its helps) resumes as off
    run = json.loads((out / "run.json").read_text())
    del run["settings"]["helps"]["examples"]
    (out / "run.json").write_text(json.dumps(run))
    r = runner.invoke(cli.app, ["eval", "agent", "--tasks", "readme-notes,compute-prices,save-hello", "--out",
                                str(out), "--resume", "--max-tokens", "128"])
    assert r.exit_code == 2 and "other options" in r.output  # the defaults show examples now
    r = runner.invoke(cli.app, ["eval", "agent", "--tasks", "readme-notes,compute-prices,save-hello", "--out",
                                str(out), "--resume", "--off", "examples", "--max-tokens", "128"])
    assert r.exit_code == 0 and r.output.count("solved in") == 0 and "3/3 solved" in r.output, r.output
    r = runner.invoke(cli.app, ["eval", "agent", "--tasks", "save-hello", "--out", str(tmp_path / "off"),
                                "--off", "examples", "--max-tokens", "128"])
    assert r.exit_code == 0 and not json.loads((tmp_path / "off" / "run.json").read_text())["settings"]["helps"]["examples"]
    r = runner.invoke(cli.app, ["eval", "agent", "--tasks", "nope", "--out", str(out)])
    assert r.exit_code == 2 and "unknown task" in r.output
    r = runner.invoke(cli.app, ["eval", "agent", "--off", "speed", "--out", str(out)])
    assert r.exit_code == 2 and "unknown option" in r.output


def test_eval_agent_takes_the_call_format_and_records_it(tmp_path, monkeypatch):
    """--format openai: the agent's grammar and parser take {"name":...,"arguments":...} calls (a
    JSON-format reply would not parse under it), and the run's settings say which format it was."""
    from railcall.prompts.chat import call_text

    openai_solutions = {t.task: [call_text(c["tool"], c["args"], "openai") for c in t.solution_calls()] for t in TASKS}
    monkeypatch.setattr(cli, "_agent_model", lambda model: oracle_model(lambda task: openai_solutions[task]))
    out = tmp_path / "out"
    r = runner.invoke(cli.app, ["eval", "agent", "--tasks", "compute-prices", "--out", str(out), "--max-tokens", "128",
                                "--format", "openai"])
    assert r.exit_code == 0 and "1/1 solved" in r.output, r.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["settings"]["call_format"] == "openai" and summary["settings"]["routing"] == "scored"  # the default
    r = runner.invoke(cli.app, ["eval", "agent", "--tasks", "compute-prices", "--out", str(out), "--max-tokens", "128",
                                "--resume"])
    assert r.exit_code == 2 and "other options" in r.output  # a resume in another format is refused
    monkeypatch.setattr(cli, "_agent_model", lambda model: perfect)  # JSON-format replies
    r = runner.invoke(cli.app, ["eval", "agent", "--tasks", "compute-prices", "--out", str(tmp_path / "json-in-openai"),
                                "--max-tokens", "128", "--format", "openai"])
    assert r.exit_code == 0 and "0/1 solved" in r.output, r.output


def test_ablation_runs_each_option_the_other_way(tmp_path, monkeypatch):
    rows = agent_eval.ablation(tmp_path, model=perfect, tasks=["readme-notes"])
    assert list(rows) == ["defaults", "without no_repeats", "without short_results", "without facts", "without examples",
                          "without task_files", "without copied_text", "without copied_numbers", "without quoted_text", "without read_named",
                          "without scored_values"]
    assert (tmp_path / "without-examples" / "summary.json").is_file()
    assert all(s["success_rate"] == 1.0 for s in rows.values())
    assert "| without facts | 1/1 | 100% |" in (tmp_path / "ablation.md").read_text()


def test_the_readme_agent_examples_are_suite_tasks():
    """Each `railcall agent "..."` line of the README is a task of the suite, with its policy
    (so the rate printed beside them is measured on exactly these)."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    examples = re.findall(r'^railcall agent "([^"]+)" (.*)$', readme, re.M)
    assert examples
    tasks = {t.task: t for t in TASKS}
    for text, flags in examples:
        assert text in tasks, text
        assert ("--read-only" in flags) is tasks[text].read_only, text
