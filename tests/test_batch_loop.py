"""railcall.runtime.batch: the continuous-batching loop and the prefix cache, on a tiny random Llama.

The model is a real transformers LlamaForCausalLM (2 layers, 64 wide, random weights, seeded), so
every KV path -- left pads, right pads, rows joining and leaving, a cached prefix, a cropped
cache -- runs through transformers' own attention; only its size is unreal. Outputs are compared
at temperature 0 with the single-sequence loop, which runs no padding and no cache reuse.
"""

from __future__ import annotations

import pytest
import torch

from conftest import byte_level_vocab
from railcall.runtime.batch import BatchLoop, PrefixCache, decode_stream
from railcall.runtime.decode import Row, SamplingParams, generate
from railcall.grammar.tools import Tool, tool_grammar
from railcall.matcher import Matcher, compiled_grammar
from railcall.models.backend import TransformersBackend

TOOLS = [Tool("get_weather", "", {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
         Tool("calc", "", {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]})]


@pytest.fixture(scope="module")
def vocab():
    return byte_level_vocab()


@pytest.fixture(scope="module")
def lm(vocab):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab.logits_width, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      initializer_range=0.2)
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def grammar(vocab):
    return compiled_grammar(tool_grammar(TOOLS, "json"), vocab)


def prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return [int(t) for t in torch.randint(1, 250, (n,), generator=g)]


def single(lm, vocab, p, matcher, params, **kw):
    return generate(TransformersBackend(lm, **kw), vocab, p, matcher, params)


def test_rows_joining_and_leaving_equal_the_single_loop(lm, vocab, grammar):
    params = SamplingParams(max_tokens=20)
    prompts = [prompt(n, i) for i, n in enumerate([5, 30, 12, 30, 9, 41])]
    constrained = [i % 2 == 0 for i in range(len(prompts))]
    want = [single(lm, vocab, p, Matcher(grammar) if c else None, params).tokens for p, c in zip(prompts, constrained)]
    loop = BatchLoop(lm, vocab, max_rows=3)
    rows, got = [], {}
    for i, (p, c) in enumerate(zip(prompts, constrained)):
        row = Row(vocab, Matcher(grammar) if c else None, params)
        rows.append(row)
        loop.add(p, row)
        for r in loop.step():  # a row is added every step: rows join a batch in flight
            got[rows.index(r)] = r.generation().tokens
    while loop.busy:
        for r in loop.step():
            got[rows.index(r)] = r.generation().tokens
    assert [got[i] for i in range(len(prompts))] == want
    assert loop.forward_passes < sum(r.passes for r in rows)  # passes were shared


def test_decode_stream_equals_the_single_loop(lm, vocab, grammar):
    params = SamplingParams(max_tokens=16)
    reqs = [(prompt(7 + 3 * i, 100 + i), Matcher(grammar) if i % 3 else None) for i in range(7)]
    want = [single(lm, vocab, p, Matcher(grammar) if m is not None else None, params).tokens for p, m in reqs]
    got = dict((i, g.tokens) for i, g in decode_stream(lm, vocab, reqs, params, max_rows=4))
    assert [got[i] for i in range(len(reqs))] == want


def test_prefix_cache_changes_nothing_but_the_prefill(lm, vocab, grammar):
    params = SamplingParams(max_tokens=12)
    system = prompt(60, 7)
    prompts = [system + prompt(5, 20 + i) for i in range(4)]
    want = [single(lm, vocab, p, Matcher(grammar), params).tokens for p in prompts]
    cache = PrefixCache(min_tokens=8)
    loop = BatchLoop(lm, vocab, max_rows=4, prefix_cache=cache)
    got = []
    for p in prompts:  # one after another: each finds the one before in the cache
        row = Row(vocab, Matcher(grammar), params)
        loop.add(p, row)
        while loop.busy:
            loop.step()
        got.append(row)
    assert [r.generation().tokens for r in got] == want
    assert got[0].prompt_cached == 0 and all(r.prompt_cached >= 60 for r in got[1:])
    assert cache.hits == 3 and cache.tokens_saved >= 180
    assert loop.prefilled_tokens == len(prompts[0]) + sum(len(p) - r.prompt_cached for p, r in zip(prompts[1:], got[1:]))


