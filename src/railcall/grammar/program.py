"""The compiler: grammar IR into the byte machine's instructions (`instructions`, `strings`,
`numbers`), with the checks that refuse what cannot be compiled (infinite or too deep nesting)."""

from __future__ import annotations

import threading

from railcall.errors import GrammarError
from railcall.grammar import ir
from railcall.grammar.instructions import MAX_DEPTH, RET, Accept, Call, Forward, Guard, Instr, Jump, Lit, Repeat, Select, Special, Split, Ws
from railcall.grammar.numbers import MAX_NUMBER_CHARS, JDec, JInt, JNum, clamp_int
from railcall.grammar.strings import _PY_ESCAPES, _SIMPLE_ESCAPES, PATTERN_MAX_LEN, JPat, JStr, JText, Text, char_dfa

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

    Counts what its grammars compiled, in bytes (`nbytes`: each grammar's `grammar_nbytes`,
    and the pattern automata its strings use, which grow as strings visit them): the matcher's
    per-vocabulary store adds it to its estimate (matcher.entries.VocabCache.nbytes). A count,
    never decreased: instructions dropped from the memo live on in the automaton's states.
    """

    def __init__(self, token_margin: int, number_margin: int, limit: int = 50_000):
        self.token_margin = token_margin
        self.number_margin = number_margin
        self.accept = Accept()
        self.memo: dict[tuple, tuple] = {}  # (node or literal, next, tail) -> (node, next, instruction)  # (id(node), id(next)) -> (node, next, instr)
        self.limit = limit
        self.program_bytes = 0  # grammar_nbytes of every grammar compiled here
        self.patterns: dict[int, object] = {}  # id -> each pattern automaton (regex._Subsets) used

    def nbytes(self) -> int:
        """The estimated bytes of what was compiled here: programs and pattern automata."""
        return self.program_bytes + sum([len(a.sets) for a in list(self.patterns.values())]) * PATTERN_STATE_BYTES


# What compiled instructions cost, in bytes, as `grammar_nbytes` estimates them (measured with
# tracemalloc, from source and compiled alike): a trie node of an enum or a table's names ~265 B
# (a dict, its slot and its subtree size), so a key costs that per byte; a literal's byte ~24 B
# with the matcher's per-offset keys (`_lit_cuts`); any other instruction, with its share of
# memos, ~400 B. A pattern automaton's state ~1.5-2.7 KB (its NFA set and its row).
TRIE_BYTE_BYTES = 272
LIT_BYTE_BYTES = 24
NODE_BYTES = 400
PATTERN_STATE_BYTES = 2048
# The most one grammar may compile to (its `grammar_nbytes`): what a request can add to the
# vocabulary's shared store at once. 64 MiB is ~240 KB of enum values (a 3 MB enum compiled to
# ~870 MB); a table of 128 tools is ~1 MiB.
MAX_GRAMMAR_BYTES = 64 << 20


def grammar_nbytes(grammar: ir.Grammar) -> tuple[int, int]:
    """(estimated bytes of the instructions `grammar` compiles to, bytes of text in its keys and
    literals): each IR node reachable from the start and the rules counted once. A loop, not a
    recursion (the IR is not yet checked for depth)."""
    total = text = 0
    seen: set[int] = set()
    todo = [grammar.start, *(node for _, node in grammar.rules)]
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        total += NODE_BYTES
        t = type(node)
        if t is ir.Lit:
            text += len(node.data)
            total += len(node.data) * LIT_BYTE_BYTES
        elif t is ir.Select:
            n = sum([len(k) for k, _ in node.choices])
            text += n
            total += n * TRIE_BYTE_BYTES
        elif t is ir.JsonObject:
            n = sum([len(k) + 4 for k, _, _ in node.properties])  # `,"key":`, twice where optional
            text += n
            total += 2 * n * LIT_BYTE_BYTES + 2 * len(node.properties) * NODE_BYTES
        elif t is ir.JsonPattern and node.kind != "regex":
            names = node.arg if node.kind == "except" else node.arg[0]
            n = sum([len(str(x)) for x in names or ()])  # excluded names: a trie of them
            text += n
            total += n * TRIE_BYTE_BYTES
        todo.extend(_children(node))
    return total, text


def check_size(grammar: ir.Grammar, limit: int | None = None) -> int:
    """`grammar_nbytes` of `grammar`; a GrammarError naming the limit where it is over `limit`
    (None: MAX_GRAMMAR_BYTES)."""
    limit = MAX_GRAMMAR_BYTES if limit is None else limit
    total, text = grammar_nbytes(grammar)
    if total > limit:
        raise GrammarError(
            f"the grammar is too large: it would compile to about {total / 2**20:.0f} MiB ({text:,} bytes of enum "
            f"values, names and literal text), over railcall's limit of {limit / 2**20:.0f} MiB per grammar "
            f"(MAX_GRAMMAR_BYTES); use fewer or shorter enum values (a pattern can stand for a long list), "
            f"or split the table")
    return total


def compile_grammar(grammar: ir.Grammar, special_ids: dict[str, int], *, max_string: int,
                    fragments: Fragments | None = None) -> Program:
    """Compile IR to instructions. `special_ids` maps special-token text to ids; `fragments`
    (per vocabulary) shares compiled pieces across grammars. An IR nested deeper than
    MAX_IR_NESTING is a GrammarError, in the compiled build as from source: a `Grammar` built
    with its own `key` skips the content hash whose recursion bounds the nesting otherwise,
    and the compiled build does not count recursion."""
    if grammar.rules:  # check_finite recurses over the rules' nodes: bound them first
        _check_nesting([grammar.start, *(node for _, node in grammar.rules)])
    size = check_size(grammar)  # before anything is built (rule bodies compile later, when entered)
    fragments = fragments or Fragments(1, 1)
    try:
        depths = check_finite(grammar)
        if depths and _deepest_nesting(grammar) <= MAX_DEPTH:
            depths = {}  # no value can nest to the limit: no branch needs a guard (see _split)
        program = _Compiler(grammar, special_ids, max_string, fragments, depths).run()
    except RecursionError:  # from source, the interpreter's limit can come first
        raise GrammarError(_TOO_DEEP) from None
    fragments.program_bytes += size
    return program


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
_EMPTY_ALT = "an empty alternative (anyOf with no branches) matches nothing"
_EMPTY_SELECT = "a choice with no options (an empty enum or tool table) matches nothing"


def _array_bounds(node: ir.JsonArray) -> None:
    lo, hi, k = node.min_items, node.max_items, len(node.prefix)
    if hi is not None and lo > hi:
        raise GrammarError(f"array size range is empty: minItems {lo} > maxItems {hi}")
    if node.item is None and lo > k:
        raise GrammarError(f"minItems {lo} needs more items than the {k} prefix items allow")


_NULLABLE_REPEAT = ("an unbounded repetition of something that can be empty (such as (a?)* or (b*)+) would "
                    "loop without writing anything: repeat the non-empty part instead")


def least_fixpoint(rules: dict, holds) -> set:
    """The names of the rules whose body `holds(body, known)` once the rules in `known` are known
    to (can this rule match the empty text, given those that can?), grown until nothing changes."""
    known: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, body in rules.items():
            if name not in known and holds(body, known):
                known.add(name)
                changed = True
    return known


def _nullable(node, rules: set) -> bool:
    """Can `node` match the empty text, given the rules known to (`rules`)?"""
    t = type(node)
    if t is ir.Lit:
        return not node.data
    if t is ir.Seq:
        return all(_nullable(x, rules) for x in node.items)
    if t is ir.Alt:
        return any(_nullable(x, rules) for x in node.items)
    if t is ir.Select:
        return any(not k and _nullable(v, rules) for k, v in node.choices)
    if t is ir.Ref:
        return node.name in rules
    if t is ir.Ws:
        return True
    if t is ir.Repeat:
        return node.min == 0 or _nullable(node.item, rules)
    if t is ir.Text:
        return matches_empty(node.pattern)
    return False


def matches_empty(pattern: str) -> bool:
    """Does the regex `pattern`, read as a whole text (ir.Text), match the empty text?"""
    return bool(char_dfa("regex", f"^(?:{pattern})$", 1).accepting[0])


def _repeat_bounds(node: ir.Repeat) -> None:
    if node.min < 0 or (node.max is not None and node.min > node.max):
        raise GrammarError(f"repetition range is empty: {node.min} to {node.max} times")


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
    if t is ir.Repeat:
        return _ref_depth(node.item, depth) if node.min > 0 else 0
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
    if t is ir.Repeat:
        return (node.item,)
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


def _deepest_nesting(grammar: ir.Grammar) -> float:
    """How many references deep any value of the grammar can nest: the longest chain of rules
    from the start, inf where the rules it reaches refer to one another in a cycle."""
    rules = dict(grammar.rules)
    refs: dict[str, set[str]] = {}

    def referred(node) -> set[str]:
        out: set[str] = set()
        todo = [node]
        while todo:
            x = todo.pop()
            if type(x) is ir.Ref:
                out.add(x.name)
            else:
                todo.extend(_children(x))
        return out

    longest: dict[str, float] = {}
    visiting: set[str] = set()

    def chain(name: str) -> float:  # rules nested in a value of `name`, itself included
        if name in longest:
            return longest[name]
        if name in visiting or len(visiting) > MAX_DEPTH:
            return _NEVER  # a cycle, or deeper than the limit anyway
        if name not in refs:
            refs[name] = referred(rules[name]) if name in rules else set()
        visiting.add(name)
        d = 1 + max((chain(r) for r in refs[name]), default=0)
        visiting.discard(name)
        longest[name] = d
        return d

    return max((chain(r) for r in referred(grammar.start)), default=0)


def need_of(ins: Instr) -> int:
    """How many references deep the shortest way from `ins` to the end of its frame (the end of
    its rule, or of the grammar) must nest: a thread waiting in `ins` at depth d can be finished
    only if d + need_of(ins) <= MAX_DEPTH. Computed from the instructions (a rule's own comes
    from its Forward, so recursion needs no fixpoint here) and kept on each of them (`_need`,
    -1 until then)."""
    if ins._need >= 0:
        return ins._need
    todo = [ins]
    while todo:
        x = todo[-1]
        if x._need >= 0:
            todo.pop()
            continue
        ready = True
        for p in x.need_parts():
            if p._need < 0:
                todo.append(p)
                ready = False
        if ready:
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
        # Whether choices get depth guards (see _split). The start runs at depth 0, where a
        # branch is refused only if it needs more than MAX_DEPTH levels: none can where every
        # rule's shortest value nests at most MAX_DEPTH - 1 (a branch nests one reference more,
        # at most). Rule bodies run at any depth: guarded wherever the grammar has rules.
        self.guarded = bool(self.depths) and max(self.depths.values(), default=0) + 1 > MAX_DEPTH
        self.special_ids = special_ids
        self.max_string = max_string
        self.shared = fragments
        self.memo: dict[tuple, tuple] = {}  # (node or literal, next, tail) -> (node, next, instruction)
        self._nesting = 0  # compile() calls open on the stack (bounded by MAX_IR_NESTING)
        self._empty_rules: set | None = None  # the rules that can match the empty text (see _nullable)
        # whether a reference followed by RET may jump (a rule body's end in a grammar with
        # tail_calls), not call: False in a repetition's item, whose RET returns to the repetition
        self._tail = False
        self.rules: dict[str, Forward] = {}
        self._pending: list[Forward] = []  # rules met, not yet handed their compiler
        self._names: dict[int, str] = {}  # id(Forward) -> its rule (the Forwards live in self.rules)

    def run(self) -> Program:
        start = self.compile(self.g.start, self.shared.accept)
        if self._pending:
            # A rule's body is compiled the first time a thread enters it (Forward.arrive): a
            # schema of hundreds of definitions pays at compile time for its start and for the
            # checks below, not for the definitions a value may never reach. Every error the
            # compiler could raise in a body is raised now, by those checks.
            self._check_rules()
            self._lock = threading.RLock()
            for fwd in self._pending:
                fwd.compiler = self
            self._pending.clear()
        if len(self.shared.memo) + len(self.memo) > self.shared.limit:
            self.shared.memo.clear()
        self.shared.memo.update(self.memo)  # a Forward in these compiles its rule when entered
        return Program(start)

    def compile_rule(self, fwd: Forward) -> Instr:
        """The body of `fwd`'s rule, compiled on first entry; the rules it refers to stay lazy."""
        with self._lock:
            if fwd.target is None:
                self.guarded = bool(self.depths)
                self._tail = self.g.tail_calls  # a rule's own end: a reference there may jump
                fwd.target = self.compile(self.g.rule(self._names[id(fwd)]), RET)
                for f in self._pending:
                    f.compiler = self
                self._pending.clear()
            return fwd.target

    def _check_rules(self) -> None:
        """Raise what compiling every rule the start reaches would raise (GrammarError), without
        compiling them: the same checks, node by node."""
        seen: set[int] = set()
        todo = [self.g.start]
        while todo:
            node = todo.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            t = type(node)
            if t is ir.Ref:
                try:
                    todo.append(self.g.rule(node.name))
                except KeyError:
                    raise GrammarError(f"reference to an undefined rule {node.name!r}") from None
                continue
            if t is ir.Alt and not node.items:
                raise GrammarError(_EMPTY_ALT)
            if t is ir.Select and not node.choices:
                raise GrammarError(_EMPTY_SELECT)
            if t is ir.JsonString:
                self._string_max(node)
            elif t is ir.JsonPattern:
                self._pattern(node)
            elif t is ir.JsonInteger:
                if node.multiple_of is not None:
                    self._bounded_number(node, RET)
                elif node.minimum is not None or node.maximum is not None:
                    clamp_int(node.minimum, node.maximum)
            elif t is ir.JsonNumber:
                if node.minimum is not None or node.maximum is not None or node.multiple_of is not None:
                    self._bounded_number(node, RET)
            elif t is ir.JsonArray:
                _array_bounds(node)
            elif t is ir.Text:
                self._text(node)
            elif t is ir.Repeat:
                _repeat_bounds(node)
                if node.max is None and self._nullable(node.item):
                    raise GrammarError(_NULLABLE_REPEAT)
            elif t is ir.JsonObject:
                todo.extend(key for key, _ in node.extras)
            todo.extend(_children(node))

    def _string_max(self, node, pattern: bool = False) -> int:
        """A string node's maximum length: its maxLength where the schema gives one (a patterned
        string's at most PATTERN_MAX_LEN), else the string cap `max_string` (a model
        must not be able to write one string forever), raised to minLength
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
        key = (node.data, id(nxt)) if isinstance(node, ir.Lit) else (id(node), id(nxt), self._tail)
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
                raise GrammarError(_EMPTY_ALT)
            return self._split([self.compile(x, nxt) for x in node.items])
        if isinstance(node, ir.Select):
            if not node.choices:
                raise GrammarError(_EMPTY_SELECT)
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
                self._names[id(fwd)] = node.name
                self._pending.append(fwd)
            if nxt is RET and self._tail:
                return Jump(fwd)
            return Call(fwd, nxt)
        if isinstance(node, ir.JsonString):
            hi = self._string_max(node)
            body = JStr(node.min_len, hi, nxt)
            body.margin = self.shared.token_margin
            return self.compile(ir.Lit(b'"'), body)
        if isinstance(node, ir.JsonPattern):
            dfa, hi = self._pattern(node)
            body = JPat(dfa, node.min_len, hi, nxt, _PY_ESCAPES if node.dialect == "python" else _SIMPLE_ESCAPES)
            body.margin = self.shared.token_margin
            return self.compile(ir.Lit(b'"'), body)
        if isinstance(node, ir.JsonInteger):
            if node.multiple_of is not None:
                return self._bounded_number(node, nxt)
            if node.minimum is None and node.maximum is None:
                return self._num(JNum(True, nxt))
            return JInt(*clamp_int(node.minimum, node.maximum), nxt)
        if isinstance(node, ir.JsonNumber):
            if node.minimum is None and node.maximum is None and node.multiple_of is None:
                return self._num(JNum(False, nxt))
            return self._bounded_number(node, nxt)
        if isinstance(node, ir.Ws):
            return Ws(node.max, nxt) if node.max > 0 else nxt
        if isinstance(node, ir.Text):
            dfa, hi = self._text(node)
            body = (JText if node.json else Text)(dfa, 0, hi, nxt)
            body.margin = self.shared.token_margin
            return body
        if isinstance(node, ir.Repeat):
            _repeat_bounds(node)
            if node.max is None and self._nullable(node.item):
                raise GrammarError(_NULLABLE_REPEAT)
            if node.max == 0:
                return nxt
            return self._repeat(Repeat(self._item(node.item), None, node.min, node.max, nxt))
        if isinstance(node, ir.JsonArray):
            return self._array(node, nxt)
        if isinstance(node, ir.JsonObject):
            return self._object(node, nxt)
        raise GrammarError(f"unknown grammar node {type(node).__name__}")

    def _count_pattern(self, dfa) -> None:
        """Count the automaton `dfa` grows on demand in the store (Fragments.nbytes); one
        built whole (a test's reference automaton) has none to count."""
        auto = getattr(dfa, "auto", None)
        if auto is not None:
            self.shared.patterns[id(auto)] = auto

    def _pattern(self, node: ir.JsonPattern):
        """(CharDFA, maximum length) of a patterned string; GrammarError if no matching string
        has an allowed length."""
        hi = self._string_max(node, pattern=True)
        dfa = char_dfa(node.kind, node.arg, hi)
        self._count_pattern(dfa)
        if not dfa.can_end_within(node.min_len, hi) and node.max_len is None and hi < PATTERN_MAX_LEN:
            # The string cap is below the pattern's shortest match (`^a{300}$`): raised to
            # it, as it is to a minLength above it.
            lengths = char_dfa(node.kind, node.arg, PATTERN_MAX_LEN).length_set(0) >> node.min_len
            if lengths:
                hi = node.min_len + (lengths & -lengths).bit_length() - 1
                dfa = char_dfa(node.kind, node.arg, hi)
                self._count_pattern(dfa)
        if not dfa.can_end_within(node.min_len, hi):
            raise GrammarError(f"no string matching {node.arg!r} has a length in [{node.min_len}, {hi}]")
        return dfa, hi

    def _item(self, node) -> Instr:
        """`node` compiled as a repetition's item: ending in RET, which returns to the repetition's
        frame, so a reference at its end is a call (a jump would leave the frame uncounted)."""
        tail, self._tail = self._tail, False
        try:
            return self.compile(node, RET)
        finally:
            self._tail = tail

    def _nullable(self, node) -> bool:
        """Can `node` match the empty text? (Rules by a least fixpoint, once per grammar.)"""
        if self._empty_rules is None:
            self._empty_rules = least_fixpoint(dict(self.g.rules), _nullable)
        return _nullable(node, self._empty_rules)

    def _text(self, node: ir.Text):
        """(CharDFA, maximum length: None where not capped) of raw text; GrammarError if no text
        matching the pattern has an allowed length."""
        anchored = f"^(?:{node.pattern})$"
        if node.max_len is None:
            dfa = char_dfa("regex", anchored, PATTERN_MAX_LEN)
            self._count_pattern(dfa)
            if dfa.shortest() is None:
                raise GrammarError(f"no text matches {node.pattern!r}")
            return dfa, None
        hi = min(node.max_len, PATTERN_MAX_LEN)
        dfa = char_dfa("regex", anchored, hi)
        self._count_pattern(dfa)
        if not dfa.can_end_within(0, hi):
            shortest = char_dfa("regex", anchored, PATTERN_MAX_LEN).shortest()
            if shortest is None:
                raise GrammarError(f"no text matches {node.pattern!r} within {PATTERN_MAX_LEN} characters")
            hi = shortest  # the cap is below the shortest match: raised to it, as a string's is
            dfa = char_dfa("regex", anchored, hi)
            self._count_pattern(dfa)
        return dfa, hi

    def _split(self, targets: list[Instr]) -> Instr:
        """A choice between `targets`; those that must nest references deeper than the cheapest
        are guarded (see Guard), so that none is entered where it could not be finished."""
        if len(targets) == 1:
            return targets[0]
        if self.guarded:
            needs = [need_of(t) for t in targets]
            low = min(needs)
            targets = [t if n == low else Guard(n, t) for t, n in zip(targets, needs)]
        return Split(targets)

    def _select(self, choices: list[tuple[bytes, Instr]]) -> Instr:
        """A trie of keys. Where the keys' continuations nest references to different depths,
        one trie per depth, each guarded (a key is not offered where what follows it could not
        be finished, and a trie never leads into a branch whose every key is refused)."""
        if self.guarded:
            groups: dict[int, list] = {}
            for k, cont in choices:
                groups.setdefault(need_of(cont), []).append((k, cont))
            if len(groups) > 1:
                return self._split([Select(g) for g in groups.values()])
        return Select(choices)

    def _repeat(self, rep: Repeat) -> Repeat:
        """Guard a list's further items where one nests references deeper than what follows it."""
        rep.margin = self.shared.token_margin
        if self.guarded:
            item = need_of(rep.item)
            if item > need_of(rep.next):
                rep.item_need = item
        return rep

    def _bounded_number(self, node, nxt: Instr) -> Instr:
        """A JsonNumber with bounds or a multipleOf, or a JsonInteger with a multipleOf: JDec
        (an integer one writes no fraction)."""
        from decimal import Decimal

        lo = None if node.minimum is None else Decimal(node.minimum)
        hi = None if node.maximum is None else Decimal(node.maximum)
        step = None if node.multiple_of is None else Decimal(node.multiple_of)
        if step is not None and not step > 0:
            raise GrammarError(f"multipleOf must be above 0, not {node.multiple_of}")
        integer = isinstance(node, ir.JsonInteger)
        ins = JDec(lo, hi, False if integer else node.exclusive_min, False if integer else node.exclusive_max, nxt,
                   step=step, frac=not integer)
        if not ins._feasible(""):
            of = "" if step is None else f", multipleOf {node.multiple_of}"
            raise GrammarError(f"no {'integer' if integer else 'number'} of at most {MAX_NUMBER_CHARS} characters lies "
                               f"within the bounds (minimum {node.minimum}, maximum {node.maximum}{of})")
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
        _array_bounds(node)
        close = self._punct(b"]", ws, nxt, before=True, after=False)
        if hi is not None:
            k = min(k, hi)
        if node.item is not None and (hi is None or hi > k):
            item = self._item(node.item)
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

        rest(i, c) is "the object from property i on, with c members written so far" (c = 0:
        nothing yet, so no comma). Counts are kept up to `top`: max_props where it binds, else
        min_props (past it, every count is alike), and at least 1 (written or not is all a
        comma needs). A state from which min_props cannot be reached, or a member
        past max_props, is not built. Each state is compiled once, so n optional properties
        cost O(n * top) instructions, not 2^n paths.
        """
        props, ws = node.properties, node.ws
        lo, hi = node.min_props, node.max_props
        if hi is not None and hi >= len(props) and not node.extras:
            hi = None  # a maximum no object can pass binds nothing (and would cost a state per count)
        top = hi if hi is not None else max(lo, 1)
        close = self._punct(b"}", ws, nxt, before=True, after=False)
        extras: dict[int, Instr] = {}

        def tail(c: int) -> Instr | None:
            """The object's end after c members: undeclared members (at most max_props - c), or
            the close; None where min_props is not met (extras never meet it: schema.py only
            gives them with a minimum the required members meet)."""
            if not node.extras:
                return close if c >= lo else None
            room = None if hi is None else hi - c
            if node.max_extra is not None:
                room = node.max_extra if room is None else min(room, node.max_extra)
            key = (c > 0, room)
            hit = extras.get(key)
            if hit is None:
                if room == 0:
                    hit = close
                else:
                    members = [self.compile(k, self._punct(b":", ws, self._item(value), before=True))
                               for k, value in node.extras]
                    member = self._split(members)
                    sep = self._punct(b",", ws, member, before=True)
                    hit = self._repeat(Repeat(member, sep, 0, room, close, lead_sep=c > 0))
                extras[key] = hit
            return hit

        # From the last property back, so that a thousand properties are a loop, not a recursion
        # a thousand deep. Only the states a written object can be in are built: c <= i, and
        # c == 0 only up to the first required property (before it, all were skippable).
        n = len(props)
        first_required = next((i for i, p in enumerate(props) if p[2]), n)
        later: dict[int, Instr] = {}
        for c in range(min(n, top) + 1):
            t = tail(c)
            if t is not None and (c or first_required == n):
                later[c] = t
        for i in range(n - 1, -1, -1):
            key, value, required = props[i]
            cur: dict[int, Instr] = {}
            for c in range(min(i, top) + 1):
                if c == 0 and i > first_required:
                    continue
                after = later.get(min(c + 1, top)) if hi is None or c < hi else None
                options = []
                if after is not None:
                    value_entry = self.compile(value, after)
                    if ws:
                        emit = self.compile(ir.Lit(ir.json_literal(key)), self._punct(b":", ws, value_entry, before=True))
                        if c:
                            emit = self._punct(b",", ws, emit, before=True)
                    else:
                        emit = self.compile(ir.Lit((b"," if c else b"") + ir.json_literal(key) + b":"), value_entry)
                    options.append(emit)
                if not required and c in later:
                    options.append(later[c])
                if options:
                    cur[c] = self._split(options)
            later = cur
        if 0 not in later:
            raise GrammarError(f"no object has {f'{lo} to {hi}' if hi is not None else f'at least {lo}'} of its "
                               "allowed members")
        return self._punct(b"{", ws, later[0])
