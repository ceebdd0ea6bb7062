"""JSON Schema keywords: a table of (schema, text, accepted), the errors, and the limits.

Texts are fed byte by byte to a matcher over the byte-level test vocabulary; `accepted` means the
matcher consumed all of it and is accepting.
"""

from __future__ import annotations

import time
import warnings

import pytest

from railcall.errors import GrammarError, SchemaError
from railcall.grammar.schema import SchemaOptions, schema_grammar
from railcall.matcher import CompiledGrammar, Matcher

STD = SchemaOptions(standard=True)

_A = {"a": {"properties": {"a": {"type": "string"}}}}
_INT_OR_STRING = {"oneOf": [{"type": ["string", "null"]}, {"type": ["integer", "null"]}]}
_MIN3_X = {"type": "object", "minProperties": 3, "properties": {"x": {}}, "required": ["x"], "additionalProperties": True}

CASES = [
    # pattern: search semantics, anchors, classes, quantifiers, escapes decoded before matching
    ({"type": "string", "pattern": "^[a-z]+-\\d{2,3}$"}, '"ab-12"', True),
    ({"type": "string", "pattern": "^[a-z]+-\\d{2,3}$"}, '"ab-1234"', False),
    ({"type": "string", "pattern": "^[a-z]+-\\d{2,3}$"}, '"AB-12"', False),
    ({"type": "string", "pattern": "b+"}, '"abbbc"', True),
    ({"type": "string", "pattern": "b+"}, '"ac"', False),
    ({"type": "string", "pattern": "^a\\.b$"}, '"a.b"', True),
    ({"type": "string", "pattern": "^a\\.b$"}, '"axb"', False),
    ({"type": "string", "pattern": "^\\w+$"}, '"\\u0061_1"', True),  # \u0061 is "a"
    ({"type": "string", "pattern": "^[^\"]*$"}, '"a\\"b"', False),  # the escaped quote is a quote
    ({"type": "string", "pattern": "^é+$"}, '"éé"', True),
    # \s and \S only where ECMA-262 and Python's re (jsonschema's) agree: U+FEFF is white space
    # to ECMA only, U+0085 to Python only
    ({"type": "string", "pattern": "^\\s$"}, '"\\u3000"', True),
    ({"type": "string", "pattern": "^\\s$"}, '"\\ufeff"', False),
    ({"type": "string", "pattern": "^\\S$"}, '"\\ufeff"', False),
    ({"type": "string", "pattern": "^\\S$"}, '"\\u0085"', False),
    ({"type": "string", "pattern": "^\\S$"}, '"x"', True),
    ({"type": "string", "pattern": "^(cat|dog)s?$", "maxLength": 3}, '"cats"', False),
    ({"type": "string", "pattern": "^(cat|dog)s?$", "maxLength": 3}, '"dog"', True),
    ({"type": "string", "pattern": "^x*$", "minLength": 2}, '"x"', False),
    ({"type": "string", "pattern": "^x*$", "minLength": 2}, '"xx"', True),
    # formats
    ({"type": "string", "format": "date"}, '"2024-02-29"', True),
    ({"type": "string", "format": "date"}, '"2023-02-29"', False),
    ({"type": "string", "format": "date"}, '"2024-04-31"', False),
    ({"type": "string", "format": "date-time"}, '"2024-05-01T12:30:00Z"', True),
    ({"type": "string", "format": "date-time"}, '"2024-05-01 12:30:00"', False),
    ({"type": "string", "format": "time"}, '"23:59:60Z"', True),
    ({"type": "string", "format": "email"}, '"joe.bloggs@example.com"', True),
    ({"type": "string", "format": "email"}, '"joe@@example.com"', False),
    ({"type": "string", "format": "uuid"}, '"123e4567-e89b-12d3-a456-426614174000"', True),
    ({"type": "string", "format": "uuid"}, '"123e4567e89b12d3a456426614174000"', False),
    ({"type": "string", "format": "uri"}, '"https://example.com/a?b=c#d"', True),
    ({"type": "string", "format": "uri"}, '"example.com/a"', False),
    ({"type": "string", "format": "ipv4"}, '"192.168.0.1"', True),
    ({"type": "string", "format": "ipv4"}, '"256.1.1.1"', False),
    ({"type": "string", "format": "ipv6"}, '"::1"', True),
    ({"type": "string", "format": "ipv6"}, '"1:2:3:4:5:6:7:8:9"', False),
    # numbers with bounds, exactly (no exponent for a bounded number)
    ({"type": "number", "minimum": 0.5, "exclusiveMaximum": 10}, "0.5", True),
    ({"type": "number", "minimum": 0.5, "exclusiveMaximum": 10}, "0.49", False),
    ({"type": "number", "minimum": 0.5, "exclusiveMaximum": 10}, "9.999", True),
    ({"type": "number", "minimum": 0.5, "exclusiveMaximum": 10}, "10", False),
    ({"type": "number", "minimum": 0.5, "exclusiveMaximum": 10}, "10.0", False),
    ({"type": "number", "maximum": -2.5}, "-2.5", True),
    ({"type": "number", "maximum": -2.5}, "-2.4", False),
    ({"type": "number", "maximum": -2.5}, "-1e3", False),
    ({"type": "number", "exclusiveMinimum": 0}, "0", False),
    ({"type": "number", "exclusiveMinimum": 0}, "0.001", True),
    ({"type": "number", "minimum": 1, "exclusiveMinimum": True}, "1", False),  # draft-04 form
    # draft-04 boolean exclusives merged through allOf: each belongs to its own branch's bound
    ({"allOf": [{"maximum": 10, "exclusiveMaximum": False}, {"maximum": 5, "exclusiveMaximum": True}]}, "5", False),
    ({"allOf": [{"maximum": 10, "exclusiveMaximum": False}, {"maximum": 5, "exclusiveMaximum": True}]}, "4.5", True),
    ({"allOf": [{"maximum": 5}, {"maximum": 10, "exclusiveMaximum": True}]}, "5", True),
    ({"allOf": [{"minimum": 5}, {"minimum": 1, "exclusiveMinimum": True}]}, "5", True),
    ({"allOf": [{"minimum": 1, "exclusiveMinimum": False}, {"minimum": 5, "exclusiveMinimum": True}]}, "5", False),
    ({"allOf": [{"exclusiveMaximum": 3}, {"maximum": 5, "exclusiveMaximum": False}]}, "3", False),
    # arrays: prefixItems, items after them, draft-07 tuples
    ({"prefixItems": [{"type": "integer"}, {"type": "string"}]}, '[1,"a",null]', True),
    ({"prefixItems": [{"type": "integer"}, {"type": "string"}], "items": False}, '[1,"a",null]', False),
    ({"prefixItems": [{"type": "integer"}, {"type": "string"}], "items": False}, "[1]", True),
    ({"prefixItems": [{"type": "integer"}], "items": {"type": "boolean"}, "minItems": 2}, "[1]", False),
    ({"prefixItems": [{"type": "integer"}], "items": {"type": "boolean"}, "minItems": 2}, "[1,true]", True),
    ({"items": [{"type": "integer"}], "additionalItems": False}, "[1,2]", False),
    # objects: additionalProperties, property counts
    ({"type": "object", "properties": {"a": {"type": "integer"}}}, '{"a":1,"b":2}', False),  # railcall default
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "integer"}},
     '{"a":1,"b":2}', True),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "integer"}},
     '{"a":1,"b":"x"}', False),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": True},
     '{"a":1,"a":2}', False),  # an undeclared key may not repeat a declared one
    ({"type": "object"}, '{"x":[1,{"y":null}]}', True),  # no properties: free-form
    ({"type": "object", "properties": {}}, '{"x":1}', False),  # a tool without parameters takes {}
    ({"type": "object", "maxProperties": 1}, '{"a":1,"b":2}', False),
    ({"type": "object", "minProperties": 2}, '{"a":1}', False),
    ({"type": "object", "minProperties": 2}, '{"a":1,"bb":2}', True),
    # a repeated key leaves one member (json.loads keeps the last), so minProperties' mandatory
    # undeclared keys are kept apart: slot j of n has (j + 1) mod n characters, modulo n
    ({"type": "object", "minProperties": 2}, '{"a":1,"a":2}', False),
    ({"type": "object", "minProperties": 2}, '{"a":1,"b":2}', False),  # two keys of one length
    (_MIN3_X, '{"x":1,"a":1,"a":2}', False),
    (_MIN3_X, '{"x":1,"a":1,"bb":2}', True),
    ({"type": "object", "minProperties": 2}, '{"a":1,"bb":2,"a":3}', True),  # past the minimum: two members remain
    ({"type": "object", "minProperties": 3}, '{"a":1,"bb":2,"ccc":3}', True),
    ({"type": "object", "minProperties": 3}, '{"a":1,"bb":2,"cccc":3}', False),
    # oneOf of branches that only name types: the types exactly one branch names (Kubernetes'
    # int-or-string; null is in both branches, so no null)
    (_INT_OR_STRING, '"a"', True),
    (_INT_OR_STRING, "3", True),
    (_INT_OR_STRING, "null", False),
    (_INT_OR_STRING, "3.5", False),
    ({"oneOf": [{"type": "number"}, {"type": "string"}]}, "3.5", True),
    # patternProperties: an undeclared key answers to every pattern it matches; the rest to
    # additionalProperties; propertyNames constrains every key
    ({"patternProperties": {"^x_": {"type": "integer"}}, "additionalProperties": False}, '{"x_a":1,"x_b":2}', True),
    ({"patternProperties": {"^x_": {"type": "integer"}}, "additionalProperties": False}, '{"x_a":"s"}', False),
    ({"patternProperties": {"^x_": {"type": "integer"}}, "additionalProperties": False}, '{"y":1}', False),
    ({"patternProperties": {"a": {"minimum": 5}, "b": {"maximum": 7}}, "additionalProperties": {"type": "string"}},
     '{"ab":6,"c":"s"}', True),
    ({"patternProperties": {"a": {"minimum": 5}, "b": {"maximum": 7}}, "additionalProperties": {"type": "string"}},
     '{"ab":8}', False),
    ({"properties": {"x_n": {"type": "number"}}, "patternProperties": {"^x_": {"type": "integer"}}}, '{"x_n":1.5}', False),
    ({"type": "object", "propertyNames": {"maxLength": 3}}, '{"abc":1}', True),
    ({"type": "object", "propertyNames": {"maxLength": 3}}, '{"abcd":1}', False),
    ({"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}}, '{"Ab":1}', False),
    # allOf merged, $ref with siblings, oneOf over disjoint branches
    ({"allOf": [{"type": "integer", "minimum": 0}, {"maximum": 5}]}, "5", True),
    ({"allOf": [{"type": "integer", "minimum": 0}, {"maximum": 5}]}, "6", False),
    ({"allOf": [{"properties": {"a": {"type": "string"}}, "required": ["a"]},
                {"properties": {"b": {"type": "integer"}}, "required": ["b"]}]}, '{"a":"x","b":1}', True),
    ({"allOf": [{"properties": {"a": {"type": "string"}}, "required": ["a"]},
                {"properties": {"b": {"type": "integer"}}, "required": ["b"]}]}, '{"a":"x"}', False),
    ({"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n", "minimum": 3}, "2", False),
    # properties merged from a $ref or an allOf keep the order the schema is written in
    *[(schema, text, ok) for schema in (
        {"properties": {"b": {"type": "integer"}}, "$ref": "#/$defs/a", "$defs": _A},
        {"properties": {"b": {"type": "integer"}}, "allOf": [_A["a"]]},
    ) for text, ok in (('{"b":1,"a":"x"}', True), ('{"a":"x","b":1}', False))],
    *[(schema, text, ok) for schema in (
        {"$ref": "#/$defs/a", "properties": {"b": {"type": "integer"}}, "$defs": _A},
        {"allOf": [_A["a"]], "properties": {"b": {"type": "integer"}}},
    ) for text, ok in (('{"a":"x","b":1}', True), ('{"b":1,"a":"x"}', False))],
    ({"oneOf": [{"type": "string"}, {"type": "integer"}]}, "3", True),
    ({"oneOf": [{"const": "a"}, {"const": "b"}]}, '"b"', True),
    # references by $anchor and by $id
    ({"$defs": {"x": {"$anchor": "num", "type": "integer"}}, "items": {"$ref": "#num"}}, "[1,2]", True),
    ({"$defs": {"x": {"$anchor": "num", "type": "integer"}}, "items": {"$ref": "#num"}}, '["a"]', False),
    ({"$id": "http://example.com/root.json", "$defs": {"b": {"$id": "b.json", "type": "boolean"}},
      "items": {"$ref": "b.json"}}, "[true]", True),
    # recursion
    ({"$defs": {"t": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/t"}}}}},
      "$ref": "#/$defs/t"}, '{"kids":[{"kids":[]},{}]}', True),
]


def accepts(vocab, grammar, text: str) -> bool:
    m = Matcher(CompiledGrammar(grammar, vocab))
    return m.consume_bytes(text.encode("utf-8")) and m.is_accepting()


@pytest.mark.parametrize("schema,text,accepted", CASES)
def test_keyword_language(bytes_vocab, schema, text, accepted):
    assert accepts(bytes_vocab, schema_grammar(schema), text) is accepted


def test_standard_semantics(bytes_vocab):
    """standard=True: undeclared properties allowed, untyped schemas admit every type."""
    props = {"properties": {"a": {"type": "integer"}}}
    assert not accepts(bytes_vocab, schema_grammar(props), '{"a":1,"b":2}')
    assert accepts(bytes_vocab, schema_grammar(props, STD), '{"a":1,"b":2}')
    assert not accepts(bytes_vocab, schema_grammar({"minimum": 3}), '"x"')
    assert accepts(bytes_vocab, schema_grammar({"minimum": 3}, STD), '"x"')
    assert accepts(bytes_vocab, schema_grammar({"const": 1.0}, STD), "1")


def test_flexible_whitespace_is_bounded(bytes_vocab):
    schema = {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}}}, "required": ["a"]}
    ws2 = SchemaOptions(whitespace=2)
    assert accepts(bytes_vocab, schema_grammar(schema, ws2), '{ "a" : [ 1 ,\n2 ] }')
    assert not accepts(bytes_vocab, schema_grammar(schema, ws2), '{   "a":[1]}')  # three spaces: over the bound
    assert not accepts(bytes_vocab, schema_grammar(schema), '{ "a":[1]}')  # compact by default


