"""Policy as grammar: a view of the live table, compiled like the table itself.

A policy never refuses a call after the model wrote it; it decides what the model can write. The
view is built from the table as it is at this moment:

1. the tools the policy admits -- an allow-list (or all), minus a deny-list, minus every mutating
   tool in read-only mode (a write the model cannot spell cannot happen, whatever the prompt says);
2. each argument with a live domain provider becomes an enum of the values that exist now;
3. a policy may narrow any argument further: a list of values (intersected with the live
   domain), `{"glob": "docs/*"}` (filters it; `fnmatch`, so `*` matches `/` too: `docs/*`
   admits `docs/a/b.md`), or bounds (`minimum`, `maximum`, `maxLength`). Where the table gives
   an argument a canonical form (a path with its links resolved), the rule must admit both the
   value and that form;
4. a tool whose required argument is left with no value at all (no files, no skills) is left out:
   a call to it could not be written validly, so its name is unspellable too.

The view's tools are ordinary `Tool`s, so `tool_grammar(view.tools)` compiles them; the
per-tool IR cache keys on each schema, so a new file recompiles `read_file` alone.

Approval is the second gate, for mutating calls the view allows: `ask` (on the terminal,
`/dev/tty`, never stdin; no terminal is a denial), `auto` or `deny`, per policy and optionally
per tool. A denial is an observation with its reason; nothing runs.

Lifecycle: a Policy is plain data, made once (or loaded from a JSON file of named policies); a
View is made per decoding step.
"""

from __future__ import annotations

import copy
import fnmatch
import json
import os
import termios
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from railcall.agent.table import ToolTable, ViewContext
from railcall.errors import GrammarError, PolicyError
from railcall.grammar.tools import Tool

APPROVALS = ("ask", "auto", "deny")
_BOUNDS = ("minimum", "maximum", "minLength", "maxLength", "maxItems", "minItems")
_COUNTS = ("minLength", "maxLength", "maxItems", "minItems")  # bounds that count, so whole and >= 0
_KEYS = ("read_only", "allow", "deny", "args", "approve", "approve_tools", "hard_links")


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
    hard_links: bool = False  # read files with more than one name (files.Workspace.read)

    def __post_init__(self):
        # Every field is checked here, for a policies file and a library caller alike: Python
        # would read a wrong type silently ("deny": "write_file" as the set of its letters,
        # denying nothing; "read_only": "false" as True).
        for key in ("read_only", "hard_links"):
            if not isinstance(getattr(self, key), bool):
                raise self._error(key, getattr(self, key), "true or false")
        for key in ("allow", "deny"):
            v = getattr(self, key)
            if v is None and key == "allow":
                continue
            if isinstance(v, (str, bytes)) or not isinstance(v, (list, tuple, set, frozenset)) \
                    or not all(isinstance(t, str) for t in v):
                hint = f', e.g. [{json.dumps(v)}]' if isinstance(v, str) else ""
                raise self._error(key, v, "a list of tool names" + hint)
            object.__setattr__(self, key, frozenset(v))
        if not isinstance(self.approve, str) or self.approve not in APPROVALS:
            raise self._error("approve", self.approve, "one of " + ", ".join(APPROVALS))
        if not isinstance(self.approve_tools, dict):
            raise self._error("approve_tools", self.approve_tools, 'an object {tool: "ask" | "auto" | "deny"}')
        for tool, mode in self.approve_tools.items():
            if not isinstance(mode, str) or mode not in APPROVALS:
                raise self._error(f"approve_tools.{tool}", mode, "one of " + ", ".join(APPROVALS))
        if not isinstance(self.args, dict):
            raise self._error("args", self.args, "an object {tool: {argument: narrowing}}")
        for tool, narrowing in self.args.items():
            if not isinstance(narrowing, dict):
                raise self._error(f"args.{tool}", narrowing, "an object {argument: narrowing}")
            for arg, rule in narrowing.items():
                _check_narrowing(self, f"args.{tool}.{arg}", rule)

    def _error(self, field: str, value, expected: str) -> PolicyError:
        return PolicyError(f"policy {self.name!r}: {field!r} is {_shown(value)}; expected {expected}")

    @classmethod
    def from_dict(cls, name: str, d: dict) -> "Policy":
        """A policy from its JSON object (one entry of a policies file)."""
        if not isinstance(d, dict):
            raise PolicyError(f"policy {name!r} is {_shown(d)}; expected an object with any of the keys "
                              f"{', '.join(_KEYS)}")
        extra = set(d) - set(_KEYS)
        if extra:
            raise PolicyError(f"policy {name!r}: unknown keys {sorted(extra)}; known: {sorted(_KEYS)}")
        return cls(name=name, **d)

    def with_(self, **changes) -> "Policy":
        from dataclasses import replace

        return replace(self, **changes)

    def approval_for(self, tool: str) -> str:
        return self.approve_tools.get(tool, self.approve)

    def admits(self, tool: str, arg: str, value) -> bool:
        """Whether this policy's narrowing of `tool`'s `arg` (a list, an enum or a glob; bounds
        are the grammar's) lets `value` through. The view applies it when it is built; a tool
        applies it again when it runs, to the path it resolved (a file re-linked meanwhile)."""
        rule = self.args.get(tool, {}).get(arg)
        return rule is None or _rule_admits(rule, value)


