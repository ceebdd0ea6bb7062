"""Regular expressions (JSON Schema `pattern`, `format`) compiled to character automata.

JSON Schema patterns are ECMA-262 regexes matched by *search*: `abc` means "contains abc" unless
anchored with `^`/`$`. This module parses the subset of that syntax a regular language can hold
and compiles it into a `CharDFA`: a deterministic automaton over Unicode code points whose
transitions are stored as sorted intervals (a negated class is two intervals, not a million
entries). The byte machine (`strings.JPat`) runs a `CharDFA` inside a JSON string, decoding
escapes and UTF-8 as it goes, so the pattern constrains the string's *value*, not its spelling.

Supported: literals and escapes (`\\d \\w \\s` and their negations, `\\n \\t \\r \\f \\v \\0`,
`\\xHH`, `\\uHHHH`, escaped punctuation), `.`, classes `[...]`/`[^...]` with ranges, groups
`(...)`, `(?:...)`, `(?<name>...)`, alternation, the quantifiers `* + ? {n} {n,} {n,m}` (lazy forms
match the same language), and `^`/`$` at the ends of the pattern. Anything else (lookaround,
backreferences, `\\b`, `\\p{..}`, anchors in the middle) is a `RegexError` that names it.

The NFA is built when the pattern is compiled, with what keeps every path alive: which NFA
states can still reach acceptance, and (on first use, per length cap) the completion lengths
of each. The DFA is built on demand (`_Subsets`): a state's transitions the first time a string
steps from it, so a pattern whose DFA has thousands of states (an ARN's `[a-z0-9-]{0,63}`
chains, an unanchored alternation) costs at compile time only its NFA. Bounded:
`MAX_NFA_STATES`, a work budget for the closures, and `MAX_PATTERN_STATES` keep a hostile
pattern from taking the process down (`x{1000}{1000}` is an error, not a hang).
"""

from __future__ import annotations

import functools
import threading
from collections import deque
from bisect import bisect_left, bisect_right

from railcall.errors import GrammarError

MAX_UNICODE = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)
MAX_NFA_STATES = 20_000
MAX_DFA_STATES = 4_000  # a product of patterns, or the keys that exclude names (built whole)
# a pattern's automaton, built as strings visit it (see _Subsets)
MAX_PATTERN_STATES = 100_000
# How deep groups and quantifiers may nest, counted along any path of the pattern (`((a{1}){1})`
# is 4 deep). The parser and every walk over the syntax tree recurse once or twice per level; an
# explicit limit keeps a hostile pattern a RegexError, the same from the Python source as from the
# compiled build (which does not count recursion, and would crash).
MAX_NESTING = 64


class RegexError(GrammarError):
    """A pattern outside the supported subset, malformed, or too large."""


# -- character sets as sorted, disjoint, inclusive (lo, hi) intervals -------------------------


def norm_ranges(ranges) -> tuple:
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((a, b) for a, b in out)


def negate_ranges(ranges) -> tuple:
    out, nxt = [], 0
    for lo, hi in norm_ranges(ranges):
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= MAX_UNICODE:
        out.append((nxt, MAX_UNICODE))
    return tuple(out)


DIGIT = ((0x30, 0x39),)
WORD = norm_ranges([(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)])
# `\s` is ECMA-262's white space and line terminators less U+FEFF, and `\S` leaves out U+FEFF,
# U+001C-U+001F and U+0085 too: validators in Python (jsonschema) read `\s` as Python's `re` does,
# which lacks U+FEFF and adds those five, and a string either reading rejects must not be written.
# (Random walks over cfn-lint's schemas wrote "q\ufeff" for `^[\w\s+=,.@-]+$`.)
SPACE = norm_ranges([(0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A),
               (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000)])
_PYTHON_ONLY_SPACE = ((0x1C, 0x1F), (0x85, 0x85), (0xFEFF, 0xFEFF))
LINE_TERMINATORS = ((0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029))
ANY = ((0, MAX_UNICODE),)
DOT = negate_ranges(LINE_TERMINATORS)
_CLASS_ESCAPES = {"d": DIGIT, "D": negate_ranges(DIGIT), "w": WORD, "W": negate_ranges(WORD), "s": SPACE,
                  "S": negate_ranges(list(SPACE) + list(_PYTHON_ONLY_SPACE))}
_CHAR_ESCAPES = {"n": 0x0A, "t": 0x09, "r": 0x0D, "f": 0x0C, "v": 0x0B, "0": 0x00}


# -- parsing: pattern -> AST --------------------------------------------------------------------
# ("set", ranges) | ("cat", [nodes]) | ("alt", [nodes]) | ("rep", node, min, max or None)


