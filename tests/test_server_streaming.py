"""Without a model: streamed tool calls (name first, then argument pieces that add up to the
non-streamed arguments), calls cut by max_tokens (never handed out as complete), the token
ceiling's three modes, and the sampling adjustments (penalties, logit_bias, min_tokens)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from railcall.runtime.decode import SamplingParams, Step, generate
from railcall.grammar.tools import Tool, tool_grammar
from railcall.matcher import Matcher, compiled_grammar
from railcall.output import Delimiters, OutputParser
from railcall.server.assemble import Assembler

TOOLS = [Tool("send_email", "", {"type": "object", "properties": {
    "to": {"type": "string"}, "subject": {"type": "string"}, "body": {"type": "string"}},
    "required": ["to", "subject", "body"]})]


class Scripted:
    """Logits that prefer the single-byte token of the script's next byte after the text fed so
    far (forced tokens may span several bytes), a few alternatives after it."""

    def __init__(self, vocab, script):
        self.vocab, self.width = vocab, vocab.logits_width
        self.script = b"".join(vocab.token_bytes[t] for t in script)
        self.text = b""

    def _row(self):
        row = torch.full((self.width,), -5.0)
        row[1:40] = torch.linspace(-1.0, -3.0, 39)
        n = len(self.text)
        nxt = self.vocab.lookup[self.script[n:n + 1]] if n < len(self.script) else self.vocab.stop_ids[0]
        row[nxt] = 5.0
        return row

    def start(self, prompt):
        self.text = b""
        return self._row()

    def feed(self, tokens):
        rows = []
        for t in tokens:
            self.text += self.vocab.token_bytes[t]
            rows.append(self._row())
        return torch.stack(rows)


def ids_of(vocab, text: str) -> list[int]:
    return [vocab.lookup[bytes([b])] for b in text.encode()]


def assembler(vocab, tool_choice="required"):
    served = SimpleNamespace(vocab=vocab, delimiters=Delimiters.from_vocab(vocab, reasoning=None), call_format="json")
    plan = SimpleNamespace(tool_choice=tool_choice, params=SimpleNamespace(stop=()), top_logprobs=0, grammar=object())
    return Assembler(served, plan)


def stream(asm, vocab, text, finish_reason="stop"):
    toks = ids_of(vocab, text)
    deltas = []
    for t in toks:
        deltas += asm.feed(Step(0, t, "", None, False, -0.5))
    deltas += asm.finish(SimpleNamespace(tokens=toks, text=text, stop_string=None, finish_reason=finish_reason))
    return deltas


def joined(deltas) -> dict[int, dict]:
    """What an OpenAI streaming client assembles: per index, the name and arguments concatenated."""
    calls: dict[int, dict] = {}
    for d in deltas:
        for c in d.get("tool_calls", []):
            got = calls.setdefault(c["index"], {"id": None, "name": "", "arguments": ""})
            got["id"] = got["id"] or c.get("id")
            got["name"] += c["function"].get("name") or ""
            got["arguments"] += c["function"].get("arguments") or ""
    return calls


def test_a_call_streams_its_name_first_then_its_arguments_in_pieces(bytes_vocab):
    asm = assembler(bytes_vocab)
    deltas = stream(asm, bytes_vocab, '{"tool":"send_email","args":{"to":"a@b.c","subject":"Hi","body":"x \\" y"}}')
    pieces = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert pieces[0]["function"] == {"name": "send_email", "arguments": ""} and pieces[0]["id"].startswith("call_")
    assert len(pieces) > 10 and all("name" not in p["function"] for p in pieces[1:])  # arrived as it was written
    [call] = asm.message()["tool_calls"]
    assert joined(deltas) == {0: {"id": call["id"], "name": "send_email", "arguments": call["function"]["arguments"]}}
    assert json.loads(call["function"]["arguments"]) == {"to": "a@b.c", "subject": "Hi", "body": 'x " y'}


def test_parallel_calls_stream_under_their_own_indexes(bytes_vocab):
    asm = assembler(bytes_vocab)
    deltas = stream(asm, bytes_vocab, '[{"tool":"f","args":{"a":[1,{"b":"}"}]}},{"tool":"g","args":{}}]')
    got = joined(deltas)
    msg = asm.message()["tool_calls"]
    assert [got[i]["arguments"] for i in (0, 1)] == [c["function"]["arguments"] for c in msg] == ['{"a":[1,{"b":"}"}]}', "{}"]
    assert [got[i]["name"] for i in (0, 1)] == ["f", "g"]


def test_a_call_cut_by_max_tokens_is_not_handed_out_as_complete(bytes_vocab):
    asm = assembler(bytes_vocab)
    deltas = stream(asm, bytes_vocab, '{"tool":"send_email","args":{"to":"a@b.c","subj', finish_reason="length")
    [call] = asm.message()["tool_calls"]
    assert call["function"]["name"] == "send_email" and call["function"]["arguments"] == '{"to":"a@b.c","subj'
    with pytest.raises(ValueError):
        json.loads(call["function"]["arguments"])  # no client can run it
    assert joined(deltas)[0]["arguments"] == call["function"]["arguments"]
    assert asm.message()["content"] is None


def test_a_call_cut_before_its_name_is_complete_is_no_call(bytes_vocab):
    asm = assembler(bytes_vocab)
    stream(asm, bytes_vocab, '{"tool":"send_em', finish_reason="length")
    assert asm.message()["tool_calls"] is None


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=8)


@settings(max_examples=150, deadline=None)
@given(args=st.dictionaries(st.text(max_size=6), json_values, max_size=4), indent=st.sampled_from([None, 1]),
       ascii_=st.booleans(), chunk=st.integers(1, 7))
def test_streamed_arguments_equal_the_whole_on_any_json(args, indent, ascii_, chunk):
    body = json.dumps({"tool": "t", "args": args}, indent=indent, ensure_ascii=ascii_)
    d = Delimiters.from_vocab(SimpleNamespace(_extra={}, size=0), reasoning=None, tool_call=None) if False else None
    parser = OutputParser(Delimiters(), call_format="json", tool_choice="required", stream_calls=True)
    deltas = []
    for i in range(0, len(body), chunk):
        deltas += parser.feed(-1, body[i:i + chunk])
    deltas += parser.finish()
    [call] = parser.result().tool_calls
    assert call.name == "t" and call.complete
    assert "".join(x.text for x in deltas if x.kind == "call_args") == call.arguments
    assert json.loads(call.arguments) == json.loads(json.dumps(args))
    assert [x.kind for x in deltas if x.kind != "call_args"] == ["call_name", "tool_call"]


# -- the token ceiling -------------------------------------------------------------------------------

LONG = '{"tool":"send_email","args":{"to":"someone@example.com","subject":"A long subject line","body":"' + "x" * 60 + '"}}'


@pytest.mark.parametrize("max_tokens", [6, 12, 25, 40, 60])
def test_the_ceiling_modes(bytes_vocab, max_tokens):
    g = compiled_grammar(tool_grammar(TOOLS), bytes_vocab)
    script = ids_of(bytes_vocab, LONG)
    out = {}
    for mode in ("leave", "close", "complete"):
        out[mode] = generate(Scripted(bytes_vocab, script), bytes_vocab, [1], Matcher(g),
                             SamplingParams(max_tokens=max_tokens, cut=mode))
    leave, close, complete = out["leave"], out["close"], out["complete"]
    assert len(leave.tokens) == max_tokens and not leave.cut and leave.finish_reason == "length"
    assert LONG.startswith(leave.text)  # cut where it was cut, nothing invented
    assert complete.cut and complete.finish_reason == "length"
    assert json.loads(complete.text)["tool"] == "send_email"  # closed: it parses
    assert len(close.tokens) <= max_tokens and close.finish_reason == "length"  # never past the budget
    if close.cut:  # the close fitted: the same output as "complete"
        assert json.loads(close.text)["tool"] == "send_email" and complete.tokens == close.tokens
    else:  # too short to close: left cut, and "complete" went past the budget
        assert LONG.startswith(close.text) and len(complete.tokens) > max_tokens
    assert close.cut == (max_tokens >= 40)  # the three "?"-filled strings need about 30 tokens


def test_the_close_comes_as_late_as_it_fits(bytes_vocab):
    g = compiled_grammar(tool_grammar(TOOLS), bytes_vocab)
    script = ids_of(bytes_vocab, LONG)
    r = generate(Scripted(bytes_vocab, script), bytes_vocab, [1], Matcher(g), SamplingParams(max_tokens=60, cut="close"))
    args = json.loads(r.text)["args"]
    assert len(r.tokens) == 60 and args["to"] == "someone@example.com"  # the model wrote until the close had to start
    assert sum(s.forced for s in r.steps[-3:]) == 3


# -- sampling adjustments -------------------------------------------------------------------------------

def test_penalties_bias_and_min_tokens(bytes_vocab):
    v = bytes_vocab
    script = ids_of(v, "aaaa")
    plain = generate(Scripted(v, script), v, [1], None, SamplingParams(max_tokens=4))
    assert plain.text == "aaaa"
    a = ids_of(v, "a")[0]
    biased = generate(Scripted(v, script), v, [1], None, SamplingParams(max_tokens=4, logit_bias={a: -100.0}))
    assert "a" not in biased.text
    rep = generate(Scripted(v, script), v, [1], None, SamplingParams(max_tokens=4, frequency_penalty=2.0))
    assert rep.text.count("a") < 4  # after 'a' was written, its 5.0 lead shrinks by 2 per occurrence
    early = generate(Scripted(v, []), v, [1], None, SamplingParams(max_tokens=5))
    assert early.tokens == [] and early.finish_reason == "stop"
    held = generate(Scripted(v, []), v, [1], None, SamplingParams(max_tokens=5, min_tokens=3))
    assert len(held.tokens) >= 3  # the stop token was masked until 3 tokens were written


def test_forced_tokens_have_logprob_zero_under_the_mask(bytes_vocab):
    g = compiled_grammar(tool_grammar(TOOLS), bytes_vocab)
    r = generate(Scripted(bytes_vocab, ids_of(bytes_vocab, LONG)), bytes_vocab, [1], Matcher(g),
                 SamplingParams(max_tokens=30, top_logprobs=2))
    forced = [s for s in r.steps if s.forced]
    assert forced and all(s.logprob == 0.0 and s.top == [(s.token, 0.0)] for s in forced)
