"""String bodies of the byte machine: the inside of a JSON string (`JStr`: escapes, UTF-8,
surrogate pairs, a length range) and patterned strings (`JPat`: `pattern`, `format`, the keys of
additional properties, run by a character automaton from `regex`)."""

from __future__ import annotations

import functools
from bisect import bisect_right

import numpy as np

from railcall.errors import GrammarError
from railcall.grammar import regex
from railcall.grammar.instructions import Instr, _byteset, _frozen

# The longest patterned string (`pattern`, `format`): its automaton tracks every length up to here.
PATTERN_MAX_LEN = 4096


@functools.lru_cache(maxsize=256)
def char_dfa(kind: str, arg, length_cap: int):
    """The CharDFA of a JsonPattern node (a regex, or "any string except these"); cached, since
    the same pattern recurs across grammars and building it is the costly part."""
    if kind == "regex":
        return regex.compile_pattern(arg, length_cap)
    if kind == "except":
        return regex.excluding(arg, length_cap)
    if kind == "product":
        names, patterns = arg
        parts = [(regex.excluding(names, length_cap), True)] if names else []
        parts += [(regex.compile_pattern(p, length_cap), must) for p, must in patterns]
        if not parts:
            parts = [(regex.compile_pattern("", length_cap), True)]
        return regex.product(parts, length_cap)
    raise GrammarError(f"unknown string pattern kind {kind!r}")

# ---------------------------------------------------------------------------------------------
# JSON string body
# ---------------------------------------------------------------------------------------------
# A tiny byte automaton for the inside of a JSON string, after the opening quote. Substates:
N, ESC, U0, U1, U2, U3 = 0, 1, 2, 3, 4, 5
# UTF-8 continuation substates, named by (bytes still owed, allowed range of the next byte). The
# narrow ranges after E0/ED/F0/F4 reject overlong forms and surrogates, as RFC 3629 requires.
C1, C2A0, C2, C2ED, C3F0, C3, C3F4 = 6, 7, 8, 9, 10, 11, 12
# A \u escape of a UTF-16 surrogate: after `\ud` (U1D), inside a high surrogate (H2, H3), and
# the low surrogate that must follow it (HN: `\`, HE: `u`, HU: `d`, HD: `c`-`f`, then U2, U3). The
# pair is one character (JSON Schema counts code points), counted at its first backslash; a lone
# surrogate is no character (UTF-8 cannot encode it, a tool cannot receive it) and is not offered.
U1D, H2, H3, HN, HE, HU, HD = 13, 14, 15, 16, 17, 18, 19
N_SUB = 20
# A string's local is count << JSTR_BITS | substate; the matcher's hot paths write the shift (5)
# and the mask (31) as literals.
JSTR_BITS = 5
assert N_SUB <= 1 << JSTR_BITS
DEAD, EXIT = -1, -2


def _jstr_tables():
    nxt = np.full((N_SUB, 256), DEAD, dtype=np.int8)
    inc = np.zeros((N_SUB, 256), dtype=np.int8)  # 1 where the byte starts a character
    # Printable ASCII except the quote and the backslash. Raw control characters (0x00-0x1F and
    # DEL, 0x7F) are excluded: JSON forbids the first, and DEL is a control character a model
    # has no business writing raw (it can still write \u007f).
    for b in range(0x20, 0x7F):
        if b not in (0x22, 0x5C):
            nxt[N, b], inc[N, b] = N, 1
    nxt[N, 0x22] = EXIT
    nxt[N, 0x5C], inc[N, 0x5C] = ESC, 1
    for lo, hi, sub in ((0xC2, 0xDF, C1), (0xE0, 0xE0, C2A0), (0xE1, 0xEC, C2), (0xED, 0xED, C2ED),
                        (0xEE, 0xEF, C2), (0xF0, 0xF0, C3F0), (0xF1, 0xF3, C3), (0xF4, 0xF4, C3F4)):
        nxt[N, lo : hi + 1], inc[N, lo : hi + 1] = sub, 1
    for c in b'"\\/bfnrt':
        nxt[ESC, c] = N
    nxt[ESC, ord("u")] = U0
    hexd = [ord(c) for c in "0123456789abcdefABCDEF"]
    for s, t in ((U0, U1), (U1, U2), (U2, U3), (U3, N), (H2, H3), (H3, HN)):
        nxt[s, hexd] = t
    nxt[U0, list(b"dD")] = U1D
    nxt[U1D, list(b"01234567")] = U2  # U+D000-D7FF: an ordinary character
    nxt[U1D, list(b"89abAB")] = H2  # a high surrogate: a low one must follow
    nxt[HN, 0x5C], nxt[HE, ord("u")] = HE, HU
    nxt[HU, list(b"dD")] = HD
    nxt[HD, list(b"cdefCDEF")] = U2
    for s, lo, hi, t in ((C1, 0x80, 0xBF, N), (C2A0, 0xA0, 0xBF, C1), (C2, 0x80, 0xBF, C1),
                         (C2ED, 0x80, 0x9F, C1), (C3F0, 0x90, 0xBF, C2), (C3, 0x80, 0xBF, C2),
                         (C3F4, 0x80, 0x8F, C2)):
        nxt[s, lo : hi + 1] = t
    return nxt, inc


