"""A Turn (railcall.grammar.turn) compiled against a vocabulary, and its per-request matcher.

`compiled_turn(turn, vocab)` resolves the turn's delimiters and token triggers to ids, compiles
each grammar (`compiled_grammar`, shared), builds one search automaton over the triggers' texts,
and checks that each tag's grammar starts with its trigger. `TurnMatcher(compiled)` runs one
request through the turn's phases behind the Matcher verbs, so a decode loop cannot tell it from
a Matcher:

    [open] [reasoning close]  ( grammar  |  free ( trigger grammar free )* )

The grammars run on an ordinary `Matcher`; the free phases (reasoning, content) are masks
precomputed once per vocabulary: every non-special text token but the delimiter tokens, plus
the phase's exit tokens, plus the stop tokens where the turn may end.

- Reasoning ends only at the close delimiter's *token*. A `</think>` spelled in pieces inside
  reasoning is reasoning text and does not end it. Where the close is not one token (SmolLM2),
  its text ends reasoning.
- Inside a grammar, a special delimiter token is ordinary text: legal wherever its text is, and
  moves the grammar by its text. Banning it would push a model that generates the `</think>`
  token inside a JSON string (Qwen does) to substitute something else; the reader returns it as
  text, so a structured answer may contain the tag.
- A text trigger is found anywhere in free text, with JSON whitespace at its gaps. A token whose
  text completes a trigger hands the trigger's compact text and what follows it in the token to
  the tag's grammar, and is legal only if that is a legal start of the grammar. A token trigger
  is the one token: its token is handed to the grammar.

Lifecycle: the per-vocabulary masks and trigger tables are cached on the Vocabulary; a
CompiledTurn is cached per (turn, vocabulary, string cap); a TurnMatcher is per request and cheap.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import numpy as np

from railcall.bitmask import bitmask_words, pack_ids
from railcall.errors import GrammarError, MatcherError
from railcall.grammar import ir
from railcall.grammar.turn import Free, Turn
from railcall.matcher.matcher import MAX_STRING, CompiledGrammar, Matcher, compiled_grammar, current_store
from railcall.matcher.transitions import DEAD
from railcall.vocab import Vocabulary, single_token


# -- per-vocabulary tables -----------------------------------------------------------------------


def _cache(vocab: Vocabulary) -> dict:
    return vocab._extra.setdefault("turns", {})


def text_token_mask(vocab: Vocabulary) -> np.ndarray:
    """(words,) int32: every non-special token that adds text. Once per vocabulary."""
    c = _cache(vocab)
    hit = c.get("text")
    if hit is None:
        ids = np.flatnonzero((vocab.lengths > 0) & ~vocab.special)
        hit = c["text"] = pack_ids(ids, vocab.logits_width)
    return hit


WS_BYTES = b" \t\n\r"


def _search_dfa(triggers: tuple) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int]]]:
    """A search automaton for any of `triggers` ((text bytes, gaps), ...) anywhere in a text,
    with any run of JSON whitespace allowed before the positions in each one's gaps: (table
    (states, 256) int32; per state the trigger it has found, or -1; per state (trigger, position)
    of its furthest partial match). State 0 is "nothing matched"; one trigger without gaps gives
    the KMP automaton. Subset construction over (trigger, position) pairs: a handful of states
    for a few short triggers."""
    start = frozenset((i, 0) for i in range(len(triggers)))
    sets = {start: 0}
    order = [start]
    rows: list[np.ndarray] = []
    i = 0
    while i < len(order):
        cur = order[i]
        row = np.zeros(256, dtype=np.int32)
        for b in range(256):
            nxt = set(start)
            for t, p in cur:
                text, gaps = triggers[t]
                if p == len(text):
                    continue
                if text[p] == b:
                    nxt.add((t, p + 1))
                elif p in gaps and b in WS_BYTES:
                    nxt.add((t, p))
            done = [t for t, p in nxt if p == len(triggers[t][0])]
            key = frozenset([(min(done), len(triggers[min(done)][0]))]) if done else frozenset(nxt)
            if key not in sets:  # a found state is terminal: the search stops there
                sets[key] = len(order)
                order.append(key)
            row[b] = sets[key]
        rows.append(row)
        i += 1
    found = np.array([next((t for t, p in st if p == len(triggers[t][0])), -1) for st in order], dtype=np.int32)
    furthest = [max(st, key=lambda tp: (tp[1], -tp[0])) for st in order]
    return np.stack(rows), found, furthest


class TriggerIndex:
    """For some triggers (each a text, and where JSON whitespace may stand inside it) and one
    vocabulary: which tokens complete a trigger from each partial match, which trigger, and where
    in the token it completes. Built once per (vocabulary, triggers).

    Only tokens containing a trigger's last byte can complete it, so the walk looks at those (a
    few hundred in a 49k vocabulary), through the search automaton, one numpy step per byte.
    """

    def __init__(self, vocab: Vocabulary, triggers: tuple):
        self.triggers = triggers
        self.table, self.found, self._furthest = _search_dfa(triggers)
        self._rows, self._found = self.table.tolist(), self.found.tolist()  # for byte-at-a-time steps
        B = vocab.byte_matrix  # (max_len, V) uint8
        lens = vocab.lengths
        inside = np.arange(B.shape[0])[:, None] < lens[None, :]
        has_last = np.zeros(B.shape[1], dtype=bool)
        for text, _ in triggers:
            has_last |= ((B == text[-1]) & inside).any(axis=0)
        self.candidates = np.flatnonzero(has_last & ~vocab.special & (lens > 0))
        self._by_start: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self.vocab = vocab

    def rest(self, k: int) -> bytes:
        """The shortest text that completes a trigger from state k (the furthest matched one)."""
        t, p = self._furthest[k]
        return self.triggers[t][0][p:]

    def completing(self, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ids, end, which): tokens that complete a trigger from partial match `k`, the byte
        offset in each token just after the trigger, and the trigger each completes."""
        hit = self._by_start.get(k)
        if hit is None:
            ids = self.candidates
            lens = self.vocab.lengths[ids]
            B = self.vocab.byte_matrix[:, ids]
            state = np.full(ids.size, k, dtype=np.int32)
            end = np.zeros(ids.size, dtype=np.int64)
            for j in range(B.shape[0]):
                live = (end == 0) & (lens > j)
                if not live.any():
                    break
                state = np.where(live, self.table[state, B[j]], state)
                end[live & (self.found[state] >= 0)] = j + 1
            done = end > 0
            hit = self._by_start[k] = (ids[done], end[done], self.found[state[done]])
        return hit

    def advance(self, k: int, data: bytes) -> tuple[int, int, int]:
        """(new partial match, offset just after a trigger or -1, which trigger or -1) after
        `data` from `k`."""
        rows, found = self._rows, self._found
        for i, b in enumerate(data):
            k = rows[k][b]
            if found[k] >= 0:
                return k, i + 1, found[k]
        return k, -1, -1


