"""Output: a model's generated tokens -> reasoning_content, content and tool calls, as deltas.

Two pieces, with different lifecycles:

- `Delimiters` (once per model): the model contract's reasoning open/close and tool-call
  open/close strings, each resolved against the vocabulary to the one token that spells it, or
  to None when no such token exists. The output parser and the grammar regions
  (`railcall.runtime.regions`) read the same object, so they can never disagree on what ends reasoning.
- `OutputParser` (once per request): fed one generated token at a time, as its id and then its
  text, it returns deltas and, at the end, a `ParsedOutput`.

The rule: a delimiter that is one token counts only where that token was generated.
A model that writes `</think>` as ordinary text -- explaining a chat template, or inside a JSON
string -- produces pieces such as `</`, `think`, `>`; those stay text, in reasoning_content or
content, wherever they occur. The parser learns from the token id *where* the delimiter's text
will start (the offset in the decoded text when the id arrives) and switches mode exactly there;
text that could still become that delimiter is held until its text arrives. At `finish()` held
text is released as ordinary text; `cancel()` (a cancelled or failed request) discards it.

The fallback, and its limit: a delimiter that is not one token (SmolLM2 has no `<think>` token;
it spells it `<`, `think`, `>`) can only be recognised by its text, so there a spelled tag does
switch modes -- the behaviour this module exists to avoid, kept because nothing better is
knowable from text. docs/reasoning.md lists which delimiters resolve on the embedded model.

Call formats (railcall.grammar.tools):
- Hermes, `<tool_call>{"name":…,"arguments":{…}}</tool_call>`: a call starts at the open
  delimiter (token, or text where it is not one token) and ends at the close delimiter once the
  body is a complete JSON value, so a close tag written inside an argument string stays argument
  text. Several calls in one turn (parallel) are simply several such blocks.
- JSON wire format, `{"tool":"<name>","args":{…}}`: no vocabulary has a token for it, so calls
  are recognised by text. With tool_choice "required" the content *is* the call: content that
  starts with `{` or `[` is scanned as one JSON value (an object, or an array of objects for
  parallel calls). With "auto", the trigger text `{"tool":"` anywhere in content starts a call,
  which ends where its JSON object closes; further triggers are further calls. These are the
  same texts `railcall.runtime.regions` hands to the call grammar, so grammar and parser agree.
- OpenAI-style `{"name":…,"arguments":{…}}`: read as the JSON wire format, with its own keys
  and trigger text `{"name":"`.
- Pythonic, `[get_weather(city="Paris", days=3)]`: content that starts with `[` (after
  whitespace; with "auto" as with "required", as vLLM's pythonic parser reads it) is read as one
  Python list of calls, to its closing bracket. It is parsed with `ast.parse`, never evaluated:
  each item must be a call of a (dotted) name with keyword arguments only, each value a literal
  (strings, numbers, True/False/None, lists, dicts with string keys); the arguments become JSON
  text, numbers as written where JSON spells them alike. With `stream_calls` its calls are
  handed out when the list closes (name, arguments, call), not piece by piece.
A call body that does not parse as a call of its format is returned as content, verbatim.
"""

from __future__ import annotations

import ast
import json
import re
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable, Literal

from railcall.errors import RailcallError
from railcall.vocab import Vocabulary, single_token

# What the JSON wire format's calls start with; the trigger for tool_choice "auto". JSON allows
# whitespace between its tokens, and a model writes `{\n    "tool": "` as readily as the compact
# form: both start a call (`json_gaps` says where whitespace may stand; the grammar regions and
# this parser read the same trigger, so they agree on where a call starts).
JSON_CALL_TRIGGER = '{"tool":"'
# The JSON-object call formats: (name key, arguments key) and the trigger text for "auto".
JSON_FORMATS = {"json": ("tool", "args"), "openai": ("name", "arguments")}
CALL_FORMATS = ("hermes", "json", "openai", "pythonic")
# The text that starts a call in free text (tool_choice "auto") per format, for the grammar
# regions' `trigger` (None: the regions' own choice, the call-open delimiter or JSON_CALL_TRIGGER).
# Pythonic's is `[`: this parser reads a list only where it opens the reply, so under "auto" a
# pythonic call must come first.
AUTO_TRIGGERS = {"json": None, "openai": '{"name":"', "hermes": None, "pythonic": "["}
JSON_WS = " \t\n\r"


