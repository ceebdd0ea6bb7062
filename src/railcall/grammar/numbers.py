"""Number bodies of the byte machine: any JSON number (`JNum`), integers within bounds (`JInt`)
and decimals within bounds (`JDec`), each stepping one byte of the number's text at a time."""

from __future__ import annotations

import numpy as np

from railcall.errors import GrammarError
from railcall.grammar.instructions import _NONE, Instr, _byteset, _frozen, _shared_allowed
from railcall.grammar.strings import DEAD

# A number may not run forever either (a model can loop on digits as easily as on whitespace).
MAX_NUMBER_CHARS = 24

# ---------------------------------------------------------------------------------------------
# JSON numbers
# ---------------------------------------------------------------------------------------------
# Substates of the number automaton; FINAL ones may end the number.
S0, NEG, ZERO, INT, DOT, FRAC, EXP0, EXPS, EXP = range(9)
_FINAL = {ZERO, INT, FRAC, EXP}


def _num_step(sub: int, b: int, integer: bool) -> int:
    d = 0x30 <= b <= 0x39
    if sub == S0:
        return NEG if b == 0x2D else ZERO if b == 0x30 else INT if d else DEAD
    if sub == NEG:
        return ZERO if b == 0x30 else INT if d else DEAD
    if sub in (ZERO, INT):
        if d and sub == INT:
            return INT
        if integer:
            return DEAD
        return DOT if b == 0x2E else EXP0 if b in (0x65, 0x45) else DEAD
    if sub == DOT:
        return FRAC if d else DEAD
    if sub == FRAC:
        return FRAC if d else EXP0 if b in (0x65, 0x45) else DEAD
    if sub == EXP0:
        return EXPS if b in (0x2B, 0x2D) else EXP if d else DEAD
    if sub in (EXPS, EXP):
        return EXP if d else DEAD
    return DEAD


def _num_tables():
    """(2, 9, 256) int8: the number automaton as a table, [integer][substate][byte] -> substate."""
    t = np.full((2, 9, 256), DEAD, dtype=np.int8)
    for integer in (0, 1):
        for sub in range(9):
            for b in b"-+.eE0123456789":
                t[integer, sub, b] = _num_step(sub, b, bool(integer))
    return t


NUM_NEXT = _num_tables()
NUM_FINAL = np.zeros(10, dtype=bool)  # index 9 stands for DEAD (-1) in vectorised lookups
NUM_FINAL[list(_FINAL)] = True
NUM_BYTES = _frozen(_byteset(b"-+.eE0123456789"))
# per (integer, substate): the number bytes allowed next
_NUM_ALLOWED = [[_frozen(_byteset(b for b in b"-+.eE0123456789" if _num_step(sub, b, bool(integer)) >= 0))
                 for sub in range(9)] for integer in (0, 1)]


class JNum(Instr):
    """Any JSON number (or integer); local = length << 4 | substate."""

    __slots__ = ("integer", "margin")

    def __init__(self, integer: bool, nxt: Instr):
        self._need = -1
        self.integer = integer
        self.next = nxt
        self.margin = MAX_NUMBER_CHARS  # set by the matcher: the most number bytes one token adds

    def coarse(self, local):
        # Far enough from the length cap that no token can reach it, only the substate matters.
        if (local >> 4) + self.margin < MAX_NUMBER_CHARS:
            return -1 - (local & 15)
        return local

    def ends(self, local) -> bool:
        """Whether the number may end at `local` (there, what follows arrives too)."""
        return (local & 15) in _FINAL

    def arrive(self, local, stack, out):
        out.add((self, local, stack))
        if self.ends(local):
            self.next.arrive(0, stack, out)

    def _next(self, local, b):
        """The local after byte `b`, or None (not a number byte here, or past the cap)."""
        n = local >> 4
        if n >= MAX_NUMBER_CHARS:
            return None
        t = _num_step(local & 15, b, self.integer)
        return (n + 1) << 4 | t if t >= 0 else None

    def step(self, local, stack, b, out):
        nl = self._next(local, b)
        if nl is not None:
            self.arrive(nl, stack, out)

    def allowed(self, local):
        if (local >> 4) >= MAX_NUMBER_CHARS:
            return _NONE
        return _NUM_ALLOWED[self.integer][local & 15]


