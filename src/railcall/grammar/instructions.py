"""The byte machine's instructions: each knows how one thread moves on one byte.

A grammar runs as a set of live *threads* (an NFA's live states: one per path still consistent with
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
(railcall.matcher) interns thread sets into DFA states and caches their transitions and masks;
these modules only define how one thread moves. This one holds the base class and the structural
instructions (literals, special tokens, choices, calls and returns, repetition, whitespace); the
bodies of JSON values are in `strings` and `numbers`, and `program` compiles IR into them.
"""

from __future__ import annotations

import numpy as np

from railcall.errors import GrammarError

# Recursion depth limit for Ref/$ref and a general grammar's rules: a model must not be able to
# nest forever, and every level is a stack frame in each thread. A calculator's parenthesis nests
# three rules (expr, term, factor): 128 frames are about 42 parentheses (32 allowed 10, fewer than
# llguidance and a user's expressions reach).
MAX_DEPTH = 128
# A number may not run forever either (a model can loop on digits as easily as on whitespace).

class Instr:
    """One instruction. Subclasses that consume bytes implement `step` and `allowed`."""

    __slots__ = ("next", "_need")  # _need: see need_of; -1 until computed (every __init__ sets it)
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

    def alike(self, local, b: int):
        """(lo, hi) with lo <= b < hi: a run of bytes that each step this thread to the threads
        byte b steps it to, so the automaton builds one transition for the run (a digit: one
        step for ten bytes); None where no other byte is known to."""
        return None

    def special(self, local) -> int | None:
        return None

    # need_of: how deep the shortest way from here to the end of the frame nests, from parts

    def need_parts(self) -> tuple:
        """The instructions whose need_of this one's is made of (a consuming instruction: the
        one it continues with)."""
        return (self.next,)

    def need_from_parts(self) -> int:
        """need_of from its parts' (all known): a choice takes its cheapest branch."""
        best = -1
        for p in self.need_parts():
            if best < 0 or p._need < best:
                best = p._need
        return 0 if best < 0 else best


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

    def __init__(self):
        self._need = -1

    def step(self, local, stack, b, out):
        return

    def allowed(self, local):
        return _NONE

    def need_parts(self):
        return ()


class Lit(Instr):
    __slots__ = ("data",)

    def __init__(self, data: bytes, nxt: Instr):
        self._need = -1
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
        self._need = -1
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
        self._need = -1
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
            kids = self.children[local]
            # most nodes of a long key have one child: the shared array, not one per node
            m = self._masks[local] = _ONE_BYTE[next(iter(kids))] if len(kids) == 1 else _byteset(kids.keys())
        return m

    def need_parts(self):
        return tuple(self.terminal.values())


class Split(Instr):
    __slots__ = ("targets",)
    consumes = False

    def __init__(self, targets: list[Instr]):
        self._need = -1
        self.targets = targets
        self.next = None

    def arrive(self, local, stack, out):
        for t in self.targets:
            t.arrive(0, stack, out)

    def need_parts(self):
        return tuple(self.targets)


class Forward(Instr):
    """A rule's entry (recursive rules reference themselves), its body compiled the first time a
    thread arrives (`compiler`, see program._Compiler.compile_rule). Its `_need` is its rule's
    (see need_of), known from the grammar before the rule is compiled."""

    __slots__ = ("target", "compiler")
    consumes = False

    def __init__(self, need: int = 0):
        self.target = None
        self.compiler = None
        self.next = None
        self._need = need

    def arrive(self, local, stack, out):
        t = self.target
        if t is None:
            t = self.compiler.compile_rule(self)
        t.arrive(local, stack, out)

    def need_parts(self):
        return ()  # its rule's, set when created


class Call(Instr):
    __slots__ = ("target",)
    consumes = False

    def __init__(self, target: Instr, nxt: Instr):
        self._need = -1
        self.target = target
        self.next = nxt

    def arrive(self, local, stack, out):
        depth = stack[3] if stack else 0
        if depth >= MAX_DEPTH:
            return  # too deep: this path is not offered
        self.target.arrive(0, (self.next, 0, stack, depth + 1), out)

    def need_from_parts(self):
        return max(1 + self.target._need, self.next._need)


class Jump(Instr):
    """A call in tail position (a general grammar's rule ending in a rule): the target returns
    where this rule would have, so the thread's stack does not grow. `a: "-" a | "x"` then
    writes any number of dashes, not MAX_DEPTH of them."""

    __slots__ = ("target",)
    consumes = False

    def __init__(self, target: Instr):
        self._need = -1
        self.target = target
        self.next = None

    def arrive(self, local, stack, out):
        self.target.arrive(0, stack, out)

    def need_parts(self):
        return (self.target,)


class Guard(Instr):
    """Enters `target` only where what it needs fits under the depth limit: a thread at depth d
    may take a branch that needs `need` more levels (see need_of) only if d + need <= MAX_DEPTH.
    Put in front of the branches of a choice that need more than its cheapest branch, so a model
    is never offered a way into a value it could not finish (an optional property whose value
    nests references, entered at the limit)."""

    __slots__ = ("target", "need")
    consumes = False

    def __init__(self, need: int, target: Instr):
        self._need = -1
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

    def __init__(self):
        self._need = -1

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
        self._need = -1
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

class Ws(Instr):
    """Up to `max` JSON whitespace bytes; local = how many so far. Optional (epsilon to next)."""

    __slots__ = ("max",)
    _BYTES = _byteset(b" \t\n\r")

    def __init__(self, max_ws: int, nxt: Instr):
        self._need = -1
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
