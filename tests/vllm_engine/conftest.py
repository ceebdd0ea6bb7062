"""The vLLM tests (`make test-vllm`, in .venv-vllm): one engine per module, kept small for a
2-core CPU (eager mode, a 1024-token context, 1 GiB of KV cache)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest

ENGINE_ARGS = dict(enforce_eager=True, max_model_len=1024, dtype="float32", max_num_seqs=16, seed=0)


@pytest.fixture(scope="session")
def folder():
    from railcall.models.store import model_folder

    return str(model_folder())


@pytest.fixture(scope="session")
def batch():
    """The requests: (name, prompt ids, railcall spec or None, the tools its output may call)."""
    from scenario import requests

    from railcall.models.store import load_tokenizer

    return requests(load_tokenizer())


@pytest.fixture(scope="session")
def reference(batch):
    """railcall's own loop on the batch, greedy, run before the engine starts (vLLM's CPU worker
    keeps its cores busy while it lives): {name: (without fast-forward, with fast-forward)}."""
    from scenario import MAX_TOKENS

    from railcall import Matcher, Vocabulary, compiled_grammar, schema_grammar, tool_grammar
    from railcall.runtime.decode import SamplingParams, generate
    from railcall.models.backend import TransformersBackend
    from railcall.models.store import load_model

    lm = load_model()
    vocab = Vocabulary.from_hf(lm.tokenizer, logits_width=lm.model.config.vocab_size)
    backend = TransformersBackend(lm.model)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
    out = {}
    for name, ids, spec, allowed in batch:
        if spec is None:
            continue
        grammar = tool_grammar(allowed) if allowed is not None else schema_grammar(spec["schema"])
        compiled = compiled_grammar(grammar, vocab)
        out[name] = (generate(backend, vocab, ids, Matcher(compiled), params, fast_forward=False),
                     generate(backend, vocab, ids, Matcher(compiled), params))
    out["_stops"] = set(vocab.stop_ids)
    return out


@pytest.fixture(scope="module")
def llm(folder, reference):
    from vllm import LLM

    from railcall.integrations.vllm import RailcallLogitsProcessor

    engine = LLM(model=folder, logits_processors=[RailcallLogitsProcessor], **ENGINE_ARGS)
    yield engine
    engine.llm_engine.engine_core.shutdown()
