"""`railcall demo`: the embedded 135M model calling tools, without and with the grammar.

Each task runs twice on the same prompt: once prompt-only (the model may write anything) and
once under the grammar (every output is a call the table allows). The screen shows which
characters the grammar wrote and which the model chose, and a summary: parse rate both ways,
forward passes saved by fast-forward, tokens per second both ways.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from railcall.agent.builtins import calc  # safe arithmetic, shared with the agent
from railcall.grammar.tools import Tool

_P = lambda *names: {"type": "object", "properties": {n: {"type": "string"} for n in names}, "required": list(names)}  # noqa: E731

DEMO_TOOLS = [
    Tool("list_dir", "List the files in a folder of the workspace.", _P("path")),
    Tool("read_file", "Read a text file of the workspace.", _P("path")),
    Tool("write_file", "Write text to a file of the workspace.", _P("path", "text"), mutates=True),
    Tool("calc", "Evaluate an arithmetic expression.", _P("expr")),
]

TASKS = [
    "List the files in the workspace folder.",
    "Show me what is in notes.txt.",
    "What is 17 times 23?",
    "Save the text 'buy milk' to shopping.txt.",
    "Read the file todo.md.",
    "What files are in the data folder?",
]


WORKSPACE_FILES = {
    "notes.txt": "Meeting moved to Thursday.\nBring the quarterly numbers.\n",
    "todo.md": "- buy milk\n- call the plumber\n- finish the report\n",
    "data/numbers.csv": "month,sales\njan,120\nfeb,135\n",
}


def workspace(root: Path | None = None) -> Path:
    """The demo workspace (created once under $RAILCALL_HOME/demo-workspace)."""
    from railcall.home import railcall_home

    root = root or railcall_home() / "demo-workspace"
    for name, text in WORKSPACE_FILES.items():
        p = root / name
        if not p.exists():
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
    return root


def execute(call: dict, root: Path) -> str:
    """Run a read-only call in the workspace; a mutating call is shown, not run (the demo never
    writes; approval and execution belong to the agent runtime)."""
    args = call["args"]
    if call["tool"] == "calc":
        return calc(args["expr"])
    if call["tool"] == "write_file":
        return "(not run: write_file mutates the workspace, and the demo only reads)"
    target = (root / args["path"]).resolve()
    if root.resolve() not in (target, *target.parents):
        return f"error: {args['path']!r} is outside the workspace"
    if call["tool"] == "list_dir":
        if not target.is_dir():
            return f"error: no folder {args['path']!r}"
        return ", ".join(sorted(p.name + ("/" if p.is_dir() else "") for p in target.iterdir()))
    if not target.is_file():
        return f"error: no file {args['path']!r}"
    return target.read_text()[:200]


def parse_call(text: str, tools) -> dict | None:
    """The call in `text` if it is exactly one wire-format call to a tool of the table whose
    arguments validate against that tool's schema; otherwise None."""
    try:
        call = json.loads(text.strip())
    except ValueError:
        return None
    if not isinstance(call, dict) or set(call) != {"tool", "args"}:
        return None
    tool = next((t for t in tools if t.name == call["tool"]), None)
    if tool is None or not isinstance(call["args"], dict):
        return None
    props = tool.parameters.get("properties", {})
    req = tool.parameters.get("required", [])
    if any(k not in props for k in call["args"]) or any(k not in call["args"] for k in req):
        return None
    if any(not isinstance(call["args"][k], str) or (k in req and not call["args"][k]) for k in call["args"]):
        return None
    return call


@dataclass
class TaskResult:
    task: str
    without: dict | None
    with_grammar: dict | None