def json_gaps(text: str) -> frozenset[int]:
    """Positions p of a JSON fragment where whitespace may stand before text[p]: before a JSON
    token that starts outside a string (an opening quote, `:`, `,`, a bracket), never at 0."""
    gaps, in_str, esc = set(), False, False
    for p, c in enumerate(text):
        if in_str:
            if esc:
                esc = False
            elif c == "\\":
                esc = True
            elif c == '"':
                in_str = False
            continue
        if p > 0 and c in '":,{}[]':
            gaps.add(p)
        if c == '"':
            in_str = True
    return frozenset(gaps)


class TextTrigger:
    """A trigger recognised by its text: `text`, with any run of JSON whitespace allowed at the
    positions in `gaps`. Built once per parser."""

    def __init__(self, text: str, gaps: frozenset[int] = frozenset()):
        self.text, self.gaps = text, gaps

    def _run(self, s: str, i: int) -> int:
        """From s[i], how far the trigger matches: the end index of a whole match, or -1 if
        s ends inside a possible match (a prefix), or -2 if it fails."""
        p, t = 0, self.text
        while i < len(s):
            c = s[i]
            if c == t[p]:
                p += 1
                if p == len(t):
                    return i + 1
            elif not (p in self.gaps and c in JSON_WS):
                return -2
            i += 1
        return -1

    def find(self, buf: str, limit: int) -> tuple[int, str] | None:
        """(where, the matched text) of the first whole match ending by `limit`; None if none."""
        at = buf.find(self.text[0], 0, limit)
        while at >= 0:
            end = self._run(buf[:limit], at)
            if end >= 0:
                return at, buf[at:end]
            at = buf.find(self.text[0], at + 1, limit)
        return None

    def held(self, buf: str) -> int:
        """The longest end of `buf` that could still become a match (held until it is known)."""
        at = buf.find(self.text[0])
        while at >= 0:
            if self._run(buf, at) == -1:
                return len(buf) - at
            at = buf.find(self.text[0], at + 1)
        return 0

Role = Literal["reasoning_open", "reasoning_close", "call_open", "call_close"]
ROLES: tuple[Role, ...] = ("reasoning_open", "reasoning_close", "call_open", "call_close")


@dataclass(frozen=True)
class Delimiter:
    """One delimiter of a model's contract: its role, its text, and the single token id that
    spells it (None: not one token in this vocabulary; matched by text, see the module doc)."""

    role: Role
    text: str
    token_id: int | None


@dataclass(frozen=True)
class Delimiters:
    """The contract's delimiters resolved against one vocabulary. Built once per model (cached on
    the Vocabulary), read-only, shared by every OutputParser and every region matcher.

    A role the model does not have (no reasoning, say) is None.
    """

    reasoning_open: Delimiter | None = None
    reasoning_close: Delimiter | None = None
    call_open: Delimiter | None = None
    call_close: Delimiter | None = None

    @classmethod
    def from_vocab(
        cls,
        vocab: Vocabulary,
        *,
        reasoning: tuple[str, str] | None = ("<think>", "</think>"),
        tool_call: tuple[str, str] | None = ("<tool_call>", "</tool_call>"),
    ) -> "Delimiters":
        """Resolve the contract's strings against `vocab` (cached per vocabulary and contract).

        A delimiter keeps a token id when its text encodes to exactly one token and that token
        decodes back to the same text: with the tokenizer's own `encode` when the vocabulary was
        built from one (`Vocabulary.from_hf`), else by looking the text up among the special
        tokens and then the text tokens. Anything else falls back to text matching.
        """
        for pair, what in ((reasoning, "reasoning"), (tool_call, "tool_call")):
            if pair is not None and (len(pair) != 2 or not all(isinstance(s, str) and s for s in pair)):
                raise RailcallError(f"{what} delimiters must be a pair of non-empty strings (open, close), "
                                    f"not {pair!r}; pass None for a model without them")
        cache = vocab._extra.setdefault("delimiters", {})
        key = (reasoning, tool_call)
        hit = cache.get(key)
        if hit is None:
            texts = (reasoning or (None, None)) + (tool_call or (None, None))
            hit = cls(*(None if t is None else Delimiter(role, t, single_token(vocab, t))
                        for role, t in zip(ROLES, texts)))
            cache[key] = hit
        return hit

    def all(self) -> list[Delimiter]:
        return [d for d in (self.reasoning_open, self.reasoning_close, self.call_open, self.call_close) if d]

    @property
    def token_ids(self) -> frozenset[int]:
        """The ids of the delimiters that are single tokens."""
        return frozenset(d.token_id for d in self.all() if d.token_id is not None)


