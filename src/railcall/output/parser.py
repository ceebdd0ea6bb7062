"""The streaming parser: one request's generated tokens -> reasoning, content and tool calls."""

from __future__ import annotations

from collections import deque
from typing import Iterable

from railcall.errors import RailcallError
from railcall.output.calls import Delta, ParsedOutput, ToolCall, parse_calls, parse_pythonic, read_json
from railcall.output.delimiters import CALL_FORMATS, JSON_FORMATS, Delimiter, Delimiters, TextTrigger, json_gaps
from railcall.output.scan import CallBody

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
      grammar_calls    a call starts only where the grammar started one: `feed`'s starts_call
                       says so per token (a Turn's `started` tag), so a call's trigger spelled
                       inside another tagged part is that part's text.

    Reasoning happens at most once, at the start: an open delimiter opens it only before any
    content, and once it is closed, reasoning delimiters are ordinary text (a structured answer
    may contain them). A close *token* at the very start of content (a template that opened
    reasoning in the prompt, and a parser not told so) is dropped; a spelled one stays content.
    Inside reasoning, an open token is dropped and a tool-call open token ends reasoning.
    """

    def __init__(self, delimiters: Delimiters, *, call_format: str | None = "hermes",
                 tool_choice: str = "auto", reasoning_opened: bool = False, stop_ids: Iterable[int] = (),
                 stream_calls: bool = False, text_tools: Iterable[str] = (), grammar_calls: bool = False):
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
        self._call: CallBody | None = None  # the call being read (in the modes "hermes", "json", "pythonic")
        self._out: list[Delta] = []
        self.stream_calls = stream_calls
        self.text_tools = frozenset(text_tools)
        trigger = '{"%s":"' % self._keys[0]
        self._json_trigger = TextTrigger(trigger, json_gaps(trigger))
        self._closed = False
        self._result = ParsedOutput()
        # grammar_calls: a call starts only where the grammar started one (feed's starts_call),
        # not wherever its trigger appears in the text: a trigger spelled inside another tagged
        # part (a structural tag's JSON beside calls) is that part's text.
        self._grammar_calls = grammar_calls
        self._starts: deque[tuple[int, bool | None]] = deque()  # per fed text: (its end offset, starts_call)
        self._fed = 0  # offset just after the text fed so far

    # -- the verbs --------------------------------------------------------------------------

    def feed(self, token_id: int, text: str, starts_call: bool | None = None) -> list[Delta]:
        """One generated token: its id, then its text. Returns the deltas now certain.
        `starts_call` (with grammar_calls): whether the grammar started a call with this token
        (None: not known, the text decides)."""
        self._check_open("feed")
        if token_id in self._stops:
            return []
        if self._grammar_calls:
            self._fed += len(text)
            self._starts.append((self._fed, starts_call))
            while self._starts and self._starts[0][0] <= self._base:
                self._starts.popleft()  # text already classified: no opener can end in it
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
            call, self._call, self._mode = self._call, None, "content"
            sc = call.scanner
            named = [c for c in (sc.calls if sc is not None and self.stream_calls else []) if c[0] is not None]
            if named:  # cut inside a call: it stays a call, its arguments as far as written
                for name, args, done in named:
                    self._add_call(ToolCall(name, args, complete=done and args != ""))
            else:
                self._emit("content", call.opener + call.text)
        self._closed = True
        r = self._result
        if not r.content.strip():
            r.content = ""
        return self._take()

    def cancel(self) -> None:
        """A cancelled or failed request: held text and any unclosed call are discarded."""
        self._buf, self._call = "", None
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
                end = self._base + len(text)  # (after _consume(at): _base is the opener's offset)
                self._consume(len(text))
                if what in ("json_trigger", "call_open") and not self._grammar_started(end):
                    self._ordinary_all(text)  # the grammar started no call here: the text is a part's
                elif not self._on_delimiter(what, text):
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
                        end = self._base + len(d.text)
                        self._consume(len(d.text))
                        if d.role == "call_open" and self._mode == "content" and not self._grammar_started(end):
                            self._ordinary_all(d.text)  # the token inside another tagged part: text
                        elif not self._on_delimiter(d.role, d.text, token=True):
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
        elif mode in ("hermes", "json", "pythonic"):
            return self._read_call(text)
        elif self.format == "pythonic" and self._at_start and text.lstrip()[:1] == "[":
            # a pythonic call list is the content: it starts the output (auto or required)
            start = len(text) - len(text.lstrip())
            self._emit("content", text[:start])
            self._reasoning_done = True
            self._start_call("pythonic", "")
            return start + self._read_call(text[start:])
        elif self._json_like and self.required and self._at_start and text.lstrip()[:1] in ("{", "["):
            # tool_choice "required": the content is the call (or an array of calls).
            start = len(text) - len(text.lstrip())
            self._emit("content", text[:start])
            self._start_call("json", "")
            return start + self._read_call(text[start:])
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
                self._read_call(text)
                return True
            return False
        if mode == "hermes" and what == "call_close":
            try:
                read_json(self._call.text)
            except ValueError:
                return False  # inside the arguments (a close tag in a string): text
            self._end_call(text)
            return True
        return False

    def _grammar_started(self, end: int) -> bool:
        """With grammar_calls: whether the token whose text holds offset `end - 1` (the last
        character of a call's opener) started a call in the grammar."""
        if not self._grammar_calls:
            return True
        while self._starts and self._starts[0][0] < end:
            self._starts.popleft()  # texts wholly before this opener: no later opener ends there
        return not self._starts or self._starts[0][1] is not False

    def _start_call(self, mode: str, opener: str) -> None:
        self._mode, self._at_start = mode, False
        keys = ("name", "arguments") if mode == "hermes" else self._keys
        self._call = CallBody(mode, opener, keys, len(self._result.tool_calls), self.text_tools)

    def _read_call(self, text: str) -> int:
        """Feed text to the call being read; returns the characters taken (up to the end of a
        JSON value or a pythonic list, where the call ends; all of it for Hermes, whose close
        delimiter ends it)."""
        n, ended = self._call.add(text)
        pieces = self._call.pieces()
        if self.stream_calls:
            self._out += pieces
        if ended:
            self._end_call("")
        return n

    def _end_call(self, closer: str) -> None:
        body, self._call = self._call, None
        pythonic = body.mode == "pythonic"
        calls = (parse_pythonic(body.text) if pythonic
                 else parse_calls(body.text, body.mode, self._keys, self.text_tools))
        self._mode = "content"
        if calls is None:
            self._emit("content", body.opener + body.text + closer)  # not a call of this format: content
            return
        if pythonic:
            for call in calls:
                if self.stream_calls:
                    k = len(self._result.tool_calls)
                    self._out += [Delta("call_name", call.name, index=k), Delta("call_args", call.arguments, index=k)]
                self._add_call(call)
            return
        read = body.scanner.calls
        for k, call in enumerate(calls):
            # the arguments as written (what a stream sent), where the scanner read an object
            if k < len(read) and read[k][2] and read[k][0] == call.name:
                call = ToolCall(call.name, read[k][1])
            self._add_call(call)

    def _add_call(self, call: ToolCall) -> None:
        self._out.append(Delta("tool_call", call=call, index=len(self._result.tool_calls)))
        self._result.tool_calls.append(call)
