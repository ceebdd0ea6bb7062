"""OutputParser: delimiters switch modes only where their token was generated.

Each case is a scripted token stream (see output_script.py: a scripted backend emitting given
ids) with two expectations: where `<think>`, `</think>`, `<tool_call>` are single tokens
("token"), and where they are not and fall back to text matching ("text": SmolLM2, and a
synthetic byte vocabulary). The "text" column is the documented limitation, pinned.
"""

from __future__ import annotations

import json

import pytest

from output_script import Tok, detokenize, script
from railcall.errors import RailcallError
from railcall.output import Delimiters, OutputParser

OPEN, CLOSE, CALL, END = Tok("<think>"), Tok("</think>"), Tok("<tool_call>"), Tok("</tool_call>")


def run(vocab, parts, **options):
    d = Delimiters.from_vocab(vocab)
    p = OutputParser(d, stop_ids=vocab.stop_ids, **options)
    deltas = []
    for tid, text in detokenize(vocab, script(vocab, *parts)):
        deltas += p.feed(tid, text)
    deltas += p.finish()
    r = p.result()
    # The deltas add up to the result, in order.
    assert "".join(x.text for x in deltas if x.kind == "reasoning") == r.reasoning_content
    assert "".join(x.text for x in deltas if x.kind == "content").strip() == r.content.strip()
    assert [x.call for x in deltas if x.kind == "tool_call"] == r.tool_calls
    return r, d


# (name, parts, options, expected with token delimiters, expected with text delimiters)
# expected: (reasoning_content, content, [(name, arguments dict)])
CASES = [
    ("spelled tags stay text in reasoning and content",
     [OPEN, "plan a</think>b", CLOSE, "answer <think> x"], {},
     ("plan a</think>b", "answer <think> x", []),
     ("plan a", "b</think>answer <think> x", [])),
    ("spelled tags in content only", ["Use </think> and <think> tags"], {},
     ("", "Use </think> and <think> tags", []),
     ("", "Use </think> and <think> tags", [])),
    ("reasoning opened by the prompt", ["r1 <think> r2", CLOSE, "c"], {"reasoning_opened": True},
     ("r1 <think> r2", "c", []),
     ("r1 <think> r2", "c", [])),
    ("leading close token is dropped", [CLOSE, "hello"], {},
     ("", "hello", []),
     ("", "</think>hello", [])),
    ("leading spelled close stays content", ["</think>hello"], {},
     ("", "</think>hello", []),
     ("", "</think>hello", [])),
    ("leading whitespace before reasoning", ["\n", OPEN, "r", CLOSE, "\n\nc"], {},
     ("r", "\n\nc", []),
     ("r", "\n\nc", [])),
    ("a tool call after reasoning", [OPEN, "r", CLOSE, CALL, '{"name":"f","arguments":{"a":1}}', END], {},
     ("r", "", [("f", {"a": 1})]),
     ("r", "", [("f", {"a": 1})])),
    ("close tag spelled inside an argument", [CALL, '{"name":"f","arguments":{"a":"</tool_call>x"}}', END], {},
     ("", "", [("f", {"a": "</tool_call>x"})]),
     ("", "", [("f", {"a": "</tool_call>x"})])),
    ("close token inside an argument string", [CALL, '{"name":"f","arguments":{"a":"', END, '"}}', END], {},
     ("", "", [("f", {"a": "</tool_call>"})]),
     ("", "", [("f", {"a": "</tool_call>"})])),
    ("parallel calls", [CALL, '{"name":"f","arguments":{}}', END, "\n", CALL, '{"name":"g","arguments":{"b":"</think>"}}', END], {},
     ("", "", [("f", {}), ("g", {"b": "</think>"})]),
     ("", "", [("f", {}), ("g", {"b": "</think>"})])),
    ("spelled call tag in content", ["write <tool_call> like this"], {},
     ("", "write <tool_call> like this", []),
     ("", "write <tool_call> like this", [])),
    ("spelled call tag in reasoning", [OPEN, "then <tool_call>", CLOSE, "ok"], {},
     ("then <tool_call>", "ok", []),
     ("then <tool_call>", "ok", [])),
    ("tool_choice none leaves calls as text", [CALL, '{"name":"f","arguments":{}}', END], {"tool_choice": "none"},
     ("", '<tool_call>{"name":"f","arguments":{}}</tool_call>', []),
     ("", '<tool_call>{"name":"f","arguments":{}}</tool_call>', [])),
    ("a body that is not a call stays content", [CALL, '{"x":1}', END, " ok"], {},
     ("", '<tool_call>{"x":1}</tool_call> ok', []),
     ("", '<tool_call>{"x":1}</tool_call> ok', [])),
    ("reasoning delimiter tokens inside a structured answer are text",
     [OPEN, "r", CLOSE, '{"literal":"', OPEN, " and ", CLOSE, '"}'], {},
     ("r", '{"literal":"<think> and </think>"}', []),
     ("r", '{"literal":"<think> and </think>"}', [])),
    ("json format, required: the content is the call",
     [OPEN, "r", CLOSE, ' {"tool":"f","args":{"p":"</think>"}}'], {"call_format": "json", "tool_choice": "required"},
     ("r", "", [("f", {"p": "</think>"})]),
     ("r", "", [("f", {"p": "</think>"})])),
    ("json format, required, parallel array",
     ['[{"tool":"f","args":{}},{"tool":"g","args":{"n":2}}]'], {"call_format": "json", "tool_choice": "required"},
     ("", "", [("f", {}), ("g", {"n": 2})]),
     ("", "", [("f", {}), ("g", {"n": 2})])),
    ("json format, auto: trigger text starts a call",
     ['Sure. {"tool":"f","args":{"s":"}{"}} {"tool":"g","args":{}} done'], {"call_format": "json"},
     ("", "Sure.   done", [("f", {"s": "}{"}), ("g", {})]),
     ("", "Sure.   done", [("f", {"s": "}{"}), ("g", {})])),
    ("json format, auto: other JSON is content",
     ['{"other":"tool"}'], {"call_format": "json"},
     ("", '{"other":"tool"}', []),
     ("", '{"other":"tool"}', [])),
]


