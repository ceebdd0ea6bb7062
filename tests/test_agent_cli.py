"""`railcall agent` and `railcall chat` with a scripted model in place of SmolLM2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from agentkit import scripted_model
from typer.testing import CliRunner

import railcall.agent
import railcall.agent.policy
import railcall.cli as cli

runner = CliRunner()


def call(tool, **args) -> str:
    return json.dumps({"tool": tool, "args": args}, separators=(",", ":"))


@pytest.fixture
def ws(tmp_path, monkeypatch):
    root = tmp_path / "ws"
    root.mkdir()
    (root / "notes.txt").write_text("Meeting on Thursday.")
    replies = []
    monkeypatch.setattr(cli, "_agent_model", lambda model: scripted_model(replies))
    return root, replies


def test_agent_command_runs_a_task_and_writes_the_trace(ws):
    root, replies = ws
    replies += [call("read_file", path="notes.txt"), call("answer", text="Thursday")]
    r = runner.invoke(cli.app, ["agent", "When is the meeting?", "--workspace", str(root)])
    assert r.exit_code == 0, r.output
    assert 'read_file {"path": "notes.txt"}' in r.output and "-> Meeting on Thursday." in r.output
    assert "answer: Thursday" in r.output and "learned skill learned-" in r.output
    rows = [json.loads(x) for x in (root / ".railcall" / "trace.jsonl").read_text().splitlines()]
    assert [r["call"]["tool"] for r in rows] == ["read_file", "answer"]


def test_agent_read_only_and_approval_flags(ws):
    root, replies = ws
    replies += [call("write_file", path="x.txt", text="hi")]
    r = runner.invoke(cli.app, ["agent", "save hi", "-w", str(root), "--read-only", "--max-steps", "1"])
    assert r.exit_code == 0 and "write_file" not in r.output.split("tools ")[1].splitlines()[0]
    assert not (root / "x.txt").exists()
    replies += [call("write_file", path="x.txt", text="hi")]
    r = runner.invoke(cli.app, ["agent", "save hi", "-w", str(root), "--approve", "deny", "--max-steps", "1"])
    assert "[denied]" in r.output and not (root / "x.txt").exists()
    replies += [call("write_file", path="x.txt", text="hi")]
    r = runner.invoke(cli.app, ["agent", "save hi", "-w", str(root), "--approve", "auto", "--max-steps", "1"])
    assert "[auto-approved]" in r.output and (root / "x.txt").read_text() == "hi"
    r = runner.invoke(cli.app, ["agent", "x", "-w", str(root), "--approve", "maybe"])
    assert r.exit_code == 2 and "ask, auto or deny" in r.output


def test_agent_named_policy(ws):
    root, replies = ws
    (root / ".railcall").mkdir()
    (root / ".railcall" / "policies.json").write_text(json.dumps({"calc-only": {"allow": ["calc", "answer"]}}))
    replies += [call("read_file", path="notes.txt")]
    r = runner.invoke(cli.app, ["agent", "x", "-w", str(root), "--policy", "calc-only", "--max-steps", "1"])
    assert r.exit_code == 0 and "policy calc-only: tools calc, answer" in r.output and "read_file" not in r.output
    r = runner.invoke(cli.app, ["agent", "x", "-w", str(root), "--policy", "nope"])
    assert r.exit_code == 2 and "no policy 'nope'" in r.output and "calc-only" in r.output
    r = runner.invoke(cli.app, ["agent", "x", "-w", str(root / "missing")])
    assert r.exit_code == 2 and "not a folder" in r.output


def test_chat_reads_tasks_from_stdin_and_approvals_from_the_terminal(ws, monkeypatch):
    root, replies = ws
    replies += [call("write_file", path="a.txt", text="one"), call("answer", text="saved"),
                call("write_file", path="b.txt", text="two"), call("answer", text="not saved")]
    answers = [(True, "approved on the terminal"), (False, "the user said no on the terminal")]
    monkeypatch.setattr(railcall.agent.policy, "ask_terminal", lambda prompt: answers.pop(0))
    r = runner.invoke(cli.app, ["chat", "-w", str(root)],
                      input="save one\n/skills\nsave two\n/tools\n/quit\nnever read\n")
    assert r.exit_code == 0, r.output
    assert (root / "a.txt").read_text() == "one" and not (root / "b.txt").exists()
    assert "[approved]" in r.output and "[not approved]" in r.output
    assert "answer: saved" in r.output and "answer: not saved" in r.output
    learned = r.output.split("learned skill ")[1].split()[0]
    assert r.output.count(learned) == 2  # learned from the first task, then listed by /skills
    assert "not callable" not in r.output  # /tools: run is callable now that a skill exists
    assert ("policy default: list_dir, read_file, append_file, write_file, calc, remember, run, answer"
            in " ".join(r.output.split()))  # however the terminal wraps it


def test_agent_package_surface():
    assert railcall.agent.__all__ == [
        "Agent", "AgentModel", "Approver", "Decision", "Episode", "PathRefused", "Policy", "PolicyError", "Skill",
        "SkillError", "SkillStore", "ToolTable", "View", "Workspace", "atomic_write", "load_policies", "view",
    ]
    code = "import sys, railcall.agent; print(sorted(m for m in ('torch', 'transformers', 'pydantic') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("policies, says", [
    ({"p": 5}, "policy 'p' is the number 5; expected an object"),
    ({"p": {"deny": "write_file"}}, """'deny' is the string "write_file"; expected a list of tool names"""),
    ({"p": {"allow": 5}}, "'allow' is the number 5"),
    ({"p": {"read_only": "false"}}, """'read_only' is the string "false"; expected true or false"""),
    ({"p": {"args": [1]}}, "'args' is the list [1]"),
    ({"p": {"args": {"read_file": {"path": 5}}}}, "'args.read_file.path' is the number 5"),
    ({"p": {"args": {"read_file": {"path": {"glob": 5}}}}}, "'args.read_file.path.glob' is the number 5"),
    ({"p": {"args": {"read_file": {"nope": ["x"]}}}}, "narrows arguments ['nope'] that tool 'read_file' does not have"),
    ({"p": {"args": {"calc": {"expr": {"glob": "*"}}}}}, "calc.expr has no enumerated domain"),
    ({"p": {"deny": ["write_flie"]}}, "'deny' names write_flie, which the agent does not have; its tools: list_dir"),
])
def test_a_bad_policies_file_is_an_error_not_a_traceback(ws, policies, says):
    root, replies = ws
    path = root / "pol.json"
    path.write_text(json.dumps(policies))
    for command in (["agent", "x"], ["chat"]):
        r = runner.invoke(cli.app, [*command, "-w", str(root), "--policy", "p", "--policies", str(path)], input="")
        assert r.exit_code == 2, (r.output, r.exception)
        text = " ".join(r.output.split())
        assert text.startswith("error:") and says in text, r.output


def test_arguments_are_checked_before_the_model_loads(ws, monkeypatch, tmp_path):
    root, replies = ws
    loads = []
    monkeypatch.setattr(cli, "_agent_model", lambda model: loads.append(model) or scripted_model(replies))
    bad = tmp_path / "pol.json"
    bad.write_text(json.dumps({"p": {"deny": ["write_flie"]}}))
    for args in (["-w", str(root / "missing")], ["-w", str(root), "--policy", "p", "--policies", str(bad)],
                 ["-w", str(root), "--policy", "nope"]):
        for command in (["agent", "x"], ["chat"]):
            r = runner.invoke(cli.app, [*command, *args], input="")
            assert r.exit_code == 2 and r.output.startswith("error:"), r.output
    assert loads == []  # every mistake above was reported without loading the model


def test_tool_output_reaches_the_terminal_escaped(ws):
    root, replies = ws
    (root / "evil\u202etxt.md").write_text("\x1b[2J\x1b]0;pwned\x07cleared")
    # the path as the grammar spells it (its enum's JSON, raw UTF-8), so that scored values pick it too
    replies += [json.dumps({"tool": "read_file", "args": {"path": "evil\u202etxt.md"}}, ensure_ascii=False,
                           separators=(",", ":")), call("answer", text="\x1b[31mred\u202e")]
    r = runner.invoke(cli.app, ["agent", "read it", "-w", str(root)])
    assert r.exit_code == 0, r.output
    for raw in ("\x1b", "\x07", "\u202e"):
        assert raw not in r.output
    assert "\\x1b[2J\\x1b]0;pwned\\x07cleared" in r.output and "evil\\u202etxt.md" in r.output
    assert "answer: \\x1b[31mred\\u202e" in r.output


def test_skills_approve_shows_the_steps_and_signs_only_on_a_yes(ws, monkeypatch):
    from railcall.agent.skills import SkillStore, skill_name

    root, _ = ws
    steps = [{"tool": "write_file", "args": {"path": "a\u202etxt", "text": "x"}}]
    name = skill_name(steps)
    folder = root / ".railcall" / "skills"
    folder.mkdir(parents=True)
    (folder / f"{name}.json").write_text(json.dumps({"name": name, "task": "t", "steps": steps}))
    answers = [(False, "the user said no on the terminal"), (True, "approved on the terminal")]
    monkeypatch.setattr(railcall.agent.policy, "ask_terminal", lambda prompt: answers.pop(0))
    r = runner.invoke(cli.app, ["skills", "approve", name, "-w", str(root)])
    assert r.exit_code == 1 and "not approved" in r.output and "a\\u202etxt" in r.output and "\u202e" not in r.output
    with pytest.raises(railcall.agent.SkillError, match="not signed"):
        SkillStore(folder).load(name)
    r = runner.invoke(cli.app, ["skills", "approve", name, "-w", str(root)])
    assert r.exit_code == 0 and "approved" in r.output, r.output
    assert SkillStore(folder).load(name).steps == tuple(steps)
    r = runner.invoke(cli.app, ["skills", "approve", "learned-000000000000", "-w", str(root)])
    assert r.exit_code == 2 and "no stored skill" in r.output


def test_agent_progress_options_from_the_command_line(tmp_path):
    assert cli._helps("facts", "examples,task_files").label() == "without examples, task_files"
    r = runner.invoke(cli.app, ["agent", "hi", "-w", str(tmp_path), "--off", "speed"])
    assert r.exit_code != 0 and "unknown option" in r.output and "no_repeats" in r.output


def test_a_planted_policies_file_cannot_widen_a_named_policy(ws, monkeypatch, tmp_path):
    """The issue's case: `--policy docs-reader` ran with all seven tools from a planted
    .railcall/policies.json; now it is refused, and without the file the built-in one runs."""
    root, replies = ws
    monkeypatch.setenv("RAILCALL_HOME", str(tmp_path / "home"))
    (root / ".railcall").mkdir()
    (root / ".railcall" / "policies.json").write_text(json.dumps({"docs-reader": {}}))
    r = runner.invoke(cli.app, ["agent", "x", "-w", str(root), "--policy", "docs-reader", "--max-steps", "1"])
    assert r.exit_code == 2 and "docs-reader" in r.output and "widen" in r.output, r.output
    (root / ".railcall" / "policies.json").unlink()
    replies += [call("answer", text="none")]
    r = runner.invoke(cli.app, ["agent", "x", "-w", str(root), "--policy", "docs-reader", "--max-steps", "1"])
    assert r.exit_code == 0 and "write_file" not in r.output.split("tools ")[1].splitlines()[0], r.output
