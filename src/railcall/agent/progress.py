"""What helps a small model make progress in an episode: the options of the loop, each
measured on the agent task suite (`railcall eval agent`; docs/agent.md, "Measured").

    no_repeats     a call already made in this episode is unspellable at the next step
                   (`without_repeats`: policy as grammar, applied to the episode's own history)
    short_results  each observation is written for a small model: what the call found, first,
                   in a sentence ("notes.txt says: ..."), cut to SHORT_LIMIT characters
    facts          the last turn restates the task, lists what the episode found so far and
                   offers `answer` ("If that is enough, call answer ..."); under a read-only
                   policy, for a request that asks for a change (`asks_for_change`), the
                   answer offered first says that nothing was changed (`REFUSAL`)
    examples       the system prompt shows one request and its call for each tool of the view
                   but `answer`, built from the tool table (`tool_examples`; on since it won
                   three computations on the suite, 31 of 39 against 28)
    task_files     a request that names files ("Save 'buy milk' to shopping.txt") scopes the
                   episode's writes to them: every mutating tool's path argument is narrowed to
                   the names the request spells out (`task_files`, `episode_scoped`: least
                   privilege, and the grammar cannot write notes.txt over for a small model);
                   while a named file is unused, the facts turn says so instead of offering
                   `answer`
    copied_text    what a mutating tool writes is copied: a run of the request's words or a
                   result calc computed in the episode (`episode_scoped`); a file's content or a
                   model's own composition cannot be written, so a planted line in a file read
                   cannot become a write either. Turn it off for a model that composes (a
                   read-modify-write, a summary written to a file)
    copied_numbers calc computes with the numbers the request or a result (not a listing) has
                   shown: its argument is one of them joined by one operator
                   (`expressions_over`, `with_seen_numbers`); before two are seen, calc is left
                   out; until calc has run, the facts turn lists them and says calc computes
    read_named     while files the request names exist and no call has used them, the next call
                   reads one: the view is the tools that read a named file (not mutating, the
                   file among their path's choices), narrowed to those files (`reading_named`);
                   a named file that does not exist is left to task_files' wait
    scored_values  with scored routing, an argument that is an enum of strings (a path that
                   exists, a skill's name, copied_text's runs, copied_numbers' expressions) is
                   chosen as the tool name is, by the likelihood of each whole value
                   (`NameRouter.for_tools(values=True)`), not token by token
    quoted_text    a request that quotes text ("Save 'buy milk' to shopping.txt") has that text
                   written: with copied_text, a mutating tool's free string is one of the quoted
                   spans (`quoted_spans`), not any run of the request's words; and while a
                   quoted span is one no successful mutating call has written (and some
                   mutating tool is in view), the facts turn says so instead of offering `answer`

On SmolLM2-135M without them, an episode calls `list_dir "."` six times, or `calc "buy milk"`
six times: every call well-formed, none new. Lifecycle: `Helps` is plain data, made once per
agent; the functions are pure, called once per step.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import re
from dataclasses import dataclass, fields
from typing import Sequence

from railcall.grammar.tools import Tool

# What the ready answer says first where a read-only episode was asked for a change: the answer
# is the outcome, and an answer that only restates what was read ("todo.md says: ...", every
# refusal of the suite's dev set before this) left the user to guess whether the change was made.
REFUSAL = "Nothing was changed: this workspace is read-only, so I cannot make that change."
SHORT_LIMIT = 500  # characters of an observation with short_results: SmolLM2 loses the task past ~1k
FACT_LIMIT = 200  # characters of each fact in the facts turn
FACTS_SHOWN = 4  # the latest facts; older ones are still in the history above
OFFER_LIMIT = 300  # characters of the answer offered (up to FACTS_SHOWN facts): ~75 tokens to copy
SPAN_WORDS = 12  # the longest run of a request's words copied_text offers (a 30-word request: ~300 runs)
SPAN_CHARS = 200  # ... and its most characters; only the request's first SPAN_SOURCE characters are read
SPAN_SOURCE = 2000  # (a 3 MB request would otherwise be a 3 MB value in the grammar)
NUMBERS_JOINED = 8  # the most numbers one of calc's expressions joins (copied_numbers)
_QUOTES = "'\"`\u2018\u2019\u201c\u201d"


@dataclass(frozen=True)
class Helps:
    """The progress options of an Agent (each one measured on the suite, on by default only where
    it helped there)."""

    no_repeats: bool = True
    short_results: bool = True
    facts: bool = True
    examples: bool = True
    task_files: bool = True
    copied_text: bool = True
    copied_numbers: bool = True
    quoted_text: bool = True
    read_named: bool = True
    scored_values: bool = True

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

    Exact, and only where the grammar can say it: a value is taken out of an argument's schema
    in one of two ways, and only for a tool whose one required argument decides the call (a call
    of such a tool is that value):
      - an enumerated argument (read_file's path, list_dir's path, run's name) loses the value
        from its enum; a tool left with no value is left out, as the policy view does;
      - a string (calc's expr, remember's text, answer's text) gets `not: {"enum": used}` beside
        its own schema: the grammar takes its automaton (calc's arithmetic pattern included) in
        product with "none of these".
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
        elif schema.get("type") == "string" and all(isinstance(v, str) for v in values):
            # `not` of the used strings: the grammar's automaton for the argument (its own pattern
            # too, calc's arithmetic) is taken in product with "none of these"
            params["properties"][arg] = {"allOf": [schema, {"not": {"enum": list(dict.fromkeys(values))}}]}
        else:
            out.append(tool)
            continue
        out.append(Tool(tool.name, tool.description, params, mutates=tool.mutates))
    return out, left_out


# -- short_results and facts: observations a small model can use -------------------------------

# How each built-in tool's result reads as a sentence, from the call's arguments and the result's
# first part (cut to SHORT_LIMIT); any other tool: "<tool> gave: ...".
_SENTENCES = {
    "read_file": lambda args, body: f"{args.get('path')} says: {body}",
    "list_dir": lambda args, body: f"The folder {args.get('path')} holds: {body}",
    # the text written in single quotes, not as a JSON string: offered back inside `answer`'s
    # JSON, an escaped \" made SmolLM2 lose the string's end and write "}} } } ..." to the ceiling
    "write_file": lambda args, body: f"Saved {args.get('path')}: it now holds {_quoted(args.get('text', ''))}.",
    "append_file": lambda args, body: f"Added {_quoted(args.get('text', ''))} at the end of {args.get('path')}.",
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


def facts_turn(task: str, found: Sequence[str], offer: str | None = None, fmt: str = "json",
               pending: Sequence[str] = (), fits=None, numbers: Sequence[str] = ()) -> str:
    """The last turn with `facts`: the task again, what the episode found, and `answer` offered
    as a ready call whose text is `offer` (the facts gathered): a 135M model copies a call from
    its context far more readily than it composes one. (A line of the tools here as well, next
    to where the model writes, made SmolLM2 call the first tool listed in 11 tasks of 11.)
    `pending`: what the task names and no call has done yet (a file unused, a quoted text not
    written): then nothing is offered. `fits(call text)`: whether the model can write the offered
    call within its token budget; the offer is cut until it does (an offer of four facts ran
    past 64 tokens, and the cut call was never run). `numbers` (copied_numbers): the numbers calc
    may join, listed with a line that says so, and no ready answer beside them."""
    lines = [f"The task: {task}"]
    if found:
        lines.append("Found so far:")
        lines += [f"- {_cut(f, FACT_LIMIT)}" for f in found[-FACTS_SHOWN:]]
    if numbers:
        lines.append(f"Numbers found: {', '.join(numbers[:NUMBERS_JOINED])}. If the task needs arithmetic on them, call calc.")
    if pending:
        # the task is not done: nothing is offered
        lines.append(f"The task names {', '.join(pending)}, and no call has used "
                     f"{'it' if len(pending) == 1 else 'them'} yet: call the tool the task needs.")
    elif offer and not numbers:
        lines.append(f"If that answers the task, reply with: {ready_answer(offer, fmt, fits)}")
        lines.append("Otherwise call another tool.")
    elif offer:
        # no ready answer beside the numbers: offered one, SmolLM2 copied it (the file's lines)
        # in 4 of 5 computations; without it, it called calc in 5 of 5
        lines.append("If that answers the task, call answer with the reply.")
        lines.append("Otherwise call another tool.")
    else:
        lines.append("If that is enough for the task, call answer with the reply; otherwise call another tool.")
    return "\n".join(lines)


def ready_answer(offer: str, fmt: str = "json", fits=None) -> str:
    """`answer` holding `offer` (blanks collapsed, at most OFFER_LIMIT characters), as a call in
    `fmt`, cut at a word until `fits` accepts the call's text."""
    from railcall.prompts.chat import call_text

    text = " ".join(offer.split())
    limit = OFFER_LIMIT
    while True:
        call = call_text("answer", {"text": _cut(text, limit)}, fmt)
        if fits is None or fits(call) or limit <= 16:
            return call
        limit = max(16, text.rfind(" ", 0, int(limit * 0.8)))


