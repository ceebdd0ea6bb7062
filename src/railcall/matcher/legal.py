"""Which tokens one thread may take: the walks that mark, for a thread waiting in a literal, a
choice of names, a string or a number, every token whose bytes it accepts, without visiting the
whole vocabulary (the per-vocabulary indexes of `indexes` narrow each walk to the tokens that can
start there). The automaton's masks (`automaton.Automaton.mask`) are unions of these.

A layer of the automaton (`automaton.Automaton`), above its transitions: `ThreadLegalTokens`
holds nothing of its own. What it marks is cached as mask entries in the vocabulary's mask cache
(`entries.MaskCache`): built once per vocabulary, shared by every automaton and grammar on it.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right

import numpy as np

from railcall.grammar.instructions import Lit, Select
from railcall.grammar.numbers import MAX_NUMBER_CHARS, NUM_BYTES, JInt, JNum
from railcall.grammar.strings import JStr
from railcall.matcher.entries import _Bits
from railcall.matcher.indexes import (
    JStrIndex, jnum_index, jstr_after_prefix, jstr_exit_rests, jstr_index, jstr_inside, number_margin, ONE_BYTE,
    _prefix_upper, sorted_ids_list,
)
from railcall.matcher.content_keys import _JINT_SUB
from railcall.matcher.transitions import DEAD, TransitionTable


class ThreadLegalTokens(TransitionTable):
    """The tokens one thread may take (a literal's rest, a trie of names, a string body, a
    number), marked into a `_Bits` by look-ups and binary searches over the per-vocabulary
    indexes rather than a walk over the vocabulary. A base of `automaton.Automaton`, never built
    on its own; what it marks is cached per vocabulary (`entries.MaskCache`), shared by every
    grammar."""

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
                        x2 = self._arrival_state(ins.next, st)
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
            x = self._arrival_state(ins.next, st)
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
            x = self._arrival_state(nxt, st)
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
            short = len(acc) < 3  # its branches' prefixes are short: `_longest_extension` is a look-up
            for byte, child in kids[n].items():
                p = acc + ONE_BYTE[byte]
                if short:
                    e = reach(p, -1)
                    if e < 0:
                        continue  # no token starts with p
                    e -= len(p)
                else:
                    e = self._longest_extension(p)
                    if e < 0:
                        continue
                cont = term(child)
                x = self._arrival_state(cont, st) if cont is not None else DEAD
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
        x = self._arrival_state(ins.next, st)
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
        x = self._arrival_state(ins.next, st)
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
        x = self._arrival_state(ins.next, st)
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
            x2 = self._arrival_state(ins.next, st)
            if x2 >= 0:
                # the texts that spell all of the literal: legal if what they add past its end
                # is, from there (exactly the literal: _accepts takes the empty rest)
                hits: list[int] = []
                self._accepted_run(x2, keys, a, b, len(lit), {}, hits)
                if hits:
                    legal[order[hits]] = True
        return legal


def _jint_run(step, loc, data: bytes):
    """A bounded integer's local after `data` from `loc` (`step`: its `_next`), None where a
    byte is not allowed."""
    at = loc
    for b in data:
        at = step(at, b)
        if at is None:
            return None
    return at