def trigger_index(vocab: Vocabulary, triggers: tuple) -> TriggerIndex:
    c = _cache(vocab).setdefault("triggers", {})
    hit = c.get(triggers)
    if hit is None:
        hit = c[triggers] = TriggerIndex(vocab, triggers)
    return hit


def _prefix_tokens(vocab: Vocabulary, rest: bytes) -> np.ndarray:
    """(words,) int32: every text token whose bytes are a non-empty prefix of `rest` -- all of
    them, where several tokens spell the same bytes (Gemma's `k` and its byte token `<0x6B>`):
    the tokenizer's own encoding of `rest`, which forced_tokens() returns, is among them."""
    c = _cache(vocab).setdefault("prefix", {})
    hit = c.get(rest)
    if hit is None:
        look, dups = vocab.lookup, vocab.duplicates
        ids = []
        for j in range(1, min(len(rest), vocab.max_token_len) + 1):
            t = look.get(rest[:j])
            if t is not None:
                ids.append(t)
                ids.extend(dups.get(rest[:j], ()))
        hit = c[rest] = pack_ids(ids, vocab.logits_width)
    return hit


# -- phases ----------------------------------------------------------------------------------------


def _count(mask: np.ndarray) -> int:
    """How many tokens a mask allows."""
    return int(np.bitwise_count(mask.view(np.uint32)).sum())


class _Illegal(Exception):
    pass


