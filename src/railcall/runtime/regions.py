"""Regions: a turn's output as phases -- reasoning, free content, a tool call or a structured answer.

`answer_matcher()` builds, per request, one matcher-like object (`RegionMatcher`) with the
Matcher verbs `railcall.runtime.decode.generate` uses, so a decode loop cannot tell it from a Matcher:

    mode "required":  [<think>] reasoning </think>  ANSWER
    mode "auto":      [<think>] reasoning </think>  ( content TRIGGER CALL )* content STOP
    mode "none":      [<think>] reasoning </think>  content STOP

(the reasoning part only with `reasoning=True`; its open is left out when the prompt already
opened it). ANSWER and CALL are a CompiledGrammar run by an ordinary `railcall.matcher.Matcher`;
the free phases (reasoning, content) are masks precomputed once per vocabulary: every
non-special text token but the delimiter tokens (which the parser reads as delimiters wherever
they are generated, special or not), plus the phase's exit, plus the stop tokens where the turn
may end.

Delimiters come from `railcall.output.Delimiters`, the object the output parser reads, so the
grammar and the parser end reasoning at the same place:
- Reasoning ends only at the close delimiter's *token*. A `</think>` spelled in pieces inside
  reasoning is reasoning text and does not end it. Where the close is not one token (SmolLM2),
  its text ends reasoning: the documented text fallback, as in the parser.
- Inside ANSWER/CALL, a delimiter token is ordinary text: it is legal wherever its text is, and
  moves the grammar by its text. Banning it would push a model that generates the `</think>`
  token inside a JSON string (Qwen does) to substitute something else; the parser returns it as
  text, so a structured answer may contain the tag.
- The "auto" trigger is the tool-call open token where the call grammar starts with it; else a
  trigger text: the open's text (Hermes without a `<tool_call>` token) or `{"tool":"` (the JSON
  wire format), the latter with any JSON whitespace where JSON allows it (`{\n  "tool": "`, as a
  model writes it unprompted; `output.json_gaps`). A token whose text completes the trigger hands
  the trigger's compact text and what follows it in the token to the call grammar, and is legal
  only if that is a legal start of the call.

Lifecycle: the per-vocabulary masks and trigger tables are cached on the Vocabulary (shared,
never per-request); a RegionMatcher is per request and cheap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from railcall.bitmask import bitmask_words, pack_ids
from railcall.errors import GrammarError, MatcherError
from railcall.grammar import ir
from railcall.matcher import DEAD, CompiledGrammar, Matcher, compiled_grammar
from railcall.output import JSON_CALL_TRIGGER, Delimiters, json_gaps
from railcall.vocab import Vocabulary

MODES = ("none", "auto", "required")


# -- per-vocabulary tables -----------------------------------------------------------------------


def _cache(vocab: Vocabulary) -> dict:
    return vocab._extra.setdefault("regions", {})


def text_token_mask(vocab: Vocabulary) -> np.ndarray:
    """(words,) int32: every non-special token that adds text. Once per vocabulary."""
    c = _cache(vocab)
    hit = c.get("text")
    if hit is None:
        ids = np.flatnonzero((vocab.lengths > 0) & ~vocab.special)
        hit = c["text"] = pack_ids(ids, vocab.logits_width)
    return hit


WS_BYTES = b" \t\n\r"


def _search_dfa(trigger: bytes, gaps: frozenset[int]) -> tuple[np.ndarray, int, list[int]]:
    """A search automaton for `trigger` anywhere in a text, with any run of JSON whitespace
    allowed before the positions in `gaps`: (table (states, 256) int32, the found state, per
    state the furthest trigger position it has matched). State 0 is "nothing matched"; with no
    gaps this is the KMP automaton. Built by subset construction over trigger positions (a
    handful of states for `{"tool":"`)."""
    n = len(trigger)
    sets = {frozenset([0]): 0}
    order = [frozenset([0])]
    rows: list[np.ndarray] = []
    found = -1
    i = 0
    while i < len(order):
        cur = order[i]
        row = np.zeros(256, dtype=np.int32)
        for b in range(256):
            nxt = {0}
            for p in cur:
                if p == n:
                    continue
                if trigger[p] == b:
                    nxt.add(p + 1)
                elif p in gaps and b in WS_BYTES:
                    nxt.add(p)
            key = frozenset(nxt)
            if n in key:
                key = frozenset([n])  # found: the search stops here
            if key not in sets:
                sets[key] = len(order)
                order.append(key)
            row[b] = sets[key]
        rows.append(row)
        i += 1
    found = sets.get(frozenset([n]), -1)
    return np.stack(rows), found, [max(st) for st in order]


class TriggerIndex:
    """For one trigger (its text, and where JSON whitespace may stand inside it) and one
    vocabulary: which tokens complete the trigger from each partial match, and where in the token
    it completes. Built once per (vocabulary, trigger).

    Only tokens containing the trigger's last byte can complete it, so the walk looks at those
    (a few hundred in a 49k vocabulary), through the search automaton, one numpy step per byte.
    """

    def __init__(self, vocab: Vocabulary, trigger: bytes, gaps: frozenset[int] = frozenset()):
        self.trigger = trigger
        self.table, self.found, self._pos = _search_dfa(trigger, gaps)
        B = vocab.byte_matrix  # (max_len, V) uint8
        lens = vocab.lengths
        has_last = ((B == trigger[-1]) & (np.arange(B.shape[0])[:, None] < lens[None, :])).any(axis=0)
        self.candidates = np.flatnonzero(has_last & ~vocab.special & (lens > 0))
        self._by_start: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.vocab = vocab

    def rest(self, k: int) -> bytes:
        """The shortest text that completes the trigger from state k."""
        return self.trigger[self._pos[k]:]

    def completing(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(ids, end): tokens that complete the trigger from partial match `k`, and the byte
        offset in each token just after the trigger."""
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
                end[live & (state == self.found)] = j + 1
            done = end > 0
            hit = self._by_start[k] = (ids[done], end[done])
        return hit

    def advance(self, k: int, data: bytes) -> tuple[int, int]:
        """(new partial match, offset just after the trigger or -1) after `data` from `k`."""
        t, found = self.table, self.found
        for i, b in enumerate(data):
            k = int(t[k, b])
            if k == found:
                return k, i + 1
        return k, -1