class _Parser:
    def __init__(self, pattern: str):
        self.p = pattern
        self.i = 0
        self.depth = 0  # groups open around the current atom: bounds the parser's own recursion
        self.nest: dict[int, int] = {}  # id(node) -> groups and quantifiers nested in it (0 if absent)

    def error(self, what: str) -> RegexError:
        return RegexError(f"pattern {self.p!r}: {what} at offset {self.i}")

    def peek(self) -> str | None:
        return self.p[self.i] if self.i < len(self.p) else None

    def parse(self):
        node = self.alt()
        if self.i != len(self.p):
            raise self.error(f"unbalanced {self.p[self.i]!r}")
        return node

    def alt(self):
        branches = [self.cat()]
        while self.peek() == "|":
            self.i += 1
            branches.append(self.cat())
        if len(branches) == 1:
            return branches[0]
        return self._nested(("alt", branches), max(self._nest(b) for b in branches))

    def cat(self):
        items = []
        while (c := self.peek()) is not None and c not in "|)":
            items.append(self.quantified())
        return self._nested(("cat", items), max((self._nest(x) for x in items), default=0))

    def _nest(self, node) -> int:
        return self.nest.get(id(node), 0)

    def _nested(self, node, n: int):
        """Record that `node` holds `n` levels of groups and quantifiers (nodes stay alive for the
        whole parse, so their ids are not reused)."""
        if n > MAX_NESTING:
            raise self.error(f"groups and quantifiers nested more than {MAX_NESTING} deep")
        if n:
            self.nest[id(node)] = n
        return node

    def quantified(self):
        atom = self.atom()
        while True:
            c = self.peek()
            if c in ("*", "+", "?"):
                self.i += 1
                lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
            elif c == "{" and (q := self._braces()) is not None:
                lo, hi = q
            else:
                return atom
            if self.peek() == "?":  # lazy: the same language
                self.i += 1
            if atom[0] == "anchor":
                raise self.error("a quantifier on an anchor")
            atom = self._nested(("rep", atom, lo, hi), self._nest(atom) + 1)

    def _braces(self):
        """`{n}`, `{n,}`, `{n,m}` as a quantifier; None if the brace is a literal (ECMA annex B)."""
        j = self.p.find("}", self.i)
        if j < 0:
            return None
        body = self.p[self.i + 1 : j]
        parts = body.split(",")
        if len(parts) > 2 or not parts[0].isdigit() or (len(parts) == 2 and parts[1] and not parts[1].isdigit()):
            return None
        lo = int(parts[0])
        hi = lo if len(parts) == 1 else (int(parts[1]) if parts[1] else None)
        if hi is not None and hi < lo:
            raise self.error(f"quantifier {{{body}}} has max < min")
        if lo > 10_000 or (hi or 0) > 10_000:
            raise self.error(f"quantifier {{{body}}} is too large")
        self.i = j + 1
        return lo, hi

    def atom(self):
        c = self.p[self.i]
        self.i += 1
        if c == "(":
            if self.p.startswith("?:", self.i):
                self.i += 2
            elif self.p.startswith("?<", self.i) and self.p[self.i + 2 : self.i + 3] not in ("=", "!"):
                j = self.p.find(">", self.i)
                if j < 0:
                    raise self.error("an unterminated group name")
                self.i = j + 1
            elif self.peek() == "?":
                raise self.error("lookaround assertions are not supported")
            self.depth += 1
            if self.depth > MAX_NESTING:
                raise self.error(f"groups and quantifiers nested more than {MAX_NESTING} deep")
            node = self.alt()
            self.depth -= 1
            if self.peek() != ")":
                raise self.error("a missing ')'")
            self.i += 1
            return self._nested(node, self._nest(node) + 1)
        if c == "[":
            return ("set", self._class())
        if c == ".":
            return ("set", DOT)
        if c == "^":
            return ("anchor", "^")
        if c == "$":
            return ("anchor", "$")
        if c == "\\":
            return ("set", self._escape(in_class=False))
        if c in "*+?":
            raise self.error(f"nothing to repeat before {c!r}")
        if c == ")":
            raise self.error("an unbalanced ')'")
        return ("set", ((ord(c), ord(c)),))

    def _escape(self, in_class: bool) -> tuple:
        if self.i >= len(self.p):
            raise self.error("a trailing backslash")
        c = self.p[self.i]
        self.i += 1
        if c in _CLASS_ESCAPES:
            return _CLASS_ESCAPES[c]
        if c in _CHAR_ESCAPES:
            if c == "0" and self.peek() is not None and self.peek().isdigit():
                raise self.error("octal escapes are not supported")
            v = _CHAR_ESCAPES[c]
            return ((v, v),)
        if c == "b" and in_class:
            return ((0x08, 0x08),)
        if c == "x":
            return self._hex(2)
        if c == "u":
            if self.peek() == "{":
                j = self.p.find("}", self.i)
                if j < 0:
                    raise self.error("an unterminated \\u{...}")
                v = int(self.p[self.i + 1 : j], 16)
                self.i = j + 1
                return ((v, v),)
            return self._hex(4)
        if c.isdigit():
            raise self.error("backreferences are not supported")
        if c in "bB":
            raise self.error("word-boundary assertions (\\b, \\B) are not supported")
        if c in "pP":
            raise self.error("Unicode property escapes (\\p{...}) are not supported")
        if c == "c":
            raise self.error("control escapes (\\cX) are not supported")
        if c.isalnum():
            raise self.error(f"unknown escape \\{c}")
        return ((ord(c), ord(c)),)

    def _hex(self, n: int) -> tuple:
        h = self.p[self.i : self.i + n]
        if len(h) != n or any(x not in "0123456789abcdefABCDEF" for x in h):
            raise self.error(f"a malformed hex escape (expected {n} hex digits)")
        self.i += n
        v = int(h, 16)
        return ((v, v),)

    def _class(self) -> tuple:
        neg = self.peek() == "^"
        if neg:
            self.i += 1
        ranges = []
        first = True
        while True:
            if self.i >= len(self.p):
                raise self.error("an unterminated character class")
            c = self.p[self.i]
            if c == "]" and not first:
                self.i += 1
                break
            first = False
            lo = self._class_atom()
            if self.peek() == "-" and self.p[self.i + 1 : self.i + 2] not in ("]", ""):
                self.i += 1
                hi = self._class_atom()
                if len(lo) != 1 or len(hi) != 1 or lo[0][0] != lo[0][1] or hi[0][0] != hi[0][1]:
                    raise self.error("a class escape cannot bound a range")
                if hi[0][0] < lo[0][0]:
                    raise self.error("a character range out of order")
                ranges.append((lo[0][0], hi[0][0]))
            else:
                ranges.extend(lo)
        ranges = norm_ranges(ranges)
        return negate_ranges(ranges) if neg else ranges

    def _class_atom(self) -> tuple:
        c = self.p[self.i]
        self.i += 1
        if c == "\\":
            return self._escape(in_class=True)
        return ((ord(c), ord(c)),)