@pytest.mark.parametrize("name,parts,options,token_expect,text_expect", CASES, ids=[c[0] for c in CASES])
def test_parser_table(vocab, name, parts, options, token_expect, text_expect):
    r, d = run(vocab, parts, **options)
    tokens = d.reasoning_close.token_id is not None
    reasoning, content, calls = token_expect if tokens else text_expect
    assert (r.reasoning_content, r.content) == (reasoning, content)
    assert [(c.name, json.loads(c.arguments)) for c in r.tool_calls] == calls


def test_which_vocabularies_have_token_delimiters(bytes_vocab, bpe_vocab, multi_vocab, smollm2_vocab):
    for v in (bytes_vocab, bpe_vocab):
        d = Delimiters.from_vocab(v)
        assert all(x.token_id is not None and v.special_text[x.token_id] == x.text for x in d.all())
    for v in (multi_vocab, smollm2_vocab):
        assert [x.token_id for x in Delimiters.from_vocab(v).all()] == [None] * 4


def _feed_all(p, steps):
    out = []
    for tid, text in steps:
        out += p.feed(tid, text)
    return out


@pytest.mark.parametrize("where", ["reasoning", "content"])
def test_held_text_is_released_at_finish(bytes_vocab, where):
    """A delimiter token whose text has only partly arrived holds that text; finish releases it
    as ordinary text of the current mode, cancel discards it."""
    d = Delimiters.from_vocab(bytes_vocab)
    a = bytes_vocab.lookup[b"abc"]
    if where == "reasoning":
        steps = [(d.reasoning_open.token_id, "<think>"), (a, "abc"), (d.reasoning_close.token_id, "</thi")]
    else:
        steps = [(a, "abc"), (d.call_open.token_id, "<tool")]
    held = steps[-1][1]
    p = OutputParser(d)
    streamed = "".join(x.text for x in _feed_all(p, steps))
    assert streamed == "abc"  # the partial delimiter text is held, not streamed
    released = p.finish()
    assert [(x.kind, x.text) for x in released] == [(where, held)]
    r = p.result()
    assert (r.reasoning_content if where == "reasoning" else r.content) == "abc" + held

    p = OutputParser(d)
    _feed_all(p, steps)
    p.cancel()
    r = p.result()
    assert (r.reasoning_content if where == "reasoning" else r.content) == "abc"
    with pytest.raises(RailcallError, match="one parser per request"):
        p.feed(a, "abc")


