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
    at a time (`start` begins a new one).

    With `reuse_prefix=True` the KV of the previous sequence is kept: a prompt that starts with
    what was run before (an agent's next step: the same system prompt, tools and history, plus
    the last step's call and observation) runs only the rest. `last_cached` is how many prompt
    tokens the last `start` reused. Off by default, so a benchmark's repeated prompt costs a
    full prefill each time."""

    # the shortest common prefix worth reusing: cropping the cache costs a copy per layer
    MIN_REUSE = 16

    def __init__(self, model, tokenizer=None, *, reuse_prefix: bool = False):
        self.model = model
        self.tokenizer = tokenizer
        self.width = int(model.config.vocab_size)
        self.reuse_prefix = reuse_prefix
        self._cache = None
        self._tokens: list[int] = []  # what the cache holds
        self.forward_passes = 0
        self.last_cached = 0

    def start(self, prompt):
        import torch
        from transformers import DynamicCache

        prompt = list(prompt)
        self.forward_passes = 0
        m = 0
        if self.reuse_prefix and self._cache is not None:
            n = min(len(self._tokens), len(prompt) - 1)
            while m < n and self._tokens[m] == prompt[m]:
                m += 1
        if m >= self.MIN_REUSE:
            if m < len(self._tokens):
                self._cache.crop(m - len(self._tokens))  # a negative count: drop that many from the end
        else:
            m = 0
            self._cache = DynamicCache()
        self.last_cached = m
        self._tokens = prompt[:m]
        # Only the last position's logits: all of them would be (prompt length, width) floats,
        # 1 GB for a 1,000-token prompt over Gemma 3's 262,144 tokens.
        return self.feed(prompt[m:], keep=1)[-1]

    def feed(self, tokens, keep: int = 0):
        """Append tokens; (len(tokens), width) logits, or only the last `keep` rows."""
        import torch

        out = self._run(torch.tensor([list(tokens)], dtype=torch.long), keep)
        self._tokens.extend(tokens)
        return out

    def branch_logits(self, branches):
        """For each branch (a token list), the (len(branch), width) logits after each of its
        tokens, run on the current sequence's KV; the sequence is left as it was (the cache is
        cropped back after each branch). One forward pass per branch (railcall.runtime.routing's
        scorer; a batched pass over the branches' trie is the planned replacement)."""
        import torch

        out = []
        n = len(self._tokens)
        for b in branches:
            out.append(self._run(torch.tensor([list(b)], dtype=torch.long)))
            self._cache.crop(-len(b))  # transformers' crop takes the count to drop, negative
        assert self._cache.get_seq_length() == n
        return out

    def _run(self, ids, keep: int = 0):
        import torch

        with torch.inference_mode():
            out = self.model(input_ids=ids, past_key_values=self._cache, use_cache=True, logits_to_keep=keep)
        self._cache = out.past_key_values
        self.forward_passes += 1
        return out.logits[0].float()
