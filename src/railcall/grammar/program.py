"""The byte machine: IR compiled into instructions that step one byte at a time.

A grammar runs as a set of live *threads*, as in seed 000 (one per path still consistent with
the output), generalised with a return stack so that the IR can recurse (JSON Schema `$ref`).
A thread is a plain tuple

    (instr, local, stack)      stack = None | (return instr, return local, parent stack, depth)

where `instr` is the instruction it waits in and `local` that instruction's small integer state
(the offset inside a literal, the trie node of a Select, the (count, substate) of a string body).
Instructions are compiled continuation-passing: each knows the instruction that follows it
(`next`), so a thread never needs to know which grammar it is part of, and two grammars that share
an instruction object share everything downstream of it.

Epsilon moves (alternatives, calls, returns, the end of a number) happen in `arrive`, so a thread
set only ever holds threads that wait for a byte, a special token, or the end (ACCEPT). The matcher
(railcall.matcher) interns thread sets into DFA states and caches their transitions and masks; this
module only defines how one thread moves.
"""

from __future__ import annotations

import functools

import numpy as np

from railcall.errors import GrammarError
from railcall.grammar import ir, regex

# Recursion depth limit for Ref/$ref: a model must not be able to nest forever, and every level is
# a stack frame in each thread.
MAX_DEPTH = 32
# A number may not run forever either (a model can loop on digits as easily as on whitespace).
MAX_NUMBER_CHARS = 24
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
    if kind == "keys":
        names, patterns = arg
        parts = [(regex.excluding(names, length_cap), True)] if names else []
        parts += [(regex.compile_pattern(p, length_cap), must) for p, must in patterns]
        if not parts:
            parts = [(regex.compile_pattern("", length_cap), True)]
        return regex.product(parts, length_cap)
    raise GrammarError(f"unknown string pattern kind {kind!r}")


class Instr:
    """One instruction. Subclasses that consume bytes implement `step` and `allowed`."""

    __slots__ = ("next", "_need")  # _need: see need_of, set when first computed
    consumes = True  # False for epsilon instructions
    accepting = False

    def arrive(self, local, stack, out: set) -> None:
        out.add((self, local, stack))

    def step(self, local, stack, b: int, out: set) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def allowed(self, local) -> np.ndarray:
        """(256,) bool: the bytes this thread accepts next."""
        raise NotImplementedError

    def coarse(self, local):
        """A stand-in for `local` in mask-cache keys: equal only where masks are provably equal."""
        return local

    def special(self, local) -> int | None:
        return None

    # need_of: how deep the shortest way from here to the end of the frame nests, from parts

    def need_parts(self) -> tuple:
        """The instructions whose need_of this one's is made of (a consuming instruction: the
        one it continues with)."""
        return (self.next,)

    def need_from_parts(self) -> int:
        """need_of from its parts' (all known): a choice takes its cheapest branch."""
        return min((p._need for p in self.need_parts()), default=0)


def _byteset(bs) -> np.ndarray:
    m = np.zeros(256, dtype=bool)
    m[list(bs)] = True
    return m


def _frozen(m: np.ndarray) -> np.ndarray:
    m.setflags(write=False)
    return m


_NONE = _frozen(np.zeros(256, dtype=bool))
# The allowed bytes of instructions that differ only in where they continue are equal: shared
# read-only arrays, so that the hundredth tool's literal or integer computes none of its own.
_ONE_BYTE = [_frozen(_byteset([b])) for b in range(256)]
_SHARED_ALLOWED: dict = {}
SHARED_ALLOWED_LIMIT = 1 << 16


def _shared_allowed(key, compute) -> np.ndarray:
    """The allowed-bytes array under `key`, computed by `compute()` once per process."""
    m = _SHARED_ALLOWED.get(key)
    if m is None:
        m = _frozen(compute())
        if len(_SHARED_ALLOWED) < SHARED_ALLOWED_LIMIT:
            _SHARED_ALLOWED[key] = m
    return m


class Accept(Instr):
    __slots__ = ()
    accepting = True

    def step(self, local, stack, b, out):
        return

    def allowed(self, local):
        return _NONE

    def need_parts(self):
        return ()


