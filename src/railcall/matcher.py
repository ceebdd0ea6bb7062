"""CompiledGrammar (shared) and Matcher (per request): token masks from a byte grammar.

Lifecycles:
- `Automaton` is built once per vocabulary (and string cap) and shared by every grammar on it:
  a lazily built DFA over thread sets (see grammar.program), its transition table, per-state
  masks and token transitions. Thread sets mean the same thing in every grammar (instructions
  are continuation-passing and shared), so grammars that share tools share their states.
  Masks are also cached per vocabulary by a content key (`MaskCache`).
- `CompiledGrammar` is built once per (grammar, vocabulary) and shared by every request that uses
  that grammar: its compiled program and its start state in the automaton.
  `compiled_grammar()` keeps an LRU of them keyed by grammar content.
- `Matcher` is built per request. It holds the current DFA state, the history for rollback, and
  the error flag. It is cheap (a list and a few ints).

How a mask is computed (once per cache key, then a lookup and a copy):
- A DFA state is a frozen set of threads; its transitions are a row of an (n_states, 256) int32
  table, filled entry by entry as tokens are walked.
- Generic states use a vectorised walk: every candidate token's j-th byte is gathered from the
  vocabulary's byte matrix and pushed through the table at once, so the Python cost is one numpy
  step per byte position, not one per token. The first step only looks at tokens whose first
  byte the state allows (the vocabulary groups tokens by first byte), which makes literal states
  -- most of a tool call -- cost a few dozen token checks.
- A state inside a JSON string body (a single string thread) uses a per-vocabulary precomputation:
  for each token, whether it stays inside the string, how many characters it adds, or where it
  closes the string. Only the tokens that close the string are walked further, through what
  follows the string.
- Masks are cached by a content key (`Automaton._ckey`): what a state accepts, as far as some
  token reaches. Seed 000's coarsening (string positions far from the cap share a mask) is one
  case of it; states of different tools, tables and grammars with the same key share too.
"""

from __future__ import annotations

import gc
import itertools
import threading
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from typing import NamedTuple, Sequence

import numpy as np

from railcall.bitmask import allocate_bitmask, bitmask_words, pack_ids, unpack_bitmask
from railcall.errors import MatcherError
from railcall.grammar import ir
from railcall.grammar.program import (
    EXIT, INT, JSTR_INC, JSTR_NEXT, MAX_NUMBER_CHARS, NEG, NUM_BYTES, NUM_FINAL, NUM_NEXT, S0, ZERO, Fragments, JInt, JNum,
    JStr, Lit, Select,
    compile_grammar,
)
from railcall.vocab import Vocabulary, single_token

UNBUILT = -2  # a transition not computed yet
DEAD = -1

# Finish (forced completion) prefers these bytes when several completions are equally short:
# close what is open, and fill a required string with "?" -- a visible tell, as in seed 000,
# that the value was cut short by the token ceiling rather than chosen.
_FINISH_ORDER = [ord(c) for c in '"?}]0'] + [ord(c) for c in "nrtu:,{["]


# A mask entry, as cached and as `CompiledGrammar.mask` returns it, is a tuple
#   (dense, count, words, values)
# dense: the packed int32 bitmask, or None when the mask is sparse; then `words` (int64) are the
# indices of its nonzero words and `values` (int32) their contents. Most masks of a tool call (a
# literal's prefixes, a trie's branches, digits) set a few dozen words out of 1,536 (SmolLM2) or
# 8,192 (Gemma 3): filling those is a zero fill and one scatter, and they cost a few hundred bytes
# to keep, so a table's every state can stay cached.

def _sparse_entry(acc: dict[int, int]) -> tuple:
    words = np.array(list(acc), dtype=np.int64)
    vals = np.array(list(acc.values()), dtype=np.uint32).view(np.int32)
    return None, sum(map(int.bit_count, acc.values())), words, vals


def entry_dense(entry: tuple, n_words: int) -> np.ndarray:
    """The packed int32 bitmask of a mask entry (a new array when the entry is sparse)."""
    dense, _, words, vals = entry
    if dense is not None:
        return dense
    out = np.zeros(n_words, dtype=np.int32)
    out[words] = vals
    return out


def entry_ids(entry: tuple, width: int) -> list[int]:
    """The token ids of a mask entry, sorted."""
    dense, _, words, vals = entry
    if dense is not None:
        return np.flatnonzero(unpack_bitmask(dense, width)).tolist()
    ids = []
    for w, val in sorted(zip(words.tolist(), vals.view(np.uint32).tolist())):
        while val:
            low = val & -val
            ids.append(w * 32 + low.bit_length() - 1)
            val ^= low
    return ids


def _entry_nbytes(value: tuple) -> int:
    if len(value) == 4:
        return 64 + (value[0].nbytes if value[0] is not None else value[2].nbytes + value[3].nbytes)
    return 64 + (value[0].nbytes if value[0] is not None else 0)


class _Bits:
    """Token ids gathered from several sources, packed into a bitmask once at the end: a few ids
    go straight into their words; many go through a bool array and np.packbits. Parts are
    Python lists (a literal's few ids: no numpy call per part) or int64 arrays."""

    __slots__ = ("words", "parts", "n")

    def __init__(self, words: int):
        self.words = words
        self.parts: list = []
        self.n = 0

    def add(self, ids) -> None:
        if not isinstance(ids, list):
            ids = np.asarray(ids, dtype=np.int64)
        if len(ids):
            self.parts.append(ids)
            self.n += len(ids)

    def entry(self) -> tuple:
        """The collected ids as a mask entry (see `entry_dense`): sparse when few are set."""
        if self.n <= 256:
            # Few ids (a literal's prefixes, a trie's branches): accumulate the words in a
            # dict; numpy's ufunc.at costs more than this, and so does a dense array.
            acc: dict[int, int] = {}
            for p in self.parts:
                for i in (p if isinstance(p, list) else p.tolist()):
                    acc[i >> 5] = acc.get(i >> 5, 0) | (1 << (i & 31))
            return _sparse_entry(acc)
        out = self.packed()
        return out, int(np.bitwise_count(out.view(np.uint32)).sum()), None, None

    def packed(self) -> np.ndarray:
        out = np.zeros(self.words, dtype=np.uint32)
        parts = [np.asarray(p, dtype=np.int64) for p in self.parts]
        if self.n > 4096:
            bits = np.zeros(self.words * 32, dtype=bool)
            for p in parts:
                bits[p] = True
            out |= np.packbits(bits, bitorder="little").view(np.uint32)
        elif self.n:
            ids = np.concatenate(parts) if len(parts) > 1 else parts[0]
            np.bitwise_or.at(out, ids >> 5, np.left_shift(np.uint32(1), (ids & 31).astype(np.uint32)))
        return out.view(np.int32)


def _union(entries: list[tuple], n_words: int) -> tuple:
    """The mask entry of the union of several entries."""
    if all(e[0] is None for e in entries):
        acc: dict[int, int] = {}
        for _, _, words, vals in entries:
            for w, v in zip(words.tolist(), vals.view(np.uint32).tolist()):
                acc[w] = acc.get(w, 0) | v
        if len(acc) <= 256:
            return _sparse_entry(acc)
    out = entry_dense(entries[0], n_words).copy()
    for e in entries[1:]:
        if e[0] is not None:
            out |= e[0]
        else:
            out[e[2]] |= e[3]
    return out, int(np.bitwise_count(out.view(np.uint32)).sum()), None, None


def jstr_inside(vocab: Vocabulary, sub: int, words: int, room: int | None = None) -> tuple[np.ndarray, int]:
    """The packed mask of every token that stays inside a JSON string from substate `sub` and
    adds at most `room` characters (None: any token fits), and how many tokens that is: the bulk
    of every in-string mask, shared per vocabulary. Near a string's cap each remaining room has
    its own mask; they are kept too (at most the longest token's length of them per substate)."""
    cache = vocab._extra.setdefault("jstr_packed", {})
    if room is not None and room >= vocab.max_token_len:
        room = None
    hit = cache.get((sub, room))
    if hit is None:
        idx = jstr_index(vocab, sub)
        ids = idx.inside_ids if room is None else idx.inside_ids[idx.inside_chars <= room]
        hit = cache[(sub, room)] = (pack_ids(ids, words * 32), int(ids.size))
    return hit


class MaskCache:
    """Masks by content key, shared by every grammar on one vocabulary; bounded in bytes (a
    SmolLM2 mask is 6 KiB, a Gemma 3 mask 32 KiB), the oldest entries dropped first. A hit does
    not reorder: every state keeps a reference to its own mask (Automaton._state_mask), so the
    cache only decides which masks a state seen for the first time can find, and that first
    visit is the hot path (an LRU's reordering cost 3% of a tool table's median step)."""

    def __init__(self, budget_bytes: int = 256 << 20):
        self.budget = budget_bytes
        self.used = 0
        self._d: dict = {}
        self.lock = threading.Lock()

    def get(self, key):
        return self._d.get(key)

    def put(self, key, value) -> None:
        with self.lock:
            if key not in self._d:
                self._d[key] = value
                self.used += _entry_nbytes(value)
                while self.used > self.budget and len(self._d) > 1:
                    old = self._d.pop(next(iter(self._d)))
                    self.used -= _entry_nbytes(old)

    def __len__(self) -> int:
        return len(self._d)


class VocabCache:
    """What railcall shares per vocabulary: compiled fragments and the automaton (per string
    cap), and masks."""

    def __init__(self):
        self.fragments: dict[int, Fragments] = {}
        self.automata: dict[int, "Automaton"] = {}  # per string cap
        self.masks = MaskCache()
        self.lock = threading.RLock()
        # content keys (Automaton._ckey): interned ids, never reused; memo of thread keys
        self.content_ids: dict = {}
        self.content_memo: dict = {}
        self.content_next = itertools.count(1)  # 0 stands for "alive", in lookahead keys
        self.token_ext: dict[bytes, int] = {}
        self.next_bytes: dict[bytes, np.ndarray] = {}
        self.costly_keys: set = set()  # threads (and continuations) whose content key costs too much
        self.literal_keys: dict[bytes, int] = {}  # a literal's rest -> its key, or -1: depends on what follows


def vocab_cache(vocab: Vocabulary) -> VocabCache:
    vc = vocab._extra.get("railcall_cache")
    if vc is None:
        vc = vocab._extra.setdefault("railcall_cache", VocabCache())
    return vc


TOKEN_NEXT_LIMIT = 1 << 20
KEY_BUDGET = 32  # lookahead nodes one content key may visit before falling back to the instruction


class _Costly(Exception):
    """A content key that would cost more than KEY_BUDGET to build."""
