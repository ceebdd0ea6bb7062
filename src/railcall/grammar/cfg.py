"""General grammars (Lark, GBNF, a regex) into the IR: the back end the front ends share.

A front end (`lark`, `gbnf`) parses its text into rules over a small syntax tree of tuples:

    ("lit", text)              these characters
    ("set", ranges)            one character in the sorted (lo, hi) code point ranges
    ("regex", pattern)         text matching a regex (railcall's dialect, see grammar.regex)
    ("ref", name, pos)         the rule `name` (pos: (line, column) of the reference)
    ("seq", items) / ("alt", items)
    ("rep", item, lo, hi)      item lo to hi times (hi None: no bound)
    ("node", ir_node, rules)   an IR node made elsewhere (Lark's %json: a JSON Schema value)

and `build` turns them into an `ir.Grammar`. There is no lexer: a terminal is part of the
language, so the grammar accepts exactly the texts its rules derive (a lexer's longest-match
choices do not remove any). Regular parts become character automata:

- A rule is *regular* when no rule it reaches (itself included) is recursive; it is inlined, as a
  regex, wherever it is used. A maximal run of regular items in a sequence becomes one `ir.Text`
  (one automaton), or one `ir.Lit` when it is plain characters. Recursion stays as rules (`Ref`),
  repetition of a non-regular item as `ir.Repeat`.
- A rule that reaches itself again before writing anything (left recursion, direct or through
  other rules) is refused with an error that names it: the byte machine expands rules depth
  first and would never write a byte. `expr: expr "+" term | term` is written
  `expr: term ("+" term)*`.
- A regular stretch (a `Text`) has no length cap (a reply's token budget bounds it), and rules
  nest at most grammar.instructions.MAX_DEPTH deep (a recursive rule entered inside itself and returned from,
  as in `"(" expr ")"`). Neither repetition nor a rule that ends in a rule (`a: "-" a`) nests, so
  `statement*` and right recursion have no such limit.
"""

from __future__ import annotations

from railcall.errors import GrammarError
from railcall.grammar import ir
from railcall.grammar.program import least_fixpoint, matches_empty
from railcall.grammar.regex import MAX_UNICODE, RegexError
from railcall.grammar.strings import PATTERN_MAX_LEN, char_dfa

_META = set("\\^$.|?*+()[]{}/")


def escape_char(cp: int, in_class: bool = False) -> str:
    """One code point, spelled for railcall's regex dialect."""
    c = chr(cp)
    if in_class:
        return "\\" + c if c in "\\]^-[" else (c if cp >= 0x20 else f"\\x{cp:02x}")
    if c in _META:
        return "\\" + c
    return c if cp >= 0x20 else f"\\x{cp:02x}"


def class_regex(ranges) -> str:
    """A character class `[...]` for the (lo, hi) ranges."""
    if not ranges:
        raise GrammarError("an empty character class matches nothing")
    if tuple(ranges) == ((0, MAX_UNICODE),):
        return "[\\s\\S]"
    parts = []
    for lo, hi in ranges:
        if lo == hi:
            parts.append(escape_char(lo, True))
        else:
            parts.append(escape_char(lo, True) + "-" + escape_char(hi, True))
    return "[" + "".join(parts) + "]"


# Groups inside groups, at the most, in a Lark or GBNF text (each is a frame of the parsers).
MAX_NESTING = 64
_QUANTIFIERS = {"*": (0, None), "+": (1, None), "?": (0, 1)}
_HEX_DIGITS = {"x": 2, "u": 4, "U": 8}


