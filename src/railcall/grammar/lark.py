"""Lark grammars into the IR, through grammar.cfg: the subset of Lark that describes a language.

    start: expr
    expr: term (("+" | "-") term)*
    term: NUMBER | "(" expr ")"
    %import common.NUMBER
    %import common.WS
    %ignore WS

Read: rules (lowercase, `?`/`!` modifiers and `.N` priorities accepted and ignored: they shape
Lark's tree, not the language), terminals (uppercase, regular: inlined as automata), literals
`"..."` (with `i`: any case), ranges `"a".."z"`, regexes `/.../` (railcall's regex dialect, see
grammar.regex; no flags), `|`, groups, `[...]` and `?` (optional), `*`, `+`, `~ n`, `~ n..m`,
aliases `-> name` (ignored), `%import common.NAME` / `%import common (A, B)` for Lark's common
terminals, `%ignore` (what it names may appear between any two items of a rule, and around the
whole text), and `%json {schema}` (a JSON value of that schema, compact, as railcall writes
JSON). Refused, with the line and column: templates, `%declare`, `%override`, `%extend`,
imports from other files, regex flags. There is no lexer: the grammar's language is what its
rules derive (see grammar.cfg), which includes every text Lark's own parsers accept.
"""

from __future__ import annotations

import functools
import json
import re

from railcall.errors import GrammarError
from railcall.grammar import cfg, ir

# Lark's common terminals (common.lark), spelled in the subset read here. Lark writes
# ESCAPED_STRING with a lookbehind, which a character automaton has no use for: the same strings
# are "a quote, then characters other than a quote, a backslash or a newline, or a backslash and
# any character but a newline, then a quote".
COMMON = r'''
DIGIT: "0".."9"
HEXDIGIT: "a".."f" | "A".."F" | DIGIT
INT: DIGIT+
SIGNED_INT: ["+" | "-"] INT
DECIMAL: INT "." INT? | "." INT
_EXP: ("e" | "E") SIGNED_INT
FLOAT: INT _EXP | DECIMAL _EXP?
SIGNED_FLOAT: ["+" | "-"] FLOAT
NUMBER: FLOAT | INT
SIGNED_NUMBER: ["+" | "-"] NUMBER
ESCAPED_STRING: "\"" /(?:[^"\\\n]|\\[^\n])*/ "\""
LCASE_LETTER: "a".."z"
UCASE_LETTER: "A".."Z"
LETTER: UCASE_LETTER | LCASE_LETTER
WORD: LETTER+
CNAME: ("_" | LETTER) ("_" | LETTER | DIGIT)*
WS_INLINE: (" " | /\t/)+
WS: /[ \t\f\r\n]/+
CR: /\r/
LF: /\n/
NEWLINE: (CR? LF)+
SH_COMMENT: /#[^\n]*/
CPP_COMMENT: /\/\/[^\n]*/
C_COMMENT: "/*" /(?:[^*]|\*+[^*\/])*\*+/ "/"
SQL_COMMENT: /--[^\n]*/
'''

_DEF = re.compile(r"[?!]?([A-Za-z_][A-Za-z_0-9]*)(\.-?\d+)?[ \t]*:(?!:)")
_NAME = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")
_REPEAT = re.compile(r"~\s*(\d+)(?:\s*\.\.\s*(\d+))?")
_STR_ESC = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "'": "'", "f": "\f", "v": "\v", "0": "\0",
            "a": "\a", "b": "\b"}