# A bounded integer's stage (nothing yet, after "-", a lone "0", digits) as a number substate
_JINT_SUB = (S0, NEG, ZERO, INT)
_NUMBER_BYTES = frozenset(b"-+.eE0123456789")
CONTENT_KEYS_LIMIT = 1 << 19  # interned content keys, and memo entries, per vocabulary (~100 MiB)
NEXT_BYTES_LIMIT = 1 << 15  # memoised (256,) byte sets per vocabulary (~12 MiB)


def _jstr_clamps(ins: JStr, count: int, top: int) -> tuple[int, int]:
    """A string's characters still owed and still allowed at `count`, clamped at `top` (the
    longest token): past it no token can tell two counts apart."""
    return min(max(0, ins.min - count), top), min(ins.max - count, top)


def _stack_key(st):
    if st is None:
        return None
    ret, rl, parent, depth = st
    return (ret, ret.coarse(rl), _stack_key(parent), depth)


class Automaton:
    """The DFA over thread sets, its transitions and masks, shared by every grammar compiled for
    one vocabulary (and string cap). Instructions are continuation-passing and shared between
    grammars (grammar.program.Fragments), so a thread set means the same thing whichever grammar
    reached it: a table that keeps most of its tools after a live change finds their states,
    transitions and masks already built. Thread-safe for concurrent matchers (state growth is
    serialised by a lock). Replaced by a fresh one for new grammars once it holds
    AUTOMATON_STATES states; grammars compiled before keep theirs."""

    def __init__(self, vocab: Vocabulary):
        self.vocab = vocab
        self.width = vocab.logits_width
        self.words = bitmask_words(self.width)
        # what a sparse mask is written over: copying zeros costs less than ndarray.fill(0)
        # (a third less on SmolLM2's 1,536 words, half on Gemma 3's 8,192)
        self._zeros = np.zeros(self.words, dtype=np.int32)
        self._zeros.flags.writeable = False
        self.stop_ids = np.array(sorted(vocab.stop_ids), dtype=np.int64)
        self._stop_set = frozenset(vocab.stop_ids)
        self._lock = threading.RLock()
        self._sets: list[frozenset] = []
        self._ids: dict[frozenset, int] = {}
        self._table = np.full((64, 256), UNBUILT, dtype=np.int32)
        self._accepting: list[bool] = []
        self._only_accept: list[bool] = []
        self._specials: list[dict[int, int] | None] = []
        self._first: list[np.ndarray | None] = []
        self._row_init: list[bool] = []
        self._state_mask: list[tuple | None] = []
        self._forced: dict[int, list[int]] = {}
        # Per state, token -> the state after it: consume_token's fast path, one dict lookup
        # instead of a table step per byte. Bounded in total; cleared when full.
        self._token_next: list[dict[int, int]] = []
        self._token_next_size = 0
        self._after_memo: dict[tuple, int] = {}
        vc = vocab_cache(vocab)
        self._masks = vc.masks  # shared by every automaton on this vocabulary
        self._cids, self._cmemo, self._cnext = vc.content_ids, vc.content_memo, vc.content_next
        self._extm, self._lit_memo = vc.token_ext, vc.literal_keys
        self._reach = prefix_reach(vocab)
        # per string substate: whether some token closes a string from there (on SmolLM2 and
        # Gemma 3 only between characters and after a backslash)
        self._jstr_closes = [bool(jstr_index(vocab, sub).exit_ids.size) for sub in range(13)]
        self._nextm: dict[bytes, np.ndarray] = vc.next_bytes
        self._budget = KEY_BUDGET
        self._costly: set = vc.costly_keys
        self.mask_computations = 0
        # what precompute walked already (by any grammar): states, and the mask keys expanded
        self._walked: set[int] = set()
        self._walked_keys: set = set()

    # -- the DFA --------------------------------------------------------------------------------

    def _intern(self, threads: frozenset) -> int:
        s = self._ids.get(threads)
        if s is not None:
            return s
        with self._lock:
            s = self._ids.get(threads)
            if s is not None:
                return s
            s = len(self._sets)
            if s >= self._table.shape[0]:
                grow = np.full((self._table.shape[0], 256), UNBUILT, dtype=np.int32)
                self._table = np.concatenate([self._table, grow])
            self._sets.append(threads)
            acc = any(t[0].accepting for t in threads)
            self._accepting.append(acc)
            self._only_accept.append(acc and all(t[0].accepting for t in threads))
            self._specials.append(None)
            self._first.append(None)
            self._row_init.append(False)
            self._state_mask.append(None)
            self._token_next.append({})
            self._ids[threads] = s
            return s

    def step(self, s: int, b: int) -> int:
        """The state after byte `b` from state `s` (DEAD if illegal)."""
        r = int(self._table[s, b])
        if r != UNBUILT:
            return r
        out: set = set()
        for ins, loc, st in self._sets[s]:
            ins.step(loc, st, b, out)
        r = self._intern(frozenset(out)) if out else DEAD
        with self._lock:  # _intern may swap in a grown table: a write to the old one would be lost
            self._table[s, b] = r
        return r

    def specials(self, s: int) -> dict[int, int]:
        """Special token id -> next state, for the special tokens state `s` accepts."""
        sp = self._specials[s]
        if sp is None:
            by_id: dict[int, set] = {}
            for ins, loc, st in self._sets[s]:
                tid = ins.special(loc)
                if tid is not None:
                    ins.next.arrive(0, st, by_id.setdefault(tid, set()))
            sp = {tid: self._intern(frozenset(out)) for tid, out in by_id.items() if out}
            self._specials[s] = sp
        return sp

    def first_bytes(self, s: int) -> np.ndarray:
        """(256,) bool: bytes that some thread of `s` accepts next (a superset of legal bytes
        only in that a byte may still lead to a dead end for every token)."""
        m = self._first[s]
        if m is None:
            m = np.zeros(256, dtype=bool)
            for ins, loc, _ in self._sets[s]:
                m |= ins.allowed(loc)
            self._first[s] = m
        return m

    def is_accepting(self, s: int) -> bool:
        return self._accepting[s]

    def _coarse_key(self, s: int):
        """A key equal for states with equal futures (the same instructions at positions that
        coarsen alike): precompute expands one state per key."""
        threads = self._sets[s]
        if len(threads) == 1:
            (ins, loc, st), = threads
            if st is None:  # most states: one thread, no stack
                return ins, ins.coarse(loc)
        return frozenset((ins, ins.coarse(loc), _stack_key(st)) for ins, loc, st in threads)

    # -- content keys ---------------------------------------------------------------------------
    # A state's mask is fixed by which byte strings no longer than the longest token it accepts,
    # whether it accepts (stop tokens) and which special tokens it waits for. A content key
    # describes exactly that, and only as far as some token can reach: a literal `","unit":"`
    # whose first four bytes no token spells is keyed by `","` alone, a string by its substate,
    # the characters it still owes or may add (up to a token's length) and the few bytes after
    # its closing quote that a closing token can spell. States with one key have one mask,
    # whichever instruction, tool or grammar they belong to, so a table's 15,000 states share a
    # few hundred masks, and a state seen for the first time mostly finds its mask cached.
    # Keys are interned to ints (per vocabulary), so keys built from keys hash in constant time.

    def _kid(self, content) -> int:
        k = self._cids.get(content)
        if k is None:
            if len(self._cids) > CONTENT_KEYS_LIMIT or len(self._cmemo) > 2 * CONTENT_KEYS_LIMIT:
                # ids are never reused: keys cached under the old ones just miss
                self._cids.clear()
                self._cmemo.clear()
                self._lit_memo.clear()
                self._costly.clear()
            k = self._cids.setdefault(content, next(self._cnext))
        return k

    def _ckey(self, s: int) -> int:
        """The content key of state `s` (see above): equal keys, equal masks."""
        threads = self._sets[s]
        if len(threads) == 1:
            return self._top_key(*next(iter(threads)))
        return self._kid(frozenset(self._top_key(*t) for t in threads))

    def _top_key(self, ins, loc, st) -> int:
        """The key of one thread at a token's start: its mask is a function of it. Where the
        lookahead would cost too much to describe (a free-form JSON value after a string: every
        byte opens many ways), the thread is keyed by its instruction, as precompute keys it."""
        memo = self._cmemo
        k = memo.get((ins, loc, st))
        if k is not None:
            return k
        if (ins, st) not in self._costly:
            self._budget = KEY_BUDGET
            try:
                return self._content_key(ins, loc, st)
            except _Costly:
                self._costly.add((ins, st))  # its other positions would cost as much: don't try
        k = memo[(ins, loc, st)] = self._kid(("X", ins, ins.coarse(loc), _stack_key(st)))
        return k

    def _content_key(self, ins, loc, st) -> int:
        memo = self._cmemo
        t = type(ins)
        top = self.vocab.max_token_len
        if t is Lit:
            # Every offset of the literal is keyed on first meeting it: a call's literal is met
            # at a few offsets, each then a look-up.
            data = ins.data
            if (ins, None, st) not in memo:
                memo[(ins, None, st)] = 0
                for off in range(len(data) - 1):  # the last byte's is keyed when met
                    memo[(ins, off, st)] = self._rest_key(data[off:], ins.next, st)
                k = memo.get((ins, loc, st))
                if k is not None:
                    return k
            k = memo[(ins, loc, st)] = self._rest_key(data[loc:], ins.next, st)
            return k
        if t is JStr:  # keyed by the clamped counts: a string's states mostly share one
            count, sub = loc >> 4, loc & 15
            need, room = _jstr_clamps(ins, count, top)
            mk = (ins, -1 - sub, need, room, st)
            k = memo.get(mk)
            if k is None:
                if not self._jstr_closes[sub]:  # no token closes the string from here
                    k = self._kid(("S", sub, 0, room, None))
                else:
                    after = self._quote_key(ins.next, st) if need < top else None
                    k = self._kid(("S", sub, need, room, after))
                memo[mk] = k
            memo[(ins, loc, st)] = k
            return k
        if t is Select:
            chain = ins.chain(loc)
            if chain is not None:  # one name left: keyed as the literal it is
                return self._rest_key(chain[0], chain[1], st)
            if ins.size(loc) > 2 * KEY_BUDGET:  # near a trie's root: one of a kind, keyed as itself
                content = ("X", ins, loc, _stack_key(st))
            else:
                content = ("T", self._select_key(ins, loc, st, b""))
        elif t is JNum:
            n, sub = loc >> 4, loc & 15
            room = min(MAX_NUMBER_CHARS - n, number_margin(self.vocab))
            content = ("N", ins.integer, sub, room, self._akey(ins.next, st, self._num_ext(ins.next, st)))
        elif t is JInt:  # which digits may come, as far as a token's number part reaches
            tree = self._jint_tree(ins, loc, number_margin(self.vocab))
            content = ("I", tree, self._akey(ins.next, st, self._num_ext(ins.next, st)))
        else:
            content = self._plain_key(ins, loc, st)
        k = memo[(ins, loc, st)] = self._kid(content)
        return k

    def _rest_key(self, rest: bytes, nxt, st) -> int:
        """The key of a literal's remaining text `rest`, followed by instruction `nxt`: the text
        cut after the longest prefix some token starts with, and, only if some token spells all
        of it, what follows as far as such tokens go."""
        k = self._rest_cut(rest)
        if k < 0:
            k = self._kid(("L", rest, self._pkey_arrive(nxt, st, rest)))
        return k

    def _rest_cut(self, rest: bytes) -> int:
        """The key of a literal's remaining text `rest` where no token spells all of it: `rest`
        cut where no token reaches (-1 where some token spells all of it)."""
        lits = self._lit_memo
        k = lits.get(rest)  # literals of other keys and tools end alike
        if k is None:
            j = self._reach.get(rest[:2], 1)  # the longest token starting with its first two bytes
            if j > 2:  # tokens go past two bytes: the longest prefix some token starts with
                j = self._token_lcp(rest)
            k = lits[rest] = self._kid(("L", rest[:j])) if j < len(rest) else -1
        return k

    def _jint_tree(self, ins: JInt, loc, depth: int) -> tuple:
        """The number bytes a bounded integer accepts next, `depth` deep, each with whether the
        integer may end there: all a token (which adds at most `depth` of them) can see of it."""
        self._budget -= 1
        if self._budget < 0:
            raise _Costly  # a vocabulary with long runs of digits: ten branches a level
        out = []
        for b in b"-0123456789":
            nl = ins._next(loc, b)
            if nl is not None:
                stage, neg, mag = nl
                ends = stage >= 2 and ins._in(-mag if neg else mag)
                out.append((b, ends, self._jint_tree(ins, nl, depth - 1) if depth > 1 else None))
        return tuple(out)

    def _plain_key(self, ins, loc, st):
        if ins.accepting:
            return ("A",)
        tid = ins.special(loc)
        if tid is not None:  # offered only if something may follow it (a recursion may end there)
            return ("P", tid, self._akey(ins.next, st, 0))
        return ("X", ins, ins.coarse(loc), _stack_key(st))  # the instruction itself

    def _dkey(self, ins, loc, st, d: int) -> int:
        """The key of one thread `d` bytes into a token's lookahead: what it accepts of the
        next `d` bytes (0: only that it is alive)."""
        if d <= 0:
            return 0
        mk = (ins, loc, st, d)
        k = self._cmemo.get(mk)
        if k is not None:
            return k
        self._budget -= 1
        if self._budget < 0:
            raise _Costly
        t = type(ins)
        if t is Lit:
            rest = ins.data[loc:]
            # at exactly its length, whether anything may follow still matters
            content = ("l", rest[:d]) if len(rest) > d else ("l", rest, self._akey(ins.next, st, d - len(rest)))
        elif t is Select:
            kids, term = ins.children, ins.terminal
            content = ("t", tuple(
                (b, self._akey(term[c], st, d - 1) if c in term else None,
                 self._dkey(ins, c, st, d - 1) if kids[c] else None)
                for b, c in sorted(kids[loc].items())))
        elif t is JStr:
            count, sub = loc >> 4, loc & 15
            need = max(0, ins.min - count)
            after = self._akey(ins.next, st, d - 1) if need < d else None
            content = ("s", sub, min(need, d), min(ins.max - count, d), after)
        elif t is JNum:
            n, sub = loc >> 4, loc & 15
            content = ("n", ins.integer, sub, min(MAX_NUMBER_CHARS - n, d), self._akey(ins.next, st, d - 1))
        elif t is JInt:
            content = ("i", ins.lo, ins.hi, loc, self._akey(ins.next, st, d - 1))
        else:
            content = self._plain_key(ins, loc, st)
        k = self._cmemo[mk] = self._kid(content)
        return k

    def _quote_key(self, ins, st) -> int:
        """The key of what may follow a string's closing quote (arriving at `ins` with stack
        `st`): a token that closes a string is legal exactly when the text after its quote is,
        and that text is one of `quote_rests`. Literals are cut after the longest prefix such a
        text spells (`_quote_lits`), so strings followed by `,"city":` and by `,"unit":` share
        one key where no token spells `","c` or `","u`; otherwise, which of those texts the
        state accepts, walked. Memoised."""
        mk = ("q", ins, st)
        k = self._cmemo.get(mk)
        if k is None:
            saved, self._budget = self._budget, KEY_BUDGET  # this key may be part of another
            try:
                k = self._quote_lits(ins, st, b"")
            except _Costly:
                k = None
            finally:
                self._budget = saved
            if k is None:  # alive here: an empty arrival would have keyed without cost
                k = self._kid(("q", tuple(self._accepted_texts(self._after(ins, st), quote_rests(self.vocab)))))
            self._cmemo[mk] = k
        return k

    def _quote_lits(self, ins, st, p: bytes) -> int:
        """`_quote_key` for a text after a quote that has spelled `p` so far: a literal cut
        after what such a text spells of it; anything else (a string, a number, the end) as
        far as the longest such text reaches (`_dkey`; may raise _Costly)."""
        out: set = set()
        ins.arrive(0, st, out)
        rests = quote_rests(self.vocab)
        parts = []
        for i, loc, s in out:
            if type(i) is not Lit:
                parts.append(self._kid(("qd", self._dkey(i, loc, s, quote_reach(self.vocab) - len(p)))))
                continue
            text = i.data[loc:]
            j = _common_prefix(rests, p + text) - len(p)
            if j < len(text):
                parts.append(self._kid(("ql", text[:j])))
            else:  # some text spells all of it: what follows matters too
                after = self._quote_lits(i.next, s, p + text)
                parts.append(self._kid(("ql", text, after)))
        return self._kid(frozenset(parts))

    def _arrive_key(self, ins, st, how, arg) -> int:
        """The key of arriving at instruction `ins` with stack `st`: the set of its threads'
        keys, each `how(ins, loc, st, arg)` (the empty set when nothing can follow); memoised."""
        mk = (how.__name__, ins, st, arg)
        k = self._cmemo.get(mk)
        if k is None:
            out: set = set()
            ins.arrive(0, st, out)
            k = self._cmemo[mk] = self._kid(frozenset(how(i, l, s, arg) for i, l, s in out))
        return k

    def _akey(self, ins, st, d: int) -> int:
        """Arriving at `ins`, `d` bytes of lookahead (`_dkey`)."""
        return self._arrive_key(ins, st, self._dkey, d)

    def _pkey_arrive(self, ins, st, p: bytes) -> int:
        """Arriving at `ins` inside a token that has spelled `p` so far: only what tokens
        starting with `p` can go on to spell matters (`_pkey`)."""
        return self._arrive_key(ins, st, self._pkey, p)

    def _pkey(self, ins, loc, st, p: bytes) -> int:
        """The key of one thread inside a token that has spelled `p`: a literal or a trie cut
        where no token can follow; anything else as far as the longest token starting with `p`
        reaches (`_dkey`)."""
        e = self._ext(p)
        if e <= 0:
            return 0  # no token goes on past p: only that the thread is alive matters
        t = type(ins)
        if t is Lit:
            self._budget -= 1
            if self._budget < 0:
                raise _Costly
            rest = ins.data[loc:]
            j = self._token_lcp(p + rest) - len(p)
            if j < len(rest):
                return self._kid(("pl", rest[:j]))
            return self._kid(("pl", rest, self._pkey_arrive(ins.next, st, p + rest)))
        if t is Select:
            return self._kid(("pt", self._select_key(ins, loc, st, p)))
        go = np.flatnonzero(self._next_bytes(p) & ins.allowed(loc)).tolist()
        if not go:
            return 0  # no token goes on from p with a byte this thread accepts: alive is all
        # as far as the longest token that goes on from p with one of those bytes reaches
        return self._dkey(ins, loc, st, 1 + max(self._ext(p + bytes((b,))) for b in go))

    def _next_bytes(self, p: bytes) -> np.ndarray:
        """(256,) bool: the bytes that follow `p` in some text token (memoised per prefix)."""
        hit = self._nextm.get(p)
        if hit is None:
            v = self.vocab
            sb, sid = v.sorted_index
            a, b = v.prefix_range(p)
            hit = np.zeros(256, dtype=bool)
            n = len(p)
            if b - a <= 64:
                hit[[t[n] for t in sb[a:b] if len(t) > n]] = True
            else:
                ids = sid[a:b]
                ids = ids[v.lengths[ids] > n]
                hit[v.byte_matrix[n, ids]] = True
            if len(self._nextm) > NEXT_BYTES_LIMIT:
                self._nextm.clear()
            self._nextm[p] = hit
        return hit

    def _select_key(self, ins: Select, node: int, st, p: bytes) -> tuple:
        """A trie of keys from `node`, where tokens are `p` so far: only branches some token
        spells, and past a key's end only as far as a token reaches."""
        items = []
        kids, term = ins.children, ins.terminal
        self._budget -= 1
        if self._budget < 0:
            raise _Costly
        for b, child in sorted(kids[node].items()):
            q = p + bytes((b,))
            e = self._ext(q)
            if e < 0:
                continue  # no token starts with q: nothing down this branch is in the mask
            cont = term.get(child)
            tk = self._pkey_arrive(cont, st, q) if cont is not None else None
            ck = (self._select_key(ins, child, st, q) if e > 0 else 0) if kids[child] else None
            items.append((b, tk, ck))
        return tuple(items)

    def _token_lcp(self, data: bytes) -> int:
        """The length of the longest prefix of `data` that some token starts with."""
        return _common_prefix(self.vocab.sorted_index[0], data)

    def _ext(self, p: bytes) -> int:
        """How many bytes past `p` the longest token starting with `p` spells (-1: none)."""
        if len(p) <= 3:
            return self._reach.get(p, len(p) - 1) - len(p) if p else self.vocab.max_token_len
        e = self._extm.get(p)
        if e is None:
            v = self.vocab
            a, b = v.prefix_range(p)
            if a == b:
                e = -1
            elif b - a <= 32:
                e = max(len(x) for x in v.sorted_index[0][a:b]) - len(p)
            else:
                e = int(sorted_lengths(v)[a:b].max()) - len(p)
            if len(self._extm) > CONTENT_KEYS_LIMIT:
                self._extm.clear()
            self._extm[p] = e
        return e

    def _num_ext(self, ins, st) -> int:
        """How many bytes past a number's end a token may spell: the vocabulary's longest, unless
        what follows may itself start with a number character (then where the number ends is
        not fixed by the token, and the whole token may lie past it)."""
        mk = ("#", ins, st)
        e = self._cmemo.get(mk)
        if e is None:
            out: set = set()
            ins.arrive(0, st, out)
            if any(i.data[l] in _NUMBER_BYTES if type(i) is Lit else (i.allowed(l) & NUM_BYTES).any() for i, l, _ in out):
                e = self.vocab.max_token_len - 1
            else:
                e = jnum_ext(self.vocab)
            self._cmemo[mk] = e
        return e

    # -- masks ----------------------------------------------------------------------------------

    def mask(self, s: int) -> tuple:
        """The mask entry of state `s`: (dense, count, words, values), see `entry_dense`; cached."""
        hit = self._state_mask[s]
        if hit is not None:
            return hit
        threads = self._sets[s]
        key = None
        if len(threads) == 1:
            t, = threads  # a thread is its own memo key (see _top_key)
            key = self._cmemo.get(t)
            if key is None and type(t[0]) is JStr:  # a string at a new count: by its clamps
                ins, loc, st = t
                key = self._cmemo.get((ins, -1 - (loc & 15), *_jstr_clamps(ins, loc >> 4, self.vocab.max_token_len), st))
        if key is None:
            key = self._ckey(s)
        hit = self._masks._d.get(key)  # MaskCache.get, inlined: the common case of a first visit
        if hit is None:
            threads = self._sets[s]
            lone = next(iter(threads)) if len(threads) == 1 else None
            if lone is not None and type(lone[0]) in (JStr, Lit):
                hit = self._thread_entry(lone)
            elif lone is not None:
                hit = self._legal_bits(s).entry()
            else:
                # Threads run independently (an NFA), so a token is legal exactly when it is legal
                # for at least one thread: the mask is the union of single-thread masks, each
                # cached on its own and shared by every state that contains that thread.
                hit = _union([self._thread_mask(t) for t in threads], self.words)
            self._masks.put(key, hit)
            self.mask_computations += 1
        self._state_mask[s] = hit
        return hit

    def _thread_mask(self, t: tuple) -> tuple:
        """The mask entry of one thread of a state, as a state of its own would have it (cached
        under the same key). A literal's or a string's is computed without making it a state."""
        ins = t[0]
        if type(ins) is not Lit and type(ins) is not JStr:
            return self.mask(self._intern(frozenset([t])))
        key = self._cmemo.get(t)
        if key is None:
            key = self._top_key(*t)
        hit = self._masks.get(key)
        if hit is None:
            hit = self._thread_entry(t)
            self._masks.put(key, hit)
            self.mask_computations += 1
        return hit

    def _thread_entry(self, t: tuple) -> tuple:
        """The mask entry of a literal's or a string's thread, computed (neither stops nor
        waits for a special token)."""
        ins, loc, st = t
        if type(ins) is JStr:
            return self._jstr_entry(ins, loc, st)
        bits = _Bits(self.words)
        self._rest_legal(ins.data[loc:], ins.next, st, bits)
        return bits.entry()

    def _legal_bits(self, s: int) -> "_Bits":
        """The legal tokens of state `s`, collected for packing (a lone literal's or string's are
        `_thread_entry`'s)."""
        bits = _Bits(self.words)
        threads = self._sets[s]
        ins = None
        if len(threads) == 1:
            (ins, loc, st), = threads
        if isinstance(ins, Select):
            chain = ins.chain(loc)
            if chain is not None:
                self._rest_legal(chain[0], chain[1], st, bits)
            else:
                self._select_legal(ins, loc, st, bits)
        elif isinstance(ins, JNum) and self._jnum_legal(ins, loc, st, bits):
            pass
        elif isinstance(ins, JInt) and self._jint_legal(ins, loc, st, bits):
            pass
        elif any(t[0].consumes and not t[0].accepting and t[0].special(t[1]) is None for t in threads):
            bits.add(self._walk_from(s))
        sp = self.specials(s)
        if sp:
            bits.add(np.fromiter(sp, dtype=np.int64))
        if self._accepting[s]:
            bits.add(self.stop_ids)
        return bits

    def _init_row(self, s: int) -> None:
        """Mark every byte no thread of `s` accepts as DEAD in one vectorised write, so that the
        walk only ever computes real transitions in Python (one per live byte, not 256)."""
        if not self._row_init[s]:
            dead = ~self.first_bytes(s)
            with self._lock:
                self._table[s, dead] = DEAD
            self._row_init[s] = True

    def _delta(self, cur: np.ndarray, b: np.ndarray) -> np.ndarray:
        flat = cur.astype(np.int64) * 256 + b
        nxt = self._table.reshape(-1)[flat]
        miss = nxt == UNBUILT
        if miss.any():
            pairs = set(flat[miss].tolist())
            for st in {p >> 8 for p in pairs}:
                self._init_row(st)
            built = {}
            table = self._table.reshape(-1)
            for p in sorted(pairs):
                if table[p] == UNBUILT:
                    built[p] = self.step(p >> 8, p & 255)
                    table = self._table.reshape(-1)
            nxt = self._table.reshape(-1)[flat]
            lost = np.flatnonzero(nxt == UNBUILT)
            if lost.size:  # never read a transition back as "unbuilt": use what step returned
                nxt[lost] = [built.get(p) if p in built else self.step(p >> 8, p & 255) for p in flat[lost].tolist()]
        return nxt

    def _walk_from(self, s: int) -> np.ndarray:
        """Text tokens legal from `s`, by a vectorised walk starting at their first byte."""
        v = self.vocab
        order, offsets = v.first_byte_index
        fb = np.flatnonzero(self.first_bytes(s))
        if fb.size == 0:
            return np.zeros(0, dtype=np.int64)
        if fb.size <= 32:
            idx = np.concatenate([order[offsets[b] : offsets[b + 1]] for b in fb.tolist()])
        else:
            idx = order[offsets[fb[0]] : offsets[fb[-1] + 1]]
        return self._walk(idx.astype(np.int64), np.zeros(idx.size, dtype=np.int64), np.full(idx.size, s, dtype=np.int64))

    def _walk(self, idx: np.ndarray, pos: np.ndarray, cur: np.ndarray) -> np.ndarray:
        """Walk tokens `idx`, each from its byte offset `pos` in state `cur`; return those that
        end alive. Shapes: all (k,) int64."""
        if idx.size <= 48:
            # a few tokens: byte by byte in Python costs less than numpy's per-call overhead
            tb, table, step = self.vocab.token_bytes, self._table, self.step
            legal = []
            for t, p, s in zip(idx.tolist(), pos.tolist(), cur.tolist()):
                for b in tb[t][p:]:
                    n = int(table[s, b])
                    if n == UNBUILT:
                        n = step(s, b)
                        table = self._table
                    s = n
                    if s < 0:
                        break
                else:
                    legal.append(t)
            return np.array(legal, dtype=np.int64)
        v = self.vocab
        lens = v.lengths
        B = v.byte_matrix
        legal = []
        while idx.size:
            b = B[pos, idx]
            cur = self._delta(cur, b)
            ok = cur >= 0
            idx, pos, cur = idx[ok], pos[ok] + 1, cur[ok]
            done = lens[idx] == pos
            if done.any():
                legal.append(idx[done])
                keep = ~done
                idx, pos, cur = idx[keep], pos[keep], cur[keep]
        return np.concatenate(legal) if legal else np.zeros(0, dtype=np.int64)

    def _walk_bytes(self, s: int, data: bytes, start: int, memo: dict) -> int:
        """The state after `data[start:]` from `s` (DEAD if illegal), memoised in `memo`."""
        if start == len(data):
            return s
        key = (s, data[start:])
        n = memo.get(key)
        if n is None:
            n = s
            for b in key[1]:
                n = self.step(n, b)
                if n < 0:
                    break
            memo[key] = n
        return n

    # -- precomputation -------------------------------------------------------------------------

    def precompute(self, start: int, max_states: int = 50_000, small: int = 4096, per_instr_cap: int = 8,
                   max_depth: int = 1) -> int:
        """Compute now, rather than on first use, the mask of every state reachable from `start`
        at a token boundary, and the (state, token) transitions between them; returns the number
        of states reached. States an earlier walk expanded (for this grammar or another one that
        shares them) are not walked again.

        A breadth-first walk over tokens: from a state with at most `small` legal tokens (a
        literal, a trie of names or keys, digits) every legal token is walked to the state it
        ends in. A state inside a JSON string allows most of the vocabulary; from there only
        the tokens that close the string are walked, plus one way into each substate of the
        string body (an ordinary character, an escape, each kind of multi-byte character): every
        count past the string's minimum shares one cached mask. What is left (a state inside a
        free-form pattern, say) stays lazy. After this, a matcher on the grammar finds every
        structural mask in the cache: a look-up and a copy per step.
        """
        v = self.vocab
        vsize = v.size
        text_ok = v._extra.get("text_ok")
        if text_ok is None:  # text tokens, as bytes of 0/1 (a stop token is never text here)
            ok = ~v.special & (v.lengths > 0)
            ok[[t for t in v.stop_ids if t < vsize]] = False
            text_ok = v._extra["text_ok"] = bytes(ok.astype(np.uint8))
        text_np = np.frombuffer(text_ok, dtype=np.uint8).astype(bool)
        tb = v.token_bytes
        ends: dict[tuple[int, bytes], int] = {}  # (state, bytes) -> state: walks shared by tokens
        seen = {start}
        walked = self._walked
        expanded = self._walked_keys  # coarse keys: states that share one have the same successors' masks
        per_instr: dict[frozenset, int] = {}
        todo = [start]
        head = 0
        tn = self._token_next
        while head < len(todo) and len(seen) < max_states:
            s = todo[head]
            head += 1
            if s in walked:
                continue  # expanded by an earlier walk, which also reached what follows it
            if self._only_accept[s]:
                self.mask(s)
                continue
            key = self._coarse_key(s)
            if key in expanded:
                continue
            threads = self._sets[s]
            if any(t[2] is not None and t[2][3] > max_depth for t in threads):
                continue  # deep inside a recursive value (free-form JSON, a $ref): lazy
            kinds = frozenset(t[0] for t in threads)
            if not all(isinstance(i, Lit) for i in kinds):
                # A literal has as many states as bytes. A number or a string may have thousands
                # (every value of a bounded integer), a trie as many as its keys' bytes: the
                # first few are walked here, the rest stay lazy. More for a trie of names (every
                # call starts there), for a string (13 substates: escapes, multi-byte
                # characters) and for a bounded integer (each prefix of a value has its own
                # mask, and computing one on first use is among the costlier ones).
                k = per_instr.get(kinds, 0)
                if all(isinstance(i, Select) for i in kinds):
                    cap = per_instr_cap * 1024
                elif any(isinstance(i, (JInt, JStr)) for i in kinds):
                    cap = per_instr_cap * 2
                else:
                    cap = per_instr_cap
                if k >= cap:
                    continue
                per_instr[kinds] = k + 1
            expanded.add(key)
            walked.add(s)
            entry = self.mask(s)
            found: list[int] = []
            for tid, n in self.specials(s).items():
                if tid not in self._stop_set:  # consume_token decides on stop tokens itself
                    tn[s][tid] = n
                found.append(n)
            row = tn[s]
            lone = next(iter(threads)) if len(threads) == 1 else None
            if entry[1] <= small and lone is not None and isinstance(lone[0], Lit):
                # inside a literal a token's end is known without a walk: a proper prefix of
                # what remains moves the offset; a longer token goes on from the literal's end
                ins, off, st = lone
                rest_len = len(ins.data) - off
                x = None
                for t in entry_ids(entry, self.width):
                    if t >= vsize or not text_ok[t]:
                        continue
                    d = tb[t]
                    if len(d) < rest_len:
                        n = self._intern(frozenset([(ins, off + len(d), st)]))
                    else:
                        if x is None:
                            x = self._after(ins.next, st)
                        n = self._walk_bytes(x, d, rest_len, ends)
                    if n >= 0:
                        row[t] = n
                        found.append(n)
            elif lone is not None and isinstance(lone[0], JStr):
                # inside a string: the tokens that close it, each from the state after the
                # quote, grouped by what follows the quote (`"`, `",`, `"}` recur); and one
                # ordinary character standing for every token that stays inside
                ins, loc, st = lone
                idx = jstr_index(v, loc & 15)
                gid, rests = jstr_exit_groups(v, loc & 15)
                legal = unpack_bitmask(entry_dense(entry, self.words), self.width)
                sel = legal[idx.exit_ids] & text_np[idx.exit_ids]
                ids, g = idx.exit_ids[sel], gid[sel]
                order = np.argsort(g, kind="stable")
                ids, g = ids[order], g[order]
                cuts = np.flatnonzero(np.diff(g)) + 1
                x = self._after(ins.next, st)
                for part, k in zip(np.split(ids, cuts), g[np.r_[0, cuts]].tolist() if g.size else []):
                    n = self._walk_bytes(x, rests[k], 0, ends)
                    if n >= 0:
                        row.update(dict.fromkeys(part.tolist(), n))
                        found.append(n)
                if loc & 15 == 0:  # between characters: one way into every substate
                    found.extend(self._walk_bytes(s, r, 0, ends) for r in _JSTR_REACH)
            elif entry[1] <= small:
                for t in entry_ids(entry, self.width):
                    if t < vsize and text_ok[t]:
                        n = self._walk_bytes(s, tb[t], 0, ends)
                        if n >= 0:
                            row[t] = n
                            found.append(n)
            # anything else (a free-form pattern, a multi-thread state with a string) stays lazy
            self._token_next_size += len(row)
            for n in found:
                if n >= 0 and n not in seen:
                    seen.add(n)
                    todo.append(n)
        if head < len(todo):
            # stopped at max_states: states it expanded have successors it never reached, so
            # they must not stop a later walk
            walked.clear()
            expanded.clear()
        return len(seen)

    def _after(self, ins, st) -> int:
        """The state entered at instruction `ins` with stack `st` (DEAD if none); memoised (the
        offsets of one literal, the states of one string, all ask for the same one)."""
        key = (ins, st)
        r = self._after_memo.get(key)
        if r is None:
            out: set = set()
            ins.arrive(0, st, out)
            r = self._after_memo[key] = self._intern(frozenset(out)) if out else DEAD
        return r

    def _prefix_tokens(self, p: bytes, x: int, bits: "_Bits", exact_ok: bool = True) -> bool:
        """Mark the tokens that are exactly `p` (if `exact_ok`), and the longer tokens starting
        with `p` whose rest is legal from state `x` (the state after `p`; DEAD if nothing may
        follow). False if no token starts with `p`, so no longer prefix needs looking at."""
        v = self.vocab
        sb, sid = v.sorted_index
        a = bisect_left(sb, p)
        if a == len(sb) or not sb[a].startswith(p):
            return False
        upper = _prefix_upper(p)
        b = bisect_left(sb, upper, a) if upper is not None else len(sb)
        e = a
        n = len(p)
        while e < b and len(sb[e]) == n:  # equal tokens sort first within the range
            e += 1
        if exact_ok and e > a:
            bits.add(sorted_ids_list(v)[a:e])
        if e < b and x >= 0:
            threads = self._sets[x]
            ins = next(iter(threads))[0] if len(threads) == 1 else None
            if isinstance(ins, Lit):
                # What follows is a literal: chain through it with look-ups instead of a walk
                # (a tool name's closing quote followed by `,"args":{"path":"`, say).
                (ins, off, st), = threads
                rest = ins.data[off:]
                lookup, dups = v.lookup, v.duplicates
                ids = []
                for k in range(1, min(len(rest) - 1, v.max_token_len - n) + 1):
                    t = lookup.get(p + rest[:k])
                    if t is not None:
                        ids.append(t)
                        if dups:
                            ids.extend(dups.get(p + rest[:k], ()))
                bits.add(ids)
                if n + len(rest) <= v.max_token_len:
                    x2 = self._after(ins.next, st)
                    self._prefix_tokens(p + rest, x2, bits, exact_ok=x2 >= 0)
            else:
                ids = sid[e:b]
                bits.add(self._walk(ids, np.full(ids.size, n, dtype=np.int64), np.full(ids.size, x, dtype=np.int64)))
        return True

    def _rest_legal(self, rest: bytes, nxt, st, bits: "_Bits") -> None:
        """A literal's remaining text `rest`, then instruction `nxt`: the tokens that spell a
        prefix of it, and those that spell all of it and go on legally. Look-ups and binary
        searches over the sorted vocabulary, no scan."""
        v = self.vocab
        lookup, dups = v.lookup, v.duplicates
        ids = []
        j = self._token_lcp(rest)  # no token goes past the longest prefix tokens start with
        for k in range(1, min(j, len(rest) - 1) + 1):  # tokens spelling a proper prefix
            t = lookup.get(rest[:k])
            if t is not None:
                ids.append(t)
                if dups:
                    ids.extend(dups.get(rest[:k], ()))
        bits.add(ids)
        if j == len(rest):  # tokens spelling all of it, and maybe more
            x = self._after(nxt, st)
            self._prefix_tokens(rest, x, bits, exact_ok=x >= 0)

    def _select_legal(self, ins: Select, node: int, st, bits: "_Bits") -> None:
        """A trie of keys: walk the trie, pruning a branch as soon as no token starts with its
        bytes (a memoised look-up per prefix, shared by every trie on the vocabulary); a token
        is looked up by its bytes, and only where a key ends are the tokens that run on into
        what follows walked."""
        v = self.vocab
        lookup, dups, ext = v.lookup, v.duplicates, self._ext
        kids, term = ins.children, ins.terminal
        ids = []
        todo = [(node, b"")]
        while todo:
            n, acc = todo.pop()
            for byte, child in kids[n].items():
                p = acc + bytes((byte,))
                e = ext(p)
                if e < 0:
                    continue  # no token starts with p
                cont = term.get(child)
                x = self._after(cont, st) if cont is not None else DEAD
                more = bool(kids[child])
                if more or x >= 0:  # a token that is exactly p
                    t = lookup.get(p)
                    if t is not None:
                        ids.append(t)
                        if dups:
                            ids.extend(dups.get(p, ()))
                if e > 0:
                    if x >= 0:  # tokens that run past the key's end into what follows
                        self._prefix_tokens(p, x, bits, exact_ok=False)
                    if more:
                        todo.append((child, p))
        bits.add(ids)

    def _jnum_legal(self, ins: JNum, loc: int, st, bits: np.ndarray) -> bool:
        """A number: the tokens that stay inside it, and those that end it in a final substate
        and go on legally after it. False (use the generic walk) when what follows the number
        could itself start with a number character, where the split is ambiguous."""
        x = self._after(ins.next, st)
        if x >= 0 and (self.first_bytes(x) & NUM_BYTES).any():
            return False
        n, sub = loc >> 4, loc & 15
        idx = jnum_index(self.vocab, sub, ins.integer)
        room = MAX_NUMBER_CHARS - n
        bits.add(idx.inside_ids[idx.inside_len <= room])
        if x < 0:
            return True
        ok = idx.exit_pos <= room
        ids, pos = idx.exit_ids[ok], idx.exit_pos[ok]
        if ids.size:
            bits.add(self._walk(ids, pos, np.full(ids.size, x, dtype=np.int64)))
        return True

    def _jint_legal(self, ins: JInt, loc, st, bits: "_Bits") -> bool:
        """A bounded integer: the tokens made of number bytes that it accepts, one by one (the
        few that an integer automaton accepts at all, from the per-vocabulary number index),
        and those that end it within its bounds and go on legally. False (use the generic walk)
        where what follows could itself start with a number character."""
        x = self._after(ins.next, st)
        if x >= 0 and (self.first_bytes(x) & NUM_BYTES).any():
            return False
        stage = loc[0]
        idx = jnum_index(self.vocab, _JINT_SUB[stage], True)
        tb, step = self.vocab.token_bytes, ins._next

        def run(data):
            at = loc
            for b in data:
                at = step(at, b)
                if at is None:
                    return None
            return at

        bits.add([t for t in idx.inside_ids.tolist() if run(tb[t]) is not None])
        if x < 0 or not idx.exit_ids.size:
            return True
        ids, pos = [], []
        for t, p in zip(idx.exit_ids.tolist(), idx.exit_pos.tolist()):
            at = run(tb[t][:p])
            if at is not None and at[0] >= 2 and ins._in(-at[2] if at[1] else at[2]):
                ids.append(t)
                pos.append(p)
        if ids:
            bits.add(self._walk(np.array(ids, dtype=np.int64), np.array(pos, dtype=np.int64),
                                np.full(len(ids), x, dtype=np.int64)))
        return True

    def _jstr_entry(self, ins: JStr, loc: int, st) -> tuple:
        """A string body's mask entry, from two cached parts: the tokens that stay inside
        (per vocabulary, substate and room left) and the tokens that close the string and go on
        legally after it (per substate, continuation, characters still owed and room left).
        The two sets are disjoint, so the count is a sum."""
        count, sub = loc >> 4, loc & 15
        v = self.vocab
        room = ins.max - count
        inside, n_in = jstr_inside(v, sub, self.words, room)
        x = self._after(ins.next, st)
        if x < 0:
            return inside, n_in, None, None
        need, roomc = min(max(0, ins.min - count), v.max_token_len + 1), min(room, v.max_token_len)
        after = self._quote_key(ins.next, st)  # what a closing token reaches
        key = ("jexits", sub, after, need, roomc)
        hit = self._masks.get(key)
        if hit is None:
            idx = jstr_index(v, sub)
            ok = (idx.exit_chars >= need) & (idx.exit_chars <= roomc)
            ids = idx.exit_ids[ok & self._exits_after(sub, x, idx, after)]
            bits = _Bits(self.words)
            bits.add(ids)
            hit = (bits.packed() if ids.size else None, int(ids.size))
            self._masks.put(key, hit)
        if hit[0] is None:
            return inside, n_in, None, None
        return inside | hit[0], n_in + hit[1], None, None

    def _exits_after(self, sub: int, x: int, idx: "JStrIndex", after: int) -> np.ndarray:
        """Which string-closing tokens (from substate `sub`) go on legally in state `x` after the
        closing quote. Independent of the string's count and of which string it was, so it is
        cached per vocabulary by (substate, `after`: the content key of `x` as far as a closing
        token reaches): every string followed by the same few bytes (`"}}`, `","`) shares one
        walk."""
        key = ("exits", sub, after)
        hit = self._masks.get(key)
        if hit is not None:
            return hit[0]
        threads = self._sets[x]
        lit = next(iter(threads)) if len(threads) == 1 else None
        if lit is not None and isinstance(lit[0], Lit):
            legal = self._exits_into_literal(sub, lit, idx)
        else:
            legal = self._exits_by_rest(sub, x, idx)
        self._masks.put(key, (legal,))
        return legal

    def _exits_by_rest(self, sub: int, x: int, idx: "JStrIndex") -> np.ndarray:
        """The string-closing tokens whose text after the quote state `x` accepts: each distinct
        text walked once (they are short: see `quote_rests`), and only those that start with a
        byte `x` accepts."""
        keys, order = jstr_exit_rests(self.vocab, sub)
        legal = np.zeros(idx.exit_ids.size, dtype=bool)
        legal[order[self._accepted_texts(x, keys)]] = True
        return legal

    def _accepted_texts(self, x: int, keys: list[bytes]) -> list[int]:
        """The indices of the sorted texts `keys` that state `x` (alive) accepts: b"" always;
        each distinct text walked once, and only those that start with a byte `x` accepts."""
        hits = list(range(bisect_right(keys, b"")))
        memo: dict = {}
        for byte in np.flatnonzero(self.first_bytes(x)).tolist():
            a = bisect_left(keys, bytes((byte,)))
            b = bisect_left(keys, bytes((byte + 1,)), a) if byte < 255 else len(keys)
            prev, ok = None, False
            for i in range(a, b):
                if keys[i] != prev:
                    prev = keys[i]
                    ok = self._walk_bytes(x, prev, 0, memo) >= 0
                if ok:
                    hits.append(i)
        return hits

    def _walk_marks(self, ids: np.ndarray, pos: np.ndarray, x: int) -> np.ndarray:
        """(k,) bool: which of tokens `ids`, each from byte `pos`, end alive from state x."""
        ok = self._walk(ids, pos, np.full(ids.size, x, dtype=np.int64))
        return np.isin(ids, ok)

    def _exits_into_literal(self, sub: int, thread, idx: "JStrIndex") -> np.ndarray:
        """The string-closing tokens legal when a literal follows the quote (`","text":"`, `"}}`:
        nearly always): those whose text after the quote is a prefix of the literal, found by
        binary search over the remainders sorted once per vocabulary, plus the few that run past
        the literal's end, walked from there. No walk over all closing tokens."""
        ins, off, st = thread
        lit = ins.data[off:]
        keys, order = jstr_exit_rests(self.vocab, sub)
        legal = np.zeros(idx.exit_ids.size, dtype=bool)
        for k in range(min(len(lit), self.vocab.max_token_len + 1)):  # proper prefixes, empty included
            p = lit[:k]
            a, b = bisect_left(keys, p), bisect_right(keys, p)
            legal[order[a:b]] = True
        a = bisect_left(keys, lit)
        b = bisect_left(keys, _prefix_upper(lit)) if _prefix_upper(lit) is not None else len(keys)
        if a < b:
            x2 = self._after(ins.next, st)
            if x2 >= 0:
                sel = order[a:b]
                exact = np.array([len(keys[i]) == len(lit) for i in range(a, b)], dtype=bool)
                legal[sel[exact]] = True
                more = sel[~exact]
                if more.size:
                    legal[more] = self._walk_marks(idx.exit_ids[more], idx.exit_pos[more] + len(lit), x2)
        return legal

    # -- forced continuations and finish ------------------------------------------------------------

    def forced(self, s: int) -> list[int]:
        """Tokens forced from state `s` (see Matcher.forced_tokens); cached per state."""
        hit = self._forced.get(s)
        if hit is not None:
            return hit
        out: list[int] = []
        buf = bytearray()
        cur = s
        while len(buf) < 512:
            if self._accepting[cur]:
                break
            fb = np.flatnonzero(self.first_bytes(cur))
            sp = self.specials(cur)
            if fb.size == 1 and not sp:
                nxt = self.step(cur, int(fb[0]))
                if nxt < 0:
                    break
                buf.append(int(fb[0]))
                cur = nxt
            elif fb.size == 0 and len(sp) == 1:
                toks = self._tokenize_forced(bytes(buf), final=False)
                if toks is None:
                    break
                out.extend(toks)
                buf.clear()
                (tid, cur), = sp.items()
                out.append(tid)
            else:
                break
        if buf:
            toks = self._tokenize_forced(bytes(buf), final=True)
            if toks:
                out.extend(toks)
        self._forced[s] = out
        return out

    def _tokenize_forced(self, data: bytes, final: bool) -> list[int] | None:
        if not data:
            return []
        v = self.vocab
        toks = None
        enc = v._extra.get("encode")
        if enc is not None:
            try:
                cand = enc(data.decode("utf-8"))
                if v.decode(cand) == data and not any(v.special[t] for t in cand):
                    toks = list(cand)
            except UnicodeDecodeError:
                pass
        if toks is None:
            toks = v.greedy_tokenize(data)
        if toks is None:
            return None
        # The last forced token may be a prefix of a longer token that crosses into the model's
        # part; forcing it would take that choice away, so it is left to the model -- and so on
        # back: once it is dropped, the token before it ends the run, with the same question
        # for what is left of the run from its start (`":` then `{`: a token `":{"` may cross).
        if final:
            tail = b""
            while toks:
                tail = v.token_bytes[toks[-1]] + tail
                if not v.has_extension(tail):
                    break
                toks.pop()
        return toks

    def shortest_completion(self, s: int, limit: int = 200_000) -> list | None:
        """A short sequence of bytes/special ids from `s` to an accepting state, as a list of
        ints (bytes) and ("special", id) tuples; None if none within `limit` steps.

        A breadth-first search, first with each layer cut to FINISH_BEAM states (the fewest open
        frames first, then in the order of preferred bytes): states that hold text (a bounded
        number keeps its digits) multiply by ten a byte, and `minimum: 1e9` needs ten layers of
        them. The cut search finds the shortest completion wherever a layer has few states
        (literals, strings, names); past a cut it may find a longer one (`minimum: 123456789`
        completes as 1000000000). Where it finds nothing, it runs again taking the states of a
        layer in turns by place in the grammar (see `_completion`); where that finds nothing too
        (a free-form value, an optional bounded number and a required nested object together
        defeat both orders), a depth-first dive along the preferred bytes (`_dive`) finds a
        longer completion at once, and only where it finds none does the whole search run."""
        for turns in (False, True):
            path = self._completion(s, limit, FINISH_BEAM, turns)
            if path is not None:
                return path
        path = self._dive(s, limit)
        return path if path is not None else self._completion(s, limit, None)

    def _open_frames(self, s: int) -> int:
        """The fewest frames (calls, list items) any thread of state `s` has open."""
        best = None
        for _, _, st in self._sets[s]:
            n = 0
            while st is not None:
                n += 1
                st = st[2]
            if best is None or n < best:
                best = n
        return best or 0

    def _place(self, s: int) -> frozenset:
        """Where in the grammar state `s` is: its threads' instructions and open frames (as
        coarse as in `_coarse_key`), without the threads' own local states (a number's text)."""
        return frozenset((ins, _stack_key(st)) for ins, _, st in self._sets[s])

    def _finish_edges(self, cur: int):
        """(byte or ("special", id), next state) from `cur`, preferred bytes first (lazily)."""
        allowed = np.flatnonzero(self.first_bytes(cur)).tolist()
        # Non-ASCII bytes never shorten a completion when an ASCII byte is possible (they only
        # open multi-byte characters), so they are tried only when nothing else is allowed, e.g.
        # inside a UTF-8 character.
        ascii_ = [b for b in allowed if b < 0x80]
        pool = ascii_ or allowed
        for b in [b for b in _FINISH_ORDER if b in pool] + [b for b in pool if b not in _FINISH_ORDER]:
            yield b, self.step(cur, b)
        for t, n in self.specials(cur).items():
            yield ("special", t), n

    def _dive(self, s: int, limit: int) -> list | None:
        """A completion from `s` found depth first, the preferred byte first at every step (each
        coarse key visited once): not the shortest, but found in about as many steps as it is
        long wherever the preferred bytes lead to an end, as they nearly always do."""
        if self._accepting[s]:
            return []
        key = self._coarse_key
        seen = {key(s)}
        path: list = []
        stack = [self._finish_edges(s)]  # one edge iterator per state on the path
        steps = 0
        while stack and steps < limit:
            for sym, n in stack[-1]:
                steps += 1
                if n < 0:
                    continue
                k = key(n)
                if k in seen:
                    continue
                seen.add(k)
                path.append(sym)
                if self._accepting[n]:
                    return path
                stack.append(self._finish_edges(n))
                break
            else:
                stack.pop()
                if path:
                    path.pop()
        return None

    def _completion(self, s: int, limit: int, beam: int | None, turns: bool = False) -> list | None:
        if self._accepting[s]:
            return []
        prev: dict[int, tuple[int, object]] = {s: (-1, None)}
        # States whose coarse keys are equal have equally short completions (a string's count
        # past its minimum, a number's digits far from its cap, a list's items past its minimum:
        # see Instr.coarse), so only the first met is searched from: `"?`, `"??`, `"???` are one.
        key = self._coarse_key
        seen = {key(s)}
        frontier = [s]
        steps = 0
        while frontier and steps < limit:
            if beam is not None and len(frontier) > beam:
                # Keep the states with the fewest open frames (a free-form value's nested objects
                # and lists, a list's items): they are closest to an end, other things equal.
                if not turns:
                    frontier.sort(key=self._open_frames)
                else:
                    # The same, taken in turns by place in the grammar (the same instructions with
                    # the same frames open): the first state of each place, then the second of
                    # each, and so on. A place that multiplies its states (a bounded number keeps
                    # its text: each digit is a state of its own) cannot fill the layer then, and
                    # push out, one frame deeper, the one state that goes on to the end.
                    per: dict = {}
                    turn = {}
                    for x in frontier:
                        where = self._place(x)
                        turn[x] = per[where] = per.get(where, 0) + 1
                    frontier.sort(key=lambda x: (turn[x], self._open_frames(x)))
                # States cut from this layer were not searched from: forget them, so that a later
                # layer that reaches one again searches from it (else the only way to an end
                # could be lost: the quote closing a free-form value, met first in a cut state).
                for x in frontier[beam:]:
                    del prev[x]
                    seen.discard(key(x))
                frontier = frontier[:beam]
            nxt_frontier = []
            for cur in frontier:
                for sym, n in self._finish_edges(cur):
                    steps += 1
                    if n < 0 or n in prev:
                        continue
                    k = key(n)
                    if k in seen:
                        continue
                    prev[n] = (cur, sym)
                    seen.add(k)
                    if self._accepting[n]:
                        path = []
                        while n != s:
                            p, sym2 = prev[n]
                            path.append(sym2)
                            n = p
                        return path[::-1]
                    nxt_frontier.append(n)
            frontier = nxt_frontier
        return None