def _check_narrowing(policy: Policy, field: str, rule) -> None:
    """A narrowing is a list of values, or an object of glob / enum / bounds (module docstring)."""
    if isinstance(rule, list):
        return
    if not isinstance(rule, dict):
        raise policy._error(field, rule, 'a list of values or an object such as {"glob": "docs/*"}')
    bad = set(rule) - {"glob", "enum", *_BOUNDS}
    if bad:
        raise PolicyError(f"policy {policy.name!r}: {field!r} cannot narrow with {sorted(bad)}; "
                          f"use a list, glob, enum or {', '.join(_BOUNDS)}")
    if "glob" in rule and not isinstance(rule["glob"], str):
        raise policy._error(f"{field}.glob", rule["glob"], 'a pattern string such as "docs/*"')
    if "enum" in rule and not isinstance(rule["enum"], list):
        raise policy._error(f"{field}.enum", rule["enum"], "a list of values")
    for k in _BOUNDS:
        v = rule.get(k)
        if k not in rule:
            continue
        if k in _COUNTS and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise policy._error(f"{field}.{k}", v, "a whole number >= 0")
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise policy._error(f"{field}.{k}", v, "a number")


def _rule_admits(rule, value) -> bool:
    """Whether one narrowing (`_check_narrowing`'s shapes) admits `value`."""
    if isinstance(rule, list):
        return value in rule
    if "glob" in rule and not (isinstance(value, str) and fnmatch.fnmatchcase(value, rule["glob"])):
        return False
    return "enum" not in rule or value in rule["enum"]


def _shown(value) -> str:
    """A wrong value as the user wrote it in JSON, with its type (a string and a list look alike
    in an error otherwise)."""
    kind = {str: "the string", bool: "the boolean", int: "the number", float: "the number", list: "the list",
            dict: "the object", type(None): ""}.get(type(value), f"a {type(value).__name__}")
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return f"{kind} {text[:80]}".strip()


# Named policies railcall itself defines, so that their names mean the same in every workspace
# (a planted workspace file cannot redefine one: `load_policies`).
BUILTIN = {"docs-reader": {"read_only": True, "args": {"read_file": {"path": {"glob": "docs/*"}}}}}
USER_POLICIES = "policies.json"  # the user's own named policies, in $RAILCALL_HOME (outside every workspace)
_APPROVAL_ORDER = {"deny": 0, "ask": 1, "auto": 2}  # narrow to wide


