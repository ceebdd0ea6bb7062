"""The automaton: the DFA over thread sets with its masks and precomputation, one per vocabulary
(and string cap), shared by every grammar compiled for it. Its layers are its base classes, each
in its module, from the first base to the last: `content_keys.ContentKeyBuilder` (the keys masks
are cached under), `completion.ForcedCompletions` (forced tokens, the forced finish),
`transitions.TransitionTable` (states, transitions, the token walk) and
`legal.ThreadLegalTokens` (the tokens one thread may take); `Automaton` adds the masks and the
precomputation."""

from __future__ import annotations

import threading

import numpy as np

from railcall.bitmask import bitmask_words, unpack_bitmask
from railcall.grammar.instructions import Lit, Select
from railcall.grammar.numbers import JInt, JNum
from railcall.grammar.strings import N_SUB, JStr
from railcall.matcher.entries import _Bits, entry_dense, entry_ids, _union, vocab_cache
from railcall.matcher.indexes import _JSTR_REACH, jstr_exit_groups, jstr_index, prefix_reach, special_flags
from railcall.matcher.content_keys import KEY_BUDGET, _jstr_clamps, _stack_key
from railcall.matcher.legal import ThreadLegalTokens
from railcall.matcher.transitions import UNBUILT
from railcall.vocab import Vocabulary

# The most positions `prewarm` visits. A table of 128 tools has ~1,400; nested arrays with
# minItems multiply them (a frame per item count: 300 x 300 gave 180,000 positions and 2.6 s).
# Past this, prewarm stops and the rest stays lazy: ~0.1 s of work at most on SmolLM2's vocabulary.
PREWARM_POSITIONS = 8_192
# What a state holds, in bytes, as `Automaton.nbytes` estimates it beside its row of the table
# (1 KiB): its thread set and thread, its id in `_ids`, its slots in the per-state lists, an
# empty token_next dict and, for many, a (256,) bool array of first bytes: ~700 B measured with
# tracemalloc; each further thread of a state ~100 B.
STATE_BYTES = 768
THREAD_BYTES = 96
# One entry of a memo keyed by state or instruction (token_next, forced tokens, arrivals).
ENTRY_BYTES = 96