AUTOMATON_STATES = 100_000  # states in one shared automaton before new grammars get a fresh one
MAX_STRING = 256  # by default, the most characters of a string whose schema gives no maxLength
FINISH_BEAM = 16  # states kept per layer by the first search for a forced finish


class TagIds(dict):
    """Tag text -> the token id a grammar's `ir.Special` matches. A special token's own id; else
    the one ordinary token that spells the tag, resolved as `railcall.output.Delimiters` does
    (Qwen's `<think>` and `<tool_call>` are added tokens that are not special): the grammar then
    takes that token alone there, as the output parser counts that token alone, and a tag spelled
    in pieces is no tag for either. No such token: None, and the tag is matched as text."""

    def __init__(self, vocab: Vocabulary):
        super().__init__((t, i) for i, t in vocab.special_text.items())
        self.vocab = vocab
        self.ordinary = ordinary_tags(vocab)

    def get(self, text: str, default=None):
        hit = super().get(text)
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
    `compiled_grammar()` keeps an LRU of them keyed by grammar content."""

    def __init__(self, grammar: ir.Grammar, vocab: Vocabulary, *, max_string: int = MAX_STRING):
        self.grammar = grammar
        self.vocab = vocab
        special_ids = TagIds(vocab)
        shared = vocab_cache(vocab)
        with shared.lock:
            frags = shared.fragments.get(max_string)
            if frags is None:
                frags = shared.fragments[max_string] = Fragments(max(vocab.max_token_len, 1),
                                                                 max(number_margin(vocab), 1))
            self.program = compile_grammar(grammar, special_ids, max_string=max_string, fragments=frags)
            auto = shared.automata.get(max_string)
            if auto is None or len(auto._sets) >= AUTOMATON_STATES:
                auto = shared.automata[max_string] = Automaton(vocab)
        self.auto = auto
        self.precomputed = False
        start: set = set()
        self.program.start.arrive(0, None, start)
        if not start:
            raise MatcherError("the grammar matches nothing")
        self.start_state = auto._intern(frozenset(start))
        self._computations_before = auto.mask_computations

    def __getattr__(self, name: str):
        # only reached for what is not an attribute of the grammar itself: the automaton's
        if name == "auto":
            raise AttributeError(name)
        return getattr(self.auto, name)

    @property
    def mask_computations(self) -> int:
        """Masks computed in the shared automaton since this grammar was compiled."""
        return self.auto.mask_computations - self._computations_before

    def precompute(self, max_states: int = 50_000, small: int = 4096, per_instr_cap: int = 8,
                   max_depth: int = 1) -> int:
        """Every structural mask of this grammar now (see Automaton.precompute)."""
        n = self.auto.precompute(self.start_state, max_states, small, per_instr_cap, max_depth)
        self.precomputed = True
        return n


class JStrIndex(NamedTuple):
    inside_ids: np.ndarray  # (k,) tokens that stay inside the string
    inside_chars: np.ndarray  # (k,) characters each adds
    inside_end: np.ndarray  # (k,) the substate each ends in
    exit_ids: np.ndarray  # (e,) tokens that close the string
    exit_chars: np.ndarray  # (e,) characters before the closing quote
    exit_pos: np.ndarray  # (e,) byte offset just after the closing quote


class JNumIndex(NamedTuple):
    inside_ids: np.ndarray  # (k,) tokens made only of number bytes the number accepts
    inside_len: np.ndarray  # (k,) their lengths
    exit_ids: np.ndarray  # (e,) tokens whose number part ends, in a final substate, before their end
    exit_pos: np.ndarray  # (e,) the byte offset where the number ends (>= 1)


def number_margin(vocab: Vocabulary) -> int:
    """The most characters of a JSON number one token can add, from any point of a number: the
    margin past which a number's masks no longer depend on its length. It counts every byte the
    number accepts before a token leaves it, wherever it leaves (what follows a number may itself
    start with a number character, `1e` then `ex`, say). Tighter than the longest run of number
    bytes in a token (SmolLM2 has a token of 64 dashes; no number holds two), so that number
    states far from the length cap share their masks."""
    hit = vocab._extra.get("number_margin")
    if hit is None:
        hit = 0
        lens = vocab.lengths
        B = vocab.byte_matrix
        for integer in (False, True):
            table = NUM_NEXT[int(integer)].astype(np.int64)
            for sub in range(table.shape[0]):
                idx = np.flatnonzero(lens > 0)
                cur = np.full(idx.size, sub, dtype=np.int64)
                j = 0
                while idx.size:
                    t = table[cur, B[j, idx]]
                    go = t >= 0
                    if not go.any():
                        break
                    j += 1  # some token's first j bytes all stay inside the number
                    idx, cur = idx[go], t[go]
                    keep = lens[idx] > j
                    idx, cur = idx[keep], cur[keep]
                hit = max(hit, j)
        vocab._extra["number_margin"] = hit
    return hit


def jnum_index(vocab: Vocabulary, sub: int, integer: bool) -> JNumIndex:
    """Per vocabulary, number substate and kind: how each text token continues a JSON number.
    Computed once (vectorised), shared by every grammar on this vocabulary."""
    cache = vocab._extra.setdefault("jnum", {})
    hit = cache.get((sub, integer))
    if hit is not None:
        return hit
    table = NUM_NEXT[int(integer)].astype(np.int64)
    lens = vocab.lengths
    B = vocab.byte_matrix
    idx = np.flatnonzero(lens > 0)
    cur = np.full(idx.size, sub, dtype=np.int64)
    inside_ids, inside_len, exit_ids, exit_pos = [], [], [], []
    j = 0
    while idx.size:
        b = B[j, idx]
        t = table[cur, b]
        stop = t < 0
        if j > 0 and stop.any():
            # the number ends before byte j: legal only from a final substate
            ends = stop & NUM_FINAL[cur]
            exit_ids.append(idx[ends])
            exit_pos.append(np.full(int(ends.sum()), j, dtype=np.int64))
        go = ~stop
        idx, cur = idx[go], t[go]
        j += 1
        done = lens[idx] == j
        if done.any():
            inside_ids.append(idx[done])
            inside_len.append(np.full(int(done.sum()), j, dtype=np.int64))
            keep = ~done
            idx, cur = idx[keep], cur[keep]

    def cat(xs):
        return np.concatenate(xs) if xs else np.zeros(0, dtype=np.int64)

    hit = JNumIndex(cat(inside_ids), cat(inside_len), cat(exit_ids), cat(exit_pos))
    cache[(sub, integer)] = hit
    return hit


def _common_prefix(sorted_bytes: list[bytes], data: bytes) -> int:
    """The length of the longest prefix of `data` that some item of `sorted_bytes` starts with
    (the longest common prefix with one of its neighbours in the sorted order)."""
    a = bisect_left(sorted_bytes, data)
    best = 0
    for t in (sorted_bytes[a - 1] if a else b"", sorted_bytes[a] if a < len(sorted_bytes) else b""):
        n = min(len(t), len(data))
        i = best
        if t[:i] != data[:i]:
            continue
        while i < n and t[i] == data[i]:
            i += 1
        best = i
    return best


def quote_rests(vocab: Vocabulary) -> list[bytes]:
    """Every text that follows a `"` in some text token (b"" where it ends one), sorted and
    distinct: all that a token that closes a JSON string can spell after the quote, whether the
    token started inside the string or before it (63 texts on SmolLM2, 325 on Gemma 3)."""
    hit = vocab._extra.get("quote_rests")
    if hit is None:
        found = {b""}
        for t in vocab.sorted_index[0]:
            i = t.find(b'"')
            while i >= 0:
                found.add(t[i + 1 :])
                i = t.find(b'"', i + 1)
        hit = vocab._extra["quote_rests"] = sorted(found)
    return hit


def quote_reach(vocab: Vocabulary) -> int:
    """The longest of `quote_rests`: how far past a quote a token can reach."""
    hit = vocab._extra.get("quote_reach")
    if hit is None:
        hit = vocab._extra["quote_reach"] = max(map(len, quote_rests(vocab)))
    return hit


def jnum_ext(vocab: Vocabulary) -> int:
    """The most bytes a token that ends a number spells after it, from any substate, where what
    follows cannot start with a number character (0 on SmolLM2 and Gemma 3: no token holds a
    digit and then something else)."""
    hit = vocab._extra.get("jnum_ext")
    if hit is None:
        lens = vocab.lengths
        hit = 0
        for integer in (False, True):
            for sub in range(9):
                idx = jnum_index(vocab, sub, integer)
                if idx.exit_ids.size:
                    hit = max(hit, int((lens[idx.exit_ids] - idx.exit_pos).max()))
        vocab._extra["jnum_ext"] = hit
    return hit


def prefix_reach(vocab: Vocabulary) -> dict[bytes, int]:
    """Per prefix of one to three bytes of some text token, the length of the longest text token
    that starts with it (absent: none does). How far a token that starts on a literal can reach
    into it, and whether any token starts with a short prefix, in one look-up."""
    hit = vocab._extra.get("prefix_reach")
    if hit is None:
        hit = {}
        get = hit.get
        for b in vocab.sorted_index[0]:
            n = len(b)
            for k in range(1, min(n, 3) + 1):
                q = b[:k]
                if get(q, 0) < n:
                    hit[q] = n
        vocab._extra["prefix_reach"] = hit
    return hit


def sorted_lengths(vocab: Vocabulary) -> np.ndarray:
    """The lengths of `vocab.sorted_index`'s tokens, in its order."""
    hit = vocab._extra.get("sorted_lengths")
    if hit is None:
        hit = vocab._extra["sorted_lengths"] = vocab.lengths[vocab.sorted_index[1]]
    return hit


