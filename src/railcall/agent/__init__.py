"""The agent runtime: a live tool table, policy as grammar, approval, skills, traces.

    table.py      ToolTable: tools (functions or OpenAI dicts), handlers, live argument domains
    signature.py  a function's type hints and docstring -> JSON Schema
    policy.py     Policy -> View (the table as the model may see it now); the approval gate
    files.py      Workspace: paths confined to the sandbox; atomic writes
    builtins.py   list_dir, read_file, write_file, calc, remember, run, answer
    skills.py     SkillStore: episodes compiled into content-addressed skills, checked at load
    progress.py   Helps: what helps a small model progress (repeats unspellable, short results, facts)
    loop.py       Agent: the episode loop and its JSON-lines trace

See docs/agent.md.
"""

from railcall.agent.files import PathRefused, Workspace, atomic_write
from railcall.agent.loop import Agent, AgentModel, Episode
from railcall.agent.policy import Approver, Decision, Policy, View, load_policies, view
from railcall.agent.skills import Skill, SkillError, SkillStore
from railcall.agent.table import ToolTable
from railcall.errors import PolicyError

__all__ = [
    "Agent", "AgentModel", "Approver", "Decision", "Episode", "PathRefused", "Policy", "PolicyError", "Skill",
    "SkillError", "SkillStore", "ToolTable", "View", "Workspace", "atomic_write", "load_policies", "view",
]