class Reader:
    """What the Lark and GBNF parsers share: the text and a position in it, errors that name the
    line and column, alternatives, groups, quantifiers and hex escapes. A parser gives
    `sequence(top)` (one alternative) and `at_bar(top)` (is a `|` next, the position on it)."""

    kind = "grammar"

    def __init__(self, text: str):
        self.t = text
        self.i = 0
        self.depth = 0  # groups open around the current item

    def pos(self, i: int | None = None) -> tuple[int, int]:
        i = self.i if i is None else i
        return self.t.count("\n", 0, i) + 1, i - (self.t.rfind("\n", 0, i) + 1) + 1

    def error(self, what: str, i: int | None = None) -> GrammarError:
        line, col = self.pos(i)
        return GrammarError(f"{self.kind} grammar, line {line}, column {col}: {what}")

    def sequence(self, top: bool):  # pragma: no cover - each parser has its own
        raise NotImplementedError

    def at_bar(self, top: bool) -> bool:  # pragma: no cover - each parser has its own
        raise NotImplementedError

    def alternatives(self, top: bool):
        alts = [self.sequence(top)]
        while self.at_bar(top):
            self.i += 1
            alts.append(self.sequence(top))
        return alts[0] if len(alts) == 1 else ("alt", alts)

    def group(self, close: str):
        """The alternatives between the opening character at the position and `close`."""
        start = self.i
        self.i += 1
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise self.error(f"groups nested more than {MAX_NESTING} deep")
        inner = self.alternatives(top=False)
        self.skip()
        if not self.t.startswith(close, self.i):
            raise self.error(f"a `{self.t[start]}` without its `{close}`", start)
        self.i += 1
        self.depth -= 1
        return inner

    def skip(self) -> None:  # pragma: no cover - each parser has its own
        raise NotImplementedError

    def quantifier(self, item):
        """`item` under the `*`, `+` or `?` at the position (the position past it), or None."""
        q = _QUANTIFIERS.get(self.t[self.i : self.i + 1])
        if q is None:
            return None
        self.i += 1
        return ("rep", item, *q)

    def hex_escape(self, start: int) -> int:
        """The code point of the `\\x`, `\\u` or `\\U` escape at `start`; the position past it."""
        e = self.t[start + 1]
        n = _HEX_DIGITS[e]
        digits = self.t[start + 2 : start + 2 + n]
        if len(digits) != n or any(d not in "0123456789abcdefABCDEF" for d in digits):
            raise self.error(f"`\\{e}` needs {n} hex digits", start)
        cp = int(digits, 16)
        if cp > MAX_UNICODE or 0xD800 <= cp <= 0xDFFF:
            raise self.error(f"`\\{e}{digits}` is not a character", start)
        self.i = start + 2 + n
        return cp


class Rules:
    """The rules of one grammar as a front end parsed them: name -> (tree, (line, column))."""

    def __init__(self, kind: str):
        self.kind = kind  # "Lark" or "GBNF": named in errors
        self.defs: dict[str, tuple] = {}
        self.pos: dict[str, tuple[int, int]] = {}

    def add(self, name: str, tree, pos: tuple[int, int]) -> None:
        if name in self.defs:
            line = self.pos[name][0]
            raise GrammarError(f"{self.kind} grammar, line {pos[0]}, column {pos[1]}: {name!r} is defined twice "
                               f"(first on line {line})")
        self.defs[name] = tree
        self.pos[name] = pos

    def where(self, name: str) -> str:
        line, col = self.pos[name]
        return f"{self.kind} grammar, line {line}, column {col}"


def _refs(tree, out: list) -> list:
    k = tree[0]
    if k == "ref":
        out.append(tree)
    elif k in ("seq", "alt"):
        for x in tree[1]:
            _refs(x, out)
    elif k == "rep":
        _refs(tree[1], out)
    return out


def _nullable(tree, empty: set) -> bool:
    k = tree[0]
    if k == "lit":
        return not tree[1]
    if k == "set":
        return False
    if k == "regex":
        return matches_empty(tree[1])
    if k == "ref":
        return tree[1] in empty
    if k == "seq":
        return all(_nullable(x, empty) for x in tree[1])
    if k == "alt":
        return any(_nullable(x, empty) for x in tree[1])
    if k == "rep":
        return tree[2] == 0 or _nullable(tree[1], empty)
    return False  # "node": a JSON value is never empty


