"""railcall.runtime.batch's chunked prefill on the real embedded model under llama.cpp: prompts run
a few tokens a step, interleaved with the other rows' decode steps and with each other, and every
row's greedy output equals the same row run alone (up to a near-tie: llama.cpp is not
batch-invariant, see NEAR_TIE in test_models_llama)."""

from __future__ import annotations

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is part of railcall[llama] and of `make setup`")

from test_models_llama import REQUESTS, TOOLS, same_run  # noqa: E402

from railcall.grammar.tools import tool_grammar  # noqa: E402
from railcall.matcher import Matcher, compiled_grammar  # noqa: E402
from railcall.runtime.batch import BatchLoop  # noqa: E402
from railcall.runtime.decode import Row, SamplingParams, generate  # noqa: E402
from railcall.prompts.chat import chat_prompt_ids  # noqa: E402

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def lm():
    from railcall.models.store import load_model

    return load_model(backend="llama", threads=2)


def test_chunked_interleaved_prefill_equals_each_row_alone(lm):
    vocab = lm.vocabulary()
    grammar = compiled_grammar(tool_grammar(TOOLS, "json"), vocab)
    prompts = [chat_prompt_ids(lm.tokenizer, TOOLS, r) for r in REQUESTS]
    params = SamplingParams(max_tokens=24, top_logprobs=2)
    want = [generate(lm.backend(), vocab, p, Matcher(grammar) if i % 2 == 0 else None, params)
            for i, p in enumerate(prompts)]
    free = len(lm.model._free)
    loop = BatchLoop(lm.model, vocab, max_rows=3, step_tokens=16)
    rows = []
    for i, p in enumerate(prompts):  # a request every other step: prompts fill beside rows decoding
        rows.append(Row(vocab, Matcher(grammar) if i % 2 == 0 else None, params))
        loop.add(p, rows[-1], group=i)
        loop.step()
        loop.step()
    while loop.busy:
        loop.step()
    assert loop.steps > sum(len(p) for p in prompts) // 16  # the prompts did run in chunks
    same = [same_run(r.generation(), w) for r, w in zip(rows, want)]
    assert sum(same) >= 3, same  # most rows equal throughout; the rest up to a near-tie
    assert len(lm.model._free) == free  # every row's sequence freed