def builtin_policies() -> dict[str, Policy]:
    return {name: Policy.from_dict(name, d) for name, d in BUILTIN.items()}


def user_policies_path() -> Path:
    """`$RAILCALL_HOME/policies.json`: where the user's own named policies live."""
    from railcall.home import railcall_home

    return railcall_home() / USER_POLICIES


def load_policies(path: str | Path) -> dict[str, Policy]:
    """Named policies from a JSON file: {"reader": {"read_only": true, ...}, "ops": {...}}.

    Every field is checked (`Policy.__post_init__`); a wrong one is a PolicyError naming the
    file, the policy, the field, the value found and what is expected.

    A file in a workspace's state folder (`WORKSPACE/.railcall/policies.json`, the agent's
    default) is anyone's who can write to that workspace: a cloned repository or an unpacked
    archive brings its own. So it may only narrow: each of its policies is checked against the
    trusted one of the same name -- the user's own (`$RAILCALL_HOME/policies.json`), else the
    built-in one (`BUILTIN`), else the default (every tool, writes asked) -- and one that would
    widen it (a tool, a value, an approval, hard links or writes it does not allow) is a
    PolicyError naming the file, the policy and what it widens. The file is read without
    following a link (`files.StateFolder`). What is returned then is the built-in, the user's
    and the workspace's policies together; a missing workspace file is no policies of its own.
    Any other file (`--policies FILE`) is the user's choice and is taken as it is."""
    from railcall.agent.files import StateFolder

    state = StateFolder(Path(path).parent)
    if not state.parts:
        return _policies_from(path, _read_policies(path))
    trusted = builtin_policies()
    source = dict.fromkeys(trusted, "the built-in one")
    user = user_policies_path()
    if user.exists():
        mine = _policies_from(user, _read_policies(user))
        trusted.update(mine)
        source.update(dict.fromkeys(mine, f"the user's own in {user}"))
    try:
        data = state.read(Path(path).name)
    except (OSError, ValueError) as e:  # a StateRefused (a link there) among them
        raise PolicyError(f"cannot read policies from {path}: {e}") from None
    if data is None:
        return trusted
    own = _policies_from(path, _parse_policies(path, data))
    for name, policy in own.items():
        base = trusted.get(name, Policy(name=name))
        wider = widens(policy, base)
        if wider:
            raise PolicyError(f"{path}: policy {name!r} would widen {source.get(name, 'the default')}: "
                              f"{'; '.join(wider)}. A workspace's own "
                              f"policies file may only narrow; define a wider policy in {user}, or pass your own "
                              "file with --policies")
    return {**trusted, **own}


def _read_policies(path) -> object:
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise PolicyError(f"cannot read policies from {path}: {e}") from None
    return _parse_policies(path, data)


def _parse_policies(path, data: bytes) -> object:
    try:
        return json.loads(data)
    except ValueError as e:
        raise PolicyError(f"cannot read policies from {path}: {e}") from None


def _policies_from(path, data) -> dict[str, Policy]:
    if not isinstance(data, dict):
        raise PolicyError(f"{path}: expected an object of named policies, "
                          f'such as {{"reader": {{"read_only": true}}}}; found {_shown(data)}')
    try:
        return {name: Policy.from_dict(name, d) for name, d in data.items()}
    except PolicyError as e:
        raise PolicyError(f"{path}: {e}") from None


