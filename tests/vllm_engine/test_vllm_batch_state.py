"""The processor's batch bookkeeping without an engine: rows added, removed, moved and swapped as
vLLM's persistent batch changes; each row masked by its own request's grammar; rows without a
spec untouched."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate
from vllm.v1.sample.logits_processor.interface import MoveDirectionality

from railcall.integrations.vllm import RailcallLogitsProcessor, railcall_args
from scenario import MATH, WEATHER, openai_tools

WIDTH = 49152


@pytest.fixture(scope="module")
def proc(folder):
    config = SimpleNamespace(
        model_config=SimpleNamespace(tokenizer=folder, tokenizer_revision=None, trust_remote_code=False,
                                     get_vocab_size=lambda: WIDTH),
        scheduler_config=SimpleNamespace(max_num_seqs=4))
    return RailcallLogitsProcessor(config, torch.device("cpu"), False)


def _params(tools=None):
    p = SamplingParams(max_tokens=64, extra_args=railcall_args(openai_tools(tools)) if tools else None)
    p._all_stop_token_ids = {2}
    return p


def _legal(logits, row):
    return set(torch.isfinite(logits[row]).nonzero().flatten().tolist())


def test_rows_follow_the_batch(proc):
    tok = proc._vocabulary().encoder
    weather, math, plain = [], [], []
    proc.update_state(BatchUpdate(3, removed=[], moved=[], added=[
        (0, _params(WEATHER), None, weather), (1, _params(), None, plain), (2, _params(MATH), None, math)]))
    assert sorted(proc.requests) == [0, 2]
    logits = torch.zeros(3, WIDTH)
    proc.apply(logits)
    assert len(_legal(logits, 1)) == WIDTH  # no spec: untouched
    assert _legal(logits, 0) and len(_legal(logits, 0)) < 10

    weather.extend(tok('{"tool":"get_weather","args":{"city":"'))
    math.extend(tok('{"tool":"mul'))
    # the request in row 1 finishes; vLLM condenses: row 2 moves into row 1
    proc.update_state(BatchUpdate(2, removed=[1], added=[], moved=[(2, 1, MoveDirectionality.UNIDIRECTIONAL)]))
    assert sorted(proc.requests) == [0, 1] and proc.requests[1].output_ids is math
    logits = torch.zeros(2, WIDTH)
    proc.apply(logits)
    assert tok("tiply")[0] in _legal(logits, 1)  # math's grammar, where math left off
    assert tok("Paris")[0] in _legal(logits, 0) and tok("Paris")[0] not in _legal(logits, 1)  # a string vs a name

    proc.update_state(BatchUpdate(2, removed=[], added=[], moved=[(0, 1, MoveDirectionality.SWAP)]))
    assert proc.requests[0].output_ids is math and proc.requests[1].output_ids is weather
    # a new request without a spec takes a tracked row: that row is untracked from then on
    proc.update_state(BatchUpdate(2, removed=[0], added=[(0, _params(), None, [])], moved=[]))
    assert sorted(proc.requests) == [1]
    logits = torch.zeros(2, WIDTH)
    proc.apply(logits)
    assert len(_legal(logits, 0)) == WIDTH and tok("Paris")[0] in _legal(logits, 1)


def test_placeholders_wait_and_stops_follow_vllm(proc):
    """-1 (async scheduling's placeholder) is not consumed; where the call is complete only the
    stop ids vLLM stops on are offered (SmolLM2's railcall stop set also has <|endoftext|>)."""
    tok = proc._vocabulary().encoder
    out = tok('{"tool":"add","args":{"a":1,"b":2}}')
    ids = out[:-1] + [-1]
    proc.update_state(BatchUpdate(1, removed=[0, 1], added=[(0, _params(MATH), None, ids)], moved=[]))
    logits = torch.zeros(1, WIDTH)
    proc.apply(logits)
    assert proc.requests[0].consumed == len(out) - 1
    ids[-1] = out[-1]
    logits = torch.zeros(1, WIDTH)
    proc.apply(logits)
    assert _legal(logits, 0) == {2}


def test_a_bad_spec_names_the_field():
    with pytest.raises(ValueError, match="mode"):
        RailcallLogitsProcessor.validate_params(SamplingParams(extra_args={"railcall": {"tools": [], "mode": "sometimes"}}))
    with pytest.raises(ValueError, match="railcall.*keyword 'not'"):
        RailcallLogitsProcessor.validate_params(SamplingParams(extra_args={"railcall": {"schema": {
            "not": {"type": "string"}}}}))
    RailcallLogitsProcessor.validate_params(SamplingParams(extra_args={"railcall": '{"schema": {"type": "integer"}}'}))


def test_precompute_in_the_spec(proc):
    with pytest.raises(ValueError, match="precompute must be true or false"):
        RailcallLogitsProcessor.validate_params(SamplingParams(extra_args={"railcall": {"tools": [], "precompute": "yes"}}))
    p = SamplingParams(max_tokens=64, extra_args=railcall_args(openai_tools(WEATHER), precompute=True))
    p._all_stop_token_ids = {2}
    req = proc._new_request(p, [])
    assert req.matcher.compiled.precomputed
    lazy = proc._new_request(_params(MATH), [])
    assert not lazy.matcher.compiled.precomputed


def test_prewarm_in_the_spec(proc):
    with pytest.raises(ValueError, match="prewarm must be true or false"):
        RailcallLogitsProcessor.validate_params(SamplingParams(extra_args={"railcall": {"tools": [], "prewarm": 1}}))
    p = SamplingParams(max_tokens=64, extra_args=railcall_args(openai_tools(MATH), prewarm=True))
    p._all_stop_token_ids = {2}
    req = proc._new_request(p, [])
    assert req.matcher.compiled.prewarmed and not req.matcher.compiled.precomputed
