"""The grammar IR: a small tree that tool tables and JSON Schema both compile to.

The IR is JSON-aware on purpose. A generic regular/context-free IR would force every JSON string
through a character-class regex and every object through nested alternations; keeping
`JsonString`, `JsonInteger`, `JsonObject` and friends as nodes lets the compiler emit one
specialised instruction for each (a string body is one instruction with a length counter, not
256 copies of a character class), and lets the matcher precompute their masks per vocabulary.

Nodes (all immutable):

    Lit(data)                      exactly these bytes (keys, punctuation: the machine's part)
    Seq(items)                     one after another
    Alt(items)                     any one of them (anyOf, optional pieces)
    Select(choices)                one of many literal keys, each with its own continuation;
                                   tool names and enumerated values (thousands stay fast: the
                                   keys form a trie, one thread follows all of them at once)
    Special(name)                  one special token, matched by id (e.g. <tool_call>)
    Ref(name)                      the rule `name` of the enclosing Grammar (recursion: $ref)
    JsonString(min_len, max_len)   a JSON string with its quotes: full escapes, any valid
                                   UTF-8, no raw control characters; lengths in characters
    JsonInteger(minimum, maximum, multiple_of)
                                   a JSON integer, bounds enforced exactly (None = unbounded),
                                   a multiple of `multiple_of` (a decimal string) where given
    JsonNumber()                   any JSON number
    JsonNumber(minimum, maximum, exclusive_min, exclusive_max)
                                   a JSON number; bounds (decimal strings) enforced exactly;
    JsonNumber(..., multiple_of)   and a multiple of `multiple_of` (0.01: no nonzero digit past
                                   the second decimal)
    JsonPattern(kind, arg, min_len, max_len)
                                   a JSON string whose *value* matches a character automaton:
                                   kind "regex" (arg: an ECMA pattern, search semantics),
                                   "except" (arg: a tuple of strings the value may not be), or
                                   "product" (arg: (excluded strings, ((pattern, must match),
                                   ...))): a string that is none of the excluded ones and
                                   matches some patterns and not others (an object key of a
                                   patternProperties class; a value under allOf's patterns, a
                                   pattern with a format, or `not: {"enum": [...]}`);
                                   dialect "python": the same value set spelled as a Python
                                   string literal in double quotes (the escapes JSON and Python
                                   read alike: no `\\/`; see railcall.grammar.pythonic)
    JsonArray(item, min_items, max_items, prefix)
                                   `prefix` items first (prefixItems), then `item` (None: none)
    JsonObject(properties, extras, max_extra, ws, min_props, max_props)
                                   properties in declared order, each (key, node, required);
                                   optional ones may be skipped; then up to `max_extra` further
                                   members, each from one of the `extras` classes (key node,
                                   value node): additionalProperties, patternProperties; between
                                   min_props and max_props members in all
    Ws(max)                        up to `max` JSON whitespace bytes (the flexible-whitespace
                                   option; never unbounded)
    Text(pattern, max_len)         raw text (UTF-8, no quotes, no escapes) whose characters match
                                   `pattern` as a whole (the regex dialect of JsonPattern, anchored
                                   at both ends); at most `max_len` characters (None: any length,
                                   not counted). The terminals of general grammars (grammar.cfg).
                                   With `json`: the same text written as the inside of a JSON
                                   string (each character as itself or a JSON escape; a quote,
                                   a backslash and control characters escaped): a grammar inside
                                   a custom tool's call (grammar.cfg.inside_json_string)
    Repeat(item, min, max)         `item` from `min` to `max` times (None: no upper bound), nothing
                                   between; `item` must not match the empty text where `max` is None

A `Grammar` is a start node plus named rules (for `Ref`), and its `key` is a stable content hash
used to cache compiled forms.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Union

from railcall.errors import GrammarError


@dataclass(frozen=True)
class Lit:
    data: bytes

    def __post_init__(self):
        if isinstance(self.data, str):
            object.__setattr__(self, "data", self.data.encode("utf-8"))


@dataclass(frozen=True)
class Seq:
    items: tuple

    def __init__(self, *items):
        object.__setattr__(self, "items", tuple(items))


@dataclass(frozen=True)
class Alt:
    items: tuple

    def __init__(self, *items):
        object.__setattr__(self, "items", tuple(items))


@dataclass(frozen=True)
class Select:
    """Choose one literal key, then continue with that key's node.

    `choices` is a tuple of (key bytes, node) pairs; keys must be distinct.
    """

    choices: tuple


@dataclass(frozen=True)
class Special:
    name: str  # the special token's text, resolved to an id against the vocabulary


@dataclass(frozen=True)
class Ref:
    name: str


@dataclass(frozen=True)
class JsonString:
    min_len: int = 0
    max_len: int | None = None


@dataclass(frozen=True)
class JsonInteger:
    minimum: int | None = None
    maximum: int | None = None
    multiple_of: str | None = None  # a positive decimal string (multipleOf)


@dataclass(frozen=True)
class JsonNumber:
    minimum: str | None = None  # decimal strings, so that bounds compare exactly
    maximum: str | None = None
    exclusive_min: bool = False
    exclusive_max: bool = False
    multiple_of: str | None = None  # a positive decimal string (multipleOf): the value is k times it


@dataclass(frozen=True)
class JsonPattern:
    kind: str  # "regex" | "except" | "product"
    arg: object  # the pattern (str), the excluded values (tuple of str), or both (see the docstring)
    min_len: int = 0
    max_len: int | None = None
    dialect: str = "json"  # "json" | "python": which escapes spell the value (see the docstring)


@dataclass(frozen=True)
class JsonArray:
    item: "Node | None"
    min_items: int = 0
    max_items: int | None = None
    prefix: tuple = ()
    ws: int = 0  # flexible whitespace: up to this many bytes around each `[`, `,`, `]`


@dataclass(frozen=True)
class JsonObject:
    properties: tuple  # ((key: str, node, required: bool), ...)
    extras: tuple = ()  # ((key node: JsonString/JsonPattern, value node), ...) for undeclared members
    max_extra: int | None = None
    ws: int = 0  # flexible whitespace: up to this many bytes around each `{`, `:`, `,`, `}`
    min_props: int = 0  # members in all, declared and undeclared (minProperties; with extras, met
    max_props: int | None = None  # by the required members alone), and maxProperties


@dataclass(frozen=True)
class Ws:
    max: int


@dataclass(frozen=True)
class Text:
    pattern: str  # anchored at both ends: the whole text matches
    max_len: int | None = None
    json: bool = False  # written as the inside of a JSON string (escapes decoded before matching)


@dataclass(frozen=True)
class Repeat:
    item: "Node"
    min: int = 0
    max: int | None = None


Node = Union[Lit, Seq, Alt, Select, Special, Ref, JsonString, JsonInteger, JsonNumber, JsonPattern, JsonArray,
             JsonObject, Ws, Text, Repeat]


def json_literal(value) -> bytes:
    """A JSON value written the way railcall's wire format writes it: compact, UTF-8 as is.
    GrammarError for a value JSON cannot spell (NaN, an infinity, a lone surrogate)."""
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")
    except ValueError as e:  # UnicodeEncodeError is one too
        why = "a lone surrogate, which UTF-8 cannot encode" if isinstance(e, UnicodeEncodeError) else \
            "NaN or an infinity, which JSON has no spelling for"
        raise GrammarError(f"{value!r} is not a JSON value: it holds {why}") from None


def const(value) -> Lit:
    return Lit(json_literal(value))


def enum(values) -> Node:
    keys = []
    seen = set()
    for v in values:
        k = json_literal(v)
        if k not in seen:
            seen.add(k)
            keys.append((k, Seq()))
    if len(keys) == 1:
        return Lit(keys[0][0])
    return Select(tuple(keys))


# The names of grammars over free text (railcall.grammar.cfg: Lark, GBNF, a regex), as against
# the JSON grammars of tool tables and schemas. Their matchers are not prewarmed by default
# (matcher.compiled_grammar): a rule's first mask seldom serves the states a walk meets, which hold
# several rules' threads at once.
TEXT_GRAMMARS = frozenset({"lark", "gbnf", "regex"})


@dataclass(frozen=True)
class Grammar:
    """A start node and the rules its `Ref`s name. Built per tool table version or schema."""

    start: Node
    rules: tuple = ()  # ((name, node), ...)
    name: str = "grammar"
    key: str = field(default="", compare=False)
    # A rule that ends in a reference continues into it without nesting (general grammars,
    # railcall.grammar.cfg); JSON Schema grammars count every reference as a level.
    tail_calls: bool = False

    def __post_init__(self):
        if not self.key:
            try:
                object.__setattr__(self, "key", _digest((self.start, self.rules, "tail") if self.tail_calls else
                                                        (self.start, self.rules)))
            except RecursionError:  # the repr recurses (a Python frame per level), so this bounds the nesting
                raise GrammarError("the grammar nests too deeply (about a thousand levels); "
                                   "flatten it, or use Ref rules for recursion") from None

    def rule(self, name: str) -> Node:
        # by name, the first of that name as before: a scan per reference was quadratic in the
        # rules (cfn-lint's QuickSight schemas have 700-odd definitions: ~36 ms of a compile)
        index = self.__dict__.get("_rule_index")
        if index is None:
            index = {}
            for n, node in self.rules:
                index.setdefault(n, node)
            object.__setattr__(self, "_rule_index", index)
        return index[name]


def _digest(obj) -> str:
    return hashlib.sha256(repr(obj).encode()).hexdigest()[:24]


def prefix_rules(node, rules, prefix: str):
    """Rename a schema's rules to `<prefix>:<rule>` (a tool's name; a grammar's place for the
    schema) so that two schemas' $defs never collide."""
    if not rules:
        return node, ()
    mapping = {name: f"{prefix}:{name}" for name, _ in rules}

    def walk(n):
        if isinstance(n, Ref):
            return Ref(mapping.get(n.name, n.name))
        if isinstance(n, Seq):
            return Seq(*[walk(x) for x in n.items])
        if isinstance(n, Alt):
            return Alt(*[walk(x) for x in n.items])
        if isinstance(n, Select):
            return Select(tuple((k, walk(v)) for k, v in n.choices))
        if isinstance(n, JsonArray):
            return JsonArray(None if n.item is None else walk(n.item), n.min_items, n.max_items,
                             tuple(walk(x) for x in n.prefix), n.ws)
        if isinstance(n, JsonObject):
            return JsonObject(tuple((k, walk(v), r) for k, v, r in n.properties),
                              tuple((key, walk(v)) for key, v in n.extras), n.max_extra, n.ws, n.min_props,
                              n.max_props)
        if isinstance(n, Repeat):
            return Repeat(walk(n.item), n.min, n.max)
        return n

    return walk(node), tuple((mapping[name], walk(r)) for name, r in rules)