JSTR_NEXT, JSTR_INC = _jstr_tables()
_JN = JSTR_NEXT.tolist()
_JI = JSTR_INC.tolist()
# Precomputed allowed-byte masks per substate: (stay-without-counting, stay-counting, exit)
_J_NOINC = (JSTR_NEXT >= 0) & (JSTR_INC == 0)
_J_INC = (JSTR_NEXT >= 0) & (JSTR_INC == 1)
_J_EXIT = JSTR_NEXT == EXIT
# per substate, by (may add a character) | (may close) << 1
_JSTR_ALLOWED = [[_frozen(_J_NOINC[sub] | (_J_INC[sub] if f & 1 else False) | (_J_EXIT[sub] if f & 2 else False))
                  for f in range(4)] for sub in range(len(_J_NOINC))]


class JStr(Instr):
    """A JSON string body and its closing quote (the opening quote is the preceding literal).

    local = count << 5 | substate, where count is the characters written so far (an escape is
    one character, counted at its backslash, an escaped surrogate pair at its first; a UTF-8
    character at its lead byte).
    """

    __slots__ = ("min", "max", "margin")

    def __init__(self, min_len: int, max_len: int, nxt: Instr):
        self._need = -1
        self.min = min_len
        self.max = max_len
        self.next = nxt
        self.margin = 0  # set by the matcher (the vocabulary's longest token, in bytes)

    def step(self, local, stack, b, out):
        sub = local & 31
        t = _JN[sub][b]
        if t >= 0:
            count = (local >> 5) + _JI[sub][b]
            if count <= self.max:
                out.add((self, count << 5 | t, stack))
        elif t == EXIT and (local >> 5) >= self.min:
            self.next.arrive(0, stack, out)

    def allowed(self, local):
        sub, count = local & 31, local >> 5
        return _JSTR_ALLOWED[sub][(count < self.max) | (count >= self.min) << 1]

    def coarse(self, local):
        # The cache key coarsened: far from the cap and past the minimum, the legal
        # tokens do not depend on the exact count. The margin is the longest token in bytes
        # (a token adds at most that many characters), so no token can reach the cap from a
        # coarsened position. Below `min` the closing quote is illegal, so those stay exact.
        count = local >> 5
        if count >= self.min and count + self.margin <= self.max:
            return -1 - (local & 31)
        return local

