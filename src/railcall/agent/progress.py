"""What helps a small model make progress in an episode: three options of the loop, each
measured on the agent task suite (`railcall eval agent`; docs/agent.md, "Measured").

    no_repeats     a call already made in this episode is unspellable at the next step
                   (`without_repeats`: policy as grammar, applied to the episode's own history)
    short_results  each observation is written for a small model: what the call found, first,
                   in a sentence ("notes.txt says: ..."), cut to SHORT_LIMIT characters
    facts          the last turn restates the task, lists what the episode found so far and
                   offers `answer` ("If that is enough, call answer ...")
    examples       the system prompt shows one request and its call for each tool of the view
                   but `answer`, built from the tool table (`tool_examples`; off by default:
                   see docs/agent.md for what it measured)

On SmolLM2-135M without them, an episode calls `list_dir "."` six times, or `calc "buy milk"`
six times: every call well-formed, none new. Lifecycle: `Helps` is plain data, made once per
agent; the functions are pure, called once per step.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass, fields
from typing import Sequence

from railcall.grammar.tools import Tool

SHORT_LIMIT = 500  # characters of an observation with short_results: SmolLM2 loses the task past ~1k
FACT_LIMIT = 200  # characters of each fact in the facts turn
FACTS_SHOWN = 4  # the latest facts; older ones are still in the history above
OFFER_LIMIT = 300  # characters of the answer offered (up to FACTS_SHOWN facts): ~75 tokens to copy
# A free-text value longer than this is not excluded: its complement pattern has ~n^2/2
# characters and the regex compiler's NFA grows with it (48: 1.2k alternatives' worth, <30 ms).
COMPLEMENT_LIMIT = 48


@dataclass(frozen=True)
class Helps:
    """The progress options of an Agent (each one measured on the suite, on by default only where
    it helped there)."""

    no_repeats: bool = True
    short_results: bool = True
    facts: bool = True
    examples: bool = False

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def off(cls, *names: str) -> "Helps":
        """The defaults with `names` turned off (a ValueError names an unknown option)."""
        return cls.chosen(off=names)

    @classmethod
    def chosen(cls, on: Sequence[str] = (), off: Sequence[str] = ()) -> "Helps":
        """The defaults with `on` turned on and `off` turned off (a ValueError names an unknown
        option, or one given both ways)."""
        bad = [n for n in (*on, *off) if n not in cls.names()]
        if bad:
            raise ValueError(f"unknown option(s) {', '.join(bad)}; known: {', '.join(cls.names())}")
        both = sorted(set(on) & set(off))
        if both:
            raise ValueError(f"option(s) {', '.join(both)} both on and off; give each once")
        return cls(**{**{n: True for n in on}, **{n: False for n in off}})

    def toggled(self, name: str) -> "Helps":
        """These options with `name` the other way round (the ablation's configurations)."""
        return dataclasses.replace(self, **{name: not getattr(self, name)})

    @classmethod
    def none(cls) -> "Helps":
        return cls(**{n: False for n in cls.names()})

    def label(self) -> str:
        default = Helps()
        off = [n for n in self.names() if not getattr(self, n) and getattr(default, n)]
        on = [n for n in self.names() if getattr(self, n) and not getattr(default, n)]
        parts = (["without " + ", ".join(off)] if off else []) + (["with " + ", ".join(on)] if on else [])
        return "; ".join(parts) or "defaults"


# -- no_repeats: the episode's calls taken out of the grammar ---------------------------------

def without_repeats(tools: Sequence[Tool], made: Sequence[dict]) -> tuple[list[Tool], dict[str, str]]:
    """`tools` (a view's, domains applied) with each call in `made` made unspellable, and the
    tools that have no call left, with why.

    Exact, and only where the grammar can say it: the grammar has no `not`, so a value is taken
    out of an argument's schema in one of two ways, and only for a tool whose one required
    argument decides the call (a call of such a tool is that value):
      - an enumerated argument (read_file's path, list_dir's path, run's name) loses the value
        from its enum; a tool left with no value is left out, as the policy view does;
      - a free string (calc's expr, remember's text, answer's text) gets a `pattern` matching
        every string except the ones used (`complement`), when it has no pattern of its own
        and each value is at most COMPLEMENT_LIMIT characters.
    A tool of two or more arguments (write_file's path and text) keeps its schema: excluding a
    pair would need `anyOf` over which argument differs, a grammar per pair; such a repeat is
    left to the facts turn. The caller forgets the calls made before a successful mutating
    call, since after it the same read may show something new (same call, same observation
    expected: only then is a repeat useless)."""
    used: dict[str, list] = {}
    for c in made:
        if isinstance(c, dict) and isinstance(c.get("args"), dict):
            used.setdefault(c.get("tool"), []).append(c["args"])
    out, left_out = [], {}
    for tool in tools:
        calls = used.get(tool.name)
        props = tool.parameters.get("properties", {})
        required = tool.parameters.get("required", [])
        if not calls or len(props) != 1 or list(props) != list(required):
            out.append(tool)
            continue
        (arg,) = props
        values = [a[arg] for a in calls if arg in a]
        schema = props[arg]
        params = copy.deepcopy(tool.parameters)
        if "enum" in schema:
            left = [v for v in schema["enum"] if v not in values]
            if not left:
                left_out[tool.name] = "every value was called already in this episode"
                continue
            params["properties"][arg]["enum"] = left
        elif schema.get("type") == "string" and "pattern" not in schema and "format" not in schema \
                and all(isinstance(v, str) and len(v) <= COMPLEMENT_LIMIT for v in values):
            params["properties"][arg]["pattern"] = complement(values)
        else:
            out.append(tool)
            continue
        out.append(Tool(tool.name, tool.description, params, mutates=tool.mutates))
    return out, left_out


def complement(values: Sequence[str]) -> str:
    """A pattern (anchored, ECMA-262 subset of grammar.regex) matching every string except the
    `values`: a string differs from v when it is a proper prefix of v, leaves v at some
    character, or goes on past its end. Over several values: the strings no value equals is
    the intersection, which a regex without lookahead cannot write directly, so the pattern
    enumerates, per value, the ways to differ, and a string must differ from all values -- done
    here by building the complement of a trie of the values (the same three ways, per node)."""
    trie: dict = {}
    for v in values:
        node = trie
        for ch in v:
            node = node.setdefault(ch, {})
        node[""] = {}  # the end of a value

    def differ(node) -> str:
        # the strings s such that prefix+s is no value, for the prefix that reached `node`
        alts = []
        if "" not in node:
            alts.append("")  # stopping here is no value
        chars = [c for c in node if c]
        if chars:
            alts.append("[^" + "".join(_lit(c) for c in sorted(chars)) + r"][\s\S]*")
            alts += [_lit(c) + "(?:" + differ(node[c]) + ")" for c in sorted(chars)]
        else:
            alts.append(r"[\s\S]+")  # past every value's end
        return "|".join(alts)

    return "^(?:" + differ(trie) + ")$"


def _lit(ch: str) -> str:
    """One character as a pattern literal: ASCII letters and digits as they are, the rest of the
    BMP as \\uHHHH, so no character is read as syntax; a character beyond the BMP as itself (the
    regex runs on code points: a surrogate pair \\ud83c\\udf89 would be two of them, matching no
    character, and no such character is syntax)."""
    if ch.isascii() and ch.isalnum():
        return ch
    cp = ord(ch)
    return f"\\u{cp:04x}" if cp <= 0xFFFF else ch


# -- short_results and facts: observations a small model can use -------------------------------

# How each built-in tool's result reads as a sentence, from the call's arguments and the result's
# first part (cut to SHORT_LIMIT); any other tool: "<tool> gave: ...".
_SENTENCES = {
    "read_file": lambda args, body: f"{args.get('path')} says: {body}",
    "list_dir": lambda args, body: f"The folder {args.get('path')} holds: {body}",
    "write_file": lambda args, body: (f"Saved {args.get('path')}: it now holds "
                                      f"{_cut(json.dumps(args.get('text', ''), ensure_ascii=False))}."),
    "append_file": lambda args, body: (f"Added {_cut(json.dumps(args.get('text', ''), ensure_ascii=False))} "
                                       f"at the end of {args.get('path')}."),
    "calc": lambda args, body: f"{args.get('expr')} = {body}",
    "run": lambda args, body: f"The skill gave: {body}",
    "remember": lambda args, body: f"Remembered: {_cut(str(args.get('text', '')))}.",
}


def observation(call: dict, result: str, short: bool) -> str:
    """The user turn after `call`: `Result: <result>` as it was, or (`short`) what it found
    first, in a sentence (`_SENTENCES`), cut to SHORT_LIMIT characters."""
    if not short:
        return f"Result: {result}"
    tool, args = call.get("tool"), call.get("args") or {}
    if result.startswith(("error:", "denied:")):
        return f"{_cut(result)} (that call did not work: do something else)"
    body = _cut(result.strip())
    sentence = _SENTENCES.get(tool)
    return sentence(args, body) if sentence else f"{tool} gave: {body}"


def facts_turn(task: str, found: Sequence[str], offer: str | None = None, fmt: str = "json") -> str:
    """The last turn with `facts`: the task again, what the episode found, and `answer` offered
    as a ready call whose text is `offer` (the facts gathered): a 135M model copies a call from
    its context far more readily than it composes one. (A line of the tools here as well, next
    to where the model writes, made SmolLM2 call the first tool listed in 11 tasks of 11.)"""
    lines = [f"The task: {task}"]
    if found:
        lines.append("Found so far:")
        lines += [f"- {_cut(f, FACT_LIMIT)}" for f in found[-FACTS_SHOWN:]]
    if offer:
        from railcall.runtime.prompt import call_text

        ready = call_text("answer", {"text": _cut(" ".join(offer.split()), OFFER_LIMIT)}, fmt)  # in the call format
        lines.append(f"If that answers the task, reply with: {ready}")
        lines.append("Otherwise call another tool.")
    else:
        lines.append("If that is enough for the task, call answer with the reply; otherwise call another tool.")
    return "\n".join(lines)


# -- examples: a request and its call per tool --------------------------------------------------

def tool_examples(tools: Sequence[Tool], fmt: str = "json") -> str:
    """Lines for the system prompt: for each tool but `answer` and `run`, a request and the
    call that does it, in the call format: a built-in's own (`builtins.EXAMPLES`: "Save the text
    'see you at 5' to memo.txt." -> write_file), any other tool's built from its schema alone
    (`railcall.runtime.shots`: its name in words, a placeholder of each argument's type)."""
    from railcall.agent.builtins import ANSWER, EXAMPLES
    from railcall.agent.skills import RUN
    from railcall.runtime.prompt import call_text
    from railcall.runtime.shots import shots

    lines, others = [], []
    for t in tools:
        if t.name in (ANSWER, RUN):
            continue
        if t.name in EXAMPLES:
            request, args = EXAMPLES[t.name]
            lines.append(f"- {json.dumps(request)} -> {call_text(t.name, args, fmt)}")
        else:
            others.append(t)
    lines += [f"- {json.dumps(s.request)} -> {s.call}" for s in shots(others, len(others), fmt)]
    return ("Examples of requests and the call for each:\n" + "\n".join(lines)) if lines else ""


def _cut(text: str, limit: int = SHORT_LIMIT) -> str:
    return text if len(text) <= limit else text[:limit] + " [...]"