class Lit(Instr):
    __slots__ = ("data",)

    def __init__(self, data: bytes, nxt: Instr):
        self.data = data
        self.next = nxt

    def step(self, local, stack, b, out):
        if self.data[local] == b:
            if local + 1 == len(self.data):
                self.next.arrive(0, stack, out)
            else:
                out.add((self, local + 1, stack))

    def allowed(self, local):
        return _ONE_BYTE[self.data[local]]

    def __repr__(self):
        return f"Lit({self.data!r})"


class Special(Instr):
    """Waits for one special token, matched by id (never by its text)."""

    __slots__ = ("token_id",)

    def __init__(self, token_id: int, nxt: Instr):
        self.token_id = token_id
        self.next = nxt

    def step(self, local, stack, b, out):
        return

    def allowed(self, local):
        return _NONE

    def special(self, local):
        return self.token_id


class Select(Instr):
    """One of many literal keys, as a byte trie; each key continues with its own instruction."""

    __slots__ = ("children", "terminal", "_masks", "_sizes", "_chains")

    def __init__(self, keys: list[tuple[bytes, Instr]]):
        self.children: list[dict[int, int]] = [{}]
        self.terminal: dict[int, Instr] = {}
        for key, cont in keys:
            if not key:
                raise GrammarError("a Select key may not be empty")
            node = 0
            for b in key:
                nxt = self.children[node].get(b)
                if nxt is None:
                    nxt = len(self.children)
                    self.children.append({})
                    self.children[node][b] = nxt
                node = nxt
            if node in self.terminal:
                raise GrammarError(f"duplicate choice {key!r}")
            self.terminal[node] = cont
        self._masks: dict[int, np.ndarray] = {}
        # the nodes below each node, itself included, counted once here (a child's index exceeds
        # its parent's): the content key asks at every node, and counting a 128-tool table's
        # 700 name nodes on the first mask inside a name was half of that mask
        sizes = [1] * len(self.children)
        for n in range(len(self.children) - 1, -1, -1):
            for c in self.children[n].values():
                sizes[n] += sizes[c]
        self._sizes = sizes
        self._chains: dict[int, tuple | None] = {}
        self.next = None

    def chain(self, node: int) -> tuple[bytes, "Instr"] | None:
        """Where one key alone is left below `node` (no branch, no shorter key on the way): its
        remaining bytes and its continuation -- a literal, in effect. None otherwise."""
        hit = self._chains.get(node, ())
        if hit == ():
            out, n = bytearray(), node
            hit = None
            while len(self.children[n]) == 1:
                (b, n), = self.children[n].items()
                out.append(b)
                cont = self.terminal.get(n)
                if cont is not None:
                    if not self.children[n]:
                        hit = (bytes(out), cont)
                    break
            self._chains[node] = hit
        return hit

    def size(self, node: int) -> int:
        """How many trie nodes lie below `node` (itself included)."""
        return self._sizes[node]

    def step(self, local, stack, b, out):
        child = self.children[local].get(b)
        if child is None:
            return
        cont = self.terminal.get(child)
        if cont is not None:
            cont.arrive(0, stack, out)
        if self.children[child]:
            out.add((self, child, stack))

    def allowed(self, local):
        m = self._masks.get(local)
        if m is None:
            m = self._masks[local] = _byteset(self.children[local].keys())
        return m

    def need_parts(self):
        return tuple(self.terminal.values())


class Split(Instr):
    __slots__ = ("targets",)
    consumes = False

    def __init__(self, targets: list[Instr]):
        self.targets = targets
        self.next = None

    def arrive(self, local, stack, out):
        for t in self.targets:
            t.arrive(0, stack, out)

    def need_parts(self):
        return tuple(self.targets)


class Forward(Instr):
    """A placeholder resolved after compilation (recursive rules reference themselves). Its
    `_need` is its rule's (see need_of), known from the grammar before the rule is compiled."""

    __slots__ = ("target",)
    consumes = False

    def __init__(self, need: int = 0):
        self.target = None
        self.next = None
        self._need = need

    def arrive(self, local, stack, out):
        self.target.arrive(local, stack, out)

    def need_parts(self):
        return ()  # its rule's, set when created


class Call(Instr):
    __slots__ = ("target",)
    consumes = False

    def __init__(self, target: Instr, nxt: Instr):
        self.target = target
        self.next = nxt

    def arrive(self, local, stack, out):
        depth = stack[3] if stack else 0
        if depth >= MAX_DEPTH:
            return  # too deep: this path is not offered
        self.target.arrive(0, (self.next, 0, stack, depth + 1), out)

    def need_from_parts(self):
        return max(1 + self.target._need, self.next._need)