# ---------------------------------------------------------------------------------------------
# Patterned strings (`pattern`, `format`, additional-property keys)
# ---------------------------------------------------------------------------------------------
# Substates of a patterned string body: between characters, after a backslash, inside \uXXXX,
# inside a multi-byte UTF-8 character.
P_CHAR, P_ESC, P_HEX, P_UTF8 = 0, 1, 2, 3
_SIMPLE_ESCAPES = {0x22: 0x22, 0x5C: 0x5C, 0x2F: 0x2F, 0x62: 0x08, 0x66: 0x0C, 0x6E: 0x0A, 0x72: 0x0D, 0x74: 0x09}
# A Python string literal reads every JSON escape alike but `\/` (Python keeps the backslash:
# two characters, and a SyntaxWarning). \u escapes of surrogates are refused by JPat anyway
# (JSON would pair them, Python would keep two lone surrogates): the rest coincide.
_PY_ESCAPES = {k: v for k, v in _SIMPLE_ESCAPES.items() if k != 0x2F}
_HEX = {ord(c): int(c, 16) for c in "0123456789abcdefABCDEF"}
_UTF8_MIN = {2: 0x80, 3: 0x800, 4: 0x10000}


class JPat(Instr):
    """A JSON string whose decoded value is matched by a regex.CharDFA (after the opening quote).

    local = (dfa state, characters written, substate, a, b) where (a, b) is the escape's hex
    digits so far and their value, or a UTF-8 character's bytes still owed and its bits so far.
    Escapes and UTF-8 are decoded, so `\u0041` counts as `A` for the pattern. A character, and
    even a partial one, is allowed only if some completion of it keeps the string on a path to
    an accepted value with a length in [min, max]: no dead ends.
    """

    __slots__ = ("dfa", "min", "max", "margin", "_amask", "escapes")

    def __init__(self, dfa, min_len: int, max_len: int, nxt: Instr, escapes: dict = _SIMPLE_ESCAPES):
        self._need = -1
        self.dfa = dfa
        self.min = min_len
        self.max = max_len
        self.next = nxt
        self.margin = 0  # set by the compiler: the vocabulary's longest token in bytes
        self._amask: dict = {}
        self.escapes = escapes  # _PY_ESCAPES for a Python string literal (ir.JsonPattern dialect)

    def arrive(self, local, stack, out):
        out.add((self, (0, 0, P_CHAR, 0, 0) if local == 0 else local, stack))

    def _char(self, k: int, n: int, cp: int):
        if n >= self.max:
            return None
        t = self.dfa.step(k, cp)
        if t >= 0 and self.dfa.fits(t, n + 1, self.min, self.max):
            return (t, n + 1, P_CHAR, 0, 0)
        return None

    def _some(self, k: int, n: int, lo: int, hi: int) -> bool:
        """Does some code point in [lo, hi] (surrogates excluded) continue from state k?"""
        if n >= self.max:
            return False
        for a, b in ((lo, min(hi, 0xD7FF)), (max(lo, 0xE000), min(hi, 0x10FFFF))):
            if a <= b and any(self.dfa.fits(t, n + 1, self.min, self.max) for t in self.dfa.targets_in(k, a, b)):
                return True
        return False

    def _next(self, local, b: int):
        """The local after byte b; EXIT for the closing quote; None if illegal."""
        k, n, sub, x, v = local
        if sub == P_CHAR:
            if b == 0x22:
                return EXIT if self.dfa.accepting[k] and n >= self.min else None
            if b == 0x5C:
                return (k, n, P_ESC, 0, 0) if self._some(k, n, 0, 0xFFFF) else None
            if 0x20 <= b < 0x7F:
                return self._char(k, n, b)
            for lead, need, mask in ((0xC2, 1, 0x1F), (0xE0, 2, 0x0F), (0xF0, 3, 0x07)):
                top = {0xC2: 0xDF, 0xE0: 0xEF, 0xF0: 0xF4}[lead]
                if lead <= b <= top:
                    bits = b & mask
                    lo, hi = self._utf8_range(bits, need, need + 1)
                    owed = need | (need + 1) << 4  # bytes still owed, and the character's length
                    return (k, n, P_UTF8, owed, bits) if lo <= hi and self._some(k, n, lo, hi) else None
            return None
        if sub == P_ESC:
            cp = self.escapes.get(b)
            if cp is not None:
                return self._char(k, n, cp)
            if b == 0x75:
                return (k, n, P_HEX, 0, 0) if self._some(k, n, 0, 0xFFFF) else None
            return None
        if sub == P_HEX:
            h = _HEX.get(b)
            if h is None:
                return None
            x, v = x + 1, v * 16 + h
            if x == 4:
                return None if 0xD800 <= v <= 0xDFFF else self._char(k, n, v)
            span = 4 * (4 - x)
            return (k, n, P_HEX, x, v) if self._some(k, n, v << span, ((v + 1) << span) - 1) else None
        # P_UTF8: x = bytes still owed | the character's length << 4
        if not 0x80 <= b <= 0xBF:
            return None
        v = (v << 6) | (b & 0x3F)
        owed, total = (x & 15) - 1, x >> 4
        if owed == 0:
            if v < _UTF8_MIN[total] or 0xD800 <= v <= 0xDFFF or v > 0x10FFFF:
                return None
            return self._char(k, n, v)
        lo, hi = self._utf8_range(v, owed, total)
        return (k, n, P_UTF8, owed | total << 4, v) if lo <= hi and self._some(k, n, lo, hi) else None

    @staticmethod
    def _utf8_range(bits: int, owed: int, total: int) -> tuple[int, int]:
        lo = bits << (6 * owed)
        hi = lo | ((1 << (6 * owed)) - 1)
        return max(lo, _UTF8_MIN[total]), min(hi, 0x10FFFF)

    def step(self, local, stack, b, out):
        nl = self._next(local, b)
        if nl is None:
            return
        if nl == EXIT:
            self.next.arrive(0, stack, out)
        else:
            out.add((self, nl, stack))

    def allowed(self, local):
        m = self._amask.get(local)
        if m is None:
            m = _byteset(b for b in range(256) if self._next(local, b) is not None)
            if len(self._amask) < 8192:
                self._amask[local] = m
        return m

    def coarse(self, local):
        # Past the minimum and far enough from the maximum that every reachable DFA state can
        # still finish, the exact count no longer changes which tokens are legal.
        k, n, sub, x, v = local
        if n >= self.min and n + self.margin + self.dfa.max_dist <= self.max:
            return (k, -1, sub, x, v)
        return local