def _first_refs(tree, empty: set, out: set) -> bool:
    """Add to `out` the rules `tree` can enter before writing anything; True if it can be empty."""
    k = tree[0]
    if k == "ref":
        out.add(tree[1])
        return tree[1] in empty
    if k == "seq":
        for x in tree[1]:
            if not _first_refs(x, empty, out):
                return False
        return True
    if k == "alt":
        can = False
        for x in tree[1]:
            can = _first_refs(x, empty, out) or can
        return can
    if k == "rep":
        return _first_refs(tree[1], empty, out) or tree[2] == 0
    return _nullable(tree, empty)


class _Builder:
    def __init__(self, rules: Rules, start: str):
        self.r = rules
        self.start = start
        self.extra_rules: list = []  # rules of embedded IR nodes (%json)
        self._regex_memo: dict[str, str] = {}

    def check(self) -> None:
        defs = self.r.defs
        if self.start not in defs:
            raise GrammarError(f"{self.r.kind} grammar: no {self.start!r} rule (the text a model writes starts there)")
        for name, tree in defs.items():
            for ref in _refs(tree, []):
                if ref[1] not in defs:
                    line, col = ref[2]
                    raise GrammarError(f"{self.r.kind} grammar, line {line}, column {col}: {ref[1]!r} is used in "
                                       f"rule {name!r} but never defined")
        self.empty = empty = least_fixpoint(defs, _nullable)
        # recursion: the rules each rule reaches
        graph = {name: {ref[1] for ref in _refs(tree, [])} for name, tree in defs.items()}
        reach: dict[str, set] = {}
        for name in defs:
            seen, todo = set(), list(graph[name])
            while todo:
                n = todo.pop()
                if n not in seen:
                    seen.add(n)
                    todo.extend(graph[n])
            reach[name] = seen
        self.recursive = {n for n in defs if n in reach[n]}
        self.regular = {n for n in defs if n not in self.recursive and not (reach[n] & self.recursive)}
        # left recursion: a rule entered again before a byte is written
        first = {}
        for name, tree in defs.items():
            out: set[str] = set()
            _first_refs(tree, empty, out)
            first[name] = out
        for name in sorted(self.recursive, key=lambda n: self.r.pos[n]):
            seen, todo, parent = {name}, [name], {}
            while todo:
                n = todo.pop()
                for m in first[n]:
                    if m == name:
                        chain = [n]
                        while chain[-1] != name:
                            chain.append(parent[chain[-1]])
                        path = " -> ".join([*reversed(chain), name])
                        raise GrammarError(
                            f"{self.r.where(name)}: rule {name!r} is left-recursive ({path} before any text is "
                            f"written); railcall expands rules depth first and cannot run it. Write the "
                            f"repetition with * or +: `a: a \"x\" | b` is `a: b (\"x\")*`")
                    if m not in seen:
                        seen.add(m)
                        parent[m] = n
                        todo.append(m)

    # -- regular parts to regexes --------------------------------------------------------------

    def regex(self, tree) -> str:
        k = tree[0]
        if k == "lit":
            return "".join(escape_char(ord(c)) for c in tree[1])
        if k == "set":
            return class_regex(tree[1])
        if k == "regex":
            return f"(?:{tree[1]})"
        if k == "ref":  # a sequence or a group: safe to concatenate (a repetition groups its item)
            name = tree[1]
            hit = self._regex_memo.get(name)
            if hit is None:
                hit = self._regex_memo[name] = self.regex(self.r.defs[name])
            return hit
        if k == "seq":
            return "".join(self.regex(x) for x in tree[1])
        if k == "alt":
            return "(?:" + "|".join(self.regex(x) for x in tree[1]) + ")"
        if k == "rep":
            _, item, lo, hi = tree
            body = self.regex(item)
            if not _atom(body):
                body = f"(?:{body})"
            if (lo, hi) == (0, None):
                q = "*"
            elif (lo, hi) == (1, None):
                q = "+"
            elif (lo, hi) == (0, 1):
                q = "?"
            elif hi is None:
                q = f"{{{lo},}}"
            elif lo == hi:
                q = f"{{{lo}}}"
            else:
                q = f"{{{lo},{hi}}}"
            return body + q
        raise GrammarError(f"internal: no regex for {k}")

    def is_regular(self, tree) -> bool:
        k = tree[0]
        if k in ("lit", "set", "regex"):
            return True
        if k == "ref":
            return tree[1] in self.regular
        if k in ("seq", "alt"):
            return all(self.is_regular(x) for x in tree[1])
        if k == "rep":
            return self.is_regular(tree[1])
        return False

    def _plain(self, tree) -> str | None:
        """The text of a tree that is one fixed string (literals, one-character sets), else None."""
        k = tree[0]
        if k == "lit":
            return tree[1]
        if k == "set" and len(tree[1]) == 1 and tree[1][0][0] == tree[1][0][1]:
            return chr(tree[1][0][0])
        if k == "seq":
            parts = [self._plain(x) for x in tree[1]]
            return None if any(p is None for p in parts) else "".join(parts)
        if k == "ref" and tree[1] in self.regular:
            return self._plain(self.r.defs[tree[1]])
        return None

    def leaf(self, tree) -> ir.Node:
        """A regular tree as one IR node: a literal if it is one, else an automaton."""
        plain = self._plain(tree)
        if plain is not None:
            return ir.Lit(plain)
        pattern = self.regex(tree)
        return ir.Text(pattern)

    # -- everything else to IR ----------------------------------------------------------------

    def node(self, tree) -> ir.Node:
        if self.is_regular(tree):
            return self.leaf(tree)
        k = tree[0]
        if k == "ref":
            return ir.Ref(tree[1])
        if k == "node":
            self.extra_rules.extend(tree[2])
            return tree[1]
        if k == "seq":
            out, run = [], []
            for x in tree[1]:
                if self.is_regular(x):
                    run.append(x)
                    continue
                if run:
                    out.append(self.leaf(("seq", run)))
                    run = []
                out.append(self.node(x))
            if run:
                out.append(self.leaf(("seq", run)))
            return out[0] if len(out) == 1 else ir.Seq(*out)
        if k == "alt":
            return ir.Alt(*(self.node(x) for x in tree[1]))
        if k == "rep":
            _, item, lo, hi = tree
            if hi is None and _nullable(item, self.empty):
                raise GrammarError(f"{self.r.kind} grammar: an unbounded repetition of something that can be "
                                   f"empty, in {self._describe(item)}: repeat only its non-empty part")
            return ir.Repeat(self.node(item), lo, hi)
        raise GrammarError(f"internal: no IR for {k}")

    def _describe(self, tree) -> str:
        refs = _refs(tree, [])
        return f"the part using {refs[0][1]!r}" if refs else "a group"

    def build(self, name: str) -> ir.Grammar:
        try:
            self.check()  # reads each regex leaf (can it be empty?): a bad one is a RegexError
            rules = [(n, self.node(t)) for n, t in self.r.defs.items() if n not in self.regular]
            start = self.node(self.r.defs[self.start])  # its body (the rule stays, for references)
            grammar = ir.Grammar(start, tuple(rules) + tuple(self.extra_rules), name=name, tail_calls=True)
        except RegexError as e:
            raise GrammarError(f"{self.r.kind} grammar: {e}") from None
        return grammar