@dataclass(frozen=True)
class _FreeSpec:
    """A free-text phase's configuration (shared by every phase made from it)."""

    key: tuple  # names the phase (the triggers and their grammars)
    exit_tokens: dict  # token id -> (what it hands over: the tag it starts, or None; hand the token itself on)
    triggers: tuple  # text exits: ((text bytes, gaps), ...), or ()
    handed: tuple  # per text exit: (the tag it starts or None, the bytes handed to it before the remainder)
    stops: bool  # the turn may end here
    budget: int | None  # tokens before the exit is forced
    remainder_ok: tuple  # per text exit: is this legal right after the trigger? (None: anything)
    controls: frozenset = frozenset()  # delimiter tokens, never free text (only an exit here)

    def __post_init__(self):
        # what the base mask depends on (one mask per distinct exit set, shared across turns)
        object.__setattr__(self, "base_key", (frozenset(self.exit_tokens), self.stops, self.controls))
        # this spec's masks: "base", and per partial trigger match the tokens it bans (a spec
        # lives as long as its CompiledTurn, whose LRU bounds them)
        object.__setattr__(self, "memo", {})


class _Free:
    """Free text (reasoning or content) until an exit token, a trigger text, or a stop token."""

    kind = "free"

    def __init__(self, vocab: Vocabulary, spec: _FreeSpec):
        self.vocab, self.spec = vocab, spec
        self.count = 0  # tokens consumed (for the budget)
        self.k = 0  # how much of a trigger text is matched at the end of the text so far
        self.index = trigger_index(vocab, spec.triggers) if spec.triggers else None

    def snapshot(self):
        return (self.count, self.k)

    def restore(self, snap) -> None:
        self.count, self.k = snap

    def copy(self) -> "_Free":
        other = _Free.__new__(_Free)
        other.__dict__.update(self.__dict__)
        return other

    def _base(self) -> np.ndarray:
        hit = self.spec.memo.get("base")
        if hit is not None:
            return hit
        c = _cache(self.vocab).setdefault("free", {})
        key = self.spec.base_key
        hit = c.get(key)
        if hit is None:
            extra = list(self.spec.exit_tokens) + (list(self.vocab.stop_ids) if self.spec.stops else [])
            hit = text_token_mask(self.vocab)
            if self.spec.controls:
                hit = hit & ~pack_ids(list(self.spec.controls), self.vocab.logits_width)
            hit = hit | pack_ids(extra, self.vocab.logits_width)
            c[key] = hit
        self.spec.memo["base"] = hit
        return hit

    def _banned(self, k: int) -> np.ndarray | None:
        """Tokens that complete a trigger from `k` with a remainder its next phase rejects."""
        if self.index is None:
            return None
        memo = self.spec.memo
        if k in memo:
            return memo[k]
        ids, ends, which = self.index.completing(k)
        tb, ok = self.vocab.token_bytes, self.spec.remainder_ok
        bad = [int(t) for t, e, w in zip(ids, ends, which) if ok[w] is not None and not ok[w](tb[t][e:])]
        hit = memo[k] = pack_ids(bad, self.vocab.logits_width) if bad else None
        return hit

    def exhausted(self) -> bool:
        return self.spec.budget is not None and self.count >= self.spec.budget

    def forced(self) -> list[int]:
        return self.exit_now() if self.exhausted() else []

    def exit_now(self) -> list[int]:
        """The tokens that end this phase from here (its exit token, or the rest of its trigger)."""
        if self.spec.exit_tokens:
            return [next(iter(self.spec.exit_tokens))]
        rest = self.index.rest(self.k)
        ids = self.vocab.encode(rest.decode("utf-8"))
        return ids if ids is not None else (self.vocab.greedy_tokenize(rest) or [])

    def _mask(self, k: int) -> tuple[np.ndarray, int]:
        """(mask, legal count) at partial match `k`: the base less the tokens banned there."""
        key = ("mask", k)
        hit = self.spec.memo.get(key)
        if hit is None:
            mask = self._base()
            banned = self._banned(k)
            if banned is not None:
                mask = mask & ~banned
            hit = self.spec.memo[key] = (mask, _count(mask))
        return hit

    def fill(self, row: np.ndarray) -> int:
        if self.exhausted():
            if self.spec.exit_tokens:
                row[...] = pack_ids(list(self.spec.exit_tokens), self.vocab.logits_width)
            else:  # a text exit: the tokens that continue it
                row[...] = _prefix_tokens(self.vocab, self.index.rest(self.k))
            return _count(row)
        mask, n = self._mask(self.k)
        row[...] = mask
        return n

    def consume(self, tid: int):
        """-> "stay" | "stop" | ("exit", tag or None, token to hand on or None, bytes to hand on)."""
        spec, v = self.spec, self.vocab
        if not 0 <= tid < v.size:
            raise _Illegal(f"token {tid} is outside the vocabulary (padding)")
        if self.exhausted() and tid not in spec.exit_tokens:
            # the budget is spent: only the exit is legal (a text exit is checked below)
            if not spec.triggers or v.is_special(tid):
                raise _Illegal(f"the reasoning budget ({spec.budget} tokens) is spent: only its close is allowed")
        if tid in spec.exit_tokens:
            self.count += 1
            tag, hand_token = spec.exit_tokens[tid]
            return ("exit", tag, tid if hand_token else None, b"")
        if tid in v.stop_ids:
            if spec.stops:
                return "stop"
            raise _Illegal(f"stop token {tid} before the answer")
        if v.is_special(tid) or not v.token_bytes[tid] or tid in spec.controls:
            raise _Illegal(f"token {v.token_text(tid)} is not free text here")
        data = v.token_bytes[tid]
        if self.exhausted() and not self.index.rest(self.k).startswith(data):
            raise _Illegal(f"the reasoning budget ({spec.budget} tokens) is spent: only its close is allowed")
        return self.feed(data)

    def feed(self, data: bytes):
        """Free text bytes (a token's, or a remainder handed over by the phase before)."""
        self.count += 1
        if self.index is None:
            return "stay"
        k, end, which = self.index.advance(self.k, data)
        if end < 0:
            self.k = k
            return "stay"
        rest = data[end:]
        ok = self.spec.remainder_ok[which]
        if ok is not None and not ok(rest):
            raise _Illegal(f"text {data!r} completes {self.spec.triggers[which][0]!r} but what follows it is not allowed")
        self.k = 0
        tag, handed = self.spec.handed[which]
        return ("exit", tag, None, handed + rest)


