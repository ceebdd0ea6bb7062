"""`enum` and `const` under the schema's other assertions: every value offered satisfies all of
them (the value list is filtered when the schema is compiled), also where the assertions come
from an `allOf`, a `$ref` or an `anyOf`, and inside a tool's arguments. Checked against
`jsonschema`: for each listed value, railcall accepts it exactly when jsonschema does."""

from __future__ import annotations

import json

import jsonschema
import pytest

from railcall.errors import SchemaError
from railcall.grammar.schema import SchemaOptions, schema_grammar
from railcall.grammar.tools import Tool, tool_grammar
from railcall.matcher import CompiledGrammar, Matcher

STD = SchemaOptions(standard=True)


def accepts(vocab, grammar, text: str) -> bool:
    m = Matcher(CompiledGrammar(grammar, vocab))
    return m.consume_bytes(text.encode("utf-8")) and m.is_accepting()


# (schema, the values to try): each is accepted exactly when jsonschema accepts it
SCHEMAS = [
    ({"type": "string", "enum": ["S", "XXL"], "maxLength": 2}, ["S", "XXL"]),
    ({"enum": [1, 10], "maximum": 5}, [1, 10]),
    ({"enum": [1, 10, 2.5], "exclusiveMinimum": 2}, [1, 10, 2.5]),
    ({"allOf": [{"enum": [1, 2, 3]}, {"minimum": 2}]}, [1, 2, 3]),
    ({"allOf": [{"minimum": 2}, {"enum": [1, 2, 3]}]}, [1, 2, 3]),
    ({"const": "abcdef", "minLength": 5}, ["abcdef"]),
    ({"enum": ["ab", "a1", 7], "pattern": "^[a-z]+$"}, ["ab", "a1", 7]),
    ({"enum": ["2024-02-29", "2023-02-29"], "format": "date"}, ["2024-02-29", "2023-02-29"]),
    ({"$defs": {"small": {"maximum": 3}}, "$ref": "#/$defs/small", "enum": [1, 4]}, [1, 4]),
    ({"$defs": {"e": {"enum": [1, 4, "x"]}}, "$ref": "#/$defs/e", "type": "integer", "minimum": 2}, [1, 4, "x"]),
    ({"enum": [1, "a", None], "anyOf": [{"type": "string"}, {"type": "null"}]}, [1, "a", None]),
    ({"type": "string", "maxLength": 2, "anyOf": [{"const": "XXL"}, {"const": "S"}]}, ["XXL", "S"]),
    ({"enum": [[1, 2], [1, 1], [1, 2, 3]], "items": {"type": "integer"}, "maxItems": 2, "uniqueItems": True},
     [[1, 2], [1, 1], [1, 2, 3]]),
    ({"enum": [{"a": 1}, {"a": "x"}, {"b": 1}], "properties": {"a": {"type": "integer"}}, "required": ["a"]},
     [{"a": 1}, {"a": "x"}, {"b": 1}]),
    ({"enum": [{"a": 1, "b": 2}, {"a": 1}], "minProperties": 2}, [{"a": 1, "b": 2}, {"a": 1}]),
    ({"enum": [{"k": 1}, {"kk": 1}], "propertyNames": {"maxLength": 1}}, [{"k": 1}, {"kk": 1}]),
    ({"enum": [{"x_1": 1}, {"x_1": "s"}], "patternProperties": {"^x_": {"type": "integer"}}},
     [{"x_1": 1}, {"x_1": "s"}]),
    ({"type": "object", "properties": {"size": {"type": "string", "enum": ["S", "XXL"], "maxLength": 2}}},
     [{"size": "S"}, {"size": "XXL"}]),
]


@pytest.mark.parametrize("schema,values", SCHEMAS)
def test_enum_values_are_filtered_by_every_other_assertion(bytes_vocab, schema, values):
    g = schema_grammar(schema, STD)
    for v in values:
        expected = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker()).is_valid(v)
        assert accepts(bytes_vocab, g, json.dumps(v, separators=(",", ":"))) is expected, v


@pytest.mark.parametrize("schema", [
    {"type": "string", "enum": ["XXL"], "maxLength": 2},
    {"const": "abc", "minLength": 5},
    {"allOf": [{"enum": [1, 2, 3]}, {"minimum": 4}]},
    {"enum": [1, "a"], "anyOf": [{"type": "null"}, {"type": "boolean"}]},
])
def test_an_enum_no_value_of_which_fits_is_refused(schema):
    with pytest.raises(SchemaError) as e:
        schema_grammar(schema)
    assert e.value.empty and e.value.keyword in ("enum", "const")


def test_a_tool_argument_enum_is_filtered(bytes_vocab):
    params = {"type": "object", "properties": {"size": {"type": "string", "enum": ["S", "XXL"], "maxLength": 2},
                                               "n": {"allOf": [{"enum": [1, 2, 3]}, {"minimum": 2}]}},
              "required": ["size", "n"]}
    g = tool_grammar([Tool("order", "", params)])
    assert accepts(bytes_vocab, g, '{"tool":"order","args":{"size":"S","n":2}}')
    assert not accepts(bytes_vocab, g, '{"tool":"order","args":{"size":"XXL","n":2}}')
    assert not accepts(bytes_vocab, g, '{"tool":"order","args":{"size":"S","n":1}}')


def test_an_unenforceable_keyword_beside_an_enum_is_still_reported():
    """Filtering reads the whole schema: a keyword railcall does not enforce is refused there too
    (strict), not silently passed."""
    with pytest.raises(SchemaError) as e:
        schema_grammar({"enum": [{"a": 1}, 2], "properties": {"a": {"not": {}}}})
    assert e.value.keyword == "not" and e.value.pointer == "/properties/a"
