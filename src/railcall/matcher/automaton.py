"""The DFA over thread sets, its transitions and its masks: one per vocabulary (and string cap),
shared by every grammar compiled for it."""

from __future__ import annotations

import threading
from bisect import bisect_left, bisect_right

import numpy as np

from railcall.bitmask import bitmask_words, unpack_bitmask
from railcall.grammar.program import _JI, _JN, EXIT, MAX_NUMBER_CHARS, N_SUB, NUM_BYTES, JInt, JNum, JStr, Lit, Select
from railcall.matcher.completion import Completions
from railcall.matcher.entries import _Bits, entry_dense, entry_ids, _union, vocab_cache
from railcall.matcher.indexes import (
    _JSTR_REACH, JStrIndex, jnum_index, jstr_after_prefix, jstr_exit_groups, jstr_exit_rests, jstr_index,
    jstr_inside, number_margin, ONE_BYTE, prefix_reach, _prefix_upper, sorted_ids_list, special_flags,
)
from railcall.matcher.keys import _JINT_SUB, KEY_BUDGET, _jstr_clamps, _stack_key
from railcall.vocab import Vocabulary

UNBUILT = -2  # a transition not computed yet
DEAD = -1
# The most positions `prewarm` visits. A table of 128 tools has ~1,400; nested arrays with
# minItems multiply them (a frame per item count: 300 x 300 gave 180,000 positions and 2.6 s).
# Past this, prewarm stops and the rest stays lazy: ~0.1 s of work at most on SmolLM2's vocabulary.
PREWARM_POSITIONS = 8_192


