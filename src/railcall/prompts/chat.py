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

import json

from typing import Sequence

from railcall.grammar.tools import Tool


def describe_tools(tools: Sequence[Tool], detail: str = "brief") -> str:
    """The tool list of a system prompt, a tool per line. `detail`:
    "brief"    each argument's type, `optional` where it is not required (the demo, the server);
    "choices"  an enumerated argument's values instead of its type, the first 12 (the agent:
               its file and skill names are enums built from the workspace);
    "full"     an argument per line with its type, required or optional, its description and its
               values (BFCL's prompt: its tasks' descriptions carry what the argument means)."""
    if detail not in ("brief", "choices", "full"):
        raise ValueError(f"unknown detail {detail!r}; use brief, choices or full")
    lines = []
    for t in tools:
        if t.custom:
            lines.append(" ".join(x for x in (f"- {t.name}:", " ".join(t.description.split()), describe_input(t)) if x))
            continue
        props = t.parameters.get("properties", {})
        req = set(t.parameters.get("required", []))
        if detail == "full":
            lines.append(f"- {t.name}: {' '.join(t.description.split())}")
            lines += [_full_arg(k, p if isinstance(p, dict) else {}, k in req) for k, p in props.items()]
            continue
        if detail == "choices":
            args = ", ".join(_choices_arg(k, p) for k, p in props.items())
        else:
            args = ", ".join(f"{k} ({p.get('type', 'any')}{'' if k in req else ', optional'})" for k, p in props.items())
        lines.append(f"- {t.name}: {t.description} Arguments: {args or 'none'}.")
    return "\n".join(lines)


def describe_input(tool: Tool) -> str:
    """What a custom tool takes, for the prompt: one input text, and its grammar's text."""
    f = tool.input_format
    if f["type"] == "text":
        return "Input: one text (not arguments), written as one JSON string."
    kind = "regular expression" if f["syntax"] == "regex" else f"{f['syntax'].upper() if f['syntax'] == 'gbnf' else 'Lark'} grammar"
    return (f"Input: one text (not arguments), written as one JSON string, that this {kind} describes:\n"
            + f["definition"].strip())


def _choices_arg(name: str, p: dict) -> str:
    if "enum" in p:
        shown = ", ".join(json.dumps(v, ensure_ascii=False) for v in p["enum"][:12])
        more = f", ... ({len(p['enum'])} in all)" if len(p["enum"]) > 12 else ""
        return f"{name} (one of {shown}{more})"
    return f"{name} ({p.get('type', 'any')})"


def _full_arg(name: str, p: dict, required: bool) -> str:
    kind = p.get("type", "any")
    kind = kind if isinstance(kind, str) else "/".join(kind)
    desc = " ".join(str(p.get("description", "")).split())
    extra = f" One of: {', '.join(json.dumps(v) for v in p['enum'])}." if isinstance(p.get("enum"), list) else ""
    return f"    {name} ({kind}, {'required' if required else 'optional'}): {desc}{extra}".rstrip()


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
    if t.custom:
        return call_text(t.name, "<input text>", fmt)
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


# The system prompts, by who asks. Each opens, lists the tools and asks for the format in the
# words it was measured with on its own model and suite, so each stays as written; the tool list
# and the format's words are the ones above. The format is shown with placeholders, not with one
# of the tools: a concrete example pulls a small model towards the tool it names and the values
# it shows (`describe_format`).
PURPOSES = ("call", "server", "agent", "bfcl")


def system_prompt(tools: Sequence[Tool], fmt: str = "json", *, purpose: str = "call", example: bool = False,
                  choice: str = "required", parallel: bool = False, answer_tool: str = "answer") -> str:
    """The system text that presents `tools` and the call format `fmt` to a model whose chat
    template does not know tools. `purpose`:
    "call"    one call for one request (the demo, `chat_prompt_ids`, the HF processor's example);
    "server"  the server's, by its `choice` ("auto": a call or plain text; else a call) and
              `parallel` (several calls in one reply);
    "agent"   one call per turn, step by step, ending with a call of `answer_tool` (the agent adds
              its examples and notes after it);
    "bfcl"    BFCL's: one or several calls, or plain text where no tool fits, the arguments
              described one per line.
    `example`: one call built from the table (`call_example`; off by default, measured)."""
    if fmt not in SKELETONS:
        raise ValueError(f"unknown call format {fmt!r}; known: {', '.join(SKELETONS)}")
    shape = skeleton(fmt, quoted=True)
    if purpose == "call":
        return ("You are an assistant that acts by calling one tool. Tools:\n" + describe_tools(tools) + "\n"
                "Choose the tool that fits the request and " + describe_format(tools, fmt, example=example, quoted=True))
    if purpose == "bfcl":
        return ("You are an assistant that can call tools. Tools:\n" + describe_tools(tools, "full") + "\n"
                "To call a tool, " + describe_format(tools, fmt, several=True, example=example) + ". "
                "If none of the tools fits the request, answer in plain text.")
    if purpose == "agent":
        return ("You are an assistant that solves the user's task step by step by calling tools. Tools:\n"
                + describe_tools(tools, "choices") + "\n"
                f"Answer each turn with {ONE[fmt]}: {shape}"
                + (f", for example {call_example(tools, fmt)}" if example else "") + ". "
                f"After each call you see its result. When you know the reply, call {answer_tool}.")
    if purpose != "server":
        raise ValueError(f"unknown purpose {purpose!r}; use {', '.join(PURPOSES)}")
    head = "You are an assistant that can act by calling tools. Tools:\n" + describe_tools(tools) + "\n"
    shown = call_example(tools, fmt)
    if parallel:
        how = {"json": f"a JSON array of one or more calls, each {shape}",
               "openai": f"a JSON array of one or more calls, each {shape}",
               "hermes": f"one or more <tool_call> blocks, one per line, each {shape}",
               "pythonic": f"one Python list of one or more calls, {shape}"}[fmt]
        if fmt in ("json", "openai"):
            shown = f"[{shown}]"
    else:
        how = f"{ONE[fmt]} and nothing else: {shape}"
    if example:
        how += f", for example {shown}"
    custom = next((t for t in tools if t.custom), None)
    if custom is not None and fmt in SKELETONS and fmt != "pythonic":
        # a custom tool's call holds its input text where the arguments object would be
        how += ("; a tool that takes an input text gets it as one JSON string instead of arguments: "
                + call_text("<tool name>", "<input text>", fmt))
    if choice == "auto":
        return head + f"To call a tool, answer with {how}. Otherwise answer in plain text."
    return head + f"Choose the tool that fits the request and answer with {how}"


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