# -- task_files: writes go only where the request says ---------------------------------------

# A file name as a request spells it: a name with an extension of two or more characters that
# starts with a letter, optionally under folders ("hello.txt", "docs/car.md", "report.v2.csv");
# not a number ("3.5"), not "e.g.", and a sentence's full stop is not part of it.
_FILE_NAME = re.compile(r"(?<![\w./-])((?:\./)?(?:[\w-]+/)*[\w-]+(?:\.[\w-]+)*\.[A-Za-z][A-Za-z0-9]{1,9})(?![\w/-])")


def task_files(task: str) -> list[str]:
    """The file names `task` spells out, in order, each once ("./a.txt" as "a.txt")."""
    return list(_task_files(task))


@functools.lru_cache(maxsize=8)  # every step of an episode asks again for the same request
def _task_files(task: str) -> tuple:
    names = (m.group(1) for m in _FILE_NAME.finditer(task))
    return tuple(dict.fromkeys(n[2:] if n.startswith("./") else n for n in names))


# The verbs by which a request asks for a change to a file, in the forms a request asks in (the
# base form: "save", "please add", "can you update"; a past form mostly describes, as in "the
# saved skill"): a request with none ("What is in notes.txt?", "Which city does fact.txt name?")
# gets no write scope under task_files. A reading of the request's words, file names left out: a
# change asked in other words is not made (the agent answers instead), the safe side of the
# guess; a word not meant as a change ("add up the numbers") leaves the scope to the named files.
_CHANGE_WORDS = frozenset((
    "save", "write", "append", "add", "create", "make", "put", "replace", "update", "edit", "change", "set",
    "insert", "delete", "remove", "erase", "clear", "rename", "move", "copy", "store", "record", "log", "note",
    "jot", "fix", "tidy", "clean", "correct", "overwrite", "fill", "empty", "rewrite", "modify", "amend",
    "prepend", "sort", "reorder", "format", "strike", "drop", "swap", "rewrite", "undo", "restore", "reset"))