class _Parser(cfg.Reader):
    kind = "Lark"

    def __init__(self, text: str, rules: cfg.Rules):
        super().__init__(text)
        self.rules = rules
        self.ignore: list = []
        self.imports: list[tuple[str, str, tuple]] = []  # (name, alias, pos)
        self.json_count = 0

    def skip(self, newlines: bool = True) -> None:
        t = self.t
        while self.i < len(t):
            c = t[self.i]
            if c in " \t\r" or (newlines and c == "\n"):
                self.i += 1
            elif t.startswith("//", self.i):
                j = t.find("\n", self.i)
                self.i = len(t) if j < 0 else j
            else:
                break

    def parse(self) -> None:
        self.skip()
        while self.i < len(self.t):
            start = self.i
            if self.t.startswith("%", self.i):
                self.directive()
            else:
                m = _DEF.match(self.t, self.i)
                if not m:
                    raise self.error("expected a rule (`name: ...`), a terminal (`NAME: ...`) or a directive (`%...`)")
                name = m.group(1)
                self.i = m.end()
                if self.t.startswith("{", m.start(1) + len(name)):
                    raise self.error("templates (`name{...}`) are not supported", start)
                body = self.alternatives(top=True)
                self.rules.add(name, body, self.pos(start))
            self.skip()

    def directive(self) -> None:
        start = self.i
        m = _NAME.match(self.t, self.i + 1)
        word = m.group(0) if m else ""
        self.i = m.end() if m else self.i + 1
        self.skip(newlines=False)
        if word == "import":
            self.import_()
        elif word == "ignore":
            self.ignore.append(self.alternatives(top=True))
        elif word in ("declare", "override", "extend"):
            raise self.error(f"%{word} is not supported: write the rules out", start)
        else:
            raise self.error(f"unknown directive %{word}", start)

    def import_(self) -> None:
        start = self.i
        end = self.t.find("\n", self.i)
        line = self.t[self.i : len(self.t) if end < 0 else end]
        line = line.split("//")[0].strip()
        self.i = len(self.t) if end < 0 else end
        m = re.fullmatch(r"common\s*\.\s*([A-Za-z_][A-Za-z_0-9]*)(?:\s*->\s*([A-Za-z_][A-Za-z_0-9]*))?", line)
        if m:
            self.imports.append((m.group(1), m.group(2) or m.group(1), self.pos(start)))
            return
        m = re.fullmatch(r"common\s*\(([^)]*)\)", line)
        if m:
            for n in m.group(1).split(","):
                n = n.strip()
                if n:
                    self.imports.append((n, n, self.pos(start)))
            return
        raise self.error(f"`%import {line}`: only Lark's common terminals can be imported (`%import common.WS`)", start)

    def at_bar(self, top: bool) -> bool:
        self.skip(newlines=not top)
        if top and self.t.startswith("\n", self.i):
            # a definition goes on where the next line starts with `|`
            j = self.i
            while j < len(self.t) and self.t[j] in " \t\r\n":
                j += 1
            if self.t.startswith("|", j):
                self.i = j
        return self.t.startswith("|", self.i)

    def sequence(self, top: bool):
        items = []
        while True:
            self.skip(newlines=not top)
            if self.i >= len(self.t):
                break
            c = self.t[self.i]
            if c in "|)]\n":
                break
            if self.t.startswith("->", self.i):  # an alias names the tree node: no text
                self.i += 2
                self.skip(newlines=False)
                m = _NAME.match(self.t, self.i)
                if not m:
                    raise self.error("`->` without a name")
                self.i = m.end()
                continue
            items.append(self.quantified())
        return items[0] if len(items) == 1 else ("seq", items)

    def quantified(self):
        item = self.atom()
        while True:
            self.skip(newlines=False)
            if self.t.startswith("~", self.i):
                start = self.i
                m = _REPEAT.match(self.t, self.i)
                if not m:
                    raise self.error("`~` needs a count: `~ 3` or `~ 2..5`")
                lo = int(m.group(1))
                hi = int(m.group(2)) if m.group(2) else lo
                if hi < lo:
                    raise self.error(f"`~ {lo}..{hi}` asks for at least {lo} and at most {hi}", start)
                item = ("rep", item, lo, hi)
                self.i = m.end()
                continue
            rep = self.quantifier(item)
            if rep is None:
                return item
            item = rep

    def atom(self):
        t, i = self.t, self.i
        c = t[i]
        if c == "(":
            return self.group(")")
        if c == "[":
            return ("rep", self.group("]"), 0, 1)
        if c == '"':
            text, fold = self.string()
            self.skip(newlines=False)
            if t.startswith("..", self.i):
                self.i += 2
                self.skip(newlines=False)
                if not t.startswith('"', self.i):
                    raise self.error('a range needs a literal after `..`: "a".."z"')
                hi_text, _ = self.string()
                if len(text) != 1 or len(hi_text) != 1 or ord(hi_text) < ord(text):
                    raise self.error(f"a range runs from one character to a later one, not {text!r}..{hi_text!r}", i)
                return ("set", ((ord(text), ord(hi_text)),))
            if fold:  # one item (no ignored text between its characters)
                return ("regex", "".join(cfg.class_regex(_fold(ch)) for ch in text))
            return ("lit", text)
        if c == "/":
            return ("regex", self.regex())
        if t.startswith("%json", i):
            return self.json_schema()
        m = _NAME.match(t, i)
        if m:
            self.i = m.end()
            if t.startswith("{", self.i):
                raise self.error("templates (`name{...}`) are not supported", i)
            return ("ref", m.group(0), self.pos(i))
        raise self.error(f"unexpected {c!r}")

    def string(self) -> tuple[str, bool]:
        start = self.i
        self.i += 1
        out = []
        t = self.t
        while True:
            if self.i >= len(t) or t[self.i] == "\n":
                raise self.error('a literal without its closing `"`', start)
            c = t[self.i]
            if c == '"':
                self.i += 1
                break
            if c == "\\":
                e = t[self.i + 1 : self.i + 2]
                if e in ("x", "u", "U"):
                    out.append(chr(self.hex_escape(self.i)))
                    continue
                if e in _STR_ESC:
                    out.append(_STR_ESC[e])
                    self.i += 2
                    continue
                out.append("\\" + e)  # as Python does with an unknown escape: both characters
                self.i += 2
                continue
            out.append(c)
            self.i += 1
        fold = t.startswith("i", self.i) and not _NAME.match(t, self.i + 1)
        if fold:
            self.i += 1
        return "".join(out), fold

    def regex(self) -> str:
        start = self.i
        self.i += 1
        t = self.t
        out = []
        while True:
            if self.i >= len(t) or t[self.i] == "\n":
                raise self.error("a regex without its closing `/`", start)
            c = t[self.i]
            if c == "\\" and self.i + 1 < len(t):
                out.append(t[self.i : self.i + 2])
                self.i += 2
                continue
            if c == "/":
                self.i += 1
                break
            out.append(c)
            self.i += 1
        m = re.compile(r"[imslux]+").match(t, self.i)
        if m:
            raise self.error(f"regex flags ({m.group(0)}) are not supported: spell the pattern without them "
                             "(for `i`, classes such as [aA])", self.i)
        return "".join(out)

    def json_schema(self):
        start = self.i
        self.i += len("%json")
        self.skip()
        try:
            schema, end = json.JSONDecoder().raw_decode(self.t, self.i)
        except json.JSONDecodeError as e:
            raise self.error(f"%json needs a JSON Schema object after it: {e.msg}", self.i) from None
        self.i = end
        from railcall.grammar.schema import schema_to_ir
        from railcall.grammar.ir import prefix_rules

        try:
            node, rules = schema_to_ir(schema)
        except GrammarError as e:
            raise self.error(f"%json: {e}", start) from None
        self.json_count += 1
        node, rules = prefix_rules(node, rules, f"%json{self.json_count}@{self.pos(start)[0]}")
        return ("node", node, tuple(rules))