def test_pattern_masks_have_no_dead_ends(bytes_vocab):
    """Every legal token keeps a completion: a partial UTF-8 character or \\u escape is offered
    only if some completion of it continues the pattern."""
    g = CompiledGrammar(schema_grammar({"type": "string", "pattern": "^[a-f]{2}é$"}), bytes_vocab)
    m = Matcher(g)
    assert m.consume_bytes(b'"ab')
    legal = m.legal_token_ids().tolist()
    texts = {bytes_vocab.token_bytes[t] for t in legal}
    assert "é".encode() in texts and b"\xc3" in texts  # the whole character, or its lead byte
    assert b"\xe4\xb8" not in texts and b"a" not in texts  # not another character, not a fourth letter
    assert b"\\" in texts and b"\\u00" in texts  # \u00e9 spells é too
    m.consume_bytes(b"\\u00")
    hexes = {bytes_vocab.token_bytes[t] for t in m.legal_token_ids().tolist()}
    assert b"e" in hexes and b"a" not in hexes  # \u00e? is the only way on
    assert m.forced_tokens() == [] or bytes_vocab.decode(m.forced_tokens()).startswith(b"e")


ERRORS = [
    ({"type": "string", "pattern": "(?=a)"}, "pattern", "/pattern", "lookaround"),
    ({"type": "string", "pattern": "(a)\\1"}, "pattern", "/pattern", "backreferences"),
    ({"properties": {"p": {"type": "string", "pattern": "a^b"}}}, "pattern", "/properties/p/pattern", "anchor"),
    ({"type": "string", "pattern": "["}, "pattern", "/pattern", "unterminated"),
    ({"oneOf": [{"type": "integer"}, {"minimum": 2}]}, "oneOf", "/oneOf", "overlap"),
    ({"allOf": [{"type": "string"}, {"type": "integer"}]}, "type", "/allOf/1", "no value fits"),
    ({"allOf": [{"const": 1}, {"const": 2}]}, "const", "/allOf/1", "two different constants"),
    ({"type": "array", "uniqueItems": True}, "uniqueItems", "", "not supported"),
    ({"properties": {"a": {"not": {"type": "null"}}}}, "not", "/properties/a", "lenient"),
    ({"$ref": "https://example.com/other.json"}, "$ref", "/$ref", "inline the remote schema"),
    ({"$ref": "#nowhere"}, "$ref", "/$ref", "no $anchor"),
    ({"type": "number", "minimum": 5, "maximum": 1}, "minimum", "", "no number"),
    ({"type": "array", "prefixItems": [{}], "items": False, "minItems": 3}, "minItems", "", "only 1 items"),
]


