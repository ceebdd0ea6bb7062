"""A turn as a grammar construct (railcall.grammar.turn, compiled by railcall.matcher.turn):
structural tags with several triggers in free text, token and text triggers, a trigger's
remainder handed to its grammar, the refusals, and random walks whose tagged parts are checked
by an independent reader (json + jsonschema) on real vocabularies."""

from __future__ import annotations

import json
import random
import re

import jsonschema
import numpy as np
import pytest

from railcall import Matcher, allocate_bitmask, compiled_grammar, schema_grammar
from railcall.bitmask import unpack_bitmask
from railcall.errors import GrammarError
from railcall.grammar import ir
from railcall.grammar.turn import Free, Reasoning, Tag, Trigger, Turn, structural_tag
from railcall.matcher.turn import compiled_turn, turn_matcher

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
           "required": ["city"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}, "h24": {"type": "boolean"}},
        "required": ["zone"], "additionalProperties": False}
NOTE = {"type": "string", "maxLength": 10}
STRUCTURES = [("<function=weather>", WEATHER, "</function>"), ("<function=time>", TIME, "</function>"),
              ("<note>", NOTE, "</note>")]
TRIGGERS = ["<function=", "<note>"]
PART = re.compile(r"(<function=(weather|time)>|<note>)(.*?)(</function>|</note>)", re.S)


def tags():
    return structural_tag([(b, schema_grammar(s), e) for b, s, e in STRUCTURES], TRIGGERS)


def mask(m, vocab) -> np.ndarray:
    """The legal token ids; the count fill_bitmask returns (kept with a mask, not counted each
    time) must be the mask's."""
    bm = allocate_bitmask(vocab.logits_width)
    n = m.fill_bitmask(bm)
    legal = unpack_bitmask(bm, vocab.logits_width)
    assert n == int(legal.sum()), (n, int(legal.sum()))
    return np.flatnonzero(legal[: vocab.size])


def encode(vocab, text: str) -> list[int]:
    ids = vocab.encode(text)
    return ids if ids is not None else vocab.greedy_tokenize(text.encode())


def check_parts(text: str) -> int:
    """Every tagged part of `text` is its structure's JSON under its schema; free text between
    them holds no trigger. Returns how many parts there were."""
    schemas = {"weather": WEATHER, "time": TIME}
    n, at = 0, 0
    for hit in PART.finditer(text):
        free = text[at:hit.start()]
        assert "<function=" not in free and "<note>" not in free, text
        begin, name, body, end = hit.groups()
        assert end == ("</note>" if begin == "<note>" else "</function>"), text
        jsonschema.validate(json.loads(body), NOTE if begin == "<note>" else schemas[name])
        n, at = n + 1, hit.end()
    tail = text[at:]
    # an unfinished part may stand at the end only
    for trig in TRIGGERS:
        if trig in tail:
            assert PART.search(tail) is None
    return n


def test_structural_tag_groups_structures_under_their_trigger():
    free = tags()
    assert [t.trigger.text for t in free.tags] == TRIGGERS
    assert isinstance(free.tags[0].grammar.start, ir.Alt)  # two structures begin with "<function="


@pytest.mark.parametrize("structures, triggers, says", [
    ([], ["<a"], "at least one structure"),
    ([("<a>", True, "</a>")], [], "at least one trigger"),
    ([("<b>", True, "</b>")], ["<a"], "starts with none of the triggers"),
    ([("<a>", True, "</a>")], ["<a", "<x"], "begins no structure"),
    ([("<ab>", True, "</a>"), ("<a>", True, "</a>")], ["<a", "<ab"], "contains trigger"),
])
def test_structural_tag_refusals_say_what_to_change(structures, triggers, says):
    with pytest.raises(GrammarError, match=says):
        structural_tag([(b, schema_grammar(s if s is not True else {}), e) for b, s, e in structures], triggers)


def test_turn_key_is_the_content():
    a, b = Turn(tags()), Turn(tags())
    assert a.key == b.key
    assert Turn(tags(), Reasoning("</think>")).key != a.key
    assert Turn(Free()).key != a.key


