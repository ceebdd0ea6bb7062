"""Model backends: the one small seam between the decode loop and a model.

A backend is built once per model and serves one sequence at a time: `start(prompt)` runs the
prompt and returns the logits for the next token; `feed(tokens)` appends one or more tokens
(several at once is the fast-forward of forced tokens: one forward pass instead of one per
token) and returns the logits after each of them. Logits are float32 torch tensors of the
model's logits width. A llama.cpp or vLLM backend implements the same two methods.
"""

from __future__ import annotations

from typing import Protocol, Sequence


class Backend(Protocol):
    width: int

    def start(self, prompt: Sequence[int]):
        """Run the prompt; return (width,) logits for the next token."""

    def feed(self, tokens: Sequence[int]):
        """Append tokens; return (len(tokens), width) logits, row i predicting the token after
        tokens[i]."""


class TransformersBackend:
    """A transformers causal LM on the CPU with a KV cache. Built once per model; one sequence
    at a time (`start` resets it)."""

    def __init__(self, model, tokenizer=None):
        self.model = model
        self.tokenizer = tokenizer
        self.width = int(model.config.vocab_size)
        self._cache = None
        self.forward_passes = 0

    def start(self, prompt):
        import torch
        from transformers import DynamicCache

        self._cache = DynamicCache()
        self.forward_passes = 0
        return self._run(torch.tensor([list(prompt)], dtype=torch.long))[-1]

    def feed(self, tokens):
        import torch

        return self._run(torch.tensor([list(tokens)], dtype=torch.long))

    def _run(self, ids):
        import torch

        with torch.inference_mode():
            out = self.model(input_ids=ids, past_key_values=self._cache, use_cache=True)
        self._cache = out.past_key_values
        self.forward_passes += 1
        return out.logits[0].float()
