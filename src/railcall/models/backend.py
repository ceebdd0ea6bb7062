"""Model backends: the one small seam between the decode loop and a model.

A backend is built once per model and serves one sequence at a time: `start(prompt)` runs the
prompt and returns the logits for the next token; `feed(tokens)` appends one or more tokens
(several at once is the fast-forward of forced tokens: one forward pass instead of one per
token) and returns the logits after each of them. Logits are float32 torch tensors of the
model's logits width. A llama.cpp or vLLM backend implements the same two methods. Optional,
for scored routing (railcall.runtime.routing): `branch_logits(branches)`, each branch's logits as
if fed after the sequence, the sequence left as it was.
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
        tokens, as if it were fed on the current sequence; the sequence is left as it was. One
        forward pass for all branches, over their trie (`BranchTree`), then the cache is cropped
        back (railcall.runtime.routing's scorer)."""
        import torch

        if not branches:
            return []
        tree = BranchTree(branches)
        if not tree.tokens:
            return tree.rows(torch.zeros((0, self.width)))
        n = len(self._tokens)
        assert self._cache.get_seq_length() == n
        dtype = next(self.model.parameters()).dtype
        mask = tree.attention_mask(torch.ones(n, dtype=torch.bool), dtype)
        ids = torch.tensor([tree.tokens], dtype=torch.long)
        pos = (n + torch.tensor(tree.depth, dtype=torch.long)).unsqueeze(0)
        with torch.inference_mode():
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=self._cache,
                             use_cache=True)
        self._cache = out.past_key_values
        self._cache.crop(-len(tree.tokens))  # transformers' crop takes the count to drop, negative
        self.forward_passes += 1
        return tree.rows(out.logits[0].float())

    def _run(self, ids, keep: int = 0):
        import torch

        with torch.inference_mode():
            out = self.model(input_ids=ids, past_key_values=self._cache, use_cache=True, logits_to_keep=keep)
        self._cache = out.past_key_values
        self.forward_passes += 1
        return out.logits[0].float()


class BranchTree:
    """Token branches laid out as one flat sequence: the nodes of their trie, a shared prefix
    once, each node after its parent. Built per scoring call.

        branches  [5, 6, 7]  [5, 6, 9]  [8]
        nodes     5  6  7  9  8             tokens
        depth     0  1  2  2  0             position = the sequence's next position + depth
        parent    -  0  1  1  -

    Run on a sequence's cached KV with `attention_mask` (each node sees the whole cached prefix,
    its ancestors and itself) and its positions, every node's logits are the ones it would have
    had with its branch alone fed after the prefix: attention never crosses from one branch to a
    sibling, and positions are those the branch would have taken.
    """

    def __init__(self, branches):
        self.tokens: list[int] = []
        self.depth: list[int] = []
        self.parent: list[int] = []
        self.paths: list[list[int]] = []  # per branch: the node of each of its tokens
        at: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
        for b in branches:
            path, up = [], -1
            for d, t in enumerate(b):
                node = at.get((up, int(t)))
                if node is None:
                    node = at[(up, int(t))] = len(self.tokens)
                    self.tokens.append(int(t))
                    self.depth.append(d)
                    self.parent.append(up)
                path.append(node)
                up = node
            self.paths.append(path)

    def visible(self):
        """(nodes, nodes) bool: node i sees node j (j is i or one of its ancestors)."""
        import torch

        n = len(self.tokens)
        seen = torch.zeros((n, n), dtype=torch.bool)
        for i, up in enumerate(self.parent):  # a parent comes before its children
            if up >= 0:
                seen[i] = seen[up]
            seen[i, i] = True
        return seen

    def attention_mask(self, prefix, dtype):
        """transformers' 4D float mask, (1, 1, nodes, prefix + nodes): 0 where a node may look,
        the dtype's most negative value where not. `prefix`: (cached columns,) bool, True for a
        real token (False: a pad of a batched row). transformers (5.23, as pinned) takes a 4D mask
        as given: `masking_utils._preprocess_mask_arguments` returns it unchanged, and SDPA runs
        without `is_causal` once a mask is passed; positions come from the explicit position ids.
        An additive float mask, not a bool one, so eager attention (which adds it) reads it too."""
        import torch

        n = len(self.tokens)
        seen = torch.cat([prefix.to(torch.bool).unsqueeze(0).expand(n, -1), self.visible()], dim=-1)
        mask = torch.zeros(seen.shape, dtype=dtype)
        mask.masked_fill_(~seen, torch.finfo(dtype).min)
        return mask[None, None]

    def rows(self, logits) -> list:
        """Each branch's (len(branch), width) rows of the nodes' (nodes, width) logits (numpy or
        torch)."""
        import numpy as np

        if isinstance(logits, np.ndarray):
            return [logits[np.asarray(p, dtype=np.int64)] for p in self.paths]
        import torch

        return [logits[torch.tensor(p, dtype=torch.long)] for p in self.paths]