# UTF-8 leads whose next byte has a narrower range than 80-BF (no overlong forms, no surrogates,
# nothing past U+10FFFF): their characters are followed by value until that byte is checked.
_NARROW_LEADS = frozenset((0xE0, 0xED, 0xF0, 0xF4))
_CONTINUATION = _frozen(_byteset(range(0x80, 0xC0)))


class _Free(JPat):
    """What Text and JText share: the text ends by an epsilon move wherever the automaton
    accepts (no closing quote of its own), and, uncounted (`max` None), any transition will do
    (the automaton has none that cannot finish)."""

    __slots__ = ("_live",)

    def __init__(self, dfa, min_len: int, max_len: int | None, nxt: Instr):
        JPat.__init__(self, dfa, min_len, max_len, nxt)
        self._live: dict = {}  # (state, count) -> may another character follow

    def _between(self, k: int, n: int, stack, out) -> bool:
        """Between characters in state k after n of them: leave where the text may end; True
        where another character may follow (the local stays a thread)."""
        if self.dfa.accepting[k] and n >= self.min:
            self.next.arrive(0, stack, out)
        live = self._live.get((k, n))
        if live is None:
            live = self._some(k, n, 0, 0x10FFFF)
            if len(self._live) < 65536:
                self._live[(k, n)] = live
        return live

    def _some(self, k: int, n: int, lo: int, hi: int) -> bool:
        if self.max is None:  # not counted: any transition will do (none leads to a dead end)
            return any(a <= b and self.dfa.targets_in(k, a, b)
                       for a, b in ((lo, min(hi, 0xD7FF)), (max(lo, 0xE000), min(hi, 0x10FFFF))))
        return JPat._some(self, k, n, lo, hi)


