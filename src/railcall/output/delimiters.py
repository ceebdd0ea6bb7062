"""The model contract's delimiters, resolved per vocabulary, and the texts that start a call.

`Delimiters` is built once per model: the reasoning open/close and tool-call open/close strings,
each resolved against the vocabulary to the one token that spells it, or to None when no such
token exists (then it is matched by its text). The output parser and the grammar regions
(`railcall.runtime.regions`) read the same object, so they never disagree on what ends reasoning
or starts a call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

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
    the Vocabulary), read-only, shared by every OutputParser and every turn matcher.

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
