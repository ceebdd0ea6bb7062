"""railcall.models.llama: the embedded GGUF on llama.cpp, against llama.cpp's own generation.

Each test runs the real embedded SmolLM2-135M (Q4_1) in llama.cpp: the backend's greedy output
equals llama-cpp-python's own greedy generation token for token; rows batched together equal the
same rows run alone; a prefix-cache hit and a copied row (n > 1) equal a cold prefill; the
branch pass of scored routing equals feeding each branch alone; under a grammar no illegal token
is ever sampled and every output parses; a damaged GGUF gets a clear error.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is part of railcall[llama] and of `make setup`")

from railcall.errors import ModelError  # noqa: E402
from railcall.grammar.tools import Tool, tool_grammar  # noqa: E402
from railcall.matcher import Matcher, compiled_grammar  # noqa: E402
from railcall.runtime.batch import BatchLoop, PrefixCache, decode_stream  # noqa: E402
from railcall.runtime.decode import Row, SamplingParams, generate  # noqa: E402
from railcall.prompts.chat import chat_prompt_ids  # noqa: E402

pytestmark = pytest.mark.model

# llama.cpp is not batch-invariant: the same token's logits differ by up to ~1.2 with the shape of
# the pass that computes them (one token or a prompt's worth) and with where the sequence's cells
# lie in the shared cache (other sequences before them widen the attention's span of cells, and
# its sums run in another order); what the other cells hold changes nothing (measured: the same
# logits, to the bit, beside two different sequences). Runs that must be the same are the same
# token for token until, at most, a step where the reference's best two tokens were this close,
# where a near-tie may break the other way. Where the cells and the pass shapes are the same,
# runs are equal to the bit (the greedy test against llama-cpp-python's own generation).
NEAR_TIE = 1.0


def same_run(got, want) -> bool:
    """`got` equals `want` token for token, or up to a near-tie of `want` (both Generations decoded
    with top_logprobs=2), where `got` took the reference's second choice. Asserts otherwise."""
    for k, (a, b) in enumerate(zip(got.tokens, want.tokens)):
        if a == b:
            continue
        (t1, l1), (t2, l2) = want.steps[k].top[:2]
        assert a == t2 and l1 - l2 < NEAR_TIE, (
            f"step {k}: {a} against {b}, the reference's top two {t1} ({l1:.3f}), {t2} ({l2:.3f})")
        return False
    assert len(got.tokens) == len(want.tokens) or got.finish_reason == want.finish_reason == "length", (got.tokens, want.tokens)
    return True

TOOLS = [Tool("get_weather", "Current weather in a city",
              {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
               "required": ["city"]}),
         Tool("calc", "Evaluate an arithmetic expression",
              {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]})]
REQUESTS = ["What is the weather in Paris?", "Compute 12 * 7.", "Is it raining in Oslo right now?",
            "Tell me a joke about cats.", "What is 2 to the power of 10?"]


@pytest.fixture(scope="module")
def lm():
    from railcall.models.store import load_model

    return load_model(backend="llama", threads=2)


@pytest.fixture(scope="module")
def vocab(lm):
    return lm.vocabulary()


@pytest.fixture(scope="module")
def grammar(vocab):
    return compiled_grammar(tool_grammar(TOOLS, "json"), vocab)


@pytest.fixture(scope="module")
def prompts(lm):
    return [chat_prompt_ids(lm.tokenizer, TOOLS, r) for r in REQUESTS]


def test_it_is_the_default_for_a_gguf_and_reads_the_file_in_place(lm):
    from railcall.models.store import load_model, pick_backend, resolve_source

    assert lm.backend_name == "llama.cpp"
    assert pick_backend(resolve_source(None)) == "llama"
    assert pick_backend(resolve_source(None), device="cuda") == "transformers"
    assert lm.model.path.suffix == ".gguf" and lm.width == 49152
    with pytest.raises(ModelError, match="unknown backend"):
        load_model(backend="onnx")


