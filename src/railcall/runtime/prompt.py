"""Chat prompts that present a tool table to the model.

A model whose chat template knows tools (its template mentions `tools`) gets them through the
template, as it was trained; a model without one (SmolLM2-Instruct) gets a system message that
lists each tool with its arguments and shows the wire format. The grammar enforces the format
either way; the prompt is what gives the model a chance at the semantics.
"""

from __future__ import annotations

from typing import Sequence

from railcall.grammar.tools import Tool


def describe_tools(tools: Sequence[Tool]) -> str:
    lines = []
    for t in tools:
        props = t.parameters.get("properties", {})
        req = set(t.parameters.get("required", []))
        args = ", ".join(f"{k} ({p.get('type', 'any')}{'' if k in req else ', optional'})" for k, p in props.items())
        lines.append(f"- {t.name}: {t.description} Arguments: {args or 'none'}.")
    return "\n".join(lines)


def system_prompt(tools: Sequence[Tool]) -> str:
    # The format is shown with placeholders, not with one of the tools: a concrete example
    # pulls a small model towards the tool it names.
    return (
        "You are an assistant that acts by calling one tool. Tools:\n" + describe_tools(tools) + "\n"
        "Choose the tool that fits the request and answer with exactly one JSON object and nothing "
        'else: {"tool":"<tool name>","args":{"<argument>":"<value>"}}'
    )


def has_native_tools(tokenizer) -> bool:
    template = getattr(tokenizer, "chat_template", None) or ""
    return isinstance(template, str) and "tools" in template


def chat_prompt_ids(tokenizer, tools: Sequence[Tool], user: str) -> list[int]:
    """Token ids of a chat prompt asking `user` with `tools` available, ready for generation."""
    if has_native_tools(tokenizer):
        specs = [{"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
                 for t in tools]
        messages = [{"role": "user", "content": user}]
        out = tokenizer.apply_chat_template(messages, tools=specs, add_generation_prompt=True, tokenize=True)
    else:
        messages = [{"role": "system", "content": system_prompt(tools)}, {"role": "user", "content": user}]
        out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = out["input_ids"] if hasattr(out, "keys") else out
    return list(ids[0] if ids and isinstance(ids[0], list) else ids)