def asks_for_change(task: str) -> bool:
    """Whether `task` uses a word by which a request asks to change a file (`_CHANGE_WORDS`),
    the file names it spells out left aside ("notes.txt" is no "note")."""
    words = re.findall(r"[a-z]+", _FILE_NAME.sub(" ", task).lower())
    return any(w in _CHANGE_WORDS for w in words)


def request_spans(task: str, max_words: int = SPAN_WORDS) -> list[str]:
    """Every run of up to `max_words` consecutive words of `task`, with quotes and a sentence's
    end trimmed from its edges ("Save 'buy milk' to shopping.txt" gives "buy milk"), once each,
    in order: what `copied_text` lets a mutating tool write."""
    return list(_request_spans(task, max_words))


@functools.lru_cache(maxsize=8)
def _request_spans(task: str, max_words: int) -> tuple:
    words = task[:SPAN_SOURCE].split()
    out = []
    for i in range(len(words)):
        for j in range(i + 1, min(len(words), i + max_words) + 1):
            span = " ".join(words[i:j]).strip(_QUOTES).rstrip(".,;:!?").strip(_QUOTES)
            if len(span) > SPAN_CHARS:
                break
            if span:
                out.append(span)
    return tuple(dict.fromkeys(out))


# A quoted span: text between a pair of matching quotes, the opening one not inside a word
# ("Let's" opens nothing), the closing one not followed by a letter; one line at most.
_QUOTED = re.compile("|".join(f"(?<!\\w){re.escape(a)}([^{re.escape(b)}\\n]+?){re.escape(b)}(?!\\w)"
                              for a, b in ("''", '""', "``", "\u2018\u2019", "\u201c\u201d")))


def quoted_spans(task: str) -> list[str]:
    """The texts `task` quotes ("Add 'eggs' to shopping.txt" gives ["eggs"]), in order, once each,
    blanks at their edges trimmed; only the request's first SPAN_SOURCE characters are read."""
    return list(_quoted_spans(task))


