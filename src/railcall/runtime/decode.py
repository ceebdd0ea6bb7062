"""The decode loop: logits -> matcher mask -> sampling -> consume, with fast-forward and a trace.

Per request: a Matcher (per request, or None for unconstrained decoding) and SamplingParams,
held by a `Row`; per model: a backend that runs the forward passes. Masking removes tokens from
the model's distribution and never changes the logits of the legal ones, so sampling (greedy,
temperature, top-k, top-p) sees the model's own judgement restricted to what the grammar allows.

One loop body for every caller. `Row.advance(logits)` is one step of one sequence: it is given
the logits after the sequence's last token and returns the tokens to feed next ([] once the row
has ended). `generate` drives one Row over a single-sequence backend; `railcall.runtime.batch.BatchLoop`
drives many over one batched forward pass (the server, `railcall eval`). Whatever a row does --
fast-forward, stop strings, penalties, the token ceiling -- it does the same in both.

- Fast-forward: where the grammar dictates the next tokens (`Matcher.forced_tokens`), they are
  fed in one forward pass instead of one pass per token; the passes saved are counted. A forced
  token's logprob is 0.0: under the masked distribution it was the only legal token.
- Drafts (`Row(draft=N)`; on llama.cpp by default, whose cells can be dropped): after its decided
  tokens a row feeds, in the same pass, the tokens the grammar forces next and up to N tokens
  looked up in its prompt and output; the next step decides from the logits after each of them
  as it would a step at a time and keeps the draft while it agrees (`Row.advance`). Each token
  kept saves a pass; the cells of the rest are dropped (`unfed`; `trim` at once, where scored
  routing is about to score names on the row's cells).
- Token ceiling (`SamplingParams.cut`): what happens to a call or answer that `max_tokens` would
  cut. "fit" (the default): as the budget runs out, a token is legal only if the grammar's
  shortest close still fits after it (`Matcher.finish`'s length in this vocabulary's tokens, an
  upper bound on the fewest), so the model's own tokens close a string, an array, the call, inside
  `max_tokens`; `Generation.fitted` says the budget removed a token the model would have written.
  Where the budget cannot hold even the shortest close, the output ends cut (`Generation.truncated`:
  it is no complete call and must not be read as one). "complete" (the forced finish, opt-in):
  the row writes the grammar's shortest close while it still fits, and past `max_tokens` where it
  does not; a completion may fill a required value with "?", and `Generation.cut` says it happened:
  such an output must never be executed as the model's call. "close": the same forced close,
  never past `max_tokens`. "leave": no steering, no completion; the output ends where the ceiling
  cut it (OpenAI's behaviour).
- Distinct calls (`SamplingParams.distinct_calls`, on by default): within one reply a call
  identical to an earlier one is unspellable (`railcall.runtime.distinct`), so a model cannot
  repeat one call until the ceiling.
- Routing (`Row(router=...)`, `generate(..., router=...)`): with a `railcall.heuristics.routing.NameRouter`
  the tool name is chosen whole, by the log-probability of each allowed name's complete token
  sequence (`routing="scored"`), instead of token by token from the first one (the default,
  greedy routing). The chosen name's tokens are fed together, as forced ones are; their steps
  record forced=False and each token's own log-probability; the scoring pass (one per routed
  call, over the names' trie) is counted in `forward_passes`.
- Trace: one record per generated token -- the legal-token count (where the grammar decides and
  where the model does), whether the grammar forced it, the token, its text and its logprob under the
  masked distribution. `Generation.save_trace` writes JSON lines.
- Serving hooks (all optional): `on_step(step)` is called once per generated token as soon as it
  is known (streaming); `cancelled()` is polled before every step and ends the row with
  finish_reason "cancelled"; `SamplingParams.top_logprobs` records the N most likely tokens of each
  step's distribution; `SamplingParams.stop` ends generation at the first stop string, which is cut
  from `text`; penalties, `logit_bias` and `min_tokens` adjust the logits before the mask.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from railcall.bitmask import allocate_bitmask, apply_bitmask, log_softmax

CUT_MODES = ("fit", "complete", "close", "leave")
# How close to the ceiling a row starts measuring its shortest close (a copy of the matcher runs
# `finish` once per step inside this window): a close longer than this is rare for tool calls,
# and the measuring costs a completion search per step only near the end.
CLOSE_WINDOW = 24
# "fit": how many drawn tokens may be refused (each one removed and the draw repeated, which samples
# exactly from the distribution restricted to the tokens that fit) before the model's most likely
# tokens are searched for ones that fit: each refusal costs a matcher copy and a close search.
FIT_TRIES = 8
# After FIT_TRIES refusals, the model's most likely legal tokens searched for ones that fit
# (FIT_SCAN looked at, FIT_KEEP kept to sample among); where none does, the grammar's own close
# (a cut: what it writes, the model did not rank).
FIT_SCAN = 512
FIT_KEEP = 16
# Drafts (`Row.advance`): besides the tokens the grammar forces, at most DRAFT_TOKENS looked-up
# tokens a step, DRAFT_FIRST after a draft the row did not take whole (doubling while it does),
# found by the context's last n tokens, n from DRAFT_NGRAM[1] down to DRAFT_NGRAM[0]. On 2 cores a
# SmolLM2 pass of one token costs ~14 ms, of two ~20, each further token ~2 ms more: a wrong draft
# token is cheap beside a pass, a right one saves a pass.
DRAFT_TOKENS = 8
DRAFT_FIRST = 2
DRAFT_NGRAM = (1, 4)
# Looked-up tokens only while at most this many rows run a step (`BatchLoop`): past a few rows a
# pass is bound by its tokens' arithmetic, not by reading the weights, and a wrong token costs
# as much as a right one saves. The forced tokens are drafted at any size (they run either way).
DRAFT_ROWS = 4


@dataclass
class SamplingParams:
    max_tokens: int = 64
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int | None = None
    top_logprobs: int = 0  # record this many alternatives per step (Step.top)
    stop: tuple[str, ...] = ()  # stop strings: generation ends at the first, which is cut from text
    cut: str = "fit"  # at the token ceiling: "fit" | "complete" | "close" | "leave" (module docstring)
    distinct_calls: bool = True  # a call identical to an earlier one of the reply is unspellable
    min_tokens: int = 0  # stop tokens are masked until this many tokens were generated
    repetition_penalty: float = 1.0  # >1: a generated token's logit is divided (positive) or multiplied
    presence_penalty: float = 0.0  # subtracted once from the logit of every token already generated
    frequency_penalty: float = 0.0  # subtracted per occurrence
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit (before the mask)

    def __post_init__(self):
        if self.cut not in CUT_MODES:
            raise ValueError(f"SamplingParams.cut must be one of {', '.join(CUT_MODES)}, not {self.cut!r}")

    @property
    def adjusts(self) -> bool:
        return bool(self.repetition_penalty != 1.0 or self.presence_penalty or self.frequency_penalty
                    or self.logit_bias)


@dataclass
class Step:
    index: int
    token: int
    text: str
    legal: int | None  # legal tokens at this step (None: unconstrained)
    forced: bool  # written by the grammar (fast-forward or a forced close), not sampled
    logprob: float | None
    top: list[tuple[int, float]] | None = None  # (token, logprob) best first, when top_logprobs > 0
    tag: int | None = None  # under a Turn: the tagged part this token started (0: a call under "auto")


@dataclass
class Generation:
    tokens: list[int]
    text: str
    steps: list[Step] = field(default_factory=list)
    finish_reason: str = "stop"  # stop | length | cancelled | decided
    cut: bool = False  # the grammar closed the output at the token ceiling (values may be filled in)
    truncated: bool = False  # the ceiling ended the output before the grammar accepted it: no whole call
    fitted: bool = False  # the budget ("fit") removed a token the model drew: its own close came sooner
    forward_passes: int = 0
    passes_saved: int = 0  # forced tokens that did not need a pass of their own
    seconds: float = 0.0
    grammar_error: str = ""
    stop_string: str | None = None  # the stop string that ended generation (cut from text)
    prompt_cached: int = 0  # prompt tokens whose KV came from the prefix cache
    drafted: int = 0  # draft tokens fed after the decided ones (`Row.advance`)
    accepted: int = 0  # draft tokens the row then decided (forced ones included)

    @property
    def tokens_per_s(self) -> float:
        return len(self.tokens) / self.seconds if self.seconds > 0 else 0.0

    def save_trace(self, path: str | Path) -> None:
        with open(path, "w") as f:
            for s in self.steps:
                f.write(json.dumps(asdict(s)) + "\n")


def _top(logp, n: int) -> list[tuple[int, float]]:
    """The n most likely tokens of a (width,) log-distribution; masked (-inf) ones never appear."""
    if isinstance(logp, np.ndarray):
        n = min(n, logp.shape[-1])
        ids = np.argpartition(-logp, n - 1)[:n]
        ids = ids[np.argsort(-logp[ids], kind="stable")]
        return [(int(i), float(logp[i])) for i in ids if logp[i] != -np.inf]
    import torch

    values, ids = torch.topk(logp, min(n, logp.shape[-1]))
    return [(int(i), float(v)) for v, i in zip(values.tolist(), ids.tolist()) if v != float("-inf")]


def sample_token(logits, params: SamplingParams, gen):
    """Pick a token from masked logits ((width,), numpy or torch); returns (token, logprob)."""
    tok, logp = _sample_dist(logits, params, gen)
    return tok, float(logp[tok])


def _sample_dist(logits, params: SamplingParams, gen):
    """Pick a token; returns (token, (width,) log-probabilities of the masked distribution).
    numpy logits (the llama.cpp backend) are sampled with numpy and `gen` a numpy Generator;
    torch ones (transformers) with torch and `gen` a torch Generator or None."""
    if isinstance(logits, np.ndarray):
        return _sample_numpy(logits, params, gen)
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


def _sample_numpy(logits: np.ndarray, params: SamplingParams, gen):
    """`_sample_dist` in numpy: the same steps (shift, temperature, top-k, top-p, draw)."""
    logp = log_softmax(logits)
    if params.temperature <= 0:
        return int(np.argmax(logits)), logp
    scaled = (logits.astype(np.float64) - logits.max()) / params.temperature
    if params.top_k > 0:
        k = min(params.top_k, scaled.shape[-1])
        kth = np.partition(scaled, -k)[-k]
        scaled[scaled < kth] = -np.inf
    if params.top_p < 1.0:
        order = np.argsort(-scaled, kind="stable")
        probs = np.exp(scaled[order] - scaled[order[0]])
        probs /= probs.sum()
        cum = np.cumsum(probs)
        scaled[order[cum - probs > params.top_p]] = -np.inf  # keep the smallest prefix reaching top_p
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    rng = gen if gen is not None else np.random.default_rng()
    return int(rng.choice(probs.shape[-1], p=probs)), logp


class Row:
    """One sequence being decoded: its matcher, sampling settings, output and trace. Built per
    request (or per choice of a request with n > 1); driven by whichever loop owns the model.

    Each step the loop passes the (width,) logits after the row's last fed token to `advance`,
    which decides this step's tokens (forced, or masked and sampled), records them, and returns
    what to feed next; [] means the row has ended and `generation()` is its result.
    """

    def __init__(self, vocab, matcher=None, params: SamplingParams | None = None, *, fast_forward: bool = True,
                 on_step: Callable[[Step], None] | None = None, cancelled: Callable[[], bool] | None = None,
                 decided: Callable[[list[int]], bool] | None = None, seed: int | None = None, router=None,
                 draft: int | None = None, prompt: Sequence[int] = ()):
        self.vocab = vocab
        self.matcher = matcher
        self.params = p = params or SamplingParams()
        self.fast_forward = fast_forward
        self.on_step, self.cancelled, self.decided = on_step, cancelled, decided
        self.router = router  # railcall.heuristics.routing.NameRouter: whole-name tool choice (None: token by token)
        self.seed = p.seed if seed is None else seed
        self._gen = None  # made at the first sample, for the kind of logits the backend gives
        self.stops = set(vocab.stop_ids)
        self.out: list[int] = []
        self.steps: list[Step] = []
        self.finish_reason = "length"
        self.ended = False
        self.cut = False
        self.truncated = False
        self.fitted = False
        self._distinct = None
        if matcher is not None and p.distinct_calls:
            from railcall.runtime.distinct import DistinctCalls

            self._distinct = DistinctCalls(vocab)
        self._need: dict = {}  # matcher close key -> its shortest close in tokens ("fit")
        self.passes = 1  # the prefill
        self.saved = 0
        self.prompt_cached = 0
        self.error: Exception | None = None  # what ended the row, if a fault did (finish_reason "error")
        self.t0 = time.perf_counter()
        self.seconds = 0.0
        self._bm = None
        self._counts: dict[int, int] = {}  # token -> occurrences in the output (penalties)
        self._stops_b = [(s.encode("utf-8"), s) for s in p.stop if s]  # (bytes, the string)
        self._longest_stop = max((len(b) for b, _ in self._stops_b), default=0)
        self._text_b = bytearray()  # the output's bytes so far, only kept when there are stop strings
        self._stop_at: list = []  # [byte offset, stop string] once a stop string appeared
        # Under a matcher with free-text phases (a call or an answer inside prose), stop strings
        # apply to the free text only: one would cut a call's JSON in two.
        self._in_free = getattr(matcher, "in_free_text", None)
        self._free_from = 0
        # Drafting (`advance`, `_drafted`): up to `draft` tokens a step beyond the decided ones
        # (0: none; None: the loop's choice, made where its backend can drop cells). Scored
        # routing scores names on the row's cells, which must then hold no draft's: `trim(n)`,
        # given by whoever drives the row, drops the last n fed tokens' cells at once.
        self.draft = draft
        self.trim: Callable[[int], None] | None = None
        self._pending = 0  # fed draft tokens not yet decided, while the row checks its draft
        self._trimmed = False
        self.prompt = np.asarray(prompt, dtype=np.int64)  # where drafts are looked up, with the output
        self._draft: list[int] = []  # the tokens after the decided ones in the last feed
        self.unfed = 0  # fed tokens the last advance did not decide: their cells go before its feed
        self.drafted = 0  # draft tokens fed
        self._forced_ahead = 0  # how many of the draft's first tokens the grammar forces
        self._reach = DRAFT_FIRST  # looked-up tokens the next draft may hold (at most `draft`; doubles
        # while the row takes them all)
        self.look = True  # whether drafts may hold looked-up tokens this step (the loop's say: DRAFT_ROWS)
        self.accepted = 0  # draft tokens the row decided as drafted (forced ones included)

    def generator(self, logits):
        """The row's random generator for `logits`' kind: a numpy Generator for numpy logits, a
        torch one for torch logits, seeded with the row's seed (None: unseeded; torch's global)."""
        if self._gen is None:
            if isinstance(logits, np.ndarray):  # numpy takes no negative seed; the API allows one
                self._gen = np.random.default_rng(None if self.seed is None else self.seed % (1 << 64))
            elif self.seed is not None:
                import torch

                self._gen = torch.Generator().manual_seed(self.seed)
        return self._gen

    # -- one step ----------------------------------------------------------------------------
    def advance(self, logits) -> list[int]:
        """This step's tokens, given the (width,) logits after the last fed token; returns the
        tokens to feed (forced ones together, then a draft where the row drafts), or [] when the
        row has ended.

        Where the last feed ended with a draft, `logits` holds `wants` rows: the logits after the
        draft's forced part (or after the last decided token where it has none) and after each
        looked-up token. The row decides from them one step after another, exactly as it would
        without the draft (a forced step reads no logits), while what it decides is what the
        draft holds; `unfed` is then how many fed tokens it did not decide (the loop drops their
        cells before this feed)."""
        self.unfed = 0
        draft, self._draft = self._draft, []
        if not draft:
            return self._drafted(self._decide(logits))
        forced = self._forced_ahead
        if logits.ndim == 1:
            logits = logits[None]
        j = 0  # draft tokens decided so far
        self.unfed = len(draft)  # until decided otherwise (a fault in a step leaves none kept)
        while True:
            # the logits after draft[j - 1]: none inside the forced part, whose steps read none
            self._pending = len(draft) - j
            out = self._decide(logits[j - forced] if j >= forced else None)
            if self._trimmed:  # routing dropped the rest of the draft's cells: nothing more is fed
                draft, self._trimmed = draft[:j], False
            left = len(draft) - j
            k = 0
            while k < min(len(out), left) and out[k] == draft[j + k]:
                k += 1
            if out and k == len(out) and k < left:  # all of it is fed already, and the draft goes on
                j += k
                continue
            if out and k == left == len(out):  # the decision ends where the draft does: decide again
                j = len(draft)
                continue
            break
        self._pending = 0
        j += k
        self.accepted += j
        if len(draft) > forced:  # the looked-up part grows while the row takes all of it
            self._reach = min(2 * self._reach, self.draft) if j == len(draft) else DRAFT_FIRST
        self.unfed = len(draft) - j
        return self._drafted(out[k:]) if out else []

    def undraft(self) -> int:
        """Take back the draft of the last feed before it ran (the loop's pass could not hold it);
        returns how many tokens to cut from the feed's end."""
        n, self._draft, self._forced_ahead = len(self._draft), [], 0
        self.drafted -= n
        return n

    @property
    def drafting(self) -> int:
        """How many tokens at the end of the last feed are a draft (forced and looked up)."""
        return len(self._draft)

    @property
    def wants(self) -> int:
        """Rows of logits the last feed wants: after its last token, and after each looked-up
        draft token before it (`advance`)."""
        return 1 + len(self._draft) - self._forced_ahead if self._draft else 1

    def _drafted(self, feed: list[int]) -> list[int]:
        """`feed`, then a draft of tokens the row will likely decide next, fed in the same pass
        so that each one it decides saves a pass of its own: the tokens the grammar forces after
        `feed` (all of them: sure to be decided), then up to `_reach` tokens that followed the
        latest earlier occurrence of the context's last few tokens in the prompt and output
        (prompt-lookup drafting, `_lookup`), kept while the grammar allows them. A pass of one
        token costs less than one of two (one SmolLM2 token ~14 ms on 2 cores, two ~19, each
        further ~2.3), so a lone token gets a looked-up draft only on a match of several tokens
        or after a draft the row took whole, and none while `look` is off (a batch of more than
        DRAFT_ROWS rows). Exact: the row decides from the same logits in the
        same order as without a draft (one draw per decided token when it samples), up to
        llama.cpp's differences between pass shapes (tests/test_draft.py)."""
        self._forced_ahead = 0
        if not feed or not self.draft or self.ended or (self.router is not None and self.trim is None):
            return feed
        room = self.params.max_tokens - len(self.out)
        if room <= 0:
            return feed
        m = self.matcher
        before = m.num_consumed() if m is not None else 0
        draft: list[int] = []
        try:
            if m is not None and self.fast_forward:
                for t in m.forced_tokens()[:room]:
                    m.consume_token(t)
                    draft.append(t)
            forced = len(draft)
            n, tail = self._lookup(draft, min(room - forced, self._reach, self.draft) if self.look else 0)
            if len(feed) + forced > 1 or n > 1 or self._reach > DRAFT_FIRST:
                for t in tail:
                    if t in self.stops or (m is not None and (m.is_done() or not m.consume_token(t))):
                        break
                    draft.append(t)
        finally:
            if m is not None:
                m.rollback(m.num_consumed() - before)
        if draft:
            self._draft = draft
            self._forced_ahead = forced
            self.drafted += len(draft)
        return feed + draft

    def _lookup(self, ahead: list[int], room: int) -> tuple[int, list[int]]:
        """(n, up to `room` tokens that followed the latest earlier occurrence of the context's
        last n tokens), n from DRAFT_NGRAM[1] down to DRAFT_NGRAM[0], the first that occurs; the
        context is the prompt, the output and `ahead` (draft tokens already chosen)."""
        if room <= 0:
            return 0, []
        ctx = np.concatenate((self.prompt, np.asarray(self.out, dtype=np.int64), np.asarray(ahead, dtype=np.int64)))
        size = len(ctx)
        for n in range(min(DRAFT_NGRAM[1], size - 1), DRAFT_NGRAM[0] - 1, -1):
            tail = ctx[size - n:]
            hits = np.flatnonzero(ctx[: size - n] == tail[0])
            for i in range(1, n):
                hits = hits[ctx[hits + i] == tail[i]]
            if len(hits):
                at = int(hits[-1]) + n
                return n, ctx[at: at + room].tolist()
        return 0, []

    def _decide(self, logits) -> list[int]:
        """One step without drafts: the tokens decided from the (width,) logits after the last
        decided token (forced ones together), or [] when the row has ended."""
        if self.ended:
            return []
        p, m = self.params, self.matcher
        if self._stop_at:
            return self._end("stop")
        if m is not None and m.is_done():  # complete: only a stop token could follow, ceiling or not
            return self._end("length" if self.cut else "stop")  # the grammar's close is a cut
        if len(self.out) >= p.max_tokens:
            return self._end("length")
        if self.cancelled is not None and self.cancelled():
            return self._end("cancelled")
        if m is not None and self.fast_forward:
            forced = m.forced_tokens()[: p.max_tokens - len(self.out)]
            if forced:
                for t in forced:
                    m.consume_token(t)
                    self._record(t, 1, True, 0.0)
                self.saved += len(forced) - 1
                if self._stop_at:
                    return self._end("stop")
                if len(self.out) >= p.max_tokens:
                    return self._end("stop" if m.is_done() and not self.cut else "length")
                return forced
        if m is not None and p.cut in ("complete", "close") and p.max_tokens - len(self.out) <= CLOSE_WINDOW:
            close = self._close()
            if close:
                return self._write_close(close)
        if m is not None and self.router is not None:
            before = self.router.passes
            score = self.router.score
            if self._pending:  # the names are scored on the row's cells: the draft's go first
                def trimmed(branches):
                    self.trim(self._pending)
                    self._pending, self._trimmed = 0, True
                    return score(branches)

                self.router.score = trimmed
            try:
                routed = self.router.route(m, logits, self.generator(logits), p.max_tokens - len(self.out))
            finally:
                self.router.score = score
            if routed is not None and routed[0]:
                toks, lps = routed
                self.passes += self.router.passes - before
                for t, lp in zip(toks, lps):
                    m.consume_token(t)
                    self._record(t, None, False, lp)
                if self._stop_at:
                    return self._end("stop")
                return toks
        legal = None
        if p.adjusts or p.min_tokens:
            logits = self._adjust(logits)
        if m is not None:
            if self._bm is None:
                self._bm = allocate_bitmask(logits.shape[-1])
            legal = m.fill_bitmask(self._bm)
            if not (p.adjusts or p.min_tokens):
                logits = logits.copy() if isinstance(logits, np.ndarray) else logits.clone()
            apply_bitmask(logits, self._bm)
            if self._distinct is not None and self._distinct.calls:
                legal -= self._ban_copies(logits, legal)
        if p.min_tokens and len(self.out) < p.min_tokens:
            logits = self._hold_stops(logits)
        left = p.max_tokens - len(self.out)
        if m is not None and p.cut == "fit" and left <= CLOSE_WINDOW and not m.is_error():
            picked = self._fit(logits, left)
            if isinstance(picked, list):  # nothing the model drew fits: the shortest close, written
                return picked
            tok, logp = picked
        else:
            tok, logp = _sample_dist(logits, p, self.generator(logits))
            close = (self._close(exact=False) if m is not None and p.cut in ("complete", "close")
                     and left <= CLOSE_WINDOW and self._close_lost(tok, left) else [])
            if close:  # the drawn token would leave the close no room: it is written now instead
                return self._write_close(close)
        if m is not None:
            m.consume_token(tok)
        if tok in self.stops:
            return self._end("stop")
        self._record(tok, legal, False, float(logp[tok]), logp)
        if len(self.out) >= p.max_tokens:
            return self._end("stop" if m is not None and m.is_done() and not self.cut else "length")
        if self._stop_at:
            return self._end("stop")
        if m is None and self.decided is not None and self.decided(self.out):
            return self._end("decided")
        return [tok]

    def _ban_copies(self, logits, legal: int) -> int:
        """Give -inf to the legal tokens that would copy an earlier call of this reply
        (`railcall.runtime.distinct`); returns how many. Never every legal token: the check that
        let the row reach this state found a way on that is no copy."""
        from railcall.runtime.distinct import TEST_ALL_BELOW, byte_state

        def legal_ids():
            if legal > TEST_ALL_BELOW:
                return None
            if isinstance(logits, np.ndarray):
                return np.flatnonzero(np.isfinite(logits)).tolist()
            import torch

            return torch.isfinite(logits).nonzero().flatten().tolist()

        banned = self._distinct.banned(byte_state(self.matcher), legal_ids)
        if not banned or len(banned) >= legal:
            return 0
        if isinstance(logits, np.ndarray):
            logits[np.asarray(banned, dtype=np.int64)] = -np.inf
        else:
            import torch

            logits[torch.as_tensor(banned, dtype=torch.long, device=logits.device)] = float("-inf")
        return len(banned)

    def _need_after(self, tok: int | None) -> int | None:
        """Tokens the grammar's shortest close takes after `tok` (None: from here); 0 where the
        output may end; None where no close exists."""
        m = self.matcher
        n0 = m.num_consumed()
        try:  # on the row's matcher, rolled back: a copy only where a close is searched for
            if tok is not None and (not m.consume_token(tok) or m.is_error()):
                return None
            if m.is_accepting():
                return 0
            # states with equal futures have equal closes (a string's length past its minimum
            # changes nothing): one search for the lot
            key = m.close_key() if hasattr(m, "close_key") else None
            if key is not None and key in self._need:
                return self._need[key]
            m = m.copy()
        finally:
            self.matcher.rollback(self.matcher.num_consumed() - n0)
        close = m.finish()
        # A required string the close fills ("?", one token with its quote: `?"`) takes the model
        # at least one token more when it writes the value itself (`Email` then `"}`): room is
        # kept for that, so an earlier value closes in time for a later one to be written, not
        # filled.
        need = len(close) + self.vocab.decode(close).count(b'?"') if close and m.is_accepting() else None
        if key is not None:
            self._need[key] = need
        return need

    def _fit(self, logits, left: int):
        """Sample among the tokens after which the shortest close still fits in `left` tokens.
        A drawn token that does not fit is removed and the draw repeated (the same as sampling
        from the distribution restricted to the tokens that fit); after FIT_TRIES refusals (the
        budget is tight and the model wants to go on) the draw is among the model's most likely
        legal tokens that fit (`_fitting_best`: a `"` that ends the string, `s"`). Returns
        (token, logprob), or, where none of those fits, the shortest close written by the grammar
        (the tokens to feed; `cut`: a value the model did not choose, such as the "?" of a
        required string not begun, is never passed off as the model's). Where
        not even the shortest close fits now, the draw is unrestricted and the ceiling will cut
        the output (`truncated`)."""
        gen = self.generator(logits)
        need = self._need_after(None)
        if need is None or need > left:
            return _sample_dist(logits, self.params, gen)
        is_np = isinstance(logits, np.ndarray)
        copied = False
        for _ in range(FIT_TRIES):
            tok, logp = _sample_dist(logits, self.params, gen)
            if tok in self.stops:
                return tok, logp
            after = self._need_after(tok)
            if after is not None and 1 + after <= left:
                return tok, logp
            self.fitted = True
            if not copied:
                logits = logits.copy() if is_np else logits.clone()
                copied = True
            logits[tok] = float("-inf")
            if not (np.isfinite(logits).any() if is_np else bool(logits.isfinite().any())):
                break
        fits = self._fitting_best(logits, left)
        if fits:
            keep = np.full(logits.shape[-1], False)
            keep[fits] = True
            if is_np:
                logits[~keep] = -np.inf
            else:
                import torch

                logits[~torch.from_numpy(keep).to(logits.device)] = float("-inf")
            return _sample_dist(logits, self.params, gen)
        m = self.matcher
        close = m.finish()
        for t in close:
            self._record(t, 1, True, 0.0)
        self.cut = bool(close)
        return close or self._end("length")

    def _fitting_best(self, logits, left: int) -> list[int]:
        """The legal tokens after which the shortest close fits in `left`, looked for among the
        model's FIT_SCAN most likely (FIT_KEEP at most, most likely first): a value the budget
        ends is then closed by a token the model ranks high (`s"`, `."`) rather than by the
        grammar's filler for a value not begun (the "?" of a shortest close)."""
        if isinstance(logits, np.ndarray):
            finite = int(np.isfinite(logits).sum())
            k = min(FIT_SCAN, finite)
            if k <= 0:
                return []
            top = np.argpartition(-logits, k - 1)[:k] if k < logits.shape[-1] else np.arange(logits.shape[-1])
            order = top[np.argsort(-logits[top], kind="stable")].tolist()
        else:
            import torch

            finite = int(torch.isfinite(logits).sum())
            k = min(FIT_SCAN, finite)
            if k <= 0:
                return []
            order = torch.topk(logits, k).indices.tolist()
        out = []
        for t in order:
            if t in self.stops:
                continue
            after = self._need_after(t)
            if after is not None and 1 + after <= left:
                out.append(t)
                if len(out) >= FIT_KEEP:
                    break
        if not out:
            # none of the model's most likely tokens fits (many legal tokens, the close's own
            # ranked low): the tokens that begin the grammar's close, those the model may write
            # as its own -- a `"` that ends a string, `"}` -- never the "?" of a value the close
            # would invent
            for t in self._close_starts():
                if t in self.stops or not bool(np.isfinite(logits[t]) if isinstance(logits, np.ndarray)
                                               else logits[t].isfinite()):
                    continue
                after = self._need_after(t)
                if after is not None and 1 + after <= left:
                    out.append(t)
        return out

    def _close_starts(self) -> list[int]:
        """The tokens whose bytes begin the grammar's shortest close from here, up to (not into)
        a "?" the close fills in."""
        close = self.matcher.copy().finish()
        if not close:
            return []
        v = self.vocab
        data = v.decode(close)
        stop = data.find(b"?")
        data = data if stop < 0 else data[:stop]
        out = []
        for k in range(1, min(len(data), v.max_token_len) + 1):
            t = v.lookup.get(data[:k])
            if t is not None:
                out.append(t)
                out.extend(v.duplicates.get(data[:k], ()))
        return list(dict.fromkeys(out))

    def _close(self, exact: bool = True) -> list[int]:
        """The grammar's shortest close if it is time to write it: it takes exactly the budget
        that is left (one more sampled token and it might no longer fit); with `exact` off, any
        close that fits. [] otherwise: the model writes on, so a value is cut as late as possible."""
        m, left = self.matcher, self.params.max_tokens - len(self.out)
        if m.is_accepting() or m.is_error() or (self._in_free is not None and self._in_free()):
            return []
        close = m.copy().finish()
        if not close:
            return []
        return close if len(close) == left or (not exact and len(close) <= left) else []

    def _write_close(self, close: list[int]) -> list[int]:
        """Feed the grammar's close as forced tokens and end the row cut ("complete", "close")."""
        for t in close:
            self.matcher.consume_token(t)
            self._record(t, 1, True, 0.0)
        self.cut = True
        return self._end("length")

    def _close_lost(self, tok: int, left: int) -> bool:
        """Whether feeding `tok` would leave the grammar's close no room ("complete", "close"):
        one token can lengthen the close by more than one (`,` opens a key and its value), so the
        close is written before such a token rather than only when it takes the budget exactly."""
        m = self.matcher
        if m.is_accepting() or (self._in_free is not None and self._in_free()) or tok in self.stops:
            return False
        c = m.copy()
        if not c.consume_token(tok) or c.is_error():
            return False  # an illegal draw is the mask's business, not the close's
        if c.is_accepting():
            return False
        close = c.finish()
        return not close or 1 + len(close) > left

    def _adjust(self, logits):
        """Penalties and bias (vLLM's and OpenAI's definitions), on a copy of the logits."""
        p = self.params
        logits = logits.copy() if isinstance(logits, np.ndarray) else logits.clone()
        if self._counts and (p.repetition_penalty != 1.0 or p.presence_penalty or p.frequency_penalty):
            ids = np.fromiter(self._counts, dtype=np.int64, count=len(self._counts))
            counts = np.fromiter(self._counts.values(), dtype=np.float32, count=len(self._counts))
            if not isinstance(logits, np.ndarray):
                import torch

                ids, counts = torch.from_numpy(ids), torch.from_numpy(counts).to(logits.dtype)
            x = logits[ids]
            if p.repetition_penalty != 1.0:
                x = x.clone() if not isinstance(x, np.ndarray) else x
                pos = x > 0
                x[pos] = x[pos] / p.repetition_penalty
                x[~pos] = x[~pos] * p.repetition_penalty
            x = x - p.presence_penalty - p.frequency_penalty * counts
            logits[ids] = x
        for t, b in (p.logit_bias or {}).items():
            if 0 <= t < logits.shape[-1]:
                logits[t] += b
        return logits

    def _hold_stops(self, logits):
        """Stop tokens masked while fewer than min_tokens were generated -- unless nothing else is
        legal (a grammar that is done), which min_tokens cannot override."""
        held = logits.copy() if isinstance(logits, np.ndarray) else logits.clone()
        for t in self.stops:
            if 0 <= t < held.shape[-1]:
                held[t] = float("-inf")
        finite = np.isfinite(held).any() if isinstance(held, np.ndarray) else held.isfinite().any()
        return held if bool(finite) else logits

    def _record(self, tok: int, legal, forced: bool, logprob, logp=None) -> None:
        p = self.params
        self.out.append(tok)
        self._counts[tok] = self._counts.get(tok, 0) + 1
        if p.top_logprobs > 0:
            top = _top(logp, p.top_logprobs) if logp is not None else [(tok, 0.0)]
        else:
            top = None
        step = Step(len(self.steps), tok, self.vocab.token_text(tok) if tok < self.vocab.size else "", legal, forced,
                    logprob, top, getattr(self.matcher, "started", None))
        self.steps.append(step)
        if self.on_step is not None:
            self.on_step(step)
        if self._distinct is not None and 0 <= tok < self.vocab.size:
            self._distinct.feed(self.vocab.token_bytes[tok])
            if self._in_free is not None and self._in_free():
                self._distinct.leave_call()
        if self._stops_b and not self._stop_at and 0 <= tok < self.vocab.size:
            start = max(self._free_from, len(self._text_b) - self._longest_stop + 1)
            self._text_b.extend(self.vocab.token_bytes[tok])
            if self._in_free is not None and not self._in_free():  # part of a call or an answer
                self._free_from = len(self._text_b)
                return
            hits = [(self._text_b.find(sb, start), s) for sb, s in self._stops_b]
            hits = [h for h in hits if h[0] >= 0]
            if hits:
                self._stop_at.extend(min(hits))

    def _end(self, reason: str) -> list[int]:
        self.finish_reason, self.ended = reason, True
        m = self.matcher
        if (reason == "length" and not self.cut and m is not None and self.params.cut == "complete"
                and not m.is_accepting() and not m.is_error()):
            tail = m.finish()  # the close did not fit in the budget: the forced finish, past it
            for t in tail:
                self._record(t, 1, True, 0.0)
            self.cut = bool(tail)
        if reason == "length" and m is not None and not m.is_accepting():
            self.truncated = True
        self.seconds = time.perf_counter() - self.t0
        return []

    def end(self, reason: str) -> None:
        """End the row from outside (the loop is shutting down, or the row failed)."""
        if not self.ended:
            self._end(reason)

    def generation(self) -> Generation:
        data = self.vocab.decode(self.out)
        if self._stop_at:
            data = data[: self._stop_at[0]]
        m = self.matcher
        return Generation(
            tokens=self.out, text=data.decode("utf-8", errors="replace"), steps=self.steps,
            finish_reason=self.finish_reason, cut=self.cut, truncated=self.truncated, fitted=self.fitted,
            forward_passes=self.passes, passes_saved=self.saved,
            seconds=self.seconds, grammar_error=m.error_message if m is not None else "",
            stop_string=self._stop_at[1] if self._stop_at else None, prompt_cached=self.prompt_cached,
            drafted=self.drafted, accepted=self.accepted)


def generate(backend, vocab, prompt: Sequence[int], matcher=None, params: SamplingParams | None = None, *,
             fast_forward: bool = True, batch_forced: bool = True,
             on_step: Callable[[Step], None] | None = None,
             cancelled: Callable[[], bool] | None = None, router=None, draft: int | None = None) -> Generation:
    """Generate from `prompt` on a single-sequence backend (`start`/`feed`); constrained by
    `matcher` if given (see the module docstring). With `batch_forced=False` forced tokens are
    fed one pass at a time (the reference path for fast-forward). `router`: a
    `railcall.heuristics.routing.NameRouter` for scored routing (its scorer runs on this backend).
    `draft`: tokens drafted a step (`Row.advance`; None: DRAFT_TOKENS where the backend can
    `drop` fed tokens, else 0)."""
    if router is not None and router.score is None:
        from railcall.heuristics.routing import branch_scorer

        router.score = branch_scorer(backend)
    drops = hasattr(backend, "drop") and batch_forced
    draft = (DRAFT_TOKENS if drops else 0) if draft is None else draft
    if draft and not drops:
        raise ValueError("drafts need a backend that can drop fed tokens (llama.cpp) and batch_forced")
    row = Row(vocab, matcher, params, fast_forward=fast_forward, on_step=on_step, cancelled=cancelled, router=router,
              draft=draft, prompt=prompt)
    if drops:
        row.trim = backend.drop
    logits = backend.start(prompt)
    row.prompt_cached = int(getattr(backend, "last_cached", 0) or 0)
    while feed := row.advance(logits):
        if row.unfed:
            backend.drop(row.unfed)
        if drops:
            logits = backend.feed(feed, keep=row.wants)
            logits = logits if row.wants > 1 else logits[-1]
            row.passes += 1
        elif batch_forced or len(feed) == 1:
            logits = backend.feed(feed)[-1]
            row.passes += 1
        else:
            for t in feed:
                logits = backend.feed([t])[-1]
            row.passes += len(feed)
            row.saved -= len(feed) - 1
    if row.unfed:  # the row ended inside its draft
        backend.drop(row.unfed)
    return row.generation()
