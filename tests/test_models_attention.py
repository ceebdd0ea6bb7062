"""Grouped-query attention without the key/value copy (railcall.models.attention) computes what
transformers' SDPA path computes: on small random Llama (SmolLM2's architecture) and Gemma 3
models, for a padded prefill, cached steps of one and of several tokens, an explicit 4D mask
(scored routing's branches) and an unpadded prefill."""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from railcall.models.attention import NAME, grouped_sdpa, use_grouped_attention  # noqa: E402


def llama():
    cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=128)
    return cfg, transformers.LlamaForCausalLM


def gemma3():
    cfg = transformers.Gemma3TextConfig(vocab_size=97, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=1, head_dim=16, sliding_window=6,
                                        max_position_embeddings=128, layer_types=["sliding_attention", "full_attention"])
    return cfg, transformers.Gemma3ForCausalLM


def pair(make):
    """The same random weights twice: SDPA as loaded, and switched to the grouped function."""
    (cfg, cls), (cfg2, _) = make(), make()  # a config each: switching one leaves the other
    cfg._attn_implementation = cfg2._attn_implementation = "sdpa"
    torch.manual_seed(0)
    plain = cls(cfg).eval()
    grouped = cls(cfg2).eval()
    grouped.load_state_dict(plain.state_dict())
    assert use_grouped_attention(grouped)
    assert grouped.config._attn_implementation == NAME and plain.config._attn_implementation == "sdpa"
    return plain, grouped


def steps(model, ids, mask, feeds):
    """Prefill `ids` (left-padded by `mask`), then feed each (rows, k) block of `feeds` on the cache:
    every step's logits."""
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    out = []
    with torch.no_grad():
        o = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
        out.append(o.logits)
        cache, last = o.past_key_values, pos[:, -1:]
        for f in feeds:
            k = f.shape[1]
            mask = torch.cat([mask, torch.ones(mask.shape[0], k, dtype=mask.dtype)], 1)
            fpos = last + 1 + torch.arange(k)
            o = model(input_ids=f, attention_mask=mask, position_ids=fpos, past_key_values=cache, use_cache=True)
            out.append(o.logits)
            cache, last = o.past_key_values, fpos[:, -1:]
    return out


@pytest.mark.parametrize("make", [llama, gemma3], ids=["llama", "gemma3"])
def test_grouped_attention_equals_sdpa_with_padding_and_cached_steps(make):
    plain, grouped = pair(make)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 97, (3, 12), generator=g)
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[0, :5] = 0  # left padding, as a batch's shorter rows have
    mask[2, :2] = 0
    feeds = [torch.randint(0, 97, (3, k), generator=g) for k in (1, 4, 1, 3)]  # forced tokens feed several
    for a, b in zip(steps(plain, ids, mask, feeds), steps(grouped, ids, mask, feeds)):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-5), (a - b).abs().max()
    # one row, no padding: no mask is built, and transformers' own causal path runs
    ids1, m1 = ids[1:2], torch.ones(1, 12, dtype=torch.long)
    assert torch.equal(steps(plain, ids1, m1, [])[0], steps(grouped, ids1, m1, [])[0])


def test_an_explicit_4d_mask_is_read_as_given():
    """Scored routing passes its own additive (rows, 1, q, cached + q) mask: branches that see
    only their ancestors."""
    plain, grouped = pair(llama)
    ids = torch.randint(0, 97, (1, 6), generator=torch.Generator().manual_seed(2))
    see = torch.ones(6, 6).tril().bool()
    see[3, 1:3] = False  # node 3 starts a second branch off node 0
    see[4:, 1:3] = False
    add = torch.zeros(1, 1, 6, 6).masked_fill(~see, torch.finfo(torch.float32).min)
    pos = torch.tensor([[0, 1, 2, 1, 2, 3]])
    with torch.no_grad():
        a = plain(input_ids=ids, attention_mask=add, position_ids=pos).logits
        b = grouped(input_ids=ids, attention_mask=add, position_ids=pos).logits
    assert torch.allclose(a, b, atol=1e-5, rtol=1e-5)


def test_only_shared_key_value_heads_under_sdpa_are_switched():
    cfg, cls = llama()
    cfg.num_key_value_heads = cfg.num_attention_heads  # nothing shared: nothing to gain
    cfg._attn_implementation = "sdpa"
    assert not use_grouped_attention(cls(cfg))
    cfg, cls = llama()
    cfg._attn_implementation = "eager"
    model = cls(cfg)
    assert not use_grouped_attention(model) and model.config._attn_implementation == "eager"


def test_the_function_groups_query_heads_onto_their_key_value_head():
    """Directly: query head h reads key/value head h // group, with a mask row per query row."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, h, n, 8, generator=g) for h, n in ((6, 4), (2, 9), (2, 9)))
    mask = torch.rand(2, 1, 4, 9, generator=g) > 0.3
    mask[..., 0] = True

    class M(torch.nn.Module):
        training = False

    out, _ = grouped_sdpa(M(), q, k, v, mask, scaling=0.5)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1),
                                                           attn_mask=mask, scale=0.5).transpose(1, 2)
    assert out.shape == (2, 4, 6, 8) and torch.allclose(out, ref, atol=1e-6)
