"""A validated request -> a generation plan: prompt ids, the answer grammar and sampling settings.

Everything that can reject a request happens here, before it is queued, so that a bad request
costs milliseconds and never the model's time: messages that do not fit together (a tool result
without its call, arguments that are not JSON), a tool or response schema railcall cannot compile
(the 400 names the keyword and JSON pointer), a named tool_choice that is not in `tools`, a prompt
longer than the context. Runs on a worker thread of the server (grammar compilation and the chat
template are CPU work), never on the event loop.

How tool_choice maps to the regions of the turn (`railcall.runtime.regions.answer_matcher`; a
reasoning region comes first on models whose think delimiters are single tokens):

    none      free text, or the response_format grammar ("required" region) when one is given
    required  the tool grammar: one call, or with parallel_tool_calls several (a JSON array in
              railcall's JSON and OpenAI formats, several <tool_call> blocks in the Hermes format,
              one Python list in the pythonic format)
    {name}    the tool grammar of that one tool, one call
    auto      free text in which the call trigger (`{"tool":"`, `{"name":"`, `[`, or the
              <tool_call> token or text: `AUTO_TRIGGERS`) starts a call under the tool grammar;
              with a response_format, the answer is either a call or the response schema (one
              grammar, the two as alternatives)

The call format is the request's `call_format` (railcall's extension), else the served model's
(`railcall serve --format`); the grammar, the prompt and the output parser all follow it. With
`routing: "scored"` each row chooses the tool name by whole-name likelihood (a NameRouter per
row, scored on the row's KV in the batch: `railcall.runtime.batch.BatchLoop.scorer`). With
`values: "grounded"` the grammar's tools take, in each required numeric argument, only the
numbers the conversation states (the user's messages, the assistant's text, the tool results),
and a "required" parallel reply makes as many calls as the last user message's numbers fill,
each with its own part of them (`railcall.heuristics.grounding`); the output parser still reads
the calls against the tools as sent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from railcall.runtime.decode import SamplingParams
from railcall.errors import GrammarError, MatcherError, RequestError, SchemaError
from railcall.grammar import ir
from railcall.grammar.schema import SchemaOptions, schema_to_ir
from railcall.grammar.tools import Tool, ToolGrammarBuilder
from railcall.grammar.turn import Free, structural_tag
from railcall.matcher import MAX_STRING, CompiledGrammar, Matcher, compiled_grammar
from railcall.output import AUTO_TRIGGERS, Delimiters
from railcall.runtime.regions import answer_matcher
from railcall.server.messages import text_of
from railcall.server.schemas import ChatCompletionRequest, guided

if TYPE_CHECKING:  # pragma: no cover
    from railcall.server.model import ServedModel

# The server's default completion length when the request names none: long enough for an
# answer, short enough that a client that forgot max_tokens does not hold a row of the decode
# loop for minutes (~80 ms per token on 2 cores).
DEFAULT_MAX_TOKENS = 256

_BUILDER = ToolGrammarBuilder()


@dataclass
class Plan:
    """One request, ready for the engine. Built per request; `grammar` is shared (cached)."""

    prompt: list[int]
    params: SamplingParams
    kind: str  # "text" | "json" | "tools" | "auto"
    mode: str = "none"  # the answer_matcher mode: "none" | "auto" | "required"
    tool_choice: str = "none"  # for the output parser: "none" | "auto" | "required"
    grammar: CompiledGrammar | None = None  # the answer grammar (None: free text)
    tools: list[Tool] = field(default_factory=list)
    parallel: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    return_token_ids: bool = False
    stream: bool = False
    include_usage: bool = False
    n: int = 1  # choices: rows of one batch, each with its own matcher and seed
    plain: bool = False  # /v1/completions: the grammar alone, no regions (no reasoning, no free text)
    call_format: str | None = None  # the calls' format (None: the served model's)
    routing: str = "greedy"  # "scored"/"matched": each row gets a NameRouter (railcall.heuristics.routing)
    asked: str = ""  # the last user message's text (matched routing weighs the tools by its words)
    tags: Free | None = None  # a structural tag's tagged parts in the free text

    def matcher(self, served: "ServedModel"):
        """A fresh per-request matcher (built on the engine's worker thread); None for free text
        without reasoning, which needs no mask at all."""
        tags = self.tags.tags if self.tags is not None else ()
        if self.plain and tags:  # /v1/completions: the tags alone, no delimiters of a chat turn
            return answer_matcher(served.vocab, None, Delimiters(), mode="none", tags=tags,
                                  max_string=_max_string(served))
        if self.plain or (self.grammar is None and not served.reasoning and not tags):
            return Matcher(self.grammar) if self.grammar is not None else None
        trigger = AUTO_TRIGGERS.get(self.call_format) if self.mode == "auto" and self.kind == "auto" else None
        return answer_matcher(served.vocab, self.grammar, served.delimiters, mode=self.mode, reasoning=served.reasoning,
                              trigger=trigger, tags=tags, max_string=_max_string(served))

    def router(self, served: "ServedModel"):
        """A fresh per-row NameRouter for scored routing (its scorer is bound by the loop that
        runs the row); None for greedy routing or a request without tools."""
        if self.routing not in ("scored", "matched") or not self.tools or self.call_format is None:
            return None
        from railcall.heuristics.routing import NameRouter, matching_tools

        prefer = matching_tools(self.tools, self.asked) if self.routing == "matched" else ()
        return NameRouter.for_tools(served.vocab, self.tools, self.call_format, temperature=self.params.temperature,
                                    prefer=prefer)


def build_plan(served: "ServedModel", req: ChatCompletionRequest) -> Plan:
    tools = _tools(req)
    choice = req.tool_choice if req.tool_choice is not None else ("auto" if tools else "none")
    named = None
    if not isinstance(choice, str):
        want = choice.function.name if choice.type == "function" else choice.custom.name
        named = next((t for t in tools if t.name == want and t.custom == (choice.type == "custom")), None)
        if named is None:
            known = ", ".join(f"{t.name} ({'custom' if t.custom else 'function'})" for t in tools) or "none"
            raise RequestError(f"tool_choice names the {choice.type} tool {want!r}, which is not in tools "
                               f"(known: {known})", param="tool_choice")
        choice = "named"
    if choice in ("required", "auto") and not tools:
        if choice == "required":
            raise RequestError("tool_choice 'required' needs at least one tool in tools", param="tool_choice")
        choice = "none"
    answer = _response_grammar(req)  # (ir.Grammar | None, kind), or (Free, "tags") for a structural tag
    tags = None
    if isinstance(answer[0], Free):
        tags, answer = answer[0], (None, "text")
        if choice in ("required", "named"):
            raise RequestError("a structural_tag response_format puts its tagged parts in free text, and a required "
                               "or named tool_choice leaves none: send tool_choice auto (calls and tagged parts in "
                               "one reply) or none", param="response_format")
    calling = choice in ("required", "named", "auto")
    fmt = req.call_format or served.call_format
    if req.routing != "greedy" and not getattr(served, "scores_branches", True):
        raise RequestError(f"routing {req.routing!r} needs a backend that can score the tool names' branches, and this "
                           "server's cannot; send routing 'greedy' (or leave it out)", param="routing",
                           code="unsupported_field")
    last = next((i for i in range(len(req.messages) - 1, -1, -1) if req.messages[i].role == "user"), None)
    asked = text_of(req.messages[last].content) if last is not None else ""
    spelled, per_call = (named and [named]) or tools, None
    if req.values == "grounded" and calling:
        from railcall.heuristics.grounding import ground

        # the rest of the conversation (earlier turns, tool results) offers numbers, not calls
        seen = "\n".join(text_of(m.content) for i, m in enumerate(req.messages)
                          if i != last and m.role in ("user", "assistant", "tool"))
        g = ground(spelled, asked, seen)
        spelled, per_call = g.tools, g.per_call if choice == "required" and req.parallel_tool_calls else None
    if per_call:
        grammar, kind = _tool_grammar(spelled, fmt, parallel=True, per_call=per_call), "tools"
    elif choice == "named":
        grammar, kind = _tool_grammar(spelled, fmt, parallel=False), "tools"
    elif choice == "required":
        grammar, kind = _tool_grammar(spelled, fmt, parallel=req.parallel_tool_calls), "tools"
    elif choice == "auto":
        # Several calls in one turn are several triggers, each starting one call.
        calls = _tool_grammar(spelled, fmt, parallel=False)
        grammar, kind = (calls if answer[0] is None else call_or_answer(calls, answer[0])), "auto"
    else:
        grammar, kind = answer
    if grammar is None:
        mode = "none"
    elif choice == "auto" and answer[0] is None:
        mode = "auto"
    else:
        mode = "required"
    parser_choice = {"named": "required", "required": "required", "auto": "auto"}.get(choice, "none")
    prompt = served.prompt_ids(req, tools if calling else [], choice, named, kind, answer[0] is not None, fmt)
    params = _params(served, req, prompt, kind, where="messages")
    compiled = _compile(served, grammar, kind)
    plan = Plan(prompt=prompt, params=params, kind=kind, mode=mode, tool_choice=parser_choice, grammar=compiled,
                tools=tools if calling else [], parallel=req.parallel_tool_calls and choice != "named",
                logprobs=req.logprobs, top_logprobs=params.top_logprobs, return_token_ids=req.return_token_ids,
                stream=req.stream, include_usage=bool(req.stream_options and req.stream_options.include_usage), n=req.n,
                call_format=fmt, routing=req.routing, asked=asked, tags=tags)
    return _check_tags(served, plan)


def _max_string(served: "ServedModel") -> int:
    return getattr(served, "max_string", MAX_STRING)


def _check_tags(served: "ServedModel", plan: Plan) -> Plan:
    """A structural tag's turn is compiled now (shared afterwards), so that a tag railcall cannot
    run is this request's 400, not an error on the engine's thread."""
    if plan.tags is not None:
        try:
            plan.matcher(served)
        except (GrammarError, MatcherError) as e:
            raise RequestError(f"the structural tag could not be compiled: {_for_http(e, 'response_format')}",
                               param="response_format", code="invalid_schema") from None
    return plan


def call_or_answer(calls: ir.Grammar, answer: ir.Grammar) -> ir.Grammar:
    """tool_choice auto with a response_format: a call or the answer, one grammar (a rule that
    ends in a rule keeps continuing into it where either side's does: a custom tool's input)."""
    return ir.Grammar(ir.Alt(calls.start, answer.start), calls.rules + answer.rules, name=calls.name + "|" + answer.name,
                      tail_calls=calls.tail_calls or answer.tail_calls)


def build_completion_plan(served: "ServedModel", req) -> Plan:
    """`/v1/completions`: the prompt as the model's own tokens (no chat template, no tools, no
    reasoning region), the answer free or under `response_format` / the guided fields."""
    grammar, kind = _response_grammar(req)
    tags = None
    if isinstance(grammar, Free):
        tags, grammar, kind = grammar, None, "text"
    if isinstance(req.prompt, str):
        prompt = [int(i) for i in served.tokenizer.encode(req.prompt)]
    else:
        width = served.vocab.logits_width
        bad = next((t for t in req.prompt if not 0 <= t < width), None)
        if bad is not None:
            raise RequestError(f"prompt holds token {bad}, but this model's tokens are 0..{width - 1}", param="prompt")
        prompt = list(req.prompt)
    if not prompt:
        raise RequestError("the prompt is empty once tokenized", param="prompt")
    params = _params(served, req, prompt, kind, where="prompt")
    plan = Plan(prompt=prompt, params=params, kind=kind, mode="required" if grammar is not None else "none",
                grammar=_compile(served, grammar, kind), plain=True, return_token_ids=req.return_token_ids,
                stream=req.stream, include_usage=bool(req.stream_options and req.stream_options.include_usage), n=req.n,
                tags=tags)
    return _check_tags(served, plan)


# The request's on_length -> the decode loop's ceiling mode (railcall.runtime.decode.CUT_MODES)
ON_LENGTH = {"fit": "fit", "cut": "leave", "close": "close"}


def _params(served: "ServedModel", req, prompt: list[int], kind: str, where: str) -> SamplingParams:
    """Sampling settings from the request's fields; the token limit checked against the context."""
    budget = served.context_length - len(prompt)
    limit = req.token_limit
    if budget < 1 or (limit is not None and limit > budget):
        raise RequestError(f"the prompt is {len(prompt)} tokens and the model's context is {served.context_length}: "
                           f"{'no room is left' if budget < 1 else f'at most {budget} tokens can be generated'}; "
                           f"shorten the {where} or lower max_tokens",
                           param=where if budget < 1 else
                           ("max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"),
                           code="context_length_exceeded")
    max_tokens = limit if limit is not None else min(DEFAULT_MAX_TOKENS, budget)
    # Stop strings end free text (prose, and the prose around calls with tool_choice auto); inside
    # a grammar they would cut a call or a JSON answer in two, so they are not looked for there.
    stop = tuple(req.stop or ()) if kind in ("text", "auto") else ()
    if kind in ("text", "auto") and where == "messages":
        from railcall.prompts.plain import stop_strings

        # a base model's chat is plain text turns it does not end itself (railcall.prompts.plain)
        stop += tuple(s for s in stop_strings(getattr(served, "tokenizer", None)) if s not in stop)
    width = served.vocab.logits_width
    bias = {}
    for k, b in (req.logit_bias or {}).items():
        if int(k) >= width:
            raise RequestError(f"logit_bias names token {k}, but this model's tokens are 0..{width - 1}", param="logit_bias")
        bias[int(k)] = float(b)
    return SamplingParams(max_tokens=max_tokens, temperature=req.temperature, top_p=req.top_p, top_k=req.top_k,
                          seed=req.seed, top_logprobs=(req.top_logprobs or 0) if req.logprobs else 0, stop=stop,
                          cut=ON_LENGTH[req.on_length], distinct_calls=req.distinct_calls, min_tokens=req.min_tokens,
                          repetition_penalty=req.repetition_penalty, presence_penalty=req.presence_penalty,
                          frequency_penalty=req.frequency_penalty, logit_bias=bias or None)


