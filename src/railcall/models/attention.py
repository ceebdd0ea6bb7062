"""Grouped-query attention without copying the keys and values.

SmolLM2 and Gemma 3 share each key/value head among several query heads (3 and 4 of them).
transformers' SDPA path runs a one-token step with the query heads packed onto their key/value
head, but any step that feeds more tokens with a mask first copies every key and value head
once per query head that reads it (`repeat_kv`): over a batch's whole cache, in every layer.
railcall's decode loop feeds several tokens whenever the grammar forces them (fast-forward), and
a batch's rows carry masks (left padding), so its multi-token steps paid that copy on every
cached position. On SmolLM2, 16 rows of 700 cached tokens, a 4-token step took 3.1 s with the
copy and 2.3 s without it.

`grouped_sdpa` gives each key/value head its query heads as more query rows, `(batch, kv_heads,
group * q, dim)`, with the mask's rows tiled to match, and runs one SDPA over the cache as it is.
It is the same attention: each query row is softmaxed over the same keys, and on this machine's
kernels the logits equal the copying path's bit for bit (tests/test_models_attention.py compares
them on small random models, with padding, cached steps and explicit 4D masks).

`use_grouped_attention(model)` switches a loaded model to it (`railcall.models.store.load_model`
does, where a model shares its key/value heads); the masks are built as for SDPA.
"""

from __future__ import annotations

NAME = "railcall_grouped_sdpa"
_NOT_HERE = ("position_bias", "cache", "softcap", "s_aux")  # left to transformers' SDPA function


def grouped_sdpa(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, is_causal=None,
                 **kwargs):
    """transformers' attention-function signature: query (batch, heads, q, dim), key and value
    (batch, kv_heads, length, dim), the mask as SDPA takes it (bool or additive float; None for
    plain causal). Returns (batch, q, heads, dim) and no weights."""
    import torch

    b, heads, q, dim = query.shape
    kv_heads = key.shape[1]
    group = heads // kv_heads
    if attention_mask is None or group == 1 or any(kwargs.get(k) is not None for k in _NOT_HERE):
        # no mask (an unpadded prefill: SDPA's own causal kernel), nothing to group, or a feature
        # this function does not implement: as transformers does it
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    query = query.reshape(b, kv_heads, group * q, dim)  # query head h reads key/value head h // group
    mask = attention_mask[:, :, :, : key.shape[-2]]
    if mask.shape[2] > 1:  # a mask row per query row (one row broadcasts over them as it is)
        mask = mask.repeat(1, 1, group, 1)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=dropout if module.training else 0.0, scale=scaling)
    return out.reshape(b, heads, q, dim).transpose(1, 2).contiguous(), None


def register() -> str:
    """Register the function and its mask builder with transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, grouped_sdpa)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME


def use_grouped_attention(model) -> bool:
    """Switch `model` to `grouped_sdpa` where it runs SDPA and shares key/value heads; returns
    whether it did. A model on eager, flash or any other attention is left as it is."""
    config = getattr(model, "config", None)
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if not heads or kv_heads == heads or getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    try:
        model.set_attn_implementation(register())
    except (ValueError, AttributeError):  # an architecture that refuses custom attention
        return False
    return True