def prepare_vocabulary(vocab: Vocabulary) -> None:
    """Build the per-vocabulary indexes the matcher uses (byte matrix, first-byte groups, the
    JSON-string index) now rather than on the first mask that needs them. Once per vocabulary:
    when a model is loaded, before the first request."""
    if vocab._extra.get("prepared"):
        return
    vocab.byte_matrix
    vocab.first_byte_index
    vocab.sorted_index
    sorted_ids_list(vocab)
    vocab.lookup
    vocab.duplicates
    number_margin(vocab)
    words = (vocab.logits_width + 31) // 32
    for sub in range(13):
        jstr_index(vocab, sub)
        jstr_inside(vocab, sub, words)
    for room in range(vocab.max_token_len):  # between characters, near a string's cap
        jstr_inside(vocab, 0, words, room)
    for sub in range(13):
        jstr_exit_rests(vocab, sub)
        jstr_exit_groups(vocab, sub)
    for integer in (False, True):
        for sub in range(9):
            jnum_index(vocab, sub, integer)
    quote_reach(vocab)
    jnum_ext(vocab)
    sorted_lengths(vocab)
    prefix_reach(vocab)
    vocab._extra["prepared"] = True
    # The indexes (and the tokenizer's objects before them) live as long as the vocabulary. One
    # full collection now moves them to the oldest generation; otherwise the young-generation
    # collections that a compile's allocations trigger traverse them all again (on Gemma 3's
    # 262k tokens, two such collections took ~17 ms of a 128-tool compile).
    gc.collect()