class Automaton(Completions):
    """The DFA over thread sets, its transitions and masks, shared by every grammar compiled for
    one vocabulary (and string cap). Instructions are continuation-passing and shared between
    grammars (grammar.program.Fragments), so a thread set means the same thing whichever grammar
    reached it: a table that keeps most of its tools after a live change finds their states,
    transitions and masks already built. Thread-safe for concurrent matchers (state growth is
    serialised by a lock). Replaced by a fresh one for new grammars once it holds
    AUTOMATON_STATES states; grammars compiled before keep theirs. Its content keys are in
    `keys.ContentKeys`, its forced tokens and finish searches in `completion.Completions`, its
    bases. Compiled, it is an extension type (automaton.pxd): its fields are C fields and its
    methods call each other directly, so its methods cannot be replaced on the class (tests
    spy on a subclass)."""

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
        self._after_memo: dict[tuple, int] = {}
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
            if len(threads) == 1:  # most states: no generator to run
                for t in threads:
                    acc = only = t[0].accepting
            else:
                flags = [t[0].accepting for t in threads]
                acc = any(flags)
                only = acc and all(flags)
            self._accepting.append(acc)
            self._only_accept.append(only)
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
            t, = threads  # a thread is its own memo key (see _top_key)
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
        ins, loc, st = t
        if type(ins) is not Lit and type(ins) is not JStr:
            return self.mask(self._intern(frozenset([t])))
        key = self._top_key(ins, loc, st)
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
            # a few tokens: one by one in Python costs less than numpy's per-call overhead, and
            # through literals and tries without a state per byte (`_accepts`)
            tb, memo = self.vocab.token_bytes, {}
            return np.array([t for t, p, s in zip(idx.tolist(), pos.tolist(), cur.tolist()) if self._accepts(s, tb[t], p, memo)],
                            dtype=np.int64)
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

    def _accepts(self, s: int, data: bytes, start: int, memo: dict) -> bool:
        """Whether state `s` (alive) takes `data[start:]` and stays alive: `_walk_bytes`, but
        through literals, tries and strings by comparing bytes (a string: its own byte automaton,
        counting characters) instead of making a state per byte. Threads
        run independently, so the state takes the text when one of its threads does. A text
        after a string's quote mostly runs into a literal (`,"city":`, `"}}`), a token past a
        literal's end into a trie of keys or values, and the states a byte walk made there were
        most of a first mask's cost. Memoised in `memo`."""
        if start == len(data):
            return True
        key = (s, data, start)
        hit = memo.get(key)
        if hit is not None:
            return hit
        threads = self._sets[s]
        ok = False
        if len(threads) == 1 and type(next(iter(threads))[0]) not in (Lit, Select, JStr, JNum, JInt):
            ok = self._walk_bytes(s, data, start, memo) >= 0
        else:
            for t in threads:
                if self._thread_accepts(t, data, start, memo):
                    ok = True
                    break
        memo[key] = ok
        return ok

    def _thread_accepts(self, t: tuple, data: bytes, start: int, memo: dict) -> bool:
        """`_accepts` for one thread `t` of a state (`start` < len(data))."""
        ins, loc, st = t
        kind = type(ins)
        if kind is Lit:
            rest = ins.data[loc:]
            if len(rest) > len(data) - start:
                return rest.startswith(data[start:])
            if not data.startswith(rest, start):
                return False
            x = self._after(ins.next, st)  # all of it, and maybe more after it
            return x >= 0 and self._accepts(x, data, start + len(rest), memo)
        if kind is Select:
            kids, term = ins.children, ins.terminal
            node = loc
            for i in range(start, len(data)):
                node = kids[node].get(data[i])
                if node is None:
                    return False
                cont = term.get(node)
                if cont is not None:  # a key ends here: what follows it may take the rest
                    x = self._after(cont, st)
                    if x >= 0 and self._accepts(x, data, i + 1, memo):
                        return True
                    if not kids[node]:
                        return False
            return True  # the text ends inside the trie, on a path to some key
        if kind is JStr:  # JStr.step, byte by byte, without a state per count
            sub, count, hi = loc & 31, loc >> 5, ins.max
            for i in range(start, len(data)):
                b = data[i]
                nxt = _JN[sub][b]
                if nxt >= 0:
                    count += _JI[sub][b]
                    if count > hi:
                        return False
                    sub = nxt
                elif nxt == EXIT and count >= ins.min:  # closed: what follows takes the rest
                    x = self._after(ins.next, st)
                    return x >= 0 and self._accepts(x, data, i + 1, memo)
                else:
                    return False
            return True
        if kind is JNum or kind is JInt:  # their own step, byte by byte, without a state per digit
            for i in range(start, len(data)):
                loc = ins._next(loc, data[i])
                if loc is None:
                    return False
                if i + 1 < len(data) and ins.ends(loc):  # as `arrive`: what follows may take the rest
                    x = self._after(ins.next, st)
                    if x >= 0 and self._accepts(x, data, i + 1, memo):
                        return True
            return True
        return self._walk_bytes(self._intern(frozenset([t])), data, start, memo) >= 0

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
                idx = jstr_index(v, loc & 31)
                gid, rests = jstr_exit_groups(v, loc & 31)
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
                    x = self._after(ins.next, st)
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
            if all([type(t[0]) is Lit for t in threads]):
                # What follows is a literal, or several (an optional key or the object's end):
                # chain through each with look-ups instead of a walk (a tool name's closing
                # quote followed by `,"args":{"path":"`, say); the legal tokens are the union.
                lookup, dups = v.lookup.get, v.duplicates
                for ins, off, st in threads:
                    q = p + ins.data[off:]
                    j = self._token_lcp(q)  # no token goes on past q[:j]
                    ids = []
                    for k in range(n + 1, min(j, len(q) - 1) + 1):  # tokens spelling a proper prefix
                        t = lookup(q[:k])
                        if t is not None:
                            ids.append(t)
                            if dups:
                                ids.extend(dups.get(q[:k], ()))
                    bits.add(ids)
                    if j == len(q):  # tokens spelling all of it, and maybe more
                        x2 = self._after(ins.next, st)
                        self._prefix_tokens(q, x2, bits, exact_ok=x2 >= 0)
            elif type(ins) is JStr:
                # What follows is a string body (`"`, `":"`, `["` end in its opening quote): the
                # tokens' remainders classified once per vocabulary, no state per count.
                bits.add(self._into_string(p, *next(iter(threads))))
            elif type(ins) is Select:
                # What follows is a trie (an enum's values after `":"`): walked from its node
                # with `p` spelled, look-ups as for a trie of its own, no walk per token.
                (ins, node, st), = threads
                self._select_legal(ins, node, st, bits, p)
            else:
                ids = sid[e:b]
                # only those whose next byte `x` accepts can go on: one gather drops the rest
                # (after a call's last `}`, all of them) before any is walked
                ids = ids[self.first_bytes(x)[v.byte_matrix[n, ids]]]
                if ids.size:
                    bits.add(self._walk(ids, np.full(ids.size, n, dtype=np.int64), np.full(ids.size, x, dtype=np.int64)))
        return True

    def _into_string(self, p: bytes, ins: JStr, loc: int, st) -> np.ndarray:
        """The tokens longer than `p` that spell it and go on legally into string `ins` at `loc`:
        those that stay inside within the room left, and those that close it with the characters
        it owes and go on legally after the quote (each distinct text after it walked once)."""
        idx = jstr_after_prefix(self.vocab, p, loc & 31)
        count = loc >> 5
        room = ins.max - count
        legal = [idx.inside_ids[idx.inside_chars <= room]]
        ok = (idx.exit_chars <= room) & (idx.exit_chars >= ins.min - count)
        if ok.any():
            x = self._after(ins.next, st)
            if x >= 0:
                tb, memo = self.vocab.token_bytes, {}
                ids, pos = idx.exit_ids[ok].tolist(), idx.exit_pos[ok].tolist()
                legal.append(np.array([t for t, q in zip(ids, pos) if self._accepts(x, tb[t], q, memo)],
                                      dtype=np.int64))
        return np.concatenate(legal)

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

    def _select_legal(self, ins: Select, node: int, st, bits: "_Bits", prefix: bytes = b"") -> None:
        """A trie of keys: walk the trie, pruning a branch as soon as no token starts with its
        bytes (a memoised look-up per prefix, shared by every trie on the vocabulary); a token
        is looked up by its bytes, and only where a key ends are the tokens that run on into
        what follows walked. With `prefix`: the tokens that spell it and then go on into the
        trie (`prefix` itself is not one of them)."""
        v = self.vocab
        # bound look-ups: each a direct call, no method found by name per branch
        lookup, reach, term = v.lookup.get, self._reach.get, ins.terminal.get
        dups, kids = v.duplicates, ins.children
        ids = []
        todo = [(node, prefix)]
        while todo:
            n, acc = todo.pop()
            short = len(acc) < 3  # its branches' prefixes are short: `_ext` is one look-up
            for byte, child in kids[n].items():
                p = acc + ONE_BYTE[byte]
                if short:
                    e = reach(p, -1)
                    if e < 0:
                        continue  # no token starts with p
                    e -= len(p)
                else:
                    e = self._ext(p)
                    if e < 0:
                        continue
                cont = term(child)
                x = self._after(cont, st) if cont is not None else DEAD
                more = bool(kids[child])
                if more or x >= 0:  # a token that is exactly p
                    t = lookup(p)
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
        ids, pos = idx.exit_ids, idx.exit_pos
        if room >= number_margin(self.vocab):  # far from the length cap: every token fits
            bits.add(idx.inside_ids)
        else:
            bits.add(idx.inside_ids[idx.inside_len <= room])
            ok = pos <= room
            ids, pos = ids[ok], pos[ok]
        if x < 0:
            return True
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
        bits.add([t for t in idx.inside_ids.tolist() if _jint_run(step, loc, tb[t]) is not None])
        if x < 0 or not idx.exit_ids.size:
            return True
        ids, pos = [], []
        for t, p in zip(idx.exit_ids.tolist(), idx.exit_pos.tolist()):
            at = _jint_run(step, loc, tb[t][:p])
            if at is not None and ins.ends(at):
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
        count, sub = loc >> 5, loc & 31
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
        if all([type(t[0]) is Lit for t in threads]):
            # Literals only (one, or several where an optional property may follow: `,"b":`
            # or `}`): threads run independently, so a text after the quote is legal exactly
            # when one literal takes it. One binary search each, no walk over the texts.
            legal = None
            for t in threads:
                part = self._exits_into_literal(sub, t, idx)
                legal = part if legal is None else np.logical_or(legal, part, out=legal)
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
            self._accepted_run(x, keys, a, b, 0, memo, hits)
        return hits

    def _accepted_run(self, x: int, keys: list[bytes], a: int, b: int, start: int, memo: dict,
                      hits: list[int]) -> None:
        """Append to `hits` the indices in [a, b) of the sorted texts `keys` that state `x` takes
        from byte `start` on; equal texts sort together, so each distinct one is checked once."""
        prev, ok = None, False
        for i in range(a, b):
            text = keys[i]
            if text != prev:
                prev = text
                ok = self._accepts(x, text, start, memo)
            if ok:
                hits.append(i)

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
            a = bisect_left(keys, p)
            if a == len(keys) or not keys[a].startswith(p):
                break  # no remainder starts with p: none is a longer prefix either
            b = bisect_right(keys, p, a)
            if a < b:
                legal[order[a:b]] = True
        a = bisect_left(keys, lit)
        b = bisect_left(keys, _prefix_upper(lit)) if _prefix_upper(lit) is not None else len(keys)
        if a < b:
            x2 = self._after(ins.next, st)
            if x2 >= 0:
                # the texts that spell all of the literal: legal if what they add past its end
                # is, from there (exactly the literal: _accepts takes the empty rest)
                hits: list[int] = []
                self._accepted_run(x2, keys, a, b, len(lit), {}, hits)
                if hits:
                    legal[order[hits]] = True
        return legal


def _walked(threads) -> bool:
    """Whether some thread consumes text by a step per byte (not a special token, not the end):
    the generic walk then finds its legal tokens."""
    for ins, loc, _ in threads:
        if ins.consumes and not ins.accepting and ins.special(loc) is None:
            return True
    return False


def _jint_run(step, loc, data: bytes):
    """A bounded integer's local after `data` from `loc` (`step`: its `_next`), None where a
    byte is not allowed."""
    at = loc
    for b in data:
        at = step(at, b)
        if at is None:
            return None
    return at
