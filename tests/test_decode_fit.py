"""The token ceiling under "fit" (the default): a call closes by the model's own tokens inside
max_tokens, or is reported truncated where even the shortest close cannot fit; "complete" stays
the forced finish with its "?" tell."""

from __future__ import annotations

import json

import pytest

from agentkit import ScriptedBackend
from railcall.grammar.tools import Tool, tool_grammar
from railcall.matcher import Matcher, compiled_grammar
from railcall.runtime.decode import SamplingParams, generate

NOTE = Tool("save_note", "Save a note.", {"type": "object", "properties": {
    "text": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["text", "tags"]})
LONG = '{"tool":"save_note","args":{"text":"' + "x" * 300 + '","tags":["a"]}}'
ARRAY = '{"tool":"save_note","args":{"text":"hi","tags":[' + ",".join(['"t%d"' % i for i in range(80)]) + "]}}"


def run(vocab, reply, max_tokens, cut="fit", parallel=False, **kw):
    g = compiled_grammar(tool_grammar([NOTE], parallel=parallel), vocab)
    return generate(ScriptedBackend(vocab, [reply]), vocab, [0], Matcher(g),
                    SamplingParams(max_tokens=max_tokens, cut=cut, **kw))


@pytest.mark.parametrize("reply", [LONG, ARRAY], ids=["string", "array"])
@pytest.mark.parametrize("max_tokens", [28, 40, 64])
def test_a_call_that_would_run_past_the_ceiling_closes_by_its_own_tokens(bytes_vocab, reply, max_tokens):
    g = run(bytes_vocab, reply, max_tokens)
    assert len(g.tokens) <= max_tokens and not g.truncated and not g.cut and g.fitted
    call = json.loads(g.text)
    assert call["tool"] == "save_note" and set(call["args"]) == {"text", "tags"}
    assert "?" not in g.text  # no value filled in by the grammar
    assert g.finish_reason == "stop"  # the call is whole: the ceiling cut nothing


def test_a_budget_below_the_shortest_call_is_truncated_not_completed(bytes_vocab):
    g = run(bytes_vocab, LONG, 3)
    assert g.truncated and not g.cut and g.finish_reason == "length"
    with pytest.raises(json.JSONDecodeError):
        json.loads(g.text)


def test_a_call_that_fits_is_untouched(bytes_vocab):
    short = '{"tool":"save_note","args":{"text":"hi","tags":[]}}'
    g = run(bytes_vocab, short, 64)
    assert g.text == short and not g.fitted and not g.truncated and g.finish_reason == "stop"


def test_a_call_that_ends_on_the_ceiling_stops(bytes_vocab):
    """A call whose last byte is the ceiling's token is whole: "stop", not "length"."""
    short = '{"tool":"save_note","args":{"text":"hi","tags":[]}}'
    g = run(bytes_vocab, short, len(short))
    assert g.text == short and g.finish_reason == "stop" and not g.truncated


def test_complete_is_the_forced_finish_with_its_tell(bytes_vocab):
    g = run(bytes_vocab, LONG, 12, cut="complete")
    assert g.cut and not g.truncated
    assert json.loads(g.text)["args"]["tags"] == []  # completed by the grammar


def test_leave_cuts_where_the_ceiling_falls(bytes_vocab):
    g = run(bytes_vocab, LONG, 40, cut="leave")
    assert len(g.tokens) == 40 and g.truncated and not g.cut and not g.fitted


@pytest.mark.parametrize("seed", range(6))
def test_sampled_calls_fit_too(bytes_vocab, seed):
    g = run(bytes_vocab, LONG, 34, temperature=1.5, seed=seed, parallel=True)
    assert len(g.tokens) <= 34 and not g.truncated, g.text
    json.loads(g.text)


NESTED = '{"weather_data":[{"city":"New York","temperature":"72F","wind":[1,2,3]},{"city":"Paris","x":{"y":"z"}}]}'


@pytest.mark.parametrize("cut", ["close", "complete"])
def test_the_forced_close_is_written_before_a_token_that_would_leave_it_no_room(bytes_vocab, cut):
    """Any object (response_format json_object): one token can lengthen the close by more than one
    (`,` opens a key that needs `"":0`), so the close comes before that token, not only when it
    takes the budget exactly; for every ceiling the answer parses, inside max_tokens where the
    close can fit at all."""
    from railcall.grammar import ir
    from railcall.grammar.schema import schema_to_ir

    node, rules = schema_to_ir({"type": "object"})
    g = compiled_grammar(ir.Grammar(node, rules, name="json_object"), bytes_vocab)
    for n in range(2, len(NESTED) + 1):
        out = generate(ScriptedBackend(bytes_vocab, [NESTED]), bytes_vocab, [0], Matcher(g),
                       SamplingParams(max_tokens=n, cut=cut))
        assert isinstance(json.loads(out.text), dict), (n, out.text)
        assert len(out.tokens) <= n or cut == "complete", (n, out.text)
        assert out.finish_reason == ("length" if out.cut else "stop") and (out.cut or out.text == NESTED)


def test_where_the_models_likely_tokens_do_not_fit_the_close_it_could_write_is_offered(bytes_vocab, monkeypatch):
    """The fit scan looks at the model's most likely tokens; where none of them fits (here the
    scan is one token wide and the model wants more "x"), the tokens that begin the grammar's
    close (`"`, `","`) are offered before the grammar writes the close itself: the call is
    whole, closed within the budget, not cut."""
    import railcall.runtime.decode as decode

    monkeypatch.setattr(decode, "FIT_SCAN", 1)
    for n in (30, 34, 40):
        g = run(bytes_vocab, LONG, n)
        assert len(g.tokens) <= n and not g.cut and not g.truncated and g.finish_reason == "stop", (n, g.text)
        call = json.loads(g.text)
        assert set(call["args"]) == {"text", "tags"} and "?" not in g.text


@pytest.mark.parametrize("turn", [False, True], ids=["matcher", "turn"])
def test_a_close_measured_once_per_key_is_the_close_of_every_state_with_that_key(bytes_vocab, turn):
    """`_need_after` measures a close once per close key (states with equal futures: a string's
    length past its minimum changes nothing) on the row's matcher, rolled back: after every token
    of a call it gives what a fresh copy's own close search gives, and leaves the matcher as it was."""
    from railcall.output.delimiters import Delimiters
    from railcall.runtime.decode import Row
    from railcall.runtime.regions import answer_matcher

    tool = Tool("save", "Save.", {"type": "object", "properties": {
        "text": {"type": "string", "minLength": 4}, "n": {"type": "integer", "minimum": 100}},
        "required": ["text", "n"]})
    g = compiled_grammar(tool_grammar([tool]), bytes_vocab)
    m = answer_matcher(bytes_vocab, g, Delimiters.from_vocab(bytes_vocab, tool_call=None)) if turn else Matcher(g)
    row = Row(bytes_vocab, m, SamplingParams(max_tokens=64))
    reply = b'{"tool":"save","args":{"text":"abcdefgh","n":12345}}'
    hits = 0
    for k, b in enumerate(reply):
        for probe in (b'"', b"x", b"1", b"}", b","):
            tok = bytes_vocab.token_bytes.index(probe)
            before = (m.num_consumed(), m.is_accepting(), m.close_key())
            known = len(row._need)
            got = row._need_after(tok)
            assert (m.num_consumed(), m.is_accepting(), m.close_key()) == before
            hits += len(row._need) == known and got not in (None, 0)
            fresh = m.copy()
            if not fresh.consume_token(tok) or fresh.is_error():
                assert got is None
                continue
            if fresh.is_accepting():
                assert got == 0
                continue
            close = fresh.finish()
            want = len(close) + bytes_vocab.decode(close).count(b'?"') if close and fresh.is_accepting() else None
            assert got == want, (reply[:k], probe)
        assert m.consume_token(bytes_vocab.token_bytes.index(bytes([b])))
    assert hits > 0  # the cache answered for states it had not searched from
