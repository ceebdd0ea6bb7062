"""`railcall eval agent`: the agent task suite (eval.agent_tasks) run on a model.

    for each task (skipping those results.jsonl already holds, with --resume):
        work/<id>/ws        a fresh workspace with the task's files; work/<id>/outside beside it
        skill               stored and signed first, for a skill task
        episode             Agent.for_workspace(ws, model, policy, helps) .run(task)
        traces/<id>.jsonl   the episode's trace, one line per step
        check               the outcome (agent_tasks.check) -> one line of results.jsonl
    summary.json, report.md  success rate, per kind, steps and seconds per task

Mutating calls are approved automatically (there is no terminal to ask on in a run, and a denial
would score the gate, not the model); read-only tasks use the read-only policy. Workspace keys
(for the skills) go to `<out>/keys`, not the user's cache.

With `ablation`, the suite runs once with the default options and once with each option off,
each into `<out>/<label>/`, and `<out>/ablation.md` compares them.

Lifecycle: the model is loaded once per run; an Agent per task.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Sequence

from railcall.agent.progress import Helps
from railcall.eval.agent_held_out import HELD_OUT
from railcall.eval.agent_tasks import KINDS, TASKS, AgentTask, check, make_workspace, state
from railcall.eval.results import fields_problem

RECORD_FIELDS = {"id": str, "kind": str, "ok": bool, "steps": int, "seconds": (int, float)}


SETS = ("dev", "held-out")


def tasks_of(which: str = "dev") -> list[AgentTask]:
    """The dev set (`TASKS`, the helps tuned on it) or the held-out set (`agent_held_out`)."""
    if which == "dev":
        return TASKS
    if which == "held-out":
        return HELD_OUT
    raise ValueError(f"unknown task set {which!r}; use {' or '.join(SETS)}")


def by_id(ids: Sequence[str] | None = None, limit: int | None = None, which: str = "dev") -> list[AgentTask]:
    """The tasks of set `which` named by `ids` (all when None), in suite order, then the first
    `limit`."""
    tasks = tasks_of(which)
    if ids:
        known = {t.id: t for t in tasks}
        bad = [i for i in ids if i not in known]
        if bad:
            raise ValueError(f"unknown task(s) {', '.join(bad)} in the {which} set; known: {', '.join(known)}")
        chosen = [t for t in tasks if t.id in set(ids)]
    else:
        chosen = list(tasks)
    return chosen[:limit] if limit else chosen


def describe(which: str = "dev") -> str:
    """One line per task of set `which` (for `railcall eval agent --list`)."""
    return "\n".join(f"{t.id:18} {t.kind:8} {t.steps} steps  {json.dumps(t.task)}" for t in tasks_of(which))


@contextmanager
def _keys_in(folder: Path):
    """Workspace keys under `folder` while the suite runs (one key per generated workspace would
    otherwise pile up in the user's key folder)."""
    old = os.environ.get("RAILCALL_KEYS")
    os.environ["RAILCALL_KEYS"] = str(folder)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("RAILCALL_KEYS", None)
        else:
            os.environ["RAILCALL_KEYS"] = old


def run_task(model, task: AgentTask, folder: Path, trace: Path, *, helps: Helps, max_steps: int = 6,
             params=None, call_format: str = "json", routing: str = "scored") -> dict:
    """One task on `model` (an AgentModel) in a fresh `folder`, its calls in `call_format`, the tool
    name chosen by `routing`; the checked outcome as a record."""
    from railcall.agent.loop import Agent
    from railcall.agent.policy import Policy

    if folder.exists():
        shutil.rmtree(folder)
    ws = make_workspace(task, folder)
    if trace.exists():
        trace.unlink()
    policy = Policy(name="read-only" if task.read_only else "auto", read_only=task.read_only, approve="auto")
    agent = Agent.for_workspace(ws, model, policy=policy, max_steps=max_steps, params=params, trace=trace,
                                learn=False, helps=helps, call_format=call_format, routing=routing)
    if task.skill:
        agent.skills.save(f"(stored for {task.id})", list(task.skill))
    before = state(folder)
    t0 = time.perf_counter()
    ep = agent.run(task.task)
    seconds = time.perf_counter() - t0
    problems = check(task, folder, before, ep.answer)
    return {"id": task.id, "kind": task.kind, "task": task.task, "ok": not problems, "problems": problems,
            "steps": len(ep.steps), "steps_needed": task.steps, "calls": ep.calls, "answer": ep.answer,
            "tokens": sum(s.get("tokens", 0) for s in ep.steps), "seconds": round(seconds, 2),
            "trace": str(trace)}


def record_problem(r) -> str:
    """"" when `r` is a usable record of this suite, else what is wrong with it."""
    return fields_problem(r, RECORD_FIELDS)


# What a run.json written before an option existed ran with (the option was not there: off).
HELPS_BEFORE = {"examples": False, "task_files": False, "copied_text": False, "copied_numbers": False,
                "quoted_text": False, "read_named": False, "scored_values": False}


def run(out: Path, *, model=None, tasks: Sequence[str] | None = None, limit: int | None = None,
        helps: Helps | None = None, max_steps: int = 6, max_tokens: int = 64, resume: bool = False,
        call_format: str = "json", routing: str = "scored", task_set: str = "dev",
        progress: Callable[[int, int, dict | None], None] | None = None, log=None) -> dict:
    """Run the suite's `task_set` ("dev" or "held-out"; or its `tasks`, the first `limit`) on
    `model` (an AgentModel, or a model name or None for the embedded one, loaded here); results.jsonl is appended as each task ends, so
    `resume` skips what is done. Returns and writes the summary and report.md."""
    from railcall.agent.loop import AgentModel
    from railcall.atomic import atomic_write
    from railcall.runtime.decode import SamplingParams
    from railcall.eval import results

    log = log or (lambda m: None)
    helps = helps or Helps()
    chosen = by_id(tasks, limit, task_set)  # fails early on an unknown id
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    settings = {"helps": {n: getattr(helps, n) for n in Helps.names()}, "max_steps": max_steps,
                "max_tokens": max_tokens, "call_format": call_format, "routing": routing, "set": task_set}
    run_path = out / "run.json"
    if resume and run_path.is_file():
        # runs from before the call format and routing were settings were json and greedy
        before = {"call_format": "json", "routing": "greedy", "set": "dev",
                  **{k: v for k, v in results.read_run(run_path)["settings"].items() if k != "model"}}
        before["helps"] = {**HELPS_BEFORE, **before.get("helps", {})}
        if before != settings:
            raise ValueError(f"{out} holds a run with other options ({run_path}: {json.dumps(before)}); "
                             "use another --out, or drop --resume")
    results_path, done = results.start(out, resume=resume, key=lambda r: r["id"], check=record_problem, log=log)
    if model is None or isinstance(model, (str, os.PathLike)):
        model = AgentModel.load(model)
    settings["model"] = getattr(model, "name", "model")
    atomic_write(run_path, json.dumps({"settings": settings, "machine": _machine()}, indent=1))
    params = SamplingParams(max_tokens=max_tokens)
    with _keys_in(out / "keys"), open(results_path, "a") as f:
        for i, t in enumerate(chosen):
            rec = None
            if t.id not in done:
                rec = run_task(model, t, out / "work" / t.id, out / "traces" / f"{t.id}.jsonl", helps=helps,
                               max_steps=max_steps, params=params, call_format=call_format, routing=routing)
                results.append_records(f, [rec])
            if progress:
                progress(i + 1, len(chosen), rec)
    ids = {t.id for t in chosen}
    records = [r for r in results.read_results(results_path, check=record_problem) if r["id"] in ids]
    summary = summarise(records, **settings)
    atomic_write(out / "summary.json", json.dumps(summary, indent=1, ensure_ascii=False))
    atomic_write(out / "report.md", report(summary))
    return summary


def summarise(records: Sequence[dict], **settings) -> dict:
    """Success rate over all tasks and per kind and step count; steps and seconds per task."""
    by_id_ = {r["id"]: r for r in records}  # a task run twice (resumed) counts once: the last
    rs = list(by_id_.values())
    n = len(rs)

    def rate(group):
        return round(sum(r["ok"] for r in group) / len(group), 3) if group else None

    kinds = {k: {"n": len(g), "solved": sum(r["ok"] for r in g), "rate": rate(g)}
             for k in KINDS if (g := [r for r in rs if r["kind"] == k])}
    needed = {}
    for r in rs:
        needed.setdefault(str(r.get("steps_needed", "?")), []).append(r)
    return {"n": n, "solved": sum(r["ok"] for r in rs), "success_rate": rate(rs), "kinds": kinds,
            "by_steps_needed": {k: {"n": len(g), "rate": rate(g)} for k, g in sorted(needed.items())},
            "steps_mean": round(sum(r["steps"] for r in rs) / n, 2) if n else None,
            "seconds_mean": round(sum(r["seconds"] for r in rs) / n, 2) if n else None,
            "seconds_total": round(sum(r["seconds"] for r in rs), 1),
            "tasks": [{k: r.get(k) for k in ("id", "kind", "ok", "steps", "steps_needed", "seconds", "problems",
                                             "answer", "trace")} for r in rs],
            "settings": settings}


def report(summary: dict) -> str:
    """The summary as Markdown: the rate, per kind, and a row per task."""
    s, st = summary, summary["settings"]
    lines = [f"# Agent task suite ({st.get('set', 'dev')} set): {s['solved']}/{s['n']} solved ({100 * (s['success_rate'] or 0):.0f}%)", "",
             f"model {st.get('model', '?')}, options: {Helps(**st['helps']).label()}, at most {st['max_steps']} "
             f"steps of {st['max_tokens']} tokens; {s['steps_mean']} steps and {s['seconds_mean']} s per task, "
             f"{s['seconds_total']} s in all", "",
             "| kind | tasks | solved |", "|---|---:|---:|"]
    lines += [f"| {k} | {g['n']} | {g['solved']} |" for k, g in s["kinds"].items()]
    lines += ["", "| task | kind | solved | steps (needed) | seconds | what was wrong |", "|---|---|---|---:|---:|---|"]
    for r in s["tasks"]:
        why = "; ".join(r.get("problems") or []).replace("|", "\\|")
        lines.append(f"| {r['id']} | {r['kind']} | {'yes' if r['ok'] else 'no'} | {r['steps']} ({r['steps_needed']}) "
                     f"| {r['seconds']} | {why} |")
    return "\n".join(lines) + "\n"


def ablation(out: Path, *, log=None, **kw) -> dict:
    """The suite with the default options and with each option the other way (off where it is
    on by default, on where it is off); `<out>/ablation.md`."""
    from railcall.atomic import atomic_write

    from railcall.agent.loop import AgentModel

    if kw.get("model") is None or isinstance(kw["model"], (str, os.PathLike)):
        kw["model"] = AgentModel.load(kw.get("model"))  # once for every configuration
    configs = [Helps()] + [Helps().toggled(n) for n in Helps.names()]
    rows = {}
    for helps in configs:
        label = helps.label().replace(" ", "-").replace(",", "").replace(";", "")
        if log:
            log(f"-- {helps.label()}")
        rows[helps.label()] = run(Path(out) / label, helps=helps, log=log, **kw)
    lines = ["| options | solved | rate | steps per task | seconds per task |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {k} | {s['solved']}/{s['n']} | {100 * (s['success_rate'] or 0):.0f}% | {s['steps_mean']} | "
              f"{s['seconds_mean']} |" for k, s in rows.items()]
    atomic_write(Path(out) / "ablation.md", "\n".join(lines) + "\n")
    return rows


def _machine() -> dict:
    import platform

    return {"platform": platform.machine(), "cores": os.cpu_count(), "python": platform.python_version()}
