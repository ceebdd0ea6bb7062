"""Distinct calls: within one reply, a call identical to an earlier one is unspellable.

A small model that has made a call is likely to make it again: under `parallel_tool_calls` SmolLM2
wrote `save_note` three times for one request, and on BFCL's parallel categories replies looped on
one call until the token ceiling cut them. An agent framework runs every call it gets. So, per
row, the calls already written are kept (their exact bytes: the grammar writes compact JSON, so
equal calls are equal bytes), and at each step the tokens that would make the call being written
identical to one of them get logit -inf, like any other illegal token.

Banning the last token of a copy is not enough: where everything after some choice is forced (a
tool without arguments, an enum value followed by `"}}`), the copy is decided by that choice, and
once it is taken no legal token is left but the copy's. So a token is banned when, after it, every
way the grammar allows to go on spells a copy: `DistinctCalls.escapes` walks the automaton's bytes
along the trie of earlier calls, and the output escapes as soon as one allowed byte leaves the trie
(no copy can follow: calls are balanced, so none is a prefix of another) or the output may end.
The walk only ever follows the trie, so it costs at most the earlier calls' length in byte steps.

Calls are found in the bytes by their brackets: a call starts at `{` outside any call (json, openai,
hermes), or at a name that follows `[` or `,` (pythonic), and ends where its brackets close (strings
skipped). Which tokens to test: every legal one where few are legal; else those whose bytes follow
the trie from the current position (a value that copies an earlier one so far).

Lifecycle: one per row (request), fed every token the row writes. The automaton is read through
the matcher (`byte_state`); where it cannot be read (a free-text phase, a token that crosses out of
a call phase), a token is judged by the bytes it writes alone.
"""

from __future__ import annotations

import numpy as np

from railcall.matcher.transitions import DEAD

# Where more tokens than this are legal (inside a string, free text) only the tokens that follow an
# earlier call's bytes are tested; elsewhere (between calls, at a name) every legal token is.
TEST_ALL_BELOW = 256

_OPEN, _CLOSE, _QUOTES = b"{[(", b"}])", b"\"'"
_NAME_START = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")
_SPACE = frozenset(b" \t\r\n")


class _Scan:
    """Where the bytes so far stand: inside a call (its bytes, bracket depth, string state) or
    between calls (the last byte that was not a space)."""

    __slots__ = ("cur", "depth", "quote", "esc", "last")

    def __init__(self):
        self.cur: bytearray | None = None
        self.depth = 0
        self.quote = 0
        self.esc = False
        self.last = 0

    def copy(self) -> "_Scan":
        s = _Scan()
        s.cur = None if self.cur is None else bytearray(self.cur)
        s.depth, s.quote, s.esc, s.last = self.depth, self.quote, self.esc, self.last
        return s

    def feed(self, c: int) -> bytes | None:
        """One byte; returns a call's bytes when this byte closes it."""
        if self.cur is None:
            if c == 0x7B or (c in _NAME_START and self.last in (0x5B, 0x2C)):  # `{`, or a name after `[` `,`
                self.cur = bytearray((c,))
                self.depth, self.quote, self.esc = (1 if c == 0x7B else 0), 0, False
            elif c not in _SPACE:
                self.last = c
            return None
        self.cur.append(c)
        if self.quote:
            if self.esc:
                self.esc = False
            elif c == 0x5C:
                self.esc = True
            elif c == self.quote:
                self.quote = 0
        elif c in _QUOTES:
            self.quote = c
        elif c in _OPEN:
            self.depth += 1
        elif c in _CLOSE:
            self.depth -= 1
            if self.depth <= 0:
                call, self.cur, self.last = bytes(self.cur), None, c
                return call
        return None


