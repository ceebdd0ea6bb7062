"""`railcall eval endpoint`: BFCL tasks sent to any OpenAI-compatible server as a user's client
sends them, scored like `railcall eval bfcl`. The same tasks through `railcall serve` and through
another server (llama.cpp's `llama-server`, vLLM) give figures side by side for the same model.

Each task is one chat request: its messages, its functions as OpenAI `tools` (a dotted BFCL name
such as `math.factorial` is sent as `math_factorial`, which OpenAI's name rules allow, and mapped
back), `tool_choice` "required" where the category's gold answers are calls and "auto" where no
call may be right, temperature 0. A reply is read the way a tolerant client would: its
`tool_calls` first; failing those, a call written as text anywhere in its content (a JSON object
with a name and arguments, or an array of them), so a server that answers in prose but spells a
call inside it still gets the credit.

    parse   the reply holds at least one call that reads as JSON, and it was not cut
    valid   every call names a tool of the task and its arguments validate against the schema
    ast     BFCL's AST check against the gold answer (railcall.eval.checker)
    cut     the reply ended at max_tokens (finish_reason "length"): it counts as not parsed, not
            valid and not right, whatever calls it holds (the rest of the reply is missing)
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Callable

from railcall.eval import bfcl
from railcall.eval.checker import check_calls, valid_calls


def wire_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)


def request(task: bfcl.Task, model: str, max_tokens: int) -> tuple[dict, dict[str, str]]:
    """The chat request for `task` and the map from the names sent back to the task's own."""
    names = {wire_name(t.name): t.name for t in task.tools}
    tools = [{"type": "function", "function": {"name": wire_name(t.name), "description": t.description,
                                               "parameters": t.parameters}} for t in task.tools]
    choice = "required" if task.expects == "calls" else "auto"
    messages = [{"role": m["role"], "content": m.get("content") or ""} for m in task.messages]
    return dict(model=model, messages=messages, tools=tools, tool_choice=choice, max_tokens=max_tokens,
                temperature=0), names


def _as_call(x, names: dict[str, str]) -> dict | None:
    if not isinstance(x, dict):
        return None
    name = x.get("name") or x.get("tool") or (x.get("function") or {}).get("name")
    args = x.get("arguments", x.get("args", x.get("parameters", (x.get("function") or {}).get("arguments"))))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(name, str) or not isinstance(args, dict):
        return None
    return {"tool": names.get(name, name), "args": args}


def calls_in_text(text: str, names: dict[str, str]) -> list[dict] | None:
    """Calls written as JSON anywhere in `text` (the first object or array that reads as calls)."""
    dec = json.JSONDecoder()
    for m in re.finditer(r"[\[{]", text or ""):
        try:
            value, _ = dec.raw_decode(text, m.start())
        except ValueError:
            continue
        items = value if isinstance(value, list) else [value]
        calls = [_as_call(x, names) for x in items]
        if calls and all(c is not None for c in calls):
            return calls
    return None


def read_reply(message, finish: str | None, names: dict[str, str]) -> tuple[list[dict] | None, str]:
    """(calls or None, where they came from: "tool_calls", "content" or "")."""
    tcs = getattr(message, "tool_calls", None) or []
    if tcs:
        calls = [_as_call({"name": tc.function.name, "arguments": tc.function.arguments}, names) for tc in tcs]
        return (calls, "tool_calls") if all(c is not None for c in calls) else (None, "")
    found = calls_in_text(getattr(message, "content", None) or "", names)
    return (found, "content") if found else (None, "")


def run(url: str, *, model: str, data: Path, categories: list[str], limit: int | None, max_tokens: int, out: Path,
        api_key: str = "none", progress: Callable[[str], None] = lambda s: None) -> dict:
    """Every task of `categories` (the first `limit` each) through the server at `url`; writes
    results.jsonl and summary.json into `out` and returns the summary."""
    import openai

    out.mkdir(parents=True, exist_ok=True)
    client = openai.OpenAI(base_url=url, api_key=api_key, max_retries=0, timeout=600)
    records = []
    with open(out / "results.jsonl", "w") as f:
        for cat in categories:
            tasks = bfcl.load_category(data, cat, limit)
            for i, task in enumerate(tasks):
                kw, names = request(task, model, max_tokens)
                t0 = time.perf_counter()
                try:
                    r = client.chat.completions.create(**kw)
                    choice = r.choices[0]
                    calls, source = read_reply(choice.message, choice.finish_reason, names)
                    finish, text = choice.finish_reason, choice.message.content or ""
                    tokens = r.usage.completion_tokens if r.usage else None
                    error = ""
                except Exception as e:  # a refused or failed request counts as a failed task
                    calls, source, finish, text, tokens, error = None, "", None, "", None, f"{type(e).__name__}: {e}"
                verdict = check_calls(task.functions, calls, task.ground_truth, language=task.language,
                                      expects=task.expects)
                whole = finish != "length"  # a reply max_tokens cut is no reply, whatever calls it holds
                rec = {"category": cat, "id": task.id, "parse": calls is not None and whole, "source": source,
                       "valid": bool(calls) and whole and valid_calls(calls, task.tools), "ast": verdict.ok and whole,
                       "reason": verdict.reason if whole else "cut by max_tokens", "cut": not whole, "finish": finish,
                       "tokens": tokens,
                       "seconds": round(time.perf_counter() - t0, 3), "calls": calls, "text": text[:500],
                       "error": error}
                f.write(json.dumps(rec) + "\n")
                records.append(rec)
                progress(f"{cat} {i + 1}/{len(tasks)}")
    summary = summarise(records, url=url, model=model, max_tokens=max_tokens, limit=limit)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def summarise(records: list[dict], **settings) -> dict:
    per: dict[str, dict] = {}
    for cat in dict.fromkeys(r["category"] for r in records):
        rs = [r for r in records if r["category"] == cat]
        n = len(rs)
        per[cat] = {"tasks": n, **{k: round(sum(bool(r[k]) for r in rs) / n, 4) for k in ("parse", "valid", "ast", "cut")},
                    "calls_in_content": sum(r["source"] == "content" for r in rs),
                    "errors": sum(bool(r["error"]) for r in rs),
                    "seconds": round(sum(r["seconds"] for r in rs), 1)}
    return {**settings, "categories": per}