class Text(_Free):
    """Raw text whose characters a regex.CharDFA matches as a whole (a general grammar's
    terminal, ir.Text): UTF-8 as is, no quotes and no escapes, so any character the pattern
    allows is written as itself (a newline is the byte 0x0A).

    local = (dfa state, characters written, x, v) where x is 0 between characters, or a UTF-8
    character's bytes still owed | its length << 4, and v its bits so far. Leaving is an epsilon
    move, taken wherever the automaton accepts (and at least `min` characters are written); a
    character, or part of one, is offered only if some completion of it can still be accepted
    within [min, max] characters: no dead ends. With `max` None the text is not counted (the
    count stays 0): any length, and a state per automaton state, so masks are shared along it
    (the automaton has no transition that cannot finish, so no dead ends either).
    """

    __slots__ = ()

    def arrive(self, local, stack, out):
        if local == 0:
            local = (0, 0, 0, 0)
        k, n, x, _ = local
        if x == 0 and not self._between(k, n, stack, out):
            return
        out.add((self, local, stack))

    def _char(self, k: int, n: int, cp: int):
        t = self.dfa.step(k, cp)
        return self._land(t, n) if t >= 0 else None

    def _next(self, local, b: int):
        """The local after byte b; None if illegal."""
        k, n, x, v = local
        if x == 0:
            if b < 0x80:
                return self._char(k, n, b)
            for lead, need, mask, top in ((0xC2, 1, 0x1F, 0xDF), (0xE0, 2, 0x0F, 0xEF), (0xF0, 3, 0x07, 0xF4)):
                if lead <= b <= top:
                    bits = b & mask
                    lo, hi = self._utf8_range(bits, need, need + 1)
                    if not (lo <= hi and self._some(k, n, lo, hi)):
                        return None
                    if b in _NARROW_LEADS:  # its next byte has a narrower range: checked by value
                        return (k, n, need | (need + 1) << 4, bits)
                    return (k, n, need | (need + 1) << 4, self._same(k, lo, hi, bits))
            return None
        if not 0x80 <= b <= 0xBF:
            return None
        owed, total = (x & 15) - 1, x >> 4
        if v < 0:  # every character this one can still be steps to the same state (see _same)
            return self._land(-1 - v, n) if owed == 0 else (k, n, owed | total << 4, v)
        v = (v << 6) | (b & 0x3F)
        if owed == 0:
            if v < _UTF8_MIN[total] or 0xD800 <= v <= 0xDFFF or v > 0x10FFFF:
                return None
            return self._char(k, n, v)
        lo, hi = self._utf8_range(v, owed, total)
        if not (lo <= hi and self._some(k, n, lo, hi)):
            return None
        return (k, n, owed | total << 4, self._same(k, lo, hi, v))

    def _same(self, k: int, lo: int, hi: int, v: int) -> int:
        """-1 - t where every code point in [lo, hi] (surrogates aside) steps from state k to the
        same state t, else the bits v: the bytes still owed then cannot change where the
        character lands, so the partial characters share one local (and the masks after it),
        not one per prefix (a `[^\\n]` class is one state, not thousands)."""
        st, tg = self.dfa.row(k)
        i = max(bisect_right(st, lo) - 1, 0)
        target = None
        while i < len(st) and st[i] <= hi:
            end = st[i + 1] - 1 if i + 1 < len(st) else 0x10FFFF
            if end >= lo and not (st[i] >= 0xD800 and end <= 0xDFFF):
                if tg[i] < 0 or (target is not None and tg[i] != target):
                    return v
                target = tg[i]
            i += 1
        return v if target is None else -1 - target

    def _land(self, t: int, n: int):
        """The local after a character that steps to state t."""
        if self.max is None:
            return (t, 0, 0, 0)
        if n >= self.max or not self.dfa.fits(t, n + 1, self.min, self.max):
            return None
        return (t, n + 1, 0, 0)

    def step(self, local, stack, b, out):
        nl = self._next(local, b)
        if nl is not None:
            self.arrive(nl, stack, out)

    def alike(self, local, b):
        # Between characters an ASCII byte is a character of its own, and where it lands depends
        # only on the automaton state it steps to (the count is the local's): the bytes of its
        # interval of the automaton's row land alike. Inside a character whose every completion
        # lands alike (v < 0, see _same), every continuation byte steps alike.
        k, _, x, v = local
        if x != 0:
            return (0x80, 0xC0) if v < 0 and 0x80 <= b < 0xC0 else None
        if b >= 0x80:
            return None
        st, _ = self.dfa.row(k)
        i = bisect_right(st, b) - 1
        lo = st[i] if i >= 0 else 0
        hi = st[i + 1] if i + 1 < len(st) else 0x80
        return (lo, min(hi, 0x80)) if hi - lo > 1 else None

    def allowed(self, local):
        m = self._amask.get(local)
        if m is None:
            _, _, x, v = local
            if self.max is None:  # read off the automaton, not byte by byte (JPat's way)
                m = _frozen(self._starts(local[0])) if x == 0 else _CONTINUATION if v < 0 else None
            if m is None and x != 0:  # inside a character: only a continuation byte can follow
                m = _frozen(_byteset(b for b in range(0x80, 0xC0) if self._next(local, b) is not None))
            if m is not None and len(self._amask) < 8192:
                self._amask[local] = m
        return m if m is not None else JPat.allowed(self, local)

    def _starts(self, k: int) -> np.ndarray:
        """The bytes that start a character stepping anywhere from state k (not counted): ASCII
        bytes themselves, and the UTF-8 lead bytes of the code points (surrogates aside) that
        step somewhere; read off the row's intervals, not byte by byte."""
        m = np.zeros(256, dtype=bool)
        st, tg = self.dfa.row(k)
        for i, t in enumerate(tg):
            if t < 0:
                continue
            a, b = st[i], (st[i + 1] - 1 if i + 1 < len(st) else 0x10FFFF)
            for lo, hi in ((a, min(b, 0xD7FF)), (max(a, 0xE000), b)):
                if lo > hi:
                    continue
                if lo < 0x80:
                    m[lo : min(hi, 0x7F) + 1] = True
                for first, last, shift, lead in ((0x80, 0x7FF, 6, 0xC0), (0x800, 0xFFFF, 12, 0xE0),
                                                 (0x10000, 0x10FFFF, 18, 0xF0)):
                    p, q = max(lo, first), min(hi, last)
                    if p <= q:
                        m[lead | (p >> shift) : (lead | (q >> shift)) + 1] = True
        return m

    def coarse(self, local):
        # as JPat's: past the minimum and far from the maximum, the count changes no mask
        if local == 0 or self.max is None:  # not entered yet (a return address), or not counted
            return local
        k, n, x, v = local
        if n >= self.min and n + self.margin + self.dfa.max_dist <= self.max:
            return (k, -1, x, v)
        return local