def trigger_index(vocab: Vocabulary, trigger: bytes, gaps: frozenset[int] = frozenset()) -> TriggerIndex:
    c = _cache(vocab).setdefault("triggers", {})
    hit = c.get((trigger, gaps))
    if hit is None:
        hit = c[(trigger, gaps)] = TriggerIndex(vocab, trigger, gaps)
    return hit


# -- phases ----------------------------------------------------------------------------------------


class _Illegal(Exception):
    pass


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


@dataclass(frozen=True)
class _FreeSpec:
    """A free-text phase's configuration (shared by every phase made from it)."""

    key: tuple
    exit_tokens: dict  # token id -> whether the token itself is handed to the next phase
    trigger: bytes | None  # a text exit, or None
    pass_trigger: bool  # the trigger text is handed to the next phase (it is the call's start)
    stops: bool  # the turn may end here
    budget: int | None  # tokens before the exit is forced
    remainder_ok: Callable[[bytes], bool] | None  # is this legal right after the trigger?
    controls: frozenset = frozenset()  # delimiter tokens, never free text (only an exit here)
    gaps: frozenset = frozenset()  # trigger positions where JSON whitespace may stand (json_gaps)


class _Free:
    """Free text (reasoning or content) until an exit token, a trigger text, or a stop token."""

    kind = "free"

    def __init__(self, vocab: Vocabulary, spec: _FreeSpec):
        self.vocab, self.spec = vocab, spec
        self.count = 0  # tokens consumed (for the budget)
        self.k = 0  # how much of the trigger text is matched at the end of the text so far
        self.index = trigger_index(vocab, spec.trigger, spec.gaps) if spec.trigger else None

    def snapshot(self):
        return (self.count, self.k)

    def restore(self, snap) -> None:
        self.count, self.k = snap

    def copy(self) -> "_Free":
        other = _Free.__new__(_Free)
        other.__dict__.update(self.__dict__)
        return other

    def _base(self) -> np.ndarray:
        c = _cache(self.vocab).setdefault("free", {})
        hit = c.get(self.spec.key)
        if hit is None:
            extra = list(self.spec.exit_tokens) + (list(self.vocab.stop_ids) if self.spec.stops else [])
            hit = text_token_mask(self.vocab)
            if self.spec.controls:
                hit = hit & ~pack_ids(list(self.spec.controls), self.vocab.logits_width)
            hit = hit | pack_ids(extra, self.vocab.logits_width)
            c[self.spec.key] = hit
        return hit

    def _banned(self, k: int) -> np.ndarray | None:
        """Tokens that complete the trigger from `k` with a remainder the next phase rejects."""
        if self.index is None:
            return None
        c = _cache(self.vocab).setdefault("banned", {})
        key = (self.spec.key, k)
        hit = c.get(key)
        if hit is None:
            ids, ends = self.index.completing(k)
            tb = self.vocab.token_bytes
            bad = [int(t) for t, e in zip(ids, ends) if not self.spec.remainder_ok(tb[t][e:])]
            hit = c[key] = pack_ids(bad, self.vocab.logits_width) if bad else None
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

    def fill(self, row: np.ndarray) -> None:
        if self.exhausted():
            if self.spec.exit_tokens:
                row[:] = pack_ids(list(self.spec.exit_tokens), self.vocab.logits_width)
            else:  # a text exit: the tokens that continue it
                row[:] = _prefix_tokens(self.vocab, self.index.rest(self.k))
            return
        row[:] = self._base()
        banned = self._banned(self.k)
        if banned is not None:
            row &= ~banned

    def consume(self, tid: int):
        """-> ("stay" | "stop" | ("exit", token to hand on or None, bytes to hand on or None))."""
        spec, v = self.spec, self.vocab
        if not 0 <= tid < v.size:
            raise _Illegal(f"token {tid} is outside the vocabulary (padding)")
        if self.exhausted() and tid not in spec.exit_tokens:
            # the budget is spent: only the exit is legal (a text exit is checked below)
            if spec.trigger is None or v.is_special(tid):
                raise _Illegal(f"the reasoning budget ({spec.budget} tokens) is spent: only its close is allowed")
        if tid in spec.exit_tokens:
            self.count += 1
            return ("exit", tid if spec.exit_tokens[tid] else None, None)
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
        k, end = self.index.advance(self.k, data)
        if end < 0:
            self.k = k
            return "stay"
        rest = data[end:]
        if not self.spec.remainder_ok(rest):
            raise _Illegal(f"text {data!r} completes {self.spec.trigger!r} but what follows it is not allowed")
        self.k = 0
        return ("exit", None, (self.spec.trigger if self.spec.pass_trigger else b"") + rest)


