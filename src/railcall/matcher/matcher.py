"""CompiledGrammar (per grammar and vocabulary, shared) and Matcher (per request).

Bounded memory. Everything the engine shares across requests lives in a vocabulary's store
(entries.VocabCache): the compiled fragments, the automaton's states, transitions and per-state
memos, the masks, the content keys and the lookahead memos. Schemas are the client's choice, so
a server that kept all of it would grow without bound (a request with a fresh 1,000-value enum
kept ~850 MB). A store therefore has a byte budget (ENGINE_BUDGET, `set_memory_budget`), and its
size is estimated from counts it keeps as it grows (`VocabCache.nbytes`); no walk over it.

Why generations, not piecemeal eviction. A state id is held by every live matcher on it, and
transitions, masks and memos all refer to states and instructions, so the automaton cannot drop
one of its parts while a request is on it. So the whole store is replaced instead: when the
current store is over its budget, the next grammar asked for (`compiled_grammar`, on a hit as on
a miss, and `CompiledGrammar(...)`) starts a fresh one, and grammars of the LRU compiled into an
older store are dropped from it and compiled again into the new one when next asked for. A live
matcher keeps its own store alive through its CompiledGrammar, unchanged; the old store is
freed with the last grammar and matcher that use it. Nothing is ever evicted from under a
state, and a fresh store computes each mask as the old one did (the same instructions, states
and walks), so no mask can change. What stays piecemeal is what is safe piecemeal: the mask
cache's entries (a state keeps its own), token_next and the content-key memos (ids are never
reused, so a key cached under an old id only misses).

The bound: the current store's estimate stays below its budget plus what the requests between
two checks add (a check per request); retired stores live only as long as requests started on
them. One grammar adds at most grammar.program.MAX_GRAMMAR_BYTES (checked before it is built).
The pattern automata (grammar.strings.char_dfa and regex's caches) are kept per process, across
vocabularies; a store counts those its grammars use, and a new store empties those caches so
that old automata are freed with the stores that use them.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Sequence

import numpy as np

from railcall.bitmask import allocate_bitmask, unpack_bitmask
from railcall.errors import MatcherError
from railcall.grammar import ir
from railcall.grammar.instructions import Lit
from railcall.grammar.program import Fragments, compile_grammar
from railcall.grammar.strings import JStr
from railcall.matcher.automaton import Automaton
from railcall.matcher.entries import ENGINE_BUDGET, VocabCache, vocab_cache
from railcall.matcher.indexes import fill_stops, jstr_moves, number_margin
from railcall.matcher.content_keys import _jstr_clamps
from railcall.matcher.transitions import UNBUILT
from railcall.vocab import Vocabulary, single_token

TOKEN_NEXT_LIMIT = 1 << 20  # (state, token) -> state entries kept for consume_token's fast path
MAX_STRING = 256  # by default, the most characters of a string whose schema gives no maxLength


class TagIds:
    """Tag text -> the token id a grammar's `ir.Special` matches (`get`, all the compiler asks).
    A special token's own id; else the one ordinary token that spells the tag, resolved as
    `railcall.output.Delimiters` does (Qwen's `<think>` and `<tool_call>` are added tokens that
    are not special): the grammar then takes that token alone there, as the output parser counts
    that token alone, and a tag spelled in pieces is no tag for either. No such token: None, and
    the tag is matched as text. Built per compile; what it reads is cached per vocabulary (Gemma
    3 has 6,250 special tokens: inverting them for every compile was half of the time to first
    mask of a small table)."""

    def __init__(self, vocab: Vocabulary):
        self.vocab = vocab
        self.ordinary = ordinary_tags(vocab)

    def get(self, text: str, default=None):
        hit = self.vocab.special_id(text)
        if hit is None:
            cache = self.vocab._extra.setdefault("tag_ids", {})
            if text not in cache:
                cache[text] = single_token(self.vocab, text)
            hit = cache[text]
            if hit is not None:
                self.ordinary.add(hit)
        return default if hit is None else hit


def ordinary_tags(vocab: Vocabulary) -> set[int]:
    """The ordinary tokens some grammar on `vocab` matches as a tag (TagIds), by id: the set
    the matcher checks before reading a token as text (empty but for Qwen-like vocabularies)."""
    return vocab._extra.setdefault("tag_token_ids", set())


class CompiledGrammar:
    """A grammar bound to a vocabulary: its compiled program and its start state in the
    vocabulary's shared Automaton (which holds the states, transitions and masks; attributes
    not found here are looked up there). Shared by every request that uses the grammar;
    `compiled_grammar()` keeps an LRU of them keyed by grammar content. Compiled into the
    vocabulary's current store (`store`, a fresh one where the current one is over its budget:
    see the module docstring), which it keeps alive."""

    def __init__(self, grammar: ir.Grammar, vocab: Vocabulary, *, max_string: int = MAX_STRING):
        self.grammar = grammar
        self.vocab = vocab
        self.max_string = max_string
        special_ids = TagIds(vocab)
        shared = self.store = current_store(vocab)
        with shared.lock:
            frags = shared.fragments.get(max_string)
            if frags is None:
                frags = shared.fragments[max_string] = Fragments(max(vocab.max_token_len, 1),
                                                                 max(number_margin(vocab), 1))
            self.program = compile_grammar(grammar, special_ids, max_string=max_string, fragments=frags)
            auto = shared.automata.get(max_string)
            if auto is None:
                auto = shared.automata[max_string] = Automaton(vocab)
        self.auto = auto
        self.precomputed = False
        start: set = set()
        self.program.start.arrive(0, None, start)
        if not start:
            raise MatcherError("the grammar matches nothing")
        self.start_state = auto._intern(frozenset(start))
        self.prewarmed = False
        self._computations_before = auto.mask_computations

    def __getattr__(self, name: str):
        # only reached for what is not an attribute of the grammar itself: the automaton's
        if name in ("auto", "store"):
            raise AttributeError(name)
        return getattr(self.auto, name)

    @property
    def mask_computations(self) -> int:
        """Masks computed in the shared automaton since this grammar was compiled."""
        return self.auto.mask_computations - self._computations_before

    def prewarm(self) -> int:
        """Every position's content keys and first mask now (see Automaton.prewarm); returns the
        number of positions (`compiled_grammar` does it by default). Between computing every
        mask on first use and `precompute`: for 128 tools ~18 ms on SmolLM2's vocabulary (~22 ms
        on Gemma 3's) on the benchmark's host, against ~0.6 s for `precompute`, after which the
        first call to a tool finds most of its masks' work done (SmolLM2, 128 tools: mask p99
        41.6 µs against 73.5 without it)."""
        n = self.auto.prewarm(self.start_state)
        self.prewarmed = True
        return n

    def precompute(self, max_states: int = 50_000, small: int = 4096, per_instr_cap: int = 8,
                   max_depth: int = 1) -> int:
        """Every structural mask of this grammar now (see Automaton.precompute)."""
        n = self.auto.precompute(self.start_state, max_states, small, per_instr_cap, max_depth)
        self.precomputed = True
        return n


class Matcher:
    """The grammar's state for one request. Built per request from a shared CompiledGrammar.

    The decoding verbs, used the same way at every layer (decode loop, logits processor, server):
    `fill_bitmask`, `consume_token`, `rollback`, `forced_tokens`, `is_accepting`, `is_done`.
    A token the grammar does not allow puts the matcher into an error state that it never leaves
    (`is_error()`); from then on only stop tokens are offered, so a serving loop ends the request
    instead of crashing. Only API misuse (a wrong-sized bitmask, rolling back too far) raises.
    """

    def __init__(self, compiled: CompiledGrammar):
        self.compiled = compiled
        self.g = compiled.auto  # states, transitions and masks (shared)
        self._states = [compiled.start_state]  # state after each consumed token
        self._stopped = -1  # index in _states where a stop token was consumed, or -1
        self._error = False
        self._live = True  # neither stopped nor in error: consume_token's fast path applies
        self._tn = compiled.auto._token_next  # per state: token -> state (shared)
        self._tags = ordinary_tags(compiled.vocab)  # matched by id where a tag is expected
        self._error_at = -1
        self.error_message = ""
        self.last_legal_count = 0
        self.cut = False  # set by finish(): the call was completed by force, not by the model

    def copy(self) -> "Matcher":
        """An independent matcher at the same point (for speculative checks)."""
        m = Matcher(self.compiled)
        m._states = list(self._states)
        m._stopped, m._error, m._live, m._error_at = self._stopped, self._error, self._live, self._error_at
        m.error_message, m.last_legal_count, m.cut = self.error_message, self.last_legal_count, self.cut
        return m

    @property
    def state(self) -> int:
        return self._states[-1]

    def is_error(self) -> bool:
        return self._error

    def is_accepting(self) -> bool:
        return not self._error and self.g.is_accepting(self.state)

    def is_done(self) -> bool:
        """True once a stop token was consumed, or the grammar is complete and allows nothing
        but a stop token."""
        if self._error:
            return True
        return self._stopped >= 0 or self.g._only_accept[self.state]

    def fill_bitmask(self, bitmask: np.ndarray, index: int = 0) -> int:
        """Write the legal-token bitmask into `bitmask` (row `index` if 2-D); return the count."""
        g = self.g
        row = bitmask if bitmask.ndim == 1 else bitmask[index]
        if row.shape[-1] != g.words:
            raise MatcherError(
                f"bitmask has {row.shape[-1]} words; this vocabulary (logits width {g.width}) "
                f"needs {g.words} -- allocate it with allocate_bitmask({g.width})"
            )
        if not self._live:
            return self._fill_stops(row)
        s = self._states[-1]
        dense, n, words, vals = g._state_mask[s] or g.mask(s)
        if not n and not g._accepting[s]:
            # No token continues from here: the grammar has a value it cannot finish (compile-time
            # checks reject the known causes). Offering nothing would let a sampler pick any
            # token; the error state offers only stop tokens. Rolling back a token clears it.
            self._enter_error("no token can continue the output here: the grammar has a dead end "
                              f"after {self.num_consumed()} tokens")
            return self._fill_stops(row)
        # `row[...] =` takes numpy's whole-array path: ~0.2 µs less a copy than `row[:] =`
        if dense is not None:
            row[...] = dense
        else:
            row[...] = g._zeros
            row[words] = vals
        self.last_legal_count = n
        return n

    def _fill_stops(self, row: np.ndarray) -> int:
        self.last_legal_count = fill_stops(row, self.g.vocab)
        return self.last_legal_count

    def legal_token_ids(self) -> np.ndarray:
        """The legal token ids now (for tests and traces; the hot path uses fill_bitmask)."""
        bm = allocate_bitmask(self.g.width)
        self.fill_bitmask(bm)
        return np.flatnonzero(unpack_bitmask(bm, self.g.width))

    def _fail(self, why: str) -> bool:
        # The rejected token counts as consumed (the state is repeated), so that rollback(1)
        # undoes it and the error with it.
        self._states.append(self.state)
        self._enter_error(why)
        return False

    def _enter_error(self, why: str) -> None:
        """The error state, caused at the last consumed token (rolling it back leaves it)."""
        self._error = True
        self._live = False
        self._error_at = len(self._states) - 1
        self.error_message = why

    def consume_token(self, token_id: int) -> bool:
        """Advance by one token. False (and the error state) if the grammar does not allow it."""
        if self._live:
            states = self._states
            nxt = self._tn[states[-1]].get(token_id)
            if nxt is not None:  # a (state, token) pair seen before: one dict lookup
                states.append(nxt)
                return True
        return self._consume_slow(token_id)

    def _consume_slow(self, token_id: int) -> bool:
        if self._error:
            return False
        g = self.g
        if self._stopped >= 0:
            return self._fail(f"token {token_id} after the stop token")
        s = s0 = self._states[-1]
        if token_id in g._stop_set:
            if g.is_accepting(s):
                self._states.append(s)
                self._stopped = len(self._states) - 1
                self._live = False
                return True
            return self._fail(f"stop token {token_id} before the grammar is complete")
        v = g.vocab
        if not isinstance(token_id, (int, np.integer)) or not 0 <= token_id < g._n_tokens:
            return self._fail(f"token {token_id} is outside the vocabulary (padding)")
        token_id = int(token_id)
        special = g._is_special[token_id]
        if special or token_id in self._tags:  # a tag that is an ordinary token: by id
            nxt = g.specials(s).get(token_id)
            if nxt is not None:
                self._states.append(nxt)
                return True
            if special:
                return self._fail(f"special token {v.token_text(token_id)} is not allowed here")
        data = v.token_bytes[token_id]
        if not data:
            return self._fail(f"token {token_id} adds no text")
        threads = g._sets[s]
        if len(threads) == 1:
            (ins, loc, st), = threads
            if type(ins) is JStr:
                # inside a string: a token that stays inside moves the count and the substate
                # at once (no state per byte on the way)
                chars, end = jstr_moves(v, loc & 31)
                c = int(chars[token_id])
                count = (loc >> 5) + c
                if c >= 0 and count <= ins.max:
                    sub = int(end[token_id])
                    s = g._intern(frozenset([(ins, count << 5 | sub, st)]))
                    if g._state_mask[s] is None and sub == loc & 31:
                        # the same substate, owing and allowed as many characters as a token can
                        # tell: the same mask (see Automaton._content_key), no look-up needed
                        top = v.max_token_len
                        if _jstr_clamps(ins, count, top) == _jstr_clamps(ins, loc >> 5, top):
                            g._state_mask[s] = g._state_mask[s0]
                    return self._advanced(s0, token_id, s)
            elif type(ins) is Lit and len(data) < len(ins.data) - loc and ins.data.startswith(data, loc):
                # inside a literal: a token that spells part of the rest moves the offset
                return self._advanced(s0, token_id, g._intern(frozenset([(ins, loc + len(data), st)])))
        table = g._table
        for b in data:
            nxt = int(table[s, b])
            if nxt == UNBUILT:
                nxt = g.step(s, b)
                table = g._table
            if nxt < 0:
                return self._fail(f"token {token_id} ({v.token_text(token_id)!r}) is not allowed here")
            s = nxt
        return self._advanced(s0, token_id, s)

    def _advanced(self, s0: int, token_id: int, s: int) -> bool:
        """Record the step s0 --token--> s (and remember it for the next matcher)."""
        g = self.g
        self._states.append(s)
        if g._token_next_size >= TOKEN_NEXT_LIMIT:
            for row in g._token_next:
                row.clear()
            g._token_next_size = 0
            g._walked.clear()  # the rows a walk stored are gone: a later precompute walks again
            g._walked_keys.clear()
        g._token_next[s0][token_id] = s
        g._token_next_size += 1
        return True

    def consume_tokens(self, ids: Sequence[int]) -> bool:
        return all(self.consume_token(int(t)) for t in ids)

    def consume_bytes(self, data: bytes) -> bool:
        """Advance by raw text bytes (not token-aligned); used by finish() and tests. Counts as
        one consumed token for rollback; like consume_token, False in the error state and after
        a stop token."""
        if self._error:
            return False
        if self._stopped >= 0:
            return self._fail(f"text {data!r} after the stop token")
        s = self.state
        for b in data:
            s = self.g.step(s, b)
            if s < 0:
                return self._fail(f"text {data!r} is not allowed here")
        self._states.append(s)
        return True

    def rollback(self, n: int) -> None:
        """Undo the last `n` consumed tokens (an error caused by them is undone too)."""
        if n < 0 or n > len(self._states) - 1:
            raise MatcherError(f"cannot roll back {n} tokens; {len(self._states) - 1} were consumed")
        if n:
            del self._states[-n:]
        if self._stopped >= len(self._states):
            self._stopped = -1
        if self._error and self._error_at >= len(self._states):
            self._error = False
            self.error_message = ""
        self._live = not self._error and self._stopped < 0

    def num_consumed(self) -> int:
        return len(self._states) - 1

    def close_key(self):
        """A key equal for states with the same shortest completion (the automaton's coarse key:
        equal futures); None in the error state or after the stop token."""
        if self._error or self._stopped >= 0:
            return None
        return self.g._coarse_key(self.state)

    def forced_tokens(self) -> list[int]:
        """The tokens that are the only legal continuation from here, in canonical tokenization.

        Computed from the grammar's forced bytes (one allowed byte after another), tokenized;
        the last token is left to the model when a longer token could extend it across the end
        of the forced run. Empty in error, when done, or where the model has a choice.
        """
        if self._error or self._stopped >= 0:
            return []
        return list(self.g.forced(self.state))

    def finish(self) -> list[int]:
        """Force the shortest completion (the forced finish at the token ceiling).

        Returns the token ids that complete the output and consumes them; the matcher is then
        accepting. A required string cut short is filled with "?" -- a visible tell. Returns []
        when already accepting, and [] without effect in the error state.
        """
        if self._error or self.is_accepting():
            return []
        path = self.g.shortest_completion(self.state)
        if path is None:
            self._fail("no completion within the search limit")
            return []
        out: list[int] = []
        buf = bytearray()
        v = self.g.vocab

        def flush():
            if buf:
                toks = v.greedy_tokenize(bytes(buf))
                if toks is None:
                    raise MatcherError(f"completion {bytes(buf)!r} cannot be tokenized")
                out.extend(toks)
                buf.clear()

        for sym in path:
            if isinstance(sym, tuple):
                flush()
                out.append(sym[1])
            else:
                buf.append(sym)
        flush()
        for t in out:
            if not self.consume_token(t):
                raise MatcherError(f"internal: the forced completion was rejected ({self.error_message})")
        self.cut = True
        return out


# ---------------------------------------------------------------------------------------------
# Compiled grammars are shared across requests: an LRU keyed by (grammar, vocabulary, options).
# ---------------------------------------------------------------------------------------------

_CACHE: "OrderedDict[tuple, CompiledGrammar]" = OrderedDict()
_CACHE_LOCK = threading.Lock()
CACHE_SIZE = 64
_STORE_LOCK = threading.Lock()  # taken before _CACHE_LOCK, never after


def clear_caches(vocab: Vocabulary) -> None:
    """Forget the grammars compiled for `vocab`, their automata and every cached mask (the
    vocabulary's indexes stay): the next compile starts cold. Grammars compiled before keep
    working on what they hold."""
    with _STORE_LOCK:
        vocab._extra.pop("railcall_cache", None)
        _forget(vocab)


def _forget(vocab: Vocabulary) -> None:
    """Drop from the LRU the grammars on `vocab` that are not in its current store."""
    current = vocab._extra.get("railcall_cache")
    with _CACHE_LOCK:
        for key in [k for k, cg in _CACHE.items() if cg.vocab is vocab and cg.store is not current]:
            del _CACHE[key]


def set_memory_budget(vocab: Vocabulary, nbytes: int) -> None:
    """The byte budget of `vocab`'s shared store (default ENGINE_BUDGET, 512 MiB): once its
    estimate is over it, new grammars start a fresh store (see the module docstring). Applies
    to the current store and to every later one."""
    if nbytes < 0:
        raise ValueError(f"a memory budget is a number of bytes >= 0, not {nbytes}")
    vocab._extra["railcall_budget"] = nbytes
    vocab_cache(vocab).budget = nbytes


def memory_used(vocab: Vocabulary) -> int:
    """The estimated bytes of `vocab`'s current store (`VocabCache.nbytes`)."""
    return vocab_cache(vocab).nbytes()


def current_store(vocab: Vocabulary) -> VocabCache:
    """The store new grammars on `vocab` are compiled into: the current one, or a fresh one
    where the current one is over its budget (the old one is then retired: see the module
    docstring)."""
    vc = vocab_cache(vocab)
    if vc.nbytes() <= vc.budget:
        return vc
    with _STORE_LOCK:
        if vocab._extra.get("railcall_cache") is vc:
            vocab._extra["railcall_cache"] = VocabCache(vocab._extra.get("railcall_budget", ENGINE_BUDGET),
                                                        vc.generation + 1)
            _forget(vocab)
            _forget_patterns()
        return vocab_cache(vocab)


def _forget_patterns() -> None:
    """Empty the per-process caches of pattern automata: an automaton in them grows as strings
    visit it, for every store and request that uses it; emptied, each old one lives only as long
    as the stores whose grammars use it."""
    from railcall.grammar import regex, strings

    strings.char_dfa.cache_clear()
    regex.compile_pattern.cache_clear()
    regex._pattern_automaton.cache_clear()


def compiled_grammar(grammar: ir.Grammar, vocab: Vocabulary, *, max_string: int = MAX_STRING,
                     precompute: bool = False, prewarm: bool | None = None) -> CompiledGrammar:
    """The shared CompiledGrammar for (grammar, vocab), compiled on first use, once per grammar.
    `prewarm` (the default for tool tables and schemas): every position's keys and first mask
    now (`CompiledGrammar.prewarm`), so that a call's first masks are mostly built from cached
    parts (a mask p99 about two thirds of the lazy one's, for a time to first mask about twice as
    long, still below every peer's on the README's benchmark); prewarm=False computes every mask
    on first use only (the cheapest compile, for a grammar used once). None, the default: True
    but for a grammar over free text (ir.TEXT_GRAMMARS: Lark, GBNF, regex), where it bought no
    mask p99 on `railcall bench grammars` and cost up to a fifth of the time to first mask
    (calc 2.14 -> 1.73 ms, json_arr 1.43 -> 1.07). `precompute`: every structural mask now
    (`CompiledGrammar.precompute`, far more work)."""
    if prewarm is None:
        prewarm = grammar.name not in ir.TEXT_GRAMMARS
    key = (grammar.key, vocab.key, max_string)
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            _CACHE.move_to_end(key)
    if hit is not None and hit.store is not current_store(vocab):
        hit = None  # compiled into a retired store (or for a twin of this vocabulary): again
    if hit is not None:
        if precompute and not hit.precomputed:
            hit.precompute()
        elif prewarm and not (hit.prewarmed or hit.precomputed):
            hit.prewarm()
        return hit
    cg = CompiledGrammar(grammar, vocab, max_string=max_string)
    if precompute:
        cg.precompute()
    elif prewarm:
        cg.prewarm()
    with _CACHE_LOCK:
        _CACHE[key] = cg
        while len(_CACHE) > CACHE_SIZE:
            _CACHE.popitem(last=False)
    return cg
