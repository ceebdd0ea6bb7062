"""Generated steps -> OpenAI message parts: reasoning_content, content, tool calls, logprobs.

Built per request (`Assembler`), around `railcall.output.OutputParser`, which splits the turn
into reasoning, content and calls with the same delimiters the grammar regions use. The
Assembler adds what is OpenAI's: call ids, the delta shapes of a `chat.completion.chunk`, the
logprobs entries, and stop strings.

- Stop strings (free text only): `decode.generate` ends at the token that completes the first
  one. While streaming, the last `len(longest stop) - 1` characters of content are held back,
  so a stop string's first characters are never sent before it is known whether it completes,
  and content ends where the first stop string starts.
- Tool calls are streamed as OpenAI streams them: once the name is complete, a `tool_calls`
  delta with index, id, type, the name and empty arguments; then the arguments in pieces as the
  model writes them (`function.arguments` fragments under the same index). The pieces add up to
  the non-streamed `arguments` exactly. Where no grammar holds the output (tool_choice "none"),
  nothing is a call. A call cut by max_tokens keeps its name and its arguments as far as they
  were written (not valid JSON: no client runs it), with finish_reason "length".
- A custom tool's call (a tool of `{"type": "custom"}`, whose input is one text) is OpenAI's
  `{"type": "custom", "custom": {"name", "input"}}`, its input decoded from the call's JSON
  string. Streamed, its input arrives as `custom.input` pieces that add up to the whole; a
  piece never ends inside an escape. A custom call cut by max_tokens keeps its input as far as
  it was written, with finish_reason "length".
"""

from __future__ import annotations

import codecs
import json
import secrets

from railcall.errors import RequestError
from railcall.runtime.decode import Generation, Step
from railcall.output import Delimiters, Delta, OutputParser


def call_id() -> str:
    return "call_" + secrets.token_hex(12)


def finish_reason(gen: Generation, asm: "Assembler") -> str:
    """OpenAI's finish_reason of one choice: length, tool_calls or stop. Where the ceiling ended
    the output after the grammar accepted it (every call whole, closed by the model's own tokens
    under on_length "fit"), the calls are what was asked for: tool_calls. A call the ceiling cut,
    or one the grammar closed by writing its values ("close"), is "length"."""
    if gen.truncated or gen.cut or (gen.finish_reason == "length" and not asm.has_calls()):
        return "length"
    return "tool_calls" if asm.has_calls() else "stop"


def grammar_failure(gen: Generation) -> RequestError | None:
    """The error to answer instead of an output the grammar could not finish (a dead end, or a
    cut answer with no completion): never a broken call or answer with a normal finish_reason."""
    if not gen.grammar_error:
        return None
    return RequestError(
        f"the output could not be completed under the request's tools or response_format: "
        f"{gen.grammar_error}. The schema describes a value railcall cannot finish (nested too deep, "
        f"or longer than max_tokens allows); simplify the schema or raise max_tokens",
        code="grammar_dead_end")


def generation_failed(value) -> RequestError:
    """The error a failed generation (an exception from the decode loop) is answered with."""
    if isinstance(value, RequestError):
        return value
    return RequestError(f"generation failed: {type(value).__name__}: {value}", status=500, type="server_error")


def input_text(call) -> str:
    """A custom call's input: its JSON string decoded; a call cut inside the string, as far as
    it was written (`InputText`'s reading)."""
    if call.complete:
        return call.input
    return InputText().feed(call.arguments, None)  # as far as it decodes


