"""Generated tokens -> OpenAI message parts: content, tool calls, logprobs, and stream deltas.

Built per request (`Assembler`). The engine hands it each generated step as it happens; it
answers with the deltas to stream, and at the end builds the message. The grammar has already
guaranteed the shape of a call, so reading one back is a scan, not a parse that can fail:

    {"tool":"calc","args":{"expr":"17*23"}}          one call (JSON format, SmolLM2)
    [{"tool":"a","args":{...}},{"tool":"b",...}]     parallel calls
    {"name":"calc","arguments":{...}}                 Hermes format (its tags are special tokens,
                                                      which add no text)

A call's name is streamed once its closing quote is written (the grammar commits to a name only
then); its arguments are streamed as they grow, and `function.arguments` is exactly the text of
the arguments object the model wrote.
"""

from __future__ import annotations

import codecs
import json
import secrets

from railcall.decode import Generation, Step


def call_id() -> str:
    return "call_" + secrets.token_hex(12)


def scan_calls(text: str, name_key: str, args_key: str) -> list[dict]:
    """The calls in `text` so far: [{"name": str | None, "args": str, "done": bool}, ...].

    `text` is a prefix of grammar-made output, so every call has the exact shape
    `{"<name_key>":"<name>","<args_key>":<value>}`; separators between calls (`[`, `,`, `]`,
    whitespace) are skipped."""
    head = '{"%s":"' % name_key
    mid = '","%s":' % args_key
    calls = []
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] in "[,] \n\t\r":
            i += 1
        if i >= n:
            break
        if not text.startswith(head, i):
            break  # only a prefix of `head` so far
        i += len(head)
        j = i
        while j < n and text[j] != '"':
            j += 2 if text[j] == "\\" else 1
        if j >= n:
            calls.append({"name": None, "args": "", "done": False})
            break
        name = json.loads('"' + text[i:j] + '"')
        i = j
        if not text.startswith(mid, i):
            calls.append({"name": name if len(text) - i >= len(mid) else None, "args": "", "done": False})
            break
        i += len(mid)
        start, depth, in_str, k = i, 0, False, i
        while k < n:
            ch = text[k]
            if in_str:
                if ch == "\\":
                    k += 1
                elif ch == '"':
                    in_str = False
            elif ch == '"':
                in_str = True
            elif ch in "{[":
                depth += 1
            elif ch in "}]":
                depth -= 1
                if depth == 0:
                    k += 1
                    break
            k += 1
        args = text[start:min(k, n)]
        if depth == 0 and k < n and text[k] == "}":
            calls.append({"name": name, "args": args, "done": True})
            i = k + 1
            continue
        calls.append({"name": name, "args": args, "done": False})
        break
    return calls


class Assembler:
    """Per request: steps in, OpenAI deltas and the final message out."""

    def __init__(self, vocab, kind: str, keys: tuple[str, str] = ("tool", "args"), *,
                 stop: tuple[str, ...] = (), logprobs: bool = False, top_logprobs: int = 0):
        self.vocab = vocab
        self.kind = kind  # "text" | "json" | "tools" | "auto"
        self.keys = keys
        self.holdback = max((len(s) for s in stop), default=1) - 1
        self.logprobs = logprobs
        self.top_logprobs = top_logprobs
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""
        self.sent_content = 0  # characters of content already streamed
        self.sent_calls: list[dict] = []  # per call: {"id", "named": bool, "args": int}
        self.mode = {"text": "content", "json": "content", "tools": "calls"}.get(kind)  # auto: decided later

    # -- streaming ---------------------------------------------------------------------------
    def feed(self, step: Step) -> list[dict]:
        """Deltas for one generated step (possibly none)."""
        if 0 <= step.token < self.vocab.size and not self.vocab.special[step.token]:
            self.text += self._decoder.decode(self.vocab.token_bytes[step.token])
        return self._deltas(final=False)

    def finish(self, gen: Generation) -> list[dict]:
        """The deltas that remain once generation ended (the text is now final)."""
        self.text = gen.text
        return self._deltas(final=True)

    def _decide(self, final: bool) -> None:
        if self.mode is not None:
            return
        head = '{"%s":"' % self.keys[0]
        t = self.text.lstrip("[")
        if t.startswith(head) and self.text.startswith(("[", "{")):
            self.mode = "calls"
        elif final or not head.startswith(t):
            self.mode = "content"

    def _deltas(self, final: bool) -> list[dict]:
        self._decide(final)
        if self.mode == "content":
            end = len(self.text) if final else max(self.sent_content, len(self.text) - self.holdback)
            if end > self.sent_content:
                piece = self.text[self.sent_content:end]
                self.sent_content = end
                return [{"content": piece}]
            return []
        if self.mode == "calls":
            out = []
            for i, c in enumerate(scan_calls(self.text, *self.keys)):
                if c["name"] is None:
                    break
                if i == len(self.sent_calls):
                    self.sent_calls.append({"id": call_id(), "args": 0})
                    out.append({"tool_calls": [{"index": i, "id": self.sent_calls[i]["id"], "type": "function",
                                                "function": {"name": c["name"], "arguments": ""}}]})
                sent = self.sent_calls[i]
                if len(c["args"]) > sent["args"]:
                    out.append({"tool_calls": [{"index": i, "function": {"arguments": c["args"][sent["args"]:]}}]})
                    sent["args"] = len(c["args"])
            return out
        return []

    # -- the whole message ---------------------------------------------------------------------
    def message(self, gen: Generation) -> dict:
        """The assistant message of a finished generation (non-streaming responses)."""
        self.text = gen.text
        self._decide(final=True)
        msg = {"role": "assistant", "content": None, "tool_calls": None}
        if self.mode == "calls":
            calls = scan_calls(gen.text, *self.keys)
            ids = [c["id"] for c in self.sent_calls]
            msg["tool_calls"] = [{"id": ids[i] if i < len(ids) else call_id(), "type": "function",
                                  "function": {"name": c["name"] or "", "arguments": c["args"]}}
                                 for i, c in enumerate(calls) if c["name"] is not None]
        else:
            msg["content"] = gen.text
        return msg

    def has_calls(self) -> bool:
        return self.mode == "calls"

    # -- logprobs ---------------------------------------------------------------------------------
    def logprob_entry(self, step: Step) -> dict:
        def one(tok, lp):
            data = self.vocab.token_bytes[tok] if 0 <= tok < self.vocab.size else b""
            text = self.vocab.token_text(tok) if 0 <= tok < self.vocab.size else ""
            return {"token": text, "logprob": lp, "bytes": list(data)}

        # A token the grammar wrote at the token ceiling (finish) has no sampled logprob; the
        # grammar allowed only it, so under the masked distribution it is certain.
        entry = one(step.token, step.logprob if step.logprob is not None else 0.0)
        entry["top_logprobs"] = [one(t, lp) for t, lp in (step.top or [])[: self.top_logprobs]]
        return entry
