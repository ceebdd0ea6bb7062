"""railcall's vLLM plug-in without vLLM: the names it imports are stood in for, so its own logic
(the front end's check of a request's spec, and what the engine step does when a grammar still
cannot be built) runs in the main test suite. The plug-in inside a real vLLM engine is tested by
`make test-vllm` (tests/vllm_engine)."""

from __future__ import annotations

import importlib
import sys
import types
from dataclasses import dataclass, field

import numpy as np
import pytest

from railcall.bitmask import allocate_bitmask, unpack_bitmask
from railcall.errors import GrammarError


@dataclass
class SamplingParams:  # the fields of vLLM's that the plug-in reads
    extra_args: dict = field(default_factory=dict)
    structured_outputs: object = None
    all_stop_token_ids: tuple = ()
    max_tokens: int = 16


@pytest.fixture
def plugin(monkeypatch):
    vllm = types.ModuleType("vllm")
    vllm.SamplingParams = SamplingParams
    lp = types.ModuleType("vllm.v1.sample.logits_processor")
    lp.BatchUpdate, lp.LogitsProcessor = object, object
    iface = types.ModuleType("vllm.v1.sample.logits_processor.interface")
    iface.MoveDirectionality = types.SimpleNamespace(SWAP=1, UNIDIRECTIONAL=0)
    for name, mod in {"vllm": vllm, "vllm.v1": types.ModuleType("vllm.v1"),
                      "vllm.v1.sample": types.ModuleType("vllm.v1.sample"),
                      "vllm.v1.sample.logits_processor": lp,
                      "vllm.v1.sample.logits_processor.interface": iface}.items():
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.delitem(sys.modules, "railcall.integrations.vllm", raising=False)
    mod = importlib.import_module("railcall.integrations.vllm")
    yield mod
    sys.modules.pop("railcall.integrations.vllm", None)


def params(spec) -> SamplingParams:
    return SamplingParams(extra_args={"railcall": spec})


def tool(schema):
    return {"type": "function", "function": {"name": "f", "parameters": schema}}


@pytest.mark.parametrize("spec, says", [
    ({"schema": {"$ref": "#"}}, "no finite value"),
    ({"tools": [tool({"type": "object", "properties": {"n": {"type": "object", "properties": {"c": {"$ref": "#/properties/n"}},
                                                             "required": ["c"]}}})]}, "no finite value"),
    ({"schema": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1e-30}}, "lies within the bounds"),
    ({"schema": {"type": "string", "pattern": "^\ud800$"}}, "no string matching"),
    ({"grammar": {"syntax": "lark", "definition": 'start: start "a" | "b"'}}, "left-recursive"),
    ({"grammar": {"syntax": "gbnf", "definition": 'root ::= [b-a]'}}, "line 1, column 10"),
    ({"grammar": {"syntax": "sql", "definition": "x"}}, "grammar must be"),
    ({"grammar": {"syntax": "regex", "definition": "a"}, "schema": {}}, "give one of"),
])
def test_the_front_end_refuses_what_would_fail_in_the_engine_step(plugin, spec, says):
    plugin._SPECS.clear()
    with pytest.raises(ValueError, match=says) as e:
        plugin.RailcallLogitsProcessor.validate_params(params(spec))
    assert "extra_args['railcall']" in str(e.value)