class Guard(Instr):
    """Enters `target` only where what it needs fits under the depth limit: a thread at depth d
    may take a branch that needs `need` more levels (see need_of) only if d + need <= MAX_DEPTH.
    Put in front of the branches of a choice that need more than its cheapest branch, so a model
    is never offered a way into a value it could not finish (an optional property whose value
    nests references, entered at the limit)."""

    __slots__ = ("target", "need")
    consumes = False

    def __init__(self, need: int, target: Instr):
        self.need = need
        self.target = target
        self.next = None

    def arrive(self, local, stack, out):
        if (stack[3] if stack else 0) + self.need <= MAX_DEPTH:
            self.target.arrive(local, stack, out)

    def need_parts(self):
        return (self.target,)


class Ret(Instr):
    __slots__ = ()
    consumes = False

    def arrive(self, local, stack, out):
        ret, ret_local, parent, _ = stack
        ret.arrive(ret_local, parent, out)

    def need_parts(self):
        return ()


RET = Ret()


class Repeat(Instr):
    """`item (sep item)*` between min and max times; `local` counts the items so far.

    The item is compiled with RET as its continuation; entering it pushes a frame that returns
    here with the count incremented.
    """

    __slots__ = ("item", "sep", "min", "max", "margin", "lead_sep", "item_need")
    consumes = False

    def __init__(self, item: Instr, sep: Instr | None, min_items: int, max_items: int | None, nxt: Instr,
                 lead_sep: bool = False):
        self.item = item
        self.sep = sep  # a Lit whose next is `item`, or None
        self.min = min_items
        self.max = max_items
        self.next = nxt
        self.margin = 0  # set by the matcher: counts above min and this far below max share masks
        self.lead_sep = lead_sep  # something was written before: the first item needs `sep` too
        # set by the compiler where an item nests references deeper than what follows the
        # list needs (see Guard): another item is offered only where it fits under the limit
        self.item_need = 0

    def arrive(self, local, stack, out):
        if local >= self.min:
            self.next.arrive(0, stack, out)
        if self.max is None or local < self.max:
            depth = stack[3] if stack else 0
            if self.item_need and depth + self.item_need > MAX_DEPTH:
                return
            frame = (self, local + 1, stack, depth)
            if (local == 0 and not self.lead_sep) or self.sep is None:
                self.item.arrive(0, frame, out)
            else:
                self.sep.arrive(0, frame, out)

    def coarse(self, local):
        if local >= self.min and (self.max is None or local <= self.max - self.margin):
            return -1
        return local

    def need_parts(self):
        return (self.item, self.next)

    def need_from_parts(self):
        return self.next._need if self.min == 0 else max(self.item._need, self.next._need)


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
        # Seed 000's cache-key coarsening: far from the cap and past the minimum, the legal
        # tokens do not depend on the exact count. The margin is the longest token in bytes
        # (a token adds at most that many characters), so no token can reach the cap from a
        # coarsened position. Below `min` the closing quote is illegal, so those stay exact.
        count = local >> 5
        if count >= self.min and count + self.margin <= self.max:
            return -1 - (local & 31)
        return local


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


# ---------------------------------------------------------------------------------------------
# Bounded decimal numbers
# ---------------------------------------------------------------------------------------------