def test_turn_refuses_a_body_that_is_neither():
    with pytest.raises(GrammarError, match="ir.Grammar or a Free"):
        Turn({"type": "object"})


def test_a_tag_grammar_must_start_with_its_trigger(bytes_vocab):
    g = schema_grammar(WEATHER)  # starts with "{", not with "<w>"
    with pytest.raises(GrammarError, match="does not start with its trigger"):
        compiled_turn(Turn(Free((Tag(Trigger("<w>"), g),))), bytes_vocab)


def test_a_token_trigger_needs_one_token(bytes_vocab):
    g = ir.Grammar(ir.Seq(ir.Lit(b"<w>"), schema_grammar(WEATHER).start))
    with pytest.raises(GrammarError, match="no one token"):
        compiled_turn(Turn(Free((Tag(Trigger("<w>", token=True), g),))), bytes_vocab)


@pytest.mark.parametrize("which", ["smollm2", "qwen2"])
def test_scripted_parts_and_free_text(request, which):
    vocab = request.getfixturevalue(f"{which}_vocab")
    m = turn_matcher(Turn(tags()), vocab)
    # encoded whole, as the model's tokenizer spells it: tokens run across a part's begin and
    # end (`>.` closes the last part and starts the text after it)
    text = ('Let me check. <function=weather>{"city":"Oslo"}</function> and a <note>"hi"</note> done, '
            'then <function=time>{"zone":"CET","h24":true}</function>.')
    for t in encode(vocab, text):
        assert t in set(mask(m, vocab)), (vocab.token_text(t), m.error_message)
        assert m.consume_token(t), m.error_message
    assert m.is_accepting() and m.in_free_text()
    assert set(vocab.stop_ids) <= set(mask(m, vocab))


def test_inside_a_part_the_schema_rules(smollm2_vocab):
    vocab = smollm2_vocab
    m = turn_matcher(Turn(tags()), vocab)
    for t in encode(vocab, "ok <function=weather>"):
        assert m.consume_token(t), m.error_message
    assert not m.in_free_text() and not m.is_accepting()
    assert not (set(vocab.stop_ids) & set(mask(m, vocab)))  # the turn cannot end inside a part
    legal = mask(m, vocab)
    assert all(vocab.token_bytes[t].startswith(b"{") for t in legal)
    n = m.num_consumed()
    assert not m.consume_token(encode(vocab, "hello")[0]) and m.is_error()
    m.rollback(m.num_consumed() - n)
    assert not m.is_error()
    for t in encode(vocab, '{"city":"Oslo"}</function>'):
        assert m.consume_token(t), m.error_message
    assert m.in_free_text() and m.is_accepting()


def test_a_token_may_run_from_a_parts_end_into_the_text(smollm2_vocab):
    vocab = smollm2_vocab
    m = turn_matcher(Turn(tags()), vocab)
    for t in encode(vocab, 'See <function=weather>{"city":"Oslo"}</function'):
        assert m.consume_token(t), m.error_message
    runs_on = vocab.lookup[b">."]
    assert runs_on in set(mask(m, vocab))
    # the end's last token is the model's to choose (`>` or `>.`), so it is not forced
    assert m.forced_tokens() == []
    n = m.num_consumed()
    assert m.consume_token(runs_on) and m.in_free_text() and m.is_accepting()
    m.rollback(m.num_consumed() - n)  # back inside the part, before its last byte
    assert not m.in_free_text() and not m.is_accepting()
    assert m.consume_token(vocab.lookup[b">"]) and m.in_free_text()
    m.rollback(1)
    # exactly the tokens that end the part and go on with free text are offered
    legal = set(int(t) for t in mask(m, vocab))
    expect = {t for t in range(vocab.size) if not vocab.is_special(t) and vocab.token_bytes[t].startswith(b">")}
    assert legal == expect


