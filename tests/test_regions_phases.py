"""Region matchers: reasoning ends only at the close token; delimiter tokens are text inside the
answer; "auto" hands a trigger's remainder to the call grammar. Driven by scripted token streams
(output_script.py) on single-token, multi-token and SmolLM2 vocabularies.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from output_script import Tok, detokenize, script
from railcall import Tool, Vocabulary, allocate_bitmask, compiled_grammar, schema_grammar, tool_grammar
from railcall.bitmask import unpack_bitmask
from railcall.errors import GrammarError
from railcall.output import Delimiters, OutputParser
from railcall.runtime.regions import answer_matcher

OPEN, CLOSE, CALL, END = Tok("<think>"), Tok("</think>"), Tok("<tool_call>"), Tok("</tool_call>")
LITERAL = {"type": "object", "properties": {"literal": {"type": "string"}}, "required": ["literal"]}
TOOLS = [Tool("read_file", "", {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}),
         Tool("calc", "", {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]})]


def legal(m, vocab, tid) -> bool:
    bm = allocate_bitmask(vocab.logits_width)
    m.fill_bitmask(bm)
    return bool(unpack_bitmask(bm, vocab.logits_width)[tid])


def drive(m, vocab, ids):
    """Consume `ids`, checking at every step that the mask and consume_token agree."""
    for t in ids:
        allowed = legal(m, vocab, t)
        assert m.consume_token(t) == allowed, (vocab.token_text(t), m.error_message)
        if not allowed:
            return False
    return True


def parse(vocab, ids, **options):
    p = OutputParser(Delimiters.from_vocab(vocab), stop_ids=vocab.stop_ids, **options)
    for tid, text in detokenize(vocab, ids):
        p.feed(tid, text)
    p.finish()
    return p.result()


def test_spelled_close_stays_reasoning_token_ends_it(vocab):
    d = Delimiters.from_vocab(vocab)
    answer = compiled_grammar(schema_grammar(LITERAL), vocab)
    m = answer_matcher(vocab, answer, d, reasoning=True)
    assert drive(m, vocab, script(vocab, OPEN, "I could write a </think>"))
    if d.reasoning_close.token_id is None:
        # Text fallback (documented): the spelled close ends reasoning; the answer follows.
        assert m.phase.kind == "grammar" and m.phase_index == 2
        return
    assert m.phase.kind == "free" and m.phase_index == 1  # still reasoning
    assert drive(m, vocab, script(vocab, " tag.", CLOSE))
    assert m.phase.kind == "grammar" and m.phase_index == 2


def test_structured_answer_may_contain_the_tag(vocab):
    """The close and open tokens are legal inside the answer's JSON string (as their text) and
    the parser returns them as text; a spelled tag is legal too."""
    d = Delimiters.from_vocab(vocab)
    answer = compiled_grammar(schema_grammar(LITERAL), vocab)
    m = answer_matcher(vocab, answer, d, reasoning=True)
    ids = script(vocab, OPEN, "plan", CLOSE, '{"literal":"', CLOSE, " and ", OPEN, " or </think>", '"}')
    assert drive(m, vocab, ids + [vocab.stop_ids[0]])
    assert m.is_done() and m.is_accepting()
    r = parse(vocab, ids)
    assert r.reasoning_content == "plan"
    assert json.loads(r.content) == {"literal": "</think> and <think> or </think>"}


def test_delimiter_token_is_illegal_where_its_text_is(bytes_vocab):
    d = Delimiters.from_vocab(bytes_vocab)
    m = answer_matcher(bytes_vocab, compiled_grammar(schema_grammar(LITERAL), bytes_vocab), d)
    close = d.reasoning_close.token_id
    assert not legal(m, bytes_vocab, close)  # `</think>` cannot start `{"literal":...}`
    assert not m.consume_token(close) and m.is_error()
    assert "not allowed" in m.error_message
    m.rollback(1)
    assert not m.is_error() and drive(m, bytes_vocab, script(bytes_vocab, '{"literal":"', CLOSE))


def test_reasoning_budget_forces_the_close(vocab):
    d = Delimiters.from_vocab(vocab)
    answer = compiled_grammar(schema_grammar(LITERAL), vocab)
    m = answer_matcher(vocab, answer, d, reasoning=True, reasoning_opened=True, reasoning_budget=3)
    assert m.forced_tokens() == []
    assert drive(m, vocab, script(vocab, "a", "b", "c"))
    forced = m.forced_tokens()
    assert vocab.decode(forced).decode() + "".join(vocab.special_text.get(t, "") for t in forced) == "</think>"
    assert not legal(m, vocab, script(vocab, "d")[0])  # nothing else
    assert drive(m, vocab, forced) and m.phase.kind == "grammar"


def test_id_outside_the_vocabulary_after_a_spent_budget_is_an_error(multi_vocab):
    """A spent reasoning budget whose close is text (no single token): an id past the vocabulary
    (the logits' padding) puts the matcher in its error state, as in every other phase."""
    v = multi_vocab
    d = Delimiters.from_vocab(v)
    assert d.reasoning_close.token_id is None
    answer = compiled_grammar(schema_grammar(LITERAL), v)
    for tid in (v.size, v.logits_width + 3, -1):
        m = answer_matcher(v, answer, d, reasoning=True, reasoning_opened=True, reasoning_budget=0)
        assert not m.consume_token(tid) and m.is_error(), tid
        assert "outside the vocabulary" in m.error_message
        assert not m.consume_token(tid) and m.is_error()  # and it stays there
        m.rollback(1)
        assert not m.is_error() and drive(m, v, m.forced_tokens()) and m.phase.kind == "grammar"


def test_finish_closes_reasoning_and_the_answer(vocab):
    d = Delimiters.from_vocab(vocab)
    answer = compiled_grammar(schema_grammar(LITERAL), vocab)
    m = answer_matcher(vocab, answer, d, reasoning=True)
    ids = script(vocab, OPEN, "cut here")
    assert drive(m, vocab, ids)
    tail = m.finish()
    assert m.is_accepting() and m.cut
    r = parse(vocab, ids + tail)
    assert r.reasoning_content == "cut here" and json.loads(r.content) == {"literal": "?"}  # the tell of a forced finish


@pytest.mark.parametrize("fmt", ["hermes", "json"])
def test_auto_mode_content_then_calls(vocab, fmt):
    d = Delimiters.from_vocab(vocab)
    grammar = compiled_grammar(tool_grammar(TOOLS, fmt), vocab)
    m = answer_matcher(vocab, grammar, d, mode="auto", reasoning=True)
    if fmt == "hermes":
        calls = [CALL, '{"name":"calc","arguments":{"expr":"1+1"}}', END, "\n",
                 CALL, '{"name":"read_file","arguments":{"path":"</tool_call>"}}', END]
    else:
        calls = ['{"tool":"calc","args":{"expr":"1+1"}}', " and ", '{"tool":"read_file","args":{"path":"</tool_call>"}}']
    ids = script(vocab, OPEN, "use a tool", CLOSE, "Sure: ", *calls, " done")
    assert drive(m, vocab, ids)
    assert m.is_accepting() and not m.is_done()
    assert drive(m, vocab, [vocab.stop_ids[0]]) and m.is_done()
    r = parse(vocab, ids, call_format=fmt)
    assert [(c.name, json.loads(c.arguments)) for c in r.tool_calls] == [
        ("calc", {"expr": "1+1"}), ("read_file", {"path": "</tool_call>"})]
    assert r.reasoning_content == "use a tool" and r.content.startswith("Sure: ") and r.content.endswith(" done")


def test_auto_mode_may_end_without_a_call(bytes_vocab):
    d = Delimiters.from_vocab(bytes_vocab)
    m = answer_matcher(bytes_vocab, compiled_grammar(tool_grammar(TOOLS, "hermes"), bytes_vocab), d, mode="auto")
    assert drive(m, bytes_vocab, script(bytes_vocab, "No tool needed.") + [bytes_vocab.stop_ids[0]])
    assert m.is_done() and not m.is_error()


def test_required_mode_has_no_free_text(bytes_vocab):
    d = Delimiters.from_vocab(bytes_vocab)
    m = answer_matcher(bytes_vocab, compiled_grammar(tool_grammar(TOOLS, "hermes"), bytes_vocab), d)
    assert m.forced_tokens()[:1] == [d.call_open.token_id]
    assert not m.consume_token(script(bytes_vocab, "S")[0])


def test_none_mode_is_free_text_until_stop(multi_vocab):
    d = Delimiters.from_vocab(multi_vocab)
    m = answer_matcher(multi_vocab, None, d, mode="none", reasoning=True, reasoning_opened=True)
    assert not legal(m, multi_vocab, multi_vocab.stop_ids[0])  # reasoning must close first
    assert drive(m, multi_vocab, script(multi_vocab, "r</think>answer") + [multi_vocab.stop_ids[0]])
    assert m.is_done()


def trigger_vocab() -> Vocabulary:
    """Bytes plus tokens that contain the whole JSON trigger and go on into the call."""
    pieces = [bytes([b]) for b in range(256)] + [b'x{"tool":"re', b'{"tool":"zz', b'{"tool":"', b'{"']
    return Vocabulary.from_pieces(pieces, specials=["<|end|>"], stop=["<|end|>"], name="trigger")


def test_text_trigger_hands_the_remainder_to_the_call():
    v = trigger_vocab()
    grammar = compiled_grammar(tool_grammar(TOOLS, "json"), v)
    m = answer_matcher(v, grammar, Delimiters.from_vocab(v), mode="auto")
    good, bad = v.lookup[b'x{"tool":"re'], v.lookup[b'{"tool":"zz']
    assert legal(m, v, good) and not legal(m, v, bad)  # "zz" starts no tool name
    assert drive(m, v, script(v, "ok ") + [good])
    assert m.phase.kind == "grammar"  # inside the call, after `re`
    assert m.forced_tokens() and drive(m, v, script(v, 'ad_file","args":{"path":"a"}}'))
    assert m.phase.kind == "free" and m.is_accepting()  # back to content after the call
    # a trigger split across tokens: `{"` then `tool":"` pieces
    assert drive(m, v, script(v, '{"', "t", "o", "o", "l", '"', ":", '"'))
    assert m.phase.kind == "grammar" and not legal(m, v, v.lookup[b"z"])


def test_rollback_across_phases(bytes_vocab):
    d = Delimiters.from_vocab(bytes_vocab)
    m = answer_matcher(bytes_vocab, compiled_grammar(schema_grammar(LITERAL), bytes_vocab), d, reasoning=True)
    before = allocate_bitmask(bytes_vocab.logits_width)
    assert drive(m, bytes_vocab, script(bytes_vocab, OPEN, "r"))
    m.fill_bitmask(before)
    other = m.copy()
    assert drive(m, bytes_vocab, script(bytes_vocab, CLOSE, '{"'))
    assert m.phase.kind == "grammar" and other.phase.kind == "free"  # the copy is independent
    m.rollback(2)
    after = allocate_bitmask(bytes_vocab.logits_width)
    m.fill_bitmask(after)
    assert m.phase.kind == "free" and np.array_equal(before, after)
    with pytest.raises(Exception, match="cannot roll back"):
        m.rollback(99)


def test_misuse_says_what_to_do(bytes_vocab):
    d = Delimiters.from_vocab(bytes_vocab)
    answer = compiled_grammar(schema_grammar(LITERAL), bytes_vocab)
    with pytest.raises(GrammarError, match="mode='none'"):
        answer_matcher(bytes_vocab, None, d)
    with pytest.raises(GrammarError, match="trigger="):
        answer_matcher(bytes_vocab, answer, d, mode="auto")
    with pytest.raises(GrammarError, match="unknown mode"):
        answer_matcher(bytes_vocab, answer, d, mode="any")


def test_a_spent_budget_offers_every_token_of_the_close():
    """With a text close, a spent reasoning budget offers every token that continues the close,
    also where two tokens spell the same bytes (Gemma's `k` and `<0x6B>`); forced_tokens()
    returns the tokenizer's own encoding, which must be among them."""
    pieces = [bytes([b]) for b in range(256)] + [b"</", b"think", b"think"]  # the last: a second "think"
    v = Vocabulary.from_pieces(pieces, specials=["<|end|>"], stop=["<|end|>"], name="same-bytes")
    lt, think2 = v.lookup[b"</"], len(pieces) - 1
    v.encoder = lambda s: {"</think>": [lt, think2, v.lookup[b">"]]}.get(s) or v.greedy_tokenize(s.encode())
    d = Delimiters.from_vocab(v)
    assert d.reasoning_close.token_id is None
    m = answer_matcher(v, None, d, mode="none", reasoning=True, reasoning_opened=True, reasoning_budget=1)
    assert drive(m, v, script(v, "a"))
    forced = m.forced_tokens()
    assert forced == [lt, think2, v.lookup[b">"]]
    assert drive(m, v, forced) and m.phase_index == 1  # drive checks each against the mask


@pytest.mark.parametrize("opening", ['{"tool":"', '{\n    "tool": "', '{ "tool" :"', '{\r\n\t"tool":\n"'])
def test_the_json_trigger_takes_the_whitespace_json_allows(vocab, opening):
    """A model writes `{\\n    "tool": "` as readily as the compact form: both start a call, in
    the grammar and in the parser alike; from the trigger on the call grammar holds (compact)."""
    grammar = compiled_grammar(tool_grammar(TOOLS, "json"), vocab)
    m = answer_matcher(vocab, grammar, Delimiters.from_vocab(vocab), mode="auto")
    ids = script(vocab, "Let me check.\n", opening)
    assert drive(m, vocab, ids) and m.phase.kind == "grammar"
    assert not legal(m, vocab, script(vocab, "z")[0])  # inside the call: only a tool's name
    rest = script(vocab, 'calc","args":{"expr":"2*3"}}')
    assert drive(m, vocab, rest) and m.phase.kind == "free"
    r = parse(vocab, ids + rest, call_format="json")
    assert [(c.name, json.loads(c.arguments)) for c in r.tool_calls] == [("calc", {"expr": "2*3"})]
    assert r.content.strip() == "Let me check."


@pytest.mark.parametrize("text", ['{"tools": 1}', '{ "toolbox": "x"}', '{\n  "name": "calc"}', "{ } and {\n}"])
def test_json_that_is_not_a_call_stays_content(vocab, text):
    grammar = compiled_grammar(tool_grammar(TOOLS, "json"), vocab)
    m = answer_matcher(vocab, grammar, Delimiters.from_vocab(vocab), mode="auto")
    ids = script(vocab, text)
    assert drive(m, vocab, ids + [vocab.stop_ids[0]]) and m.is_done()
    r = parse(vocab, ids, call_format="json")
    assert r.tool_calls == [] and r.content == text