def _compile(served: "ServedModel", grammar, kind: str) -> CompiledGrammar | None:
    if grammar is None:
        return None
    try:
        return compiled_grammar(grammar, served.vocab, max_string=getattr(served, "max_string", MAX_STRING))
    except (GrammarError, MatcherError) as e:
        where = "tools" if kind in ("tools", "auto") else "response_format"
        raise RequestError(f"the answer grammar could not be compiled: {_for_http(e, where)}", param=where,
                           code="invalid_schema") from None


# What an HTTP client does to get what `SchemaOptions(lenient=True)` gives a library caller.
_HTTP_LENIENT = {
    "tools": {"ignore": "; remove it from the schema", "anyof": ""},
    "response_format": {"ignore": "; set response_format.json_schema.strict to false to have it ignored",
                        "anyof": ", or set response_format.json_schema.strict to false to treat it as anyOf"},
}


def _for_http(e: Exception, where: str) -> str:
    """A compile error in the terms of this API: a SchemaError's remedy is what an HTTP client
    can change (the request cannot set SchemaOptions)."""
    if isinstance(e, SchemaError):
        return e.describe(lenient=_HTTP_LENIENT[where], options=False)
    return str(e)


def _tools(req: ChatCompletionRequest) -> list[Tool]:
    tools = []
    seen = set()
    for i, spec in enumerate(req.tools or []):
        fn = spec.function if spec.type == "function" else spec.custom
        if fn.name in seen:
            raise RequestError(f"two tools are named {fn.name!r}; tool names must be unique", param=f"tools[{i}].{spec.type}.name")
        seen.add(fn.name)
        if spec.type == "custom":  # one input text under its format's grammar
            where = f"tools[{i}].custom.format" + (".grammar.definition" if fn.format and fn.format.grammar else "")
            try:
                tool = Tool(fn.name, fn.description, input_format=fn.format.spec() if fn.format else {"type": "text"})
                _BUILDER.args_ir(tool)  # compiles the grammar now: a bad one is this tool's 400
            except GrammarError as e:
                raise RequestError(f"{where}: {e}", param=where, code="invalid_grammar") from None
            tools.append(tool)
            continue
        params = fn.parameters if fn.parameters is not None else {"type": "object", "properties": {}}
        try:
            tool = Tool(fn.name, fn.description, params)
            _BUILDER.args_ir(tool)  # compiles the schema now: a bad one is this tool's 400
        except (GrammarError, RecursionError, ValueError, TypeError) as e:
            raise RequestError(f"tools[{i}].function.parameters: {_for_http(e, 'tools')}",
                               param=f"tools[{i}].function.parameters", code="invalid_schema") from None
        tools.append(tool)
    return tools