class _Grammar:
    """A CompiledGrammar phase (the answer, a call, a literal open). Delimiter tokens that the
    grammar does not reference as tokens are text here: legal wherever their text is."""

    kind = "grammar"

    def __init__(self, compiled: CompiledGrammar, as_text: dict[int, bytes]):
        self.m = Matcher(compiled)
        self.as_text = as_text  # special delimiter token id -> its text

    def snapshot(self):
        return self.m.num_consumed()

    def restore(self, snap) -> None:
        self.m.rollback(self.m.num_consumed() - snap)

    def copy(self) -> "_Grammar":
        other = _Grammar.__new__(_Grammar)
        other.m, other.as_text = self.m.copy(), self.as_text
        return other

    def _text_ok(self, data: bytes) -> bool:
        g, s = self.m.g, self.m.state
        for b in data:
            s = g.step(s, b)
            if s == DEAD:
                return False
        return True

    def fill(self, row: np.ndarray) -> None:
        self.m.fill_bitmask(row)
        if self.m.is_error() or self.m.is_done():
            return
        extra = [t for t, data in self.as_text.items() if self._text_ok(data)]
        if extra:
            row |= pack_ids(extra, self.m.g.width)

    def consume(self, tid: int):
        m = self.m
        if tid in self.as_text and tid not in m.g.specials(m.state) and not m.is_done():
            ok = m.consume_bytes(self.as_text[tid])
        else:
            ok = m.consume_token(tid)
        if not ok:
            msg = m.error_message
            m.rollback(1)
            raise _Illegal(msg)
        return "stop" if tid in m.g.vocab.stop_ids else "stay"

    def feed(self, data: bytes):
        if data and not self.m.consume_bytes(data):
            msg = self.m.error_message
            self.m.rollback(1)
            raise _Illegal(msg)
        return "stay"


def _grammar_accepts(compiled: CompiledGrammar, token: int | None, data: bytes) -> Matcher | None:
    """A matcher on `compiled` after `token` and/or `data`, or None if it rejects them."""
    m = Matcher(compiled)
    if token is not None and not m.consume_token(token):
        return None
    if data and not m.consume_bytes(data):
        return None
    return m


# -- the region matcher -------------------------------------------------------------------------


