"""BFCL's multi-turn categories as agent episodes over BFCL's own simulated back-ends.

A multi-turn task is a scenario (the starting state of a few simulated services: a file system,
a trading bot, travel booking, a vehicle, messaging, ...), a list of user turns, and for each
turn the calls that solve it. The bfcl-eval wheel ships the services as Python classes with their
function docs (`multi_turn_func_doc/`); they need nothing beyond the standard library.

Each turn is one episode of railcall's agent loop (`railcall.agent.loop.Agent`):

    table    = the involved classes' functions (BFCL's docs, minus the task's excluded ones),
               each bound to this task's own instance, plus `answer`, which ends the turn
    per step : grammar from the live table -> one call -> run on the simulated state -> observation
    context  : the earlier turns' requests and the agent's answers

The calls of each turn, written as Python calls (`cd(folder='document')`), are then scored by
BFCL's own multi-turn checker from the wheel: it replays them and the gold calls on fresh
instances and compares the services' state and the calls' results after every turn. A task is
right when every turn passes.

Lifecycle: instances are made per task (a scenario's state is never shared between tasks).
"""

from __future__ import annotations

import copy
import importlib
import itertools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from railcall.agent.builtins import ANSWER
from railcall.agent.table import ToolTable
from railcall.eval.bfcl_dialect import bfcl_tools
from railcall.eval.results import fields_problem
from railcall.grammar.tools import Tool

# The multi-turn categories whose tasks need no functions added mid-task (BFCL's miss_func and
# miss_param hold a turn back for a function or a parameter the user gives later).
MULTI_TURN = ["multi_turn_base", "multi_turn_long_context"]
MAX_STEPS = 8  # calls per turn before the turn is cut (BFCL's own harness allows 20)


@dataclass
class MultiTurnTask:
    category: str
    id: str
    turns: list[list[dict]]  # each turn's messages
    ground_truth: list[list[str]]  # each turn's gold calls, as Python calls
    entry: dict  # the task as BFCL writes it (initial_config, involved_classes, ...)

    @property
    def involved(self) -> list[str]:
        return list(self.entry["involved_classes"])


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load(data: Path, category: str, limit: int | None = None) -> list[MultiTurnTask]:
    """The first `limit` tasks of a multi-turn category (all if None), with their gold calls."""
    if category not in MULTI_TURN:
        raise ValueError(f"{category!r} is not a multi-turn category railcall runs; use one of {', '.join(MULTI_TURN)}")
    from railcall.eval.bfcl import category_file

    qpath = category_file(data, category)
    gold = {a["id"]: a["ground_truth"] for a in _lines(qpath.parent / "possible_answer" / qpath.name)}
    entries = _lines(qpath)[:limit] if limit else _lines(qpath)
    return [MultiTurnTask(category, e["id"], e["question"], gold[e["id"]], e) for e in entries]


def function_docs(data: Path, task: MultiTurnTask) -> list[dict]:
    """BFCL's docs of the functions the task may call: its classes' functions, minus its excluded ones."""
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

    excluded = set(task.entry.get("excluded_function", []))
    docs = []
    for cls in task.involved:
        for doc in _lines(Path(data) / "multi_turn_func_doc" / MULTI_TURN_FUNC_DOC_FILE_MAPPING[cls]):
            if doc["name"] not in excluded:
                docs.append(doc)
    return docs


def backends(task: MultiTurnTask) -> dict[str, object]:
    """Fresh instances of the task's simulated services, loaded with its starting state."""
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING, STATELESS_CLASSES

    out = {}
    for cls in task.involved:
        inst = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[cls]), cls)()
        if cls not in STATELESS_CLASSES:
            inst._load_scenario(copy.deepcopy(task.entry["initial_config"].get(cls, {})),
                                long_context="long_context" in task.category)
        out[cls] = inst
    return out


def answer(text: str) -> str:
    """Reply to the user and finish this turn.

    Args:
        text: the reply.
    """
    return text


def tool_table(docs: Sequence[dict], instances: dict[str, object]) -> ToolTable:
    """The live table: each doc bound to the instance that has the method, plus `answer`."""
    table = ToolTable()
    for tool in bfcl_tools(list(docs)):
        owner = next((i for i in instances.values() if callable(getattr(i, tool.name, None))), None)
        if owner is None:
            raise ValueError(f"no simulated service has a function {tool.name!r}")
        method = getattr(owner, tool.name)
        table.add(Tool(tool.name, tool.description, tool.parameters), lambda _m=method, **kw: _m(**kw))
    table.register(answer, name=ANSWER)
    return table


def call_text(call: dict) -> str:
    """A call as BFCL writes it: `name(arg=<Python literal>, ...)`."""
    return f"{call['tool']}(" + ", ".join(f"{k}={v!r}" for k, v in call["args"].items()) + ")"


_SCORED = itertools.count()