def _tool_grammar(tools, fmt, parallel: bool, per_call=None) -> ir.Grammar:
    if fmt == "pythonic" and any(t.custom for t in tools):
        raise RequestError("custom tools (one input text) have no spelling in the pythonic call format; send "
                           "call_format json, openai or hermes", param="call_format")
    try:
        return _BUILDER.sequence(per_call, fmt) if per_call else _BUILDER.grammar(tools, fmt, parallel=parallel)
    except GrammarError as e:
        raise RequestError(str(e), param="tools") from None


def _text_grammar(syntax: str, text: str, where: str) -> ir.Grammar:
    """A Lark, GBNF or regex grammar over the whole answer; a 400 naming `where` (and the line
    and column) where it is not one railcall runs."""
    from railcall.grammar.cfg import regex_grammar
    from railcall.grammar.gbnf import gbnf_grammar
    from railcall.grammar.lark import lark_grammar

    try:
        return {"lark": lark_grammar, "gbnf": gbnf_grammar, "regex": regex_grammar}[syntax](text)
    except GrammarError as e:
        raise RequestError(f"{where}: {e}", param=where, code="invalid_grammar") from None


def _structural_tag(tag, where: str) -> Free:
    """A structural tag's structures (each schema compiled as a response_format's, not strict) as
    the turn's tagged parts; a 400 naming the structure where one cannot be."""
    structures = []
    for i, s in enumerate(tag.structures):
        try:
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                node, rules = schema_to_ir(s.schema_, SchemaOptions(lenient=True))
        except (GrammarError, RecursionError, ValueError, TypeError) as e:
            raise RequestError(f"{where}.structures[{i}].schema: {_for_http(e, 'response_format')}",
                               param=f"{where}.structures[{i}].schema", code="invalid_schema") from None
        structures.append((s.begin, ir.Grammar(node, rules, name=f"structure:{s.begin}"), s.end))
    try:
        return structural_tag(structures, tag.triggers)
    except GrammarError as e:
        raise RequestError(f"{where}: {e}", param=where) from None


