"""The live tool table: the one list of valid tools, read fresh at every step.

An entry is a `Tool` (name, description, argument schema, `mutates`), the handler that runs it,
and, per argument, an optional *domain provider*: a function that returns the values that
argument may take right now (the files in the workspace for `read_file`'s path, the stored
skills for `run`'s name). Nothing else keeps a list of tools: the policy view, the grammar, the
prompt, the validator and the dispatcher all read this table at the moment they need it, so a
tool added is callable on the next step and a tool removed is unspellable at once.

    table = ToolTable()

    @table.tool(mutates=True)
    def write_file(path: str, text: str) -> str:
        '''Write text to a file of the workspace.'''

    table.add_openai({"type": "function", "function": {...}}, handler)
    table.remove("write_file")

Lifecycle: once per agent session; it changes live. `version` counts changes.
"""

from __future__ import annotations

import inspect
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from railcall.agent.signature import function_schema, to_python
from railcall.errors import GrammarError
from railcall.grammar.tools import Tool

# A domain provider gets the view being built (`ViewContext`: the table, the policy, the names
# the policy admits -- so `run` can offer only the skills that view could run) and returns the
# values an argument may take right now.
Provider = Callable[["ViewContext"], Iterable]


@dataclass(frozen=True)
class ViewContext:
    table: "ToolTable"
    policy: Any  # railcall.agent.policy.Policy
    names: frozenset


@dataclass
class Entry:
    tool: Tool
    handler: Callable[..., Any]
    domains: dict[str, Provider] = field(default_factory=dict)
    hints: dict[str, Any] = field(default_factory=dict)  # argument -> annotation, for to_python
    # argument -> value -> what it really names (a path with its links resolved; None: nothing);
    # a policy's narrowing must admit both the value and this (policy._narrowed)
    canonical: dict[str, Callable[[Any], Any]] = field(default_factory=dict)

    def call(self, args: dict) -> Any:
        return self.handler(**{k: to_python(self.hints[k], v) if k in self.hints else v for k, v in args.items()})


class ToolTable:
    """Tools, their handlers and their live argument domains."""

    def __init__(self):
        self._entries: dict[str, Entry] = {}
        self.version = 0

    # -- registering ---------------------------------------------------------------------------

    def register(self, fn: Callable, *, name: str | None = None, mutates: bool = False,
                 description: str | None = None, domains: dict[str, Provider] | None = None,
                 canonical: dict[str, Callable[[Any], Any]] | None = None, replace: bool = False) -> Tool:
        """Add a Python function; its schema comes from its type hints and docstring."""
        summary, params = function_schema(fn)
        tool = Tool(name or fn.__name__, description if description is not None else summary, params, mutates=mutates)
        hints = {k: v for k, v in typing.get_type_hints(fn, include_extras=True).items() if k != "return"}
        return self._add(Entry(tool, fn, dict(domains or {}), hints, dict(canonical or {})), replace)

    def tool(self, **kw) -> Callable[[Callable], Callable]:
        """Decorator form of `register`: `@table.tool(mutates=True)`."""
        def deco(fn):
            self.register(fn, **kw)
            return fn
        return deco

    def add(self, tool: Tool, handler: Callable[..., Any], *, domains: dict[str, Provider] | None = None,
            replace: bool = False) -> Tool:
        """Add a ready-made Tool with its handler (called with the arguments as keywords)."""
        return self._add(Entry(tool, handler, dict(domains or {})), replace)

    def add_openai(self, spec: dict, handler: Callable[..., Any], *, mutates: bool = False,
                   domains: dict[str, Provider] | None = None, replace: bool = False) -> Tool:
        """Add an OpenAI-style tool dict (`{"type": "function", "function": {...}}`)."""
        return self.add(Tool.from_openai(spec, mutates=mutates), handler, domains=domains, replace=replace)

    def _add(self, entry: Entry, replace: bool) -> Tool:
        name = entry.tool.name
        if name in self._entries and not replace:
            raise GrammarError(f"a tool named {name!r} is already in the table; remove it first or pass replace=True")
        props = entry.tool.parameters.get("properties", {})
        unknown = set(entry.domains) - set(props)
        if unknown:
            raise GrammarError(f"tool {name!r}: domains for arguments it does not have: {sorted(unknown)}")
        params = inspect.signature(entry.handler).parameters if callable(entry.handler) else {}
        takes_any = any(p.kind == p.VAR_KEYWORD for p in params.values())
        missing = [k for k in props if k not in params and not takes_any]
        if missing:
            raise GrammarError(f"tool {name!r}: the handler takes no argument(s) {missing} that the schema declares")
        self._entries[name] = entry
        self.version += 1
        return entry.tool

    def remove(self, name: str) -> None:
        if self._entries.pop(name, None) is None:
            raise KeyError(f"no tool {name!r} in the table")
        self.version += 1

    # -- reading -------------------------------------------------------------------------------

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> list[str]:
        return list(self._entries)

    def tools(self) -> list[Tool]:
        """The tools as declared (no domains applied): what a policy view starts from."""
        return [e.tool for e in self._entries.values()]

    def entry(self, name: str) -> Entry:
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(f"no tool {name!r} in the table") from None