def test_rows_admitted_together_into_an_empty_batch_with_cached_prefixes(lm, vocab, grammar):
    """Once every row has ended, a burst of new requests is admitted at once: some prefill in
    one batch, each with a cached prefix in one of its own, and all of those batches make the
    new one (not only the last: its rows' logits would meet a batch of another size)."""
    params = SamplingParams(max_tokens=10)
    system = prompt(40, 11)
    first = [system + prompt(4, 30 + i) for i in range(2)]
    burst = [system + prompt(5, 40 + i) for i in range(2)] + [prompt(9, 50), prompt(12, 51)]
    want = [single(lm, vocab, p, Matcher(grammar), params).tokens for p in first + burst]
    cache = PrefixCache(min_tokens=8)
    loop = BatchLoop(lm, vocab, max_rows=8, prefix_cache=cache)
    rows = []
    for batch in (first, burst):  # the second group waits until the first has ended
        group = [Row(vocab, Matcher(grammar), params) for _ in batch]
        for p, row in zip(batch, group):
            loop.add(p, row)
        while loop.busy:
            loop.step()
        rows += group
    assert [r.generation().finish_reason for r in rows].count("error") == 0
    assert [r.generation().tokens for r in rows] == want
    assert sum(r.prompt_cached >= 40 for r in rows[2:4]) == 2  # two of the burst took a cached prefix


def test_prefix_cache_is_bounded_in_bytes_and_keeps_the_longest(lm, vocab):
    cache = PrefixCache(max_bytes=1 << 20, min_tokens=4)
    kv = lambda n: [(torch.zeros(1, 2, n, 16), torch.zeros(1, 2, n, 16))] * 2  # noqa: E731  (n * 512 bytes)
    cache.store(list(range(10)), kv(10))
    cache.store(list(range(20)), kv(20))  # extends the first: replaces it
    assert len(cache) == 1
    m, _ = cache.lookup(list(range(15)) + [99])
    assert m == 15
    m, _ = cache.lookup(list(range(3)) + [99] * 10)
    assert m == 0  # shorter than min_tokens: a miss
    for k in range(200):
        cache.store([1000 + k] * 4 + list(range(500)), kv(504))
    assert cache.bytes <= cache.max_bytes and len(cache) < 200


def test_the_single_backend_reuses_the_previous_sequence(lm, vocab, grammar):
    params = SamplingParams(max_tokens=10)
    first = prompt(50, 3)
    backend = TransformersBackend(lm, reuse_prefix=True)
    g1 = generate(backend, vocab, first, Matcher(grammar), params)
    follow = first + g1.tokens + prompt(6, 4)  # the next step of an episode
    g2 = generate(backend, vocab, follow, Matcher(grammar), params)
    assert g2.prompt_cached >= 50
    assert g2.tokens == single(lm, vocab, follow, Matcher(grammar), params).tokens


def test_a_cancelled_row_leaves_within_one_step(lm, vocab):
    loop = BatchLoop(lm, vocab, max_rows=4)
    flag = {"stop": False}
    a = Row(vocab, None, SamplingParams(max_tokens=50), cancelled=lambda: flag["stop"])
    b = Row(vocab, None, SamplingParams(max_tokens=50))
    loop.add(prompt(10, 1), a)
    loop.add(prompt(10, 2), b)
    loop.step()
    loop.step()
    flag["stop"] = True
    ended = loop.step()
    assert ended == [a] and a.finish_reason == "cancelled" and loop.live == [b]


def test_a_failing_row_ends_alone(lm, vocab):
    loop = BatchLoop(lm, vocab, max_rows=4)

    def boom(step):
        raise RuntimeError("listener failed")

    a = Row(vocab, None, SamplingParams(max_tokens=5), on_step=boom)
    b = Row(vocab, None, SamplingParams(max_tokens=5))
    loop.add(prompt(8, 1), a)
    loop.add(prompt(8, 2), b)
    ended = loop.step()
    assert ended == [a] and a.finish_reason == "error" and isinstance(a.error, RuntimeError)
    while loop.busy:
        ended += loop.step()
    assert b in ended and b.finish_reason == "length" and len(b.out) == 5