def _response_grammar(req) -> tuple[ir.Grammar | Free | None, str]:
    given = guided(req)
    if given is not None:
        kind, value, where = given
        if kind == "structural_tag":
            return _structural_tag(value, where), "tags"
        if kind == "choice":
            if len(set(value)) != len(value) or not all(value):
                raise RequestError(f"{where} needs distinct, non-empty strings", param=where)
            return ir.Grammar(ir.Alt(*(ir.Lit(c) for c in value)), name="choice"), "json"
        if kind == "json_object":
            node, rules = schema_to_ir({"type": "object"})
            return ir.Grammar(node, rules, name="json_object"), "json"
        if kind in ("regex", "grammar"):
            # vLLM's grammar field takes Lark or GBNF/EBNF (`::=` rules), as its back ends do
            syntax = "regex" if kind == "regex" else ("gbnf" if "::=" in value else "lark")
            return _text_grammar(syntax, value, where), "json"
        try:
            node, rules = schema_to_ir(value)
        except (GrammarError, RecursionError, ValueError, TypeError) as e:
            raise RequestError(f"{where}: {_for_http(e, 'response_format')}", param=where,
                               code="invalid_schema") from None
        return ir.Grammar(node, rules, name="guided_json"), "json"
    rf = req.response_format
    if rf is None or rf.type == "text":
        return None, "text"
    if rf.type == "grammar":
        return _text_grammar(rf.syntax, rf.definition, "response_format.definition"), "json"
    if rf.type == "structural_tag":
        return _structural_tag(rf.structural_tag(), "response_format"), "tags"
    if rf.type == "json_object":
        node, rules = schema_to_ir({"type": "object"})  # any object: free keys, any values
        return ir.Grammar(node, rules, name="json_object"), "json"
    spec = rf.json_schema
    schema = spec.schema_
    # strict: every assertion must be enforced (an unenforced one is a 400); not strict: assertions
    # the grammar cannot enforce are ignored, as OpenAI does without strict.
    options = SchemaOptions(lenient=not spec.strict)
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            node, rules = schema_to_ir(schema, options)
    except (GrammarError, RecursionError, ValueError, TypeError) as e:
        raise RequestError(f"response_format.json_schema.schema: {_for_http(e, 'response_format')}",
                           param="response_format.json_schema.schema", code="invalid_schema") from None
    return ir.Grammar(node, rules, name=f"json_schema:{spec.name}"), "json"