# -- results and deltas -----------------------------------------------------------------------


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: the tool's name and its arguments as JSON text -- the text the model
    wrote, whitespace outside strings removed (numbers and escapes as written). `complete` is
    False for a call the output ended inside (cut by max_tokens): its arguments stop where the
    output stopped and are not valid JSON, so no client can mistake them for a call to run."""

    name: str
    arguments: str
    complete: bool = True

    @property
    def input(self) -> str:
        """A custom tool's input text: its arguments are one JSON string (`OutputParser`'s
        `text_tools`). ValueError for a call whose arguments are not one."""
        value = json.loads(self.arguments)
        if not isinstance(value, str):
            raise ValueError(f"the call of {self.name!r} has arguments, not an input text")
        return value


@dataclass(frozen=True)
class Delta:
    """A piece of output. `kind` is "reasoning" or "content" (with `text`); "tool_call" (with
    `call` and its `index` in the turn) once a call's end is seen; and, with `stream_calls`,
    "call_name" (`text` the name, as soon as it is complete) and "call_args" (`text` the next
    piece of the arguments) before it. The pieces of a call's arguments add up to its
    `ToolCall.arguments`."""

    kind: Literal["reasoning", "content", "tool_call", "call_name", "call_args"]
    text: str = ""
    call: ToolCall | None = None
    index: int = 0


class _CallScanner:
    """Reads a call body (JSON text) as it arrives and says what a streaming client may see: the
    name once its string is complete, then the arguments piece by piece. The body is one call
    object, or an array of them (the JSON format's parallel calls). Per call being read.

    A scanner does not validate: it runs where the grammar already holds the body to a call
    (`OutputParser(stream_calls=True)`), and the parser validates the whole at the call's end.
    """

    def __init__(self, keys: tuple[str, str], first: int, text_tools: frozenset[str] = frozenset()):
        self.name_key, self.args_key = keys
        self.text_tools = text_tools  # custom tools: their arguments are one string, streamed as written
        self.first = first  # the turn's index of the body's first call
        self.calls: list[list] = []  # [name or None, args text, args complete]
        self.depth = 0
        self.in_str = self.esc = False
        self.base: int | None = None  # depth of a call object's members: 1 (an object), 2 (an array)
        self.key: str | None = None  # the member being read at the call's top level
        self.expect_key = False
        self.text = ""  # the current string's raw text (a key or the name)
        self.args_from: int | None = None  # depth the arguments value opened at
        self.args_string = False  # arguments written as a JSON string: streamed only for a custom tool
        self.out: list[Delta] = []
        self.held: dict[int, str] = {}  # arguments read before the name (sent once it is known)

    def feed(self, c: str) -> None:
        top = self.base is not None and self.depth == self.base
        if self.in_str:
            self._arg(c)
            if self.esc:
                self.esc = False
                self.text += c
            elif c == "\\":
                self.esc = True
                self.text += c
            elif c == '"':
                self.in_str = False
                if self.args_from is not None and self.args_from == self.depth and self.args_string:
                    self.calls[-1][2] = True  # a custom tool's input string closed
                    self.args_from = None
                elif top and self.expect_key:
                    self.key, self.expect_key = _str(self.text), False
                elif top and self.key == self.name_key and self.calls and self.calls[-1][0] is None:
                    name = _str(self.text)
                    self.calls[-1][0] = name
                    k = len(self.calls) - 1
                    self.out.append(Delta("call_name", name, index=self.first + k))
                    if self.held.get(k):
                        self.out.append(Delta("call_args", self.held.pop(k), index=self.first + k))
            else:
                self.text += c
            return
        if c in " \t\r\n":
            return
        if self.base is None:
            self.base = 1 if c == "{" else 2
        if c == '"':
            self.in_str, self.text = True, ""
            if top and self.key == self.args_key and self.args_from is None and not self.expect_key:
                self.args_string = True
                if self.calls and self.calls[-1][0] is not None and self.calls[-1][0] in self.text_tools:
                    self.args_from = self.depth  # the input's JSON string, streamed quotes and all
            self._arg(c)
        elif c in "{[":
            if top and self.key == self.args_key and self.args_from is None:
                self.args_from = self.depth
            self._arg(c)
            self.depth += 1
            if c == "{" and self.depth == self.base:  # a call object opens
                self.calls.append([None, "", False])
                self.key, self.expect_key, self.args_from, self.args_string = None, True, None, False
        elif c in "}]":
            self._arg(c)
            self.depth -= 1
            if self.args_from is not None and self.depth == self.args_from:
                self.calls[-1][2] = True
                self.args_from = None
        elif c == "," and top:
            self.key, self.expect_key = None, True
        else:
            self._arg(c)

    def _arg(self, c: str) -> None:
        """Append c to the call's arguments if it is part of them (inside the arguments object)."""
        if self.args_from is None or not self.calls or self.calls[-1][2]:
            return
        call = self.calls[-1]
        call[1] += c
        k = len(self.calls) - 1
        if call[0] is None:
            self.held[k] = self.held.get(k, "") + c
        elif self.out and self.out[-1].kind == "call_args" and self.out[-1].index == self.first + k:
            self.out[-1] = Delta("call_args", self.out[-1].text + c, index=self.first + k)
        else:
            self.out.append(Delta("call_args", c, index=self.first + k))

    def take(self) -> list[Delta]:
        out, self.out = self.out, []
        return out


def _str(raw: str) -> str:
    try:
        return json.loads('"' + raw + '"')
    except ValueError:
        return raw


@dataclass
class ParsedOutput:
    """The whole turn. `content` is "" when it held only whitespace (e.g. between calls)."""

    reasoning_content: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)


