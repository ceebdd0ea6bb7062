"""Model backends: the one small seam between the decode loop and a model, and the transformers
implementations of both of its sides (one sequence, `TransformersBackend`; many rows per
forward pass for `runtime.batch.BatchLoop`, `TransformersBatch`; llama.cpp's are in `llama`).

A backend is built once per model and serves one sequence at a time: `start(prompt)` runs the
prompt and returns the logits for the next token; `feed(tokens)` appends one or more tokens
(several at once is the fast-forward of forced tokens: one forward pass instead of one per
token) and returns the logits after each of them. Logits are float32 torch tensors of the
model's logits width. A llama.cpp or vLLM backend implements the same two methods. Optional,
for scored routing (railcall.heuristics.routing): `branch_logits(branches)`, each branch's logits as
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
        back (railcall.heuristics.routing's scorer)."""
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


class TransformersBatch:
    """A transformers causal LM run over several rows at once with one KV cache (per batch).

    `start(prompts)` prefills the prompts (left-padded), one row each; `start_cached(prompt, m,
    kv)` prefills one row whose first m tokens' KV is given; `keep(rows)` selects and copies rows
    (so requests sharing a prompt share its prefill); `join(other)` appends another started
    batch's rows; `feed(tokens)` appends a list of tokens per live row (of different lengths;
    right-padded and masked) and returns each row's logits after its last token; `row_kv(b)` is
    row b's KV without its pads (for the prefix cache). Row numbers are positions in the current
    batch. Relies on transformers' DynamicCache (`reorder_cache`, per-layer `keys`/`values`), as
    pinned in pyproject.
    """

    def __init__(self, model, pad_id: int = 0):
        self.model = model
        self.pad_id = pad_id
        self.width = int(model.config.vocab_size)
        self.device = getattr(model, "device", None)  # where the weights and the KV are (None: CPU)
        self.forward_passes = 0
        self._cache = None
        self._mask = None  # (rows, cache length) long: 1 for a real token, 0 for a pad
        self._pos = None  # (rows,) long: the position of each row's next token

    @property
    def columns(self) -> int:
        return 0 if self._mask is None else int(self._mask.shape[-1])

    def start(self, prompts: Sequence[Sequence[int]]):
        """Prefill the prompts (one row each, left-padded); return (rows, width) logits."""
        import torch
        from transformers import DynamicCache

        longest = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), longest), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), longest), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, longest - len(p):] = torch.tensor(list(p), dtype=torch.long)
            mask[i, longest - len(p):] = 1
        # Left pads get position 0 (they are masked); real tokens count from 0.
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        self._cache = DynamicCache()
        # Only the last position's logits: the full (rows, length, 49152) would cost a fifth of
        # the prefill's arithmetic and ~40 MB per 200-token prompt, for nothing.
        logits = self._run(ids, mask, pos, keep=1)[:, -1]
        self._mask = mask
        self._pos = mask.sum(-1)
        return logits

    def start_cached(self, prompt: Sequence[int], m: int, kv: Sequence[tuple]):
        """Prefill one row whose first `m` tokens are already computed: `kv` holds, per layer,
        (keys, values) of shape (1, heads, >= m, head_dim); only prompt[m:] runs. Returns (1, width)."""
        import torch
        from transformers import DynamicCache

        self._cache = DynamicCache()
        for i, (k, v) in enumerate(kv):
            self._cache.update(k[:, :, :m].clone(), v[:, :, :m].clone(), i)
        n = len(prompt)
        ids = torch.tensor([list(prompt[m:])], dtype=torch.long)
        mask = torch.ones((1, n), dtype=torch.long)
        pos = torch.arange(m, n, dtype=torch.long).unsqueeze(0)
        logits = self._run(ids, mask, pos, keep=1)[:, -1]
        self._mask = mask
        self._pos = torch.tensor([n], dtype=torch.long)
        return logits

    def feed(self, tokens: Sequence[Sequence[int]]):
        """Append `tokens[i]` (at least one) to row i; return (rows, width) logits, row i's
        taken after its last token."""
        import torch

        k = max(len(t) for t in tokens)
        n = len(tokens)
        ids = torch.full((n, k), self.pad_id, dtype=torch.long)
        new_mask = torch.zeros((n, k), dtype=torch.long)
        lengths = torch.tensor([len(t) for t in tokens], dtype=torch.long)
        for i, t in enumerate(tokens):
            ids[i, : len(t)] = torch.tensor(list(t), dtype=torch.long)
            new_mask[i, : len(t)] = 1
        pos = self._pos.unsqueeze(-1) + torch.arange(k).unsqueeze(0)  # pads: positions past the end, masked
        mask = torch.cat([self._mask, new_mask], dim=-1)
        # Only each row's last position goes through the output layer: a forced run of k tokens
        # in one row would otherwise cost (rows, k, width) logits, 670 MB for 32 rows, k = 20
        # over Gemma 3's 262,144 tokens.
        logits = self._run(ids, mask, pos, keep=(lengths - 1).unsqueeze(-1))[:, 0]
        self._mask = mask
        self._pos = self._pos + lengths
        return logits

    def branch_logits(self, b: int, branches: Sequence[Sequence[int]]) -> list:
        """Scored routing's scorer for row b: each branch's (len(branch), width) logits as if fed
        after the row's tokens, in one forward pass over the branches' trie
        (`railcall.models.backend.BranchTree`) on a copy of the row's KV; the batch is not
        touched. The copy costs ~46 KB per cached token on SmolLM2-135M (a few ms)."""
        import torch
        from transformers import DynamicCache


        tree = BranchTree(branches)
        if not tree.tokens:
            return tree.rows(torch.zeros((0, self.width)))
        cache = DynamicCache()
        for i, layer in enumerate(self._cache.layers):
            cache.update(layer.keys[b:b + 1], layer.values[b:b + 1], i)  # the update copies
        dtype = next(self.model.parameters()).dtype
        mask = tree.attention_mask(self._mask[b].bool(), dtype)
        ids = torch.tensor([tree.tokens], dtype=torch.long)
        pos = (self._pos[b] + torch.tensor(tree.depth, dtype=torch.long)).unsqueeze(0)
        with torch.inference_mode():
            out = self.model(input_ids=self._on(ids), attention_mask=self._on(mask), position_ids=self._on(pos),
                             past_key_values=cache, use_cache=True)
        self.forward_passes += 1
        return tree.rows(out.logits[0].float().cpu())

    def keep(self, rows: Sequence[int]) -> None:
        """Make the batch rows `rows` of the current one, in this order: rows not named leave,
        a row named twice is copied (an index_select of the cache per layer: ~2 ms per MB).
        Columns no remaining row uses (the left pads of rows that left) are dropped."""
        import torch

        index = torch.tensor(list(rows), dtype=torch.long)
        self._cache.reorder_cache(self._on(index))
        self._mask = self._mask[index]
        self._pos = self._pos[index]
        used = self._mask.any(0)
        first = int(torch.argmax(used.to(torch.int8))) if bool(used.any()) else 0
        if first > 0:
            for layer in self._cache.layers:
                layer.keys = layer.keys[:, :, first:].contiguous()
                layer.values = layer.values[:, :, first:].contiguous()
            self._mask = self._mask[:, first:]

    def join(self, other: "TransformersBatch") -> None:
        """Append `other`'s rows after this batch's (both started). The shorter cache is padded
        on the left with masked slots, so every row keeps its own positions."""
        import torch

        if self._cache is None:
            self._cache, self._mask, self._pos = other._cache, other._mask, other._pos
            self.forward_passes += other.forward_passes
            return
        a, b = self._mask.shape[-1], other._mask.shape[-1]
        length = max(a, b)

        def pad(t, have):  # (rows, heads, L, dim) -> (rows, heads, length, dim), zeros on the left
            if have == length:
                return t
            z = t.new_zeros(t.shape[:-2] + (length - have, t.shape[-1]))
            return torch.cat([z, t], dim=-2)

        for mine, theirs in zip(self._cache.layers, other._cache.layers):
            mine.keys = torch.cat([pad(mine.keys, a), pad(theirs.keys, b)], dim=0)
            mine.values = torch.cat([pad(mine.values, a), pad(theirs.values, b)], dim=0)
        zeros = lambda m, have: torch.cat([m.new_zeros((m.shape[0], length - have)), m], dim=-1)  # noqa: E731
        self._mask = torch.cat([zeros(self._mask, a), zeros(other._mask, b)], dim=0)
        self._pos = torch.cat([self._pos, other._pos])
        self.forward_passes += other.forward_passes

    def row_kv(self, b: int) -> list[tuple]:
        """Row b's KV without pads: per layer (keys, values), each (1, heads, tokens, head_dim),
        new tensors (the batch may change after)."""
        real = self._on(self._mask[b].bool())
        return [(layer.keys[b:b + 1][:, :, real], layer.values[b:b + 1][:, :, real]) for layer in self._cache.layers]

    def _run(self, ids, mask, pos, keep=0):
        """One forward pass; `keep`: 0 every position's logits, n the last n, a (rows, 1) tensor
        the position given for each row (transformers' `logits_to_keep`)."""
        import torch

        if isinstance(keep, torch.Tensor):
            keep = self._on(keep)
        with torch.inference_mode():
            out = self.model(input_ids=self._on(ids), attention_mask=self._on(mask), position_ids=self._on(pos),
                             past_key_values=self._cache, use_cache=True, logits_to_keep=keep)
        self._cache = out.past_key_values
        self.forward_passes += 1
        return out.logits.float().cpu()  # the rows' masks and sampling run on the CPU

    def _on(self, t):
        """`t` on the model's device (the same tensor where that is the CPU)."""
        return t if self.device is None or t.device == self.device else t.to(self.device)