@pytest.mark.parametrize("schema,keyword,pointer,words", ERRORS)
def test_schema_errors_name_keyword_and_pointer(schema, keyword, pointer, words):
    with pytest.raises(SchemaError) as e:
        schema_grammar(schema)
    assert e.value.keyword == keyword and e.value.pointer == pointer
    assert words in str(e.value)


def test_lenient_ignores_with_a_warning(bytes_vocab):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        g = schema_grammar({"oneOf": [{"type": "integer"}, {"minimum": 2}], "not": {"const": 3}},
                           SchemaOptions(lenient=True))
    assert accepts(bytes_vocab, g, "3")  # `not` ignored (with a warning), oneOf read as anyOf
    msgs = " ".join(str(x.message) for x in w)
    assert "oneOf" in msgs and "'not'" in msgs


def test_unknown_format_is_an_annotation(bytes_vocab):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        g = schema_grammar({"type": "string", "format": "color"})
    assert accepts(bytes_vocab, g, '"anything"')
    assert any("color" in str(x.message) for x in w)


def test_limits_stop_hostile_schemas_cleanly(bytes_vocab):
    deep: dict = {"type": "integer"}
    for _ in range(100):
        deep = {"type": "array", "items": deep}
    with pytest.raises(SchemaError, match="max_depth"):
        schema_grammar(deep)
    with pytest.raises(SchemaError, match="max_enum"):
        schema_grammar({"enum": list(range(20))}, SchemaOptions(max_enum=10))
    with pytest.raises(SchemaError, match="max_pattern"):
        schema_grammar({"type": "string", "pattern": "a" * 5000})
    t0 = time.perf_counter()
    with pytest.raises(SchemaError, match="too large|too complex"):
        schema_grammar({"type": "string", "pattern": "(a{1000}){1000}"})
    assert time.perf_counter() - t0 < 30
    # 2^20 DFA states, built only as strings visit them (each character at most one new state;
    # regex.MAX_PATTERN_STATES bounds them all): it compiles at the cost of its NFA
    g = schema_grammar({"type": "string", "pattern": "^[ab]*a[ab]{20}$"})
    assert accepts(bytes_vocab, g, '"' + "ab" * 30 + "a" * 21 + '"')
    wide = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(2000)}}
    with pytest.raises(SchemaError, match="budget"):
        schema_grammar({"allOf": [wide] * 50}, SchemaOptions(time_budget_s=0.05))


