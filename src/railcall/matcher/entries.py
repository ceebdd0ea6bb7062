"""Mask entries and the caches that hold them, per vocabulary.

Built per vocabulary (`VocabCache`, reached by `vocab_cache`) and shared by every grammar and
request on it: masks by content key (`MaskCache`), content-key interning, small memos of token
lookahead, the compiled fragments and the automata. A `VocabCache` is one store of that shared
state, with a byte budget: `matcher.matcher` starts a fresh store for new grammars once the
current one's estimate (`VocabCache.nbytes`) is over it, and the old one is freed when the last
grammar and request on it are gone (the module docstring of `matcher.matcher` says why).
"""

from __future__ import annotations

import itertools
import threading

import numpy as np

from railcall.bitmask import unpack_bitmask
from railcall.grammar.program import Fragments
from railcall.vocab import Vocabulary


# A mask entry, as cached and as `CompiledGrammar.mask` returns it, is a tuple
#   (dense, count, words, values)
# dense: the packed int32 bitmask, or None when the mask is sparse; then `words` (int64) are the
# indices of its nonzero words and `values` (int32) their contents. Most masks of a tool call (a
# literal's prefixes, a trie's branches, digits) set a few dozen words out of 1,536 (SmolLM2) or
# 8,192 (Gemma 3): filling those is a zero fill and one scatter, and they cost a few hundred bytes
# to keep, so a table's every state can stay cached.

_BIT = [1 << k for k in range(32)]  # a word's bits, as Python ints: no shift per token id


def _sparse_entry(acc: dict[int, int]) -> tuple:
    n = len(acc)
    words = np.fromiter(acc, np.int64, n)
    vals = np.fromiter(acc.values(), np.uint32, n).view(np.int32)
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
            get = acc.get
            for p in self.parts:
                for i in (p if isinstance(p, list) else p.tolist()):
                    w = i >> 5
                    acc[w] = get(w, 0) | _BIT[i & 31]
            return _sparse_entry(acc)
        out = self.packed()
        return out, int(np.bitwise_count(out.view(np.uint32)).sum()), None, None

    def packed(self) -> np.ndarray:
        parts = [np.asarray(p, dtype=np.int64) for p in self.parts]
        if self.n * 300 > self.words * 32:
            # a bool per token, packed: costs ~0.03 ns a token of the vocabulary plus a scatter,
            # against ~5 ns an id for ufunc.at (SmolLM2: from ~160 ids on; Gemma 3: ~900)
            bits = np.zeros(self.words * 32, dtype=bool)
            for p in parts:
                bits[p] = True
            return np.packbits(bits, bitorder="little").view(np.int32)
        out = np.zeros(self.words, dtype=np.uint32)
        if self.n:
            ids = np.concatenate(parts) if len(parts) > 1 else parts[0]
            np.bitwise_or.at(out, ids >> 5, np.left_shift(np.uint32(1), (ids & 31).astype(np.uint32)))
        return out.view(np.int32)


def _union(entries: list[tuple], n_words: int) -> tuple:
    """The mask entry of the union of several entries."""
    sparse, size = True, 0
    for e in entries:
        if e[0] is not None:
            sparse = False
            break
        size += e[2].size
    if sparse and size <= 16:
        # a few words: a dict costs less than numpy's calls
        acc: dict[int, int] = {}
        for _, _, words, vals in entries:
            for w, v in zip(words.tolist(), vals.view(np.uint32).tolist()):
                acc[w] = acc.get(w, 0) | v
        return _sparse_entry(acc)
    first = entries[0]
    out = first[0].copy() if first[0] is not None else entry_dense(first, n_words)  # (a new array)
    for e in entries[1:]:
        if e[0] is not None:
            out |= e[0]
        else:
            out[e[2]] |= e[3]  # an entry's words are distinct: one scatter
    if sparse:
        words = np.flatnonzero(out)
        if words.size <= 256:
            vals = out[words]
            return None, int(np.bitwise_count(vals.view(np.uint32)).sum()), words, vals
    return out, int(np.bitwise_count(out.view(np.uint32)).sum()), None, None



class MaskCache:
    """Masks by content key, shared by every grammar on one vocabulary; bounded in bytes (a
    SmolLM2 mask is 6 KiB, a Gemma 3 mask 32 KiB), the oldest entries dropped first. A hit does
    not reorder: every state keeps a reference to its own mask (Automaton._state_mask), so the
    cache only decides which masks a state seen for the first time can find, and that first
    visit is the hot path (an LRU's reordering cost 3% of a tool table's median step, and an
    OrderedDict's look-up another 4%)."""

    def __init__(self, budget_bytes: int = 256 << 20):
        self.budget = budget_bytes
        self.used = 0
        # every entry ever put, in bytes: what the store's estimate counts, since an entry dropped
        # here lives on while a state holds it (Automaton._state_mask)
        self.made = 0
        self._d: dict = {}
        self.lock = threading.Lock()

    def get(self, key):
        return self._d.get(key)

    def put(self, key, value) -> None:
        with self.lock:
            if key not in self._d:
                self._d[key] = value
                size = _entry_nbytes(value)
                self.used += size
                self.made += size
                if self.used > self.budget and len(self._d) > 1:
                    self._evict()

    def _evict(self) -> None:
        """Drop the oldest entries down to 7/8 of the budget (the newest always stays), in one
        rebuild: a dict's first entry, taken one at a time, is found by scanning the slots that
        earlier removals left empty (~20x slower per insertion once the cache is full)."""
        target = self.budget - self.budget // 8
        drop, used, last = 0, self.used, len(self._d) - 1
        for v in self._d.values():
            if used <= target or drop == last:
                break
            used -= _entry_nbytes(v)
            drop += 1
        self._d = dict(itertools.islice(self._d.items(), drop, None))  # readers see the old or the new
        self.used = used

    def __len__(self) -> int:
        return len(self._d)


