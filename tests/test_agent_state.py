"""railcall's own folder in a workspace (`.railcall/`): no link in it is ever followed. A
workspace may arrive with `.railcall/trace.jsonl -> ../../victim` planted; the trace, the
memory store, the skills and the temporary files must not write (or read) through it, under
--read-only or not, and the link is named in the error."""

from __future__ import annotations

import json
import os

import pytest
from agentkit import scripted_model
from hostile import victim_workspace
from typer.testing import CliRunner

import railcall.cli as cli
from railcall.agent.loop import Agent
from railcall.agent.policy import Policy
from railcall.agent.skills import skill_name

READ = {"tool": "read_file", "args": {"path": "notes.txt"}}
STEPS = [READ]


@pytest.fixture
def ws(tmp_path):
    """A workspace with `.railcall/skills/`, and outside it a file and a folder to aim links at."""
    return victim_workspace(tmp_path)


def _outside_untouched(victim, outdir):
    assert victim.read_text() == "keep"
    assert os.listdir(outdir) == []


# (the link's path under the workspace, what it points at: the victim file or the outside folder)
LINKS = [(".railcall/trace.jsonl", "victim"), (".railcall/memory.jsonl", "victim"),
         (f".railcall/skills/{skill_name(STEPS)}.json", "victim"), (".railcall/skills", "outdir"),
         (".railcall/tmp", "outdir"), (".railcall/policies.json", "victim")]


def _plant(root, rel, target):
    link = root / rel
    if link.is_dir() and not link.is_symlink():
        link.rmdir()
    link.symlink_to(target)


@pytest.mark.parametrize("rel, to", LINKS)
def test_a_link_planted_in_the_state_folder_is_refused_at_start(ws, rel, to):
    root, victim, outdir = ws
    _plant(root, rel, victim if to == "victim" else outdir)
    with pytest.raises((ValueError, OSError)) as e:
        Agent.for_workspace(root, None, trace=root / ".railcall" / "trace.jsonl")
    assert rel in str(e.value) and "link" in str(e.value)
    _outside_untouched(victim, outdir)


def _agent(root):
    return Agent.for_workspace(root, None, policy=Policy(approve="auto"), trace=root / ".railcall" / "trace.jsonl")


# The same links planted after the agent started (another process in the workspace): each
# operation that would write there is refused, naming the link, and nothing outside changes.
OPERATIONS = {
    ".railcall/trace.jsonl": lambda a: a._write_trace({"step": 1}),
    ".railcall/memory.jsonl": lambda a: a.memory.append("a note"),
    f".railcall/skills/{skill_name(STEPS)}.json": lambda a: a.skills.save("t", STEPS),
    ".railcall/skills": lambda a: a.skills.save("t", STEPS),
    ".railcall/tmp": lambda a: a.workspace.write("new.txt", b"data"),
}


@pytest.mark.parametrize("rel", OPERATIONS)
def test_a_link_planted_after_the_start_is_never_written_through(ws, rel):
    root, victim, outdir = ws
    agent = _agent(root)
    to = dict(LINKS)[rel]
    _plant(root, rel, victim if to == "victim" else outdir)
    with pytest.raises((ValueError, OSError)) as e:
        OPERATIONS[rel](agent)
    assert rel.removeprefix(".railcall/") in str(e.value) and "link" in str(e.value)
    _outside_untouched(victim, outdir)


def test_memory_and_skills_are_not_read_through_a_link(ws):
    """Reading through a link would put an outside file's lines into the prompt as notes."""
    root, victim, outdir = ws
    victim.write_text(json.dumps({"text": "outside secret"}) + "\n")
    agent = _agent(root)
    (root / ".railcall" / "memory.jsonl").symlink_to(victim)
    with pytest.raises((ValueError, OSError), match="memory.jsonl"):
        agent.memory.items()
    assert victim.read_text() == json.dumps({"text": "outside secret"}) + "\n"


def test_the_issue_reproduction_through_the_cli(ws, monkeypatch):
    """`railcall agent "What is in notes.txt?" -w ws --read-only` with trace.jsonl -> ../../victim:
    refused with the link named, the victim kept."""
    root, victim, outdir = ws
    (root / ".railcall" / "trace.jsonl").symlink_to("../../victim")
    replies = [json.dumps(READ, separators=(",", ":")), '{"tool":"answer","args":{"text":"hi"}}']
    monkeypatch.setattr(cli, "_agent_model", lambda model: scripted_model(replies))
    r = CliRunner().invoke(cli.app, ["agent", "What is in notes.txt?", "-w", str(root), "--read-only",
                                     "--max-steps", "3"])
    assert victim.read_text() == "keep"
    assert r.exit_code == 2 and "trace.jsonl" in r.output and "link" in r.output, r.output