def widens(policy: Policy, base: Policy) -> list[str]:
    """What `policy` allows that `base` does not, one phrase each ([] when it only narrows):
    a tool it admits that base leaves out, an approval more permissive, hard links, writes
    under a read-only base, or an argument base narrows that it leaves wider."""
    out = []
    if base.read_only and not policy.read_only:
        out.append("read_only is false where it is true")
    if policy.hard_links and not base.hard_links:
        out.append("hard_links is true where it is false")
    if policy.allow is None and base.allow is not None:
        out.append(f"allow admits every tool where it admits {', '.join(sorted(base.allow))}")
    else:
        admitted = (policy.allow - policy.deny) if policy.allow is not None else None
        if admitted is not None:
            extra = {t for t in admitted if (base.allow is not None and t not in base.allow) or t in base.deny}
        else:  # both admit every tool but what they deny
            extra = base.deny - policy.deny
        if extra:
            out.append(f"it admits {', '.join(sorted(extra))}, which is left out")
    for tool in sorted({*base.approve_tools, *policy.approve_tools, ""}):
        mine, theirs = (policy.approval_for(tool), base.approval_for(tool)) if tool else (policy.approve, base.approve)
        if _APPROVAL_ORDER[mine] > _APPROVAL_ORDER[theirs]:
            out.append(f"approve{'_tools.' + tool if tool else ''} is {mine!r} where it is {theirs!r}")
    for tool, narrowing in base.args.items():
        for arg, rule in narrowing.items():
            new = policy.args.get(tool, {}).get(arg)
            if new is None or not _narrows(new, rule):
                out.append(f"args.{tool}.{arg} is {_shown(new) if new is not None else 'not narrowed'} where it "
                           f"is {_shown(rule)}")
    return out


def _narrows(new, old) -> bool:
    """Whether the narrowing `new` admits nothing `old` does not (conservatively: a rule it
    cannot compare is taken as wider)."""
    if new == old:
        return True
    values = new if isinstance(new, list) else new.get("enum")
    if values is not None:  # a closed set: each value must pass the old rule, bounds and all
        return all(_rule_admits(old, v) and _within(old, v) for v in values)
    if isinstance(old, list) or "enum" in old:
        return False  # a glob or bounds alone cannot be inside a closed set
    if "glob" in old and new.get("glob") != old["glob"]:
        return False
    for k in _BOUNDS:
        if k in old:
            if k not in new:
                return False
            if (new[k] < old[k]) if k.startswith("min") else (new[k] > old[k]):
                return False
    return True