class JDec(_Stepper):
    """A JSON number within decimal bounds (no exponent: a bounded number is written plainly).

    local = the number's text so far (str). A byte is allowed only if some completion within
    MAX_NUMBER_CHARS lies within the bounds: the reachable values of a prefix are a grid (the
    next integer digits scale it, fraction digits refine it), intersected exactly with the
    bounds in Decimal arithmetic.
    """

    __slots__ = ("lo", "hi", "xlo", "xhi", "_memo")
    _BYTES = b"-.0123456789"

    def __init__(self, lo, hi, xlo: bool, xhi: bool, nxt: Instr):
        self.lo, self.hi, self.xlo, self.xhi = lo, hi, xlo, xhi
        self.next = nxt
        self._memo: dict = {}

    def _params(self) -> tuple:
        return (type(self.lo), self.lo, type(self.hi), self.hi, self.xlo, self.xhi)

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
        return True

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
        return jmin <= jmax

    def _feasible(self, text: str) -> bool:
        hit = self._memo.get(text)
        if hit is not None:
            return hit
        ok = self._feasible_uncached(text)
        if len(self._memo) < 50_000:
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
            if r >= 3 and self._grid_hits(Decimal(0), Decimal(10) ** -(r - 2), 10 ** (r - 2), neg):
                return True  # 0.fff
            for k in range(r):  # k+1 integer digits, the first one 1-9
                f = r - (k + 1) - 1
                step = Decimal(10) ** -f if f >= 1 else Decimal(1)
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
            return room >= 2 and self._grid_hits(Decimal(0), Decimal(10) ** -(room - 1), 10 ** (room - 1), neg)
        d = Decimal(body)
        for k in range(room + 1):  # k more integer digits, then maybe a fraction
            f = room - k - 1
            step = Decimal(10) ** -f if f >= 1 else Decimal(1)
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
            ok = bool(body) and "." not in body
        elif 0x30 <= b <= 0x39:  # an ASCII digit (str.isdigit also takes "²" and others)
            body = text.lstrip("-")
            ok = not (body == "0")  # no leading zeros
        else:
            return None
        if not ok:
            return None
        nt = text + c
        return nt if self._feasible(nt) else None


def _dec(text: str):
    from decimal import Decimal

    return Decimal(text)


class Ws(Instr):
    """Up to `max` JSON whitespace bytes; local = how many so far. Optional (epsilon to next)."""

    __slots__ = ("max",)
    _BYTES = _byteset(b" \t\n\r")

    def __init__(self, max_ws: int, nxt: Instr):
        self.max = max_ws
        self.next = nxt

    def arrive(self, local, stack, out):
        if local < self.max:
            out.add((self, local, stack))
        self.next.arrive(0, stack, out)

    def step(self, local, stack, b, out):
        if b in (0x20, 0x09, 0x0A, 0x0D) and local < self.max:
            self.arrive(local + 1, stack, out)

    def allowed(self, local):
        return self._BYTES if local < self.max else _NONE


# ---------------------------------------------------------------------------------------------
# The compiler
# ---------------------------------------------------------------------------------------------


class Program:
    """A compiled grammar: its entry instruction."""

    def __init__(self, start: Instr):
        self.start = start


class Fragments:
    """Compiled instructions shared by every grammar compiled for one vocabulary and string cap.

    A tool's arguments compile to the same instruction objects in every table that contains the
    tool (keyed by the argument IR node, which the tool-grammar builder caches per schema, and
    by the canonical continuation), so a live table change compiles only the tools that
    changed, and every mask keyed by those instructions stays valid and shared.
    Entries are added only after a compilation succeeds; the cache is cleared when it grows
    past `limit` entries.
    """

    def __init__(self, token_margin: int, number_margin: int, limit: int = 50_000):
        self.token_margin = token_margin
        self.number_margin = number_margin
        self.accept = Accept()
        self.memo: dict[tuple[int, int], tuple] = {}  # (id(node), id(next)) -> (node, next, instr)
        self.limit = limit


def compile_grammar(grammar: ir.Grammar, special_ids: dict[str, int], *, max_string: int,
                    fragments: Fragments | None = None) -> Program:
    """Compile IR to instructions. `special_ids` maps special-token text to ids; `fragments`
    (per vocabulary) shares compiled pieces across grammars. An IR nested deeper than
    MAX_IR_NESTING is a GrammarError, in the compiled build as from source: a `Grammar` built
    with its own `key` skips the content hash whose recursion bounds the nesting otherwise,
    and the compiled build does not count recursion."""
    if grammar.rules:  # check_finite recurses over the rules' nodes: bound them first
        _check_nesting([grammar.start, *(node for _, node in grammar.rules)])
    try:
        depths = check_finite(grammar)
        return _Compiler(grammar, special_ids, max_string, fragments or Fragments(1, 1), depths).run()
    except RecursionError:  # from source, the interpreter's limit can come first
        raise GrammarError(_TOO_DEEP) from None


MAX_IR_NESTING = 400  # compile() calls nested one in another, at the most (see compile_grammar)
_TOO_DEEP = (f"the grammar nests too deeply (more than {MAX_IR_NESTING} levels); flatten it, or use Ref rules "
             "for recursion")