# Characters that Python's `re` (Lark's parsers) and Rust's regex match case-insensitively with
# an ASCII letter beyond its other case: the dotted and dotless i, the long s, the Kelvin sign.
_FOLD_EXTRA = (0x130, 0x131, 0x17F, 0x212A)


def _fold(ch: str) -> tuple:
    """The ranges of one character of a case-insensitive literal: every character Python's `re`
    matches it with under IGNORECASE (`"s"i` takes s, S and U+017F, as Lark does)."""
    candidates = {ord(ch)} | {ord(c) for form in (ch.lower(), ch.upper(), ch.casefold()) if len(form) == 1
                              for c in form} | set(_FOLD_EXTRA)
    forms = {c for c in candidates if re.fullmatch(re.escape(ch), chr(c), re.IGNORECASE)}
    return tuple((c, c) for c in sorted(forms))


def _with_ignore(tree, ign):
    """A rule's tree with the ignored terminals allowed before each of its items."""
    k = tree[0]
    if k == "seq":
        return ("seq", [_with_ignore(x, ign) for x in tree[1]])
    if k == "alt":
        return ("alt", [_with_ignore(x, ign) for x in tree[1]])
    if k == "rep":
        return ("rep", _with_ignore(tree[1], ign), tree[2], tree[3])
    return ("seq", [ign, tree])


@functools.lru_cache(maxsize=1)
def _common() -> cfg.Rules:
    """Lark's common terminals, parsed once per process (~0.4 ms, half of a small grammar's
    front end). Their trees are shared, read and never changed, by every grammar that imports
    them."""
    common = cfg.Rules("Lark")
    _Parser(COMMON, common).parse()
    return common


def lark_grammar(text: str, start: str = "start") -> ir.Grammar:
    """The IR grammar of a Lark text, starting at rule `start`. GrammarError, naming the line
    and column, for what is outside the subset (see the module docstring)."""
    if not isinstance(text, str):
        raise GrammarError(f"a Lark grammar is text, not {type(text).__name__}")
    rules = cfg.Rules("Lark")
    p = _Parser(text, rules)
    p.parse()
    if p.imports:
        common = _common()
        needed = []
        for name, alias, pos in p.imports:
            if name not in common.defs:
                raise GrammarError(f"Lark grammar, line {pos[0]}, column {pos[1]}: common.{name} is not one of "
                                   f"Lark's common terminals railcall knows ({', '.join(sorted(common.defs))})")
            needed.append((name, alias, pos))
        todo = [n for n, _, _ in needed]
        seen: set[str] = set()
        while todo:  # the common terminals they use, under their own names
            n = todo.pop()
            if n in seen:
                continue
            seen.add(n)
            todo.extend(ref[1] for ref in cfg._refs(common.defs[n], []))
        for name, alias, pos in needed:
            if alias not in rules.defs:
                rules.add(alias, common.defs[name], pos)
        for n in seen:
            if n not in rules.defs:
                rules.add(n, common.defs[n], (0, 0))
    if p.ignore:
        ign = ("rep", p.ignore[0] if len(p.ignore) == 1 else ("alt", p.ignore), 0, None)
        for name in list(rules.defs):
            if name[:1].islower() or (name[:1] == "_" and name[1:2].islower()):
                rules.defs[name] = _with_ignore(rules.defs[name], ign)
        if start in rules.defs:
            rules.defs[start] = ("seq", [rules.defs[start], ign])
    return cfg.build(rules, start, "lark")