def test_delimiter_text_arriving_later_switches_at_its_offset(bytes_vocab):
    d = Delimiters.from_vocab(bytes_vocab)
    a = bytes_vocab.lookup[b"abc"]
    p = OutputParser(d, reasoning_opened=True)
    assert [(x.kind, x.text) for x in p.feed(a, "x")] == [("reasoning", "x")]
    assert p.feed(d.reasoning_close.token_id, "</th") == []  # held: may still be the close
    out = p.feed(a, "ink>ans")
    assert [(x.kind, x.text) for x in out] == [("content", "ans")]
    p.finish()
    assert (p.result().reasoning_content, p.result().content) == ("x", "ans")


def test_text_fallback_holds_a_possible_delimiter(multi_vocab):
    d = Delimiters.from_vocab(multi_vocab)
    p = OutputParser(d, reasoning_opened=True)
    out = _feed_all(p, [(0, "why </th")])
    assert [(x.kind, x.text) for x in out] == [("reasoning", "why ")]  # "</th" might be the close
    assert [(x.kind, x.text) for x in p.feed(0, "e")] == [("reasoning", "</the")]  # it was not
    assert [(x.kind, x.text) for x in p.finish()] == []


def test_unclosed_call_is_content_at_finish(bytes_vocab):
    d = Delimiters.from_vocab(bytes_vocab)
    p = OutputParser(d)
    _feed_all(p, [(d.call_open.token_id, "<tool_call>"), (0, '{"name":"f"')])
    assert [(x.kind, x.text) for x in p.finish()] == [("content", '<tool_call>{"name":"f"')]
    assert p.result().tool_calls == []


def test_resolution_needs_the_round_trip():
    """A text that encodes to one token which decodes to something else keeps no token id."""
    from railcall.vocab import single_token
    from railcall.vocab import Vocabulary

    v = Vocabulary.from_pieces(["a", "b"], specials=["<|end|>", "<think>"], stop=["<|end|>"])
    assert single_token(v, "<think>") == 3
    v.encoder = lambda s: [3] if s == "<THINK>" else [0, 1]
    assert single_token(v, "<THINK>") is None  # decodes to "<think>"
    assert single_token(v, "<think>") is None  # two tokens


def test_bad_options_say_what_to_do(bytes_vocab, multi_vocab):
    with pytest.raises(RailcallError, match="pair of non-empty strings"):
        Delimiters.from_vocab(bytes_vocab, reasoning=("<think>",))
    with pytest.raises(RailcallError, match="tool_call="):
        OutputParser(Delimiters.from_vocab(bytes_vocab, tool_call=None))
    with pytest.raises(RailcallError, match="unknown tool_choice"):
        OutputParser(Delimiters.from_vocab(bytes_vocab), tool_choice="any")
    assert Delimiters.from_vocab(bytes_vocab) is Delimiters.from_vocab(bytes_vocab)  # once per model