def parse(pattern: str):
    """Parse `pattern` (search semantics) into an AST anchored at both ends."""
    ast = _Parser(pattern).parse()
    return _absorb(_anchor(ast, pattern))


def _anchor(ast, pattern: str):
    """Turn search semantics into a full match: `^`/`$` at the ends anchor, otherwise `.*` pads.

    Only top-level (or whole-alternative) anchors are expressible here; one elsewhere errors."""
    branches = ast[1] if ast[0] == "alt" else [ast]
    out = []
    anyrep = ("rep", ("set", ANY), 0, None)
    for br in branches:
        items = list(br[1]) if br[0] == "cat" else [br]
        head = bool(items) and items[0] == ("anchor", "^")
        if head:
            items = items[1:]
        tail = bool(items) and items[-1] == ("anchor", "$")
        if tail:
            items = items[:-1]
        if _has_anchor(items):
            raise RegexError(f"pattern {pattern!r}: an anchor (^ or $) inside the pattern is not supported")
        out.append(("cat", ([] if head else [anyrep]) + items + ([] if tail else [anyrep])))
    return out[0] if len(out) == 1 else ("alt", out)


def _has_anchor(items) -> bool:
    for n in items:
        if n[0] == "anchor":
            return True
        if n[0] in ("cat", "alt") and _has_anchor(n[1]):
            return True
        if n[0] == "rep" and _has_anchor([n[1]]):
            return True
    return False


def _absorb(node):
    """`node` with every bounded repetition beside a star that absorbs it cut to its minimum:
    `S*X{m,n}` and `X{m,n}S*` are `S*X{m}` and `X{m}S*` wherever every X is also an S* (the
    star can take the optional copies), and X{0} is dropped. The same language, so the same
    masks, from far fewer states: an unanchored `[a-zA-Z0-9_\\-]{1,2048}$` is `.*` and then
    2,048 classes, whose subset construction kept every start position alive (2,050 states,
    each a set of up to 2,048 NFA states: ~1 s compiled); absorbed it is `.*[...]`, 3 states.
    Only the plain case is recognised: S a character set (any X beside `.*`, the padding of an
    unanchored end; a set X inside S otherwise)."""
    kind = node[0]
    if kind == "alt":
        return ("alt", [_absorb(x) for x in node[1]])
    if kind == "rep":
        return ("rep", _absorb(node[1]), node[2], node[3])
    if kind != "cat":
        return node
    items = [_absorb(x) for x in node[1]]
    changed = True
    while changed:
        changed = False
        for i in range(len(items) - 1):
            if _star_absorbs(items[i], items[i + 1]):
                j = i + 1
            elif _star_absorbs(items[i + 1], items[i]):
                j = i
            else:
                continue
            _, sub, lo, _ = items[j]
            if lo == 0:
                del items[j]
            else:
                items[j] = ("rep", sub, lo, lo)
            changed = True
            break
    return ("cat", items)


