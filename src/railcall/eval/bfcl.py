"""BFCL data -> Tasks, and the prompt every task is asked with.

A category is one file of questions (`BFCL_v4_<category>.json`, one JSON object per line:
id, question = turns of {role, content} messages, function = the tool specs in BFCL's parameter
dialect) and, beside it in `possible_answer/`, one of gold answers (same ids, same order:
`ground_truth` = a list of calls {name: {param: [acceptable values]}}). A category without an
answer file is one whose right answer is not a list of gold calls: BFCL's irrelevance
categories (no call is right) and its relevance category (any call is right, `expects="any"`).

What a task expects is read from its gold answers: a task whose ground truth is an empty list
expects no call; otherwise the calls, in any order. Only where there are no gold answers at all
does the name decide, as BFCL's own rule does: a `*relevance` category that is not an
`*irrelevance` one is right with any call. The decoding mode (`tool_choice`) is chosen once per
category, never per task: "required" (a call must be made) when every task of the category has
gold calls, "auto" (free text, or a call) otherwise, so no-call and any-call categories are
never won by forcing a call.

Java and JavaScript categories (`simple_java`, `simple_javascript`) are asked the way BFCL's
harness asks them: every parameter is a string holding a value in the language's own syntax
(`"true"`, `"50L"`, `"new ArrayList<>(Arrays.asList(...))"`), with BFCL's hint on each
description; the checker converts those strings back with BFCL's own converters.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from railcall.eval.bfcl_dialect import bfcl_tools
from railcall.grammar.tools import Tool
from railcall.prompts.chat import has_native_tools, system_prompt

# The categories railcall was first measured on (their figures in the README go back furthest).
SHARED_CATEGORIES = ["simple_python", "multiple", "parallel", "live_simple"]
# Every single-turn category of BFCL v4, in BFCL's order.
SINGLE_TURN = ["simple_python", "simple_java", "simple_javascript", "multiple", "parallel", "parallel_multiple",
               "irrelevance", "live_simple", "live_multiple", "live_parallel", "live_parallel_multiple",
               "live_irrelevance", "live_relevance"]
# Files in BFCL's data folder that are not single-turn question files.
OTHER_KINDS = ("multi_turn_", "memory", "web_search", "format_sensitivity")


def language(category: str) -> str:
    """The language BFCL checks a category's values in: java, javascript or python."""
    return "java" if category.endswith("_java") else "javascript" if category.endswith("_javascript") else "python"


@dataclass
class Task:
    category: str
    id: str
    messages: list[dict]  # the question's turns, flattened: [{role, content}, ...]
    functions: list[dict]  # BFCL's specs, as written (the checker reads their types)
    ground_truth: list[dict]  # [{name: {param: [acceptable values]}}]; [] = no gold call
    expects: str = "calls"  # "calls": the gold calls; "none": no call; "any": any call is right

    @property
    def language(self) -> str:
        return language(self.category)

    @property
    def tools(self) -> list[Tool]:
        return bfcl_tools(self.functions, self.language)


def category_file(data: Path, category: str) -> Path:
    """The questions file of `category` in `data` (BFCL_v4_<c>.json, BFCL_*_<c>.json or <c>.json)."""
    data = Path(data)
    for p in [data / f"BFCL_v4_{category}.json", *sorted(data.glob(f"BFCL_*_{category}.json")),
              data / f"{category}.json"]:
        if p.is_file():
            return p
    known = ", ".join(categories(data)) or "none"
    raise FileNotFoundError(f"no BFCL file for category {category!r} in {data} (categories there: {known})")


def categories(data: Path) -> list[str]:
    """The categories with a questions file in `data`."""
    out = []
    for p in sorted(Path(data).glob("BFCL_*_*.json")):
        out.append(p.stem.split("_", 2)[2])
    return out


def single_turn_categories(data: Path) -> list[str]:
    """The single-turn categories in `data` (what `--category all` runs): BFCL's in its own
    order, then any others (hand-made ones in the same format), multi-turn and agentic files left out."""
    there = categories(data)
    known = [c for c in SINGLE_TURN if c in there]
    return known + [c for c in there if c not in SINGLE_TURN and not c.startswith(OTHER_KINDS)]