class RegionMatcher:
    """Phases of one turn behind the Matcher verbs. Built per request by `answer_matcher()`.

    Like Matcher: an illegal token puts it into an error state it never leaves (only stop tokens
    are offered then) and `rollback` undoes it; only API misuse raises MatcherError.
    """

    def __init__(self, vocab: Vocabulary, plan: list, cycle_from: int | None):
        self.vocab = vocab
        self.words = bitmask_words(vocab.logits_width)
        self._plan = plan  # phase factories, in order
        self._cycle_from = cycle_from  # after the last, start again here ("auto"), or None: end
        self._phases = [(0, plan[0]())]  # (plan index, phase)
        self._log: list[tuple] = []  # per consumed token: how to undo it
        self._stopped = False
        self._error = False
        self._error_at = -1  # len(_log) when the error happened (rollback past it clears it)
        self.error_message = ""
        self.cut = False  # set by finish(): the turn was completed by force
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

    def _advance(self) -> "object":
        i = self._next_index(self.phase_index)
        if i is None:
            raise _Illegal("the output is complete; only a stop token may follow")
        p = self._plan[i]()
        self._phases.append((i, p))
        return p

    def _settle(self) -> None:
        """Move past grammar phases that are complete and have a successor (an open delimiter
        once written, a call in "auto" once its JSON closes)."""
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
            row[:] = pack_ids(list(self.vocab.stop_ids), self.vocab.logits_width)
        else:
            self.phase.fill(row)
        return int(np.bitwise_count(row.view(np.uint32)).sum())

    def consume_token(self, token_id: int) -> bool:
        """Advance by one token; False (and the error state) if no phase allows it."""
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
            _, token, data = outcome
            nxt = self._advance()
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
        for _ in range(n):
            count, snap, stopped = self._log.pop()
            del self._phases[count:]
            self.phase.restore(snap)
            self._stopped = stopped
        if self._error and self._error_at > len(self._log):
            self._error, self.error_message = False, ""

    def num_consumed(self) -> int:
        return len(self._log)

    def forced_tokens(self) -> list[int]:
        """The phase's forced tokens: a grammar's, or a free phase's exit once its budget is spent."""
        if self._error or self._stopped:
            return []
        p = self.phase
        return p.forced() if p.kind == "free" else p.m.forced_tokens()

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

    def copy(self) -> "RegionMatcher":
        other = RegionMatcher.__new__(RegionMatcher)
        other.__dict__.update(self.__dict__)
        other._phases = [(i, p.copy()) for i, p in self._phases]
        other._log = list(self._log)
        return other


# -- the factory -----------------------------------------------------------------------------------


