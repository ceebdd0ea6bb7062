"""Which keywords mean what: a keyword outside JSON Schema's vocabulary is an annotation (ignored,
as the specification says); OpenAPI's `nullable` admits null; a JSON Schema assertion railcall
cannot enforce is refused (naming the keyword and its pointer) unless `lenient`."""

from __future__ import annotations

import warnings

import pytest

from railcall.errors import SchemaError
from railcall.grammar.schema import UNENFORCED, SchemaOptions, schema_grammar
from railcall.grammar.tools import Tool, tool_grammar
from railcall.matcher import CompiledGrammar, Matcher

BASE = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}, "s": {"type": "string"}},
        "required": ["n"]}


def accepts(vocab, grammar, text: str) -> bool:
    m = Matcher(CompiledGrammar(grammar, vocab))
    return m.consume_bytes(text.encode("utf-8")) and m.is_accepting()


def with_extra(extra: dict, inner: dict) -> dict:
    return {**BASE, **extra, "properties": {"n": {**BASE["properties"]["n"], **inner}, "s": BASE["properties"]["s"]}}


@pytest.mark.parametrize("extra", [
    {"self": {"vendor": "com.acme", "name": "click", "format": "jsonschema", "version": "1-0-0"}},  # Snowplow
    {"x-kubernetes-int-or-string": True, "x-go-name": "N"},
    {"id": "http://example.com/s.json"},  # draft-04's $id, under a 2020-12 reading an annotation
    {"_format": "int32"},
    {"example": 3, "examples": [3]},
    {"deprecated": True, "readOnly": True, "writeOnly": False},
    {"frobnicate": {"type": "string"}},
])
def test_keywords_outside_the_vocabulary_are_annotations(extra):
    plain = schema_grammar(BASE)
    assert schema_grammar({**BASE, **extra}).key == plain.key
    assert schema_grammar(with_extra(extra, extra)).key == plain.key  # nested, too


@pytest.mark.parametrize("kw, value", [
    ("not", {"type": "null"}), ("maxContains", 2), ("if", {"minimum": 2}), ("contains", {"type": "integer"}),
    ("dependentRequired", {"a": ["b"]}), ("unevaluatedProperties", False), ("dependencies", {"a": ["b"]}),
])
def test_an_assertion_railcall_cannot_enforce_is_refused_unless_lenient(kw, value):
    assert kw in UNENFORCED
    with pytest.raises(SchemaError) as e:
        schema_grammar({"type": "object", "properties": {"a": {kw: value}}})
    assert e.value.keyword == kw and e.value.pointer == "/properties/a" and "lenient=True" in str(e.value)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        schema_grammar({"type": "object", "properties": {"a": {kw: value}}}, SchemaOptions(lenient=True))
    assert any(repr(kw) in str(x.message) for x in w)


@pytest.mark.parametrize("schema, text, accepted", [
    ({"type": "string", "nullable": True, "maxLength": 2}, "null", True),
    ({"type": "string", "nullable": True, "maxLength": 2}, '"ab"', True),
    ({"type": "string", "nullable": True, "maxLength": 2}, '"abc"', False),
    ({"type": ["integer", "boolean"], "nullable": True}, "null", True),
    ({"type": "integer", "nullable": False}, "null", False),
    ({"minimum": 2, "nullable": True}, "null", False),  # without `type`, nullable adds nothing (OpenAPI 3.0.3)
    ({"type": "string", "enum": ["a"], "nullable": True}, "null", False),  # enum still decides
    ({"type": "string", "enum": ["a", None], "nullable": True}, "null", True),
    ({"type": "object", "properties": {"a": {"type": "integer", "nullable": True}}, "required": ["a"]},
     '{"a":null}', True),
    ({"allOf": [{"type": "string", "nullable": True}, {"maxLength": 3}]}, "null", True),
])
def test_nullable_admits_null(bytes_vocab, schema, text, accepted):
    assert accepts(bytes_vocab, schema_grammar(schema), text) is accepted


def test_nullable_tool_parameters_are_still_an_object(bytes_vocab):
    params = {"type": "object", "nullable": True, "properties": {"a": {"type": "string", "nullable": True}}}
    g = tool_grammar([Tool("t", "", params)])
    assert accepts(bytes_vocab, g, '{"tool":"t","args":{"a":null}}')
    assert not accepts(bytes_vocab, g, '{"tool":"t","args":null}')
