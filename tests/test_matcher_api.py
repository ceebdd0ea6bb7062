"""The Matcher's verbs and guarantees: masks, stop tokens, errors, rollback, forced tokens,
finish, the live table, read-only views, enumerated arguments, special-token call formats."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from railcall import (
    CompiledGrammar, GrammarError, Matcher, MatcherError, SchemaError, SchemaOptions, Tool, allocate_bitmask,
    apply_bitmask, read_only_view, schema_grammar, tool_grammar,
)
from railcall.bitmask import pack_ids, unpack_bitmask

PATH = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
TOOLS = [
    Tool("read_file", "Read a file", PATH),
    Tool("list_dir", "List a folder", PATH),
    Tool("write_file", "Write a file", {"type": "object", "properties": {"path": {"type": "string"}, "text": {"type": "string"}},
                                        "required": ["path", "text"]}, mutates=True),
]


def legal_text(m: Matcher) -> set[bytes]:
    v = m.g.vocab
    return {v.token_bytes[i] for i in m.legal_token_ids() if not v.special[i]}


def test_stop_tokens_only_when_complete(bytes_vocab):
    v = bytes_vocab
    m = Matcher(CompiledGrammar(tool_grammar(TOOLS), v))
    (end,) = v.stop_ids
    assert end not in m.legal_token_ids()
    assert not m.consume_token(end) and m.is_error()
    m = Matcher(CompiledGrammar(tool_grammar(TOOLS), v))
    assert m.consume_bytes(b'{"tool":"read_file","args":{"path":"x"}}')
    assert m.is_accepting() and m.is_done()
    assert m.legal_token_ids().tolist() == [end]  # complete: only the stop token
    assert m.consume_token(end) and m.is_done()


def test_illegal_token_is_an_error_state_not_an_exception(bytes_vocab):
    v = bytes_vocab
    m = Matcher(CompiledGrammar(tool_grammar(TOOLS), v))
    assert m.consume_token(v.lookup[b'{"'])
    assert not m.consume_token(v.lookup[b"x"])
    assert m.is_error() and "not allowed" in m.error_message
    assert not m.consume_token(v.lookup[b"tool"])  # it never leaves the error state
    assert m.legal_token_ids().tolist() == list(v.stop_ids)  # only stop tokens, to end the request
    m.rollback(1)  # ... unless the offending token is rolled back
    assert not m.is_error() and m.consume_token(v.lookup[b"tool"])
    assert not m.consume_token(10_000)  # outside the vocabulary: also just an error


def test_consume_bytes_after_an_error_or_a_stop_is_rejected(bytes_vocab):
    """consume_bytes agrees with consume_token: nothing is accepted in the error state or after
    the stop token."""
    v = bytes_vocab
    m = Matcher(CompiledGrammar(tool_grammar(TOOLS), v))
    assert m.consume_bytes(b'{"tool":"read_file"')
    assert not m.consume_token(v.lookup[b"x"]) and m.is_error()
    n = m.num_consumed()
    assert not m.consume_bytes(b',"args"') and not m.consume_bytes(b"")  # legal before the error
    assert m.is_error() and m.num_consumed() == n
    m.rollback(1)
    assert not m.is_error() and m.consume_bytes(b',"args"')

    m = Matcher(CompiledGrammar(schema_grammar({"type": "integer"}), v))
    assert m.consume_bytes(b"1") and m.consume_token(v.stop_ids[0])
    assert not m.consume_bytes(b"2") and m.is_error()  # legal before the stop token
    assert "after the stop token" in m.error_message
    m.rollback(1)
    assert m.is_done() and not m.is_error()


def test_rollback_restores_masks(bytes_vocab):
    v = bytes_vocab
    m = Matcher(CompiledGrammar(tool_grammar(TOOLS), v))
    first = m.legal_token_ids().tolist()
    ids = v.greedy_tokenize(b'{"tool":"list_dir","args":{"path":"a')
    assert m.consume_tokens(ids)
    mid = m.legal_token_ids().tolist()
    close = [v.lookup[b'"'], v.lookup[b"}}"]]
    assert m.consume_tokens(close) and m.is_accepting()
    m.rollback(2)
    assert m.legal_token_ids().tolist() == mid
    m.rollback(len(ids))
    assert m.legal_token_ids().tolist() == first
    with pytest.raises(MatcherError):
        m.rollback(1)


def test_bitmask_shape_is_checked(bytes_vocab):
    m = Matcher(CompiledGrammar(tool_grammar(TOOLS), bytes_vocab))
    with pytest.raises(MatcherError, match="allocate_bitmask"):
        m.fill_bitmask(np.zeros(3, dtype=np.int32))
    bm = allocate_bitmask(bytes_vocab.logits_width, batch=4)
    assert m.fill_bitmask(bm, index=2) == len(m.legal_token_ids())
    assert bm[0].sum() == 0 and bm[2].any()


def test_apply_bitmask_keeps_legal_logits(bytes_vocab):
    import torch

    width = bytes_vocab.logits_width + 5  # padding ids beyond the vocabulary are never legal
    legal = [3, 40, 41, 290]
    bm = pack_ids(legal, width)
    logits = np.random.default_rng(0).normal(size=width).astype(np.float32)
    want = logits.copy()
    apply_bitmask(logits, bm)
    assert np.array_equal(logits[legal], want[legal])
    assert np.isneginf(np.delete(logits, legal)).all()
    t = torch.tensor(want).repeat(2, 1)
    apply_bitmask(t, np.stack([bm, bm]))
    assert torch.equal(t[0], torch.tensor(logits)) and torch.equal(t[1], torch.tensor(logits))
    assert unpack_bitmask(bm, width).nonzero()[0].tolist() == legal


def test_forced_tokens_fast_forward(bpe_vocab):
    v = bpe_vocab
    one = [TOOLS[0]]
    m = Matcher(CompiledGrammar(tool_grammar(one), v))
    forced = m.forced_tokens()
    text = v.decode(forced)
    # a single tool: everything up to the path's value is forced
    assert b'{"tool":"read_file","args":{"path":"'.startswith(text) and len(text) > 20
    assert m.consume_tokens(forced)
    # the canonical tokenization of the forced text
    assert forced == v.encode(text.decode())
    # inside the value, the model chooses: nothing is forced
    m.consume_tokens(m.forced_tokens())
    m.consume_bytes(b"x")
    assert m.forced_tokens() == []
    # several tools: only the common prefix is forced
    m2 = Matcher(CompiledGrammar(tool_grammar(TOOLS), v))
    assert b'{"tool":"'.startswith(v.decode(m2.forced_tokens()))


def test_finish_fills_required_strings(bytes_vocab):
    v = bytes_vocab
    m = Matcher(CompiledGrammar(tool_grammar(TOOLS), v))
    m.consume_bytes(b'{"tool":"write_file","args":{"path":"')
    tail = m.finish()
    out = b'{"tool":"write_file","args":{"path":"' + v.decode(tail)
    assert json.loads(out) == {"tool": "write_file", "args": {"path": "?", "text": "?"}}
    assert m.is_accepting() and m.cut
    assert m.finish() == []  # already complete


def test_finish_inside_escapes_and_utf8(bytes_vocab):
    v = bytes_vocab
    for prefix in (b'{"tool":"read_file","args":{"path":"a\\', b'{"tool":"read_file","args":{"path":"a\\u0',
                   b'{"tool":"read_file","args":{"path":"\xf0\x9f', b'{"tool":"re'):
        m = Matcher(CompiledGrammar(tool_grammar(TOOLS), v))
        assert m.consume_bytes(prefix)
        out = prefix + v.decode(m.finish())
        call = json.loads(out)
        assert call["tool"] in {"read_file", "read", "list_dir", "write_file"}


def test_live_table_changes(bytes_vocab):
    v = bytes_vocab
    table = [TOOLS[0]]

    def name_bytes(tools):
        m = Matcher(CompiledGrammar(tool_grammar(tools), v))
        m.consume_bytes(b'{"tool":"')
        return {b[:1] for b in legal_text(m)}

    assert name_bytes(table) == {b"r"}
    table.append(Tool("zap", "", {"type": "object", "properties": {}}))  # added: callable on the next mask
    assert name_bytes(table) == {b"r", b"z"}
    table.remove(TOOLS[0])  # removed: unspellable at once
    assert name_bytes(table) == {b"z"}


def test_read_only_view_never_spells_a_mutating_tool(bytes_vocab):
    v = bytes_vocab
    view = read_only_view(TOOLS)
    assert [t.name for t in view] == ["read_file", "list_dir"]
    m = Matcher(CompiledGrammar(tool_grammar(view), v))
    m.consume_bytes(b'{"tool":"')
    assert b"w" not in {b[:1] for b in legal_text(m)} and b"write" not in legal_text(m)
    assert not Matcher(CompiledGrammar(tool_grammar(view), v)).consume_bytes(b'{"tool":"w')


def test_enumerated_argument_with_thousands_of_values(bpe_vocab):
    v = bpe_vocab
    files = [f"notes/day-{i:04d}.txt" for i in range(3000)]
    tool = Tool("read_file", "", {"type": "object", "properties": {"path": {"enum": files}}, "required": ["path"]})
    cg = CompiledGrammar(tool_grammar([tool]), v)
    m = Matcher(cg)
    assert m.consume_bytes(b'{"tool":"read_file","args":{"path":"notes/day-1')
    assert not m.copy().consume_bytes(b"x")
    assert m.consume_bytes(b'234.txt"}}') and m.is_accepting()
    m2 = Matcher(cg)
    assert not m2.consume_bytes(b'{"tool":"read_file","args":{"path":"notes/day-3000.txt"}}')
    # the threads stay few: one trie thread follows all 3000 values
    m3 = Matcher(cg)
    m3.consume_bytes(b'{"tool":"read_file","args":{"path":"notes/')
    assert len(cg._sets[m3.state]) == 1


def test_hermes_format_uses_special_tokens_by_id(bpe_vocab):
    v = bpe_vocab
    cg = CompiledGrammar(tool_grammar(TOOLS, "hermes"), v)
    m = Matcher(cg)
    open_id, close_id = v.special_id("<tool_call>"), v.special_id("</tool_call>")
    assert m.legal_token_ids().tolist() == [open_id]  # the tag only as its token
    assert not m.copy().consume_bytes(b"<tool_call>")  # spelled out as text it is not the tag
    assert m.consume_token(open_id)
    assert m.consume_bytes(b'{"name":"read_file","arguments":{"path":"a"}}')
    assert m.legal_token_ids().tolist() == [close_id]
    assert m.forced_tokens() == [close_id]
    assert m.consume_token(close_id) and m.is_accepting()


def test_masks_are_cached_and_coarsened(smollm2_vocab):
    v = smollm2_vocab
    cg = CompiledGrammar(tool_grammar(TOOLS), v)
    bm = allocate_bitmask(v.logits_width)
    path = b'{"tool":"read_file","args":{"path":"ab'

    def run(m):
        for b in path:
            m.fill_bitmask(bm)
            assert m.consume_bytes(bytes([b]))
        m.fill_bitmask(bm)

    m = Matcher(cg)
    run(m)
    before = cg.mask_computations
    for _ in range(60):  # deep inside the string, far from the cap: one shared mask
        m.consume_bytes(b"b")
        m.fill_bitmask(bm)
    assert cg.mask_computations == before
    # a second request on the same grammar computes nothing new along the same path
    run(Matcher(cg))
    assert cg.mask_computations == before


def test_grammar_errors():
    with pytest.raises(GrammarError, match="empty"):
        tool_grammar([])
    with pytest.raises(GrammarError, match="duplicate"):
        tool_grammar([TOOLS[0], TOOLS[0]])
    with pytest.raises(SchemaError) as e:
        tool_grammar([Tool("t", "", {"type": "object", "properties": {"p": {"type": "string", "not": {"type": "null"}}}})])
    assert e.value.keyword == "not" and e.value.pointer == "/properties/p"
    assert "lenient" in str(e.value)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        schema_grammar({"type": "string", "not": {"type": "null"}}, SchemaOptions(lenient=True))
    assert any("not" in str(x.message) for x in w)
    with pytest.raises(SchemaError) as e:  # required: no object fits (an optional one is left out)
        schema_grammar({"type": "object", "properties": {"s": {"type": "string", "minLength": 5, "maxLength": 2}},
                        "required": ["s"]})
    assert e.value.keyword == "minLength" and e.value.pointer == "/properties/s"


def test_live_table_change_recompiles_only_what_changed(bpe_vocab):
    """Adding a tool reuses the other tools' compiled instructions and their cached masks."""
    v = bpe_vocab
    bm = allocate_bitmask(v.logits_width)
    head, value = b'{"tool":"list_dir","args":{"path":"', b'notes/a.txt"}}'

    def walk(tools):
        cg = CompiledGrammar(tool_grammar(tools), v)
        m = Matcher(cg)
        for b in head + value:
            m.fill_bitmask(bm)
            assert m.consume_bytes(bytes([b]))
            if b == head[-1] and m.num_consumed() == len(head):
                inside = next(iter(cg._sets[m.state]))[0]
        return cg, inside

    cg1, ins1 = walk([TOOLS[1]])
    cg2, ins2 = walk([TOOLS[1], Tool("zz_new", "", PATH)])  # one tool added
    assert ins1 is ins2  # the unchanged tool's arguments: the very same compiled instructions
    # only masks before the name is committed are new (the name trie changed); none inside the call
    assert 0 < cg2.mask_computations <= len(b'{"tool":"list_dir"')