class _Stepper(Instr):
    """An instruction defined by `_next(local, byte)` (the next local, or None): stepping arrives
    at the next local, and the allowed bytes are those of `_BYTES` that `_next` accepts."""

    __slots__ = ()
    _BYTES = b""

    def _next(self, local, b):  # pragma: no cover - abstract
        raise NotImplementedError

    def step(self, local, stack, b, out):
        nl = self._next(local, b)
        if nl is not None:
            self.arrive(nl, stack, out)

    def allowed(self, local):
        params = self._params()
        if params is None:
            return _byteset(b for b in self._BYTES if self._next(local, b) is not None)
        return _shared_allowed((type(self), params, local),
                               lambda: _byteset(b for b in self._BYTES if self._next(local, b) is not None))

    def _params(self) -> tuple | None:
        """All that `_next` depends on besides `local`: instructions with equal ones share their
        allowed bytes, process-wide. None (the default): not shared."""
        return None


# texts whose feasibility a bounded decimal memoises (~100 B each: it grows as requests walk it,
# and lives as long as the instruction, in the matcher's shared store)
JDEC_MEMO_LIMIT = 4096
JINT_STEPS_LIMIT = 4096  # memoised locals per bounded integer (each a tuple of 11 steps)
_JINT_MAG_CAP = 10 ** (MAX_NUMBER_CHARS - 2)  # the least magnitude of MAX_NUMBER_CHARS - 1 digits
# The largest magnitude a bounded integer is written with: MAX_NUMBER_CHARS - 1 digits (a sign
# and 23 digits fill the 24 characters). A bound past it is clamped to it (see `clamp_int`), so
# the digit search never offers a prefix that only a longer integer could bring within bounds.
JINT_MAX = 10 ** (MAX_NUMBER_CHARS - 1) - 1


def clamp_int(lo: int | None, hi: int | None) -> tuple[int, int]:
    """Integer bounds intersected with what railcall writes, [-JINT_MAX, JINT_MAX]; GrammarError
    if no integer of at most MAX_NUMBER_CHARS - 1 digits is left."""
    clo = -JINT_MAX if lo is None else max(lo, -JINT_MAX)
    chi = JINT_MAX if hi is None else min(hi, JINT_MAX)
    if clo > chi:
        raise GrammarError(f"no integer of at most {MAX_NUMBER_CHARS - 1} digits lies within the bounds "
                           f"(minimum {lo}, maximum {hi})")
    return clo, chi
_NO_STEPS = (None,) * 11
_JINT_ALLOWED: dict[int, np.ndarray] = {}  # which of JInt._BYTES a local allows (a bit each) -> the array


