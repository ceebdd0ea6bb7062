"""GBNF (llama.cpp's grammar format) into the IR, through grammar.cfg.

    root   ::= item+                 # rules; `root` is where the text starts
    item   ::= "- " [^\\r\\n]+ "\\n"    # literals, character classes ([^...] negated, . any)
    number ::= [0-9]{1,3} ("." [0-9]+)?   # groups, | ? * + {m} {m,} {m,n}

Escapes in literals and classes: \\n \\r \\t \\\\ \\" \\[ \\] \\- \\xHH \\uHHHH \\UHHHHHHHH. A rule runs
until the next `name ::=`; comments start with `#`. Token references (`<[1234]>`, `!<...>`)
are refused: they name token ids of one model, and railcall's grammars are text. Errors name
the line and column.
"""

from __future__ import annotations

from railcall.errors import GrammarError
from railcall.grammar import cfg, ir
from railcall.grammar.regex import MAX_UNICODE, negate_ranges, norm_ranges

_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")
_ESCAPES = {"n": 0x0A, "r": 0x0D, "t": 0x09, "\\": 0x5C, '"': 0x22, "[": 0x5B, "]": 0x5D, "-": 0x2D,
            "'": 0x27, "/": 0x2F, "0": 0x00, "f": 0x0C, "v": 0x0B, "a": 0x07, "b": 0x08, "e": 0x1B}


class _Parser(cfg.Reader):
    kind = "GBNF"

    def __init__(self, text: str):
        super().__init__(text)
        self.rules = cfg.Rules("GBNF")

    def skip(self) -> None:
        t = self.t
        while self.i < len(t):
            c = t[self.i]
            if c in " \t\r\n":
                self.i += 1
            elif c == "#":
                j = t.find("\n", self.i)
                self.i = len(t) if j < 0 else j + 1
            else:
                break

    def name(self) -> str:
        j = self.i
        while j < len(self.t) and self.t[j] in _NAME_CHARS:
            j += 1
        return self.t[self.i : j]

    def at_rule_start(self) -> bool:
        """Is the next thing `name ::=` (a new rule)?"""
        n = self.name()
        if not n:
            return False
        j = self.i + len(n)
        while j < len(self.t) and self.t[j] in " \t":
            j += 1
        return self.t.startswith("::=", j)

    def parse(self) -> cfg.Rules:
        self.skip()
        while self.i < len(self.t):
            start = self.i
            n = self.name()
            if not n or not self.at_rule_start():
                raise self.error("expected a rule, `name ::= ...`")
            self.i += len(n)
            self.skip()
            self.i += 3
            body = self.alternatives(top=True)
            self.rules.add(n, body, self.pos(start))
            self.skip()
        return self.rules

    def at_bar(self, top: bool) -> bool:
        self.skip()
        return self.t.startswith("|", self.i)

    def sequence(self, top: bool):
        items = []
        while True:
            self.skip()
            if self.i >= len(self.t) or self.t[self.i] in "|)" or (top and self.at_rule_start()):
                break
            items.append(self.quantified())
        return items[0] if len(items) == 1 else ("seq", items)

    def quantified(self):
        item = self.atom()
        while self.i < len(self.t):
            if self.t[self.i] == "{":
                item = ("rep", item, *self.braces())
                continue
            rep = self.quantifier(item)
            if rep is None:
                break
            item = rep
        return item

    def braces(self) -> tuple[int, int | None]:
        start = self.i
        j = self.t.find("}", self.i)
        if j < 0:
            raise self.error("an unclosed `{`", start)
        body = self.t[self.i + 1 : j].replace(" ", "")
        self.i = j + 1
        try:
            if "," not in body:
                lo = hi = int(body)
            else:
                a, b = body.split(",", 1)
                lo = int(a) if a else 0
                hi = int(b) if b else None
        except ValueError:
            raise self.error(f"a repetition count `{{{body}}}` is not `{{m}}`, `{{m,}}` or `{{m,n}}`", start) from None
        if hi is not None and lo > hi:
            raise self.error(f"a repetition `{{{body}}}` asks for at least {lo} and at most {hi}", start)
        return lo, hi

    def atom(self):
        t, i = self.t, self.i
        c = t[i]
        if c == '"':
            return ("lit", self.literal())
        if c == "[":
            return ("set", self.char_class())
        if c == ".":
            self.i += 1
            return ("set", ((0, MAX_UNICODE),))
        if c == "(":
            return self.group(")")
        if c in "<!":
            raise self.error("token references (`<[id]>`, `!<...>`) name one model's token ids; railcall's "
                             "grammars constrain text: write the token's text as a literal")
        n = self.name()
        if n:
            self.i += len(n)
            return ("ref", n, self.pos(i))
        raise self.error(f"unexpected {c!r}")

    def char(self, closing: str) -> int:
        """One character of a literal or class (escapes decoded)."""
        t = self.t
        if self.i >= len(t):
            raise self.error(f"missing the closing {closing!r}")
        c = t[self.i]
        if c != "\\":
            self.i += 1
            return ord(c)
        start = self.i
        if self.i + 1 >= len(t):
            raise self.error("an escape at the end of the text")
        e = t[self.i + 1]
        if e in "xuU":
            return self.hex_escape(start)
        if e in _ESCAPES:
            self.i += 2
            return _ESCAPES[e]
        raise self.error(f"unknown escape `\\{e}`", start)

    def literal(self) -> str:
        start = self.i
        self.i += 1
        out = []
        while True:
            if self.i >= len(self.t) or self.t[self.i] == "\n":
                raise self.error("a literal without its closing `\"`", start)
            if self.t[self.i] == '"':
                self.i += 1
                return "".join(out)
            out.append(chr(self.char('"')))

    def char_class(self) -> tuple:
        start = self.i
        self.i += 1
        neg = self.t.startswith("^", self.i)
        if neg:
            self.i += 1
        ranges = []
        while True:
            if self.i >= len(self.t):
                raise self.error("a `[` without its `]`", start)
            if self.t[self.i] == "]":
                self.i += 1
                break
            lo = self.char("]")
            hi = lo
            if self.t.startswith("-", self.i) and not self.t.startswith("-]", self.i):
                self.i += 1
                hi = self.char("]")
                if hi < lo:
                    raise self.error(f"a range from {chr(lo)!r} down to {chr(hi)!r}", start)
            ranges.append((lo, hi))
        ranges = negate_ranges(ranges) if neg else norm_ranges(ranges)
        if not ranges:
            raise self.error("this character class matches no character", start)
        return ranges


def gbnf_grammar(text: str, start: str = "root") -> ir.Grammar:
    """The IR grammar of a GBNF text, starting at rule `start` (`root`). GrammarError, naming
    the line and column, for text outside GBNF or a grammar railcall cannot run (left
    recursion, see grammar.cfg)."""
    if not isinstance(text, str):
        raise GrammarError(f"a GBNF grammar is text, not {type(text).__name__}")
    rules = _Parser(text).parse()
    return cfg.build(rules, start, "gbnf")
