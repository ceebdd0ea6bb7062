"""Scripted token streams for the output and region tests.

A test double, said plainly: instead of a model, these helpers emit *given* token ids (a
scripted backend), with the text a streaming detokenizer would produce for each. That is what
the parser and the region matchers consume, so the tests drive them exactly as decoding would,
without a model and in milliseconds.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass

from railcall.vocab import Vocabulary, single_token


@dataclass(frozen=True)
class Tok:
    """A delimiter *generated as its token* (where the vocabulary has one; else it is spelled)."""

    text: str


TAGS = ("<think>", "</think>", "<tool_call>", "</tool_call>")
_TAG = re.compile("(" + "|".join(map(re.escape, TAGS)) + ")")


def script(vocab: Vocabulary, *parts) -> list[int]:
    """Token ids for `parts`: strings are spelled in ordinary text tokens and never with a
    delimiter's own token (so `"</think>"` is `<`, `/think>` ... pieces, also where the tag is an
    ordinary token, as Qwen's are), `Tok(...)` is the delimiter's own token."""
    ids: list[int] = []
    for p in parts:
        if isinstance(p, Tok):
            tid = single_token(vocab, p.text)
            if tid is not None:
                ids.append(tid)
                continue
            p = p.text
        # a tag in the text is cut after its `<`: no piece contains the whole tag
        pieces = [q for piece in _TAG.split(p) for q in ([piece[:1], piece[1:]] if piece in TAGS else [piece]) if q]
        for piece in pieces:
            toks = vocab.greedy_tokenize(piece.encode("utf-8"))
            assert toks is not None, f"{piece!r} cannot be spelled in {vocab.name}"
            ids.extend(toks)
    return ids


def detokenize(vocab: Vocabulary, ids):
    """(id, text) per step, as an incremental detokenizer with skip_special_tokens=False gives
    them: special tokens as their text, a UTF-8 character split across tokens once complete, and
    one left incomplete before a special token as a replacement character before it (as the
    server's Assembler feeds it)."""
    dec = codecs.getincrementaldecoder("utf-8")("replace")
    for i in ids:
        if vocab.is_special(i):
            tail = dec.decode(b"", final=True)
            if tail:
                yield -1, tail
            yield i, vocab.special_text[i]
        else:
            yield i, dec.decode(vocab.token_bytes[i])


def multi_token_vocab() -> Vocabulary:
    """Every byte a token, a few pieces, and no delimiter tokens: every delimiter is spelled."""
    pieces = [bytes([b]) for b in range(256)] + [b"</", b"think", b"tool", b"_call", b'{"', b'":"', b"ab"]
    return Vocabulary.from_pieces(pieces, specials=["<|end|>"], stop=["<|end|>"], name="multi")


class ScriptedIds:
    """A backend test double that follows a script of token ids: each row of logits (`_row`, by
    the subclass) prefers the script's next id. `start` begins the script, `feed` steps through it."""

    script: list[int]
    pos: int = 0

    def start(self, prompt):
        self.pos = 0
        return self._row()

    def feed(self, tokens):
        import torch

        rows = []
        for _ in tokens:
            self.pos += 1
            rows.append(self._row())
        return torch.stack(rows)
