"""Delimiters that are one *ordinary* token: Qwen 2.5 and Qwen 3 add `<think>`, `</think>`,
`<tool_call>` and `</tool_call>` as tokens that are not special. `Delimiters` resolves them to
those ids, so the output parser counts only the token; the grammar side must take the same token
and nothing else where it writes the tag, or a tag spelled in pieces would be legal for the
grammar and no tag for the parser.

Each test runs on a small synthetic vocabulary and on Qwen's own 152k vocabulary (read from
DeepSeek-R1-Distill-Qwen-7B's GGUF metadata), where the tags are 151648, 151649, 151657, 151658.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from output_script import detokenize
from railcall import Tool, Vocabulary, allocate_bitmask, compiled_grammar, schema_grammar, tool_grammar
from railcall.bitmask import unpack_bitmask
from railcall.output import Delimiters, OutputParser
from railcall.runtime.regions import answer_matcher

TAGS = ["<think>", "</think>", "<tool_call>", "</tool_call>"]
LITERAL = {"type": "object", "properties": {"literal": {"type": "string"}}, "required": ["literal"]}


def synthetic_tags_vocab() -> Vocabulary:
    """Every byte a token, a few pieces, and the four tags as ordinary (not special) tokens."""
    pieces = [bytes([b]) for b in range(256)] + [b"<", b"think", b"tool", b"_call", b'{"', b'":"', b">"]
    pieces += [t.encode() for t in TAGS]
    return Vocabulary.from_pieces(pieces, specials=["<|im_end|>"], stop=["<|im_end|>"], name="added-tags")


@pytest.fixture(scope="module", params=["synthetic", pytest.param("qwen2", marks=pytest.mark.qwen2)])
def tags_vocab(request) -> Vocabulary:
    return synthetic_tags_vocab() if request.param == "synthetic" else request.getfixturevalue("qwen2_vocab")


def legal(m, vocab) -> set[int]:
    bm = allocate_bitmask(vocab.logits_width)
    m.fill_bitmask(bm)
    return set(np.flatnonzero(unpack_bitmask(bm, vocab.logits_width)).tolist())


def test_the_tags_resolve_to_ordinary_tokens(tags_vocab):
    d = Delimiters.from_vocab(tags_vocab)
    assert [x.token_id for x in d.all()] == [tags_vocab.lookup[t.encode()] for t in TAGS]
    assert not any(tags_vocab.is_special(x.token_id) for x in d.all())


# (what the grammar writes first, the tag it starts with)
STARTS = [
    ("reasoning", "<think>"),
    ("a Hermes call", "<tool_call>"),
]


@pytest.mark.parametrize("what,tag", STARTS, ids=[s[0] for s in STARTS])
def test_a_tag_is_its_token_alone(tags_vocab, what, tag):
    v = tags_vocab
    d = Delimiters.from_vocab(v)
    if what == "reasoning":
        m = answer_matcher(v, compiled_grammar(schema_grammar(LITERAL), v), d, reasoning=True)
    else:
        m = answer_matcher(v, compiled_grammar(tool_grammar([Tool("f")], "hermes"), v), d)
    tid = v.lookup[tag.encode()]
    assert legal(m, v) == {tid}  # not `<`, the first piece of the tag spelled out
    assert m.forced_tokens()[0] == tid
    assert not m.copy().consume_token(v.lookup[b"<"])


def test_a_hermes_call_between_tag_tokens_parses(tags_vocab):
    v = tags_vocab
    d = Delimiters.from_vocab(v)
    m = answer_matcher(v, compiled_grammar(tool_grammar([Tool("f")], "hermes"), v), d)
    ids = m.forced_tokens()
    assert all(m.consume_token(t) for t in ids) and m.is_done()
    assert ids[0] == d.call_open.token_id and ids[-1] == d.call_close.token_id
    p = OutputParser(d, stop_ids=v.stop_ids, tool_choice="required")
    for tid, text in detokenize(v, ids):
        p.feed(tid, text)
    p.finish()
    assert [(c.name, json.loads(c.arguments)) for c in p.result().tool_calls] == [("f", {})]


@pytest.mark.parametrize("tag", TAGS)
def test_a_tag_token_inside_an_argument_is_text(tags_vocab, tag):
    """Where the grammar expects no tag, a tag's ordinary token is text: legal inside a string,
    consumed by its bytes."""
    v = tags_vocab
    c = compiled_grammar(tool_grammar([Tool("f", "", LITERAL)], "hermes"), v)
    m = answer_matcher(v, c, Delimiters.from_vocab(v))
    prefix = m.forced_tokens()  # the tag and the keys, as far as the tokens are forced
    opened = '<tool_call>{"name":"f","arguments":{"literal":"'
    prefix += v.greedy_tokenize(opened[len(v.decode(prefix)):].encode())
    assert all(m.consume_token(t) for t in prefix)  # up to the string's opening quote
    tid = v.lookup[tag.encode()]
    assert tid in legal(m, v)
    assert m.consume_token(tid) and m.consume_token(v.lookup[b'"'])
    rest = m.forced_tokens()
    assert all(m.consume_token(t) for t in rest) and m.is_done()
    text = b"".join(v.token_bytes[t] for t in prefix[1:] + [tid, v.lookup[b'"']] + rest[:-1])
    assert json.loads(text)["arguments"] == {"literal": tag}


# (tokens before the close, as bytes, expected reasoning_content, expected content)
CUT_BEFORE_THE_CLOSE = [
    ("a whole character", [b"r", b"\xc3\xa9"], "ré", "ok"),
    ("an incomplete character", [b"r", b"\xc3"], "r\ufffd", "ok"),
]


@pytest.mark.parametrize("name,before,reasoning,content", CUT_BEFORE_THE_CLOSE, ids=[c[0] for c in CUT_BEFORE_THE_CLOSE])
def test_close_token_after_an_incomplete_character(tags_vocab, name, before, reasoning, content):
    """An ordinary close token's text goes through the incremental decoder, which releases the
    replacement character of an incomplete one before it in the same step; the close still counts."""
    v = tags_vocab
    d = Delimiters.from_vocab(v)
    flat = [t for piece in before for t in v.greedy_tokenize(piece)]
    ids = flat + [d.reasoning_close.token_id] + v.greedy_tokenize(b"ok")
    m = answer_matcher(v, None, d, mode="none", reasoning=True, reasoning_opened=True)
    assert all(m.consume_token(t) for t in ids) and m.phase_index == 1  # the grammar is in content
    p = OutputParser(d, stop_ids=v.stop_ids, reasoning_opened=True)
    steps = list(detokenize(v, ids))
    assert steps[len(flat)][1].endswith("</think>")
    for tid, text in steps:
        p.feed(tid, text)
    p.finish()
    assert (p.result().reasoning_content, p.result().content) == (reasoning, content)


# (phase, mode, tag, offered there): a free phase offers a tag token only as its exit
FREE_PHASES = [
    ("reasoning", "none", "</think>", True),
    ("reasoning", "none", "<think>", False),  # the parser would drop it
    ("reasoning", "auto", "<tool_call>", False),  # the parser would end reasoning and start a call
    ("reasoning", "none", "</tool_call>", False),
    ("content", "auto", "<tool_call>", True),
    ("content", "auto", "<think>", False),
    ("content", "none", "</think>", False),
    ("content", "none", "<tool_call>", False),
]


@pytest.mark.parametrize("phase,mode,tag,offered", FREE_PHASES)
def test_free_phases_offer_a_tag_token_only_as_their_exit(tags_vocab, phase, mode, tag, offered):
    v = tags_vocab
    d = Delimiters.from_vocab(v)
    answer = compiled_grammar(tool_grammar([Tool("f")], "hermes"), v) if mode == "auto" else None
    m = answer_matcher(v, answer, d, mode=mode, reasoning=phase == "reasoning", reasoning_opened=True)
    assert m.phase.kind == "free"
    tid = v.lookup[tag.encode()]
    assert (tid in legal(m, v)) == offered
    assert m.copy().consume_token(tid) == offered
    assert v.lookup[b"<"] in legal(m, v)  # the tag spelled in pieces is text


def test_the_server_writes_hermes_calls_where_the_tag_is_an_ordinary_token(tags_vocab):
    """Hermes where `<tool_call>` is one token, special or not; JSON where it is spelled in pieces."""
    from types import SimpleNamespace

    from railcall.server.model import ServedModel

    def served(vocab):
        lm = SimpleNamespace(tokenizer=SimpleNamespace(chat_template="{% for t in tools %}{% endfor %}"), name="m",
                             model=SimpleNamespace(config=SimpleNamespace(max_position_embeddings=512)))
        return ServedModel(lm, vocab)

    qwen_like = served(tags_vocab)
    assert (qwen_like.call_format, qwen_like.keys, qwen_like.reasoning) == ("hermes", ("name", "arguments"), True)
    assert qwen_like.delimiters.call_open.token_id == tags_vocab.lookup[b"<tool_call>"]
    pieces = served(Vocabulary.from_pieces([bytes([b]) for b in range(256)], specials=["<|im_end|>"],
                                           stop=["<|im_end|>"], name="bytes-only"))
    assert (pieces.call_format, pieces.keys) == ("json", ("tool", "args"))