def _tokens_starting(vocab: Vocabulary, head: bytes) -> np.ndarray:
    """The text tokens whose bytes start with `head` and go on past it. Once per (vocabulary, head)."""
    c = _cache(vocab).setdefault("starting", {})
    hit = c.get(head)
    if hit is None:
        B, lens = vocab.byte_matrix, vocab.lengths
        keep = (lens > len(head)) & ~vocab.special
        if len(head) >= B.shape[0]:
            keep[:] = False
        for j, b in enumerate(head[: B.shape[0]]):
            keep &= B[j] == b
        hit = c[head] = np.flatnonzero(keep)
    return hit


class _Span:
    """Tokens that run from a tag's end into the free text after it (`>.` after
    `</function`, `}\n` after a call): legal where the tag's grammar can only end one way (its
    forced tokens close it) and the token's rest is legal free text. Per tag, shared by the
    requests of a CompiledTurn; cached per grammar state."""

    def __init__(self, vocab: Vocabulary, accepts: Callable[[bytes], bool]):
        self.vocab, self.accepts = vocab, accepts
        self._by_state: dict[int, tuple] = {}  # state -> (the tag's forced end, extra mask) or ()

    def at(self, m: Matcher) -> tuple:
        """(the bytes that end the tag from here, the extra tokens' mask), or () where the tag
        can still end more than one way (or not within a token's length)."""
        hit = self._by_state.get(m.state)
        if hit is None:
            hit = ()
            g, c, tail = m.g, m.copy(), bytearray()
            while len(tail) < self.vocab.max_token_len and not c.is_accepting():
                allowed = np.flatnonzero(g.first_bytes(c.state))
                if allowed.size != 1 or g.specials(c.state) or not c.consume_bytes(bytes([int(allowed[0])])):
                    break
                tail.append(int(allowed[0]))
            if tail and c.is_done():
                good = [int(t) for t in _tokens_starting(self.vocab, bytes(tail))
                        if self.accepts(self.vocab.token_bytes[t][len(tail):])]
                if good:
                    hit = (bytes(tail), pack_ids(good, self.vocab.logits_width))
            self._by_state[m.state] = hit
        return hit