# What one entry of the content-key memos costs, on average (a key tuple or frozenset of a few
# ints and instructions, its dict slot and int id): measured on SmolLM2's vocabulary with 128
# tools, ~150 B; the memos of token lookahead (prefix -> int) cost less, counted alike.
KEY_BYTES = 160
# One memoised (256,) bool array of the bytes that follow a prefix, with its key.
NEXT_BYTES_BYTES = 256 + 112 + 80
# The budget of a vocabulary's store (`VocabCache.budget`): past it, new grammars get a fresh
# store. A table of 128 tools on SmolLM2 fills ~40 MiB with everything prewarmed; one grammar
# may compile to at most railcall.grammar.program.MAX_GRAMMAR_BYTES (64 MiB).
ENGINE_BUDGET = 512 << 20


class VocabCache:
    """What railcall shares per vocabulary: compiled fragments and the automaton (per string
    cap), masks, content keys and lookahead memos. One store of them, with a byte budget; a
    vocabulary has one current store (`vocab_cache`), and older ones live while a grammar
    compiled into them does (see matcher.matcher). Built once per vocabulary, and again each
    time the current store is retired over its budget."""

    def __init__(self, budget: int = ENGINE_BUDGET, generation: int = 0):
        self.budget = budget
        self.generation = generation  # 0 for a vocabulary's first store, then 1, 2, ...
        self.fragments: dict[int, Fragments] = {}
        # per string cap, the Automaton over this vocabulary: built and stored by CompiledGrammar
        # (matcher.py), which imports both; this module sits below the automaton, which reads
        # the masks and content keys kept here, so it never names that class
        self.automata: dict[int, object] = {}
        self.masks = MaskCache(min(256 << 20, budget))
        self.lock = threading.RLock()
        # content keys (Automaton._state_content_key): ids never reused; memo of thread keys
        self.content_ids: dict = {}
        self.content_memo: dict = {}
        self.content_next = itertools.count(1)  # 0 stands for "alive", in lookahead keys
        self.token_ext: dict[bytes, int] = {}
        self.next_bytes: dict[bytes, np.ndarray] = {}
        self.costly_keys: set = set()  # threads (and continuations) whose content key costs too much
        self.literal_keys: dict[bytes, int] = {}  # a literal's rest -> its key, or -1: depends on what follows
        self.literal_cuts: dict[bytes, list] = {}  # a literal's text -> each offset's key, or -1 (see _lit_cuts)

    def nbytes(self) -> int:
        """An estimate of the bytes this store holds, from counts kept as it grows (no walk over
        what it holds): the compiled programs and the pattern automata they reach
        (`Fragments.nbytes`), each automaton's states, transitions and memos
        (`Automaton.nbytes`), every mask computed (`MaskCache.made`) and the content-key and
        lookahead memos by entry. The per-vocabulary indexes (`indexes`, in `Vocabulary._extra`)
        are not counted: they are bounded by the vocabulary, built once, and kept across stores.
        Measured against tracemalloc over fresh schemas of enums, patterns and nested objects,
        walked a few tokens each: 14.9 MiB estimated for 14.3 traced on SmolLM2's vocabulary,
        55 for 49 on a 600-token BPE."""
        n = self.masks.made
        n += (len(self.content_ids) + len(self.content_memo) + len(self.costly_keys)) * KEY_BYTES
        n += (len(self.token_ext) + len(self.literal_keys) + len(self.literal_cuts)) * KEY_BYTES
        n += len(self.next_bytes) * NEXT_BYTES_BYTES
        for frags in list(self.fragments.values()):
            n += frags.nbytes()
        for auto in list(self.automata.values()):
            n += auto.nbytes()
        return n


def vocab_cache(vocab: Vocabulary) -> VocabCache:
    """The vocabulary's current store (made on first use, with the budget `set_memory_budget`
    gave the vocabulary, else ENGINE_BUDGET)."""
    vc = vocab._extra.get("railcall_cache")
    if vc is None:
        vc = vocab._extra.setdefault("railcall_cache", VocabCache(vocab._extra.get("railcall_budget", ENGINE_BUDGET)))
    return vc
