# cython: boundscheck=False, wraparound=False
# (Compiled only; they concern typed memoryviews, which only _walk_nodes has: its indexes are in
# range by construction, see there. A quarter off a walk of the whole trie.)
"""The DFA over thread sets: states interned from the threads they hold, their byte and special-
token transitions, and the walk of the vocabulary's token trie that decides which token texts a
state accepts.

A layer of the automaton (`automaton.Automaton`), above its content keys and completions:
`TransitionTable` holds the automaton's states and their (n_states, 256) transition table, grown
lazily as bytes are stepped, for as long as the automaton lives (once per vocabulary and string
cap, shared by every grammar compiled for it).
"""

from __future__ import annotations

import numpy as np

from railcall.grammar.instructions import Lit, Select
from railcall.grammar.numbers import JInt, JNum
from railcall.grammar.strings import _JI, _JN, EXIT, JStr
from railcall.matcher.completion import ForcedCompletions
from railcall.matcher.indexes import runs, token_nodes, token_trie

UNBUILT = -2  # a transition not computed yet
DEAD = -1
# Whether this module runs compiled (railcall.speedups): a first mask's walk of the token trie
# then goes node by node in C (`_walk_nodes`, ~10 ns a node: ~1 ms for all of SmolLM2's ~100k,
# a few µs where the first bytes die). From source the same loop costs ~0.5 µs a node, so there
# the walk goes level by level in numpy (`_walk_levels`), paying a few µs per array operation.
COMPILED = not __file__.endswith(".py")


