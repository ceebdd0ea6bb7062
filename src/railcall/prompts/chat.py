"""Chat prompts that present a tool table to the model.

A model whose chat template knows tools (its template mentions `tools`) gets them through the
template, as it was trained; a model without one (SmolLM2-Instruct) gets a system message that
lists each tool with its arguments and shows the call format with placeholders (`skeleton`), and
on request one example built from the table (`call_example`: the first tool, its required
arguments as placeholders of their types; never a task's answer; off by default, see
`describe_format` for why). The grammar enforces the format either way; the prompt is what gives
the model a chance at the semantics.
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


# How each call format is spelled, for the prompt: the skeleton with placeholders, and what
# several calls in one reply look like (railcall.grammar.tools.FORMATS). `skeleton(fmt, quoted)`
# writes the value placeholder as "<value>" or <value>: each prompt keeps the JSON wording it was
# measured with (the BFCL prompt unquoted, the others quoted).
SKELETONS = {
    "json": '{"tool":"<tool name>","args":{"<argument>":<value>}}',
    "openai": '{"name":"<tool name>","arguments":{"<argument>":<value>}}',
    "hermes": '<tool_call>{"name":"<tool name>","arguments":{"<argument>":<value>}}</tool_call>',
    "pythonic": '[<tool name>(<argument>=<value>)]',
}
ONE = {"json": "exactly one JSON object", "openai": "exactly one JSON object",
       "hermes": "exactly one <tool_call> block", "pythonic": "exactly one Python list with the call"}
SEVERAL = {
    "json": "a JSON array of such objects",
    "openai": "a JSON array of such objects",
    "hermes": "one <tool_call> block per call, one per line",
    "pythonic": "one list holding every call, separated by commas",
}


def _placeholder(name: str, p) -> object:
    """A value of the argument's type that says what goes there (never a real answer)."""
    p = p if isinstance(p, dict) else {}
    kind = p.get("type", "string")
    kind = next((k for k in kind if k != "null"), "string") if isinstance(kind, list) else kind
    if isinstance(p.get("enum"), list) and p["enum"]:
        return p["enum"][0]
    return {"integer": 0, "number": 0.0, "boolean": False, "array": [], "object": {}, "null": None}.get(kind, f"<{name}>")


def call_example(tools: Sequence[Tool], fmt: str = "json") -> str:
    """One call in `fmt`, built from the table alone: the first tool, its required arguments,
    each a placeholder of its type (`"<city>"`, 0, false, []). It shows the format; the values
    are not an answer to anything."""
    t = tools[0]
    props = t.parameters.get("properties", {}) or {}
    return call_text(t.name, {k: _placeholder(k, props.get(k)) for k in t.parameters.get("required", []) if k in props},
                     fmt)


def call_text(name: str, args: dict, fmt: str = "json") -> str:
    """One call as `fmt`'s grammar writes it (compact, arguments in the order given): the one
    spelling of a call, shared with `railcall.grammar.tools.write_calls` and the in-context
    examples (`railcall.prompts.shots`)."""
    from railcall.errors import GrammarError
    from railcall.grammar.tools import call_format

    try:
        return call_format(fmt).write([(name, args)])
    except GrammarError:
        raise ValueError(f"unknown call format {fmt!r}; known: {', '.join(SKELETONS)}") from None


def skeleton(fmt: str = "json", quoted: bool = False) -> str:
    """The format's call with placeholders; `quoted`: the value placeholder as a string."""
    if fmt not in SKELETONS:
        raise ValueError(f"unknown call format {fmt!r}; known: {', '.join(SKELETONS)}")
    return SKELETONS[fmt].replace("<value>", '"<value>"') if quoted else SKELETONS[fmt]


def describe_format(tools: Sequence[Tool], fmt: str = "json", *, several: bool = False, example: bool = False,
                    quoted: bool = False) -> str:
    """The words that ask for a call in `fmt` (no closing period): its skeleton; with `example`,
    one call built from the table (`call_example`); with `several`, how a reply holds more than
    one call.

    The example is off by default, measured: on BFCL `multiple` (its first 20 tasks, SmolLM2,
    greedy) the prompt with the example scored 3 of 20 by AST against 7 of 20 without it -- the
    model copied the placeholders (`"a":0,"b":0,"c":0`, `"coordinates":[]`) into its calls."""
    text = f"answer with {ONE[fmt]} and nothing else: {skeleton(fmt, quoted)}"
    if example:
        text += f", for example {call_example(tools, fmt)}"
    if several:
        text += f". If the request needs several calls, answer with {SEVERAL[fmt]}"
    return text


def system_prompt(tools: Sequence[Tool], fmt: str = "json", *, example: bool = False) -> str:
    # The format is shown with placeholders, not with one of the tools: a concrete example pulls
    # a small model towards the tool it names and the values it shows (`describe_format`).
    return ("You are an assistant that acts by calling one tool. Tools:\n" + describe_tools(tools) + "\n"
            "Choose the tool that fits the request and " + describe_format(tools, fmt, example=example, quoted=True))


def has_native_tools(tokenizer) -> bool:
    template = getattr(tokenizer, "chat_template", None) or ""
    return isinstance(template, str) and "tools" in template


def chat_prompt_ids(tokenizer, tools: Sequence[Tool], user: str, fmt: str = "json", *, example: bool = False) -> list[int]:
    """Token ids of a chat prompt asking `user` with `tools` available, ready for generation."""
    if has_native_tools(tokenizer):
        specs = [{"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
                 for t in tools]
        messages = [{"role": "user", "content": user}]
        out = tokenizer.apply_chat_template(messages, tools=specs, add_generation_prompt=True, tokenize=True)
    else:
        messages = [{"role": "system", "content": system_prompt(tools, fmt, example=example)},
                    {"role": "user", "content": user}]
        out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = out["input_ids"] if hasattr(out, "keys") else out
    return list(ids[0] if ids and isinstance(ids[0], list) else ids)