class DistinctCalls:
    """The calls one row has written, and which tokens would copy one (module docstring)."""

    def __init__(self, vocab):
        self.vocab = vocab
        self.calls: set[bytes] = set()
        self._trie: dict = {}  # byte -> child dict; key None marks the end of a call
        self._scan = _Scan()
        self._escapes: dict = {}  # (state, id(node)) -> bool, valid until the next call is added
        self.banned_total = 0  # tokens banned over the row's steps (for tests and traces)

    # -- what was written ---------------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        for c in data:
            call = self._scan.feed(c)
            if call is not None and call not in self.calls:
                self.calls.add(call)
                node = self._trie
                for b in call:
                    node = node.setdefault(b, {})
                node[None] = True
                self._escapes.clear()

    def leave_call(self) -> None:
        """The output left the call phase (free text follows): whatever was open is no call."""
        self._scan.cur = None

    def _node(self, data) -> dict | None:
        node = self._trie
        for b in data:
            node = node.get(b)
            if node is None:
                return None
        return node

    # -- what may be written next -------------------------------------------------------------
    def banned(self, state, legal_ids) -> list[int]:
        """The legal tokens that would copy an earlier call. `state`: (automaton, state) of the
        matcher now (`byte_state`), or None; `legal_ids()`: the legal token ids (called only
        where few tokens are legal, `few`)."""
        if not self.calls:
            return []
        out = []
        for t in self._candidates(legal_ids):
            if not self._allows(int(t), state):
                out.append(int(t))
        self.banned_total += len(out)
        return out

    def _candidates(self, legal_ids):
        scan = self._scan
        node = self._trie if scan.cur is None else self._node(scan.cur)
        if node is None:
            return []  # the call being written already differs from every earlier one
        ids = legal_ids()
        if ids is not None:
            return ids
        # many legal tokens, inside a call that copies an earlier one so far: the tokens whose
        # bytes follow the trie (each path from here, as long as a token can be)
        v, out = self.vocab, []
        lookup, longest = v.lookup, v.max_token_len
        stack = [(node, b"")]
        while stack:
            n, path = stack.pop()
            if path:
                t = lookup.get(path)
                if t is not None:
                    out.append(t)
                    out.extend(v.duplicates.get(path, ()))
                if None in n:  # the end of a call: tokens that copy it and go on past it
                    a, b = v.prefix_range(path)
                    out.extend(int(i) for i in v.sorted_index[1][a:b])
            if len(path) < longest:
                stack.extend((child, path + bytes((k,))) for k, child in n.items() if k is not None)
        return list(dict.fromkeys(out))

    def _allows(self, t: int, state) -> bool:
        v = self.vocab
        if t >= v.size or v.special[t]:
            return True  # tags and stop tokens write no call bytes
        scan = self._scan.copy()
        auto, q = state if state is not None else (None, None)
        for c in v.token_bytes[t]:
            call = scan.feed(c)
            if call is not None and call in self.calls:
                return False
            if auto is not None and q is not None:
                q = auto.step(q, c)
                if q == DEAD:
                    q = None  # the token leaves this phase's grammar: judge by its bytes alone
        if auto is None or q is None:
            return True
        node = self._trie if scan.cur is None else self._node(scan.cur)
        if node is None:
            return True
        return self.escapes(auto, q, node, scan.cur is None, scan.last)

    def escapes(self, auto, q: int, node: dict, outside: bool, last: int = 0) -> bool:
        """Whether some output the grammar allows from state `q` is not a copy: a path that
        leaves the trie of earlier calls, or ends the output between calls. `node`: the trie
        node of the call being written (the root when `outside` a call)."""
        key = (q, id(node), outside, last if outside else 0)
        hit = self._escapes.get(key)
        if hit is not None:
            return hit
        seen = set()
        stack = [(q, node, outside, last)]
        found = False
        while stack and not found:
            q, n, out, last = stack.pop()
            if (q, id(n), out, last) in seen:
                continue
            seen.add((q, id(n), out, last))
            if not out and None in n:
                continue  # a copy is complete: this way is closed
            if out and auto.is_accepting(q):
                found = True  # the output may end here, after calls that all differ
                break
            if auto.specials(q):
                found = True  # a tag or a stop token: no more call bytes to compare
                break
            for b in np.flatnonzero(auto.first_bytes(q)):
                b = int(b)
                nq = auto.step(q, b)
                if nq == DEAD:
                    continue
                if out:
                    if b == 0x7B or (b in _NAME_START and last in (0x5B, 0x2C)):
                        child = n.get(b)
                        if child is None:
                            found = True
                            break
                        stack.append((nq, child, False, 0))
                    else:
                        stack.append((nq, n, True, last if b in _SPACE else b))
                else:
                    child = n.get(b)
                    if child is None:
                        found = True  # leaves every earlier call: what follows is new
                        break
                    stack.append((nq, child, False, 0))
        self._escapes[key] = found
        return found


def byte_state(matcher):
    """(automaton, state) of the grammar the matcher is in now, where it can be read: a Matcher,
    or a TurnMatcher inside a grammar phase. None otherwise."""
    g = getattr(matcher, "g", None)
    if g is not None and hasattr(matcher, "state"):
        return (g, matcher.state) if not matcher.is_error() else None
    phase = getattr(matcher, "phase", None)
    m = getattr(phase, "m", None) if phase is not None and getattr(phase, "kind", "") == "grammar" else None
    if m is not None and not m.is_error():
        return m.g, m.state
    return None