def test_greedy_equals_llama_cpps_own_generation(lm, vocab, prompts):
    """Token for token, with no grammar: railcall's loop over the backend against
    llama-cpp-python's `Llama.generate` at temperature 0 on the same prompt ids. Each side starts
    from an empty cache (llama.cpp's sums depend on where a sequence's cells lie, see NEAR_TIE),
    and feeds a token a pass (a draft's passes have other shapes: tests/test_draft.py)."""
    import llama_cpp

    from railcall.models.llama import LlamaBackend, LlamaModel

    own = llama_cpp.Llama(str(lm.model.path), n_ctx=2048, n_threads=2, verbose=False)
    for p in prompts:
        want = []
        own.reset()
        for t in own.generate(p, temp=0.0, top_k=1, reset=True):
            if t in vocab.stop_ids or len(want) == 40:
                break
            want.append(t)
        fresh = LlamaModel(lm.model.path, threads=2)
        got = generate(LlamaBackend(fresh), vocab, p, None, SamplingParams(max_tokens=40), draft=0).tokens
        fresh.close()
        got = [t for t in got if t not in vocab.stop_ids]
        assert got == want, (vocab.decode(got), vocab.decode(want))
    own.close()


def test_drafts_equal_runs_without_them(lm, vocab, grammar, prompts):
    """A row that drafts (the forced tokens and looked-up ones in the pass of its next token)
    writes what it writes a pass a token, up to a near-tie (a draft's pass has another shape),
    in fewer passes; the sequence's cells end holding the prompt and the decided tokens only."""
    params = SamplingParams(max_tokens=40, top_logprobs=2)
    same, passes, plain_passes = [], 0, 0
    for i, p in enumerate(prompts + [prompts[0] + vocab.encode(" Paris, Paris, Paris.")]):
        m = (lambda: Matcher(grammar)) if i % 2 == 0 else (lambda: None)
        want = generate(lm.backend(), vocab, p, m(), params, draft=0)
        backend = lm.backend()
        got = generate(backend, vocab, p, m(), params, draft=8)
        same.append(same_run(got, want))
        passes, plain_passes = passes + got.forward_passes, plain_passes + want.forward_passes
        held = lm.model._ll.llama_memory_seq_pos_max(lm.model._mem, backend.seq) + 1
        assert held == len(backend._tokens) and backend._tokens == p + got.tokens[: held - len(p)]
        assert held >= len(p) + len(got.tokens) - 1
    assert sum(same) >= len(same) // 2, same  # the rest diverged at a near-tie (same_run asserts it)
    assert passes < plain_passes


def test_batched_rows_equal_the_same_rows_alone(lm, vocab, grammar, prompts):
    params = SamplingParams(max_tokens=32, top_logprobs=2)
    reqs = [(p, Matcher(grammar) if i % 2 == 0 else None) for i, p in enumerate(prompts)]
    want = [generate(lm.backend(), vocab, p, Matcher(grammar) if m is not None else None, params) for p, m in reqs]
    free = len(lm.model._free)
    got = dict(decode_stream(lm.model, vocab, reqs, params, max_rows=3))
    same = [same_run(got[i], w) for i, w in enumerate(want)]
    assert sum(same) >= 3, same  # most rows equal throughout; the rest up to a near-tie
    assert len(lm.model._free) == free  # every row's sequence freed


def test_a_prefix_cache_hit_and_a_copied_row_equal_a_cold_prefill(lm, vocab, grammar, prompts):
    params = SamplingParams(max_tokens=24, top_logprobs=2)
    want = [generate(lm.backend(), vocab, p, Matcher(grammar), params) for p in prompts[:3]]
    cache = PrefixCache(min_tokens=8)
    loop = BatchLoop(lm.model, vocab, max_rows=4, prefix_cache=cache)
    rows = []
    for p in prompts[:3]:  # one after another: the tool prompt's start is found in the cache
        row = Row(vocab, Matcher(grammar), params)
        loop.add(p, row)
        while loop.busy:
            loop.step()
        rows.append(row)
    assert sum(same_run(r.generation(), w) for r, w in zip(rows, want)) >= 2
    assert all(r.prompt_cached >= 50 for r in rows[1:]) and cache.hits == 2
    # three rows of one prompt share its prefill (keep copies the row into new sequences)
    copies = [Row(vocab, Matcher(grammar), params) for _ in range(3)]
    for r in copies:
        loop.add(prompts[0], r)
    while loop.busy:
        loop.step()
    outs = [r.generation().tokens for r in copies]
    assert outs[0] == outs[1] == outs[2]  # the copies share one prefill: the same cells, the same logits
    same_run(copies[0].generation(), want[0])
    cache.clear()
    assert not lm.model._kept


