"""A grammar's rules ($defs, recursion) are compiled the first time a value enters them, and
every error compiling them could raise is raised at compile time all the same."""

from __future__ import annotations

import random

import pytest

from railcall.errors import GrammarError
from railcall.grammar import ir, program
from railcall.grammar.schema import schema_grammar
from railcall.matcher import CompiledGrammar, Matcher

from conftest import byte_level_vocab

SCHEMA = {
    "type": "object", "additionalProperties": False,
    "properties": {"name": {"type": "string"}, "meta": {"$ref": "#/$defs/Meta"}, "spec": {"$ref": "#/$defs/Spec"}},
    "$defs": {
        "Meta": {"type": "object", "additionalProperties": False,
                 "properties": {"labels": {"type": "array", "items": {"$ref": "#/$defs/Label"}}}},
        "Label": {"type": "object", "additionalProperties": False, "required": ["k"],
                  "properties": {"k": {"type": "string", "pattern": "^[a-z]{1,8}$"}}},
        "Spec": {"type": "object", "additionalProperties": False,
                 "properties": {"replicas": {"type": "integer", "minimum": 0, "maximum": 9},
                                "child": {"$ref": "#/$defs/Spec"}}},
    },
}


@pytest.fixture
def entered(monkeypatch):
    names: list[str] = []
    real = program._Compiler.compile_rule

    def spy(self, fwd):
        if fwd.target is None:
            names.append(self._names[id(fwd)].rpartition("/")[2])
        return real(self, fwd)

    monkeypatch.setattr(program._Compiler, "compile_rule", spy)
    return names


def _feed(m: Matcher, text: str) -> None:
    for b in text.encode():
        assert m.consume_token(b), text


def test_a_rule_is_compiled_when_a_value_first_enters_it(entered):
    g = CompiledGrammar(schema_grammar(SCHEMA), byte_level_vocab())
    m = Matcher(g)
    m.legal_token_ids()
    assert entered == []  # the first mask needs no definition
    _feed(m, '{"name":"x","meta":')
    m.legal_token_ids()
    assert entered == ["Meta"]
    _feed(m, '{"labels":[')
    m.legal_token_ids()
    assert entered == ["Meta", "Label"]
    _feed(m, '{"k":"ab"}]},"spec":{"child":{"replicas":3}}}')
    assert m.is_accepting() and entered == ["Meta", "Label", "Spec"]  # Spec once, though recursive


def test_random_walks_through_lazy_rules_end_valid():
    import json

    import jsonschema

    vocab = byte_level_vocab()
    g = CompiledGrammar(schema_grammar(SCHEMA), vocab)
    rng = random.Random(5)
    done = 0
    for _ in range(60):
        m, out = Matcher(g), bytearray()
        for _ in range(800):
            if m.is_accepting() or m.is_done():
                break
            legal = m.legal_token_ids().tolist()
            assert legal, bytes(out)  # no dead end
            closers = [t for t in legal if vocab.token_bytes[t] in (b'"', b"}", b"]", b",")]
            t = rng.choice(closers) if closers and rng.random() < 0.6 else rng.choice(legal)
            assert m.consume_token(t)
            out += vocab.token_bytes[t]
        if m.is_accepting():
            jsonschema.validate(json.loads(out), SCHEMA)
            done += 1
    assert done > 10


def _compile(start, **rules):
    return CompiledGrammar(ir.Grammar(start, tuple(rules.items())), byte_level_vocab())


@pytest.mark.parametrize("bad,message", [
    (ir.JsonString(5, 2), "string length range is empty"),
    (ir.JsonPattern("regex", "^abc$", 0, 2), "no string matching"),
    (ir.JsonInteger(10**40, None), "no integer"),
    (ir.JsonNumber("5", "4"), "no number"),
    (ir.JsonArray(None, 3), "prefix items"),
    (ir.JsonArray(ir.JsonString(), 4, 2), "array size range is empty"),
    (ir.Alt(), "empty alternative|no finite value"),
    (ir.Select(()), "no options|no finite value"),
    (ir.Ref("missing"), "undefined rule|no finite value"),
    (ir.JsonObject((("x", ir.JsonString(3, 1), True),)), "string length range is empty"),
    (ir.JsonObject((), ((ir.JsonPattern("regex", "^x$", 2, 5), ir.JsonString()),)), "no string matching"),
])
def test_what_a_rule_could_not_compile_is_an_error_at_compile_time(bad, message):
    # behind an alternative a value may never take, two references deep
    start = ir.Alt(ir.Lit(b"0"), ir.Ref("outer"))
    with pytest.raises(GrammarError, match=message):
        _compile(start, outer=ir.Seq(ir.Lit(b"["), ir.Ref("inner"), ir.Lit(b"]")), inner=bad)
    _compile(start, outer=ir.Seq(ir.Lit(b"["), ir.Ref("inner"), ir.Lit(b"]")), inner=ir.JsonString())


def test_threads_entering_a_rule_at_once_share_one_body():
    import threading

    g = CompiledGrammar(schema_grammar(SCHEMA), byte_level_vocab())
    masks: list = []
    barrier = threading.Barrier(4)

    def run():
        m = Matcher(g)
        _feed(m, '{"spec":{"child":{"child":')
        barrier.wait()
        masks.append(m.legal_token_ids().tolist())

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(masks) == 4 and all(x == masks[0] for x in masks)


def test_guards_are_left_out_only_where_no_value_can_nest_to_the_limit():
    from railcall.grammar.instructions import MAX_DEPTH

    def chain(n):  # rule i refers to rule i + 1, the last to none
        rules = {f"r{i}": ir.Alt(ir.Lit(b"0"), ir.Seq(ir.Lit(b"["), ir.Ref(f"r{i + 1}"), ir.Lit(b"]")))
                 for i in range(n - 1)}
        rules[f"r{n - 1}"] = ir.Lit(b"0")
        return ir.Grammar(ir.Ref("r0"), tuple(rules.items()))

    assert program._deepest_nesting(chain(5)) == 5
    assert program._deepest_nesting(chain(MAX_DEPTH + 8)) == float("inf")  # past the limit
    assert program._deepest_nesting(schema_grammar(SCHEMA)) == float("inf")  # Spec refers to itself
    deep = CompiledGrammar(chain(MAX_DEPTH + 8), byte_level_vocab())
    m = Matcher(deep)
    _feed(m, "[" * (MAX_DEPTH - 1))
    assert m.legal_token_ids().tolist() == [ord("0")]  # one more `[` could not be closed in time


def test_the_start_needs_no_depth_guards_where_no_branch_can_nest_to_the_limit(entered, monkeypatch):
    calls = []
    real = program.need_of
    monkeypatch.setattr(program, "need_of", lambda ins: calls.append(ins) or real(ins))
    g = CompiledGrammar(schema_grammar(SCHEMA), byte_level_vocab())  # Spec is recursive
    m = Matcher(g)
    m.legal_token_ids()
    assert calls == []  # the start runs at depth 0: every branch fits under the limit
    _feed(m, '{"spec":')
    m.legal_token_ids()
    assert entered == ["Spec"] and calls  # a recursive rule's body can run deep: guarded