def _star_absorbs(star, rep) -> bool:
    """Is `star` S* over a character set S, and `rep` X{m,n} (n > m, or unbounded) with every
    X in S*?"""
    if star[0] != "rep" or star[2] != 0 or star[3] is not None or star[1][0] != "set":
        return False
    if rep[0] != "rep" or rep[3] == rep[2]:
        return False
    outer = star[1][1]
    if outer == ANY:
        return True
    inner = rep[1]
    if inner[0] != "set":
        return False
    los = [lo for lo, _ in outer]
    for lo, hi in inner[1]:
        i = bisect_right(los, lo) - 1
        if i < 0 or outer[i][1] < hi:
            return False
    return True


# -- AST -> NFA -> DFA ----------------------------------------------------------------------------


class _NFA:
    def __init__(self):
        self.eps: list[list[int]] = []
        self.edges: list[list[tuple[tuple, int]]] = []

    def state(self) -> int:
        if len(self.eps) >= MAX_NFA_STATES:
            raise RegexError(f"pattern too large: more than {MAX_NFA_STATES} automaton states "
                             "(shorten it or reduce its repetition counts)")
        self.eps.append([])
        self.edges.append([])
        return len(self.eps) - 1

    def build(self, node, start: int) -> int:
        """Add `node` from `start`; return its end state."""
        kind = node[0]
        if kind == "set":
            end = self.state()
            if node[1]:
                self.edges[start].append((node[1], end))
            return end
        if kind == "cat":
            cur = start
            for x in node[1]:
                cur = self.build(x, cur)
            return cur
        if kind == "alt":
            end = self.state()
            for x in node[1]:
                s = self.state()
                self.eps[start].append(s)
                self.eps[self.build(x, s)].append(end)
            return end
        if kind == "rep":
            _, sub, lo, hi = node
            cur = start
            for _ in range(lo):
                cur = self.build(sub, cur)
            if hi is None:
                loop = self.state()
                self.eps[cur].append(loop)
                self.eps[self.build(sub, loop)].append(loop)
                return loop
            end = self.state()
            self.eps[cur].append(end)
            for _ in range(hi - lo):
                cur = self.build(sub, cur)
                self.eps[cur].append(end)
            return end
        raise RegexError(f"unexpected regex node {kind}")

    def closure(self, states) -> frozenset:
        out = set(states)
        todo = list(states)
        while todo:
            for t in self.eps[todo.pop()]:
                if t not in out:
                    out.add(t)
                    todo.append(t)
        return frozenset(out)