# -- the streaming parser ---------------------------------------------------------------------


class OutputParser:
    """Splits one request's output into reasoning, content and tool calls. Built per request.

    Lifecycle: `feed(token_id, text)` once per generated token (the id first: it tells where a
    delimiter's text will start; then the text the detokenizer produced at that step, which for
    a special delimiter token must be its text -- decode with skip_special_tokens=False); then
    exactly one of `finish()` (held text is released as ordinary text; an unclosed call becomes
    content) or `cancel()` (held text is discarded). `result()` is valid after either.

    Options:
      call_format      "hermes", "json", "openai", "pythonic", or None (no calls are recognised).
      tool_choice      "auto", "required" or "none" (as in the OpenAI API; "none": no calls).
      reasoning_opened the prompt already opened reasoning (some templates end the prompt with
                       `<think>`), so the output starts inside it.
      stop_ids         end-of-turn tokens; their text is never output.
      text_tools       the names of custom tools: a call of one carries one JSON string (its
                       input text) where others carry an arguments object; it is kept as that
                       string (`ToolCall.input` decodes it) and, with stream_calls, streamed.
      stream_calls     also hand out a call in pieces as it is written ("call_name", then
                       "call_args" deltas), before its "tool_call" delta; for output a grammar
                       holds to the call format (the pieces are not validated until the end).
                       A call the output ends inside is then a `ToolCall(complete=False)` with
                       its arguments as far as they were written, not content.

    Reasoning happens at most once, at the start: an open delimiter opens it only before any
    content, and once it is closed, reasoning delimiters are ordinary text (a structured answer
    may contain them). A close *token* at the very start of content (a template that opened
    reasoning in the prompt, and a parser not told so) is dropped; a spelled one stays content.
    Inside reasoning, an open token is dropped and a tool-call open token ends reasoning.
    """

    def __init__(self, delimiters: Delimiters, *, call_format: str | None = "hermes",
                 tool_choice: str = "auto", reasoning_opened: bool = False, stop_ids: Iterable[int] = (),
                 stream_calls: bool = False, text_tools: Iterable[str] = ()):
        if call_format not in CALL_FORMATS + (None,):
            raise RailcallError(f"unknown call format {call_format!r}; use one of {', '.join(CALL_FORMATS)} or None")
        if tool_choice not in ("auto", "required", "none"):
            raise RailcallError(f"unknown tool_choice {tool_choice!r}; use 'auto', 'required' or 'none'")
        if call_format == "hermes" and delimiters.call_open is None:
            raise RailcallError("the Hermes call format needs tool-call delimiters; resolve Delimiters with "
                                "tool_call=('<tool_call>', '</tool_call>')")
        if reasoning_opened and delimiters.reasoning_close is None:
            raise RailcallError("reasoning_opened needs a reasoning close delimiter; resolve Delimiters with "
                                "reasoning=(open, close)")
        self.d = delimiters
        self.format = call_format if tool_choice != "none" else None
        self._json_like = self.format in JSON_FORMATS  # "json" and "openai" read alike, with their own keys
        self._keys = JSON_FORMATS.get(self.format or "", ("name", "arguments"))
        self.required = tool_choice == "required"
        self._by_id = {x.token_id: x for x in delimiters.all() if x.token_id is not None}
        self._stops = frozenset(stop_ids)
        self._mode = "reasoning" if reasoning_opened else "content"
        # reasoning can no longer open (it was opened in the prompt, or the model has none)
        self._reasoning_done = reasoning_opened or delimiters.reasoning_open is None
        self._at_start = True  # no non-whitespace content yet
        self._buf = ""  # received, not yet classified
        self._base = 0  # offset of _buf[0] in the whole output text
        self._pending: deque[tuple[int, Delimiter]] = deque()  # token delimiters: (offset, delimiter)
        self._body = ""  # the call being read (its text from the start, for release as content)
        self._opener = ""  # the text that opened it
        self._depth = 0  # JSON scanner: nesting depth, inside a string, after a backslash
        self._in_str = False
        self._esc = False
        self._out: list[Delta] = []
        self.stream_calls = stream_calls
        self.text_tools = frozenset(text_tools)
        self._scanner: _CallScanner | None = None
        trigger = '{"%s":"' % self._keys[0]
        self._json_trigger = TextTrigger(trigger, json_gaps(trigger))
        self._closed = False
        self._result = ParsedOutput()

    # -- the verbs --------------------------------------------------------------------------

    def feed(self, token_id: int, text: str) -> list[Delta]:
        """One generated token: its id, then its text. Returns the deltas now certain."""
        self._check_open("feed")
        if token_id in self._stops:
            return []
        d = self._by_id.get(token_id)
        if d is not None:
            # An incremental decoder gives a character left incomplete by the token before with
            # this one's text (a replacement character first): the delimiter's text ends the step.
            lead = len(text) - len(d.text) if len(text) > len(d.text) and text.endswith(d.text) else 0
            self._pending.append((self._base + len(self._buf) + lead, d))
        self._buf += text
        self._process(final=False)
        return self._take()

    def finish(self) -> list[Delta]:
        """End of generation: held text is released as ordinary text; an unclosed call is content."""
        self._check_open("finish")
        self._process(final=True)
        if self._mode in ("hermes", "json", "pythonic"):
            sc = self._scanner
            named = [c for c in (sc.calls if sc is not None and self.stream_calls else []) if c[0] is not None]
            if named:  # cut inside a call: it stays a call, its arguments as far as written
                self._mode, self._body = "content", ""
                for name, args, done in named:
                    self._add_call(ToolCall(name, args, complete=done and args != ""))
            else:
                text, self._body = self._opener + self._body, ""
                self._mode = "content"
                self._emit("content", text)
        self._closed = True
        r = self._result
        if not r.content.strip():
            r.content = ""
        return self._take()

    def cancel(self) -> None:
        """A cancelled or failed request: held text and any unclosed call are discarded."""
        self._buf, self._body = "", ""
        self._pending.clear()
        self._closed = True

    def result(self) -> ParsedOutput:
        return self._result

    # -- internals ----------------------------------------------------------------------------

    def _check_open(self, verb: str) -> None:
        if self._closed:
            raise RailcallError(f"OutputParser.{verb}() after finish() or cancel(); use one parser per request")

    def _take(self) -> list[Delta]:
        out, self._out = self._out, []
        merged: list[Delta] = []
        for x in out:  # adjacent text deltas of one kind (and one call's arguments) become one
            if (merged and x.kind in ("reasoning", "content", "call_args") and merged[-1].kind == x.kind
                    and merged[-1].index == x.index):
                merged[-1] = Delta(x.kind, merged[-1].text + x.text, index=x.index)
            else:
                merged.append(x)
        return merged

    def _emit(self, kind: str, text: str) -> None:
        if not text:
            return
        if kind == "reasoning":
            self._result.reasoning_content += text
        else:
            self._result.content += text
            if text.strip():
                self._at_start = False
        self._out.append(Delta(kind, text))

    def _consume(self, n: int) -> None:
        self._buf = self._buf[n:]
        self._base += n

    def _patterns(self) -> list[tuple]:
        """(text, what) pairs recognised by text in the current mode: delimiters without a token."""
        d, out = self.d, []
        if self._mode == "reasoning":
            if d.reasoning_close and d.reasoning_close.token_id is None:
                out.append((d.reasoning_close.text, "reasoning_close"))
        elif self._mode == "content":
            if self._at_start and not self._reasoning_done and d.reasoning_open and d.reasoning_open.token_id is None:
                out.append((d.reasoning_open.text, "reasoning_open"))
            if self.format == "hermes" and d.call_open.token_id is None:
                out.append((d.call_open.text, "call_open"))
            if self._json_like and not self.required:
                out.append((self._json_trigger, "json_trigger"))
        elif self._mode == "hermes":
            if d.call_close and d.call_close.token_id is None:
                out.append((d.call_close.text, "call_close"))
        return out

    def _process(self, final: bool) -> None:
        while self._buf:
            buf = self._buf
            tok_at = self._pending[0][0] - self._base if self._pending else None
            limit = len(buf) if tok_at is None else tok_at
            # The earliest text-matched delimiter that lies wholly before the next token delimiter.
            best = None
            for text, what in self._patterns():
                if isinstance(text, TextTrigger):
                    hit = text.find(buf, limit)
                    at, text = hit if hit is not None else (-1, "")
                else:
                    at = buf.find(text, 0, limit)
                while at >= 0 and what == "reasoning_open" and buf[:at].strip():
                    at = -1  # reasoning opens only before any content
                if at >= 0 and (best is None or at < best[0]):
                    best = (at, text, what)
            if best is not None:
                at, text, what = best
                if what == "reasoning_open":  # only whitespace precedes it: not content
                    self._consume(at)
                else:
                    n = self._ordinary(buf[:at])
                    self._consume(n)
                    if n < at:
                        continue  # a JSON call ended inside that text; rescan in the new mode
                self._consume(len(text))
                if not self._on_delimiter(what, text):
                    self._ordinary_all(text)
                continue
            if tok_at is not None:
                _, d = self._pending[0]
                if self._leading(d):
                    self._consume(tok_at)  # whitespace before a leading reasoning delimiter
                else:
                    n = self._ordinary(buf[:tok_at])
                    self._consume(n)
                    if n < tok_at:
                        continue
                rest = self._buf
                if len(rest) >= len(d.text) or not d.text.startswith(rest):
                    self._pending.popleft()
                    if rest.startswith(d.text):
                        self._consume(len(d.text))
                        if not self._on_delimiter(d.role, d.text, token=True):
                            self._ordinary_all(d.text)
                    # else: the step's text is not the delimiter's (a detokenizer that skips
                    # special tokens); what arrived is ordinary text, handled on the next pass.
                    continue
                if final:  # its text never arrived: release what was held as text
                    self._pending.popleft()
                    continue
                return  # hold: the rest could still be the delimiter's text
            hold = 0 if final else self._held(buf)
            n = len(buf) - hold
            if n == 0:
                return
            taken = self._ordinary(buf[:n])
            self._consume(taken)
            if taken < n:
                continue
            return

    def _leading(self, d: Delimiter) -> bool:
        """Whether token delimiter `d` is a reasoning delimiter at the start of the output."""
        return (self._mode == "content" and self._at_start and not self._reasoning_done
                and d.role in ("reasoning_open", "reasoning_close"))

    def _held(self, buf: str) -> int:
        """The longest end of `buf` that is a proper prefix of a text-matched delimiter."""
        best = 0
        for text, what in self._patterns():
            if isinstance(text, TextTrigger):
                best = max(best, text.held(buf))
                continue
            for k in range(min(len(text) - 1, len(buf)), best, -1):
                if text.startswith(buf[-k:]):
                    if what == "reasoning_open":
                        if buf[:-k].strip():
                            break
                        k = len(buf)  # with the whitespace before it, which is not content then
                    best = k
                    break
        if (self._mode == "content" and self._at_start and not buf.strip()
                and ((self._json_like and self.required) or self.format == "pythonic" or not self._reasoning_done)):
            return len(buf)  # leading whitespace: reasoning may still open, or a call follow
        return best

    def _ordinary_all(self, text: str) -> None:
        """Text that is certainly ordinary, given back in front of the buffer if a JSON call ends
        inside it (the rest is then classified in content mode)."""
        n = self._ordinary(text)
        if n < len(text):
            self._buf = text[n:] + self._buf
            self._base -= len(text) - n

    def _ordinary(self, text: str) -> int:
        """Route ordinary text to the current mode; returns how much was taken (less than all
        only when a JSON call ends, or starts, inside `text`)."""
        if not text:
            return 0
        mode = self._mode
        if mode == "reasoning":
            self._emit("reasoning", text)
        elif mode == "hermes":
            self._body += text
            self._scan(text)
        elif mode == "json":
            return self._scan_json(text)
        elif mode == "pythonic":
            return self._scan_python(text)
        elif self.format == "pythonic" and self._at_start and text.lstrip()[:1] == "[":
            # a pythonic call list is the content: it starts the output (auto or required)
            start = len(text) - len(text.lstrip())
            self._emit("content", text[:start])
            self._reasoning_done = True
            self._start_call("pythonic", "")
            return start + self._scan_python(text[start:])
        elif self._json_like and self.required and self._at_start and text.lstrip()[:1] in ("{", "["):
            # tool_choice "required": the content is the call (or an array of calls).
            start = len(text) - len(text.lstrip())
            self._emit("content", text[:start])
            self._start_call("json", "")
            return start + self._scan_json(text[start:])
        else:
            self._emit("content", text)
        return len(text)

    def _on_delimiter(self, what: str, text: str, token: bool = False) -> bool:
        """Apply a delimiter in the current mode; False means it is ordinary text here."""
        mode = self._mode
        if mode == "reasoning":
            if what == "reasoning_close":
                self._mode, self._reasoning_done = "content", True
                return True
            if token and what == "reasoning_open":
                return True  # a stray open token inside reasoning is a control token: dropped
            if token and what == "call_open" and self.format == "hermes":
                self._reasoning_done = True
                self._start_call("hermes", text)
                return True
            return False
        if mode == "content":
            if what == "reasoning_open" and self._at_start and not self._reasoning_done:
                self._mode = "reasoning"
                return True
            if token and what == "reasoning_close" and self._at_start and not self._reasoning_done:
                self._reasoning_done = True  # a leading close token: reasoning was opened in the prompt
                return True
            if what == "call_open" and self.format == "hermes":
                self._reasoning_done = True
                self._start_call("hermes", text)
                return True
            if what == "json_trigger":
                self._reasoning_done = True
                self._start_call("json", "")
                self._scan_json(text)
                return True
            return False
        if mode == "hermes" and what == "call_close":
            try:
                _loads(self._body)
            except ValueError:
                return False  # inside the arguments (a close tag in a string): text
            self._end_call(self._body, text)
            return True
        return False

    def _start_call(self, mode: str, opener: str) -> None:
        self._mode, self._opener, self._body = mode, opener, ""
        self._depth, self._in_str, self._esc = 0, False, False
        self._at_start = False
        self._quote = ""  # pythonic: the quote of the string being read ("" outside strings)
        keys = ("name", "arguments") if mode == "hermes" else self._keys
        self._scanner = None if mode == "pythonic" else _CallScanner(keys, len(self._result.tool_calls), self.text_tools)

    def _scan(self, text: str) -> None:
        sc = self._scanner
        for c in text:
            sc.feed(c)
        if self.stream_calls:
            self._out += sc.take()
        else:
            sc.out.clear()

    def _scan_json(self, text: str) -> int:
        """Feed text to the JSON call being read; returns the characters taken (up to the end of
        the value, where the call ends)."""
        for i, c in enumerate(text):
            self._body += c
            self._scan(c)
            if self._in_str:
                if self._esc:
                    self._esc = False
                elif c == "\\":
                    self._esc = True
                elif c == '"':
                    self._in_str = False
            elif c == '"':
                self._in_str = True
            elif c in "{[":
                self._depth += 1
            elif c in "}]":
                self._depth -= 1
                if self._depth <= 0:
                    self._end_call(self._body, "")
                    return i + 1
        return len(text)

    def _scan_python(self, text: str) -> int:
        """Feed text to the pythonic call list being read; returns the characters taken (up to
        its closing bracket, where the list ends). Brackets inside Python strings (either
        quote) do not count."""
        for i, c in enumerate(text):
            self._body += c
            if self._quote:
                if self._esc:
                    self._esc = False
                elif c == "\\":
                    self._esc = True
                elif c == self._quote:
                    self._quote = ""
            elif c in "\"'":
                self._quote = c
            elif c in "([{":
                self._depth += 1
            elif c in ")]}":
                self._depth -= 1
                if self._depth <= 0:
                    self._end_call(self._body, "")
                    return i + 1
        return len(text)

    def _end_call(self, body: str, closer: str) -> None:
        pythonic = self._mode == "pythonic"
        calls = parse_pythonic(body) if pythonic else _parse_calls(body, self._mode, self._keys, self.text_tools)
        raw = self._opener + body + closer
        self._mode, self._body, self._opener = "content", "", ""
        if calls is None:
            self._emit("content", raw)  # not a call of this format: the text stays content
            return
        if pythonic:
            for call in calls:
                if self.stream_calls:
                    k = len(self._result.tool_calls)
                    self._out += [Delta("call_name", call.name, index=k), Delta("call_args", call.arguments, index=k)]
                self._add_call(call)
            return
        read = self._scanner.calls if self._scanner is not None else []
        for k, call in enumerate(calls):
            # the arguments as written (what a stream sent), where the scanner read an object
            if k < len(read) and read[k][2] and read[k][0] == call.name:
                call = ToolCall(call.name, read[k][1])
            self._add_call(call)

    def _add_call(self, call: ToolCall) -> None:
        self._out.append(Delta("tool_call", call=call, index=len(self._result.tool_calls)))
        self._result.tool_calls.append(call)