class _Grammar:
    """A CompiledGrammar phase (the answer, a tag's grammar, a literal open). Delimiter tokens
    that the grammar does not reference as tokens are text here: legal wherever their text is.
    A tag's grammar also takes the tokens that run past its end into free text (`_Span`)."""

    kind = "grammar"

    def __init__(self, compiled: CompiledGrammar, as_text: dict[int, bytes], span: _Span | None = None):
        self.m = Matcher(compiled)
        self.as_text = as_text  # special delimiter token id -> its text
        self.span = span

    def snapshot(self):
        return self.m.num_consumed()

    def restore(self, snap) -> None:
        self.m.rollback(self.m.num_consumed() - snap)

    def copy(self) -> "_Grammar":
        other = _Grammar.__new__(_Grammar)
        other.m, other.as_text, other.span = self.m.copy(), self.as_text, self.span
        return other

    def forced(self) -> list[int]:
        """The grammar's forced tokens (Matcher.forced_tokens leaves the last token of a forced
        run to the model where a longer token could run past its end, so a token that runs from
        the tag's end into the text is the model's choice)."""
        return self.m.forced_tokens()

    def fill(self, row: np.ndarray) -> int:
        m = self.m
        n = m.fill_bitmask(row)
        if m.is_error() or m.is_done():
            return n
        more = False
        if self.as_text:
            extra = [t for t, data in self.as_text.items() if _reaches(m.g, m.state, data)]
            if extra:
                row |= pack_ids(extra, m.g.width)
                more = True
        span = self.span
        if span is not None:
            hit = span._by_state.get(m._states[-1])
            if hit is None:
                hit = span.at(m)
            if hit:
                row |= hit[1]
                more = True
        return _count(row) if more else n

    def consume(self, tid: int):
        m = self.m
        if tid in self.as_text and tid not in m.g.specials(m.state) and not m.is_done():
            ok = m.consume_bytes(self.as_text[tid])
        else:
            ok = m.consume_token(tid)
        if not ok:
            msg = m.error_message
            m.rollback(1)
            hit = self.span.at(m) if self.span is not None and 0 <= tid < m.g.vocab.size else ()
            data = m.g.vocab.token_bytes[tid] if hit else b""
            if hit and data.startswith(hit[0]) and len(data) > len(hit[0]) and self.span.accepts(data[len(hit[0]):]):
                m.consume_bytes(hit[0])  # the tag's end; the rest is the free text's
                return ("exit", None, None, data[len(hit[0]):])
            raise _Illegal(msg)
        return "stop" if tid in m.g.vocab.stop_ids else "stay"

    def feed(self, data: bytes):
        if data and not self.m.consume_bytes(data):
            msg = self.m.error_message
            self.m.rollback(1)
            raise _Illegal(msg)
        return "stay"


def _reaches(g, s: int, data: bytes) -> bool:
    """Whether `data` is legal from state `s` of automaton `g` (its transitions are cached, so
    repeated walks are table look-ups)."""
    for b in data:
        s = g.step(s, b)
        if s == DEAD:
            return False
    return True


def starts_with(compiled: CompiledGrammar, token: int | None, data: bytes) -> Matcher | None:
    """A matcher on `compiled` after `token` and/or `data`, or None if it rejects them."""
    m = Matcher(compiled)
    if token is not None and not m.consume_token(token):
        return None
    if data and not m.consume_bytes(data):
        return None
    return m


def _remainder_check(compiled: CompiledGrammar, token: int | None, prefix: bytes, what: str) -> Callable[[bytes], bool]:
    """A check "is `rest` legal at the start of `compiled`, after `token`/`prefix`?"."""
    start = starts_with(compiled, token, prefix)
    if start is None:
        raise GrammarError(f"{what} does not start with its trigger "
                           f"{compiled.vocab.token_text(token) if token is not None else prefix.decode('utf-8', 'replace')!r}")
    g, s0 = start.g, start.state
    return lambda rest: _reaches(g, s0, rest)