def _jstr_reach() -> list[bytes]:
    """The shortest bytes from between-characters (substate 0) into each substate of a JSON
    string body: an ordinary character, and the inside of each escape and multi-byte character."""
    table = JSTR_NEXT.tolist()
    reach = {0: b""}
    todo = [0]
    while todo:
        sub = todo.pop(0)
        for b in range(256):
            n = table[sub][b]
            if n >= 0 and n not in reach:
                reach[n] = reach[sub] + bytes([b])
                todo.append(n)
    return [b"a"] + [r for sub, r in sorted(reach.items()) if sub]


_JSTR_REACH = _jstr_reach()


def fill_stops(row: np.ndarray, vocab: Vocabulary) -> int:
    """Write the mask of the stop tokens alone into `row` (a matcher in its error state, or one
    whose grammar could not be built); return their count."""
    packed = vocab._extra.get("stop_mask")
    if packed is None:
        packed = vocab._extra["stop_mask"] = pack_ids(np.array(sorted(vocab.stop_ids), dtype=np.int64),
                                                      vocab.logits_width)
    row[:] = packed
    return len(vocab.stop_ids)


def sorted_ids_list(vocab: Vocabulary) -> list[int]:
    """`vocab.sorted_index[1]` as a Python list (slices of a few ids without numpy calls)."""
    hit = vocab._extra.get("sorted_ids_list")
    if hit is None:
        hit = vocab._extra["sorted_ids_list"] = vocab.sorted_index[1].tolist()
    return hit


