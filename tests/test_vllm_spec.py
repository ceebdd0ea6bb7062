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
    monkeypatch.delitem(sys.modules, "railcall.vllm", raising=False)
    mod = importlib.import_module("railcall.vllm")
    yield mod
    sys.modules.pop("railcall.vllm", None)


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
    with caplog.at_level("ERROR", logger="railcall.vllm"):
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
    assert plugin.request_spec(params({"tools": [tool({"type": "object"})]})).prewarm  # the default, as compiled_grammar's