def test_unsatisfiable_lengths_are_grammar_errors(bytes_vocab):
    with pytest.raises(GrammarError, match="length"):
        CompiledGrammar(schema_grammar({"type": "string", "pattern": "^a{5}$", "maxLength": 3}), bytes_vocab)


@pytest.mark.parametrize("params, rejected", [
    ({"minimum": 5}, b"5"),
    ({}, b"0"),
    ({"anyOf": [{"type": "string"}, {"type": "object", "properties": {"a": {"type": "integer"}}}]}, b'""'),
    ({"properties": {"a": {"type": "integer"}}}, b"[]"),
])
def test_untyped_tool_parameters_are_an_object(bytes_vocab, params, rejected):
    """A tool's arguments are always an object: `parameters` without a type (keywords alone, an
    anyOf, nothing) once let a call's arguments be a number or a string."""
    from railcall.grammar.tools import Tool, tool_grammar
    from railcall.matcher import Matcher, compiled_grammar

    g = compiled_grammar(tool_grammar([Tool("t", "", params)]), bytes_vocab)
    assert not Matcher(g).consume_bytes(b'{"tool":"t","args":' + rejected + b"}")
    m = Matcher(g)
    assert m.consume_bytes(b'{"tool":"t","args":{')
    m.finish()
    assert m.is_accepting()