class Automaton(ThreadLegalTokens):
    """The DFA over thread sets, its transitions and masks, shared by every grammar compiled for
    one vocabulary (and string cap). Instructions are continuation-passing and shared between
    grammars (grammar.program.Fragments), so a thread set means the same thing whichever grammar
    reached it: a table that keeps most of its tools after a live change finds their states,
    transitions and masks already built. Thread-safe for concurrent matchers (state growth is
    serialised by a lock). Part of the vocabulary's store (entries.VocabCache): replaced, with
    the whole store, for new grammars once the store is over its byte budget; grammars compiled
    before keep theirs (see matcher.matcher). Its layers are its bases, each in its module:
    content keys (`content_keys.ContentKeyBuilder`), forced tokens and finish searches
    (`completion.ForcedCompletions`), states and transitions (`transitions.TransitionTable`),
    the tokens one thread may take (`legal.ThreadLegalTokens`); this class adds the masks and
    the precomputation. Code outside the package reads a state's threads by `threads(s)`.
    Compiled, it is an extension type (automaton.pxd): its fields are C fields and its methods
    call each other directly, so its methods cannot be replaced on the class (tests spy on a
    subclass)."""

    def __init__(self, vocab: Vocabulary):
        self.vocab = vocab
        self.width = vocab.logits_width
        self.words = bitmask_words(self.width)
        # what a sparse mask is written over: copying zeros costs less than ndarray.fill(0)
        # (a third less on SmolLM2's 1,536 words, half on Gemma 3's 8,192)
        self._zeros = np.zeros(self.words, dtype=np.int32)
        self._zeros.flags.writeable = False
        self.stop_ids = np.array(sorted(vocab.stop_ids), dtype=np.int64)
        self._n_tokens = vocab.size  # consume_token's checks, as plain Python
        self._is_special = special_flags(vocab)
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
        self._arrival_memo: dict[tuple, int] = {}
        vc = vocab_cache(vocab)
        self._masks = vc.masks  # shared by every automaton on this vocabulary
        self._cids, self._cmemo, self._cnext = vc.content_ids, vc.content_memo, vc.content_next
        self._extm, self._lit_memo, self._lit_cut_memo = vc.token_ext, vc.literal_keys, vc.literal_cuts
        self._reach = prefix_reach(vocab)
        # per string substate: whether some token closes a string from there (on SmolLM2 and
        # Gemma 3 only between characters and after a backslash)
        self._jstr_closes = [bool(jstr_index(vocab, sub).exit_ids.size) for sub in range(N_SUB)]
        self._closing_subs = [sub for sub in range(1, N_SUB) if self._jstr_closes[sub]]  # inside an escape
        self._nextm: dict[bytes, np.ndarray] = vc.next_bytes
        self._budget = KEY_BUDGET
        self._costly: set = vc.costly_keys
        self.mask_computations = 0
        # what precompute walked already (by any grammar): states, and the mask keys expanded
        self._walked: set[int] = set()
        self._walked_keys: set = set()
        self._n_threads = 0  # threads in every state's set, for `nbytes`

    def nbytes(self) -> int:
        """An estimate of the bytes this automaton holds (see STATE_BYTES): its table, its
        states and their memos. Masks are the store's (entries.MaskCache.made)."""
        n = self._table.nbytes + len(self._sets) * STATE_BYTES + max(0, self._n_threads - len(self._sets)) * THREAD_BYTES
        n += (self._token_next_size + len(self._forced) + len(self._arrival_memo) + len(self._walked)
              + len(self._walked_keys)) * ENTRY_BYTES
        return n

    def _coarse_key(self, s: int):
        """A key equal for states with equal futures (the same instructions at positions that
        coarsen alike): precompute expands one state per key."""
        threads = self._sets[s]
        if len(threads) == 1:
            (ins, loc, st), = threads
            if st is None:  # most states: one thread, no stack
                return ins, ins.coarse(loc)
        return frozenset([(ins, ins.coarse(loc), _stack_key(st)) for ins, loc, st in threads])


    # -- masks ----------------------------------------------------------------------------------

    def mask(self, s: int) -> tuple:
        """The mask entry of state `s`: (dense, count, words, values), see `entry_dense`; cached."""
        hit = self._state_mask[s]
        if hit is not None:
            return hit
        threads = self._sets[s]
        key = None
        if len(threads) == 1:
            t, = threads  # a thread is its own memo key (see _thread_key)
            ins = t[0]
            if type(ins) is Lit:  # keyed by its text alone, where no token spells all that remains
                key = self._lit_cuts(ins.data)[t[1]]
                if key < 0:
                    key = self._cmemo.get(t)
            else:
                key = self._cmemo.get(t)
                if key is None and type(ins) is JStr:  # a string at a new count: by its clamps
                    ins, loc, st = t
                    key = self._cmemo.get((ins, -1 - (loc & 31), *_jstr_clamps(ins, loc >> 5, self.vocab.max_token_len), st))
        if key is None:
            key = self._state_content_key(s)
        hit = self._masks._d.get(key)  # MaskCache.get, inlined: the common case of a first visit
        if hit is None:
            threads = self._sets[s]
            lone = next(iter(threads)) if len(threads) == 1 else None
            if lone is not None and type(lone[0]) in (JStr, Lit):
                hit = self._thread_entry(lone)
            elif lone is not None or _stacked(threads):
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
        ins, loc, st = t
        if type(ins) is not Lit and type(ins) is not JStr:
            return self.mask(self._intern(frozenset([t])))
        key = self._thread_key(ins, loc, st)
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
        elif _walked(threads):
            bits.add(self._walk_from(s))
        sp = self.specials(s)
        if sp:
            bits.add(np.fromiter(sp, dtype=np.int64))
        if self._accepting[s]:
            bits.add(self.stop_ids)
        return bits

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
                # call starts there), for a string (20 substates: escapes, multi-byte
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
                            x = self._arrival_state(ins.next, st)
                        n = self._walk_bytes(x, d, rest_len, ends)
                    if n >= 0:
                        row[t] = n
                        found.append(n)
            elif lone is not None and isinstance(lone[0], JStr):
                # inside a string: the tokens that close it, each from the state after the
                # quote, grouped by what follows the quote (`"`, `",`, `"}` recur); and one
                # ordinary character standing for every token that stays inside
                ins, loc, st = lone
                idx = jstr_index(v, loc & 31)
                gid, rests = jstr_exit_groups(v, loc & 31)
                legal = unpack_bitmask(entry_dense(entry, self.words), self.width)
                sel = legal[idx.exit_ids] & text_np[idx.exit_ids]
                ids, g = idx.exit_ids[sel], gid[sel]
                order = np.argsort(g, kind="stable")
                ids, g = ids[order], g[order]
                cuts = np.flatnonzero(np.diff(g)) + 1
                x = self._arrival_state(ins.next, st)
                for part, k in zip(np.split(ids, cuts), g[np.r_[0, cuts]].tolist() if g.size else []):
                    n = self._walk_bytes(x, rests[k], 0, ends)
                    if n >= 0:
                        row.update(dict.fromkeys(part.tolist(), n))
                        found.append(n)
                if loc & 31 == 0:  # between characters: one way into every substate
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

    def prewarm(self, start: int, max_depth: int = 1, max_positions: int = PREWARM_POSITIONS) -> int:
        """Key and mask every grammar position a call can reach (an instruction with the frames
        open above it), where it starts: a literal at its first byte (keying every offset its
        text alone keys, `_lit_cuts`); a string just inside its quote; a trie at its root, past
        an opening quote where the root has only that, and where many names part ways
        (`_big_branches`); a number or an integer before its first digit. Returns the number of
        positions. Not a literal's last bytes: their keys look past it into what follows, and
        building them for every literal was a third of prewarm (128 tools on Gemma 3: ~12 of
        ~38 ms), while a call's tokens seldom stop there (measured: the same mask p99 with and
        without).

        Not every state: the states of a position (a literal's offsets, a string's counts, a
        number's digits) mostly share its content keys and masks, so a first visit later is a
        look-up or a small mask. A table of 128 tools has ~1,400 positions: ~18 ms on SmolLM2's
        vocabulary, ~22 ms on Gemma 3's, on the README's benchmark host; without it, a run that
        keeps calling tools not seen before pays that work a few positions at a time, tens of µs
        a first visit, but only for the tools it calls. Deeper
        than `max_depth` frames of recursion (free-form JSON, $ref) stays lazy, as in
        `precompute`, and so does what lies past the first `max_positions` positions (see
        PREWARM_POSITIONS)."""
        seen: set = set()
        todo = list(self._sets[start])
        while todo and len(seen) < max_positions:
            t = todo.pop()
            ins, loc, st = t
            if st is not None and st[3] > max_depth:
                continue
            where = (ins, _stack_key(st))
            if where in seen:
                continue
            seen.add(where)
            kind = type(ins)
            if kind is Lit or kind is JStr:
                self._thread_mask(t)
                if kind is JStr:
                    # the tokens that close it from inside an escape (`n"},`), per continuation:
                    # cached by what follows the quote, so strings followed alike share them
                    x = self._arrival_state(ins.next, st)
                    if x >= 0:
                        after = self._quote_key(ins.next, st)
                        for sub in self._closing_subs:
                            self._exits_after(sub, x, jstr_index(self.vocab, sub), after)
            elif ins.consumes and not ins.accepting:
                self.mask(self._intern(frozenset([t])))
                if kind is Select:
                    for node in self._big_branches(ins, loc):
                        self.mask(self._intern(frozenset([(ins, node, st)])))
            out: set = set()
            for cont in ins.need_parts():
                cont.arrive(0, st, out)
            todo.extend(out)
        return len(seen)

    @staticmethod
    def _big_branches(ins: Select, loc: int) -> list[int]:
        """The nodes of a trie below `loc` where keys part ways with more than 2 * KEY_BUDGET
        nodes below (a name's namespace, `find_` or `github_`, before what tells its names
        apart): keyed as themselves, their masks are never found cached from another state, and
        each is a walk over the names below it. And past an opening quote, where the root has
        only that."""
        kids, out = ins.children, []
        only = kids[loc].get(0x22) if len(kids[loc]) == 1 else None
        if only is not None:
            out.append(only)
        todo = list(kids[loc].values())
        while todo:
            n = todo.pop()
            if ins.size(n) > 2 * KEY_BUDGET:
                if len(kids[n]) > 1 and n != only:
                    out.append(n)
                todo.extend(kids[n].values())
        return out


_KEYED_BY_CONTENT = (Lit, JStr, Select, JNum, JInt)  # a thread's mask keyed by what it accepts


def _stacked(threads) -> bool:
    """Whether a thread of a general grammar's rules waits with a stack (a rule nested in
    itself): its mask is keyed by its instruction and that whole stack (content_keys'
    `_plain_key`), so it is shared with no state at another depth, and the state is walked whole
    rather than as a union of such walks. JSON's threads (a literal, a string, a trie, a
    number), inside a list item's frame too, are keyed by content and keep the union."""
    for ins, _, st in threads:
        if st is not None and type(ins) not in _KEYED_BY_CONTENT:
            return True
    return False


def _walked(threads) -> bool:
    """Whether some thread consumes text by a step per byte (not a special token, not the end):
    the generic walk then finds its legal tokens."""
    for ins, loc, _ in threads:
        if ins.consumes and not ins.accepting and ins.special(loc) is None:
            return True
    return False
