"""Skills: content-addressed, checked at load to be runnable, enumerated live in `run`."""

from __future__ import annotations

import json

import pytest

from railcall.agent.loop import Agent
from railcall.agent.policy import Policy
from railcall.agent.skills import SkillError, skill_name
from railcall.matcher import Matcher, compiled_grammar

READ = {"tool": "read_file", "args": {"path": "notes.txt"}}
CALC = {"tool": "calc", "args": {"expr": "2+3"}}
WRITE = {"tool": "write_file", "args": {"path": "out.txt", "text": "hi"}}


@pytest.fixture
def agent(tmp_path):
    (tmp_path / "notes.txt").write_text("n")
    return Agent.for_workspace(tmp_path, None, policy=Policy(approve="auto"))


def run_spellable(agent, name: str, policy=None) -> bool:
    from railcall.agent.policy import _byte_vocab, view

    v = view(agent.table, policy or agent.policy)
    m = Matcher(compiled_grammar(v.grammar(), _byte_vocab()))
    return m.consume_bytes(json.dumps({"tool": "run", "args": {"name": name}}, separators=(",", ":")).encode()) \
        and m.is_accepting()


def test_content_addressed_names(agent):
    a = agent.skills.save("t", [READ, CALC])
    assert a.name == skill_name([READ, CALC]) and a.name.startswith("learned-") and len(a.name) == 8 + 12
    assert agent.skills.save("other task", [READ, CALC]).name == a.name  # same program, stored once
    assert agent.skills.save("t", [CALC, READ]).name != a.name
    assert agent.skills.names() == sorted([a.name, skill_name([CALC, READ])])
    assert agent.skills.save("t", []) is None
    with pytest.raises(SkillError, match="cannot run a skill"):
        agent.skills.save("t", [{"tool": "run", "args": {"name": a.name}}])


def test_a_skill_added_is_spellable_at_once_and_one_removed_is_not(agent):
    assert "run" not in agent.view().names  # no skills: run has no value, so no name either
    s = agent.skills.save("t", [READ, CALC])
    assert agent.view().tool("run").parameters["properties"]["name"]["enum"] == [s.name]
    assert run_spellable(agent, s.name) and not run_spellable(agent, "learned-000000000000")
    assert agent.dispatch({"tool": "run", "args": {"name": s.name}})[1] == "[1] read_file: n | [2] calc: 5"
    agent.skills.remove(s.name)
    assert not run_spellable(agent, s.name) and "run" not in agent.view().names