def test_the_single_backend_reuses_the_previous_sequence(lm, vocab, grammar, prompts):
    params = SamplingParams(max_tokens=16, top_logprobs=2)
    backend = lm.backend(reuse_prefix=True)
    g1 = generate(backend, vocab, prompts[0], Matcher(grammar), params)
    follow = prompts[0] + g1.tokens + prompts[1][-6:]
    g2 = generate(backend, vocab, follow, Matcher(grammar), params)
    assert g2.prompt_cached >= len(prompts[0])
    same_run(g2, generate(lm.backend(), vocab, follow, Matcher(grammar), params))


@pytest.mark.parametrize("single", [True, False])
def test_branch_logits_equal_each_branch_fed_alone(lm, vocab, prompts, single):
    """Scored routing's pass over the names' trie (shared first tokens, branches of different
    lengths) gives each branch the logits it has when fed alone after the prompt."""
    names = ["get_weather", "get_time", "calc", "calculate_tax"]
    branches = [lm.tokenizer.encode(n, add_special_tokens=False) for n in names]
    p = prompts[0]
    if single:
        b = lm.backend()
        b.start(p)
        got = b.branch_logits(branches)
        del b
    else:
        batch = lm.model.new_batch()
        batch.start([prompts[1], p])
        got = batch.branch_logits(1, branches)
        batch.release()
    for br, g in zip(branches, got):
        alone = lm.backend()
        alone.start(p)
        want = alone.feed(br)
        del alone  # its cells are free again: the next branch's run lies where this one did
        assert g.shape == want.shape
        diff = np.abs(g - want).max(axis=-1)
        assert (diff < 1.5).all(), diff  # the shape noise above, not another sequence's attention
        top = np.argsort(-want, axis=-1)[:, :2]
        for k, row in enumerate(want):
            if row[top[k, 0]] - row[top[k, 1]] > NEAR_TIE:
                assert int(g[k].argmax()) == top[k, 0]


def test_sampled_calls_are_always_legal_and_parse(lm, vocab, grammar, prompts):
    """The engine's property on this backend: sampled at temperature 1 with several seeds, every
    token is one the mask allowed (the matcher never errs) and every output is a call that parses
    and names a tool with its required argument."""
    params = [SamplingParams(max_tokens=48, temperature=1.0, seed=s, cut="close") for s in range(8)]
    reqs = [(prompts[s % len(prompts)], Matcher(grammar)) for s in range(8)]
    seen = 0
    for (i, g), (_, m) in zip(sorted(decode_stream(lm.model, vocab, reqs, params[0], max_rows=8)), reqs):
        assert not g.grammar_error, g.grammar_error
        if g.finish_reason == "length":
            continue  # cut by the ceiling (the test of budget-aware closing is elsewhere)
        call = json.loads(g.text)
        assert call["tool"] in ("get_weather", "calc")
        assert {"get_weather": "city", "calc": "expr"}[call["tool"]] in call["args"]
        seen += 1
    assert seen >= 4


def test_a_truncated_gguf_gets_a_clear_error(lm, tmp_path):
    from railcall.models.llama import LlamaModel

    cut = tmp_path / "cut.gguf"
    with open(lm.model.path, "rb") as f:
        cut.write_bytes(f.read(4 << 20))  # the header and metadata, a few tensors, then nothing
    with pytest.raises(ModelError, match="could not load .*cut.gguf.*complete GGUF"):
        LlamaModel(cut)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(ModelError, match="junk.gguf"):
        LlamaModel(junk)