@functools.lru_cache(maxsize=8)
def _quoted_spans(task: str) -> tuple:
    spans = (next(g for g in m.groups() if g is not None).strip() for m in _QUOTED.finditer(task[:SPAN_SOURCE]))
    return tuple(dict.fromkeys(s for s in spans if s and len(s) <= SPAN_CHARS))


def unwritten(task: str, written: Sequence[str]) -> list[str]:
    """The quoted spans of `task` that are not among `written` (the string arguments of the
    episode's successful mutating calls): what the task still asks to be put somewhere."""
    done = set(written)
    return [s for s in quoted_spans(task) if s not in done]


def episode_scoped(policy, table, task: str, *, files: bool, text: bool, computed: Sequence[str] = (),
                   quoted: bool = False):
    """`policy` (a `Policy`) narrowed for one episode, per option:
      - files (task_files): the path argument of every mutating tool of `table` (an argument the
        table gives a canonical form: the built-ins' `path`) narrowed to the files `task` names,
        nothing when it names none; and to no file at all where `task` asks for no change
        (`asks_for_change`: "What is in notes.txt?" can read notes.txt, never overwrite it);
      - text (copied_text): every free string argument of a mutating tool (a plain string, no
        enum, pattern, format or domain, not a path) narrowed to a run of the request's words
        (`request_spans`) or a value the episode computed (`computed`: calc's results); with
        `quoted` (quoted_text) and a request that quotes text, one of the quoted spans alone
        (`quoted_spans`: the user said what to write).
    Each narrowing meets the policy's own: a list or enum is intersected, a glob still applies.
    Returns (the policy, what was narrowed for the trace)."""
    scope = {}
    named = task_files(task) if files else []
    no_writes = files and not asks_for_change(task)
    spans = quoted_spans(task) if quoted else []
    copies = (spans or list(dict.fromkeys([*request_spans(task), *computed]))) if text else []
    if named and not no_writes:
        scope["files"] = named
    if no_writes:
        scope["files"] = []  # the request asks for no change: no file is writable
    if copies:
        scope["text"] = spans if spans else len(copies)
    if not scope:
        return policy, scope
    args = copy.deepcopy(policy.args)
    for name in table.names():
        entry = table.entry(name)
        if not entry.tool.mutates:
            continue
        for arg, schema in entry.tool.parameters.get("properties", {}).items():
            if arg in entry.canonical:
                values = [] if no_writes else named
                if not values and not no_writes:
                    continue
            elif copies and _free_string(schema) and arg not in entry.domains:
                values = copies
            else:
                continue
            rule = args.setdefault(name, {}).get(arg)
            if rule is None:
                rule = list(values)
            elif isinstance(rule, list):
                rule = [v for v in rule if v in values]
            else:
                rule = {**rule, "enum": [v for v in rule.get("enum", values) if v in values]}
            args[name][arg] = rule
    return policy.with_(args=args), scope


def _free_string(schema: dict) -> bool:
    return schema.get("type") == "string" and not any(k in schema for k in ("enum", "const", "pattern", "format"))


# -- read_named: the files the request names are read first -----------------------------------

def reading_named(tools: Sequence[Tool], table, unread: Sequence[str]) -> tuple[list[Tool], dict[str, str]] | None:
    """`tools` narrowed to reading the files of `unread` (named by the request, not yet used):
    each tool that does not mutate and takes one of them in an argument the table gives a
    canonical form (read_file's path, an enum of the files that exist) keeps that argument's
    choices among them; every other tool is left out, with why. None where no tool can read
    any of them (a named file that does not exist yet): the view stays as it was."""
    out, left_out = [], {}
    for tool in tools:
        entry = table.entry(tool.name) if tool.name in table else None
        props = tool.parameters.get("properties", {})
        arg = next((k for k in (entry.canonical if entry else ()) if "enum" in props.get(k, {})), None)
        files = [f for f in unread if arg and f in props[arg]["enum"]]
        if tool.mutates or not files:
            left_out[tool.name] = "the request names a file to read first"
            continue
        params = copy.deepcopy(tool.parameters)
        params["properties"][arg]["enum"] = files
        out.append(Tool(tool.name, tool.description, params, mutates=tool.mutates))
    return (out, left_out) if out else None


# -- copied_numbers: calc computes with the numbers the episode has seen ------------------------