# (arguments as generated, the arguments string the parser returns)
NUMBERS = [
    ('{"x":1e999}', '{"x":1e999}'),  # beyond a double: a float would make it Infinity, not JSON
    ('{"x":-1E+400,"y":[2.5e-999]}', '{"x":-1E+400,"y":[2.5e-999]}'),
    ('{"x":0.10000000000000000001}', '{"x":0.10000000000000000001}'),  # not rounded to 0.1
    ('{"x":3E20,"n":-0,"k":' + "9" * 5000 + "}", '{"x":3E20,"n":-0,"k":' + "9" * 5000 + "}"),
    ('{"s":"1e999","t":true,"u":null,"v":{"w":"é"}}', '{"s":"1e999","t":true,"u":null,"v":{"w":"é"}}'),
]


@pytest.mark.parametrize("fmt", ["json", "hermes"])
@pytest.mark.parametrize("args,expect", NUMBERS)
def test_arguments_keep_numbers_as_written(bytes_vocab, fmt, args, expect):
    """Every JSON number the grammar allows comes back as strict JSON with the value written."""
    if fmt == "json":
        r, _ = run(bytes_vocab, ['{"tool":"f","args":' + args + "}"], call_format="json", tool_choice="required")
    else:
        r, _ = run(bytes_vocab, [CALL, '{"name":"f","arguments":' + args + "}", END])
    assert [(c.name, c.arguments) for c in r.tool_calls] == [("f", expect)]
    json.loads(r.tool_calls[0].arguments, parse_int=str, parse_constant=lambda name: pytest.fail(f"{name} is not JSON"))


def test_a_body_with_a_non_json_constant_is_not_a_call(bytes_vocab):
    r, _ = run(bytes_vocab, ['{"tool":"f","args":{"x":NaN}}'], call_format="json", tool_choice="required")
    assert r.tool_calls == [] and r.content == '{"tool":"f","args":{"x":NaN}}'


def test_streamed_calls_written_in_one_piece_keep_their_own_arguments():
    """Two parallel calls arriving in one feed: each call's argument pieces stay with their
    call's index (adjacent pieces of different calls are not merged into one delta)."""
    p = OutputParser(Delimiters(), call_format="json", tool_choice="required", stream_calls=True)
    out = p.feed(-1, '[{"tool":"a","args":{"x":1}},{"tool":"b","args":{"y":2}}]') + p.finish()
    pieces = [(d.kind, d.text, d.index) for d in out if d.kind in ("call_name", "call_args")]
    assert pieces == [("call_name", "a", 0), ("call_args", '{"x":1}', 0),
                      ("call_name", "b", 1), ("call_args", '{"y":2}', 1)]


@pytest.mark.parametrize("fmt, call", [("json", '{"tool":"f","args":{}}'), ("openai", '{"name":"f","arguments":{}}')])
def test_grammar_calls_take_a_call_only_where_the_grammar_started_one(bytes_vocab, fmt, call):
    """With grammar_calls, a call's trigger spelled where the grammar started no call (inside a
    structural tag's part) is text; the same trigger where it did is a call."""
    d = Delimiters.from_vocab(bytes_vocab)
    part = f"<p>{call}</p> then "
    p = OutputParser(d, call_format=fmt, tool_choice="auto", grammar_calls=True, stop_ids=bytes_vocab.stop_ids)
    for i, ch in enumerate(part + call):
        # the grammar started a call at the last character of the second trigger only
        starts = len(part) + call.index(":") + 1 == i
        p.feed(bytes_vocab.lookup[ch.encode()], ch, starts)
    p.finish()
    r = p.result()
    assert r.content.startswith(part.strip()) and [c.name for c in r.tool_calls] == ["f"], r
    plain = OutputParser(d, call_format=fmt, tool_choice="auto", stop_ids=bytes_vocab.stop_ids)
    for ch in part + call:
        plain.feed(bytes_vocab.lookup[ch.encode()], ch)
    plain.finish()
    assert len(plain.result().tool_calls) == 2  # without the grammar's word, both read as calls