def _atom(body: str) -> bool:
    """Is the regex `body` one atom a quantifier may follow (a character, an escape, a class)?"""
    if len(body) == 1:
        return body not in _META
    if body[0] == "\\":
        return len(body) == 2 or (body[1] == "x" and len(body) == 4)
    if body[0] == "[":
        i = 1
        while i < len(body):  # the first unescaped `]` (after any leading `^`) must end it
            c = body[i]
            if c == "\\":
                i += 2
                continue
            if c == "]" and i > 1:
                return i == len(body) - 1
            i += 1
    return False


def build(rules: Rules, start: str, name: str) -> ir.Grammar:
    """The IR grammar of parsed rules, starting at `start` (see the module docstring)."""
    return _Builder(rules, start).build(name)


def regex_grammar(pattern: str, max_len: int | None = None) -> ir.Grammar:
    """Text that matches `pattern` as a whole (railcall's regex dialect, grammar.regex: the
    subset of ECMA-262 / Python `re` a regular language holds), of any length or at most
    `max_len` characters (up to grammar.strings.PATTERN_MAX_LEN). A GrammarError (a RegexError)
    names what is outside the dialect."""
    if not isinstance(pattern, str):
        raise GrammarError(f"a regex grammar takes a pattern string, not {type(pattern).__name__}")
    if pattern.startswith("^"):
        pattern = pattern[1:]  # anchored already: the whole text matches
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        pattern = pattern[:-1]
    if max_len is not None and not 0 < max_len <= PATTERN_MAX_LEN:
        raise GrammarError(f"max_len must be 1 to {PATTERN_MAX_LEN}, not {max_len}")
    if char_dfa("regex", f"^(?:{pattern})$", PATTERN_MAX_LEN).shortest() is None:  # errors name the pattern
        raise GrammarError(f"no text matches {pattern!r}")
    return ir.Grammar(ir.Text(pattern, max_len), name="regex")


