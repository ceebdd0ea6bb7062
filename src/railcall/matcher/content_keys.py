"""Content keys: what a state accepts, as far as some token reaches.

A state's mask is fixed by which byte strings no longer than the longest token it accepts,
whether it accepts (stop tokens) and which special tokens it waits for. A content key describes
exactly that, and only as far as some token can reach: a literal `","unit":"` whose first four
bytes no token spells is keyed by `","` alone, a string by its substate, the characters it still
owes or may add (up to a token's length) and the few bytes after its closing quote that a
closing token can spell. States with one key have one mask, whichever instruction, tool or
grammar they belong to, so a table's 15,000 states share a few hundred masks, and a state seen
for the first time mostly finds its mask cached. Keys are interned to ints (per vocabulary), so
keys built from keys hash in constant time.

The first layer of the automaton (`automaton.Automaton`, one class built from the layers
`content_keys`, `completion`, `transitions` and `legal`): `ContentKeyBuilder` computes the keys
and interns them. It holds nothing of its own: the interned ids and the key memos are the
vocabulary's store (`entries.VocabCache`), built once per vocabulary and shared by every automaton
and grammar on it.
"""

from __future__ import annotations

import numpy as np

from railcall.grammar.instructions import Lit, Select
from railcall.grammar.numbers import INT, MAX_NUMBER_CHARS, NEG, NUM_BYTES, S0, ZERO, JInt, JNum
from railcall.grammar.strings import JStr
from railcall.matcher.indexes import (
    _common_prefix, jnum_ext, number_margin, ONE_BYTE, quote_reach, quote_rests, quote_rests_after, quote_rests_within,
    rests_reach, sorted_lengths,
)

KEY_BUDGET = 32  # lookahead nodes one content key may visit before falling back to the instruction
TEXTS_WALKED = 64  # the most texts a number's key past a prefix walks (else: its lookahead)


class _Costly(Exception):
    """A content key that would cost more than KEY_BUDGET to build."""


# A bounded integer's stage (nothing yet, after "-", a lone "0", digits) as a number substate
_JINT_SUB = (S0, NEG, ZERO, INT)
_JINT_BYTES = JInt._BYTES  # the bytes of a bounded integer's row (JInt.row), in order
_NUMBER_BYTES = frozenset(b"-+.eE0123456789")
CONTENT_KEYS_LIMIT = 1 << 19  # interned content keys, and memo entries, per vocabulary (~100 MiB)
NEXT_BYTES_LIMIT = 1 << 15  # memoised (256,) byte sets per vocabulary (~12 MiB)
LITERAL_TEXTS_LIMIT = 1 << 16  # literal texts whose offsets' keys are memoised, per vocabulary


def _jstr_clamps(ins: JStr, count: int, top: int) -> tuple[int, int]:
    """A string's characters still owed and still allowed at `count`, clamped at `top` (the
    longest token): past it no token can tell two counts apart."""
    return min(max(0, ins.min - count), top), min(ins.max - count, top)


def _stack_key(st):
    if st is None:
        return None
    ret, rl, parent, depth = st
    return (ret, ret.coarse(rl), _stack_key(parent), depth)


