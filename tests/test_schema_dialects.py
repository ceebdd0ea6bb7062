"""`$schema` selects the dialect: draft-04/06/07 ignore the keywords beside a `$ref`, draft-04
names a schema's base URI (or a plain-name anchor) with `id`, draft-06/07 write an anchor as a
`$id` fragment; 2019-09 and 2020-12 (and a schema without `$schema`) apply a `$ref`'s siblings.
Each instance is accepted exactly when `jsonschema`, reading the same dialect, accepts it."""

from __future__ import annotations

import json

import jsonschema
import pytest

from railcall.grammar.schema import SchemaOptions, schema_grammar
from railcall.matcher import CompiledGrammar, Matcher

D4 = "http://json-schema.org/draft-04/schema#"
D6 = "http://json-schema.org/draft-06/schema#"
D7 = "http://json-schema.org/draft-07/schema#"
D2019 = "https://json-schema.org/draft/2019-09/schema"
D2020 = "https://json-schema.org/draft/2020-12/schema"

REF_SIBLING = {"definitions": {"s": {"type": "string"}}, "$ref": "#/definitions/s", "maxLength": 2}

CASES = [
    *[({"$schema": d, **REF_SIBLING}, ["ab", "abcd", 3]) for d in (D4, D6, D7, D2019, D2020)],
    ({"$schema": D7, "type": "object", "properties": {"a": {"$ref": "#/definitions/n", "minimum": 5}},
      "definitions": {"n": {"type": "integer"}}}, [{"a": 1}, {"a": "x"}]),
    ({"$schema": D4, "id": "http://example.com/root.json", "definitions": {"b": {"id": "b.json", "type": "boolean"}},
      "items": {"$ref": "b.json"}}, [[True], [1]]),
    ({"$schema": D4, "definitions": {"n": {"id": "#num", "type": "integer"}}, "items": {"$ref": "#num"}}, [[1], ["a"]]),
    ({"$schema": D7, "definitions": {"n": {"$id": "#num", "type": "integer"}}, "items": {"$ref": "#num"}}, [[1], ["a"]]),
    ({"$schema": D6, "$id": "http://example.com/r.json", "definitions": {"b": {"$id": "b.json", "type": "boolean"}},
      "items": {"$ref": "b.json"}}, [[True], [1]]),
    # an id beside a $ref is one of its ignored siblings: the $ref resolves against the outer base
    *[({"$schema": d, k: "http://example.com/sib/base/",
        "definitions": {"s": {k: "http://example.com/sib/foo.json", "type": "string"},
                        "n": {k: "foo.json", "type": "number"}},
        "allOf": [{k: "http://example.com/sib/", "$ref": "foo.json"}]}, ["a", 1])
      for d, k in ((D4, "id"), (D6, "$id"), (D7, "$id"))],
    ({"$schema": D4, "type": "number", "maximum": 5, "exclusiveMaximum": True}, [5, 4.5]),
    ({"$schema": D4, "allOf": [{"maximum": 10, "exclusiveMaximum": False}, {"maximum": 5, "exclusiveMaximum": True}]},
     [5, 4]),
]


def accepts(vocab, grammar, value) -> bool:
    m = Matcher(CompiledGrammar(grammar, vocab))
    return m.consume_bytes(json.dumps(value, separators=(",", ":")).encode()) and m.is_accepting()


@pytest.mark.parametrize("schema, values", CASES)
def test_the_dialect_decides_as_jsonschema_does(bytes_vocab, schema, values):
    g = schema_grammar(schema, SchemaOptions(standard=True))
    validator = jsonschema.validators.validator_for(schema)(schema)
    for v in values:
        assert accepts(bytes_vocab, g, v) is validator.is_valid(v), v


def test_draft_07_ref_siblings_are_ignored_where_2020_12_applies_them(bytes_vocab):
    old = schema_grammar({"$schema": D7, **REF_SIBLING})
    new = schema_grammar(REF_SIBLING)  # no $schema: 2020-12
    assert accepts(bytes_vocab, old, "abcd") and not accepts(bytes_vocab, new, "abcd")
