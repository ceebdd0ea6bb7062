"""Property tests: random tool tables, random walks through their grammars.

For every walk: the mask is never empty before the call is done (no dead ends), the mask is
exactly the set of tokens the matcher accepts (small vocabulary, checked token by token), every
finished output parses as JSON, names a tool of the table and validates against that tool's
schema with `jsonschema`, and so does the output of a forced `finish()`.
"""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from railcall.grammar.tools import tool_grammar
from railcall.matcher import CompiledGrammar, Matcher

from toolgen import pick_token, random_tools

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


def check_output(text: bytes, tools) -> None:
    call = json.loads(text.decode("utf-8"))
    assert set(call) == {"tool", "args"}
    by_name = {t.name: t for t in tools}
    assert call["tool"] in by_name
    jsonschema.validate(call["args"], by_name[call["tool"]].parameters)


def walk(vocab, tools, rng: random.Random, *, max_steps: int, exhaustive: bool, max_string: int = 256):
    cg = CompiledGrammar(tool_grammar(tools), vocab, max_string=max_string)
    m = Matcher(cg)
    stop_ids = set(vocab.stop_ids)
    out = []
    for _ in range(max_steps):
        if m.is_done():
            break
        legal = m.legal_token_ids().tolist()
        assert legal, f"dead end after {vocab.decode(out)!r}"
        if exhaustive:
            accepted = [t for t in range(vocab.size) if m.copy().consume_token(t)]
            assert accepted == legal, f"mask differs from the accepted set after {vocab.decode(out)!r}"
        t = pick_token(rng, legal, vocab, stop_ids)
        assert m.consume_token(t), m.error_message
        if t not in stop_ids:
            out.append(t)
    if not m.is_accepting():
        tail = m.finish()
        assert m.is_accepting() and m.cut
        out.extend(tail)
    text = vocab.decode(out)
    check_output(text, tools)
    return text


@SETTINGS
@given(st.randoms(use_true_random=False))
def test_random_walks_tiny_bpe(bpe_vocab, rnd):
    tools = random_tools(rnd)
    walk(bpe_vocab, tools, rnd, max_steps=120, exhaustive=True)


@SETTINGS
@given(st.randoms(use_true_random=False))
def test_random_walks_byte_vocab(bytes_vocab, rnd):
    tools = random_tools(rnd)
    walk(bytes_vocab, tools, rnd, max_steps=150, exhaustive=True, max_string=20)


@pytest.mark.model
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(st.randoms(use_true_random=False))
def test_random_walks_smollm2(smollm2_vocab, rnd):
    tools = random_tools(rnd)
    walk(smollm2_vocab, tools, rnd, max_steps=80, exhaustive=False)


@SETTINGS
@given(st.randoms(use_true_random=False), st.integers(0, 40))
def test_finish_at_any_point_validates(bpe_vocab, rnd, cut_at):
    """The forced finish at a token ceiling, from any point of a walk, yields a valid call."""
    tools = random_tools(rnd)
    cg = CompiledGrammar(tool_grammar(tools), bpe_vocab)
    m = Matcher(cg)
    out = []
    for _ in range(cut_at):
        legal = m.legal_token_ids().tolist()
        legal = [t for t in legal if t not in bpe_vocab.stop_ids]
        if not legal or m.is_accepting():
            break
        t = pick_token(rnd, legal, bpe_vocab, set())
        assert m.consume_token(t)
        out.append(t)
    out.extend(m.finish())
    assert m.is_accepting()
    check_output(bpe_vocab.decode(out), tools)