class ContentKeyBuilder:
    """Builds the content key of a state or a thread (what it accepts, as far as some token
    reaches: the key its mask is cached under) and interns it to an int (`_intern_key`). The
    automaton's first base, never built on its own: it reads the automaton's thread sets and
    walks its transitions; the ids and memos it fills are the vocabulary's (built once per
    vocabulary, shared by every automaton and grammar on it). Compiled, the automaton and its
    four bases are one extension type: content_keys.pxd declares all the automaton's fields here,
    where the key builders read them as C fields."""

    def _intern_key(self, content) -> int:
        """The int id of the key `content` (a hashable tuple or frozenset, often of other ids):
        the same id for equal content, per vocabulary. Past CONTENT_KEYS_LIMIT the ids and memos
        start again."""
        k = self._cids.get(content)
        if k is None:
            if len(self._cids) > CONTENT_KEYS_LIMIT or len(self._cmemo) > 2 * CONTENT_KEYS_LIMIT:
                # ids are never reused: keys cached under the old ones just miss
                self._cids.clear()
                self._cmemo.clear()
                self._lit_memo.clear()
                self._lit_cut_memo.clear()
                self._costly.clear()
            k = self._cids.setdefault(content, next(self._cnext))
        return k

    def _state_content_key(self, s: int) -> int:
        """The content key of state `s` (see the module docstring): equal keys, equal masks."""
        threads = self._sets[s]
        if len(threads) == 1:
            (ins, loc, st), = threads
            return self._thread_key(ins, loc, st)
        return self._intern_key(frozenset([self._thread_key(ins, loc, st) for ins, loc, st in threads]))

    def _thread_key(self, ins, loc, st) -> int:
        """The key of one thread at a token's start: its mask is a function of it. Where the
        lookahead would cost too much to describe (a free-form JSON value after a string: every
        byte opens many ways), the thread is keyed by its instruction, as precompute keys it."""
        if type(ins) is Lit:
            k = self._lit_cuts(ins.data)[loc]
            if k >= 0:
                return k
        memo = self._cmemo
        k = memo.get((ins, loc, st))
        if k is not None:
            return k
        if (ins, st) not in self._costly:
            self._budget = KEY_BUDGET
            try:
                return self._build_thread_key(ins, loc, st)
            except _Costly:
                self._costly.add((ins, st))  # its other positions would cost as much: don't try
        k = memo[(ins, loc, st)] = self._intern_key(("X", ins, ins.coarse(loc), _stack_key(st)))
        return k

    def _build_thread_key(self, ins, loc, st) -> int:
        """`_thread_key` built from what the thread accepts, memoised; raises _Costly past the
        budget of lookahead nodes it was given (KEY_BUDGET)."""
        memo = self._cmemo
        t = type(ins)
        top = self.vocab.max_token_len
        if t is Lit:
            # An offset keyed by its text alone is `_lit_cuts`'s (see _thread_key); here is one
            # whose key looks past the literal's end (a token spells all that remains).
            k = memo[(ins, loc, st)] = self._rest_key(ins.data[loc:], ins.next, st)
            return k
        if t is JStr:  # keyed by the clamped counts: a string's states mostly share one
            count, sub = loc >> 5, loc & 31
            need, room = _jstr_clamps(ins, count, top)
            mk = (ins, -1 - sub, need, room, st)
            k = memo.get(mk)
            if k is None:
                if not self._jstr_closes[sub]:  # no token closes the string from here
                    k = self._intern_key(("S", sub, 0, room, None))
                else:
                    after = self._quote_key(ins.next, st) if need < top else None
                    k = self._intern_key(("S", sub, need, room, after))
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
            ahead = self._arrival_lookahead_key(ins.next, st, self._num_ext(ins.next, st))
            content = ("N", ins.integer, sub, room, ahead)
        elif t is JInt:  # which digits may come, as far as a token's number part reaches
            tree = self._jint_tree(ins, loc, number_margin(self.vocab))
            ahead = self._arrival_lookahead_key(ins.next, st, self._num_ext(ins.next, st))
            content = ("I", tree, ahead)
        else:
            content = self._plain_key(ins, loc, st)
        k = memo[(ins, loc, st)] = self._intern_key(content)
        return k

    def _rest_key(self, rest: bytes, nxt, st) -> int:
        """The key of a literal's remaining text `rest`, followed by instruction `nxt`: the text
        cut after the longest prefix some token starts with, and, only if some token spells all
        of it, what follows as far as such tokens go."""
        k = self._rest_cut(rest)
        if k < 0:
            k = self._intern_key(("L", rest, self._arrival_prefix_key(nxt, st, rest)))
        return k

    def _lit_cuts(self, data: bytes) -> list:
        """Per offset of a literal's text, `_rest_cut` of what remains there: its key where that
        is the text alone (no token spells all of it), else -1. Memoised per text, so the
        literals of every tool, table and grammar that end alike (`,"city":`, `"}}`) share one
        list, and a state inside a literal is keyed by one look-up: the first visit to a new
        tool's literals costs nothing per offset. Where -1, the key also looks past the
        literal's end (`_rest_key`) and is memoised per thread when met: that lookahead is most
        of a key's cost, and computing it for every offset of every literal at once made the
        first step into a new tool the slowest of a walk."""
        memo = self._lit_cut_memo
        cuts = memo.get(data)
        if cuts is None:
            if len(memo) > LITERAL_TEXTS_LIMIT:  # texts of tables long gone: start again
                memo.clear()
                self._lit_memo.clear()
            # each offset's rest as far as a token reaches past it (all `_rest_cut` reads): the
            # whole rest at every offset made a literal of n bytes cost n^2/2 (a 20 KB const
            # held 190 MB)
            top = self.vocab.max_token_len + 1
            cuts = memo[data] = [self._rest_cut(data[off:off + top]) for off in range(len(data))]
        return cuts

    def _rest_cut(self, rest: bytes) -> int:
        """The key of a literal's remaining text `rest` where no token spells all of it: `rest`
        cut where no token reaches (-1 where some token spells all of it). Only the first
        max_token_len + 1 bytes of `rest` matter (no token spells more), and only they are kept."""
        top = self.vocab.max_token_len + 1
        if len(rest) > top:
            rest = rest[:top]
        lits = self._lit_memo
        k = lits.get(rest)  # literals of other keys and tools end alike
        if k is None:
            j = self._token_lcp(rest)
            k = lits[rest] = self._intern_key(("L", rest[:j])) if j < len(rest) else -1
        return k

    def _jint_tree(self, ins: JInt, loc, depth: int) -> tuple:
        """The number bytes a bounded integer accepts next, `depth` deep, each with whether the
        integer may end there: all a token (which adds at most `depth` of them) can see of it."""
        self._budget -= 1
        if self._budget < 0:
            raise _Costly  # a vocabulary with long runs of digits: ten branches a level
        out = []
        for b, nl in zip(_JINT_BYTES, ins.row(loc)):  # one memoised row, not a step per byte
            if nl is not None:
                out.append((b, ins.ends(nl), self._jint_tree(ins, nl, depth - 1) if depth > 1 else None))
        return tuple(out)

    def _plain_key(self, ins, loc, st):
        if ins.accepting:
            return ("A",)
        tid = ins.special(loc)
        if tid is not None:  # offered only if something may follow it (a recursion may end there)
            return ("P", tid, self._arrival_lookahead_key(ins.next, st, 0))
        return ("X", ins, ins.coarse(loc), _stack_key(st))  # the instruction itself

    def _lookahead_key(self, ins, loc, st, d: int) -> int:
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
            if len(rest) > d:
                content = ("l", rest[:d])
            else:
                content = ("l", rest, self._arrival_lookahead_key(ins.next, st, d - len(rest)))
        elif t is Select:
            kids, term = ins.children, ins.terminal
            content = ("t", tuple([
                (b, self._arrival_lookahead_key(term[c], st, d - 1) if c in term else None,
                 self._lookahead_key(ins, c, st, d - 1) if kids[c] else None)
                for b, c in sorted(kids[loc].items())]))
        elif t is JStr:
            count, sub = loc >> 5, loc & 31
            need = max(0, ins.min - count)
            # past its closing quote a token spells one of `quote_rests`, of at most d - 1 - need
            # bytes: keyed by which of those may follow (`_quote_key`), not by all that the next
            # d - 1 bytes may be (the keys of another property or item a few bytes on)
            after = self._quote_key(ins.next, st, d - 1 - need) if need < d else None
            content = ("s", sub, min(need, d), min(ins.max - count, d), after)
        elif t is JNum:
            n, sub = loc >> 4, loc & 15
            ahead = self._arrival_lookahead_key(ins.next, st, d - 1)
            content = ("n", ins.integer, sub, min(MAX_NUMBER_CHARS - n, d), ahead)
        elif t is JInt:
            content = ("i", ins.lo, ins.hi, loc, self._arrival_lookahead_key(ins.next, st, d - 1))
        else:
            content = self._plain_key(ins, loc, st)
        k = self._cmemo[mk] = self._intern_key(content)
        return k

    def _quote_key(self, ins, st, reach: int | None = None) -> int:
        """The key of what may follow a string's closing quote (arriving at `ins` with stack
        `st`): a token that closes a string is legal exactly when the text after its quote is,
        and that text is one of `quote_rests` (of at most `reach` bytes, where given: a token
        that has more to spell before the quote). Literals are cut after the longest prefix
        such a text spells (`_quote_lits`), so strings followed by `,"city":` and by `,"unit":`
        share one key where no token spells `","c` or `","u`; otherwise, which of those texts
        the state accepts, walked. Memoised."""
        full = quote_reach(self.vocab)
        reach = full if reach is None or reach > full else reach
        rests = quote_rests(self.vocab) if reach == full else quote_rests_within(self.vocab, reach)
        return self._texts_key(ins, st, ("q", reach), rests)

    def _texts_key(self, ins, st, which: tuple, rests: list[bytes]) -> int:
        """The key of which of the sorted texts `rests` (named by `which`) arriving at `ins` with
        stack `st` accepts, texts that follow a string's closing quote: `_quote_lits`, or where
        that costs too much, the texts walked. Memoised."""
        mk = (which, ins, st)
        k = self._cmemo.get(mk)
        if k is None:
            saved, self._budget = self._budget, KEY_BUDGET  # this key may be part of another
            try:
                k = self._quote_lits(ins, st, b"", rests)
            except _Costly:
                k = None
            finally:
                self._budget = saved
            if k is None:  # alive here: an empty arrival would have keyed without cost
                x = self._arrival_state(ins, st)
                k = self._intern_key((which, tuple(self._accepted_texts(x, rests))))
            self._cmemo[mk] = k
        return k

    def _quote_lits(self, ins, st, p: bytes, rests: list[bytes]) -> int:
        """`_quote_key` for a text after a quote that has spelled `p` so far, one of `rests`: a
        literal cut after what such a text spells of it; anything else (a string, a number,
        the end) as far as the longest such text reaches (`_lookahead_key`; may raise _Costly)."""
        out: set = set()
        ins.arrive(0, st, out)
        parts = []
        for i, loc, s in out:
            if type(i) is not Lit:
                ahead = self._lookahead_key(i, loc, s, rests_reach(rests, p))
                parts.append(self._intern_key(("qd", ahead)))
                continue
            text = i.data[loc:]
            j = _common_prefix(rests, p + text) - len(p)
            if j < len(text):
                parts.append(self._intern_key(("ql", text[:j])))
            else:  # some text spells all of it: what follows matters too
                after = self._quote_lits(i.next, s, p + text, rests)
                parts.append(self._intern_key(("ql", text, after)))
        return self._intern_key(frozenset(parts))

    def _arrival_key(self, ins, st, inside: bool, arg) -> int:
        """The key of arriving at instruction `ins` with stack `st`: the set of its threads'
        keys (the empty set when nothing can follow), each `_prefix_key` inside a token that has
        spelled `arg` so far, else `_lookahead_key` with `arg` bytes of lookahead; memoised.
        Which one is a flag, not the method passed in: compiled, they are direct calls, not
        values."""
        mk = ("_prefix_key" if inside else "_lookahead_key", ins, st, arg)
        k = self._cmemo.get(mk)
        if k is None:
            out: set = set()
            ins.arrive(0, st, out)
            if inside:
                keys = [self._prefix_key(i, l, s, arg) for i, l, s in out]
            else:
                keys = [self._lookahead_key(i, l, s, arg) for i, l, s in out]
            k = self._cmemo[mk] = self._intern_key(frozenset(keys))
        return k

    def _arrival_lookahead_key(self, ins, st, d: int) -> int:
        """Arriving at `ins`, `d` bytes of lookahead (`_lookahead_key`)."""
        return self._arrival_key(ins, st, False, d)

    def _arrival_prefix_key(self, ins, st, p: bytes) -> int:
        """Arriving at `ins` inside a token that has spelled `p` so far: only what tokens
        starting with `p` can go on to spell matters (`_prefix_key`)."""
        return self._arrival_key(ins, st, True, p)

    def _prefix_key(self, ins, loc, st, p: bytes) -> int:
        """The key of one thread inside a token that has spelled `p`: a literal or a trie cut
        where no token can follow; anything else as far as the longest token starting with `p`
        reaches (`_lookahead_key`)."""
        e = self._longest_extension(p)
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
                return self._intern_key(("pl", rest[:j]))
            return self._intern_key(("pl", rest, self._arrival_prefix_key(ins.next, st, p + rest)))
        if t is Select:
            return self._intern_key(("pt", self._select_key(ins, loc, st, p)))
        if t is JStr:
            # A string accepts nearly every byte (all but raw control characters): as far as
            # the longest token going on from p, its characters owed and allowed; past its
            # closing quote only the few texts that tokens starting with p spell after a quote.
            need, room = _jstr_clamps(ins, loc >> 5, e)
            rests = quote_rests_after(self.vocab, p, need) if need < e else None
            after = self._texts_key(ins.next, st, ("qp", p, need), rests) if rests else None
            return self._intern_key(("ps", loc & 31, need, room, after))
        go = np.flatnonzero(self._next_bytes(p) & ins.allowed(loc)).tolist()
        if not go:
            return 0  # no token goes on from p with a byte this thread accepts: alive is all
        if t is JNum or t is JInt:
            # A number: which of the few texts that tokens starting with p go on to spell (`:1`,
            # `[-`) it takes, walked: numbers of any bounds, and whatever follows them, share
            # the key where those texts fare alike.
            texts = self._texts_after(p, go)
            if texts is not None:  # (each text is one byte or more: go is not empty)
                t, memo = (ins, loc, st), {}
                return self._intern_key(("pw", tuple([r for r in texts if self._thread_accepts(t, r, 0, memo)])))
        # as far as the longest token that goes on from p with one of those bytes reaches
        return self._lookahead_key(ins, loc, st, 1 + max([self._longest_extension(p + ONE_BYTE[b]) for b in go]))

    def _texts_after(self, p: bytes, go: list[int]) -> list[bytes] | None:
        """What the text tokens starting with `p` and then a byte of `go` spell after `p`;
        None where there are more than TEXTS_WALKED of them."""
        sb = self.vocab.sorted_index[0]
        n, texts = len(p), []
        for b in go:
            a, z = self.vocab.prefix_range(p + ONE_BYTE[b])
            if len(texts) + z - a > TEXTS_WALKED:
                return None
            texts.extend([t[n:] for t in sb[a:z]])
        return texts

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
            q = p + ONE_BYTE[b]
            e = self._longest_extension(q)
            if e < 0:
                continue  # no token starts with q: nothing down this branch is in the mask
            cont = term.get(child)
            tk = self._arrival_prefix_key(cont, st, q) if cont is not None else None
            ck = (self._select_key(ins, child, st, q) if e > 0 else 0) if kids[child] else None
            items.append((b, tk, ck))
        return tuple(items)

    def _token_lcp(self, data: bytes) -> int:
        """The length of the longest prefix of `data` that some token starts with: up to three
        bytes from the reach index (most of a literal's suffixes stop there), past that by a
        binary search over the sorted tokens."""
        reach = self._reach
        if len(data) >= 3:
            r = reach.get(data[:3])
            if r is not None:  # some token starts with its first three bytes
                if r == 3 or len(data) == 3:
                    return 3  # and none goes on past them, or there is no more
                return _common_prefix(self.vocab.sorted_index[0], data)
        k = min(len(data), 2)
        while k and data[:k] not in reach:
            k -= 1
        return k

    def _longest_extension(self, p: bytes) -> int:
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
                e = max([len(x) for x in v.sorted_index[0][a:b]]) - len(p)
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
            if any([i.data[l] in _NUMBER_BYTES if type(i) is Lit else (i.allowed(l) & NUM_BYTES).any() for i, l, _ in out]):
                e = self.vocab.max_token_len - 1
            else:
                e = jnum_ext(self.vocab)
            self._cmemo[mk] = e
        return e