class _Subsets:
    """The subset construction of an NFA, run on demand: a DFA state's row (its transitions) is
    built the first time something steps from it, so a pattern costs at compile time only its
    NFA, and a string pays for the states it visits. Shared by every length cap of a pattern.

    A DFA state is the epsilon closure of a set of NFA states, less those that cannot reach
    acceptance (`live`), so a transition that could never finish is absent (-1): no dead ends.
    Two closures are one state where they agree on their NFA states with a character edge and
    on their accepting ones (`_kernel`): the rest (the end of an alternative, of a class) steps
    nowhere, so they have the same future. Without this, `(a | b | c)+` would keep a state
    per last alternative matched (and `[ぁ-ゟ] | [ァ-ヿ] | ...` repeated gave a new state, a new
    matcher state and a new mask walk for each such history).
    Every state that accepts any rest of the string is one (`univ`; see _universal_roots).
    Rows are built under a lock (one automaton serves every request that uses the pattern).
    Bounded: past `limit` states, stepping into a new one is a RegexError (a pattern whose DFA
    explodes, `(a|b)*a(a|b){20}`, costs memory only as strings explore it, up to the bound)."""

    def __init__(self, nfa: _NFA, finals: frozenset, limit: int):
        self.nfa = nfa
        self.finals = finals
        self.limit = limit
        self.dead = _dead_states(nfa, finals)
        self.roots = _universal_roots(nfa, finals)
        self.univ = self._live(nfa.closure([min(self.roots)])) if self.roots else None
        start = self._canon(nfa.closure([0]))
        if not start:
            raise RegexError("the pattern matches no string")
        self.sets: list[frozenset] = [start]
        self.ids = {self._kernel(start): 0}  # a state's kernel -> its id
        self.accepting = [not finals.isdisjoint(start)]
        self.rows: list = [None]  # (starts, targets) per state, once built
        self._closures: dict[frozenset, tuple] = {}  # NFA targets -> (their DFA state, its kernel)
        self.shortest: tuple | None = None  # (the shortest accepted string's length,), once asked (CharDFA)
        self._lock = threading.Lock()

    def _live(self, states: frozenset) -> frozenset:
        return states - self.dead if self.dead and not self.dead.isdisjoint(states) else states

    def _kernel(self, state: frozenset) -> frozenset:
        """What decides a state's future: its NFA states with a character edge, and its
        accepting ones."""
        edges, finals = self.nfa.edges, self.finals
        return frozenset(x for x in state if edges[x] or x in finals)

    def _canon(self, closure: frozenset) -> frozenset:
        if self.roots and not self.roots.isdisjoint(closure):
            return self.univ
        return self._live(closure)

    def row(self, k: int) -> tuple[list, list]:
        r = self.rows[k]
        if r is None:
            with self._lock:
                r = self.rows[k]
                if r is None:
                    r = self.rows[k] = self._build(k)
        return r

    def explore(self) -> int:
        """Build every state now (tests, and tables that are small by construction)."""
        k = 0
        while k < len(self.sets):
            self.row(k)
            k += 1
        return len(self.sets)

    def _build(self, k: int) -> tuple[list, list]:
        nfa = self.nfa
        # The outgoing edges by character class: a DFA state of a bounded repetition holds many
        # NFA states on the same class (`[a-z0-9-]{0,63}`), and each class is placed once.
        by_class: dict[tuple, list[int]] = {}
        for s in self.sets[k]:
            for ranges, t in nfa.edges[s]:
                ts = by_class.get(ranges)
                if ts is None:
                    by_class[ranges] = [t]
                else:
                    ts.append(t)
        # Split the code-point line at every interval edge of every class; on each piece the
        # set of NFA targets is constant, and a class covers a run of pieces.
        pts = set()
        for ranges in by_class:
            for lo, hi in ranges:
                pts.add(lo)
                pts.add(hi + 1)
        pts = sorted(pts)
        pieces: list[list[int]] = [[] for _ in range(len(pts) - 1)]
        for ranges, ts in by_class.items():
            for lo, hi in ranges:
                for j in range(bisect_left(pts, lo), bisect_left(pts, hi + 1)):
                    pieces[j] += ts
        st: list[int] = []
        tg: list[int] = []
        if not pts or pts[0] > 0:
            st.append(0)
            tg.append(-1)
        for j, tgt in enumerate(pieces):
            target = -1
            if tgt:
                key = frozenset(tgt)
                known = self._closures.get(key)
                if known is None:
                    state = self._canon(nfa.closure(key))
                    known = self._closures[key] = (state, self._kernel(state))
                state, kernel = known
                if state:
                    target = self.ids.get(kernel, -1)
                    if target < 0:
                        if len(self.sets) >= self.limit:
                            raise RegexError(f"pattern too complex: more than {self.limit} automaton states")
                        target = self.ids[kernel] = len(self.sets)
                        self.sets.append(state)
                        self.accepting.append(not self.finals.isdisjoint(state))
                        self.rows.append(None)
            if tg and tg[-1] == target:
                continue
            st.append(pts[j])
            tg.append(target)
        if pts and pts[-1] <= MAX_UNICODE and tg[-1] != -1:
            st.append(pts[-1])
            tg.append(-1)
        return st, tg


def _dead_states(nfa: _NFA, finals: frozenset) -> frozenset:
    """NFA states from which no path reaches an accepting one."""
    n = len(nfa.eps)
    rev: list[list[int]] = [[] for _ in range(n)]
    for s in range(n):
        for t in nfa.eps[s]:
            rev[t].append(s)
        for _, t in nfa.edges[s]:
            rev[t].append(s)
    live = set(finals)
    todo = list(finals)
    while todo:
        for p in rev[todo.pop()]:
            if p not in live:
                live.add(p)
                todo.append(p)
    return frozenset(range(n)) - live if len(live) < n else frozenset()


def _universal_roots(nfa: _NFA, finals: frozenset) -> frozenset:
    """NFA states from which every string is accepted, recognised by their shape: `t` whose
    closure holds an accepting state and a state with an edge on every code point back to `t`
    (the `.*` padding of an unanchored end, `[\\s\\S]*$`). A DFA state that holds one matches
    any rest of the string, whatever else it holds; tracking which partial matches also go on
    (as the plain subset construction does) multiplies states for nothing: an unanchored
    `512|1024|...|(0.5|1|2) GB` grew past MAX_DFA_STATES, and is 25 states with this."""
    out = set()
    for s, edges in enumerate(nfa.edges):
        for ranges, t in edges:
            if ranges == ANY and t not in out:
                c = nfa.closure([t])
                if s in c and not finals.isdisjoint(c):
                    out.add(t)
    return frozenset(out)


