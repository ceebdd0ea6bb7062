"""Batched decoding: several sequences through the model per forward pass, each with its own matcher.

`decode.generate` serves one sequence; on a CPU that is memory-bound (SmolLM2-135M in fp32 reads
its ~540 MB of weights for every pass), so one pass over 16 rows costs about twice one pass over
a single row. Measured on 2 cores with ~180-token prompts: 68 ms per token for one row,
8.7 ms per row-token for 16 rows, 5.7 ms for 32. An evaluation decodes hundreds of independent
requests; this module decodes them together.

The loop is `decode.generate`'s, row by row: each row in each step either fast-forwards the
tokens its grammar dictates (`Matcher.forced_tokens`) or masks (`fill_bitmask`), samples and
consumes one token; a stop token, a done matcher or the token ceiling (with `Matcher.finish()`)
ends the row, which then leaves the batch. Rows feed different numbers of tokens per pass (a
forced run against one sampled token), so the new tokens are right-padded within the pass and
the pads masked out of attention for good; prompts are left-padded. Every row carries its own
position ids, so padding never shifts a position. At temperature 0 the outputs equal
`generate`'s (a test checks it); padded matrix products can differ from unpadded ones in the
last bits, so a near-tie between two tokens could in principle break differently.

Rows that share a prompt (the same request with and without a grammar) share one prefill: the
prompt's cache is computed once and copied into each row. `decode_stream` keeps the batch full:
when half its rows have ended, the next requests are prefilled and join (their caches padded on
the left to the batch's length), so a few long replies do not leave the machine decoding a
batch of one. Under load the thread count matters more than the batch: on 2 cores shared with
other processes (load ~7), a step of 8 rows took 1.8 s with torch's 2 threads and 0.33 s with 1.

Lifecycles: `TransformersBatch` lives as long as one `decode_stream` (it holds the KV cache of
the rows in flight); matchers are per row, as in `generate`.
Not recorded (unlike `generate`): per-token log-probabilities (`Step.logprob` is None).
"""

from __future__ import annotations

import time
from typing import Callable, Iterable, Iterator, Sequence

from railcall.bitmask import allocate_bitmask, apply_bitmask
from railcall.decode import Generation, SamplingParams, Step, sample_token


class TransformersBatch:
    """A transformers causal LM run over several rows at once with one KV cache (per batch).

    `start(prompts)` prefills the prompts (left-padded), one row each; `keep(rows)` selects and
    copies rows (so requests sharing a prompt share its prefill); `join(other)` appends another
    started batch's rows; `feed(tokens)` appends a list of tokens per live row (of different
    lengths; right-padded and masked) and returns each row's logits after its last token.
    Row numbers are positions in the current batch. Relies on transformers' DynamicCache
    (`reorder_cache`, per-layer `keys`/`values`), as pinned in pyproject.
    """

    def __init__(self, model, pad_id: int = 0):
        self.model = model
        self.pad_id = pad_id
        self.width = int(model.config.vocab_size)
        self.forward_passes = 0
        self._cache = None
        self._mask = None  # (rows, cache length) long: 1 for a real token, 0 for a pad
        self._pos = None  # (rows,) long: the position of each row's next token

    def start(self, prompts: Sequence[Sequence[int]]):
        """Prefill the prompts (one row each, left-padded); return (rows, width) logits. Rows
        that share a prompt are made with `keep` (an index may repeat)."""
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
        logits = self._run(ids, mask, pos)
        self._mask = mask
        self._pos = self._pos + lengths
        return logits[torch.arange(n), lengths - 1]

    def keep(self, rows: Sequence[int]) -> None:
        """Make the batch rows `rows` of the current one, in this order: rows not named leave,
        a row named twice is copied (an index_select of the cache per layer: ~2 ms per MB)."""
        import torch

        index = torch.tensor(list(rows), dtype=torch.long)
        self._cache.reorder_cache(index)
        self._mask = self._mask[index]
        self._pos = self._pos[index]

    def join(self, other: "TransformersBatch") -> None:
        """Append `other`'s rows after this batch's (both started). The shorter cache is padded
        on the left with masked slots, so every row keeps its own positions."""
        import torch

        if self._cache is None:
            self._cache, self._mask, self._pos = other._cache, other._mask, other._pos
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

    def _run(self, ids, mask, pos, keep: int = 0):
        import torch

        with torch.inference_mode():
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=self._cache,
                             use_cache=True, logits_to_keep=keep)
        self._cache = out.past_key_values
        self.forward_passes += 1
        return out.logits.float()


class _Row:
    __slots__ = ("matcher", "out", "steps", "reason", "cut", "passes", "saved", "seconds", "gen", "done")

    def __init__(self, matcher, gen):
        self.matcher = matcher
        self.out: list[int] = []
        self.steps: list[Step] = []
        self.reason = "length"
        self.cut = False
        self.passes = 1  # the prefill
        self.saved = 0
        self.seconds = 0.0
        self.gen = gen
        self.done = False


def generate_batch(model, vocab, prompts: Sequence[Sequence[int]], matchers: Sequence | None = None,
                   params: SamplingParams | None = None, *, fast_forward: bool = True,
                   decided: Callable[[int, list[int]], bool] | None = None) -> list[Generation]:
    """Generate for every prompt at once; row i is constrained by `matchers[i]` (None: free).
    All rows start together (see `decode_stream` for rows that join as others finish)."""
    matchers = list(matchers) if matchers is not None else [None] * len(prompts)
    if len(matchers) != len(prompts):
        raise ValueError(f"{len(matchers)} matchers for {len(prompts)} prompts")
    out: list = [None] * len(prompts)
    for i, g in decode_stream(model, vocab, list(zip(prompts, matchers)), params, max_rows=max(len(prompts), 1),
                              fast_forward=fast_forward, decided=decided):
        out[i] = g
    return out