def longer_legal(m, forced, v):
    """Legal tokens that forcing the last of `forced` would take away: longer tokens that start
    with its bytes, legal where it starts."""
    mc = m.copy()
    assert mc.consume_tokens(forced[:-1])
    last = v.token_bytes[forced[-1]]
    return [t for t in mc.legal_token_ids().tolist() if len(v.token_bytes[t]) > len(last) and v.token_bytes[t].startswith(last)]


@pytest.mark.parametrize("props", [{"tags": {"type": "string"}}, {"n": {"type": "integer"}, "tags": {"type": "string"}},
                                   {"o": {"type": "object", "properties": {"x": {"type": "string"}}}}])
def test_forced_tokens_never_take_away_a_longer_token(bpe_vocab, props):
    """The forced run `write","args":{` tokenizes as ... `":` `{`: `{` has longer tokens and is left
    to the model, and then so must `":` be, since `":{"` crosses the run's end too."""
    v = bpe_vocab
    tools = [Tool("write", "", {"type": "object", "properties": props})]
    m = Matcher(CompiledGrammar(tool_grammar(tools), v))
    for prefix in (b'{"tool":"', b'{"tool":"wr', b""):
        mm = m.copy()
        assert mm.consume_bytes(prefix) if prefix else True
        forced = mm.forced_tokens()
        assert forced and longer_legal(mm, forced, v) == [], (prefix, [v.token_bytes[t] for t in forced])


