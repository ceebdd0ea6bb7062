"""Policy as grammar: a view of the live table, compiled like the table itself.

A policy never refuses a call after the model wrote it; it decides what the model can write. The
view is built from the table as it is at this moment:

1. the tools the policy admits -- an allow-list (or all), minus a deny-list, minus every mutating
   tool in read-only mode (seed 003: "from inside the decode there is no such thing as a write");
2. each argument with a live domain provider becomes an enum of the values that exist now;
3. a policy may narrow any argument further: a list of values (intersected with the live
   domain), `{"glob": "docs/*"}` (filters it), or bounds (`minimum`, `maximum`, `maxLength`);
4. a tool whose required argument is left with no value at all (no files, no skills) is left out:
   a call to it could not be written validly, so its name is unspellable too.

The view's tools are ordinary `Tool`s, so `tool_grammar(view.tools)` compiles them; the
per-tool IR cache keys on each schema, so a new file recompiles `read_file` alone.

Approval is the second gate, for mutating calls the view allows: `ask` (on the terminal),
`auto` or `deny`, per policy and optionally per tool. A denial is an observation; nothing runs.

Lifecycle: a Policy is plain data, made once (or loaded from a JSON file of named policies); a
View is made per decoding step.
"""

from __future__ import annotations

import copy
import fnmatch
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from railcall.agent.table import ToolTable, ViewContext
from railcall.errors import GrammarError
from railcall.grammar.tools import Tool

APPROVALS = ("ask", "auto", "deny")
_BOUNDS = ("minimum", "maximum", "minLength", "maxLength", "maxItems", "minItems")


@dataclass(frozen=True)
class Policy:
    """What the model may call. `args` narrows domains: {tool: {argument: narrowing}}."""

    name: str = "default"
    read_only: bool = False
    allow: frozenset | None = None  # None: every tool of the table
    deny: frozenset = frozenset()
    args: dict = field(default_factory=dict, hash=False)
    approve: str = "ask"  # for mutating calls: ask | auto | deny
    approve_tools: dict = field(default_factory=dict, hash=False)  # tool -> ask | auto | deny

    def __post_init__(self):
        for mode in (self.approve, *self.approve_tools.values()):
            if mode not in APPROVALS:
                raise ValueError(f"policy {self.name!r}: approval {mode!r} is not one of {', '.join(APPROVALS)}")
        for key in ("allow", "deny"):
            v = getattr(self, key)
            if v is not None and not isinstance(v, frozenset):
                object.__setattr__(self, key, frozenset(v))

    @classmethod
    def from_dict(cls, name: str, d: dict) -> "Policy":
        known = {"read_only", "allow", "deny", "args", "approve", "approve_tools"}
        extra = set(d) - known
        if extra:
            raise ValueError(f"policy {name!r}: unknown keys {sorted(extra)}; known: {sorted(known)}")
        return cls(name=name, read_only=bool(d.get("read_only", False)),
                   allow=frozenset(d["allow"]) if d.get("allow") is not None else None,
                   deny=frozenset(d.get("deny", ())), args=dict(d.get("args", {})),
                   approve=d.get("approve", "ask"), approve_tools=dict(d.get("approve_tools", {})))

    def with_(self, **changes) -> "Policy":
        from dataclasses import replace

        return replace(self, **changes)

    def approval_for(self, tool: str) -> str:
        return self.approve_tools.get(tool, self.approve)