def run(model=None, *, task: int | None = None, tools: list[str] | None = None, grammar: bool = True,
        seed: int = 0, max_tokens: int = 48, log=None, starting=None, backend: str | None = None, lm=None) -> dict:
    """Run the demo; returns {"tasks": [...], "summary": {...}} (the --json output).

    `starting(i, n, task)` is called as task i of n starts, `log(record)` as it ends (the record
    holds its wall time, `seconds`): a task takes a few seconds on 2 idle cores, and on a busy
    machine minutes, so the screen says which one is running."""
    from railcall.runtime.decode import SamplingParams, generate
    from railcall.grammar.tools import tool_grammar
    from railcall.matcher import Matcher, compiled_grammar
    from railcall.models.store import load_model
    from railcall.prompts.plain import stop_strings
    from railcall.prompts.chat import chat_prompt_ids

    from railcall.models.llama import SINGLE_CELLS

    if lm is None:  # (`lm`: the model already loaded, as `railcall demo` does to show its facts first)
        lm = load_model(model, backend=backend, cells=SINGLE_CELLS)  # one sequence at a time
    vocab = lm.vocabulary()
    table = [t for t in DEMO_TOOLS if not tools or t.name in tools]
    if not table:
        raise ValueError(f"--tools selects none of {', '.join(t.name for t in DEMO_TOOLS)}")
    compiled = compiled_grammar(tool_grammar(table), vocab)
    runner = lm.backend()
    # a base model's plain-text turns end at stop strings (railcall.prompts.plain); others: none
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, seed=seed, stop=stop_strings(lm.tokenizer))
    chosen = [TASKS[task - 1]] if task else TASKS
    root = workspace()
    results = []
    totals = {"free_ok": 0, "ok": 0, "free_tokens": 0, "free_s": 0.0, "tokens": 0, "s": 0.0, "passes": 0, "saved": 0}
    for i, text in enumerate(chosen, 1):
        if starting:
            starting(i, len(chosen), text)
        started = time.perf_counter()
        prompt = chat_prompt_ids(lm.tokenizer, table, text)
        free = generate(runner, vocab, prompt, None, params)
        free_call = parse_call(free.text, table)
        totals["free_ok"] += free_call is not None
        totals["free_tokens"] += len(free.tokens)
        totals["free_s"] += free.seconds
        rec = {"task": text, "without_grammar": {"output": free.text, "parses": free_call is not None,
                                                 "tokens": len(free.tokens), "seconds": free.seconds}}
        if grammar:
            g = generate(runner, vocab, prompt, Matcher(compiled), params)
            call = parse_call(g.text, table)
            totals["ok"] += call is not None
            totals["tokens"] += len(g.tokens)
            totals["s"] += g.seconds
            totals["passes"] += g.forward_passes
            totals["saved"] += g.passes_saved
            rec["with_grammar"] = {
                "output": g.text, "parses": call is not None, "tokens": len(g.tokens), "seconds": g.seconds,
                "forward_passes": g.forward_passes, "passes_saved": g.passes_saved, "cut": g.cut,
                "segments": segments(g, vocab),
                "result": execute(call, root) if call else None,
            }
        rec["seconds"] = round(time.perf_counter() - started, 2)  # both runs and the tool's, as the user waits
        results.append(rec)
        if log:
            log(rec)
    n = len(chosen)
    summary = {
        "tasks": n,
        "parse_rate_without": totals["free_ok"] / n,
        "parse_rate_with": (totals["ok"] / n) if grammar else None,
        "forwards_saved_share": (totals["saved"] / max(totals["tokens"], 1)) if grammar else None,
        "tokens_per_s_without": totals["free_tokens"] / totals["free_s"] if totals["free_s"] else 0.0,
        "tokens_per_s_with": (totals["tokens"] / totals["s"] if totals["s"] else 0.0) if grammar else None,
        "model": lm.name,
        "backend": lm.backend_name,
        "load_seconds": lm.load_seconds,
    }
    return {"tasks": results, "summary": summary}


def segments(g, vocab) -> list[list]:
    """[[text, "grammar"|"model"], ...]: who wrote each run of characters. A token counts as the
    grammar's when it was forced or the only legal token."""
    out: list[list] = []
    for s in g.steps:
        who = "grammar" if s.forced or s.legal == 1 else "model"
        text = vocab.token_bytes[s.token].decode("utf-8", errors="replace")
        if out and out[-1][1] == who:
            out[-1][0] += text
        else:
            out.append([text, who])
    return out
