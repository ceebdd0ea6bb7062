"""The decode loop: logits -> matcher mask -> sampling -> consume, with fast-forward and a trace.

Per request: a Backend (shared per model), a Matcher (per request, or None for unconstrained
decoding) and SamplingParams. Masking removes tokens from the model's distribution and never
changes the logits of the legal ones, so sampling (greedy, temperature, top-k, top-p) sees the
model's own judgement restricted to what the grammar allows.

- Fast-forward: where the grammar dictates the next tokens (`Matcher.forced_tokens`), they are
  fed in one forward pass instead of one pass per token; the passes saved are counted. With
  `batch_forced=False` the same tokens are fed one pass at a time (the reference path).
- Token ceiling: when `max_tokens` is reached mid-call, `Matcher.finish()` completes the call
  with its shortest valid completion and the result says it was cut (seed 000's forced finish).
- Trace: one record per generated token -- the legal-token count (the syntax/semantics boundary
  moving, seed 000), whether the grammar forced it, the token, its text and its logprob under the
  masked distribution. `Generation.save_trace` writes JSON lines.
- Serving hooks (all optional, defaults keep the loop as above): `on_step(step)` is called once per
  generated token as soon as it is known (streaming); `cancelled()` is polled before every forward
  pass and ends the loop with finish_reason "cancelled" (a client that went away);
  `SamplingParams.top_logprobs` records the N most likely tokens of each step's distribution;
  `SamplingParams.stop` ends generation at the first stop string, which is cut from `text`.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from railcall.bitmask import allocate_bitmask, apply_bitmask


@dataclass
class SamplingParams:
    max_tokens: int = 64
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int | None = None
    top_logprobs: int = 0  # record this many alternatives per step (Step.top)
    stop: tuple[str, ...] = ()  # stop strings: generation ends at the first, which is cut from text


@dataclass
class Step:
    index: int
    token: int
    text: str
    legal: int | None  # legal tokens at this step (None: unconstrained)
    forced: bool  # written by the grammar (fast-forward or finish), not sampled
    logprob: float | None
    top: list[tuple[int, float]] | None = None  # (token, logprob) best first, when top_logprobs > 0


@dataclass
class Generation:
    tokens: list[int]
    text: str
    steps: list[Step] = field(default_factory=list)
    finish_reason: str = "stop"  # stop | length | cancelled
    cut: bool = False  # the call was completed by finish() at the token ceiling
    forward_passes: int = 0
    passes_saved: int = 0  # forced tokens that did not need a pass of their own
    seconds: float = 0.0
    grammar_error: str = ""
    stop_string: str | None = None  # the stop string that ended generation (cut from text)

    @property
    def tokens_per_s(self) -> float:
        return len(self.tokens) / self.seconds if self.seconds > 0 else 0.0

    def save_trace(self, path: str | Path) -> None:
        with open(path, "w") as f:
            for s in self.steps:
                f.write(json.dumps(asdict(s)) + "\n")


def _top(logp, n: int) -> list[tuple[int, float]]:
    """The n most likely tokens of a (width,) log-distribution; masked (-inf) ones never appear."""
    import torch

    values, ids = torch.topk(logp, min(n, logp.shape[-1]))
    return [(int(i), float(v)) for v, i in zip(values.tolist(), ids.tolist()) if v != float("-inf")]


def sample_token(logits, params: SamplingParams, gen):
    """Pick a token from masked logits (torch, (width,)); returns (token, logprob)."""
    tok, logp = _sample_dist(logits, params, gen)
    return tok, float(logp[tok])


def _sample_dist(logits, params: SamplingParams, gen):
    """Pick a token; returns (token, (width,) log-probabilities of the masked distribution)."""
    import torch

    logp = torch.log_softmax(logits, dim=-1)
    if params.temperature <= 0:
        return int(torch.argmax(logits)), logp
    # shifted by the largest logit first, so that a tiny temperature cannot overflow (1e-40: every
    # logit but the largest goes to -inf, which is greedy, as it should be)
    scaled = (logits - logits.max()) / params.temperature
    if params.top_k > 0:
        k = min(params.top_k, scaled.shape[-1])
        kth = torch.topk(scaled, k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        cum = torch.cumsum(probs, dim=-1)
        drop = cum - probs > params.top_p  # keep the smallest prefix reaching top_p
        scaled[order[drop]] = float("-inf")
    probs = torch.softmax(scaled, dim=-1)
    return int(torch.multinomial(probs, 1, generator=gen)), logp


def generate(backend, vocab, prompt: Sequence[int], matcher=None, params: SamplingParams | None = None, *,
             fast_forward: bool = True, batch_forced: bool = True,
             on_step: Callable[[Step], None] | None = None,
             cancelled: Callable[[], bool] | None = None) -> Generation:
    """Generate from `prompt`; constrained by `matcher` if given (see the module docstring)."""
    import torch

    params = params or SamplingParams()
    gen = None
    if params.seed is not None:
        gen = torch.Generator().manual_seed(params.seed)
    stops = set(vocab.stop_ids)
    t0 = time.perf_counter()
    logits = backend.start(prompt)
    passes, saved = 1, 0
    out: list[int] = []
    steps: list[Step] = []
    bm = allocate_bitmask(logits.shape[-1]) if matcher is not None else None
    finish_reason = "length"
    stops_b = [(s.encode("utf-8"), s) for s in params.stop if s]  # (bytes, the string)
    longest_stop = max((len(b) for b, _ in stops_b), default=0)
    text_b = bytearray()  # the output's bytes so far, only kept when there are stop strings
    stop_at: list = []  # [byte offset, stop string] once a stop string appeared
    # Under a matcher with free-text phases (a call or an answer inside prose), stop strings apply
    # to the free text only: one would cut a call's JSON in two. Matches start at `free_from`.
    in_free = getattr(matcher, "in_free_text", None)
    free_from = 0

    def record(tok, legal, forced, logprob, logp=None):
        nonlocal free_from
        top = _top(logp, params.top_logprobs) if params.top_logprobs > 0 and logp is not None else None
        step = Step(len(steps), tok, vocab.token_text(tok) if tok < vocab.size else "", legal, forced, logprob, top)
        steps.append(step)
        if on_step is not None:
            on_step(step)
        if stops_b and not stop_at and 0 <= tok < vocab.size:
            start = max(free_from, len(text_b) - longest_stop + 1)
            text_b.extend(vocab.token_bytes[tok])
            if in_free is not None and not in_free():  # this token is part of a call or an answer
                free_from = len(text_b)
                return
            hits = [(text_b.find(sb, start), s) for sb, s in stops_b]
            hits = [h for h in hits if h[0] >= 0]
            if hits:
                stop_at.extend(min(hits))

    while len(out) < params.max_tokens:
        if stop_at:
            finish_reason = "stop"
            break
        if cancelled is not None and cancelled():
            finish_reason = "cancelled"
            break
        if matcher is not None and matcher.is_done():
            finish_reason = "stop"
            break
        if matcher is not None and fast_forward:
            forced = matcher.forced_tokens()[: params.max_tokens - len(out)]
            if forced:
                lp = torch.log_softmax(logits, dim=-1)
                dists = [lp]
                logprobs = [float(lp[forced[0]])]
                if batch_forced:
                    rows = backend.feed(forced)
                    passes += 1
                    saved += len(forced) - 1
                else:
                    rows = torch.stack([backend.feed([t])[-1] for t in forced])
                    passes += len(forced)
                for i, t in enumerate(forced):
                    if i:
                        dists.append(torch.log_softmax(rows[i - 1], dim=-1))
                        logprobs.append(float(dists[i][t]))
                    matcher.consume_token(t)
                    out.append(t)
                    record(t, 1, True, logprobs[i], dists[i])
                logits = rows[-1]
                continue
        legal = None
        if matcher is not None:
            legal = matcher.fill_bitmask(bm)
            logits = logits.clone()
            apply_bitmask(logits, bm)
        tok, logp = _sample_dist(logits, params, gen)
        if matcher is not None:
            matcher.consume_token(tok)
        if tok in stops:
            finish_reason = "stop"
            break
        out.append(tok)
        record(tok, legal, False, float(logp[tok]), logp)
        if len(out) >= params.max_tokens or stop_at:
            finish_reason = "stop" if stop_at else finish_reason
            break
        logits = backend.feed([tok])[-1]
        passes += 1
    cut = False
    if stop_at:
        finish_reason = "stop"
    if matcher is not None and finish_reason == "length" and not matcher.is_accepting() and not matcher.is_error():
        tail = matcher.finish()
        for t in tail:
            out.append(t)
            record(t, 1, True, None)
        cut = bool(tail)
    data = vocab.decode(out)
    if stop_at:
        data = data[: stop_at[0]]
    return Generation(
        tokens=out, text=data.decode("utf-8", errors="replace"), steps=steps, finish_reason=finish_reason,
        cut=cut, forward_passes=passes, passes_saved=saved, seconds=time.perf_counter() - t0,
        grammar_error=matcher.error_message if matcher is not None else "",
        stop_string=stop_at[1] if stop_at else None,
    )
