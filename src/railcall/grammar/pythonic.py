"""A tool's argument IR (JSON) -> the same values spelled as Python literals, for the pythonic
call format `[get_weather(city="Paris", days=3)]` (Llama 3.2/4's tool calls, BFCL's prompt
models, vLLM's `pythonic` tool parser).

The JSON grammar pieces are reused wherever JSON and Python spell a value alike, so a pythonic
argument is held to exactly the values its JSON Schema allows:

    JSON                          Python, as this grammar writes it
    "text" (JSON escapes)         "text": double quotes; the escapes both read alike (\\" \\\\ \\b
                                  \\f \\n \\r \\t \\uXXXX), never `\\/` (Python keeps the backslash)
                                  and never an escaped surrogate pair (refused in both)
    -12, 3.5, 1e-3                the same text (both forbid leading zeros); bounds as in JSON
    true, false, null             True, False, None
    [1,2]                         [1,2]  (a list; compact, as the JSON pieces write it)
    {"a":1}                       {"a":1}  (a dict with string keys, declared order)
    enum / const values           their JSON text with the three words above respelled

Strings are JSON string grammars with the Python dialect (`ir.JsonPattern(dialect="python")`:
a pattern over the decoded value, the same automaton JSON uses, minus the `\\/` escape), so
`pattern`, `format`, `minLength` and `maxLength` hold as in JSON. A plain string without a
pattern costs a little more per token than a JSON one (the generic pattern automaton instead of
the specialised string body; its masks are cached per state like any other) and is capped at
strings.PATTERN_MAX_LEN characters.

The arguments object itself becomes keyword arguments: `name=value` in declared order,
separated by ", ". An optional argument may be skipped (the model decides); a required one may
not. Keyword order is declared, not free: a free order would multiply the grammar by the
permutations, and the declared order is the one the prompt shows. Refused, with a GrammarError
naming the keyword: parameters that allow undeclared properties (`additionalProperties`,
`patternProperties`, a free-form object), property names that are not Python identifiers (or
are keywords), tool names that are not (dotted) identifiers. Nested objects have no such limits:
they are dicts.
"""

from __future__ import annotations

import keyword

from railcall.errors import GrammarError
from railcall.grammar import ir

_WORDS = {b"true": b"True", b"false": b"False", b"null": b"None"}


def py_spell(data: bytes) -> bytes:
    """JSON text (a value or a piece of one) with true/false/null outside strings respelled as
    Python's True/False/None; everything else (strings, numbers, punctuation) is spelled alike."""
    if b"true" not in data and b"false" not in data and b"null" not in data:
        return data
    out, i, n = bytearray(), 0, len(data)
    in_str = esc = False
    while i < n:
        c = data[i]
        if in_str:
            out.append(c)
            if esc:
                esc = False
            elif c == 0x5C:
                esc = True
            elif c == 0x22:
                in_str = False
            i += 1
            continue
        if c == 0x22:
            in_str = True
        for word, py in _WORDS.items():
            if data.startswith(word, i):
                out += py
                i += len(word)
                break
        else:
            out.append(c)
            i += 1
    return bytes(out)


def value_node(node: ir.Node) -> ir.Node:
    """The IR of the same values as `node`, spelled as Python literals (see the module doc)."""
    if isinstance(node, ir.Lit):
        return ir.Lit(py_spell(node.data))
    if isinstance(node, ir.Seq):
        return ir.Seq(*[value_node(x) for x in node.items])
    if isinstance(node, ir.Alt):
        return ir.Alt(*[value_node(x) for x in node.items])
    if isinstance(node, ir.Select):
        return ir.Select(tuple((py_spell(k), value_node(v)) for k, v in node.choices))
    if isinstance(node, ir.JsonString):
        # any string: a pattern that matches everything, in the Python dialect
        return ir.JsonPattern("except", (), node.min_len, node.max_len, "python")
    if isinstance(node, ir.JsonPattern):
        return ir.JsonPattern(node.kind, node.arg, node.min_len, node.max_len, "python")
    if isinstance(node, ir.JsonArray):
        return ir.JsonArray(None if node.item is None else value_node(node.item), node.min_items, node.max_items,
                            tuple(value_node(x) for x in node.prefix), node.ws)
    if isinstance(node, ir.JsonObject):
        # a dict: declared keys are JSON strings written by json_literal, which never uses `\/`
        return ir.JsonObject(tuple((k, value_node(v), r) for k, v, r in node.properties),
                             tuple((value_node(k), value_node(v)) for k, v in node.extras), node.max_extra, node.ws,
                             node.min_props, node.max_props)
    # Ref (names are kept; the rule bodies are converted too), JsonInteger, JsonNumber, Ws,
    # Special: spelled alike
    return node