class InputText:
    """A custom call's JSON string, decoded as its raw pieces arrive: `feed` returns the input
    text that became certain, never stopping inside an escape (or between the two halves of an
    escaped surrogate pair). Only the raw text not yet decoded is kept and read again."""

    def __init__(self):
        self.pending = ""  # raw text after the opening quote, from the first escape not yet decoded
        self.opened = False
        self.sent = 0  # characters of the decoded input handed out

    def feed(self, piece: str | None, call=None) -> str:
        """The next raw piece (None: the call ended; `call` its ToolCall) -> the decoded text
        not yet handed out."""
        if call is not None and call.complete:
            text = call.input
            out, self.sent = text[self.sent:], len(text)
            return out
        if piece:
            if not self.opened:
                piece, self.opened = piece[1:] if piece.startswith('"') else piece, True
            self.pending += piece
        text, used = self._decoded(self.pending)
        self.pending = self.pending[used:]
        self.sent += len(text)
        return text

    @staticmethod
    def _decoded(raw: str) -> tuple[str, int]:
        """(the longest decodable start of `raw` decoded, the raw characters it took): `raw` is a
        JSON string's inside from an escape boundary on, perhaps with its closing quote; an
        escape or a surrogate pair still being written is left for later."""
        end = len(raw)
        if raw.endswith('"') and not _escaped_end(raw[:-1]):
            end -= 1
        for cut in range(end, max(end - 12, 0) - 1, -1):
            try:
                text = json.loads('"' + raw[:cut] + '"')
            except ValueError:
                continue
            if text and "\ud800" <= text[-1] <= "\udbff":  # a high surrogate: its pair is on its way
                continue
            return text, cut
        return "", 0


def _escaped_end(raw: str) -> bool:
    """Does `raw` end inside an escape (an odd run of backslashes at its end)?"""
    return (len(raw) - len(raw.rstrip("\\"))) % 2 == 1