class JText(_Free):
    """Text whose characters a regex.CharDFA matches as a whole, written as the inside of a JSON
    string (a general grammar inside a custom tool's call, ir.Text with `json`): a character is
    written as itself or as a JSON escape, and escapes are decoded before the automaton reads
    them (`\\u0041` is `A`); a quote, a backslash and control characters (DEL too) only escaped,
    a character past U+FFFF only as itself (JPat's rule: no surrogate escapes). No quotes of its
    own: the call's string opens before it and closes after it.

    local = JPat's (dfa state, characters written, substate, a, b). Leaving is an epsilon move
    between characters, taken wherever the automaton accepts (as Text's). With `max` None the
    text is not counted (the count stays 0): any length, a state per automaton state.
    """

    __slots__ = ()

    def arrive(self, local, stack, out):
        if local == 0:
            local = (0, 0, P_CHAR, 0, 0)
        k, n, sub, _, _ = local
        if sub == P_CHAR and not self._between(k, n, stack, out):
            return
        out.add((self, local, stack))

    def _char(self, k: int, n: int, cp: int):
        if self.max is None:
            t = self.dfa.step(k, cp)
            return (t, 0, P_CHAR, 0, 0) if t >= 0 else None
        return JPat._char(self, k, n, cp)

    def _next(self, local, b: int):
        if b == 0x22 and local[2] == P_CHAR:  # a raw quote would close the call's string
            return None
        return JPat._next(self, local, b)

    def step(self, local, stack, b, out):
        nl = self._next(local, b)
        if nl is not None:
            self.arrive(nl, stack, out)

    def coarse(self, local):
        if local == 0 or self.max is None:  # not entered yet (a return address), or not counted
            return local
        return JPat.coarse(self, local)
