"""OpenAI chat messages -> the messages a chat template renders, with railcall's instructions.

Per request, on the planning thread. Assistant calls in the history are written in the call
format the grammar enforces, so the model sees its own wire format; a model whose template does
not know tools (SmolLM2) gets the tool list and the call format in its system message.
"""

from __future__ import annotations

import json

from railcall.errors import RequestError
from railcall.grammar.tools import Tool
from railcall.prompts.chat import call_text, system_prompt
from railcall.server.schemas import ChatCompletionRequest, guided

# ---------------------------------------------------------------------------------------------

def text_of(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p.text for p in content)


def tools_instruction(tools: list[Tool], choice: str, parallel: bool, fmt: str = "json", example: bool = False) -> str:
    """The system text that presents the tools to a model whose chat template does not know
    tools (SmolLM2): `railcall.prompts.chat.system_prompt`'s "server" prompt."""
    return system_prompt(tools, fmt, purpose="server", choice=choice, parallel=parallel, example=example)


def written_calls(calls: list[tuple[str, dict]], fmt: str) -> str:
    """An assistant turn's calls as `fmt` writes them (several: one JSON array, one Python list,
    or one <tool_call> block per line)."""
    each = [call_text(n, a, fmt) for n, a in calls]
    if len(each) < 2:
        return "".join(each)
    if fmt == "hermes":
        return "\n".join(each)
    if fmt == "pythonic":
        return "[" + ", ".join(c[1:-1] for c in each) + "]"
    return "[" + ",".join(each) + "]"


def messages_for_template(req: ChatCompletionRequest, tools: list[Tool], choice: str, kind: str, has_schema: bool,
                          fmt: str, native: bool) -> tuple[list[dict], list[dict] | None]:
    """(messages, tools for the template) from the request; assistant calls are written in the
    call format the grammar enforces (`fmt`), so the model sees its own wire format in the
    history. `native`: the chat template presents the tools and renders the calls."""
    out: list[dict] = []
    names: dict[str, str] = {}  # tool_call_id -> function name
    for i, m in enumerate(req.messages):
        if m.role in ("system", "developer"):
            out.append({"role": "system", "content": text_of(m.content)})
        elif m.role == "user":
            out.append({"role": "user", "content": text_of(m.content)})
        elif m.role == "assistant":
            calls = []
            for j, c in enumerate(m.tool_calls or []):
                if c.type == "custom":  # a custom tool's call: its input text is the call's string
                    if c.id:
                        names[c.id] = c.custom.name
                    calls.append((c.custom.name, c.custom.input))
                    continue
                try:
                    args = json.loads(c.function.arguments or "{}")
                except ValueError:
                    raise RequestError(f"messages[{i}].tool_calls[{j}].function.arguments is not valid JSON: "
                                       f"{c.function.arguments[:80]!r}", param=f"messages[{i}].tool_calls[{j}].function.arguments") from None
                if c.id:
                    names[c.id] = c.function.name
                calls.append((c.function.name, args))
            text = text_of(m.content)
            if native:
                msg = {"role": "assistant", "content": text}
                if calls:
                    # a custom call's input as the JSON string the grammar writes (a template
                    # prints a string's arguments as they are)
                    msg["tool_calls"] = [{"type": "function", "function": {"name": n, "arguments": json.dumps(a) if
                                                                          isinstance(a, str) else a}} for n, a in calls]
                out.append(msg)
            else:
                written = [written_calls(calls, fmt)] if calls else []
                out.append({"role": "assistant", "content": "\n".join([t for t in [text] if t] + written)})
        else:  # tool
            if m.tool_call_id not in names:
                raise RequestError(f"messages[{i}] is a tool result for tool_call_id {m.tool_call_id!r}, but no earlier "
                                   "assistant message made a call with that id", param=f"messages[{i}].tool_call_id")
            if native:
                out.append({"role": "tool", "content": text_of(m.content), "tool_call_id": m.tool_call_id})
            else:
                out.append({"role": "tool", "content": f"{names[m.tool_call_id]} returned: {text_of(m.content)}"})
    extra = []
    if tools and not native:
        extra.append(tools_instruction(tools, choice, req.parallel_tool_calls and choice != "named", fmt))
    if kind == "json" or (kind == "auto" and has_schema):
        rf, given = req.response_format, guided(req)
        schema = (given[1] if given and given[0] == "json" else
                  rf.json_schema.schema_ if rf is not None and rf.type == "json_schema" else None)
        text = None  # (a grammar over the whole answer, what to call it)
        if given and given[0] in ("regex", "grammar"):
            text = given[1], "regular expression" if given[0] == "regex" else "grammar"
        elif rf is not None and rf.type == "grammar":
            text = rf.definition, f"{rf.syntax} grammar"
        if given and given[0] == "choice":
            extra.append("Answer with exactly one of: " + ", ".join(given[1]))
        elif text is not None:
            extra.append(f"Answer with text that this {text[1]} describes:\n{text[0]}")
        elif schema is not None:
            extra.append("Answer with a JSON object that follows this JSON Schema: "
                         + json.dumps(schema, separators=(",", ":")))
        else:
            extra.append("Answer with a JSON object.")
    if extra:
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + "\n".join(extra)}
        else:
            out.insert(0, {"role": "system", "content": "\n".join(extra)})
    specs = None
    if tools and native:
        specs = [template_spec(t) for t in tools]
    return out, specs


def template_spec(tool: Tool) -> dict:
    """A tool as a chat template that knows tools takes it: function tools as they are; a
    custom tool as a function whose arguments are one string, its grammar in the description
    (templates know function tools only; the calls' grammar is the tool's either way)."""
    if not tool.custom:
        return {"type": "function", "function": {"name": tool.name, "description": tool.description,
                                                 "parameters": tool.parameters}}
    from railcall.prompts.chat import describe_input

    return {"type": "function", "function": {"name": tool.name,
                                             "description": f"{tool.description} {describe_input(tool)}".strip(),
                                             "parameters": {"type": "string"}}}
