"""Forced continuations and the forced finish: the tokens that are the only way on, and the
shortest completion that is still valid output (the forced finish at the token ceiling).

A layer of the automaton (`automaton.Automaton`), above its content keys: `ForcedCompletions`
answers both by searching the automaton's transitions. It holds only the automaton's cache of
forced tokens per state, which lives as long as the automaton (once per vocabulary, shared by
every grammar on it).
"""

from __future__ import annotations

import numpy as np

from railcall.matcher.content_keys import ContentKeyBuilder, _stack_key

# Finish (forced completion) prefers these bytes when several completions are equally short:
# close what is open, and fill a required string with "?" -- a visible tell
# that the value was cut short by the token ceiling rather than chosen.
_FINISH_ORDER = [ord(c) for c in '"?}]0'] + [ord(c) for c in "nrtu:,{["]
FINISH_BEAM = 16  # states kept per layer by the first search for a forced finish


class ForcedCompletions(ContentKeyBuilder):
    """What a state forces: the tokens that are the only way on (`forced`, cached per state) and
    the shortest completion to an accepting state (`shortest_completion`, the forced finish at
    the token ceiling), both searched over the automaton's transitions. A base of
    `automaton.Automaton`, never built on its own; its cache lives as long as the automaton (once
    per vocabulary, shared by every grammar on it)."""

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
        if v.encoder is not None:
            try:
                cand = v.encode(data.decode("utf-8"))
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
        completes as 1000000000). Where it finds nothing, a depth-first dive along the preferred
        bytes (`_dive`) finds a completion at once, often a longer one, and the search runs again
        for a shorter one, taking the states of a layer in turns by place in the grammar (see
        `_completion`), no deeper than the dive went. Where that finds nothing (a free-form value,
        an optional bounded number and a required nested object together defeat both orders),
        the dive's completion is taken; only where there is none does the whole search run."""
        path = self._completion(s, limit, FINISH_BEAM)
        if path is not None:
            return path
        # The dive first: it is cheap (a step per byte, wherever the preferred bytes lead to an
        # end), and its length bounds the search by turns, which need look no deeper for a
        # shorter completion. Unbounded, that search spent ~0.2 s failing on the case above.
        dive = self._dive(s, limit)
        path = self._completion(s, limit, FINISH_BEAM, True, None if dive is None else len(dive) - 1)
        if path is not None:
            return path
        return dive if dive is not None else self._completion(s, limit, None)

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

    def _completion(self, s: int, limit: int, beam: int | None, turns: bool = False,
                    max_len: int | None = None) -> list | None:
        """The search of `shortest_completion`: breadth first, each layer cut to `beam` states
        (None: the whole search), in turns by place where `turns`; only completions of at most
        `max_len` symbols (None: any)."""
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
        depth = 0  # of the frontier: what it discovers is one symbol further
        while frontier and steps < limit and (max_len is None or depth < max_len):
            depth += 1
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