class TransitionTable(ForcedCompletions):
    """The automaton's states and transitions: thread sets interned to state ids (`_intern`;
    `threads` gives them back), the (n_states, 256) int32 table of byte transitions filled as
    bytes are stepped (`step`), the special-token transitions (`specials`), and the walks that
    push a token's text through them (`_walk`, `_accepts`). A base of `automaton.Automaton`,
    never built on its own (its fields are declared in content_keys.pxd): what it holds grows
    lazily and lives as long as the automaton, once per vocabulary (and string cap), shared by
    every grammar compiled for it."""

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
            self._n_threads += len(threads)
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

    def threads(self, s: int) -> frozenset:
        """The threads of state `s`: a frozenset of (instruction, location, stack), each a
        position in the grammar the text so far may have reached (see grammar.instructions).
        Shared with the automaton: read, never change, what the instructions hold."""
        return self._sets[s]

    def step(self, s: int, b: int) -> int:
        """The state after byte `b` from state `s` (DEAD if illegal)."""
        r = int(self._table[s, b])
        if r != UNBUILT:
            return r
        out: set = set()
        threads = self._sets[s]
        for ins, loc, st in threads:
            ins.step(loc, st, b, out)
        r = self._intern(frozenset(out)) if out else DEAD
        # a lone thread (most states of a general grammar: one regex) may know a run of bytes
        # that step as b does: one transition for all of them
        run = ins.alike(loc, b) if len(threads) == 1 else None
        with self._lock:  # _intern may swap in a grown table: a write to the old one would be lost
            if run is None:
                self._table[s, b] = r
            else:
                self._table[s, run[0]:run[1]] = r
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
        """Text tokens legal from `s` (int64 ids): a walk of the vocabulary's token trie, each
        distinct prefix stepped once and a prefix's whole subtree dropped where its byte is
        illegal. `_walk_nodes` and `_walk_levels` give the same tokens; which runs is the
        faster where this module runs (see COMPILED)."""
        return self._walk_nodes(s) if COMPILED else self._walk_levels(s)

    def _walk_nodes(self, s: int) -> np.ndarray:
        """`_walk_from`, node by node in depth-first order (`indexes.TokenNodes`): a node's
        state is its parent's stepped by its byte, read from the table (a transition not built
        yet is built by `step`); a dead byte jumps past the node's subtree. Compiled, every
        variable here is a C one (transitions.pxd), and the table is read in place, unchecked: a
        node's depth is below the longest token's length, and a state read from a table was
        interned before it was written there, so it is a row of that table (a table is only
        replaced, under the lock, by a longer one, and the walk reads it again after a step)."""
        nodes = token_nodes(self.vocab)
        byte, depth, skip, lo, count = nodes.byte, nodes.depth, nodes.skip, nodes.lo, nodes.count
        ids = nodes.ids
        n = byte.shape[0]
        # states[d]: the state after the current node's first d bytes
        states_np = np.empty(self.vocab.max_token_len + 1, dtype=np.int32)
        states = states_np
        states[0] = s
        out_np = np.empty(ids.shape[0], dtype=np.int64)
        out = out_np
        k = 0
        table = self._table
        unbuilt = UNBUILT  # a C int here: the global is a Python object
        i = 0
        while i < n:
            d = depth[i]
            nxt = table[states[d], byte[i]]
            if nxt == unbuilt:
                nxt = self._built_step(states[d], byte[i])
                table = self._table  # a new state may have grown (replaced) the table
            if nxt < 0:
                i = skip[i]
                continue
            states[d + 1] = nxt
            j = lo[i]
            end = j + count[i]
            while j < end:
                out[k] = ids[j]
                k += 1
                j += 1
            i += 1
        return out_np[:k].copy()

    def _built_step(self, s: int, b: int) -> int:
        """`step` for a transition the table does not hold yet: the state's dead bytes are
        marked first (`_init_row`), so a walk steps in Python only the bytes some thread takes."""
        if not self._row_init[s]:
            self._init_row(s)
        return self.step(s, b)

    def _walk_levels(self, s: int) -> np.ndarray:
        """`_walk_from`, level by level over the trie (`indexes.TokenTrie`), vectorised; the
        last few tokens under what is still alive are walked one by one (`_walk`)."""
        v = self.vocab
        trie = token_trie(v)
        fb = self.first_bytes(s)
        nodes = np.flatnonzero(fb[trie.byte[0]])
        if nodes.size == 0:
            return np.zeros(0, dtype=np.int64)
        states = self._delta(np.full(nodes.size, s, dtype=np.int64), trie.byte[0][nodes])
        legal = []
        sid = v.sorted_index[1]
        d = 0
        while True:
            ok = states >= 0
            nodes, states = nodes[ok], states[ok]
            if nodes.size == 0:
                break
            ends = runs(trie.end_lo[d][nodes], trie.end_hi[d][nodes])
            if ends.size:
                legal.append(trie.end_ids[d][ends])
            lo, hi = trie.child_lo[d][nodes], trie.child_hi[d][nodes]
            count = hi - lo
            if not count.any():
                break
            # tokens longer than this level, under the live nodes (each node's run of sorted
            # tokens, less the ones that end at it)
            under = trie.under_hi[d][nodes] - trie.under_lo[d][nodes] - (trie.end_hi[d][nodes] - trie.end_lo[d][nodes])
            if int(under.sum()) <= 48:
                # a few long tokens (runs of spaces reach 81 bytes on SmolLM2): one by one from here
                keep = under > 0
                ulo = trie.under_hi[d][nodes[keep]] - under[keep]
                ids = sid[runs(ulo, trie.under_hi[d][nodes[keep]])]
                legal.append(self._walk(ids, np.full(ids.size, d + 1, dtype=np.int64), np.repeat(states[keep], under[keep])))
                break
            kids = runs(lo, hi)
            d += 1
            states = self._delta(np.repeat(states, count), trie.byte[d][kids])
            nodes = kids
        return np.concatenate(legal) if legal else np.zeros(0, dtype=np.int64)

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
            if 0 < idx.size <= 48:
                # the long tail (runs of spaces, up to 81 bytes on SmolLM2): a few tokens walked
                # one by one from where they stand, not a round of array operations per byte
                legal.append(self._walk(idx, pos, cur))
                break
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
            x = self._arrival_state(ins.next, st)  # all of it, and maybe more after it
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
                    x = self._arrival_state(cont, st)
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
                    x = self._arrival_state(ins.next, st)
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
                    x = self._arrival_state(ins.next, st)
                    if x >= 0 and self._accepts(x, data, i + 1, memo):
                        return True
            return True
        return self._walk_bytes(self._intern(frozenset([t])), data, start, memo) >= 0

    def _arrival_state(self, ins, st) -> int:
        """The state entered at instruction `ins` with stack `st` (DEAD if none); memoised (the
        offsets of one literal, the states of one string, all ask for the same one)."""
        key = (ins, st)
        r = self._arrival_memo.get(key)
        if r is None:
            out: set = set()
            ins.arrive(0, st, out)
            r = self._arrival_memo[key] = self._intern(frozenset(out)) if out else DEAD
        return r