def _node_lengths(nfa: _NFA, finals: frozenset, nodes: list[int], length_cap: int) -> dict[int, int]:
    """Per NFA node (the start, and every target of a character edge), the bitset of completion
    lengths up to `length_cap` (bit L: some string of L characters leads from the node's closure
    to acceptance): the least solution of

        L(x) = [closure(x) accepts] | OR over edges (y -> t) with y in closure(x) of L(t) << 1

    over the epsilon-free graph of the nodes. Solved one strongly connected component at a time,
    successors' components first (Tarjan's order), so a node's value is final once its component
    is done. A node with a loop onto itself (`[a-z]*`, `.*`) takes every length from its
    shortest on at once; other cycles are swept until nothing changes. A character edge only on
    surrogates (a pattern with a lone `\\ud800`) leads nowhere: no UTF-8 text holds one."""
    succ: dict[int, list[int]] = {}
    acc: dict[int, bool] = {}
    budget = [_CLOSURE_BUDGET]
    todo = list(nodes)
    while todo:
        x = todo.pop()
        if x in succ:
            continue
        c = nfa.closure([x])
        budget[0] -= len(c)
        if budget[0] < 0:
            raise RegexError("pattern too large: its automaton's closures exceed the work budget "
                             "(shorten it or reduce its repetition counts)")
        acc[x] = not finals.isdisjoint(c)
        ts = sorted({t for y in c for ranges, t in nfa.edges[y] if not _all_surrogates(ranges)})
        succ[x] = ts
        todo.extend(t for t in ts if t not in succ)
    full = (1 << (length_cap + 1)) - 1
    lengths: dict[int, int] = {}
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    comp: dict[int, int] = {}
    onstack: set[int] = set()
    stack: list[int] = []
    count = ncomp = 0
    for root in succ:
        if root in index:
            continue
        index[root] = low[root] = count
        count += 1
        stack.append(root)
        onstack.add(root)
        work = [(root, 0)]  # the depth-first path: (node, next successor to visit)
        while work:
            k, j = work[-1]
            sk = succ[k]
            if j < len(sk):
                work[-1] = (k, j + 1)
                t = sk[j]
                if t not in index:
                    index[t] = low[t] = count
                    count += 1
                    stack.append(t)
                    onstack.add(t)
                    work.append((t, 0))
                elif t in onstack and index[t] < low[k]:
                    low[k] = index[t]
                continue
            work.pop()
            if work and low[k] < low[work[-1][0]]:
                low[work[-1][0]] = low[k]
            if low[k] != index[k]:
                continue
            members = []
            while True:
                x = stack.pop()
                onstack.discard(x)
                comp[x] = ncomp
                members.append(x)
                if x == k:
                    break
            c = ncomp
            ncomp += 1
            inner, looped = [], []
            for x in members:
                v = 1 if acc[x] else 0
                mine = []
                for t in succ[x]:
                    if comp.get(t) == c:
                        if t != x:
                            mine.append(t)
                    else:
                        v |= lengths[t] << 1  # another component's: final already
                loop = x in succ[x]
                v &= full
                lengths[x] = full & -(v & -v) if loop and v else v
                inner.append(mine)
                looped.append(loop)
            changed = len(members) > 1
            while changed:
                changed = False
                for x, mine, loop in zip(members, inner, looped):
                    v = lengths[x]
                    for t in mine:
                        v |= lengths[t] << 1
                    v &= full
                    if loop and v:
                        v = full & -(v & -v)
                    if v != lengths[x]:
                        lengths[x] = v
                        changed = True
    return lengths


_CLOSURE_BUDGET = 4_000_000  # NFA states visited by _node_lengths' closures, at the most


def _all_surrogates(ranges) -> bool:
    return all(SURROGATES[0] <= lo and hi <= SURROGATES[1] for lo, hi in ranges)


