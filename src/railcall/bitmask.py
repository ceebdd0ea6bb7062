"""Token bitmasks: allocate, pack, unpack, and apply to numpy or torch logits in place.

Layout (the same as llguidance's and xgrammar's, so masks interoperate): an int32 array of
ceil(width / 32) words per row; bit i % 32 of word i // 32 (little-endian) is token i.

Applying a mask sets every illegal logit to -inf and leaves the legal ones exactly as the model
produced them: masking removes tokens from the model's distribution, it never flattens it
(zeroing the survivors would throw away the only judgement the model contributes).
torch is imported only when a torch tensor is passed.
"""

from __future__ import annotations

import numpy as np


def bitmask_words(width: int) -> int:
    return (width + 31) // 32


def allocate_bitmask(width: int, batch: int | None = None) -> np.ndarray:
    """A zeroed int32 bitmask for `width` logits ((words,) or (batch, words))."""
    shape = (bitmask_words(width),) if batch is None else (batch, bitmask_words(width))
    return np.zeros(shape, dtype=np.int32)


def pack_ids(ids, width: int) -> np.ndarray:
    """(words,) int32 with the bits of `ids` set."""
    bits = np.zeros(bitmask_words(width) * 32, dtype=bool)
    bits[np.asarray(ids, dtype=np.int64)] = True
    return np.packbits(bits, bitorder="little").view(np.int32)


def unpack_bitmask(bitmask: np.ndarray, width: int) -> np.ndarray:
    """(…, words) int32 -> (…, width) bool."""
    bm = np.ascontiguousarray(bitmask)
    bits = np.unpackbits(bm.view(np.uint8), axis=-1, bitorder="little")
    return bits[..., :width].astype(bool)


def apply_bitmask(logits, bitmask) -> None:
    """Set illegal logits to -inf in place. `logits` is (width,) or (batch, width), numpy or
    torch; `bitmask` is the matching (words,) or (batch, words) int32 array or tensor. Logits
    beyond the mask's width are illegal too (padding ids)."""
    if isinstance(logits, np.ndarray):
        _apply_numpy(logits, np.asarray(bitmask))
    else:
        _apply_torch(logits, bitmask)


def _apply_numpy(logits: np.ndarray, bitmask: np.ndarray) -> None:
    width = logits.shape[-1]
    words = bitmask.shape[-1]
    legal = unpack_bitmask(bitmask, min(width, words * 32))
    if logits.ndim == 2 and legal.ndim == 1:
        legal = np.broadcast_to(legal, (logits.shape[0], legal.shape[-1]))
    if width > legal.shape[-1]:
        logits[..., legal.shape[-1]:] = -np.inf
    view = logits[..., : legal.shape[-1]]
    view[~legal] = -np.inf


_SHIFTS = {}


def _apply_torch(logits, bitmask) -> None:
    import torch

    if not isinstance(bitmask, torch.Tensor):
        bitmask = torch.from_numpy(np.ascontiguousarray(bitmask))
    bitmask = bitmask.to(logits.device)
    key = logits.device
    shifts = _SHIFTS.get(key)
    if shifts is None:
        shifts = _SHIFTS[key] = torch.arange(32, dtype=torch.int32, device=logits.device)
    width = logits.shape[-1]
    bits = ((bitmask.unsqueeze(-1) >> shifts) & 1).bool().flatten(-2)  # (…, words * 32)
    n = min(width, bits.shape[-1])
    if width > n:
        logits[..., n:] = float("-inf")
    logits[..., :n].masked_fill_(~bits[..., :n], float("-inf"))


def log_softmax(logits):
    """Log-probabilities along the last axis, -inf where a logit is -inf: numpy logits (the
    llama.cpp backend) in numpy, float32 out; torch ones (transformers) in torch."""
    if isinstance(logits, np.ndarray):
        top = logits.max(axis=-1, keepdims=True)
        z = logits - np.where(np.isfinite(top), top, 0)
        with np.errstate(divide="ignore"):
            return z - np.log(np.exp(z, dtype=np.float64).sum(axis=-1, keepdims=True)).astype(np.float32)
    import torch

    return torch.log_softmax(logits.float(), dim=-1)