def _within(rule, value) -> bool:
    """Whether `value` is inside the bounds of `rule` (a list has none)."""
    if isinstance(rule, list):
        return True
    size = len(value) if isinstance(value, (str, list)) else None
    number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    checks = {"minimum": (number, lambda v, b: v >= b), "maximum": (number, lambda v, b: v <= b),
              "minLength": (size, lambda v, b: v >= b), "maxLength": (size, lambda v, b: v <= b),
              "minItems": (size, lambda v, b: v >= b), "maxItems": (size, lambda v, b: v <= b)}
    return all(measured is not None and ok(measured, rule[k])
               for k, (measured, ok) in checks.items() if k in rule)


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

    def grammar(self, fmt: str = "json"):
        from railcall.grammar.tools import tool_grammar

        return tool_grammar(self.tools, fmt)


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
        raise GrammarError(f"policy {ctx.policy.name!r}: 'args.{tool.name}' narrows arguments {sorted(unknown)} "
                           f"that tool {tool.name!r} does not have; its arguments: {', '.join(props) or 'none'}")
    touched = set(entry.domains) | set(narrowing)
    if not touched:
        return tool, ""
    params = copy.deepcopy(tool.parameters)
    required = set(params.get("required", []))
    for arg in [a for a in props if a in touched]:
        schema = params["properties"][arg]
        values = list(dict.fromkeys(entry.domains[arg](ctx))) if arg in entry.domains else schema.get("enum")
        rule = narrowing.get(arg)
        # A value passes a rule when what it names passes too: with "docs/*" allowed, the link
        # docs/readme.md -> ../private/secret.txt is a name inside the rule for a file outside it.
        canon = entry.canonical.get(arg)

        def admitted(v, ok):
            if not ok(v):
                return False
            if canon is None:
                return True
            real = canon(v)
            return real is not None and ok(real)

        if isinstance(rule, list):
            values = [v for v in rule if (values is None or v in values) and admitted(v, lambda x: x in rule)]
        elif isinstance(rule, dict):
            if "glob" in rule:
                if values is None:
                    raise GrammarError(f"policy {ctx.policy.name!r}: 'args.{tool.name}.{arg}': {tool.name}.{arg} "
                                       "has no enumerated domain for a glob to filter; narrow it with a list instead")
                values = [v for v in values if isinstance(v, str)
                          and admitted(v, lambda x: fnmatch.fnmatchcase(x, rule["glob"]))]
            if "enum" in rule:
                values = [v for v in rule["enum"] if (values is None or v in values)
                          and admitted(v, lambda x: x in rule["enum"])]
            for k in _BOUNDS:  # each rule's keys and types were checked when the Policy was made
                if k in rule:
                    schema[k] = rule[k]
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
    default asks on the terminal (`ask_terminal`) and denies wherever there is none."""

    def __init__(self, ask: Callable[[str], bool] | None = None):
        self.ask = ask

    def decide(self, policy: Policy, tool: Tool, args: dict) -> Decision:
        if not tool.mutates:
            return Decision(True, "none")
        mode = policy.approval_for(tool.name)
        if mode == "auto":
            return Decision(True, "auto", "auto-approved by the policy")
        if mode == "deny":
            return Decision(False, "deny", f"the policy denies mutating calls ({tool.name})")
        call = visible(json.dumps({"tool": tool.name, "args": args}, ensure_ascii=False))
        if self.ask is None:
            ok, reason = ask_terminal(f"allow {call}?")
            return Decision(ok, "ask", reason)
        try:
            ok = bool(self.ask(f"allow {call}?"))
        except (EOFError, KeyboardInterrupt):
            ok = False
        return Decision(ok, "ask", "approved by the ask function" if ok else "the ask function said no")


TTY = "/dev/tty"  # the controlling terminal, whatever stdin is


def ask_terminal(prompt: str) -> tuple[bool, str]:
    """Ask on the controlling terminal; (approved, reason). Only a person at a terminal approves:
    stdin is never read (a file or pipe holding "y", or `railcall chat`'s next task line, would
    approve a call nobody saw), input typed before the question is discarded, and no terminal,
    end of input or Ctrl-C is a denial."""
    hint = "; run on a terminal to be asked, or choose --approve auto or --approve deny"
    try:
        fd = os.open(TTY, os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:
        return False, f"no terminal to ask on ({TTY}: {e.strerror}){hint}"
    try:
        if not os.isatty(fd):
            return False, f"no terminal to ask on ({TTY} is not a terminal){hint}"
        termios.tcflush(fd, termios.TCIFLUSH)  # a "y" typed ahead answers no question
        os.write(fd, f"{prompt} [y/N] ".encode())
        answer = b""
        while not answer.endswith(b"\n") and len(answer) < 64:
            chunk = os.read(fd, 64)
            if not chunk:
                break
            answer += chunk
    except KeyboardInterrupt:
        return False, "interrupted at the question on the terminal"
    except OSError as e:
        return False, f"the terminal could not be read ({e.strerror}){hint}"
    finally:
        os.close(fd)
    if answer.strip().lower() in (b"y", b"yes"):
        return True, "approved on the terminal"
    return False, "the user said no on the terminal" if answer.endswith(b"\n") else "end of input on the terminal"


def visible(text: str, keep: str = "") -> str:
    """`text` with every control and format character written as its escape (ESC as `\\x1b`,
    U+202E as `\\u202e`), except those in `keep`: a file name or a tool's output shown on a
    terminal can then neither drive it (clear the screen, set the title) nor reorder what is
    shown (a right-to-left override makes `evil\u202etxt.sh` read as `evilhs.txt`)."""
    return "".join(c if c in keep or unicodedata.category(c) not in _HIDDEN else c.encode("unicode_escape").decode()
                   for c in text)


_HIDDEN = ("Cc", "Cf", "Zl", "Zp", "Cs")  # controls, formats (bidi, zero-width), line/para separators