def test_the_end_of_a_part_is_fast_forwarded_but_its_last_token(smollm2_vocab):
    vocab = smollm2_vocab
    m = turn_matcher(Turn(tags()), vocab)
    for t in encode(vocab, 'See <function=weather>{"city":"Oslo"}'):
        assert m.consume_token(t), m.error_message
    forced = m.forced_tokens()
    end = b"".join(vocab.token_bytes[t] for t in forced)
    assert b"</function>".startswith(end) and end != b"</function>", end


def test_a_trigger_written_byte_by_byte_starts_its_part(bytes_vocab):
    vocab = bytes_vocab
    m = turn_matcher(Turn(tags()), vocab)
    for b in b'x <note>':
        assert m.consume_token(vocab.lookup[bytes([b])]), m.error_message
    assert not m.in_free_text()
    for b in b'"a"</note>':
        assert m.consume_token(vocab.lookup[bytes([b])]), m.error_message
    assert m.in_free_text()


def test_what_follows_a_trigger_inside_its_token_is_checked(smollm2_vocab):
    """A token that completes the trigger and goes on is legal only where its rest is a legal
    start of the tag's grammar (checked here by the grammar's own Matcher on the bytes)."""
    vocab = smollm2_vocab
    grammar = ir.Grammar(ir.Seq(ir.Lit(b"<w>"), schema_grammar(WEATHER).start))
    m = turn_matcher(Turn(Free((Tag(Trigger("<w"), grammar),))), vocab)
    for t in encode(vocab, "a <"):
        assert m.consume_token(t)
    legal = set(int(t) for t in mask(m, vocab))
    alone = compiled_grammar(grammar, vocab)
    starting_w = [t for t in range(vocab.size) if vocab.token_bytes[t].startswith(b"w") and not vocab.is_special(t)]
    for t in starting_w:
        assert (t in legal) == Matcher(alone).consume_bytes(b"<" + vocab.token_bytes[t]), vocab.token_text(t)
    assert any(t not in legal for t in starting_w) and any(t in legal for t in starting_w)


@pytest.mark.parametrize("which", ["smollm2", "qwen2", "gemma3"])
def test_random_walks_give_valid_parts(request, which):
    """Sampled walks (uniform over the mask, with a pull toward the triggers so that parts
    occur): the mask and consume_token agree on every step, and every tagged part is valid."""
    vocab = request.getfixturevalue(f"{which}_vocab")
    turn = Turn(tags())
    rng = random.Random(7)
    begins = [encode(vocab, b) for b, _, _ in STRUCTURES]
    parts = 0
    for walk in range(12):
        m = turn_matcher(turn, vocab)
        out: list[int] = []
        plan: list[int] = []  # a begin being written, token by token
        for step in range(90):
            legal = set(int(t) for t in mask(m, vocab))
            assert legal, m.error_message
            if m.in_free_text() and step > 60 and rng.random() < 0.5 and set(vocab.stop_ids) & legal:
                break
            if not plan and m.in_free_text() and rng.random() < 0.25:
                plan = list(rng.choice(begins))
            t = plan.pop(0) if plan else rng.choice(sorted(legal))
            if t in vocab.stop_ids:
                break
            assert t in legal, (vocab.token_text(t), [vocab.token_text(x) for x in out[-5:]])
            assert m.consume_token(t), (vocab.token_text(t), m.error_message)
            out.append(t)
        out += m.finish()  # close an unfinished part so the reader sees it whole
        assert m.is_accepting()
        parts += check_parts(b"".join(vocab.token_bytes[t] for t in out).decode("utf-8", "replace"))
    assert parts >= 6, parts


def test_started_names_the_tag_a_token_started(smollm2_vocab):
    """What the reply's reader is told: which tag (by index) the last token started, if any."""
    vocab = smollm2_vocab
    m = turn_matcher(Turn(tags()), vocab)
    seen = []
    for t in encode(vocab, 'a <note>"x"</note> b <function=wea'):
        assert m.consume_token(t), m.error_message
        seen.append(m.started)
    assert [s for s in seen if s is not None] == [1, 0]  # "<note>" is tag 1, "<function=" tag 0
    m.rollback(1)
    assert m.started is None