def json_escaped(text: bytes) -> bytes:
    """`text` as the inside of a JSON string, as the matcher's JSON strings take it: a quote, a
    backslash and control characters (DEL too) escaped, everything else as itself."""
    try:
        decoded = text.decode("utf-8")
    except UnicodeDecodeError:
        raise GrammarError(f"the literal {text!r} is not whole UTF-8 text, so no JSON string can hold it") from None
    out = []
    for c in decoded:
        if c in '"\\':
            out.append("\\" + c)
        elif c < " " or c == "\x7f":
            out.append({"\n": "\\n", "\t": "\\t", "\r": "\\r", "\b": "\\b", "\f": "\\f"}.get(c, f"\\u{ord(c):04x}"))
        else:
            out.append(c)
    return "".join(out).encode("utf-8")


def inside_json_string(grammar: ir.Grammar, where: str = "the grammar") -> ir.Grammar:
    """The same language written as the inside of a JSON string: what a call's string holds when
    its decoded value is a text of `grammar` (an OpenAI custom tool's input). Literals are
    escaped once (the machine writes them); a terminal's characters may be written as
    themselves or as any JSON escape (`ir.Text` with `json`). A JSON value inside the grammar
    (Lark's `%json`) or a special token has no spelling inside a string: a GrammarError naming
    `where`."""

    def walk(n):
        t = type(n)
        if t is ir.Lit:
            return ir.Lit(json_escaped(n.data))
        if t is ir.Text:
            return ir.Text(n.pattern, n.max_len, json=True)
        if t is ir.Seq:
            return ir.Seq(*[walk(x) for x in n.items])
        if t is ir.Alt:
            return ir.Alt(*[walk(x) for x in n.items])
        if t is ir.Select:
            return ir.Select(tuple((json_escaped(k), walk(v)) for k, v in n.choices))
        if t is ir.Repeat:
            return ir.Repeat(walk(n.item), n.min, n.max)
        if t is ir.Ref:
            return n
        what = "a special token" if t is ir.Special else "an embedded JSON value (%json)"
        raise GrammarError(f"{where} holds {what}, which cannot be written inside the call's JSON string; "
                           "write that part as rules and terminals")

    return ir.Grammar(walk(grammar.start), tuple((name, walk(r)) for name, r in grammar.rules),
                      name=f"json-string:{grammar.name}", tail_calls=grammar.tail_calls)