def score(task: MultiTurnTask, decoded: list[list[list[str]]]) -> tuple[bool, str]:
    """BFCL's multi-turn verdict on the calls of each turn (a list of steps, each a list of
    calls): (right, why not)."""
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    # BFCL keeps each replay's instances in its module's globals under the model name and task
    # id; a name of its own per verdict keeps replays apart, and they are dropped after it.
    name = f"railcall_{os.getpid()}_{next(_SCORED)}"
    try:
        out = multi_turn_checker(decoded, task.ground_truth, task.entry, task.category, name)
    finally:
        for k in [k for k in vars(multi_turn_utils) if k.startswith(name)]:
            del vars(multi_turn_utils)[k]
    return bool(out["valid"]), "" if out["valid"] else str(out.get("error_message", out.get("error_type", "")))


def run_task(model, task: MultiTurnTask, data: Path, *, max_steps: int = MAX_STEPS, params=None,
             grammar: bool = True) -> dict:
    """Every turn of `task` as an agent episode on `model` (an AgentModel); the calls scored by BFCL."""
    from railcall.agent.loop import Agent
    from railcall.agent.policy import Policy

    instances = backends(task)
    table = tool_table(function_docs(data, task), instances)
    agent = Agent(table, model, policy=Policy(name="bfcl"), params=params, max_steps=max_steps, learn=False)
    context: list[dict] = []
    decoded: list[list[list[str]]] = []
    steps = answered = 0
    for turn in task.turns:
        request = "\n".join(m["content"] for m in turn if m["role"] == "user")
        ep = agent.run(request, context)
        calls = [s["call"] for s in ep.steps if s.get("call") and s["call"]["tool"] != ANSWER]
        decoded.append([[call_text(c)] for c in calls])
        steps += len(ep.steps)
        answered += ep.success
        context += [{"role": "user", "content": request},
                    {"role": "assistant", "content": ep.answer if ep.success else "(no answer)"}]
    ok, why = score(task, decoded)
    return {"category": task.category, "id": task.id, "ok": ok, "reason": why, "calls": decoded,
            "turns": len(task.turns), "turns_answered": answered, "steps": steps}


def run(categories: Sequence[str], out: Path, *, data: Path | None = None, limit: int | None = None,
        model: str | None = None, max_steps: int = MAX_STEPS, max_tokens: int = 96, resume: bool = False,
        progress=None, log=None) -> dict:
    """Run the categories' tasks on the model; one line per task in `out`/results.jsonl (appended
    as each task ends, so `resume` skips what is done); returns and writes the summary."""
    import time

    from railcall.agent.loop import AgentModel
    from railcall.atomic import atomic_write
    from railcall.data import bfcl_data
    from railcall.runtime.decode import SamplingParams
    from railcall.eval import results

    log = log or (lambda m: None)
    data = Path(data) if data is not None else bfcl_data()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tasks = {c: load(data, c, limit) for c in categories}  # fails early on a bad name
    results_path, done = results.start(out, resume=resume, key=lambda r: (r["category"], r["id"]),
                                       check=record_problem, log=log)
    agent_model = AgentModel.load(model)
    params = SamplingParams(max_tokens=max_tokens)
    with open(results_path, "a") as f:
        for cat, ts in tasks.items():
            for i, t in enumerate(ts):
                if (cat, t.id) not in done:
                    t0 = time.perf_counter()
                    rec = run_task(agent_model, t, data, max_steps=max_steps, params=params)
                    rec["seconds"] = round(time.perf_counter() - t0, 2)
                    results.append_records(f, [rec])
                if progress:
                    progress(cat, i + 1, len(ts))
    summary = summarise(results.read_results(results_path, check=record_problem), model=agent_model.name,
                        max_steps=max_steps, max_tokens=max_tokens)
    atomic_write(out / "summary.json", json.dumps(summary, indent=1))
    return summary


RECORD_FIELDS = {"category": str, "id": str, "ok": bool, "turns": int, "turns_answered": int, "steps": int}


def record_problem(r) -> str:
    """"" when `r` is a usable multi-turn record, else what is wrong with it."""
    return fields_problem(r, RECORD_FIELDS)


def summarise(records: Sequence[dict], **settings) -> dict:
    """Per category: tasks, accuracy (BFCL's verdict), turns answered, steps and seconds per task."""
    cats: dict[str, list[dict]] = {}
    for r in records:
        cats.setdefault(r["category"], []).append(r)
    per = {}
    for c, rs in cats.items():
        n = len(rs)
        per[c] = {"n": n, "accuracy": sum(r["ok"] for r in rs) / n,
                  "turns_answered": sum(r["turns_answered"] for r in rs) / max(1, sum(r["turns"] for r in rs)),
                  "steps_mean": sum(r["steps"] for r in rs) / n,
                  "seconds_mean": sum(r.get("seconds", 0) for r in rs) / n}
    return {"categories": per, "settings": settings}