def test_tool_parameters_no_object_fits_are_refused_saying_so():
    from railcall.grammar.tools import Tool, tool_grammar

    with pytest.raises(SchemaError, match="parameters must describe an object, and no object fits") as e:
        tool_grammar([Tool("t", "", {"$ref": "#/$defs/s", "$defs": {"s": {"type": "string"}}})])
    assert e.value.empty and "tool 't'" in str(e.value)


def test_an_any_of_branch_no_value_fits_is_dropped(bytes_vocab):
    """JSON Schema: a branch that matches nothing leaves the others; only when every branch is
    empty is the schema."""
    g = schema_grammar({"type": "object", "anyOf": [{"type": "string"}, {"required": ["a"]}]})
    assert accepts(bytes_vocab, g, '{"a":1}') and not accepts(bytes_vocab, g, '"x"') and not accepts(bytes_vocab, g, '{}')
    with pytest.raises(SchemaError) as e:
        schema_grammar({"type": "object", "anyOf": [{"type": "string"}, {"type": "array"}]})
    assert e.value.empty
    with pytest.raises(SchemaError, match="contains"):  # any other error still stands
        schema_grammar({"anyOf": [{"type": "string"}, {"type": "array", "contains": {"type": "integer"}}]})


def test_the_reference_index_is_built_only_for_a_schema_that_refers(monkeypatch):
    """The `$id`/`$anchor` index walks the whole document; a schema without `$ref` (most tool
    parameters) never builds it, and one with references builds it once, however many there are."""
    from railcall.grammar import schema as schema_mod

    calls = []
    index = schema_mod._index
    monkeypatch.setattr(schema_mod, "_index", lambda ctx, node, base: calls.append(base) or index(ctx, node, base))
    plain = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "array", "items": {"type": "integer"}}}}
    schema_grammar(plain)
    assert calls == []
    refs = {"$id": "urn:x", "type": "object", "$defs": {"n": {"$anchor": "num", "type": "integer"}},
            "properties": {"a": {"$ref": "#/$defs/n"}, "b": {"$ref": "#num"}, "c": {"$ref": "urn:x#/$defs/n"}}}
    schema_grammar(refs)
    assert calls == ["urn:x"]