# -- compiling a turn ------------------------------------------------------------------------------


class CompiledTurn:
    """A Turn against one vocabulary: its grammars compiled, its tokens resolved, its phases'
    configurations. Shared by every request with the same turn (`compiled_turn`)."""

    def __init__(self, turn: Turn, vocab: Vocabulary, *, max_string: int = MAX_STRING):
        self.turn, self.vocab = turn, vocab
        self.grammars = [compiled_grammar(g, vocab, max_string=max_string) for g in turn.grammars]
        ids = {text: single_token(vocab, text) for text in turn.delimiters}
        self.as_text = {t: text.encode("utf-8") for text, t in ids.items() if t is not None and vocab.is_special(t)}
        # A delimiter that is one ordinary token (Qwen's) is a control token in free text, as a
        # special one is: the reader takes it as the delimiter wherever it is generated, so a
        # free phase offers it only as its exit.
        controls = frozenset(t for t in ids.values() if t is not None and not vocab.is_special(t))
        self.plan: list = []
        self.cycle_from: int | None = None
        r = turn.reasoning
        if r is not None and r.open is not None:
            opener = compiled_grammar(ir.Grammar(ir.Special(r.open), name=f"open:{r.open}"), vocab)
            self.plan.append(lambda tag: _Grammar(opener, {}))
        body = turn.body
        if isinstance(body, Free):
            content, first_ok = self._content(body, controls)
            if r is not None:
                self._reasoning(r, first_ok, content.key, controls)
            if body.tags:
                self.cycle_from = len(self.plan)
            self.plan.append(lambda tag: _Free(vocab, content))
            if body.tags:
                grammars, as_text = self.grammars, self.as_text
                spans = [_Span(vocab, self._content_accepts(content)) for _ in grammars]
                self.plan.append(lambda tag: _Grammar(grammars[tag], as_text, spans[tag]))
        else:
            answer, as_text = self.grammars[0], self.as_text
            if r is not None:
                self._reasoning(r, _remainder_check(answer, None, b"", "the answer grammar"), answer.grammar.key,
                                controls)
            self.plan.append(lambda tag: _Grammar(answer, as_text))

    def _content(self, body: Free, controls: frozenset):
        """The free content's spec, and the check for a reasoning close's remainder handed to it
        (legal unless it completes a trigger)."""
        vocab = self.vocab
        exits, triggers, handed, oks = {}, [], [], []
        for i, (tag, compiled) in enumerate(zip(body.tags, self.grammars)):
            t = tag.trigger
            if t.token:
                tid = single_token(vocab, t.text)
                if tid is None:
                    raise GrammarError(f"trigger {t.text!r} is a token trigger, but this vocabulary has no one token "
                                       "for it; make it a text trigger")
                _remainder_check(compiled, tid, b"", f"tag {i}'s grammar")
                exits[tid] = (i, True)
                continue
            text = t.text.encode("utf-8")
            triggers.append((text, frozenset(t.gaps)))
            handed.append((i, text))
            oks.append(_remainder_check(compiled, None, text, f"tag {i}'s grammar"))
        key = ("content", tuple((t.trigger, g.grammar.key) for t, g in zip(body.tags, self.grammars)), controls)
        spec = _FreeSpec(key, exits, tuple(triggers), tuple(handed), True, None, tuple(oks), controls)
        if not triggers:
            return spec, lambda rest: True
        index = trigger_index(vocab, tuple(triggers))
        return spec, lambda rest: index.advance(0, rest)[1] < 0

    def _content_accepts(self, spec: _FreeSpec) -> Callable[[bytes], bool]:
        """Is this text legal at the start of the free content (what a token that runs past a
        tag's end leaves there): it completes no trigger, or one whose grammar takes the rest."""
        index = trigger_index(self.vocab, spec.triggers) if spec.triggers else None

        def accepts(rest: bytes) -> bool:
            if index is None:
                return True
            _, end, which = index.advance(0, rest)
            return end < 0 or spec.remainder_ok[which] is None or spec.remainder_ok[which](rest[end:])

        return accepts

    def _reasoning(self, r, first_ok, after: object, controls: frozenset) -> None:
        """The reasoning phase; `first_ok` checks what a text close hands to the phase after it
        (whose masks `after` names)."""
        close = single_token(self.vocab, r.close)
        closing = ((r.close.encode("utf-8"), frozenset()),) if close is None else ()
        spec = _FreeSpec(("reasoning", close, r.close, after, controls),
                         {close: (None, False)} if close is not None else {}, closing,
                         ((None, b""),) if closing else (), False, r.budget, (first_ok,) if closing else (), controls)
        self.plan.append(lambda tag: _Free(self.vocab, spec))