def _prefix_upper(p: bytes) -> bytes | None:
    """The least byte string greater than every string that starts with `p` (None: no bound)."""
    q = p.rstrip(b"\xff")
    if not q:
        return None
    return q[:-1] + bytes([q[-1] + 1])


def jstr_exit_rests(vocab: Vocabulary, sub: int) -> tuple[list[bytes], np.ndarray]:
    """Per vocabulary and substate: each string-closing token's text after its quote, sorted
    (the remainders), and the matching positions in `jstr_index(...).exit_ids`."""
    cache = vocab._extra.setdefault("jstr_rests", {})
    hit = cache.get(sub)
    if hit is None:
        idx = jstr_index(vocab, sub)
        tb = vocab.token_bytes
        rests = [tb[t][p:] for t, p in zip(idx.exit_ids.tolist(), idx.exit_pos.tolist())]
        order = sorted(range(len(rests)), key=rests.__getitem__)
        hit = cache[sub] = ([rests[i] for i in order], np.array(order, dtype=np.int64))
    return hit


def jstr_exit_groups(vocab: Vocabulary, sub: int) -> tuple[np.ndarray, list[bytes]]:
    """Per vocabulary and substate: the string-closing tokens grouped by their text after the
    quote. (group of each entry of `jstr_index(...).exit_ids`, the text of each group)."""
    cache = vocab._extra.setdefault("jstr_groups", {})
    hit = cache.get(sub)
    if hit is None:
        keys, order = jstr_exit_rests(vocab, sub)
        gid = np.zeros(len(keys), dtype=np.int64)
        rests: list[bytes] = []
        for i, k in enumerate(keys):
            if not rests or rests[-1] != k:
                rests.append(k)
            gid[order[i]] = len(rests) - 1
        hit = cache[sub] = (gid, rests)
    return hit