def test_a_schema_with_several_malformed_keywords_reports_the_same_one_in_any_key_order():
    """Shapes are checked in a fixed keyword order, whatever order the schema's keys come in."""
    bad = [("maxLength", "10"), ("type", 3), ("required", "a"), ("pattern", 5)]
    seen = set()
    for keys in (bad, bad[::-1], bad[1:] + bad[:1]):
        with pytest.raises(SchemaError) as e:
            schema_grammar({"type": "object", "properties": {"a": dict(keys)}})
        seen.add((e.value.keyword, str(e.value)))
    assert len(seen) == 1, seen


def _nested_required(n: int) -> dict:
    s: dict = {"type": "integer"}
    for _ in range(n):
        s = {"type": "object", "properties": {"a": s}, "required": ["a"]}
    return s


_ALIASES = {"$defs": {**{f"a{i}": {"$ref": f"#/$defs/a{i + 1}"} for i in range(40)}, "a40": {"type": "integer"}},
            "$ref": "#/$defs/a0"}


@pytest.mark.parametrize("schema, good, bad", [
    # an optional property no value fits is left out
    ({"type": "object", "properties": {"a": {"type": "integer", "minimum": 5, "maximum": 1}, "b": {"type": "string"}}},
     '{"b":"x"}', '{"a":1}'),
    ({"type": "object", "properties": {"a": {"enum": []}, "b": {"type": "string"}}}, '{"b":"x"}', '{"a":1}'),
    ({"type": "object", "properties": {"a": {"type": "string", "enum": ["long"], "maxLength": 2}}}, "{}", '{"a":"long"}'),
    ({"type": "object", "properties": {"a": {"type": "array", "items": False, "minItems": 1}}}, "{}", '{"a":[]}'),
    ({"anyOf": [{"enum": []}, {"type": "integer"}]}, "3", '"x"'),
    (_nested_required(40), '{"a":' * 40 + "1" + "}" * 40, '{"a":' * 39 + "1" + "}" * 39),
    (_ALIASES, "7", '"x"'),
    ({"type": "string", "pattern": "^a{300}$"}, '"' + "a" * 300 + '"', '"' + "a" * 299 + '"'),
    ({"type": "string", "pattern": "^(ab){200,}$"}, '"' + "ab" * 200 + '"', '"' + "ab" * 199 + '"'),
])
def test_satisfiable_schemas_compile(bytes_vocab, schema, good, bad):
    g = schema_grammar(schema)
    assert accepts(bytes_vocab, g, good) and not accepts(bytes_vocab, g, bad)


def test_a_required_property_no_value_fits_empties_its_object():
    with pytest.raises(SchemaError) as e:
        schema_grammar({"type": "object", "properties": {"a": {"enum": []}}, "required": ["a"]})
    assert e.value.empty