def test_has_extension_sees_past_copies_of_the_prefix():
    from railcall.vocab import Vocabulary

    v = Vocabulary.from_pieces([bytes([b]) for b in range(32, 127)] + [b'"', b'"}', b'"}}'], name="dup-quote")
    assert v.has_extension(b'"') and v.has_extension(b'"}') and not v.has_extension(b'"}}')


@pytest.mark.parametrize("params, want", [
    ({"x": {"type": "number", "minimum": 1e9}}, {"x": 1000000000}),
    ({"x": {"type": "integer", "minimum": 123456789, "maximum": 123456799}}, {"x": 123456789}),
    ({"x": {"type": "number", "exclusiveMaximum": 10000123.456}, "y": {"type": "string", "minLength": 30}},
     {"x": 0, "y": "?" * 30}),
])
def test_finish_completes_bounded_numbers_with_long_shortest_values(bytes_vocab, params, want):
    """A bounded number keeps its digits in its state: ten layers of them (minimum 1e9) once
    outgrew the search for a forced finish."""
    tools = [Tool("f", "", {"type": "object", "properties": params, "required": list(params)})]
    m = Matcher(CompiledGrammar(tool_grammar(tools), bytes_vocab))
    assert m.consume_bytes(b'{"tool":"f","args":{"x":')
    tail = m.finish()
    assert m.is_accepting() and not m.is_error(), m.error_message
    out = json.loads(b'{"tool":"f","args":{"x":' + bytes_vocab.decode(tail))
    assert out["args"] == want