def _check_nesting(roots: list) -> None:
    """GrammarError if IR nodes nest deeper than MAX_IR_NESTING below `roots` (a loop, not a
    recursion)."""
    todo = [(r, 1) for r in roots]
    while todo:
        node, d = todo.pop()
        if d > MAX_IR_NESTING:
            raise GrammarError(_TOO_DEEP)
        todo.extend((c, d + 1) for c in _children(node))


_NEVER = float("inf")


def _ref_depth(node, depth: dict) -> float:
    """How many `Ref`s deep the shortest value of `node` nests, given each rule's in `depth`
    (absent: not known to have a finite value yet); inf where it has none. Only references can
    make a node unwritable: everything else the compiler checks as it builds it."""
    t = type(node)
    if t is ir.Ref:
        return 1 + depth.get(node.name, _NEVER)
    if t is ir.Seq:
        return max((_ref_depth(x, depth) for x in node.items), default=0)
    if t is ir.Alt:
        return min((_ref_depth(x, depth) for x in node.items), default=_NEVER)
    if t is ir.Select:
        return min((_ref_depth(v, depth) for _, v in node.choices), default=_NEVER)
    if t is ir.JsonArray:
        parts = [_ref_depth(x, depth) for x in node.prefix]
        if node.item is not None and node.min_items > len(node.prefix):
            parts.append(_ref_depth(node.item, depth))
        return max(parts, default=0)
    if t is ir.JsonObject:
        return max((_ref_depth(v, depth) for _, v, required in node.properties if required), default=0)
    return 0


def _children(node):
    t = type(node)
    if t is ir.Seq or t is ir.Alt:
        return node.items
    if t is ir.Select:
        return [v for _, v in node.choices]
    if t is ir.JsonArray:
        return [*node.prefix, *([node.item] if node.item is not None else [])]
    if t is ir.JsonObject:
        return [v for _, v, _ in node.properties] + [x for pair in node.extras for x in pair]
    return ()


def _reachable_rules(grammar: ir.Grammar, rules: dict) -> list[str]:
    """The rules a value of the grammar can enter, in the order first met."""
    seen: dict[str, None] = {}
    todo = [grammar.start]
    while todo:
        node = todo.pop()
        if type(node) is ir.Ref:
            if node.name not in seen and node.name in rules:
                seen[node.name] = None
                todo.append(rules[node.name])
            continue
        todo.extend(_children(node))
    return list(seen)


def check_finite(grammar: ir.Grammar) -> dict[str, int]:
    """Raise GrammarError if the grammar has no finite value, or none within MAX_DEPTH nested
    references: such a grammar would compile into a matcher that walks into a dead end (a
    schema whose required property refers back to itself, a `$ref` cycle with no way out).
    Returns how deep each rule's shortest value nests references (rules without one left out)."""
    if not grammar.rules:
        return {}
    rules = dict(grammar.rules)
    depth: dict[str, float] = {}
    changed = True
    while changed:  # a least fixpoint: depths only fall, from "none known"
        changed = False
        for name, node in rules.items():
            d = _ref_depth(node, depth)
            if d < depth.get(name, _NEVER):
                depth[name] = d
                changed = True
    stuck = [n for n in _reachable_rules(grammar, rules) if n not in depth]
    if stuck:  # a value the grammar lets a model start but never finish: a dead end
        shown = ", ".join(repr(n.removeprefix("ref:")) for n in sorted(stuck)[:5]) + (" ..." if len(stuck) > 5 else "")
        raise GrammarError(
            f"the grammar has no finite value for {shown}: it can only be written by containing "
            f"{'itself' if len(stuck) == 1 else 'one another'} (a reference cycle with no way out, such as "
            f"a required property that refers back to its own schema); make one link of the cycle "
            f"optional or give it a non-recursive alternative")
    top = _ref_depth(grammar.start, depth)
    if top > MAX_DEPTH:
        raise GrammarError(
            f"the shortest value of the grammar nests references {int(top)} deep; railcall allows "
            f"{MAX_DEPTH}: shorten the chain of required recursive properties")
    return {name: int(d) for name, d in depth.items()}