def test_strings_under_not_several_patterns_and_a_pattern_with_a_format(bytes_vocab):
    """`not` of strings, allOf's patterns, and a pattern beside a format: one automaton each, the
    product of its parts, agreeing with jsonschema on every probe."""
    import json
    import random

    import jsonschema

    schemas = [
        {"type": "string", "not": {"enum": ["ab", "b", ""]}},
        {"type": "string", "not": {"const": "a\\\"b"}},
        {"allOf": [{"type": "string", "pattern": "^[ab]+$"}, {"pattern": "a$"}, {"not": {"enum": ["aa"]}}]},
        {"type": "string", "pattern": "^2026-", "format": "date"},
        {"enum": ["a", "b", "c", 3], "not": {"enum": ["b"]}},
        {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 2}], "not": {"enum": ["x", "yy"]}},
    ]
    rng = random.Random(1)
    alphabet = "ab\"\\é-0126"
    probes = ["", "a", "b", "ab", "aa", "ba", "bba", "a\"b", "x", "yy", "y", "c", "3", "2026-02-30", "2026-02-03",
              "2025-02-03", "2026-1-1"] + ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 5)))
                                           for _ in range(60)]
    for schema in schemas:
        g = schema_grammar(schema)
        check = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
        for p in probes:
            for value in (p, 3):
                text = json.dumps(value, ensure_ascii=False)
                assert accepts(bytes_vocab, g, text) is check.is_valid(value), (schema, value)


def test_not_of_other_values_stays_an_error():
    for body in ({"type": "null"}, {"enum": ["a", 1]}, {"const": 2}, {"enum": ["a"], "minLength": 2}):
        with pytest.raises(SchemaError) as e:
            schema_grammar({"type": "string", "not": body})
        assert e.value.keyword == "not" and "enum or const of strings" in str(e.value)


def test_a_branch_that_cannot_hold_a_required_name_is_dropped_not_the_schema(smollm2_vocab):
    """`required: [a]` beside an anyOf whose second branch forbids `a`: that branch holds no value,
    so only the first is offered; with every branch impossible (or at the top) it is still an
    error naming the keyword. An object-or-string schema keeps its strings."""
    from railcall import Matcher, compiled_grammar, schema_grammar
    from railcall.errors import SchemaError

    schema = {"type": "object", "required": ["a"], "anyOf": [
        {"properties": {"a": {"type": "string", "maxLength": 3}}, "additionalProperties": False},
        {"properties": {"b": {"type": "string"}}, "additionalProperties": False}]}
    g = compiled_grammar(schema_grammar(schema), smollm2_vocab)
    assert Matcher(g).consume_bytes(b'{"a":"xy"}')
    assert not Matcher(g).consume_bytes(b'{"b"')
    with pytest.raises(SchemaError, match="required 'a' is neither declared"):
        schema_grammar({**schema, "anyOf": [schema["anyOf"][1]]})
    either = {"type": ["object", "string"], "required": ["a"], "properties": {}, "additionalProperties": False,
              "maxLength": 4}
    m = Matcher(compiled_grammar(schema_grammar(either), smollm2_vocab))
    assert m.consume_bytes(b'"abc"') and m.is_accepting()
    assert not Matcher(compiled_grammar(schema_grammar(either), smollm2_vocab)).consume_bytes(b"{")


@pytest.mark.parametrize("schema, good, bad", [
    ({"type": "number", "multipleOf": 0.01}, ["0", "12.34", "-0.5", "7.10", "19.99"], ["12.345", "0.001", "1e2"]),
    ({"type": "number", "multipleOf": 0.01, "minimum": 0, "maximum": 5}, ["0.01", "5", "4.99"], ["5.01", "-0.01", "2.005"]),
    ({"type": "number", "multipleOf": 0.25}, ["0.75", "-3.5", "2"], ["0.3", "1.2"]),
    ({"type": "integer", "multipleOf": 5, "minimum": -20, "maximum": 100}, ["-20", "0", "95"], ["3", "105", "-25", "5.0"]),
    ({"type": "number", "multipleOf": 3, "exclusiveMinimum": 10, "maximum": 13}, ["12", "12.0"], ["9", "15", "10"]),
    ({"allOf": [{"type": "integer", "multipleOf": 4}, {"multipleOf": 6}]}, ["0", "12", "-36"], ["4", "6", "18"]),
])
def test_multiple_of_is_enforced_exactly(bytes_vocab, schema, good, bad):
    """multipleOf with any positive step, exact in decimal (0.01 is not the float's binary
    fraction), beside the bounds; two under allOf meet at their least common multiple."""
    g = schema_grammar(schema)
    for text in good:
        assert accepts(bytes_vocab, g, text), text
    for text in bad:
        assert not accepts(bytes_vocab, g, text), text