class CharDFA:
    """A deterministic automaton over code points, at one length cap: a view of a shared
    `_Subsets` (built on demand) with the completion lengths the cap asks for.

    State k steps on a code point to another state or -1 (`step`; `row(k)` is its sorted
    interval starts and their targets), is `accepting[k]` or not, and has a bitset (a Python
    int) of the completion lengths possible from it up to `length_cap` (`length_set(k)`): it lets
    a string with minLength/maxLength offer only characters after which some accepted length
    is reachable. `max_dist` bounds the fewest characters to acceptance from any state (the
    byte machine's mask-cache keys rely on it). Lengths are computed on first use, over the NFA
    (`_node_lengths`): the schema front end builds a pattern's automaton to check it and to match
    enum values and property names against it, which needs none of them.

    Built from a table, `CharDFA(starts, targets, accepting, cap)` (the product of patterns, the
    keys that exclude names, tests), the table is the NFA: one state per row, no epsilon moves.
    """

    def __init__(self, starts, targets, accepting, length_cap: int):
        nfa = _NFA()
        for st, tg in zip(starts, targets):
            s = nfa.state()
            for i, t in enumerate(tg):
                if t >= 0:
                    nfa.edges[s].append((((st[i], st[i + 1] - 1 if i + 1 < len(st) else MAX_UNICODE),), t))
        finals = frozenset(k for k, a in enumerate(accepting) if a)
        self._view(_Subsets(nfa, finals, MAX_DFA_STATES), length_cap)

    @classmethod
    def over(cls, auto: _Subsets, length_cap: int) -> CharDFA:
        dfa = cls.__new__(cls)
        dfa._view(auto, length_cap)
        return dfa

    def _view(self, auto: _Subsets, length_cap: int) -> None:
        self.auto = auto
        self.accepting = auto.accepting  # grows with the automaton
        self.length_cap = length_cap
        self._node_lengths: dict[int, int] | None = None
        self._lengths: list[int] = []  # per state discovered so far, on first use
        self._max_dist: int | None = None

    @property
    def size(self) -> int:
        """States built so far."""
        return len(self.auto.sets)

    def row(self, k: int) -> tuple[list, list]:
        return self.auto.row(k)

    def step(self, k: int, cp: int) -> int:
        st, tg = self.auto.row(k)
        i = bisect_right(st, cp) - 1
        return tg[i] if i >= 0 else -1

    def targets_in(self, k: int, lo: int, hi: int):
        """The distinct target states for code points in [lo, hi]."""
        st, tg = self.auto.row(k)
        i = max(bisect_right(st, lo) - 1, 0)
        out = set()
        while i < len(st) and st[i] <= hi:
            end = st[i + 1] - 1 if i + 1 < len(st) else MAX_UNICODE
            if end >= lo and tg[i] >= 0:
                out.add(tg[i])
            i += 1
        return out

    def _nodes(self) -> dict[int, int]:
        nl = self._node_lengths
        if nl is None:
            auto = self.auto
            nodes = [0] + sorted({t for edges in auto.nfa.edges for _, t in edges})
            nl = self._node_lengths = _node_lengths(auto.nfa, auto.finals, nodes, self.length_cap)
        return nl

    def length_set(self, k: int) -> int:
        """The completion lengths from state k, as a bitset up to the cap."""
        ls = self._lengths
        if k < len(ls):
            return ls[k]
        nl = self._nodes()
        with self.auto._lock:  # appended in order: two threads must not both append state i
            sets = self.auto.sets
            while len(ls) <= k:
                v = 0
                for x in sets[len(ls)]:
                    v |= nl.get(x, 0)
                ls.append(v)
        return ls[k]

    @property
    def max_dist(self) -> int:
        """At least the fewest characters to acceptance from any state (from any NFA node: a DFA
        state's is the least of its nodes')."""
        if self._max_dist is None:
            self._max_dist = max(((v & -v).bit_length() - 1 for v in self._nodes().values() if v), default=0)
        return self._max_dist

    # whole-automaton views, for tests and small tables: they build every state

    @property
    def starts(self) -> list[list[int]]:
        self.auto.explore()
        return [self.auto.row(k)[0] for k in range(self.size)]

    @property
    def targets(self) -> list[list[int]]:
        self.auto.explore()
        return [self.auto.row(k)[1] for k in range(self.size)]

    @property
    def lengths(self) -> list[int]:
        self.auto.explore()
        return [self.length_set(k) for k in range(self.size)]

    @property
    def dist(self) -> list[int | None]:
        return [(v & -v).bit_length() - 1 if v else None for v in self.lengths]

    def can_end_within(self, lo: int, hi: int) -> bool:
        """Does the pattern accept a string whose length is in [lo, hi]? (`fits(0, 0, lo, hi)`,
        without computing the lengths where the shortest accepted string settles it: the
        compiler asks this of every patterned string, and most are answered so.)"""
        d = self.shortest()
        if d is None or d > hi:
            return False
        return d >= lo or self.fits(0, 0, lo, hi)

    def shortest(self) -> int | None:
        """The fewest characters of an accepted string (0-1 breadth-first over the NFA; kept on
        the automaton, which every cap shares)."""
        auto = self.auto
        if auto.shortest is None:
            auto.shortest = (self._shortest(),)
        return auto.shortest[0]

    def _shortest(self) -> int | None:
        nfa, finals = self.auto.nfa, self.auto.finals
        best = {0: 0}
        todo = deque([(0, 0)])
        while todo:
            d, x = todo.popleft()
            if d > best.get(x, d):
                continue
            if x in finals:
                return d
            for t in nfa.eps[x]:
                if d < best.get(t, d + 1):
                    best[t] = d
                    todo.appendleft((d, t))
            for ranges, t in nfa.edges[x]:
                if d + 1 < best.get(t, d + 2) and not _all_surrogates(ranges):
                    best[t] = d + 1
                    todo.append((d + 1, t))
        return None  # only through lone surrogates, which no UTF-8 text holds

    def fits(self, k: int, written: int, lo: int, hi: int) -> bool:
        """Can a string that has `written` characters and stands in state k still end accepted
        with a total length in [lo, hi]?"""
        a = max(0, lo - written)
        b = hi - written
        if b < a:
            return False
        return bool((self.length_set(k) >> a) & ((1 << (b - a + 1)) - 1))

    def matches(self, text: str) -> bool:
        k = 0
        for ch in text:
            k = self.step(k, ord(ch))
            if k < 0:
                return False
        return bool(self.accepting[k])