def test_the_ggufs_own_tokenizer_equals_the_one_transformers_rebuilds(lm, vocab, prompts):
    """llama.cpp's tokenizer and the GGUF's chat template (no transformers) give the ids that the
    tokenizer transformers rebuilds from the same file gives, and the same vocabulary."""
    from railcall.models.store import load_tokenizer
    from railcall.vocab import Vocabulary

    hf = load_tokenizer()
    assert Vocabulary.from_hf(hf, logits_width=lm.width).token_bytes == vocab.token_bytes
    assert Vocabulary.from_hf(hf, logits_width=lm.width).stop_ids == vocab.stop_ids
    for text in REQUESTS + ["héllo wörld 🎉 中文  two  spaces\n\nnew", "<|im_start|>user\nhi<|im_end|>", ""]:
        assert lm.tokenizer.encode(text, add_special_tokens=False) == hf.encode(text, add_special_tokens=False)
    assert prompts == [chat_prompt_ids(hf, TOOLS, r) for r in REQUESTS]
    assert lm.tokenizer.decode(prompts[0]) == hf.decode(prompts[0])


def test_no_torch_and_no_transformers_on_this_path(tmp_path):
    """The embedded model on llama.cpp, a call under the grammar with scored routing, sampled:
    neither torch nor transformers is imported (`pip install 'railcall[llama]'` has neither)."""
    import subprocess
    import sys

    script = (
        "import sys, json\n"
        "from railcall.models.store import load_model\n"
        "from railcall.demo import DEMO_TOOLS\n"
        "from railcall.grammar.tools import tool_grammar\n"
        "from railcall.matcher import Matcher, compiled_grammar\n"
        "from railcall.runtime.decode import SamplingParams, generate\n"
        "from railcall.prompts.chat import chat_prompt_ids\n"
        "from railcall.heuristics.routing import NameRouter\n"
        "lm = load_model()\n"
        "vocab = lm.vocabulary()\n"
        "g = compiled_grammar(tool_grammar(DEMO_TOOLS), vocab)\n"
        "p = chat_prompt_ids(lm.tokenizer, DEMO_TOOLS, 'What is 17 times 23?')\n"
        "out = generate(lm.backend(), vocab, p, Matcher(g), SamplingParams(max_tokens=40, temperature=0.7, seed=1),\n"
        "               router=NameRouter.for_tools(vocab, DEMO_TOOLS, 'json', temperature=0.7))\n"
        "json.loads(out.text)\n"
        "print(lm.backend_name, sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "llama.cpp []"


def test_a_kept_prefix_is_held_from_its_lookup_to_its_copy(lm, vocab, grammar, prompts):
    """The model gives up kept prefixes when it needs ids or cells, least recently used first,
    but never one a row has found and not yet copied; one given up before its copy (an entry
    found, then released) costs a full prefill, never a row on someone else's cells."""
    from railcall.models.llama import KVFull, LlamaModel

    small = LlamaModel(lm.model.path, threads=2, cells=1024, sequences=3)
    s = small.new_seq()
    small.run(s, prompts[0], 0)
    kept = small.keep_seq(s, len(prompts[0]))
    small.free_seq(s)
    kept.touch()  # found by a lookup: pinned
    a, b = small.new_seq(), small.new_seq()
    with pytest.raises(KVFull):
        small.new_seq()  # the only kept entry is pinned: not given up
    kept.unpin()
    c = small.new_seq()  # now it goes
    assert not kept.alive and c == kept.seq
    for q in (a, b, c):
        small.free_seq(q)
    # a hit whose entry was released before its copy: the whole prompt runs
    s = small.new_seq()
    small.run(s, prompts[0], 0)
    kept = small.keep_seq(s, len(prompts[0]))
    small.free_seq(s)
    kept.touch()
    kept.release()
    batch = small.new_batch()
    logits = batch.start_cached(prompts[0], len(prompts[0]) - 1, kept)
    assert batch.last_cached == 0 and batch.pos == [len(prompts[0])]
    cold = small.new_batch()
    want = cold.start([prompts[0]])
    assert int(np.argmax(logits[0])) == int(np.argmax(want[0]))
    batch.release()
    cold.release()
    assert len(small._free) == 3
    small.close()


def test_a_prompt_the_cache_cannot_hold_ends_alone_and_frees_everything(lm, vocab, prompts):
    from railcall.models.llama import LlamaModel

    small = LlamaModel(lm.model.path, threads=2, cells=256, sequences=4)
    loop = BatchLoop(small, vocab, max_rows=2)
    too_long = Row(vocab, None, SamplingParams(max_tokens=4))
    loop.add(prompts[0] * 3, too_long)  # ~470 tokens: more than the 256 cells
    ended = []
    for _ in range(40):  # its prompt runs in chunks (BatchLoop.step_tokens) until the cells are full
        ended += loop.step()
        if ended:
            break
    assert ended == [too_long] and too_long.finish_reason == "error" and "cells" in str(too_long.error)
    assert len(small._free) == 4 and not loop.busy
    # beside a live row, a prompt that does not fit waits; the live row finishes
    ok = Row(vocab, None, SamplingParams(max_tokens=4))
    loop.add(prompts[1], ok)
    loop.step()
    waits = Row(vocab, None, SamplingParams(max_tokens=4))
    loop.add(prompts[2], waits)  # ~155 + ~155 tokens > 256 cells while `ok` holds its cells
    for _ in range(40):
        loop.step()
    assert ok.finish_reason == "length" and len(ok.out) == 4
    assert waits.ended and len(waits.out) == 4  # admitted once `ok` left
    assert len(small._free) == 4
    small.close()


def test_an_abandoned_stream_frees_its_rows_and_a_negative_seed_samples(lm, vocab, prompts):
    free = len(lm.model._free)
    stream = decode_stream(lm.model, vocab, [(p, None) for p in prompts],
                           SamplingParams(max_tokens=3, temperature=1.0, seed=-5), max_rows=4)
    next(stream)
    stream.close()  # a consumer that stops early
    assert len(lm.model._free) == free


def test_q4_1_weights_are_re_laid_out_as_q8_0_once(lm, tmp_path, monkeypatch):
    """A Q4_1 GGUF runs as Q8_0 (llama.cpp has no batched Q4_1 kernel without AMX), written once
    into the cache and found there after; RAILCALL_LLAMA_REQUANTIZE=0 runs the file as it is;
    a file of another type runs as it is."""
    from railcall.gguf import read_metadata
    from railcall.models.llama import runnable_weights
    from railcall.models.store import embedded_gguf_path

    monkeypatch.setenv("RAILCALL_HOME", str(tmp_path))
    src = embedded_gguf_path()
    assert read_metadata(src)["general.file_type"] == 3  # the embedded SmolLM2 is Q4_1
    out = runnable_weights(src, "smollm2")
    assert out.parent == tmp_path / "models" and out.name.endswith("-q8_0.gguf")
    assert read_metadata(out)["general.file_type"] == 7 and not list(out.parent.glob(".*tmp"))
    stamp = out.stat().st_mtime_ns
    assert runnable_weights(src, "smollm2") == out and out.stat().st_mtime_ns == stamp  # found, not redone
    assert runnable_weights(out, "again") == out  # Q8_0 runs as it is
    monkeypatch.setenv("RAILCALL_LLAMA_REQUANTIZE", "0")
    assert runnable_weights(src, "smollm2") == src


def test_the_servers_prefix_cache_keeps_a_quarter_of_the_cells_at_most():
    """Kept prefixes widen every step's span of cells on llama.cpp, so the server's prefix cache
    is held to a quarter of them; a transformers model keeps the budget asked for."""
    import types

    from railcall.server.model import ServedModel

    llama = types.SimpleNamespace(lm=types.SimpleNamespace(model=types.SimpleNamespace(cells=8192, bytes_per_token=1000)))
    torchy = types.SimpleNamespace(lm=types.SimpleNamespace(model=types.SimpleNamespace(config=None)))
    assert ServedModel.prefix_budget(llama, 256 << 20) == 2048 * 1000
    assert ServedModel.prefix_budget(llama, 1000) == 1000
    assert ServedModel.prefix_budget(torchy, 256 << 20) == 256 << 20