class JInt(_Stepper):
    """A JSON integer within [lo, hi] (either may be None); exact, digit by digit.

    local = (stage, negative, magnitude): stage 0 nothing yet, 1 after '-', 2 a lone "0",
    3 digits. A digit is allowed only if some completion of the prefix lies within the bounds.
    """

    __slots__ = ("lo", "hi", "_steps")
    _BYTES = b"-0123456789"

    def __init__(self, lo: int | None, hi: int | None, nxt: Instr):
        self._need = -1
        if lo is not None and hi is not None and lo > hi:
            raise GrammarError(f"integer range is empty: minimum {lo} > maximum {hi}")
        self.lo, self.hi = lo, hi
        self.next = nxt
        # local -> the local after each byte of _BYTES (None: not allowed), see _next
        self._steps: dict = {}

    def _in(self, v: int) -> bool:
        return (self.lo is None or v >= self.lo) and (self.hi is None or v <= self.hi)

    def _digits(self, neg: bool, mag: int) -> int:
        """The digits d (bit d of the result) after which the prefix `mag` (negative if `neg`)
        can still become an in-range integer. Followed by k more digits, mag*10 + d spans
        [B + d*10**k, B + (d+1)*10**k - 1] with B = mag*10**(k+1): for each k, the digits whose
        span meets the bounds are one run, found by two divisions, for all ten digits at once.
        Magnitudes only grow with more digits, so the search stops once past the bound (as it
        does, at the latest, after MAX_NUMBER_CHARS lengths)."""
        lo, hi = self.lo, self.hi
        if neg:  # -v in [lo, hi] exactly when v in [-hi, -lo]
            lo, hi = (None if hi is None else -hi), (None if lo is None else -lo)
        ok, span = 0, 1
        for _ in range(MAX_NUMBER_CHARS):
            base = mag * 10 * span
            first = 0 if lo is None else max(0, (lo - base) // span)
            last = 9 if hi is None else min(9, (hi - base) // span)
            if first <= last:
                ok |= (2 << last) - (1 << first)
            if ok == 0x3FF or (hi is not None and base + (0 if mag else span) > hi):
                break  # every digit found, or every span (of a digit after a lone sign: 1-9) past hi
            span *= 10
        return ok

    def ends(self, local) -> bool:
        """Whether the integer may end at `local`: digits written, and within the bounds."""
        stage, neg, mag = local
        return stage >= 2 and self._in(-mag if neg else mag)

    def arrive(self, local, stack, out):
        if local == 0:  # entering: nothing written yet
            local = (0, False, 0)
        out.add((self, local, stack))
        if self.ends(local):
            self.next.arrive(0, stack, out)

    def _next(self, local, b):
        """The local after byte `b` (None: not allowed). Memoised per local, for every byte at
        once: a first mask asks for the same few steps several times (the key's digit tree,
        then each digit token, then the tokens that end the integer)."""
        row = self._steps.get(local)
        if row is None:
            row = self._memo_row(local)
        i = _JINT_BYTE_INDEX[b]
        return row[i] if i >= 0 else None

    def row(self, local) -> tuple:
        """The local after each byte of _BYTES (`-`, then `0`-`9`) from `local`, None where the
        byte is not allowed (`_row`); memoised."""
        row = self._steps.get(local)
        return row if row is not None else self._memo_row(local)

    def allowed(self, local):
        """The bytes `_next` accepts: one of a few arrays, found by which steps the row allows."""
        row = self.row(local)
        which = 0
        for i, nl in enumerate(row):
            if nl is not None:
                which |= 1 << i
        m = _JINT_ALLOWED.get(which)
        if m is None:
            m = _JINT_ALLOWED[which] = _frozen(_byteset(b for i, b in enumerate(self._BYTES) if which >> i & 1))
        return m

    def _memo_row(self, local) -> tuple:
        if len(self._steps) >= JINT_STEPS_LIMIT:
            self._steps.clear()
        row = self._steps[local] = self._row(local)
        return row

    def _row(self, local) -> tuple:
        """The local after each byte of _BYTES (`-`, then `0`-`9`) from `local`, None where the
        byte is not allowed: a digit only where some completion lies within the bounds."""
        stage, neg, mag = local
        if stage == 2:  # a lone "0" (or "-0"): nothing may follow
            return _NO_STEPS
        if stage == 3:
            if mag >= _JINT_MAG_CAP:  # MAX_NUMBER_CHARS - 1 digits already
                return _NO_STEPS
            ok = self._digits(neg, mag)
            return (None,) + tuple([(3, neg, mag * 10 + d) if ok >> d & 1 else None for d in range(10)])
        # nothing written yet, or a lone "-": the sign (first only, where negatives are allowed),
        # a lone zero, or the first digit
        minus = (1, True, 0) if stage == 0 and (self.lo is None or self.lo < 0) else None
        zero = (2, neg, 0) if self._in(0) else None
        ok = self._digits(neg, 0)
        return (minus, zero) + tuple([(3, neg, d) if ok >> d & 1 else None for d in range(1, 10)])


_JINT_BYTE_INDEX = [JInt._BYTES.find(bytes((b,))) for b in range(256)]  # a byte's place in a JInt row (-1: none)

# ---------------------------------------------------------------------------------------------
# Bounded decimal numbers
# ---------------------------------------------------------------------------------------------


class JDec(_Stepper):
    """A JSON number within decimal bounds (no exponent: a bounded number is written plainly),
    a multiple of `step` (kept as `mult`) where one is given (JSON Schema's multipleOf), an integer where `frac`
    is False (no fraction digits).

    local = the number's text so far (str). A byte is allowed only if some completion within
    MAX_NUMBER_CHARS lies within the bounds: the reachable values of a prefix are a grid (the
    next integer digits scale it, fraction digits refine it), intersected exactly with the
    bounds in Decimal arithmetic, and with the multiples of `mult` by a linear congruence.
    """

    __slots__ = ("lo", "hi", "xlo", "xhi", "mult", "frac", "_memo")
    _BYTES = b"-.0123456789"

    def __init__(self, lo, hi, xlo: bool, xhi: bool, nxt: Instr, step=None, frac: bool = True):
        self._need = -1
        self.lo, self.hi, self.xlo, self.xhi = lo, hi, xlo, xhi
        self.mult, self.frac = step, frac
        self.next = nxt
        self._memo: dict = {}

    def _params(self) -> tuple:
        return (type(self.lo), self.lo, type(self.hi), self.hi, self.xlo, self.xhi, self.mult, self.frac)

    def arrive(self, local, stack, out):
        text = "" if local == 0 else local
        out.add((self, text, stack))
        if text and text[-1].isdigit() and self._in(_dec(text)):
            self.next.arrive(0, stack, out)

    def _in(self, v) -> bool:
        if self.lo is not None and (v < self.lo or (self.xlo and v == self.lo)):
            return False
        if self.hi is not None and (v > self.hi or (self.xhi and v == self.hi)):
            return False
        if self.mult is not None:
            from fractions import Fraction

            return (Fraction(v) / Fraction(self.mult)).denominator == 1
        return True

    def _fstep(self, f: int):
        """The grid step of f more fraction digits (1: none, or an integer-only number)."""
        from decimal import Decimal

        return Decimal(10) ** -f if f >= 1 and self.frac else Decimal(1)

    def _grid_hits(self, base, step, count: int, neg: bool) -> bool:
        """Is some value +-(base + j*step), 0 <= j < count, within the bounds?"""
        import math

        lo, hi, xlo, xhi = self.lo, self.hi, self.xlo, self.xhi
        if neg:  # magnitude bounds for a negative number: -hi <= m <= -lo
            lo, hi, xlo, xhi = (None if hi is None else -hi), (None if lo is None else -lo), xhi, xlo
        jmin, jmax = 0, count - 1
        if lo is not None:
            q = (lo - base) / step
            c = math.ceil(q)
            if xlo and c == q:
                c += 1
            jmin = max(jmin, c)
        if hi is not None:
            q = (hi - base) / step
            f = math.floor(q)
            if xhi and f == q:
                f -= 1
            jmax = min(jmax, f)
        if jmin > jmax or self.mult is None:
            return jmin <= jmax
        # some j in [jmin, jmax] with (base + j*step) / multipleOf an integer: over a common
        # denominator d, a + j*b = 0 (mod d), a linear congruence
        from fractions import Fraction

        x, y = Fraction(base) / Fraction(self.mult), Fraction(step) / Fraction(self.mult)
        d = x.denominator * y.denominator // math.gcd(x.denominator, y.denominator)
        a, b = int(x * d), int(y * d)
        g = math.gcd(b, d)
        if a % g:
            return False
        period = d // g
        j0 = (-a // g) * pow(b // g, -1, period) % period if period > 1 else 0
        return jmin + (j0 - jmin) % period <= jmax

    def _feasible(self, text: str) -> bool:
        hit = self._memo.get(text)
        if hit is not None:
            return hit
        ok = self._feasible_uncached(text)
        if len(self._memo) < JDEC_MEMO_LIMIT:
            self._memo[text] = ok
        return ok

    def _feasible_uncached(self, text: str) -> bool:
        import decimal

        with decimal.localcontext() as ctx:
            ctx.prec = 120  # bounds and grids of up to MAX_NUMBER_CHARS digits, exactly
            return self._reachable(text)

    def _reachable(self, text: str) -> bool:
        from decimal import Decimal

        room = MAX_NUMBER_CHARS - len(text)
        if room < 0:
            return False
        neg = text.startswith("-")
        body = text[1:] if neg else text
        if not body:  # "" or "-": zero, or a first digit 1-9 and more
            if not neg and self._feasible("-"):
                return True
            r = room
            if self._grid_hits(Decimal(0), Decimal(1), 1, neg):  # "0"
                return r >= 1
            if self.frac and r >= 3 and self._grid_hits(Decimal(0), Decimal(10) ** -(r - 2), 10 ** (r - 2), neg):
                return True  # 0.fff
            for k in range(r):  # k+1 integer digits, the first one 1-9
                f = r - (k + 1) - 1
                step = self._fstep(f)
                base = Decimal(10) ** k
                count = int((Decimal(9) * base) / step)
                if self._grid_hits(base, step, count, neg):
                    return True
            return False
        if "." in body:
            ip, fp = body.split(".")
            base = Decimal(ip + "." + (fp or "0"))
            if room == 0:
                return bool(fp) and self._grid_hits(base, Decimal(1), 1, neg)
            step = Decimal(10) ** -(len(fp) + room)
            return self._grid_hits(base, step, 10 ** room, neg)
        if body == "0":
            if self._grid_hits(Decimal(0), Decimal(1), 1, neg):
                return True
            return self.frac and room >= 2 and self._grid_hits(Decimal(0), Decimal(10) ** -(room - 1), 10 ** (room - 1), neg)
        d = Decimal(body)
        for k in range(room + 1):  # k more integer digits, then maybe a fraction
            f = room - k - 1
            step = self._fstep(f)
            base = d * Decimal(10) ** k
            count = int(Decimal(10) ** k / step)
            if self._grid_hits(base, step, count, neg):
                return True
        return False

    def _next(self, text: str, b: int):
        c = chr(b)
        if c == "-":
            ok = text == ""
        elif c == ".":
            body = text.lstrip("-")
            ok = self.frac and bool(body) and "." not in body
        elif 0x30 <= b <= 0x39:  # an ASCII digit (str.isdigit also takes "²" and others)
            body = text.lstrip("-")
            ok = not (body == "0") and (self.frac or text != "-" or b != 0x30)  # no leading zeros; no integer -0
        else:
            return None
        if not ok:
            return None
        nt = text + c
        return nt if self._feasible(nt) else None


def _dec(text: str):
    from decimal import Decimal

    return Decimal(text)