def test_a_grammar_that_fails_in_the_engine_step_ends_that_request_only(plugin, bytes_vocab, monkeypatch, caplog):
    proc = plugin.RailcallLogitsProcessor.__new__(plugin.RailcallLogitsProcessor)
    proc.vocab, proc.width = bytes_vocab, bytes_vocab.logits_width

    def fails(*a, **k):  # what no front-end check can see: this model's vocabulary
        raise GrammarError("the grammar matches nothing")

    plugin._SPECS.clear()
    ok = proc._new_request(params({"schema": {"type": "integer"}}), [])
    monkeypatch.setattr(plugin, "compiled_grammar", fails)
    plugin._SPECS.clear()
    with caplog.at_level("ERROR", logger="railcall.integrations.vllm"):
        bad = proc._new_request(params({"schema": {"type": "boolean"}}), [])
    assert "could not be built" in caplog.text and "matches nothing" in caplog.text
    bm = allocate_bitmask(bytes_vocab.logits_width, batch=2)
    ok.fill(bm, 0)
    bad.fill(bm, 1)
    legal = [np.flatnonzero(unpack_bitmask(bm[i], bytes_vocab.logits_width)).tolist() for i in (0, 1)]
    assert bytes_vocab.lookup[b"7"] in legal[0]
    assert legal[1] == sorted(bytes_vocab.stop_ids)
    bad.output_ids.append(bytes_vocab.lookup[b"t"])  # a token that got past the mask: still no exception
    bad.advance()
    assert bad.matcher.is_error()


def test_prewarm_in_the_spec(plugin):
    plugin._SPECS.clear()
    with pytest.raises(ValueError, match="prewarm must be true or false"):
        plugin.RailcallLogitsProcessor.validate_params(params({"tools": [], "prewarm": "yes"}))
    spec = plugin.request_spec(params({"tools": [tool({"type": "object"})], "prewarm": False}))
    assert not spec.prewarm and not spec.precompute
    assert plugin.request_spec(params({"tools": [tool({"type": "object"})], "prewarm": True})).prewarm
    # unset: compiled_grammar's default for the grammar (a tool table prewarms, a Lark grammar not)
    assert plugin.request_spec(params({"tools": [tool({"type": "object"})]})).prewarm is None


# -- on Qwen's 152k vocabulary: reasoning, then a Hermes call or a structured answer -------------

THINK, UNTHINK, CALL, UNCALL, EOS = 151648, 151649, 151657, 151658, 151643
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


@pytest.fixture(scope="module")
def qwen2_folder():
    from railcall.models.store import tokenizer_folder

    return tokenizer_folder("qwen2")


@pytest.mark.qwen2
@pytest.mark.parametrize("answer", ["hermes call", "schema"])
def test_reasoning_then_the_answer_on_qwen2_ids(plugin, qwen2_tokenizer, qwen2_folder, answer):
    """The processor as vLLM drives it, one sampled token per step (a test double stands in for
    the model: each step's logits prefer the next token of a script, and the argmax after the
    processor's mask is what is "sampled"). The Vocabulary comes from the tokenizer folder, as
    vLLM's model config names it."""
    import torch

    from railcall.output import Delimiters, OutputParser
    from output_script import detokenize

    enc = lambda text: qwen2_tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    reasoning = [THINK] + enc("I could write a </") + enc("think> tag.") + [UNTHINK]
    if answer == "hermes call":
        spec = {"tools": [tool(WEATHER)], "format": "hermes", "mode": "auto", "reasoning": True}
        script = reasoning + enc("Sure.") + [CALL] + enc('{"name":"f","arguments":{"city":"Paris"}}') + [UNCALL, EOS]
    else:
        spec = {"schema": WEATHER, "reasoning": True}
        # the close token inside the answer's string: text there, as its bytes
        script = reasoning + enc('{"city":"Paris ') + [UNTHINK] + enc('"}') + [EOS]
    close = script.index(UNTHINK)
    assert UNTHINK not in script[:close]  # the spelled close in reasoning is pieces

    proc = plugin.RailcallLogitsProcessor.__new__(plugin.RailcallLogitsProcessor)
    proc.model_config = types.SimpleNamespace(tokenizer=str(qwen2_folder))
    proc.width, proc.max_rows, proc.vocab, proc.bitmask, proc.requests = 152064, 4, None, None, {}
    out: list[int] = []
    sp = SamplingParams(extra_args={"railcall": spec}, all_stop_token_ids=(EOS,), max_tokens=200)
    proc.update_state(types.SimpleNamespace(removed=[], added=[(0, sp, [1, 2], out)], moved=[]))
    for k, want in enumerate(script):
        logits = torch.zeros(1, proc.width)
        logits[0, want] = 10.0
        if want != UNTHINK:
            logits[0, UNTHINK] = 5.0  # legal all through reasoning: only the script's token beats it
        proc.apply(logits)
        assert torch.isfinite(logits[0, want]), (k, qwen2_tokenizer.decode([want]))
        if 0 < k <= close + 1:  # reasoning ends at the close token; the answer never starts with it
            assert bool(torch.isfinite(logits[0, UNTHINK])) == (k <= close), k
        out.append(int(logits[0].argmax()))
    assert out == script
    assert proc.vocab.size == 151665 and [d.token_id for d in Delimiters.from_vocab(proc.vocab).all()] == [
        THINK, UNTHINK, CALL, UNCALL]
    p = OutputParser(Delimiters.from_vocab(proc.vocab), stop_ids=proc.vocab.stop_ids,
                     call_format="hermes" if answer == "hermes call" else None)
    for tid, text in detokenize(proc.vocab, out):
        p.feed(tid, text)
    p.finish()
    r = p.result()
    assert r.reasoning_content == "I could write a </think> tag."
    if answer == "hermes call":
        assert (r.content, [(c.name, c.arguments) for c in r.tool_calls]) == ("Sure.", [("f", '{"city":"Paris"}')])
    else:
        assert (r.content, r.tool_calls) == ('{"city":"Paris </think>"}', [])  # the token, as text