PRICE = {"type": "string", "pattern": "^[0-9]+\\.[0-9]{2}$"}


@pytest.mark.parametrize("params, required, want", [
    # an optional bounded number before a required free-form value: the number's digits (it keeps
    # its text, so each is a state of its own) filled every layer of the search, the way on to
    # the end was cut, and finish() ended in the error state after seconds of searching
    ({"n": {"type": "number", "maximum": 507}, "deep": {"type": "object", "required": ["path"]}}, ["deep"],
     {"deep": {"path": 0}}),
    # (three digits at most: the first search gets past them, with a longer completion than the
    # shortest, as documented; any valid one will do)
    ({"n": {"type": "integer", "minimum": 7, "maximum": 507}, "deep": {"type": "object", "required": ["path"]}},
     ["deep"], None),
    # a free-form value, an optional bounded number and a required nested object: neither cut
    # search gets past all three; a depth-first dive along the preferred bytes does
    ({"e": {"type": "object", "additionalProperties": True}, "b": {"type": "number", "minimum": -2.5, "maximum": 97.5},
      "xy": {"type": "object", "required": ["c", "n"], "properties": {
          "c": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
          "n": {"type": "integer", "minimum": 123456, "maximum": 123465}}}}, ["e", "xy"], None),
    # ... and where the first search finds the way, its completion is kept: a free-form value
    # before list items that must be written, an email after a list of bounded numbers
    ({"a": {}, "b": {"type": "array", "items": {"type": "array", "items": PRICE, "minItems": 2}, "minItems": 2}},
     ["a", "b"], {"a": 0, "b": [["0.00", "0.00"], ["0.00", "0.00"]]}),
    ({"n": {"type": "array", "prefixItems": [{"type": "null"}],
            "items": {"anyOf": [{"type": "number", "maximum": 0.5}, {"type": "integer"}]}},
      "e": {"type": "string", "format": "email"}}, ["n", "e"], {"n": [], "e": "?@0"}),
])
def test_finish_past_values_that_multiply_states(bytes_vocab, params, required, want):
    import jsonschema

    schema = {"type": "object", "properties": params, "required": required}
    m = Matcher(CompiledGrammar(tool_grammar([Tool("f", "", schema)]), bytes_vocab))
    tail = m.finish()
    assert m.is_accepting() and not m.is_error(), m.error_message
    call = json.loads(bytes_vocab.decode(tail))
    jsonschema.validate(call["args"], schema)
    assert want is None or call == {"tool": "f", "args": want}


