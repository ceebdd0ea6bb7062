"""Without a model: the decode loop's serving hooks (per-step callback, cancellation, top
logprobs, stop strings) with a scripted backend, and the Assembler's OpenAI deltas."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from railcall.runtime.decode import SamplingParams, Step, generate
from railcall.grammar.tools import Tool, tool_grammar
from railcall.matcher import Matcher, compiled_grammar
from railcall.output import Delimiters
from railcall.server.assemble import Assembler

from output_script import ScriptedIds


class Scripted(ScriptedIds):
    """A backend whose logits put the next scripted token first (then the stop token)."""

    def __init__(self, vocab, script: list[int]):
        self.vocab, self.script, self.width, self.pos = vocab, script, vocab.logits_width, 0

    def _row(self):
        row = torch.full((self.width,), -5.0)
        row[1:40] = torch.linspace(-1.0, -3.0, 39)  # a spread of alternatives for top_logprobs
        nxt = self.script[self.pos] if self.pos < len(self.script) else self.vocab.stop_ids[0]
        row[nxt] = 5.0
        return row


def ids_of(vocab, text: str) -> list[int]:
    return [vocab.lookup[bytes([b])] for b in text.encode()]


def test_on_step_sees_every_token_in_order(bytes_vocab):
    script = ids_of(bytes_vocab, "hello")
    seen: list[Step] = []
    g = generate(Scripted(bytes_vocab, script), bytes_vocab, [1], None, SamplingParams(max_tokens=10), on_step=seen.append)
    assert g.text == "hello" and g.finish_reason == "stop"
    assert [s.token for s in seen] == g.tokens == script


def test_on_step_includes_forced_tokens(bytes_vocab):
    tools = [Tool("f", "", {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]})]
    m = Matcher(compiled_grammar(tool_grammar(tools), bytes_vocab))
    seen = []
    g = generate(Scripted(bytes_vocab, ids_of(bytes_vocab, "xyz")), bytes_vocab, [1], m, SamplingParams(max_tokens=40),
                 on_step=seen.append)
    assert [s.token for s in seen] == g.tokens and any(s.forced for s in seen)
    assert g.text.startswith('{"tool":"f","args":{"a":"')


def test_cancelled_stops_before_the_next_pass(bytes_vocab):
    seen = []
    g = generate(Scripted(bytes_vocab, ids_of(bytes_vocab, "abcdefgh")), bytes_vocab, [1], None,
                 SamplingParams(max_tokens=20), on_step=seen.append, cancelled=lambda: len(seen) >= 3)
    assert g.finish_reason == "cancelled" and g.text == "abc"


def test_top_logprobs_best_first_and_never_masked(bytes_vocab):
    g = generate(Scripted(bytes_vocab, ids_of(bytes_vocab, "ab")), bytes_vocab, [1], None,
                 SamplingParams(max_tokens=2, top_logprobs=4))
    for s in g.steps:
        assert len(s.top) == 4 and s.top[0] == (s.token, pytest.approx(s.logprob))
        assert [lp for _, lp in s.top] == sorted((lp for _, lp in s.top), reverse=True)
    # under a grammar, tokens it forbids (logit -inf) never appear among the alternatives
    tools = [Tool("f", "", {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})]
    m = Matcher(compiled_grammar(tool_grammar(tools), bytes_vocab))
    g = generate(Scripted(bytes_vocab, ids_of(bytes_vocab, "x")), bytes_vocab, [1], m,
                 SamplingParams(max_tokens=60, top_logprobs=5), fast_forward=False)
    at = g.text.index('"n":') + len('"n":')
    ends = [len(bytes_vocab.decode(g.tokens[: i + 1])) for i in range(len(g.tokens))]
    digit_step = g.steps[next(i for i, e in enumerate(ends) if e > at)]  # the token that starts the value
    assert bytes_vocab.token_bytes[digit_step.token][:1] in b"-0123456789"
    assert len(digit_step.top) == 5 and all(bytes_vocab.token_bytes[t][:1] in b"-0123456789" for t, _ in digit_step.top)
    assert g.steps[0].top is not None and SamplingParams().top_logprobs == 0


def test_stop_string_across_tokens_is_cut(bytes_vocab):
    script = ids_of(bytes_vocab, "one, two; three")
    g = generate(Scripted(bytes_vocab, script), bytes_vocab, [1], None, SamplingParams(max_tokens=30, stop=("; t", "zz")))
    assert g.text == "one, two" and g.finish_reason == "stop" and g.stop_string == "; t"
    assert len(g.tokens) == len("one, two; t")  # generation ended at the token completing the stop
    g = generate(Scripted(bytes_vocab, script), bytes_vocab, [1], None, SamplingParams(max_tokens=30))
    assert g.text == "one, two; three" and g.stop_string is None


# -- the Assembler ----------------------------------------------------------------------------------

def served_for(vocab):
    return SimpleNamespace(vocab=vocab, delimiters=Delimiters.from_vocab(vocab, reasoning=None), call_format="json")


def plan_for(tool_choice="none", stop=(), top=0):
    return SimpleNamespace(tool_choice=tool_choice, params=SimpleNamespace(stop=stop), top_logprobs=top)


def run(asm, vocab, text, stop_string=None):
    toks = ids_of(vocab, text)
    deltas = []
    for t in toks:
        deltas += asm.feed(Step(0, t, "", None, False, -0.5))
    shown = text if stop_string is None else text[: text.index(stop_string)]
    deltas += asm.finish(SimpleNamespace(tokens=toks, text=shown, stop_string=stop_string))
    return deltas


def test_assembler_content_with_a_stop_string_never_streams_it(bytes_vocab):
    asm = Assembler(served_for(bytes_vocab), plan_for(stop=("END!",)))
    deltas = run(asm, bytes_vocab, "abc EN xEND!", stop_string="END!")
    pieces = [d["content"] for d in deltas]
    assert "".join(pieces) == "abc EN x" and len(pieces) > 1
    assert asm.message()["content"] == "abc EN x" and asm.message()["tool_calls"] is None


def test_assembler_required_call(bytes_vocab):
    asm = Assembler(served_for(bytes_vocab), plan_for("required"))
    deltas = run(asm, bytes_vocab, '{"tool":"f","args":{"a":"x}"}}')
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert len(calls) == 1 and calls[0]["function"] == {"name": "f", "arguments": '{"a":"x}"}'}
    msg = asm.message()
    assert msg["content"] is None and msg["tool_calls"][0]["id"] == calls[0]["id"] and asm.has_calls()


def test_assembler_parallel_calls_in_an_array(bytes_vocab):
    asm = Assembler(served_for(bytes_vocab), plan_for("required"))
    run(asm, bytes_vocab, '[{"tool":"f","args":{}},{"tool":"g","args":{"n":1}}]')
    calls = asm.message()["tool_calls"]
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [("f", "{}"), ("g", '{"n":1}')]
    assert len({c["id"] for c in calls}) == 2


def test_assembler_auto_content_then_call(bytes_vocab):
    asm = Assembler(served_for(bytes_vocab), plan_for("auto"))
    deltas = run(asm, bytes_vocab, 'Let me check. {"tool":"f","args":{"a":"b"}}')
    kinds = [next(iter(d)) for d in deltas]
    assert kinds.index("content") < kinds.index("tool_calls")
    msg = asm.message()
    assert msg["content"].strip() == "Let me check." and msg["tool_calls"][0]["function"]["name"] == "f"


def test_logprob_entry_shape(bytes_vocab):
    asm = Assembler(served_for(bytes_vocab), plan_for(top=2))
    t = bytes_vocab.lookup[b"a"]
    e = asm.logprob_entry(Step(0, t, "a", None, False, -0.25, [(t, -0.25), (5, -2.0), (6, -3.0)]))
    assert e["token"] == "a" and e["bytes"] == [97] and e["logprob"] == -0.25
    assert [x["logprob"] for x in e["top_logprobs"]] == [-0.25, -2.0]
    assert asm.logprob_entry(Step(0, t, "a", None, True, None))["logprob"] == 0.0  # written by finish()


def test_json_object_grammar_takes_any_object(bytes_vocab):
    from railcall.server.plan import _response_grammar
    from railcall.server.schemas import ChatCompletionRequest

    req = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "x"}],
                                                "response_format": {"type": "json_object"}})
    grammar, kind = _response_grammar(req)
    compiled = compiled_grammar(grammar, bytes_vocab)
    for text, ok in [('{}', True), ('{"a":[1,{"b":null}],"c":"d"}', True), ('[1]', False), ('"s"', False)]:
        m = Matcher(compiled)
        assert (m.consume_bytes(text.encode()) and m.is_accepting()) == ok, text
    assert kind == "json"


def test_assembler_reasoning_then_content_on_think_tokens(bytes_vocab):
    """A vocabulary whose <think> and </think> are single tokens: reasoning_content deltas first,
    then content; a spelled </think> inside reasoning stays reasoning."""
    served = SimpleNamespace(vocab=bytes_vocab, delimiters=Delimiters.from_vocab(bytes_vocab), call_format="json")
    asm = Assembler(served, plan_for())
    think, end = bytes_vocab.special_id("<think>"), bytes_vocab.special_id("</think>")
    toks = [think] + ids_of(bytes_vocab, "why </think> so") + [end] + ids_of(bytes_vocab, "Hi.")
    deltas = []
    for t in toks:
        deltas += asm.feed(Step(0, t, "", None, False, -0.1))
    deltas += asm.finish(SimpleNamespace(tokens=toks, text="", stop_string=None))
    kinds = [next(iter(d)) for d in deltas]
    assert kinds[0] == "reasoning_content" and kinds[-1] == "content" and "reasoning_content" not in kinds[kinds.index("content"):]
    msg = asm.message()
    assert msg["reasoning_content"] == "why </think> so" and msg["content"] == "Hi."


# -- stop strings around calls (tool_choice auto) ---------------------------------------------------
# A backend that follows a reply by its text (agentkit's): the grammar's forced tokens keep it in step.

def auto_run(reply: str, stop: tuple):
    from agentkit import ScriptedBackend, byte_vocab
    from railcall.runtime.regions import answer_matcher

    vocab = byte_vocab()
    tools = [Tool("f", "", {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]})]
    m = answer_matcher(vocab, compiled_grammar(tool_grammar(tools), vocab), Delimiters.from_vocab(vocab), mode="auto")
    return generate(ScriptedBackend(vocab, [reply]), vocab, [0], m, SamplingParams(max_tokens=80, stop=stop))


def test_stop_strings_end_the_prose_around_calls():
    g = auto_run("Sure. STOP and more", ("STOP",))
    assert g.text == "Sure. " and g.stop_string == "STOP" and g.finish_reason == "stop"


def test_stop_strings_never_cut_a_call():
    g = auto_run('ok {"tool":"f","args":{"a":"x STOP y"}} after STOP tail', ("STOP",))
    assert g.text == 'ok {"tool":"f","args":{"a":"x STOP y"}} after ' and g.stop_string == "STOP"
    # nor does one count that starts inside a call and ends after it
    g = auto_run('ok {"tool":"f","args":{"a":"x"}} done', ('"}} d',))
    assert g.stop_string is None and g.text == 'ok {"tool":"f","args":{"a":"x"}} done'


def test_a_tiny_temperature_is_greedy_not_an_overflow(bytes_vocab):
    script = ids_of(bytes_vocab, "abc")
    g = generate(Scripted(bytes_vocab, script), bytes_vocab, [1], None,
                 SamplingParams(max_tokens=3, temperature=1e-40, seed=7))
    assert g.tokens == script


# (the text before a delimiter token: an incomplete character, expected message fields)
PARTIAL_BEFORE_A_TOKEN = [
    ("a call after a cut character", "call", {"content": "\ufffd", "reasoning_content": None, "calls": [("f", "{}")]}),
    ("reasoning closed after a cut character", "reasoning",
     {"content": "ok", "reasoning_content": "r\ufffd", "calls": []}),
]


@pytest.mark.parametrize("name,where,expect", PARTIAL_BEFORE_A_TOKEN, ids=[c[0] for c in PARTIAL_BEFORE_A_TOKEN])
def test_assembler_delimiter_token_after_an_incomplete_character(bytes_vocab, name, where, expect):
    """The grammar allows any text token before a delimiter token, a lone lead byte of a UTF-8
    character included; that byte is text before the token, and the delimiter still counts."""
    from railcall.runtime.regions import answer_matcher

    v = bytes_vocab
    d = Delimiters.from_vocab(v)
    cut = v.lookup[b"\xc3"]  # the first byte of "é"
    if where == "call":
        grammar = compiled_grammar(tool_grammar([Tool("f")], "hermes"), v)
        m = answer_matcher(v, grammar, d, mode="auto")
        toks = [cut, d.call_open.token_id] + ids_of(v, '{"name":"f","arguments":{}}') + [d.call_close.token_id]
    else:
        m = answer_matcher(v, None, d, mode="none", reasoning=True)
        toks = [d.reasoning_open.token_id] + ids_of(v, "r") + [cut, d.reasoning_close.token_id] + ids_of(v, "ok")
    assert all(m.consume_token(t) for t in toks) and m.is_accepting()
    served = SimpleNamespace(vocab=v, delimiters=d, call_format="hermes")
    asm = Assembler(served, plan_for("auto" if where == "call" else "none"))
    for t in toks:
        asm.feed(Step(0, t, "", None, False, -0.1))
    asm.finish(SimpleNamespace(tokens=toks, text="", stop_string=None))
    msg = asm.message()
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in msg["tool_calls"] or []]
    assert {"content": msg["content"], "reasoning_content": msg["reasoning_content"], "calls": calls} == expect