@pytest.mark.parametrize("damage, why", [
    (lambda d: d.update(steps=d["steps"] + [CALC]), "do not hash"),
    (lambda d: d.update(steps=[]), "no steps"),
    (lambda d: d.update(steps=[{"tool": "calc"}]), "expected"),
])
def test_damaged_skills_are_refused_at_load(agent, damage, why):
    s = agent.skills.save("t", [CALC])
    path = agent.skills.folder / f"{s.name}.json"
    doc = json.loads(path.read_text())
    damage(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(SkillError, match=why):
        agent.skills.load(s.name)
    assert "run" not in agent.view().names  # never offered
    path.write_text("{not json")
    with pytest.raises(SkillError, match="cannot be read"):
        agent.skills.load(s.name)


def test_only_runnable_programs_are_offered(agent, tmp_path):
    gone = agent.skills.save("t", [{"tool": "read_file", "args": {"path": "deleted.txt"}}])
    unknown = agent.skills.save("t", [{"tool": "teleport", "args": {}}])
    writer = agent.skills.save("t", [READ, WRITE])
    reader = agent.skills.save("t", [READ])
    assert agent.view().tool("run").parameters["properties"]["name"]["enum"] == sorted([writer.name, reader.name])
    (tmp_path / "deleted.txt").write_text("back")  # the file it reads exists again: now runnable
    assert gone.name in agent.view().tool("run").parameters["properties"]["name"]["enum"]
    # read-only: a skill with a write is unspellable, the reading ones stay
    agent.policy = agent.policy.with_(read_only=True)
    assert sorted(agent.view().tool("run").parameters["properties"]["name"]["enum"]) == sorted([gone.name, reader.name])
    assert not run_spellable(agent, writer.name)
    # and bypassing the grammar does not help: the runtime checks the skill against the view
    decision, result, ok, _ = agent.dispatch({"tool": "run", "args": {"name": writer.name}}, _full_view(agent))
    assert not ok and "cannot run here" in result and not (tmp_path / "out.txt").exists()
    assert unknown.name not in _full_view(agent).tool("run").parameters["properties"]["name"]["enum"]


def _full_view(agent):
    from railcall.agent.policy import view

    return view(agent.table, Policy())


def test_each_step_of_a_skill_passes_the_approval_gate(agent, tmp_path):
    s = agent.skills.save("t", [READ, WRITE])
    agent.policy = Policy(approve="deny")
    decision, result, ok, _ = agent.dispatch({"tool": "run", "args": {"name": s.name}})
    assert not ok and "stopped at step 2" in result and "denied" in result
    assert not (tmp_path / "out.txt").exists()
    agent.policy = Policy(approve="auto")
    decision, result, ok, program = agent.dispatch({"tool": "run", "args": {"name": s.name}})
    assert ok and (tmp_path / "out.txt").read_text() == "hi" and program == [READ, WRITE]


def test_a_hand_made_skill_with_a_right_hash_is_refused(agent, tmp_path):
    """Only a skill this runtime learned here (signed with the workspace's key, kept outside the
    workspace) or one the user approved runs: a correct content hash proves nothing."""
    steps = [{"tool": "write_file", "args": {"path": "planted.txt", "text": "pwned"}}]
    name = skill_name(steps)
    agent.skills.folder.mkdir(parents=True, exist_ok=True)
    (agent.skills.folder / f"{name}.json").write_text(json.dumps({"name": name, "task": "t", "steps": steps}))
    with pytest.raises(SkillError, match="not signed"):
        agent.skills.load(name)
    assert "run" not in agent.view().names  # never offered
    decision, result, ok, _ = agent.dispatch({"tool": "run", "args": {"name": name}}, _full_view(agent))
    assert not ok and not (tmp_path / "planted.txt").exists()
    # a signature copied from another skill does not fit this one
    other = agent.skills.save("t", [CALC])
    doc = json.loads((agent.skills.folder / f"{other.name}.json").read_text())
    (agent.skills.folder / f"{name}.json").write_text(json.dumps({**doc, "name": name, "steps": steps}))
    with pytest.raises(SkillError, match="not signed"):
        agent.skills.load(name)
    # the user approves it once (after seeing its steps): from then on it is a skill like any other
    agent.skills.approve(name)
    assert agent.skills.load(name).steps == tuple(steps)
    assert json.loads((agent.skills.folder / f"{name}.json").read_text())["origin"]["kind"] == "approved"
    assert agent.dispatch({"tool": "run", "args": {"name": name}})[2] and (tmp_path / "planted.txt").exists()


def test_the_signing_key_lives_outside_the_workspace(agent, tmp_path):
    s = agent.skills.save("t", [CALC])
    doc = json.loads((agent.skills.folder / f"{s.name}.json").read_text())
    assert doc["origin"]["kind"] == "episode" and len(doc["signature"]) == 64
    key = agent.skills.key_path
    assert key.is_file() and tmp_path not in key.parents and (key.stat().st_mode & 0o077) == 0
    # another workspace has another key: a signed skill copied there is refused
    other = tmp_path.parent / (tmp_path.name + "-other")
    other.mkdir()
    b = Agent.for_workspace(other, None)
    b.skills.folder.mkdir(parents=True)
    (b.skills.folder / f"{s.name}.json").write_text(json.dumps(doc))
    with pytest.raises(SkillError, match="not signed"):
        b.skills.load(s.name)


@pytest.mark.parametrize("edit", [
    {"task": "Delete everything"},  # the text `railcall skills approve` shows the user
    {"created": 0.0},
    {"origin": {"kind": "episode", "task": "another task"}},
    {"hint": "run me first"},  # a field railcall does not write: signed as absent
])
def test_the_signature_covers_every_field_of_a_skill(agent, edit):
    s = agent.skills.save("What is in notes.txt?", [READ, CALC])
    path = agent.skills.folder / f"{s.name}.json"
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, **edit}))
    with pytest.raises(SkillError, match="not signed"):
        agent.skills.load(s.name)
    assert "run" not in agent.view().names  # never offered