FREE_EXTRAS = [
    Tool("a", "", {"type": "object", "properties": {"v": {"type": "string"}}, "required": ["v"], "additionalProperties": True}),
    Tool("b", "", {"type": "object", "properties": {"v": {"type": "integer"}}, "required": ["v"], "additionalProperties": True}),
]


@pytest.mark.parametrize("tools, fmt, parallel, want", [
    # the first tool's free-form extras branch out ten ways a byte and used to crowd the second
    # tool's shorter completion out of the search
    (FREE_EXTRAS, "hermes", False, '<tool_call>{"name":"b","arguments":{"v":0}}</tool_call>'),
    (FREE_EXTRAS, "hermes", True, '<tool_call>{"name":"b","arguments":{"v":0}}</tool_call>'),
    (FREE_EXTRAS, "json", False, '{"tool":"b","args":{"v":0}}'),
    # required keys with free-form values: each value opens a string, a number, a list, an object
    ([Tool("t", "", {"type": "object", "required": ["k\nl", 'k"l', "k\\l", "k\rl", "k\tl", "k\fl"]})], "json", False,
     '{"tool":"t","args":{"k\\nl":0,"k\\"l":0,"k\\\\l":0,"k\\rl":0,"k\\tl":0,"k\\fl":0}}'),
])
def test_finish_finds_the_shortest_call_past_free_form_values(bytes_vocab, tools, fmt, parallel, want):
    m = Matcher(CompiledGrammar(tool_grammar(tools, fmt, parallel=parallel), bytes_vocab))
    out = m.finish()
    assert m.is_accepting() and not m.is_error(), m.error_message
    assert "".join(bytes_vocab.token_text(t) for t in out) == want


def test_finish_closes_nested_free_form_values(bytes_vocab):
    m = Matcher(CompiledGrammar(tool_grammar(FREE_EXTRAS, "hermes"), bytes_vocab))
    assert m.consume_token(bytes_vocab.special_id("<tool_call>"))
    assert m.consume_bytes(b'{"name":"a","arguments":{"v":"x","q":[{"r":[1,')
    tail = "".join(bytes_vocab.token_text(t) for t in m.finish())
    assert m.is_accepting() and tail == '0]}]}}</tool_call>'


@pytest.mark.parametrize("parallel", [False, True])
def test_finish_with_text_tags_past_free_form_values(parallel):
    """The same where `<tool_call>` is not a special token (written as text): the longer literal
    gave the first tool's free-form extras more layers to crowd out the second tool."""
    from railcall.vocab import Vocabulary

    v = Vocabulary.from_pieces([bytes([b]) for b in range(32, 127)], specials=["<end>"], stop=["<end>"], name="ascii")
    m = Matcher(CompiledGrammar(tool_grammar(FREE_EXTRAS, "hermes", parallel=parallel), v))
    out = v.decode(m.finish()).decode()
    assert m.is_accepting() and out == '<tool_call>{"name":"b","arguments":{"v":0}}</tool_call>'