def decode_stream(model, vocab, requests: Iterable[tuple], params: SamplingParams | None = None, *,
                  max_rows: int = 32, fast_forward: bool = True,
                  decided: Callable[[int, list[int]], bool] | None = None) -> Iterator[tuple[int, Generation]]:
    """Decode `requests` ((prompt, matcher or None) each; an iterable, read as rows are
    admitted) with at most `max_rows` rows live; yield (request index, Generation) as each row
    ends, in the order rows end.

    Rows join in order: whenever the live rows fall to half of `max_rows`, the next requests
    are prefilled together (equal prompts once: a request with and without a grammar shares
    its prefill) and join the batch, so a few long replies do not hold the machine to a batch
    of one. `decided(i, tokens)`, if given, is asked after each token a free row samples; True
    ends that row early with finish_reason "decided" (the caller already knows its verdict: an
    evaluation stops a reply that can no longer be a call). `Generation.seconds` is the row's
    latency from its prefill to its last token, `forward_passes` the passes it took part in
    (its prefill included).
    """
    import torch

    params = params or SamplingParams()
    stops = set(vocab.stop_ids)
    pad_id = vocab.eos_id if vocab.eos_id is not None else 0
    lm: TransformersBatch | None = None
    rows: dict[int, _Row] = {}
    live: list[int] = []  # request ids, in batch order
    slot: list[int] = []  # the batch row each live request reads its logits from
    logits = None
    bm = allocate_bitmask(getattr(vocab, "logits_width", None) or int(model.config.vocab_size))
    source = enumerate(requests)
    queue = [next(source, None)]  # one request of lookahead; None: no more

    def admit():
        nonlocal lm, logits
        take = []
        while queue[0] is not None and len(live) + len(take) < max_rows:
            take.append(queue[0])
            queue[0] = next(source, None)
        keys: dict[tuple, int] = {}
        uniq = []
        first_slot = []
        for i, (prompt, m) in take:
            key = tuple(prompt)
            if key not in keys:
                keys[key] = len(uniq)
                uniq.append(prompt)
            first_slot.append(keys[key])
            gen = torch.Generator().manual_seed(params.seed + i) if params.seed is not None else None
            rows[i] = _Row(m, gen)
            rows[i].seconds = time.perf_counter()  # start time until the row ends
        fresh = TransformersBatch(model, pad_id=pad_id)
        new_logits = fresh.start(uniq)
        base = 0 if lm is None else len(logits)
        if lm is None:
            lm, logits = fresh, new_logits
        else:
            lm.join(fresh)
            logits = torch.cat([logits, new_logits])
        live.extend(i for i, _ in take)
        slot.extend(base + k for k in first_slot)

    def record(r, tok, legal, forced):
        r.steps.append(Step(len(r.steps), tok, vocab.token_text(tok) if tok < vocab.size else "", legal, forced, None))

    def end(i, reason):
        r = rows[i]
        r.reason, r.done, r.seconds = reason, True, time.perf_counter() - r.seconds
        del rows[i]  # a finished row is the caller's now
        m = r.matcher
        if m is not None and reason == "length" and not m.is_accepting() and not m.is_error():
            tail = m.finish()
            for t in tail:
                r.out.append(t)
                record(r, t, 1, True)
            r.cut = bool(tail)
        return i, Generation(
            tokens=r.out, text=vocab.decode(r.out).decode("utf-8", errors="replace"), steps=r.steps,
            finish_reason=reason, cut=r.cut, forward_passes=r.passes, passes_saved=r.saved, seconds=r.seconds,
            grammar_error=m.error_message if m is not None else "")

    while queue[0] is not None or live:
        if queue[0] is not None and len(live) <= max_rows // 2:
            admit()
        feeds: list[list[int]] = []
        ended = []
        for b, i in enumerate(live):
            r = rows[i]
            m = r.matcher
            feed: list[int] = []
            if len(r.out) >= params.max_tokens:
                ended.append(end(i, "length"))
            elif m is not None and m.is_done():
                ended.append(end(i, "stop"))
            elif m is not None and fast_forward and (forced := m.forced_tokens()[: params.max_tokens - len(r.out)]):
                for t in forced:
                    m.consume_token(t)
                    r.out.append(t)
                    record(r, t, 1, True)
                r.saved += len(forced) - 1
                feed = forced
            else:
                row_logits = logits[slot[b]]
                legal = None
                if m is not None:
                    legal = m.fill_bitmask(bm)
                    row_logits = row_logits.clone()
                    apply_bitmask(row_logits, bm)
                tok, _ = sample_token(row_logits, params, r.gen)
                if m is not None:
                    m.consume_token(tok)
                if tok in stops:
                    ended.append(end(i, "stop"))
                else:
                    r.out.append(tok)
                    record(r, tok, legal, False)
                    if len(r.out) >= params.max_tokens:
                        ended.append(end(i, "length"))
                    elif m is None and decided is not None and decided(i, r.out):
                        ended.append(end(i, "decided"))
                    else:
                        feed = [tok]
            feeds.append(feed)
        yield from ended
        keep = [b for b, f in enumerate(feeds) if f]
        if not keep:
            live, slot, lm, logits = [], [], None, None
            continue
        # One cache selection per change: ended rows leave, and rows that share a prompt get
        # their own copies of its prefill before their first feed.
        index = [slot[b] for b in keep]
        if index != list(range(len(logits))):
            lm.keep(index)
        live = [live[b] for b in keep]
        logits = lm.feed([feeds[b] for b in keep])
        slot = list(range(len(live)))
        for i in live:
            rows[i].passes += 1