BRANCHES = {
    "shared prefixes": [[5, 6, 7], [5, 6, 9, 4], [5, 8], [12]],
    "different lengths": [[5, 6, 7], [8], [9, 10]],
    "one branch": [[5, 6, 7, 8]],
}


def one_by_one(lm, p, branches):
    """The reference: each branch fed alone after the prompt, on a fresh sequence."""
    out = []
    for b in branches:
        ref = TransformersBackend(lm)
        ref.start(p)
        out.append(ref.feed(b))
    return out


@pytest.fixture(scope="module")
def eager_lm(lm):
    """The same weights under eager attention (which adds the float mask itself)."""
    from transformers import LlamaForCausalLM

    cfg = lm.config.__class__(**lm.config.to_dict())
    cfg._attn_implementation = "eager"
    m = LlamaForCausalLM(cfg).eval()
    m.load_state_dict(lm.state_dict())
    return m


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("case", list(BRANCHES))
def test_branch_logits_in_one_pass_over_the_trie(lm, eager_lm, vocab, case, attention):
    """Scored routing's scorer: the branches' trie in one forward pass on the sequence's KV gives
    each branch the logits it has alone, and the cache is cropped back to exactly what it held."""
    lm = eager_lm if attention == "eager" else lm
    assert lm.config._attn_implementation == attention
    branches = BRANCHES[case]
    p = prompt(20, 9)
    backend = TransformersBackend(lm)
    backend.start(p)
    before = [(layer.keys.clone(), layer.values.clone()) for layer in backend._cache.layers]
    passes = backend.forward_passes
    got = backend.branch_logits(branches)
    assert backend.forward_passes == passes + 1
    for (k, v), layer in zip(before, backend._cache.layers):
        assert torch.equal(k, layer.keys) and torch.equal(v, layer.values)
    for b, rows, want in zip(branches, got, one_by_one(lm, p, branches)):
        assert rows.shape == (len(b), backend.width)
        assert torch.allclose(rows, want, atol=1e-4)
    after = backend.feed([11])[-1]
    ref = TransformersBackend(lm)
    ref.start(p)
    assert torch.allclose(after, ref.feed([11])[-1], atol=1e-4)  # the sequence went on as if no branch ran


def test_branch_tree_layout():
    from railcall.models.backend import BranchTree

    t = BranchTree([[5, 6, 7], [5, 6, 9], [8], [5, 6, 7]])
    assert t.tokens == [5, 6, 7, 9, 8] and t.depth == [0, 1, 2, 2, 0] and t.parent == [-1, 0, 1, 1, -1]
    assert t.paths == [[0, 1, 2], [0, 1, 3], [4], [0, 1, 2]]
    seen = t.visible()
    assert seen[3].tolist() == [True, True, False, True, False]  # 9 sees 5, 6 and itself, not its sibling 7
    mask = t.attention_mask(torch.tensor([False, True]), torch.float32)
    assert mask.shape == (1, 1, 5, 7)
    assert mask[0, 0, :, 0].eq(torch.finfo(torch.float32).min).all() and mask[0, 0, :, 1].eq(0).all()


def test_batch_branch_logits_of_a_padded_row(lm, vocab):
    """In the batched loop a row's branches run on a copy of its KV (left pads and all) and leave
    the batch as it was."""
    from railcall.models.backend import TransformersBatch

    branches = BRANCHES["shared prefixes"]
    short, long_ = prompt(9, 3), prompt(25, 4)
    batch = TransformersBatch(lm, pad_id=0)
    batch.start([long_, short])  # the short prompt is left-padded
    batch.feed([[40], [41, 42]])
    got = batch.branch_logits(1, branches)
    for rows, want in zip(got, one_by_one(lm, short + [41, 42], branches)):
        assert torch.allclose(rows, want, atol=1e-4)
    after = batch.feed([[43], [44]])
    ref = TransformersBackend(lm)
    ref.start(short + [41, 42])
    assert torch.allclose(after[1], ref.feed([44])[-1], atol=1e-4)