def check_name(tool_name: str) -> None:
    """A tool name the pythonic format can write: an identifier, or dotted identifiers
    (BFCL's `math.factorial`), none of them a Python keyword."""
    parts = tool_name.split(".")
    if not all(p.isidentifier() and not keyword.iskeyword(p) for p in parts):
        raise GrammarError(f"tool {tool_name!r}: the pythonic call format needs a name that is a Python identifier "
                           "(or dotted identifiers, `module.func`); rename the tool or use the json format")


def kwargs_node(node: ir.Node, rules: tuple, tool_name: str, _seen: frozenset = frozenset()) -> ir.Node:
    """The keyword arguments of a call, from the tool's arguments node (a JSON object grammar):
    `a=1, b="x"` in declared order, optional ones skippable. Values go through `value_node`."""
    if isinstance(node, ir.Alt):  # anyOf at the top: one keyword list per branch
        return ir.Alt(*[kwargs_node(x, rules, tool_name, _seen) for x in node.items])
    if isinstance(node, ir.Ref) and node.name not in _seen:
        return kwargs_node(dict(rules)[node.name], rules, tool_name, _seen | {node.name})
    if not isinstance(node, ir.JsonObject):
        raise GrammarError(f"tool {tool_name!r}: the pythonic call format writes arguments as keywords, and these "
                           "parameters are not a plain object of declared properties (a const/enum object, a "
                           "minProperties over undeclared members, or a recursive $ref at the top); use the json "
                           "format")
    if node.extras and node.max_extra != 0:
        raise GrammarError(f"tool {tool_name!r}: the parameters allow undeclared properties "
                           "(additionalProperties/patternProperties, or an object without properties), which "
                           "keyword arguments cannot spell; declare them under properties with "
                           "additionalProperties: false, or use the json format")
    props = node.properties
    for key, _, _ in props:
        if not key.isidentifier() or keyword.iskeyword(key):
            raise GrammarError(f"tool {tool_name!r}: property {key!r} (properties) is not a Python identifier, so "
                               "it cannot be a keyword argument; rename it or use the json format")
    # The comma goes before every argument but the first one written. tail[j][c]: the arguments
    # from j on, after c were written (c >= 1; each optional one skippable), counts kept up to
    # `top` as the JSON object's are (min/maxProperties; 1 without them). Shared nodes: the
    # compiler memoises by node, so the table stays linear in the number of arguments.
    n, lo, hi = len(props), node.min_props, node.max_props
    if hi is not None and hi >= n:
        hi = None  # a maximum no call can pass binds nothing
    top = hi if hi is not None else max(lo, 1)
    values = [value_node(v) for _, v, _ in props]
    tail: list[dict] = [{} for _ in range(n + 1)]
    tail[n] = {c: ir.Seq() for c in range(max(lo, 1), top + 1)}
    for j in range(n - 1, -1, -1):
        key, _, req = props[j]
        for c in range(1, min(j, top) + 1):
            options = [] if req or c not in tail[j + 1] else [tail[j + 1][c]]
            after = tail[j + 1].get(min(c + 1, top)) if hi is None or c < hi else None
            if after is not None:
                options.append(ir.Seq(ir.Lit(f", {key}=".encode()), values[j], after))
            if options:
                tail[j][c] = ir.Alt(*options) if len(options) > 1 else options[0]
    firsts: list[ir.Node] = []
    for j, (key, _, req) in enumerate(props):
        after = tail[j + 1].get(1) if hi is None or hi >= 1 else None
        if after is not None:
            firsts.append(ir.Seq(ir.Lit(f"{key}=".encode()), values[j], after))
        if req:  # a required argument: nothing after it can be the first one written
            break
    else:
        if lo == 0:
            firsts.append(ir.Seq())  # every argument optional: `name()` too
    if not firsts:
        raise GrammarError(f"tool {tool_name!r}: no call has between {lo} and {hi} of its arguments")
    return ir.Alt(*firsts) if len(firsts) > 1 else firsts[0]


def rules_node(rules: tuple) -> tuple:
    """The tool's schema rules ($ref targets), their values spelled as Python literals."""
    return tuple((name, value_node(body)) for name, body in rules)