def jstr_moves(vocab: Vocabulary, sub: int) -> tuple[np.ndarray, np.ndarray]:
    """Per vocabulary and string substate, indexed by token id: the characters a token adds
    when it stays inside the string (-1 if it does not), and the substate it ends in. Lets
    consume_token move a string's thread by a whole token without stepping byte by byte."""
    cache = vocab._extra.setdefault("jstr_moves", {})
    hit = cache.get(sub)
    if hit is None:
        idx = jstr_index(vocab, sub)
        chars = np.full(vocab.size, -1, dtype=np.int32)
        end = np.zeros(vocab.size, dtype=np.int8)
        chars[idx.inside_ids] = idx.inside_chars
        end[idx.inside_ids] = idx.inside_end
        hit = cache[sub] = (chars, end)
    return hit


def jstr_index(vocab: Vocabulary, sub: int) -> JStrIndex:
    """Per vocabulary and string substate: how each text token behaves inside a JSON string.

    Tokens that stay inside the string and the characters they add; tokens that close it, the
    characters before the closing quote, and the byte offset just after it. Tokens that break
    the string (a raw control character, a bad escape, invalid UTF-8) are in neither. Computed
    once per substate (vectorised), shared by every grammar on this vocabulary.
    """
    cache = vocab._extra.setdefault("jstr", {})
    hit = cache.get(sub)
    if hit is not None:
        return hit
    lens = vocab.lengths
    B = vocab.byte_matrix
    idx = np.flatnonzero(lens > 0)
    cur = np.full(idx.size, sub, dtype=np.int64)
    chars = np.zeros(idx.size, dtype=np.int64)
    inside_ids, inside_chars, inside_end, exit_ids, exit_chars, exit_pos = [], [], [], [], [], []
    j = 0
    while idx.size:
        b = B[j, idx]
        t = JSTR_NEXT[cur, b].astype(np.int64)
        inc = JSTR_INC[cur, b]
        ex = t == EXIT
        if ex.any():
            exit_ids.append(idx[ex])
            exit_chars.append(chars[ex])
            exit_pos.append(np.full(int(ex.sum()), j + 1, dtype=np.int64))
        ok = t >= 0
        idx, cur, chars = idx[ok], t[ok], chars[ok] + inc[ok]
        j += 1
        done = lens[idx] == j
        if done.any():
            inside_ids.append(idx[done])
            inside_chars.append(chars[done])
            inside_end.append(cur[done])
            keep = ~done
            idx, cur, chars = idx[keep], cur[keep], chars[keep]

    def cat(xs):
        return np.concatenate(xs) if xs else np.zeros(0, dtype=np.int64)

    hit = JStrIndex(cat(inside_ids), cat(inside_chars), cat(inside_end), cat(exit_ids), cat(exit_chars), cat(exit_pos))
    cache[sub] = hit
    return hit


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
        m = Matcher.__new__(Matcher)
        m.__dict__.update(self.__dict__)
        m._states = list(self._states)
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
        if dense is not None:
            row[:] = dense
        else:
            row[:] = g._zeros
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
        if not isinstance(token_id, (int, np.integer)) or not 0 <= token_id < v.size:
            return self._fail(f"token {token_id} is outside the vocabulary (padding)")
        token_id = int(token_id)
        if v.special[token_id] or token_id in self._tags:  # a tag that is an ordinary token: by id
            nxt = g.specials(s).get(token_id)
            if nxt is not None:
                self._states.append(nxt)
                return True
            if v.special[token_id]:
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
                chars, end = jstr_moves(v, loc & 15)
                c = int(chars[token_id])
                count = (loc >> 4) + c
                if c >= 0 and count <= ins.max:
                    sub = int(end[token_id])
                    s = g._intern(frozenset([(ins, count << 4 | sub, st)]))
                    if g._state_mask[s] is None and sub == loc & 15:
                        # the same substate, owing and allowed as many characters as a token can
                        # tell: the same mask (see Automaton._content_key), no look-up needed
                        top = v.max_token_len
                        if _jstr_clamps(ins, count, top) == _jstr_clamps(ins, loc >> 4, top):
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
        """Force the shortest completion (seed 000's forced finish at the token ceiling).

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


def clear_caches(vocab: Vocabulary) -> None:
    """Forget the grammars compiled for `vocab`, their automata and every cached mask (the
    vocabulary's indexes stay): the next compile starts cold. Grammars compiled before keep
    working on what they hold."""
    vocab._extra.pop("railcall_cache", None)
    with _CACHE_LOCK:
        for key in [k for k in _CACHE if k[1] == vocab.key]:
            del _CACHE[key]


def compiled_grammar(grammar: ir.Grammar, vocab: Vocabulary, *, max_string: int = MAX_STRING,
                     precompute: bool = False) -> CompiledGrammar:
    """The shared CompiledGrammar for (grammar, vocab), compiled on first use. `precompute`:
    also compute every structural mask now (`CompiledGrammar.precompute`), once per grammar."""
    key = (grammar.key, vocab.key, max_string)
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            _CACHE.move_to_end(key)
    if hit is not None:
        if precompute and not hit.precomputed:
            hit.precompute()
        return hit
    cg = CompiledGrammar(grammar, vocab, max_string=max_string)
    if precompute:
        cg.precompute()
    with _CACHE_LOCK:
        _CACHE[key] = cg
        while len(_CACHE) > CACHE_SIZE:
            _CACHE.popitem(last=False)
    return cg