def answer_matcher(vocab: Vocabulary, answer: CompiledGrammar | None, delimiters: Delimiters, *,
                   mode: str = "required", reasoning: bool = False, reasoning_budget: int | None = None,
                   reasoning_opened: bool = False, trigger: str | None = None) -> RegionMatcher:
    """A per-request matcher for one turn (see the module docstring for the three modes).

    vocab             the model's Vocabulary; `answer` must be compiled against it.
    answer            the answer grammar: a tool-call grammar or a response_format schema
                      (CompiledGrammar), or None for free text ("none" mode only).
    delimiters        `Delimiters.from_vocab(vocab, ...)`, the same object the OutputParser uses.
    reasoning         a reasoning region first; `reasoning_opened`: the prompt already wrote its
                      open delimiter; `reasoning_budget`: tokens of reasoning before its close is
                      forced (None: no limit).
    trigger           "auto" only: the text that starts a call, overriding the choice made from
                      the delimiters and the call grammar.
    """
    if mode not in MODES:
        raise GrammarError(f"unknown mode {mode!r}; use one of {', '.join(MODES)}")
    if answer is None and mode != "none":
        raise GrammarError(f"mode {mode!r} needs an answer grammar; pass mode='none' for free text")
    if answer is not None and answer.vocab is not vocab and answer.vocab.key != vocab.key:
        raise GrammarError("the answer grammar was compiled against another vocabulary; compile it with this one")
    if reasoning and (delimiters.reasoning_open is None or delimiters.reasoning_close is None):
        raise GrammarError("reasoning=True needs reasoning delimiters; resolve Delimiters with reasoning=(open, close)")
    if reasoning_budget is not None and reasoning_budget < 0:
        raise GrammarError(f"reasoning_budget must be >= 0 tokens, not {reasoning_budget}")
    as_text = {d.token_id: d.text.encode("utf-8") for d in delimiters.all()
               if d.token_id is not None and vocab.is_special(d.token_id)}
    # A delimiter that is one ordinary token (Qwen's) is a control token in free text, as a
    # special one is: the parser reads it as the delimiter wherever it is generated, so a free
    # phase offers it only as its exit.
    controls = frozenset(t for t in delimiters.token_ids if not vocab.is_special(t))
    plan: list = []
    cycle_from = None

    # What follows reasoning, first (a text close hands its remainder to it).
    def grammar_phase():
        return _Grammar(answer, as_text)

    if mode == "required":
        after = [grammar_phase]
        first_ok = _remainder_ok_for_grammar(answer, None, b"")
    elif mode == "none":
        spec = _FreeSpec(("none", controls), {}, None, False, True, None, None, controls)
        after = [lambda: _Free(vocab, spec)]
        first_ok = lambda rest: True  # noqa: E731
    else:
        tok, text = _auto_trigger(answer, delimiters, trigger)
        # the JSON wire format's trigger takes the whitespace JSON allows inside it; the call
        # grammar is handed its compact text (then what followed the trigger in the token)
        gaps = frozenset(json_gaps(JSON_CALL_TRIGGER)) if text == JSON_CALL_TRIGGER.encode() else frozenset()
        key = ("auto", answer.grammar.key, tok, text, controls, gaps)
        ok = _remainder_ok_for_grammar(answer, tok, text or b"")
        spec = _FreeSpec(key, {tok: True} if tok is not None else {}, text, True, True, None,
                         ok if text else None, controls, gaps)
        after = [lambda: _Free(vocab, spec), grammar_phase]
        index = trigger_index(vocab, text, gaps) if text else None
        # A reasoning close's remainder goes to this content: legal unless it completes a trigger.
        first_ok = (lambda rest: index.advance(0, rest)[1] < 0) if index else (lambda rest: True)  # noqa: E731

    if reasoning:
        if not reasoning_opened:
            opener = compiled_grammar(ir.Grammar(ir.Special(delimiters.reasoning_open.text),
                                                 name=f"open:{delimiters.reasoning_open.text}"), vocab)
            plan.append(lambda: _Grammar(opener, {}))
        close = delimiters.reasoning_close
        closing = close.text.encode("utf-8") if close.token_id is None else None
        rspec = _FreeSpec(("reasoning", close.token_id, closing, mode, answer.grammar.key if answer else None,
                           reasoning_budget, controls),
                          {close.token_id: False} if close.token_id is not None else {}, closing, False, False,
                          reasoning_budget, first_ok if closing else None, controls)
        plan.append(lambda: _Free(vocab, rspec))
    if mode == "auto":
        cycle_from = len(plan)
    plan.extend(after)
    return RegionMatcher(vocab, plan, cycle_from)


def _remainder_ok_for_grammar(compiled: CompiledGrammar, token: int | None, prefix: bytes):
    """A check "is `rest` legal at the start of `compiled`, after `token`/`prefix`?", walking the
    compiled grammar's DFA (its transitions are cached, so repeated checks are table look-ups)."""
    start = _grammar_accepts(compiled, token, prefix)
    if start is None:
        raise GrammarError(f"the answer grammar does not start with {prefix!r}")
    s0 = start.state

    def ok(rest: bytes) -> bool:
        s = s0
        for b in rest:
            s = compiled.step(s, b)
            if s == DEAD:
                return False
        return True

    return ok


def _auto_trigger(answer: CompiledGrammar, d: Delimiters, override: str | None) -> tuple[int | None, bytes | None]:
    """(token, text) that starts a call in "auto" mode: the call-open token, its text, or the
    JSON wire format's `{"tool":"`, whichever the call grammar starts with."""
    candidates: list[tuple[int | None, bytes | None]] = []
    if override is not None:
        candidates.append((None, override.encode("utf-8")))
    else:
        if d.call_open is not None:
            if d.call_open.token_id is not None:
                candidates.append((d.call_open.token_id, None))
            candidates.append((None, d.call_open.text.encode("utf-8")))
        candidates.append((None, JSON_CALL_TRIGGER.encode("utf-8")))
    for tok, text in candidates:
        if _grammar_accepts(answer, tok, text or b"") is not None:
            return tok, text
    raise GrammarError(
        "mode 'auto' needs to know where a call starts, and the call grammar starts with none of "
        f"{[d.call_open.text if d.call_open else None, JSON_CALL_TRIGGER] if override is None else override!r}; "
        "pass trigger='<the text every call starts with>'")