_TURNS: "OrderedDict[tuple, CompiledTurn]" = OrderedDict()
_TURNS_LOCK = threading.Lock()
TURN_CACHE_SIZE = 256


def compiled_turn(turn: Turn, vocab: Vocabulary, *, max_string: int = MAX_STRING) -> CompiledTurn:
    """The shared CompiledTurn for (turn, vocab, max_string): an LRU, as `compiled_grammar` keeps
    for grammars (whose own cache makes a miss here cheap where the grammars are known)."""
    key = (turn.key, vocab.key, max_string)
    with _TURNS_LOCK:
        hit = _TURNS.get(key)
        if hit is not None:
            _TURNS.move_to_end(key)
    if hit is not None and hit.vocab is vocab and all(g.store is current_store(vocab) for g in hit.grammars):
        return hit
    hit = CompiledTurn(turn, vocab, max_string=max_string)
    with _TURNS_LOCK:
        _TURNS[key] = hit
        while len(_TURNS) > TURN_CACHE_SIZE:
            _TURNS.popitem(last=False)
    return hit


# -- the turn matcher -------------------------------------------------------------------------------


class TurnMatcher:
    """A turn's phases behind the Matcher verbs, for one request.

    Like Matcher: an illegal token puts it into an error state it never leaves (only stop tokens
    are offered then) and `rollback` undoes it; only API misuse raises MatcherError.
    """

    def __init__(self, compiled: CompiledTurn):
        self.compiled = compiled
        self.vocab = vocab = compiled.vocab
        self.words = bitmask_words(vocab.logits_width)
        self._plan = compiled.plan  # phase factories, in order
        self._cycle_from = compiled.cycle_from  # after the last, start again here (tags), or None: end
        self._phases = [(0, self._plan[0](None))]  # (plan index, phase)
        self._log: list[tuple] = []  # per consumed token: how to undo it
        self._stopped = False
        self._error = False
        self._error_at = -1  # len(_log) when the error happened (rollback past it clears it)
        self.error_message = ""
        self.cut = False  # set by finish(): the turn was completed by force
        self.started: int | None = None  # the tag the last consumed token started (its index), if any
        self._settle()

    # -- state ------------------------------------------------------------------------------

    @property
    def phase(self):
        return self._phases[-1][1]

    @property
    def phase_index(self) -> int:
        """Which phase of the plan is current (0 = the first)."""
        return self._phases[-1][0]

    def _next_index(self, i: int) -> int | None:
        if i + 1 < len(self._plan):
            return i + 1
        return self._cycle_from

    def _advance(self, tag: int | None = None) -> "object":
        i = self._next_index(self.phase_index)
        if i is None:
            raise _Illegal("the output is complete; only a stop token may follow")
        p = self._plan[i](tag)
        self._phases.append((i, p))
        return p

    def _settle(self) -> None:
        """Move past grammar phases that are complete and have a successor (an open delimiter
        once written, a tag's grammar once it closes)."""
        while (self.phase.kind == "grammar" and not self._stopped and self.phase.m.is_done()
               and not self.phase.m.is_error() and self._next_index(self.phase_index) is not None):
            self._advance()

    def is_error(self) -> bool:
        return self._error

    def in_free_text(self) -> bool:
        """Whether the output is in a free-text phase (prose, reasoning) rather than inside a
        call or a structured answer: stop strings end generation only there."""
        return not self._error and not self._stopped and self.phase.kind == "free"

    def is_done(self) -> bool:
        if self._error or self._stopped:
            return True
        p = self.phase
        return p.kind == "grammar" and p.m.is_done() and self._next_index(self.phase_index) is None

    def is_accepting(self) -> bool:
        if self._error:
            return False
        if self._stopped:
            return True
        p = self.phase
        if p.kind == "free":
            return p.spec.stops
        return p.m.is_accepting() and (self._next_index(self.phase_index) is None or self._cycle_from is not None)

    # -- the verbs --------------------------------------------------------------------------

    def fill_bitmask(self, bitmask: np.ndarray, index: int = 0) -> int:
        row = bitmask if bitmask.ndim == 1 else bitmask[index]
        if row.shape[-1] != self.words:
            raise MatcherError(
                f"bitmask has {row.shape[-1]} words; this vocabulary (logits width {self.vocab.logits_width}) "
                f"needs {self.words} -- allocate it with allocate_bitmask({self.vocab.logits_width})")
        if self._error or self._stopped:
            row[...] = pack_ids(list(self.vocab.stop_ids), self.vocab.logits_width)
            return _count(row)
        return self.phase.fill(row)

    def consume_token(self, token_id: int) -> bool:
        """Advance by one token; False (and the error state) if no phase allows it."""
        self.started = None
        if self._error:
            return False
        self._log.append((len(self._phases), self.phase.snapshot(), self._stopped))
        if self._stopped:
            return self._fail(f"token {token_id} after the stop token")
        try:
            self._route(self.phase.consume(int(token_id)))
            self._settle()
        except _Illegal as e:
            return self._fail(str(e))
        return True

    def _route(self, outcome) -> None:
        while outcome != "stay":
            if outcome == "stop":
                self._stopped = True
                return
            _, tag, token, data = outcome
            if tag is not None:
                self.started = tag
            nxt = self._advance(tag)
            outcome = "stay"
            if token is not None:
                outcome = nxt.consume(token)
            if data and outcome == "stay":
                self._settle()
                outcome = self.phase.feed(data)

    def _fail(self, why: str) -> bool:
        self._error = True
        self.error_message = why
        self._error_at = len(self._log)
        return False

    def rollback(self, n: int) -> None:
        """Undo the last `n` consumed tokens (an error caused by them is undone too)."""
        if n < 0 or n > len(self._log):
            raise MatcherError(f"cannot roll back {n} tokens; {len(self._log)} were consumed")
        if n:
            self.started = None
        for _ in range(n):
            count, snap, stopped = self._log.pop()
            del self._phases[count:]
            self.phase.restore(snap)
            self._stopped = stopped
        if self._error and self._error_at > len(self._log):
            self._error, self.error_message = False, ""

    def close_key(self):
        """A key equal for states with the same shortest completion: the phase and, in a
        grammar phase, its matcher's `close_key`; None elsewhere (free text, an error, a stop)."""
        if self._error or self._stopped or self.phase.kind != "grammar":
            return None
        inner = self.phase.m.close_key()
        return None if inner is None else (len(self._phases), inner)

    def num_consumed(self) -> int:
        return len(self._log)

    def forced_tokens(self) -> list[int]:
        """The phase's forced tokens: a grammar's, or a free phase's exit once its budget is spent."""
        if self._error or self._stopped:
            return []
        return self.phase.forced()

    def finish(self) -> list[int]:
        """Force the shortest completion: close reasoning, then the answer's shortest completion
        (Matcher.finish). Returns and consumes the tokens; [] when already accepting."""
        out: list[int] = []
        for _ in range(len(self._plan) + 2):
            if self._error or self.is_accepting():
                break
            p = self.phase
            if p.kind == "free":
                toks = p.exit_now()
            else:
                toks = p.m.copy().finish()
            if not toks:
                break
            for t in toks:
                if not self.consume_token(t):
                    raise MatcherError(f"internal: the forced completion was rejected ({self.error_message})")
                out.append(t)
        self.cut = bool(out)
        return out

    def copy(self) -> "TurnMatcher":
        other = TurnMatcher.__new__(TurnMatcher)
        other.__dict__.update(self.__dict__)
        other._phases = [(i, p.copy()) for i, p in self._phases]
        other._log = list(self._log)
        return other


def turn_matcher(turn: Turn, vocab: Vocabulary, *, max_string: int = MAX_STRING) -> TurnMatcher:
    """A per-request matcher for `turn` on `vocab` (its compiled form shared)."""
    return TurnMatcher(compiled_turn(turn, vocab, max_string=max_string))