def test_scored_routing_in_the_batch_equals_the_single_loop(lm, vocab):
    """A router built without a scorer is bound to whatever runs its row: the backend under
    `generate`, the row's batch under `decode_stream`; both choose the same names."""
    from railcall.heuristics.routing import NameRouter

    tools = [Tool("get_weather", "", {"type": "object", "properties": {"city": {"type": "string"}}}),
             Tool("get_time"), Tool("calc")]
    g = compiled_grammar(tool_grammar(tools, "json"), vocab)
    params = SamplingParams(max_tokens=24)
    prompts = [prompt(n, 50 + n) for n in (6, 17, 11)]
    want, routers = [], []
    for p in prompts:
        r = NameRouter.for_tools(vocab, tools, "json")
        want.append(generate(TransformersBackend(lm), vocab, p, Matcher(g), params, router=r).tokens)
        assert r.routed == 1 and r.passes == 1
    reqs = []
    for p in prompts:
        routers.append(NameRouter.for_tools(vocab, tools, "json"))
        reqs.append((p, Matcher(g), routers[-1]))
    got = dict((i, gen.tokens) for i, gen in decode_stream(lm, vocab, reqs, params, max_rows=3))
    assert [got[i] for i in range(len(prompts))] == want
    assert [r.passes for r in routers] == [1, 1, 1]


# Every device this torch has: the CPU always, a CUDA GPU where there is one.
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_the_batch_runs_on_the_models_device_and_equals_the_cpu_loop(lm, vocab, grammar, device):
    """A model on an accelerator keeps its KV there; the bookkeeping travels with each pass and
    the logits come back to the CPU, where masks and sampling run. Rows joining and leaving, a
    prefix-cache hit and scored routing's branch pass give the single CPU loop's tokens."""
    import copy

    from railcall.models.backend import TransformersBatch
    from railcall.heuristics.routing import NameRouter

    model = copy.deepcopy(lm).to(device)
    params = SamplingParams(max_tokens=16)
    reqs = [(prompt(7 + 5 * i, 300 + i), Matcher(grammar) if i % 3 else None) for i in range(7)]
    want = [single(lm, vocab, p, Matcher(grammar) if m is not None else None, params).tokens for p, m in reqs]
    got = dict((i, g.tokens) for i, g in decode_stream(model, vocab, reqs, params, max_rows=4))
    assert [got[i] for i in range(len(reqs))] == want

    system = prompt(40, 9)
    cache = PrefixCache(min_tokens=8)
    loop = BatchLoop(model, vocab, max_rows=2, prefix_cache=cache)
    rows = []
    for k in range(3):
        rows.append(Row(vocab, Matcher(grammar), params))
        loop.add(system + prompt(4, 400 + k), rows[-1])
        while loop.busy:
            loop.step()
    assert cache.hits == 2
    for k, r in enumerate(rows):
        assert r.generation().tokens == single(lm, vocab, system + prompt(4, 400 + k), Matcher(grammar), params).tokens

    tools = [Tool("get_weather", "", {"type": "object", "properties": {"city": {"type": "string"}}}),
             Tool("get_time"), Tool("calc")]
    g = compiled_grammar(tool_grammar(tools, "json"), vocab)
    p = prompt(13, 77)
    r = NameRouter.for_tools(vocab, tools, "json")
    ref = generate(TransformersBackend(lm), vocab, p, Matcher(g), params, router=r).tokens
    r = NameRouter.for_tools(vocab, tools, "json")
    (_, gen), = decode_stream(model, vocab, [(p, Matcher(g), r)], params, max_rows=1)
    assert gen.tokens == ref and r.passes == 1
    batch = TransformersBatch(model)
    assert batch.start([p]).device.type == "cpu"  # what the rows' masks are applied to