def test_multiple_of_offers_no_digit_that_cannot_end_on_a_multiple(bytes_vocab):
    """Byte by byte: after `1.` under multipleOf 0.25, only 1.0, 1.25, 1.5 and 1.75 lie ahead;
    after `1.7`, only `5`; and with maximum 1.6, `7` is gone too."""
    quarter = {"type": "number", "multipleOf": 0.25}
    m = Matcher(CompiledGrammar(schema_grammar(quarter), bytes_vocab))
    assert m.consume_bytes(b"1.")
    assert [chr(b) for b in b"0123456789" if m.copy().consume_bytes(bytes([b]))] == ["0", "2", "5", "7"]
    assert m.consume_bytes(b"7") and not m.is_accepting()
    assert [chr(b) for b in b"0123456789" if m.copy().consume_bytes(bytes([b]))] == ["5"]
    m = Matcher(CompiledGrammar(schema_grammar({**quarter, "maximum": 1.6}), bytes_vocab))
    assert m.consume_bytes(b"1.")
    assert [chr(b) for b in b"0123456789" if m.copy().consume_bytes(bytes([b]))] == ["0", "2", "5"]
    with pytest.raises(SchemaError, match="multipleOf must be a number above 0"):
        schema_grammar({"type": "number", "multipleOf": 0})


_FIVE = {k: {"type": "integer"} for k in "abcde"}


@pytest.mark.parametrize("schema, good, bad", [
    ({"type": "object", "properties": _FIVE, "additionalProperties": False, "minProperties": 1},
     ['{"a":1}', '{"e":1}', '{"b":1,"d":2}'], ["{}"]),
    ({"type": "object", "properties": _FIVE, "additionalProperties": False, "minProperties": 2, "maxProperties": 3},
     ['{"a":1,"b":2}', '{"c":1,"d":2,"e":3}'], ['{"a":1}', '{"a":1,"b":2,"c":3,"d":4}', "{}"]),
    ({"type": "object", "properties": _FIVE, "additionalProperties": False, "maxProperties": 1},
     ["{}", '{"d":4}'], ['{"a":1,"b":2}']),
    ({"type": "object", "properties": _FIVE, "required": ["c"], "additionalProperties": False, "minProperties": 2},
     ['{"a":1,"c":2}', '{"c":1,"e":2}'], ['{"c":1}']),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": True, "maxProperties": 2},
     ['{"a":1,"x":2}', '{"x":1,"y":2}'], ['{"a":1,"x":2,"y":3}']),
])
def test_property_counts_with_optional_declared_properties(bytes_vocab, schema, good, bad):
    """min/maxProperties over optional declared properties: the object counts its members as it
    writes them (these were refused as "property counts with optional declared properties")."""
    g = schema_grammar(schema)
    for text in good:
        assert accepts(bytes_vocab, g, text), text
    for text in bad:
        assert not accepts(bytes_vocab, g, text), text


def test_property_counts_no_object_meets_are_empty():
    with pytest.raises(SchemaError, match="minProperties 6 > the 5 properties allowed") as e:
        schema_grammar({"type": "object", "properties": _FIVE, "additionalProperties": False, "minProperties": 6})
    assert e.value.empty
    with pytest.raises(SchemaError, match="a minimum above the required properties"):
        schema_grammar({"type": "object", "properties": {"a": {}}, "additionalProperties": True, "minProperties": 2})


def test_a_branch_or_optional_property_no_multiple_fits_is_left_out(bytes_vocab):
    """No multiple within the bounds: that part is empty (left out where it may be), not the
    schema refused; an integer under multipleOf is never written `-0`."""
    seven = {"type": "integer", "multipleOf": 7, "minimum": 1, "maximum": 6}
    g = schema_grammar({"type": "object", "properties": {"x": seven, "y": {"type": "integer"}}})
    assert accepts(bytes_vocab, g, '{"y":1}') and not accepts(bytes_vocab, g, '{"x":7}')
    assert accepts(bytes_vocab, schema_grammar({"anyOf": [seven, {"type": "string"}]}), '"a"')
    with pytest.raises(SchemaError, match="multiple of 0.5") as e:
        schema_grammar({"type": "number", "multipleOf": 0.5, "minimum": 0.1, "maximum": 0.2})
    assert e.value.empty and e.value.keyword == "multipleOf"
    assert not accepts(bytes_vocab, schema_grammar({"type": "integer", "multipleOf": 1}), "-0")