def need_of(ins: Instr) -> int:
    """How many references deep the shortest way from `ins` to the end of its frame (the end of
    its rule, or of the grammar) must nest: a thread waiting in `ins` at depth d can be finished
    only if d + need_of(ins) <= MAX_DEPTH. Computed from the instructions (a rule's own comes
    from its Forward, so recursion needs no fixpoint here) and kept on each of them."""
    try:
        return ins._need
    except AttributeError:
        pass
    todo = [ins]
    while todo:
        x = todo[-1]
        if hasattr(x, "_need"):
            todo.pop()
            continue
        missing = [p for p in x.need_parts() if not hasattr(p, "_need")]
        if missing:
            todo.extend(missing)
            continue
        x._need = x.need_from_parts()
        todo.pop()
    return ins._need


class _Compiler:
    def __init__(self, grammar: ir.Grammar, special_ids: dict[str, int], max_string: int, fragments: Fragments,
                 depths: dict[str, int] | None = None):
        self.g = grammar
        # each rule's shortest nesting (check_finite); where the grammar has rules, choices whose
        # branches nest differently get guards (see Guard, need_of)
        self.depths = depths or {}
        self.special_ids = special_ids
        self.max_string = max_string
        self.shared = fragments
        self.memo: dict[tuple[int, int], tuple] = {}
        self._nesting = 0  # compile() calls open on the stack (bounded by MAX_IR_NESTING)
        self.rules: dict[str, Forward] = {}
        self._pending: list[tuple[str, Forward]] = []

    def run(self) -> Program:
        start = self.compile(self.g.start, self.shared.accept)
        while self._pending:
            name, fwd = self._pending.pop()
            try:
                node = self.g.rule(name)
            except KeyError:
                raise GrammarError(f"reference to an undefined rule {name!r}") from None
            fwd.target = self.compile(node, RET)
        if len(self.shared.memo) + len(self.memo) > self.shared.limit:
            self.shared.memo.clear()
        self.shared.memo.update(self.memo)  # only now: every Forward in these is resolved
        return Program(start)

    def _string_max(self, node, pattern: bool = False) -> int:
        """A string node's maximum length: its maxLength where the schema gives one (a patterned
        string's at most PATTERN_MAX_LEN), else the string cap `max_string` (seed 000's
        MAX_STRING: a model must not be able to write one string forever), raised to minLength
        where that asks for more."""
        if node.max_len is None:
            hi = max(self.max_string, node.min_len)
        else:
            hi = node.max_len
        if pattern and hi > PATTERN_MAX_LEN:
            if node.min_len > PATTERN_MAX_LEN:
                raise GrammarError(f"a patterned string of at least {node.min_len} characters is longer than "
                                   f"railcall checks a pattern over ({PATTERN_MAX_LEN}): lower minLength")
            hi = PATTERN_MAX_LEN
        if node.min_len > hi:
            raise GrammarError(f"string length range is empty: minLength {node.min_len} > maxLength {hi}")
        return hi

    def compile(self, node, nxt: Instr) -> Instr:
        # Literals are keyed by value, so the punctuation after a tool's arguments is the same
        # instruction in every grammar and the arguments compiled against it can be shared.
        key = (node.data, id(nxt)) if isinstance(node, ir.Lit) else (id(node), id(nxt))
        hit = self.memo.get(key) or self.shared.memo.get(key)
        if hit is not None:
            return hit[2]
        self._nesting += 1
        if self._nesting > MAX_IR_NESTING:
            raise GrammarError(_TOO_DEEP)
        try:
            out = self._compile(node, nxt)
        finally:
            self._nesting -= 1
        self.memo[key] = (node, nxt, out)  # node and next kept alive, so their ids stay unique
        return out

    def _compile(self, node, nxt: Instr) -> Instr:
        if isinstance(node, ir.Lit):
            if not node.data:
                return nxt
            if isinstance(nxt, Lit):  # merge adjacent literals: fewer threads, longer forced runs
                return Lit(node.data + nxt.data, nxt.next)
            return Lit(node.data, nxt)
        if isinstance(node, ir.Seq):
            cur = nxt
            for item in reversed(node.items):
                cur = self.compile(item, cur)
            return cur
        if isinstance(node, ir.Alt):
            if not node.items:
                raise GrammarError("an empty alternative (anyOf with no branches) matches nothing")
            return self._split([self.compile(x, nxt) for x in node.items])
        if isinstance(node, ir.Select):
            if not node.choices:
                raise GrammarError("a choice with no options (an empty enum or tool table) matches nothing")
            return self._select([(k, self.compile(v, nxt)) for k, v in node.choices])
        if isinstance(node, ir.Special):
            tid = self.special_ids.get(node.name)
            if tid is None:
                # The token is not in this vocabulary: fall back to its text (documented limit).
                return self.compile(ir.Lit(node.name), nxt)
            return Special(tid, nxt)
        if isinstance(node, ir.Ref):
            fwd = self.rules.get(node.name)
            if fwd is None:
                fwd = self.rules[node.name] = Forward(self.depths.get(node.name, 0))
                self._pending.append((node.name, fwd))
            return Call(fwd, nxt)
        if isinstance(node, ir.JsonString):
            hi = self._string_max(node)
            body = JStr(node.min_len, hi, nxt)
            body.margin = self.shared.token_margin
            return self.compile(ir.Lit(b'"'), body)
        if isinstance(node, ir.JsonPattern):
            hi = self._string_max(node, pattern=True)
            dfa = char_dfa(node.kind, node.arg, hi)
            if not dfa.fits(0, 0, node.min_len, hi) and node.max_len is None and hi < PATTERN_MAX_LEN:
                # The string cap is below the pattern's shortest match (`^a{300}$`): raised to
                # it, as it is to a minLength above it.
                lengths = char_dfa(node.kind, node.arg, PATTERN_MAX_LEN).lengths[0] >> node.min_len
                if lengths:
                    hi = node.min_len + (lengths & -lengths).bit_length() - 1
                    dfa = char_dfa(node.kind, node.arg, hi)
            if not dfa.fits(0, 0, node.min_len, hi):
                raise GrammarError(f"no string matching {node.arg!r} has a length in [{node.min_len}, {hi}]")
            body = JPat(dfa, node.min_len, hi, nxt, _PY_ESCAPES if node.dialect == "python" else _SIMPLE_ESCAPES)
            body.margin = self.shared.token_margin
            return self.compile(ir.Lit(b'"'), body)
        if isinstance(node, ir.JsonInteger):
            if node.minimum is None and node.maximum is None:
                return self._num(JNum(True, nxt))
            return JInt(*clamp_int(node.minimum, node.maximum), nxt)
        if isinstance(node, ir.JsonNumber):
            if node.minimum is None and node.maximum is None:
                return self._num(JNum(False, nxt))
            return self._bounded_number(node, nxt)
        if isinstance(node, ir.Ws):
            return Ws(node.max, nxt) if node.max > 0 else nxt
        if isinstance(node, ir.JsonArray):
            return self._array(node, nxt)
        if isinstance(node, ir.JsonObject):
            return self._object(node, nxt)
        raise GrammarError(f"unknown grammar node {type(node).__name__}")

    def _split(self, targets: list[Instr]) -> Instr:
        """A choice between `targets`; those that must nest references deeper than the cheapest
        are guarded (see Guard), so that none is entered where it could not be finished."""
        if len(targets) == 1:
            return targets[0]
        if self.depths:
            needs = [need_of(t) for t in targets]
            low = min(needs)
            targets = [t if n == low else Guard(n, t) for t, n in zip(targets, needs)]
        return Split(targets)

    def _select(self, choices: list[tuple[bytes, Instr]]) -> Instr:
        """A trie of keys. Where the keys' continuations nest references to different depths,
        one trie per depth, each guarded (a key is not offered where what follows it could not
        be finished, and a trie never leads into a branch whose every key is refused)."""
        if self.depths:
            groups: dict[int, list] = {}
            for k, cont in choices:
                groups.setdefault(need_of(cont), []).append((k, cont))
            if len(groups) > 1:
                return self._split([Select(g) for g in groups.values()])
        return Select(choices)

    def _repeat(self, rep: Repeat) -> Repeat:
        """Guard a list's further items where one nests references deeper than what follows it."""
        rep.margin = self.shared.token_margin
        if self.depths:
            item = need_of(rep.item)
            if item > need_of(rep.next):
                rep.item_need = item
        return rep

    def _bounded_number(self, node: ir.JsonNumber, nxt: Instr) -> Instr:
        from decimal import Decimal

        lo = None if node.minimum is None else Decimal(node.minimum)
        hi = None if node.maximum is None else Decimal(node.maximum)
        ins = JDec(lo, hi, node.exclusive_min, node.exclusive_max, nxt)
        if not ins._feasible(""):
            raise GrammarError(f"no number of at most {MAX_NUMBER_CHARS} characters lies within the bounds "
                               f"(minimum {node.minimum}, maximum {node.maximum})")
        return ins

    def _punct(self, data: bytes, ws: int, nxt: Instr, before: bool = False, after: bool = True) -> Instr:
        """A punctuation literal with optional whitespace after it (and before it if `before`);
        plain when `ws` is 0 (compact JSON)."""
        out = self.compile(ir.Lit(data), self.compile(ir.Ws(ws), nxt) if ws and after else nxt)
        return self.compile(ir.Ws(ws), out) if ws and before else out

    def _array(self, node: ir.JsonArray, nxt: Instr) -> Instr:
        """`[`, the prefix items (prefixItems) in order, then `item` repeated, then `]`.

        The array may close after any prefix item once min_items are written; the repeated part
        counts on from the prefix length, so min/max items hold over the whole array."""
        lo, hi, ws = node.min_items, node.max_items, node.ws
        k = len(node.prefix)
        if hi is not None and lo > hi:
            raise GrammarError(f"array size range is empty: minItems {lo} > maxItems {hi}")
        if node.item is None and lo > k:
            raise GrammarError(f"minItems {lo} needs more items than the {k} prefix items allow")
        close = self._punct(b"]", ws, nxt, before=True, after=False)
        if hi is not None:
            k = min(k, hi)
        if node.item is not None and (hi is None or hi > k):
            item = self.compile(node.item, RET)
            sep = self._punct(b",", ws, item, before=True)
            rmin = max(lo - k, 0)
            rmax = None if hi is None else hi - k
            rest = self._repeat(Repeat(item, sep, rmin, rmax, close, lead_sep=k > 0))
        else:
            rest = close
        # after(i): i prefix items written; close if allowed, or go on with item i
        tail: Instr = rest
        for i in range(k - 1, -1, -1):
            value = self.compile(node.prefix[i], tail)
            entry = value if i == 0 else self._punct(b",", ws, value, before=True)
            tail = self._split([entry, close]) if i >= lo and i > 0 else entry
        if k and lo == 0:
            tail = self._split([tail, close])
        return self._punct(b"[", ws, tail)

    def _num(self, ins: JNum) -> JNum:
        ins.margin = self.shared.number_margin
        return ins

    def _object(self, node: ir.JsonObject, nxt: Instr) -> Instr:
        """Properties in declared order; optional ones skippable; commas only between members;
        then, if the object allows them, undeclared members from the `extras` classes.

        rest(i, first) is "the object from property i on, `first` if nothing was written yet".
        Each is compiled once, so n optional properties cost O(n) instructions, not 2^n paths.
        """
        props, ws = node.properties, node.ws
        close = self._punct(b"}", ws, nxt, before=True, after=False)
        extras: dict[bool, Instr] = {}

        def tail(first: bool) -> Instr:
            if not node.extras:
                return close
            hit = extras.get(first)
            if hit is None:
                members = [self.compile(key, self._punct(b":", ws, self.compile(value, RET), before=True))
                           for key, value in node.extras]
                member = self._split(members)
                sep = self._punct(b",", ws, member, before=True)
                hit = extras[first] = self._repeat(Repeat(member, sep, 0, node.max_extra, close, lead_sep=not first))
            return hit

        # From the last property back, so that a thousand properties are a loop, not a recursion
        # a thousand deep. rest(i, False) is needed for every i >= 1 (a value's continuation);
        # rest(i, True) only up to the first required property (before it, all were skippable).
        n = len(props)
        first_required = next((i for i, p in enumerate(props) if p[2]), n)
        later = {False: tail(False)} if n else {}
        if first_required == n:
            later[True] = tail(True)
        for i in range(n - 1, -1, -1):
            key, value, required = props[i]
            value_entry = self.compile(value, later[False])
            cur: dict[bool, Instr] = {}
            for first in ((False,) if i else ()) + ((True,) if i <= first_required else ()):
                if ws:
                    emit = self.compile(ir.Lit(ir.json_literal(key)), self._punct(b":", ws, value_entry, before=True))
                    if not first:
                        emit = self._punct(b",", ws, emit, before=True)
                else:
                    head = (b"" if first else b",") + ir.json_literal(key) + b":"
                    emit = self.compile(ir.Lit(head), value_entry)
                cur[first] = emit if required else self._split([emit, later[first]])
            later = cur
        return self._punct(b"{", ws, later[True])
