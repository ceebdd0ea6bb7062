"""Tool table -> grammar: the set of valid calls, built from the table as it is right now.

A tool is a name, a description, a JSON Schema for its arguments, and whether it mutates
anything. The grammar spells every call the table allows and nothing else: the machine
writes every key and every piece of punctuation, in declared order; the model chooses the tool
name among the table's names and fills in the values.

    {"tool":"read_file","args":{"path":"notes.txt"}}
     ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^ machine    ^^^^^^^^^ model

Tool names share prefixes (`read_file`, `read_dir`), so the name is a Select: one trie over all
names, followed by that tool's own argument grammar, and a name is committed only once its
closing quote is written.

Call formats are small classes (`CallFormat`), registered by name in FORMATS:

    json      {"tool":"get_weather","args":{"city":"Paris"}}        the seed's wire format (default)
    openai    {"name":"get_weather","arguments":{"city":"Paris"}}   OpenAI's function-call object
    hermes    <tool_call>{"name":…,"arguments":{…}}</tool_call>     tags as special tokens by id where
                                                                    the vocabulary has them, else text
    pythonic  [get_weather(city="Paris", days=3)]                   Python call syntax, arguments as
                                                                    typed literals (grammar.pythonic)

Every format reads back through `railcall.output.OutputParser(call_format=<name>)` into the same
`ToolCall` (a name and the arguments as JSON text). The other way, `CallFormat.write` (and
`write_calls` for a table's tools) spells calls as the format's grammar writes them: what a prompt's
example call or a history's earlier call should look like.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Sequence

from railcall.errors import GrammarError, SchemaError
from railcall.grammar import ir
from railcall.grammar.ir import prefix_rules  # noqa: F401 (a tool's rules are named for it; callers import it here)
from railcall.grammar.schema import SchemaOptions, schema_to_ir


# The syntaxes a custom tool's grammar may be written in: OpenAI's two, and GBNF
INPUT_SYNTAXES = ("lark", "regex", "gbnf")


@dataclass(frozen=True)
class Tool:
    """One tool of a table. `parameters` is a JSON Schema for the arguments object.

    A *custom* tool (OpenAI's `{"type": "custom"}`) takes one string instead of arguments, and
    `input_format` says which: `{"type": "text"}` (any non-empty text) or `{"type": "grammar",
    "syntax": "lark" | "regex" | "gbnf", "definition": "..."}` (a text of that grammar). Its call
    carries the input as the arguments' JSON string: `{"tool":"run_sql","args":"SELECT 1"}`.
    """

    name: str
    description: str = ""
    parameters: dict = field(default_factory=lambda: {"type": "object", "properties": {}})
    mutates: bool = False
    input_format: dict | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise GrammarError(f"a tool needs a non-empty string name, not {self.name!r}")
        if not isinstance(self.parameters, dict):
            raise GrammarError(f"tool {self.name!r}: parameters must be a JSON Schema object")
        f = self.input_format
        if f is None:
            return
        if not isinstance(f, dict) or f.get("type") not in ("text", "grammar"):
            raise GrammarError(f"tool {self.name!r}: input_format must be {{\"type\": \"text\"}} or "
                               f"{{\"type\": \"grammar\", \"syntax\", \"definition\"}}, not {f!r}")
        if f["type"] == "grammar" and (f.get("syntax") not in INPUT_SYNTAXES or not isinstance(f.get("definition"), str)):
            raise GrammarError(f"tool {self.name!r}: a grammar input_format needs syntax ({', '.join(INPUT_SYNTAXES)}) "
                               "and definition (the grammar's text)")

    @property
    def custom(self) -> bool:
        """Does the tool take one string (its `input_format`) instead of arguments?"""
        return self.input_format is not None

    @classmethod
    def from_openai(cls, spec: dict, *, mutates: bool = False) -> "Tool":
        """From an OpenAI-style tool dict: a function tool ({"type":"function","function":{...}}
        or the inner part) or a custom tool ({"type":"custom","custom":{name, description,
        format}}; the Responses API's flat {"type":"custom", name, description, format})."""
        if spec.get("type") == "custom":
            c = spec.get("custom", spec)
            if not c.get("name"):
                raise GrammarError("an OpenAI custom tool needs custom.name")
            fmt = c.get("format") or {"type": "text"}
            if fmt.get("type") == "grammar" and isinstance(fmt.get("grammar"), dict):
                fmt = {"type": "grammar", **fmt["grammar"]}  # Chat Completions nests it one level
            return cls(c["name"], c.get("description") or "", input_format=dict(fmt), mutates=mutates)
        fn = spec.get("function", spec)
        if "name" not in fn:
            raise GrammarError("an OpenAI tool needs function.name")
        return cls(fn["name"], fn.get("description", ""), fn.get("parameters") or {"type": "object", "properties": {}},
                   mutates=bool(fn.get("x-mutates", mutates)))

    def schema_key(self) -> str:
        """A content key for the tool's name and schema (computed once per Tool). Key order is
        part of it: properties are written in declared order, so a schema that declares them in
        another order is another grammar."""
        key = self.__dict__.get("_schema_key")
        if key is None:
            key = json.dumps([self.name, self.parameters] + ([self.input_format] if self.custom else []))
            self.__dict__["_schema_key"] = key  # a frozen dataclass: cache without __setattr__
        return key

    def input_grammar(self) -> ir.Grammar:
        """A custom tool's input as a grammar over the text itself (not yet inside a string);
        a GrammarError naming the line and column where the definition is not one railcall runs."""
        from railcall.grammar.cfg import regex_grammar
        from railcall.grammar.gbnf import gbnf_grammar
        from railcall.grammar.lark import lark_grammar

        f = self.input_format
        if f is None:
            raise GrammarError(f"tool {self.name!r} is a function tool: it takes arguments, not an input text")
        if f["type"] == "text":
            return regex_grammar(r"[\s\S]+")
        return {"lark": lark_grammar, "gbnf": gbnf_grammar, "regex": regex_grammar}[f["syntax"]](f["definition"])


class CallFormat:
    """How one call is written around a tool's name and arguments."""

    name = "base"

    def call(self, choices: tuple) -> ir.Node:  # pragma: no cover - abstract
        """The IR of one call, given a Select over (name key, arguments node) choices."""
        raise NotImplementedError

    def name_key(self, tool_name: str) -> bytes:
        # the JSON string of the name without its opening quote: the quote is the literal before
        return ir.json_literal(tool_name)[1:]

    def many(self, one: ir.Node, max_calls: int | None, min_calls: int = 1) -> ir.Node:
        """The whole output when calls may be parallel: `min_calls` to `max_calls` calls (None:
        no upper bound)."""
        raise NotImplementedError

    def single(self, one: ir.Node) -> ir.Node:
        """The whole output when there is one call (not parallel)."""
        return one

    def more_rules(self, one: ir.Node, max_calls: int | None) -> tuple:
        """Rules `many` refers to (a recursive tail of further calls), if any."""
        return ()

    def sequence(self, ones: Sequence[ir.Node]) -> ir.Node:
        """The whole output of exactly len(`ones`) calls, call i one of `ones[i]` (spelled as
        `many` spells parallel calls)."""
        return ir.JsonArray(None, len(ones), len(ones), tuple(ones))

    def args(self, node: ir.Node, rules: tuple, tool: "Tool") -> tuple:
        """A tool's arguments as this format spells them, from its JSON argument IR: (node,
        rules). JSON formats keep them as they are."""
        return node, rules

    def write(self, calls: Sequence[tuple[str, dict]]) -> str:
        """`calls` ((name, arguments) pairs) as this format's grammar writes them: one call as
        `single` spells it, several as `many` does; values compact, arguments in the order
        given (the grammar's is the schema's: `write_calls` orders them)."""
        if not calls:
            raise GrammarError("write needs at least one call")
        return self._one(*calls[0]) if len(calls) == 1 else self._many([self._one(n, a) for n, a in calls])

    def _one(self, name: str, args: dict) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def _many(self, written: list[str]) -> str:
        return "[" + ",".join(written) + "]"  # a JSON array, as ir.JsonArray writes it


class JsonCall(CallFormat):
    """The default wire format: {"tool":"<name>","args":{...}}; parallel calls as a JSON array."""

    name = "json"

    def call(self, choices):
        # The Select ends at the name's closing quote (where the name is committed); what follows
        # belongs to the tool, so it compiles to instructions shared by every table with the tool.
        return ir.Seq(ir.Lit(b'{"tool":"'), ir.Select(tuple((k, ir.Seq(ir.Lit(b',"args":'), v)) for k, v in choices)),
                      ir.Lit(b"}"))

    def many(self, one, max_calls, min_calls=1):
        return ir.JsonArray(one, min_calls, max_calls)

    def _one(self, name, args):
        return f'{{"tool":{_json(name)},"args":{_json(args)}}}'


class OpenAICall(JsonCall):
    """OpenAI's function-call object: {"name":"<name>","arguments":{...}}; parallel calls as a
    JSON array. (The arguments are an object here, not the JSON-encoded string of the wire API:
    the parser accepts both.)"""

    name = "openai"

    def call(self, choices):
        return ir.Seq(ir.Lit(b'{"name":"'), ir.Select(tuple((k, ir.Seq(ir.Lit(b',"arguments":'), v)) for k, v in choices)),
                      ir.Lit(b"}"))

    def _one(self, name, args):
        return f'{{"name":{_json(name)},"arguments":{_json(args)}}}'


class HermesCall(CallFormat):
    """<tool_call>{"name":"<name>","arguments":{...}}</tool_call>, tags as special tokens where
    the vocabulary has them (matched by id), else as text; parallel calls one per line."""

    name = "hermes"

    def __init__(self, open_tag: str = "<tool_call>", close_tag: str = "</tool_call>"):
        self.open_tag, self.close_tag = open_tag, close_tag

    def call(self, choices):
        return ir.Seq(
            ir.Special(self.open_tag),
            ir.Lit(b'{"name":"'),
            ir.Select(tuple((k, ir.Seq(ir.Lit(b',"arguments":'), v)) for k, v in choices)),
            ir.Lit(b"}"),
            ir.Special(self.close_tag),
        )

    def many(self, one, max_calls, min_calls=1):
        if max_calls == 1:
            return one
        if max_calls is None:
            rest: ir.Node = ir.Alt(ir.Seq(), ir.Seq(ir.Lit(b"\n"), ir.Ref("hermes_more")))
        else:  # bounded: unrolled, as pythonic's
            rest = ir.Seq()
            for _ in range(max_calls - min_calls):
                rest = ir.Alt(ir.Seq(), ir.Seq(ir.Lit(b"\n"), one, rest))
        return ir.Seq(one, *[ir.Seq(ir.Lit(b"\n"), one) for _ in range(min_calls - 1)], rest)

    def more_rules(self, one, max_calls):
        if max_calls is not None:
            return ()
        return (("hermes_more", ir.Seq(one, ir.Alt(ir.Seq(), ir.Seq(ir.Lit(b"\n"), ir.Ref("hermes_more"))))),)

    def sequence(self, ones):
        return ir.Seq(*[x for i, one in enumerate(ones) for x in ((ir.Lit(b"\n"),) if i else ()) + (one,)])

    def _one(self, name, args):
        return f'{self.open_tag}{{"name":{_json(name)},"arguments":{_json(args)}}}{self.close_tag}'

    def _many(self, written):
        return "\n".join(written)


class PythonicCall(CallFormat):
    """A Python list of calls, `[get_weather(city="Paris", days=3)]`: keyword arguments in
    declared order, optional ones skippable, values as Python literals that follow the JSON
    Schema (see railcall.grammar.pythonic for what is supported and what is refused). Parallel
    calls are further items of the list, separated by ", "; a single call is still a list."""

    name = "pythonic"

    def name_key(self, tool_name: str) -> bytes:
        # the opening parenthesis ends the name (as JSON's closing quote does): no name key is
        # a prefix of another, so a name is committed once it is written
        from railcall.grammar.pythonic import check_name

        check_name(tool_name)
        return tool_name.encode() + b"("

    def args(self, node, rules, tool):
        from railcall.grammar.pythonic import kwargs_node, rules_node

        if tool.custom:
            raise GrammarError(f"tool {tool.name!r} is a custom tool (one input text): the pythonic format has no "
                               "spelling for it; use the json, openai or hermes format")

        return ir.Seq(kwargs_node(node, rules, tool.name), ir.Lit(b")")), rules_node(rules)

    def call(self, choices):
        return ir.Select(tuple(choices))

    def single(self, one):
        return ir.Seq(ir.Lit(b"["), one, ir.Lit(b"]"))

    def many(self, one, max_calls, min_calls=1):
        if max_calls is None:
            rest: ir.Node = ir.Ref("pythonic_more")
        else:  # bounded: unrolled, no recursion (each Ref level is a frame in every thread)
            rest = ir.Seq()
            for _ in range(max_calls - min_calls):
                rest = ir.Alt(ir.Seq(), ir.Seq(ir.Lit(b", "), one, rest))
        required = [ir.Seq(ir.Lit(b", "), one) for _ in range(min_calls - 1)]
        return ir.Seq(ir.Lit(b"["), one, *required, rest, ir.Lit(b"]"))

    def sequence(self, ones):
        return ir.Seq(ir.Lit(b"["), *[x for i, one in enumerate(ones) for x in ((ir.Lit(b", "),) if i else ()) + (one,)],
                      ir.Lit(b"]"))

    def more_rules(self, one, max_calls):
        if max_calls is not None:
            return ()
        return (("pythonic_more", ir.Alt(ir.Seq(), ir.Seq(ir.Lit(b", "), one, ir.Ref("pythonic_more")))),)

    def write(self, calls):
        if not calls:
            raise GrammarError("write needs at least one call")
        return "[" + ", ".join(self._one(n, a) for n, a in calls) + "]"  # a single call is a list too

    def _one(self, name, args):
        from railcall.grammar.pythonic import py_spell

        if isinstance(args, str):
            raise GrammarError(f"{name!r} takes an input text (a custom tool): the pythonic format has no spelling for it")

        return f"{name}(" + ", ".join(f"{k}={py_spell(_json(v).encode()).decode()}" for k, v in args.items()) + ")"


def _json(value) -> str:
    return ir.json_literal(value).decode("utf-8")


FORMATS = {"json": JsonCall, "openai": OpenAICall, "hermes": HermesCall, "pythonic": PythonicCall}


def call_format(fmt: CallFormat | str) -> CallFormat:
    """A CallFormat from its name in FORMATS (a format object is returned as it is)."""
    if not isinstance(fmt, str):
        return fmt
    if fmt not in FORMATS:
        raise GrammarError(f"unknown call format {fmt!r}; known: {', '.join(FORMATS)}")
    return FORMATS[fmt]()


def write_calls(tools: Sequence[Tool], calls: Sequence[tuple[str, dict]], fmt: CallFormat | str = "json") -> str:
    """`calls` ((tool name, arguments) pairs) over `tools` as `fmt` writes them, each call's
    arguments in its tool's declared order (the order its grammar writes them in)."""
    by_name = {t.name: t for t in tools}
    ordered = []
    for name, args in calls:
        if name not in by_name:
            raise GrammarError(f"no tool {name!r} in the table; its tools: {', '.join(by_name)}")
        if isinstance(args, str):  # a custom tool's input text
            ordered.append((name, args))
            continue
        order = list(by_name[name].parameters.get("properties", {}))
        ordered.append((name, {k: args[k] for k in sorted(args, key=lambda k: order.index(k) if k in order else len(order))}))
    return call_format(fmt).write(ordered)


class _SchemaCache:
    """Values by schema key, the least recently used dropped first once the keys' text passes
    `budget` bytes (each counted SCHEMA_CACHE_FACTOR times its length: its JSON text and the
    IR built from it, ~3x the text, measured on enum-heavy schemas). A server's builder sees
    every client's schemas: unbounded, it kept them all."""

    def __init__(self, budget: int):
        self.budget = budget
        self.used = 0
        self._d: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _size(key) -> int:
        return SCHEMA_CACHE_FACTOR * len(key if isinstance(key, str) else key[-1])

    def get(self, key):
        with self._lock:
            hit = self._d.get(key)
            if hit is not None:
                self._d.move_to_end(key)
            return hit

    def put(self, key, value) -> None:
        with self._lock:
            if key in self._d:
                return
            self._d[key] = value
            self.used += self._size(key)
            while self.used > self.budget and len(self._d) > 1:
                old, _ = self._d.popitem(last=False)
                self.used -= self._size(old)

    def __len__(self) -> int:
        return len(self._d)


SCHEMA_CACHE_FACTOR = 4
SCHEMA_CACHE_BYTES = 32 << 20  # per builder and cache: the schemas of many large tables


class ToolGrammarBuilder:
    """Builds call grammars from tool tables, caching each tool's argument IR by its schema, so a
    live table change only compiles the tools that changed. Built once per server or process;
    its caches are bounded in bytes (SCHEMA_CACHE_BYTES, least recently used dropped first)."""

    def __init__(self, options: SchemaOptions | None = None, cache_bytes: int = SCHEMA_CACHE_BYTES):
        self.options = options or SchemaOptions()
        self._args = _SchemaCache(cache_bytes)  # schema key -> (node, rules)
        self._fmt_args = _SchemaCache(cache_bytes)  # (format name, schema key) -> the format's spelling

    def args_ir(self, tool: Tool) -> tuple:
        key = tool.schema_key()
        hit = self._args.get(key)
        if hit is None and tool.custom:
            # one JSON string whose decoded value is a text of the input grammar
            from railcall.grammar.cfg import inside_json_string

            g = inside_json_string(tool.input_grammar(), f"tool {tool.name!r}'s input grammar")
            hit = prefix_rules(ir.Seq(ir.Lit(b'"'), g.start, ir.Lit(b'"')), g.rules, tool.name)
            self._args.put(key, hit)
        if hit is None:
            params = tool.parameters
            if params.get("type", "object") != "object":
                raise SchemaError(f"parameters must describe an object, not {params.get('type')!r}",
                                  pointer="/type", keyword="type", context=f"tool {tool.name!r}")
            # Arguments are an object whatever else the schema says: without a type, a schema
            # of keywords alone (`{"minimum": 5}`, an anyOf, a $ref) would allow other values.
            untyped = "type" not in params
            try:
                node, rules = schema_to_ir({**{k: v for k, v in params.items() if k != "nullable"}, "type": "object"},
                                           self.options)
            except SchemaError as e:
                if untyped and e.empty:
                    raise SchemaError(f"parameters must describe an object, and no object fits this schema ({e.detail})",
                                      pointer=e.pointer, keyword=e.keyword, context=f"tool {tool.name!r}",
                                      empty=True) from None
                raise e.with_context(f"tool {tool.name!r}") from None
            # rule names are made unique per tool so tables can combine them
            hit = prefix_rules(node, rules, tool.name)
            self._args.put(key, hit)
        return hit

    def format_args(self, tool: Tool, fmt: CallFormat) -> tuple:
        """The tool's argument IR as `fmt` spells it (cached per format and schema)."""
        if type(fmt).args is CallFormat.args:
            return self.args_ir(tool)
        key = (fmt.name, tool.schema_key())
        hit = self._fmt_args.get(key)
        if hit is None:
            node, rules = self.args_ir(tool)
            hit = fmt.args(node, rules, tool)
            self._fmt_args.put(key, hit)
        return hit

    def grammar(self, tools: Sequence[Tool], fmt: CallFormat | str = "json", *, parallel: bool = False,
                max_calls: int | None = None, min_calls: int = 1) -> ir.Grammar:
        fmt = call_format(fmt)
        if min_calls < 1 or (max_calls is not None and max_calls < min_calls):
            raise GrammarError(f"min_calls={min_calls}, max_calls={max_calls}: a reply makes at least one call, "
                               "and max_calls (None: no bound) may not be below min_calls")
        if min_calls > 1 and not parallel:
            raise GrammarError(f"min_calls={min_calls} needs parallel=True: one call is all a non-parallel reply makes")
        if not tools:
            raise GrammarError("the tool table is empty (or the policy view removed every tool): "
                               "no call can be written")
        names = [t.name for t in tools]
        one, rules = self._one(tools, fmt)
        if parallel and max_calls != 1:
            rules.extend(fmt.more_rules(one, max_calls))
            start = fmt.many(one, max_calls, min_calls)
        else:
            start = fmt.single(one)
        # The content key from the tools' schema keys: hashing the IR's repr would cost
        # milliseconds for a large table on every request.
        key = hashlib.sha256(json.dumps([repr(self.options), fmt.name, getattr(fmt, "open_tag", ""), getattr(fmt, "close_tag", ""),
                                         parallel, max_calls, min_calls, [t.schema_key() for t in tools]]).encode()).hexdigest()[:24]
        # a custom tool's grammar continues into a rule at a rule's end without nesting (as a
        # general grammar does on its own: statement lists are right-recursive)
        return ir.Grammar(start, tuple(rules), name=f"{fmt.name}:{','.join(names)}", key=key,
                          tail_calls=any(t.custom for t in tools))

    def sequence(self, tables: Sequence[Sequence[Tool]], fmt: CallFormat | str = "json") -> ir.Grammar:
        """The grammar of exactly len(`tables`) calls in order, call i one `tables[i]` allows
        (a table per call: `railcall.heuristics.grounding` narrows each call's numbers to its own
        part of the request)."""
        fmt = call_format(fmt)
        if not tables:
            raise GrammarError("a call sequence needs at least one table")
        ones, rules, seen = [], [], set()
        for tools in tables:
            if not tools:
                raise GrammarError("a table of the call sequence is empty: that call could not be written")
            one, trules = self._one(tools, fmt)
            ones.append(one)
            for name, rule in trules:  # a tool's rules are named for it: the same name is the same rule
                if name not in seen:
                    seen.add(name)
                    rules.append((name, rule))
        key = hashlib.sha256(json.dumps([repr(self.options), fmt.name, getattr(fmt, "open_tag", ""), getattr(fmt, "close_tag", ""),
                                         "sequence", [[t.schema_key() for t in tools] for tools in tables]]).encode()).hexdigest()[:24]
        names = ",".join(dict.fromkeys(t.name for tools in tables for t in tools))
        return ir.Grammar(fmt.sequence(ones), tuple(rules), name=f"{fmt.name}:{len(tables)} calls:{names}", key=key,
                          tail_calls=any(t.custom for tools in tables for t in tools))

    def _one(self, tools: Sequence[Tool], fmt: CallFormat) -> tuple:
        """(one call over `tools` as `fmt` writes it, the rules it refers to)."""
        dup = [n for n, k in Counter(t.name for t in tools).items() if k > 1]
        if dup:
            raise GrammarError(f"duplicate tool names: {sorted(dup)}")
        choices, rules = [], []
        for t in tools:
            node, trules = self.format_args(t, fmt)
            choices.append((fmt.name_key(t.name), node))
            rules.extend(trules)
        return fmt.call(tuple(choices)), rules


def read_only_view(tools: Sequence[Tool]) -> list[Tool]:
    """The tools that do not mutate anything: a read-only grammar is built from these alone, so
    a mutating tool's name is unspellable rather than refused: no prompt can talk the model into
    a write it cannot spell."""
    return [t for t in tools if not t.mutates]


_DEFAULT_BUILDER = ToolGrammarBuilder()


def call_sequence_grammar(tables: Sequence[Sequence[Tool]], fmt: CallFormat | str = "json", *,
                          options: SchemaOptions | None = None) -> ir.Grammar:
    """Exactly len(`tables`) calls, call i over `tables[i]` (see ToolGrammarBuilder.sequence)."""
    builder = _DEFAULT_BUILDER if options is None else ToolGrammarBuilder(options)
    return builder.sequence(tables, fmt)


def tool_grammar(tools: Sequence[Tool], fmt: CallFormat | str = "json", *, parallel: bool = False,
                 max_calls: int | None = None, min_calls: int = 1, options: SchemaOptions | None = None) -> ir.Grammar:
    """The grammar of every call `tools` allows (see ToolGrammarBuilder); with `parallel`,
    `min_calls` to `max_calls` of them (None: no upper bound)."""
    builder = _DEFAULT_BUILDER if options is None else ToolGrammarBuilder(options)
    return builder.grammar(tools, fmt, parallel=parallel, max_calls=max_calls, min_calls=min_calls)