# A number to compute with: not part of a word, a version, a phone number or a date (digits joined
# to digits by "-" or "/": "555-0199", "2023-01-01", "3/4/2025"), and no leading zero ("0199").
_NUMBER_SEEN = re.compile(r"(?<![\w.])(?<!\d[-/])(?:0|[1-9]\d{0,8})(?:\.\d{1,6})?(?![\w.]\d)(?![-/]\d)(?!\d)")


# A number written as a word ("three times the price", "twice", "half of"), as its digits; "one"
# is left out (it is mostly "one file", and computing with 1 changes nothing).
_NUMBER_WORDS = {"two": "2", "three": "3", "four": "4", "five": "5", "six": "6", "seven": "7", "eight": "8",
                 "nine": "9", "ten": "10", "eleven": "11", "twelve": "12", "twice": "2", "double": "2",
                 "triple": "3", "half": "2", "dozen": "12", "hundred": "100", "thousand": "1000"}
_NUMBER_WORD = re.compile(r"\b(" + "|".join(_NUMBER_WORDS) + r")\b", re.IGNORECASE)


def numbers_seen(texts: Sequence[str], limit: int = 64) -> list[str]:
    """The numbers written in `texts` (the request, the results so far), in digits or as a word
    (`_NUMBER_WORDS`), in order, once each."""
    out = []
    for t in texts:
        hits = [(m.start(), m.group(0)) for m in _NUMBER_SEEN.finditer(t)]
        hits += [(m.start(), _NUMBER_WORDS[m.group(1).lower()]) for m in _NUMBER_WORD.finditer(t)]
        out += [n for _, n in sorted(hits)]
    return list(dict.fromkeys(out))[:limit]


def expressions_over(numbers: Sequence[str]) -> list[str]:
    """What calc may compute with copied_numbers: the numbers (the first NUMBERS_JOINED) joined
    by one operator, each of + - * /, and for two numbers both orders of - and /. A finite
    choice: SmolLM2 picked the right one of these for 7 of the suite's 8 computations, scored
    by likelihood, where free arithmetic gave numbers of its own."""
    ns = list(numbers)[:NUMBERS_JOINED]
    out = [op.join(ns) for op in "+-*/"]
    if len(ns) == 2:
        out += [f"{ns[1]}-{ns[0]}", f"{ns[1]}/{ns[0]}"]
    return out


def with_seen_numbers(tools: Sequence[Tool], numbers: Sequence[str]) -> tuple[list[Tool], dict[str, str]]:
    """`tools` with calc (the tool whose argument has `builtins.ARITHMETIC`'s pattern) narrowed
    to `expressions_over(numbers)`; with fewer than two numbers seen, calc is left out (there is
    nothing to compute with). A tool with any other schema is as it was."""
    from railcall.agent.builtins import ARITHMETIC

    out, left_out = [], {}
    for tool in tools:
        props = tool.parameters.get("properties", {})
        arg = next((k for k, p in props.items() if p.get("pattern") == ARITHMETIC["pattern"]), None)
        if arg is None:
            out.append(tool)
            continue
        if len(numbers) < 2:
            left_out[tool.name] = "fewer than two numbers seen yet in the request or a result"
            continue
        params = copy.deepcopy(tool.parameters)
        params["properties"][arg] = {"type": "string", "enum": expressions_over(numbers)}
        out.append(Tool(tool.name, tool.description, params, mutates=tool.mutates))
    return out, left_out


# -- examples: a request and its call per tool --------------------------------------------------

def tool_examples(tools: Sequence[Tool], fmt: str = "json") -> str:
    """Lines for the system prompt: for each tool but `answer` and `run`, a request and the
    call that does it, in the call format: a built-in's own (`builtins.EXAMPLES`: "Save the text
    'see you at 5' to memo.txt." -> write_file), any other tool's built from its schema alone
    (`railcall.prompts.shots`: its name in words, a placeholder of each argument's type)."""
    from railcall.agent.builtins import ANSWER, EXAMPLES
    from railcall.agent.skills import RUN
    from railcall.prompts.chat import call_text
    from railcall.prompts.shots import shots

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


def _quoted(text) -> str:
    return "'" + _cut(" ".join(str(text).split())) + "'"


def _cut(text: str, limit: int = SHORT_LIMIT) -> str:
    return text if len(text) <= limit else text[:limit] + " [...]"