class Assembler:
    """Per request: steps in, OpenAI deltas and the final message out."""

    def __init__(self, served, plan):
        self.vocab = served.vocab
        self.custom = frozenset(t.name for t in getattr(plan, "tools", ()) if t.custom)  # custom tools' names
        self.inputs: dict[int, InputText] = {}  # call index -> a custom call's input, decoded as it streams
        self._grammar_calls = False
        if getattr(plan, "plain", False):  # /v1/completions: all text, no delimiters read
            self.parser = OutputParser(Delimiters(), call_format=None, tool_choice="none", stop_ids=self.vocab.stop_ids)
        else:
            fmt = (getattr(plan, "call_format", None) or served.call_format) if plan.tool_choice != "none" else None
            # beside a structural tag's parts, a call is where the grammar started one (tag 0 of
            # the turn), not wherever its trigger is spelled (inside a part's JSON, say)
            self._grammar_calls = getattr(plan, "tags", None) is not None and plan.tool_choice == "auto"
            self.parser = OutputParser(served.delimiters, call_format=fmt, tool_choice=plan.tool_choice,
                                       stop_ids=self.vocab.stop_ids,
                                       stream_calls=getattr(plan, "grammar", None) is not None,
                                       text_tools=self.custom, grammar_calls=self._grammar_calls)
        self.stops = tuple(plan.params.stop)
        self.holdback = max((len(s) for s in self.stops), default=1) - 1
        self.top_logprobs = plan.top_logprobs
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.content = ""  # all content the parser released
        self.sent = 0  # characters of it already streamed
        self.ids: list[str] = []  # call ids, by index
        self.args_sent: dict[int, int] = {}  # call index -> characters of its arguments streamed

    # -- streaming ---------------------------------------------------------------------------
    def feed(self, step: Step) -> list[dict]:
        """Deltas for one generated step (possibly none)."""
        t = step.token
        deltas = []
        if 0 <= t < self.vocab.size and self.vocab.special[t]:
            # A special token ends a character left incomplete before it: its bytes are text
            # before the token (a replacement character), so a <tool_call> or </think> token's
            # text arrives whole, where the parser expects it.
            tail = self._decoder.decode(b"", final=True)
            if tail:
                deltas += self.parser.feed(-1, tail)
            text = "" if t in self.vocab.stop_ids else self.vocab.special_text.get(t, "")
        elif 0 <= t < self.vocab.size:
            text = self._decoder.decode(self.vocab.token_bytes[t])
        else:
            text = ""
        starts = (step.tag == 0) if self._grammar_calls else None
        return self._convert(deltas + self.parser.feed(t, text, starts), self.holdback)

    def finish(self, gen: Generation) -> list[dict]:
        """The deltas that remain once generation ended."""
        deltas = []
        tail = self._decoder.decode(b"", final=True)
        if tail:
            deltas += self.parser.feed(-1, tail)
        deltas += self.parser.finish()
        out = self._convert(deltas, 0, flush=False)
        self.content = self.content[: self._stop_at()]
        if len(self.content) > self.sent:
            out.append({"content": self.content[self.sent:]})
            self.sent = len(self.content)
        return out

    def cancel(self) -> None:
        self.parser.cancel()

    def _stop_at(self) -> int:
        """Where content ends: at the first stop string in it (decode stops at the token that
        completes one, whose text the parser has already released)."""
        hits = [i for i in (self.content.find(s) for s in self.stops) if i >= 0]
        return min(hits, default=len(self.content))

    def _convert(self, deltas: list[Delta], holdback: int, flush: bool = True) -> list[dict]:
        out = []
        for d in deltas:
            if d.kind == "reasoning":
                out.append({"reasoning_content": d.text})
            elif d.kind == "content":
                self.content += d.text
                if flush:
                    end = min(len(self.content) - holdback, self._stop_at())
                    if end > self.sent:
                        out.append({"content": self.content[self.sent:end]})
                        self.sent = end
            else:
                if len(self.content) > self.sent:  # content before a call goes first
                    out.append({"content": self.content[self.sent:]})
                    self.sent = len(self.content)
                while len(self.ids) <= d.index:
                    self.ids.append(call_id())
                i = d.index
                if d.kind == "call_name" and d.text in self.custom:
                    self.inputs[i] = InputText()
                    out.append({"tool_calls": [{"index": i, "id": self.ids[i], "type": "custom",
                                                "custom": {"name": d.text, "input": ""}}]})
                elif i in self.inputs:  # the pieces of a custom call's input, decoded
                    piece = self.inputs[i].feed(d.text if d.kind == "call_args" else None, d.call)
                    if piece:
                        out.append({"tool_calls": [{"index": i, "custom": {"input": piece}}]})
                elif d.kind == "tool_call" and d.call.name in self.custom:  # not streamed in pieces: whole
                    self.inputs[i] = InputText()
                    out.append({"tool_calls": [{"index": i, "id": self.ids[i], "type": "custom",
                                                "custom": {"name": d.call.name, "input": input_text(d.call)}}]})
                elif d.kind == "call_name":
                    self.args_sent[i] = 0
                    out.append({"tool_calls": [{"index": i, "id": self.ids[i], "type": "function",
                                                "function": {"name": d.text, "arguments": ""}}]})
                elif d.kind == "call_args":
                    self.args_sent[i] += len(d.text)
                    out.append({"tool_calls": [{"index": i, "function": {"arguments": d.text}}]})
                elif i in self.args_sent:  # streamed in pieces: only what is left
                    rest = d.call.arguments[self.args_sent[i]:]
                    self.args_sent[i] += len(rest)
                    if rest:
                        out.append({"tool_calls": [{"index": i, "function": {"arguments": rest}}]})
                else:
                    self.args_sent[i] = len(d.call.arguments)
                    out.append({"tool_calls": [{"index": i, "id": self.ids[i], "type": "function",
                                                "function": {"name": d.call.name, "arguments": d.call.arguments}}]})
        return out

    # -- the whole message ---------------------------------------------------------------------
    def message(self) -> dict:
        """The assistant message, after `finish()`."""
        r = self.parser.result()
        while len(self.ids) < len(r.tool_calls):
            self.ids.append(call_id())
        calls = [{"id": self.ids[i], "type": "custom", "custom": {"name": c.name, "input": input_text(c)}}
                 if c.name in self.custom else
                 {"id": self.ids[i], "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                 for i, c in enumerate(r.tool_calls)]
        content = self.content if self.content.strip() or not calls else None
        return {"role": "assistant", "content": content, "reasoning_content": r.reasoning_content or None,
                "tool_calls": calls or None}

    def has_calls(self) -> bool:
        return bool(self.parser.result().tool_calls)

    # -- logprobs ---------------------------------------------------------------------------------
    def logprob_entry(self, step: Step) -> dict:
        def one(tok, lp):
            inside = 0 <= tok < self.vocab.size
            return {"token": self.vocab.token_text(tok) if inside else "", "logprob": lp,
                    "bytes": list(self.vocab.token_bytes[tok]) if inside and not self.vocab.special[tok] else []}

        # A token the grammar wrote at the token ceiling (finish) has no sampled logprob; the
        # grammar allowed only it, so under the masked distribution it is certain.
        entry = one(step.token, step.logprob if step.logprob is not None else 0.0)
        entry["top_logprobs"] = [one(t, lp) for t, lp in (step.top or [])[: self.top_logprobs]]
        return entry