def _subsets(ast) -> _Subsets:
    nfa = _NFA()
    s0 = nfa.state()
    final = nfa.build(ast, s0)
    return _Subsets(nfa, frozenset((final,)), MAX_PATTERN_STATES)


def _automaton(ast) -> tuple[list, list, list]:
    """(starts, targets, accepting) of the whole DFA of `ast`, every state built (tests)."""
    auto = _subsets(ast)
    n = auto.explore()
    rows = [auto.row(k) for k in range(n)]
    return [r[0] for r in rows], [r[1] for r in rows], list(auto.accepting)


@functools.lru_cache(maxsize=256)
def _pattern_automaton(pattern: str) -> _Subsets:
    """The automaton of a pattern, for every length cap: the schema front end checks a pattern
    (at 256) and the compiler builds it at the string's maxLength; both share this, and the
    states either has built."""
    return _subsets(parse(pattern))


@functools.lru_cache(maxsize=256)
def compile_pattern(pattern: str, length_cap: int = 256) -> CharDFA:
    """Compile a JSON Schema `pattern` (search semantics) to a CharDFA. Cached: the schema front
    end checks a pattern and the compiler builds it, and the same pattern recurs across grammars."""
    if not isinstance(pattern, str):
        raise RegexError(f"a pattern must be a string, not {type(pattern).__name__}")
    return CharDFA.over(_pattern_automaton(pattern), length_cap)


def excluding(words, length_cap: int = 256) -> CharDFA:
    """Any string except the given ones (free-form object keys that must not repeat a declared
    property's name)."""
    # A trie of the words; leaving it (or finishing past a word's end) lands in `other`.
    nodes: list[dict[int, int]] = [{}]
    word_end = [False]
    for w in words:
        k = 0
        for ch in w:
            cp = ord(ch)
            nxt = nodes[k].get(cp)
            if nxt is None:
                nxt = len(nodes)
                nodes.append({})
                word_end.append(False)
                nodes[k][cp] = nxt
            k = nxt
        word_end[k] = True
    other = len(nodes)
    starts, targets, accepting = [], [], []
    for k, kids in enumerate(nodes + [{}]):
        st, tg = [0], [other]
        for cp in sorted(kids):
            if st[-1] == cp:
                tg[-1] = kids[cp]
            else:
                st.append(cp)
                tg.append(kids[cp])
            if cp < MAX_UNICODE:
                st.append(cp + 1)
                tg.append(other)
        starts.append(st)
        targets.append(tg)
        accepting.append(k == other or not word_end[k])
    return CharDFA(starts, targets, accepting, length_cap)


def product(parts, length_cap: int = 256) -> CharDFA:
    """The strings every (dfa, True) part accepts and every (dfa, False) part rejects.

    Product construction over the parts' interval partitions; a part whose state is gone (-1)
    can no longer accept, which ends a positive part's path and settles a negative part for
    good. Bounded like every other automaton here."""
    if len(parts) == 1 and parts[0][1]:
        return parts[0][0]  # the strings one automaton accepts: itself
    start = tuple(0 for _ in parts)
    ids = {start: 0}
    order = [start]
    rows = []
    i = 0
    while i < len(order):
        cur = order[i]
        i += 1
        pts = {0}
        for (dfa, _), k in zip(parts, cur):
            if k >= 0:
                pts.update(dfa.row(k)[0])
        pts = sorted(pts)
        st, tg = [], []
        for j, a in enumerate(pts):
            nxt = []
            dead = False
            for (dfa, must), k in zip(parts, cur):
                t = dfa.step(k, a) if k >= 0 else -1
                if t < 0 and must:
                    dead = True
                    break
                nxt.append(t)
            if dead:
                target = -1
            else:
                key = tuple(nxt)
                if key not in ids:
                    if len(order) >= MAX_DFA_STATES:
                        raise RegexError(f"key patterns too complex: more than {MAX_DFA_STATES} automaton states")
                    ids[key] = len(order)
                    order.append(key)
                target = ids[key]
            if tg and tg[-1] == target:
                continue
            st.append(a)
            tg.append(target)
        rows.append((st, tg))
    accepting = [all((k >= 0 and dfa.accepting[k]) if must else not (k >= 0 and dfa.accepting[k])
                     for (dfa, must), k in zip(parts, state)) for state in order]
    return CharDFA([r[0] for r in rows], [r[1] for r in rows], accepting, length_cap)