def _expects_any_call(category: str) -> bool:
    return category.endswith("relevance") and not category.endswith("irrelevance")


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load_category(data: Path, category: str, limit: int | None = None) -> list[Task]:
    """The first `limit` tasks of `category` (all if None), with their gold answers."""
    qpath = category_file(data, category)
    questions = _lines(qpath)[:limit] if limit else _lines(qpath)
    apath = qpath.parent / "possible_answer" / qpath.name
    answers = {a["id"]: a["ground_truth"] for a in _lines(apath)} if apath.is_file() else {}
    if category.startswith("multi_turn_"):
        raise ValueError(f"{category} is a multi-turn category; it runs as agent episodes, not as single replies")
    tasks = []
    for q in questions:
        if apath.is_file() and q["id"] not in answers:
            raise ValueError(f"{apath}: no gold answer for {q['id']}")
        turns = q["question"]
        messages = [m for turn in turns for m in (turn if isinstance(turn, list) else [turn])]
        gold = answers.get(q["id"], [])
        expects = "calls" if gold else "any" if not apath.is_file() and _expects_any_call(category) else "none"
        tasks.append(Task(category, q["id"], messages, q["function"], gold, expects))
    return tasks


def request_text(task: Task) -> str:
    """What the user wrote in `task` (its user turns, one per line)."""
    return "\n".join(m.get("content") or "" for m in task.messages if m.get("role") == "user")


def tool_choice(tasks: Sequence[Task]) -> str:
    """The category's decoding mode: "required" if every task has gold calls, else "auto"."""
    return "required" if all(t.expects == "calls" for t in tasks) else "auto"


# --- the prompt -------------------------------------------------------------------------------
# One prompt for every category (no tuning to the data). It lists each tool with its arguments'
# types and descriptions, and shows the call format with placeholders (a concrete example pulls
# a small model towards the tool it names and the values it shows: with `example`, one built
# from the table, measured in railcall.prompts.chat.describe_format); its text is
# `railcall.prompts.chat.system_prompt(..., purpose="bfcl")`. Changing it changes
# PROMPT_VERSION, which a resumed run checks (with the call format, a setting of its own).

PROMPT_VERSION = "bfcl-1"


def prompt_ids(tokenizer, task: Task, fmt: str = "json", example: bool = False, *,
               examples: Sequence[dict] = ()) -> list[int]:
    """Token ids of the chat prompt for `task`, ready for generation. The task's own system
    messages (some live tasks have one) follow the tool list in the same system message. `fmt`:
    the call format the system prompt describes (with an example call when `example`).
    `examples`: in-context examples as earlier user and assistant turns, before the task's
    question (`railcall.prompts.shots`, built from the tool table alone)."""
    tools = task.tools
    own_system = [m["content"] for m in task.messages if m["role"] == "system"]
    rest = list(examples) + [{"role": m["role"], "content": m["content"]} for m in task.messages if m["role"] != "system"]
    if has_native_tools(tokenizer):
        specs = [{"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
                 for t in tools]
        msgs = ([{"role": "system", "content": "\n\n".join(own_system)}] if own_system else []) + rest
        out = tokenizer.apply_chat_template(msgs, tools=specs, add_generation_prompt=True, tokenize=True)
    else:
        msgs = [{"role": "system", "content": "\n\n".join([system_prompt(tools, fmt, purpose="bfcl", example=example), *own_system])}] + rest
        out = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    ids = out["input_ids"] if hasattr(out, "keys") else out
    return list(ids[0] if ids and isinstance(ids[0], list) else ids)


def bfcl_prompt_ids(tokenizer, task: Task) -> list[int]:
    """Token ids of the chat prompt BFCL itself gives a model in prompt mode: its default system
    prompt (the functions as JSON, the reply asked for as a Python list of calls), its
    language hints on the functions of a Java or JavaScript task, the task's own system message
    after it -- each built by the bfcl-eval wheel's own code -- then the question."""
    import copy

    from bfcl_eval.model_handler.utils import system_prompt_pre_processing_chat_model
    from bfcl_eval.utils import add_language_specific_hint_to_function_doc

    [entry] = add_language_specific_hint_to_function_doc([{"id": task.id, "function": copy.deepcopy(task.functions)}])
    msgs = system_prompt_pre_processing_chat_model([{"role": m["role"], "content": m["content"]} for m in task.messages],
                                                   entry["function"], task.id)
    out = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    ids = out["input_ids"] if hasattr(out, "keys") else out
    return list(ids[0] if ids and isinstance(ids[0], list) else ids)