def load_policies(path: str | Path) -> dict[str, Policy]:
    """Named policies from a JSON file: {"reader": {"read_only": true, ...}, "ops": {...}}."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read policies from {path}: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected an object of named policies")
    return {name: Policy.from_dict(name, d) for name, d in data.items()}


@dataclass
class View:
    """The tools one decoding step may call, with their domains applied (per step)."""

    tools: list[Tool]
    policy: Policy
    table_version: int
    left_out: dict[str, str] = field(default_factory=dict)  # tool -> why it is not in the view

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.tools]

    def tool(self, name: str) -> Tool | None:
        return next((t for t in self.tools if t.name == name), None)

    def check(self, call) -> str:
        """"" when `call` ({"tool", "args"}) is one this view's grammar can spell, else why not.

        The check *is* the grammar: the call is written in the wire format (keys in declared
        order) and walked through the view's compiled grammar byte by byte, so there is no
        second validator to disagree with what the model could have written."""
        if not isinstance(call, dict) or not isinstance(call.get("tool"), str) or not isinstance(call.get("args"), dict):
            return 'not a call: expected {"tool": NAME, "args": {...}}'
        tool = self.tool(call["tool"])
        if tool is None:
            why = self.left_out.get(call["tool"], "not in the table")
            return f"tool {call['tool']!r} is not callable here ({why})"
        if not self.tools:
            return "no tool is callable"
        from railcall.matcher import Matcher, compiled_grammar

        m = Matcher(compiled_grammar(self.grammar(), _byte_vocab()))
        if m.consume_bytes(wire(tool, call["args"])) and m.is_accepting():
            return ""
        return f"arguments {json.dumps(call['args'], ensure_ascii=False)[:200]} do not fit {tool.name}'s schema in this view"

    def grammar(self):
        from railcall.grammar.tools import tool_grammar

        return tool_grammar(self.tools)


def wire(tool: Tool, args: dict) -> bytes:
    """A call in the grammar's wire format: compact JSON, arguments in the schema's order."""
    order = list(tool.parameters.get("properties", {}))
    ordered = {k: args[k] for k in sorted(args, key=lambda k: order.index(k) if k in order else len(order))}
    return json.dumps({"tool": tool.name, "args": ordered}, separators=(",", ":"), ensure_ascii=False).encode()


_BYTES = None


def _byte_vocab():
    """One token per byte: enough to walk a grammar over raw bytes (built once per process)."""
    global _BYTES
    if _BYTES is None:
        from railcall.vocab import Vocabulary

        _BYTES = Vocabulary.from_pieces([bytes([b]) for b in range(256)], name="bytes-256")
    return _BYTES


def view(table: ToolTable, policy: Policy | None = None) -> View:
    """The table as `policy` lets the model see it right now (see the module docstring)."""
    policy = policy or Policy()
    admitted, left_out = [], {}
    for name in table.names():
        entry = table.entry(name)
        if policy.allow is not None and name not in policy.allow:
            left_out[name] = "not on the policy's allow-list"
        elif name in policy.deny:
            left_out[name] = "denied by the policy"
        elif policy.read_only and entry.tool.mutates:
            left_out[name] = "mutates (read-only)"
        else:
            admitted.append(entry)
    ctx = ViewContext(table, policy, frozenset(e.tool.name for e in admitted))
    tools = []
    for entry in admitted:
        tool, why = _narrowed(entry, policy.args.get(entry.tool.name, {}), ctx)
        if tool is None:
            left_out[entry.tool.name] = why
        else:
            tools.append(tool)
    return View(tools, policy, table.version, left_out)


def _narrowed(entry, narrowing: dict, ctx: ViewContext) -> tuple[Tool | None, str]:
    tool = entry.tool
    props = tool.parameters.get("properties", {})
    unknown = set(narrowing) - set(props)
    if unknown:
        raise GrammarError(f"policy narrows arguments {sorted(unknown)} that tool {tool.name!r} does not have")
    touched = set(entry.domains) | set(narrowing)
    if not touched:
        return tool, ""
    params = copy.deepcopy(tool.parameters)
    required = set(params.get("required", []))
    for arg in [a for a in props if a in touched]:
        schema = params["properties"][arg]
        values = list(dict.fromkeys(entry.domains[arg](ctx))) if arg in entry.domains else schema.get("enum")
        rule = narrowing.get(arg)
        if isinstance(rule, list):
            values = [v for v in rule if values is None or v in values]
        elif isinstance(rule, dict):
            if "glob" in rule:
                if values is None:
                    raise GrammarError(f"policy: {tool.name}.{arg} has no enumerated domain for a glob to filter")
                values = [v for v in values if isinstance(v, str) and fnmatch.fnmatchcase(v, rule["glob"])]
            if "enum" in rule:
                values = [v for v in rule["enum"] if values is None or v in values]
            bad = set(rule) - {"glob", "enum", *_BOUNDS}
            if bad:
                raise GrammarError(f"policy: {tool.name}.{arg}: cannot narrow with {sorted(bad)}; "
                                   f"use a list, glob, enum or {', '.join(_BOUNDS)}")
            for k in _BOUNDS:
                if k in rule:
                    schema[k] = rule[k]
        elif rule is not None:
            raise GrammarError(f"policy: {tool.name}.{arg}: a narrowing is a list of values or an object")
        if values is None:
            continue
        if not values:
            if arg in required:
                return None, f"no value for its required argument {arg!r}"
            del params["properties"][arg]
            continue
        schema.pop("anyOf", None)
        schema["enum"] = values
    return Tool(tool.name, tool.description, params, mutates=tool.mutates), ""


@dataclass
class Decision:
    approved: bool
    mode: str  # ask | auto | deny | none (a call that mutates nothing needs no approval)
    reason: str = ""


class Approver:
    """The gate for mutating calls. `ask` is a function (prompt -> bool) used in `ask` mode; the
    default reads a y/N answer on the terminal."""

    def __init__(self, ask: Callable[[str], bool] | None = None):
        self.ask = ask or _terminal_ask

    def decide(self, policy: Policy, tool: Tool, args: dict) -> Decision:
        if not tool.mutates:
            return Decision(True, "none")
        mode = policy.approval_for(tool.name)
        if mode == "auto":
            return Decision(True, "auto", "auto-approved by the policy")
        if mode == "deny":
            return Decision(False, "deny", f"the policy denies mutating calls ({tool.name})")
        call = json.dumps({"tool": tool.name, "args": args}, ensure_ascii=False)
        try:
            ok = bool(self.ask(f"allow {call}?"))
        except (EOFError, KeyboardInterrupt):
            ok = False
        return Decision(ok, "ask", "approved on the terminal" if ok else "the user said no")


def _terminal_ask(prompt: str) -> bool:
    return input(f"{prompt} [y/N] ").strip().lower() in ("y", "yes")