def test_a_grammar_spec_constrains_the_answer(plugin, smollm2_vocab):
    """A Lark grammar in the spec: the request's matcher takes its text and nothing else."""
    plugin._SPECS.clear()
    spec = plugin.request_spec(params({"grammar": {"syntax": "lark", "definition": 'start: "n=" /[0-9]{1,3}/'}}))
    from railcall import Matcher, compiled_grammar

    m = Matcher(compiled_grammar(spec.grammar, smollm2_vocab))
    assert m.consume_bytes(b"n=42") and m.is_accepting() and not Matcher(compiled_grammar(
        spec.grammar, smollm2_vocab)).consume_bytes(b"n=x")


TAG = {"structures": [{"begin": "<f=w>", "schema": {"type": "object", "properties": {"c": {"type": "integer"}},
                                                     "required": ["c"]}, "end": "</f>"}], "triggers": ["<f="]}


@pytest.mark.parametrize("spec, says", [
    ({"structural_tag": TAG, "schema": {}}, "tagged parts in free text"),
    ({"structural_tag": TAG, "tools": [tool({})], "mode": "required"}, "tagged parts in free text"),
    ({"structural_tag": {"structures": "x", "triggers": []}}, "structural_tag must be"),
    ({"structural_tag": {**TAG, "triggers": ["<g="]}}, "starts with none of the triggers"),
])
def test_a_structural_tag_spec_is_refused_with_what_to_send(plugin, spec, says):
    plugin._SPECS.clear()
    with pytest.raises(ValueError, match=says):
        plugin.RailcallLogitsProcessor.validate_params(params(spec))


def test_a_structural_tag_spec_puts_parts_in_free_text(plugin, bytes_vocab):
    """The request's matcher (built as in the engine step) takes free text, and after the
    trigger only the structure: its begin, an object under its schema, its end."""
    proc = plugin.RailcallLogitsProcessor.__new__(plugin.RailcallLogitsProcessor)
    proc.vocab, proc.width = bytes_vocab, bytes_vocab.logits_width
    plugin._SPECS.clear()
    req = proc._new_request(params({"structural_tag": TAG}), [])
    m = req.matcher
    for b in b'so <f=w>{"c":7}</f> ok':
        assert m.consume_token(bytes_vocab.lookup[bytes([b])]), m.error_message
    assert m.is_accepting() and m.in_free_text()
    m2 = proc._new_request(params({"structural_tag": TAG}), []).matcher
    for b in b"<f=w>{":
        assert m2.consume_token(bytes_vocab.lookup[bytes([b])])
    assert not m2.consume_token(bytes_vocab.lookup[b"}"])  # "c" is required