class _Number(str):
    """A JSON number as it was written. Arguments are re-serialised with their numbers' own
    text: through a float, `1e999` would come back as `Infinity` (not JSON) and
    `0.10000000000000000001` as `0.1`."""


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _loads(text: str):
    return json.loads(text, parse_float=_Number, parse_int=_Number, parse_constant=_no_constant)


def _is_text(x) -> bool:
    return isinstance(x, str) and not isinstance(x, _Number)


def _compact(value) -> str:
    """Compact JSON of a value read by `_loads`, numbers as written."""
    if isinstance(value, _Number):
        return str(value)
    if isinstance(value, dict):
        return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + _compact(v) for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_compact(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def _parse_calls(body: str, fmt: str, keys: tuple[str, str] = ("tool", "args"),
                 text_tools: frozenset[str] = frozenset()) -> list[ToolCall] | None:
    try:
        value = _loads(body)
    except ValueError:
        return None
    name_key, args_key = ("name", "arguments") if fmt == "hermes" else keys
    items = value if isinstance(value, list) and fmt == "json" else [value]
    calls = []
    for item in items:
        if not isinstance(item, dict) or not _is_text(item.get(name_key)):
            return None
        args = item.get(args_key, {})
        if item[name_key] in text_tools:  # a custom tool: one input text
            if not _is_text(args):
                return None
            calls.append(ToolCall(item[name_key], json.dumps(args, ensure_ascii=False)))
            continue
        if _is_text(args):  # some templates write arguments as a JSON string
            try:
                args = _loads(args)
            except ValueError:
                return None
        if not isinstance(args, dict):
            return None
        calls.append(ToolCall(item[name_key], _compact(args)))
    return calls or None


# -- pythonic calls ---------------------------------------------------------------------------

_JSON_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")


def parse_pythonic(text: str) -> list[ToolCall] | None:
    """`[f(a=1), g.h(b="x")]` -> ToolCalls, or None where `text` is not such a list. Parsed with
    `ast.parse` and read node by node (as `ast.literal_eval` reads, never evaluated): a call of
    a name or dotted name with keyword arguments only, each value a literal JSON can hold."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if not isinstance(tree.body, ast.List):
        return None
    src = text.strip()
    calls = []
    for item in tree.body.elts:
        if not isinstance(item, ast.Call) or item.args:
            return None
        name = _dotted(item.func)
        if name is None:
            return None
        members = {}
        try:
            for kw in item.keywords:
                if kw.arg is None or kw.arg in members:  # **kwargs; a repeated keyword (a SyntaxError to Python)
                    return None
                members[kw.arg] = _py_json(kw.value, src)
        except (ValueError, RecursionError):
            return None
        args = "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + v for k, v in members.items()) + "}"
        calls.append(ToolCall(name, args))
    return calls or None


def _dotted(node) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return None if head is None else head + "." + node.attr
    return None


def _py_json(node, src: str) -> str:
    """A Python literal's node as compact JSON text; ValueError for anything JSON cannot hold
    (tuples, sets, bytes, complex numbers, names, calls, a lone surrogate)."""
    if isinstance(node, ast.Constant):
        v = node.value
        if v is None or isinstance(v, bool):
            return {None: "null", True: "true", False: "false"}[v]
        if isinstance(v, str):
            if any("\ud800" <= c <= "\udfff" for c in v):
                raise ValueError("a lone surrogate")
            return json.dumps(v, ensure_ascii=False)
        if isinstance(v, (int, float)):
            return _number(node, v, src)
        raise ValueError(f"{type(v).__name__} is not JSON")
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)) and isinstance(
            node.operand, ast.Constant) and type(node.operand.value) in (int, float):
        v = node.operand.value
        return _number(node, -v if isinstance(node.op, ast.USub) else v, src)
    if isinstance(node, ast.List):
        return "[" + ",".join(_py_json(x, src) for x in node.elts) + "]"
    if isinstance(node, ast.Dict):
        members = {}
        for k, v in zip(node.keys, node.values):
            if not (isinstance(k, ast.Constant) and isinstance(k.value, str)):
                raise ValueError("a dict key that is not a string")
            members[k.value] = _py_json(v, src)
        return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + v for k, v in members.items()) + "}"
    raise ValueError(f"{type(node).__name__} is not a literal")


def _number(node, value, src: str) -> str:
    """A number as written where JSON spells it alike (`1e999` stays `1e999`, not Infinity),
    else its value (`0x1F`, `1_000`, `.5`)."""
    seg = ast.get_source_segment(src, node)
    if seg is not None and _JSON_NUMBER.fullmatch(seg):
        return seg
    out = json.dumps(value, allow_nan=False)  # ValueError for inf/nan
    return out
