"""Batched decoding: many rows through the model per forward pass, each its own `decode.Row`.

On a memory-bound CPU (SmolLM2-135M in fp32 reads its ~540 MB of weights on every pass) one pass
over 16 rows costs about twice one pass over a single row. Measured on 2 cores with ~180-token
prompts: 68 ms per token for one row, 8.7 ms per row-token for 16 rows, 5.7 ms for 32.

    BatchLoop.add(prompt, row, group)  -> waiting (group: the request; its n rows go as one)
    BatchLoop.step():  admit waiting rows (each request up to its share; a cached prefix is not
                       run again), row.advance(logits) for the rows that run this step (mask,
                       sample, or forced tokens), rows that ended leave, one forward pass feeds
                       the rest and a chunk of each prompt still filling (llama.cpp; the
                       transformers batch prefills a prompt whole at admission)
    decode_stream / generate_batch: a BatchLoop over an iterable of requests (railcall eval)
    server.engine.Engine: a BatchLoop on its worker thread, fed by the request queue

Continuous batching: rows join and leave at every step. Rows feed different numbers of tokens per
pass (a forced run against one sampled token), so the new tokens are right-padded within the
pass and the pads masked out of attention for good; prompts are left-padded, and a row that joins
a longer batch is padded on the left. Every row carries its own position ids, so padding never
shifts a position. At temperature 0 the outputs equal `generate`'s (a test checks it); padded
matrix products can differ from unpadded ones in the last bits, so a near-tie between two tokens
could in principle break differently.

Prefix cache (`PrefixCache`, per model, LRU, bounded in bytes): when a row ends, the KV of its
prompt and the tokens it fed is kept; a later prompt that starts with a kept sequence prefills
only the rest. The KV of the first m tokens does not depend on what follows them (attention is
causal and positions count from 0 in every row), so any prefix of a kept sequence is reusable.

Devices: the model may sit on an accelerator (`load_model(device="cuda")`). Its KV cache stays
there; the bookkeeping (each row's padding mask and next position) stays on the CPU and travels
with each pass's token ids, and the logits come back to the CPU, where the rows' masks and
sampling run. On the CPU every move is a no-op.

Lifecycles: the model's batch (`models.backend.TransformersBatch`, `models.llama.LlamaBatch`) holds the KV of the rows in flight, as long as its loop runs;
`PrefixCache` lives as long as the model; rows (and their matchers) are per request.
"""

from __future__ import annotations

import collections
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from railcall.models.backend import TransformersBatch
from railcall.runtime.decode import DRAFT_ROWS, DRAFT_TOKENS, Generation, Row, SamplingParams


class OneRowBatch:
    """A single-sequence backend (`start`/`feed`: a test double, a runtime that cannot batch) seen
    as a batch of at most one row, so that it runs in the same loop (`BatchLoop(max_rows=1)`,
    no prefix cache)."""

    def __init__(self, backend):
        self.backend = backend
        self.rows = 0

    def start(self, prompts):
        if len(prompts) != 1:
            raise ValueError(f"a single-sequence backend runs one row at a time, not {len(prompts)}")
        self.rows = 1
        return self.backend.start(prompts[0]).unsqueeze(0)

    def feed(self, tokens):
        (toks,) = tokens
        return self.backend.feed(toks)[-1].unsqueeze(0)

    def branch_logits(self, b: int, branches):
        from railcall.heuristics.routing import branch_scorer

        return branch_scorer(self.backend)(branches)

    def keep(self, rows):
        if list(rows) != [0] * len(rows) or len(rows) > 1:
            raise ValueError("a single-sequence backend cannot copy or reorder rows")
        self.rows = len(rows)

    def join(self, other) -> None:
        if self.rows:
            raise ValueError("a single-sequence backend holds one row")
        self.backend, self.rows = other.backend, other.rows


class PrefixCache:
    """KV of token sequences a model has run, to skip prefilling a prompt's known start. Built once
    per model (the KV is that model's); used from one thread (the loop's).

    LRU over entries, bounded in bytes (SmolLM2-135M: 46 KB per token, so the default 256 MB holds
    about 5,800 tokens). An entry is a whole sequence (a prompt and what was fed after it); a
    lookup takes the longest common prefix with any entry, at least `min_tokens` long and leaving
    one prompt token to run (its logits are the next step's). Storing a sequence drops the entries
    it extends: an agent's episode keeps one entry that grows step by step.
    """

    def __init__(self, max_bytes: int = 256 << 20, min_tokens: int = 16):
        import numpy as np

        self._np = np
        self.max_bytes = max_bytes
        self.min_tokens = min_tokens
        self._entries: collections.OrderedDict[tuple, tuple] = collections.OrderedDict()  # key -> (ids array, kv, bytes)
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.tokens_saved = 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, prompt: Sequence[int]) -> tuple[int, list | None]:
        """(m, kv): the first m tokens of `prompt` have their KV in `kv` (per layer, (keys,
        values)); (0, None) when no entry shares at least min_tokens with it."""
        np = self._np
        a = np.asarray(prompt, dtype=np.int64)
        for key in [k for k, (_, kv, _) in self._entries.items() if not getattr(kv, "alive", True)]:
            self.bytes -= self._entries.pop(key)[2]  # released by its model when it needed the cells
        best, hit = 0, None
        for key, (ids, kv, _) in self._entries.items():
            n = min(len(ids), len(a))
            if n <= best:
                continue
            eq = ids[:n] == a[:n]
            m = n if bool(eq.all()) else int(np.argmin(eq))
            if m > best:
                best, hit = m, key
        best = min(best, len(prompt) - 1)
        if hit is None or best < self.min_tokens:
            self.misses += 1
            return 0, None
        self._entries.move_to_end(hit)
        self.hits += 1
        self.tokens_saved += best
        kv = self._entries[hit][1]
        touch = getattr(kv, "touch", None)
        if touch is not None:  # the entry's model keeps it until the row has its copy (start_cached)
            touch()
        return best, kv

    def store(self, tokens: Sequence[int], kv: list[tuple]) -> None:
        if len(tokens) < self.min_tokens:
            return
        key = tuple(tokens)
        size = kv.nbytes if hasattr(kv, "nbytes") else sum(
            k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)
        if size > self.max_bytes:
            _release(kv)
            return
        for old in [k for k in self._entries if len(k) <= len(key) and key[: len(k)] == k]:
            self._drop(self._entries.pop(old))
        if key in self._entries:
            self._drop(self._entries.pop(key))
        self._entries[key] = (self._np.asarray(key, dtype=self._np.int64), kv, size)
        self.bytes += size
        while self.bytes > self.max_bytes:
            self._drop(self._entries.popitem(last=False)[1])

    def _drop(self, entry) -> None:
        self.bytes -= entry[2]
        _release(entry[1])

    def clear(self) -> None:
        for entry in self._entries.values():
            _release(entry[1])
        self._entries.clear()
        self.bytes = 0


def _unpin(kv) -> None:
    """End a prefix-cache hit's hold on its entry (railcall.models.llama.KeptSequence pins one
    between its lookup and its copy into the row; torch tensors need none)."""
    unpin = getattr(kv, "unpin", None)
    if unpin is not None:
        unpin()


def _release(kv) -> None:
    """Free a prefix-cache entry's KV where it holds a native resource (a llama.cpp sequence,
    railcall.models.llama.KeptSequence); torch tensors go with their last reference."""
    release = getattr(kv, "release", None)
    if release is not None:
        release()


class _Slot:
    """A row of the loop's batch (per row, per loop). Its prompt runs first, whole at admission
    or a chunk per step (`done` counts the prompt tokens its KV holds); until it has, every row
    of the loop with the same prompt rides along in `rows` and is copied out of it when it is
    done (n > 1: one prefill, the cells shared). After that it holds one row, and `logits` are
    that row's for its next advance."""

    __slots__ = ("rows", "prompt", "group", "done", "tokens", "logits")

    def __init__(self, rows, prompt, group, done, logits=None):
        self.rows = rows
        self.prompt = prompt
        self.group = group
        self.done = done
        self.tokens = list(prompt)  # what the KV holds once the prompt has run: prompt + fed
        self.logits = logits  # (width,): the logits after the row's last token; None while it fills

    @property
    def ready(self) -> bool:
        return self.logits is not None


# The output cells a row is counted for at admission (chunked): what it may still write, at most
# this many (a row past it grows into free cells; a full pass is handled as it always was).
RESERVE = 256
# The prompt tokens a step may run for a request alone in the batch, with nobody queued: no other
# row waits on its pass, so its prompt fills in fewer, larger chunks. A 1,400-token prompt on an
# idle server (SmolLM2 Q8_0 on llama.cpp, 2 cores): 3.64 s in chunks of 32, 3.01 in 64, 2.89 in
# 128, 2.92 in 256, 3.00 in 512. A request that comes in meanwhile waits for at most one such
# pass before the fair order shares the steps again, and that wait is what it costs: behind a
# 7,015-token prompt a short request took 2.0-2.1x its time alone in chunks of 32, 2.3-2.7x in
# 64 or 128 (idle host), and past the server's 3x bound under load (tests/test_server_fairness.py).
# So the default is step_tokens' 32, and larger chunks are a BatchLoop(alone_tokens=...) choice.
ALONE_TOKENS = 32
# Past this many tokens of the prompt filled, each token's attention spans more cells than its
# share of the weights costs (SmolLM2: ~69k multiply-adds per cell a token against ~135M for the
# weights), so a lone prompt's chunk shrinks in proportion (alone_tokens * ALONE_DEPTH / filled,
# at least step_tokens) and a pass, the most a newcomer waits, stays about as long: 128-token
# chunks 6,000 tokens into a prompt made a short request take 2.9-4.1x its time alone.
ALONE_DEPTH = 2048


def _reserve(row: Row) -> int:
    return max(0, min(row.params.max_tokens - len(row.out), RESERVE))


class BatchLoop:
    """Continuous batching: rows join and leave at every step, one forward pass per step for all.

    Built per serving loop (one per model in the server, one per `decode_stream`); used from one
    thread. `add(prompt, row, group)` queues a row (`group`: the request it belongs to, so that
    the rows of one request with n choices are scheduled as one); `step()` admits queued rows,
    advances the rows that run this step, feeds them in one pass together with a chunk of the
    prompts still filling, and returns the rows that ended. A row whose `advance` raises ends with
    finish_reason "error" and the exception in `row.error`.

    Scheduling (docs/server.md, "Scheduling"). A backend whose batch takes part-rows
    (`chunked = True`: railcall.models.llama.LlamaBatch) has its prompts prefilled in chunks, in
    the same pass as the other rows' next tokens; any other (TransformersBatch) prefills a prompt
    whole at admission, at most `prefill_tokens` prompt tokens per step beyond the first row.
    With `fair` (the server), the requests in the batch share each step:

      order    the request that has run the fewest tokens (prompt and output; a cached prefix
               is free) leads; ties in arrival order. A newcomer leads at once.
      tokens   the leader runs up to `step_tokens` tokens (its rows' next tokens and a chunk of
               its prompt) and up to the rows the others leave of `max_rows`; every other
               request runs one token (one row's next token, or one prompt token). A request
               alone in the batch with nobody queued runs up to `alone_tokens`. So a light
               request's step costs about what it would alone, and nobody stops: on 2 cores a
               step of one row is ~15 ms, each further token ~4 ms, a 32-token chunk beside
               3,200 cells ~0.3 s (a 256-token one ~2.4 s: hence 32; one run at load 0.5 filled
               a 3,200-token prompt in 24 s in chunks of 32 against 68 s whole).
      rows     a request is admitted up to its share of the rows (max_rows // the requests with
               rows in the batch or queued, at least one); chunked, rows past their share are
               held with their cells and logits (up to 2 * max_rows held) and a newcomer is
               admitted beside them; whole prefill, a request that took every row before others
               came keeps them until they end.

    Without `fair` (decode_stream, an evaluation) rows are admitted and run in arrival order and
    each prompt may take the whole `step_tokens`.
    """

    def __init__(self, model, vocab, *, max_rows: int = 16, prefix_cache: PrefixCache | None = None,
                 prefill_tokens: int = 2048, step_tokens: int = 32, alone_tokens: int = ALONE_TOKENS,
                 fair: bool = True, new_batch: Callable[[], object] | None = None, draft: int = DRAFT_TOKENS):
        self.model = model
        # what runs the rows: a TransformersBatch over `model` by default, or any object with its
        # verbs (start, start_cached, feed, keep, join, row_kv; OneRowBatch for a single sequence)
        # (a model with a `new_batch` of its own, railcall.models.llama.LlamaModel, makes its own rows)
        if new_batch is None and hasattr(model, "new_batch"):
            new_batch = lambda: model.new_batch(self.pad_id)  # noqa: E731
        self.new_batch = new_batch or (lambda: TransformersBatch(model, pad_id=self.pad_id))
        self.vocab = vocab
        self.max_rows = max_rows
        self.cache = prefix_cache
        self.prefill_tokens = prefill_tokens
        self.step_tokens = max(1, step_tokens)
        self.alone_tokens = max(self.step_tokens, alone_tokens)
        self.fair = fair
        self.draft = draft  # draft tokens a row feeds a step, where the batch can drop them (chunked)
        self.pad_id = vocab.eos_id if vocab.eos_id is not None else 0
        self.waiting: collections.deque[tuple[list[int], Row]] = collections.deque()
        self._slots: list[_Slot] = []  # the batch's rows, in batch order
        self._group: dict[int, object] = {}  # id(row) -> its request, for rows queued or in the batch
        self._service: dict[object, int] = {}  # request -> tokens run for it (its place in the order)
        self._lm = None
        self._chunked: bool | None = None  # whether the batch takes part-rows (known once one is made)
        self._ends = 0  # rows that have left the batch (cells freed)
        self._full_at = -1  # `_ends` when a chunk found the cells full: no admission until a row leaves
        self.forward_passes = 0
        self.steps = 0
        self.prefilled_tokens = 0  # prompt tokens run (a cached prefix is not)

    def add(self, prompt: Sequence[int], row: Row, group=None) -> None:
        router = getattr(row, "router", None)
        if router is not None and router.score is None:
            router.score = self.scorer(row)  # the row's names are scored where its KV is
        group = id(row) if group is None else group
        self._group[id(row)] = group
        self._service.setdefault(group, 0)  # arrival order: the order among requests that ran as much
        self.waiting.append((list(prompt), row))

    def scorer(self, row: Row):
        """Scored routing's scorer for `row` (railcall.heuristics.routing): its branches run on the
        row's KV in the batch, in a pass of their own (`branch_logits` of the batch). Called from
        the row's `advance`, while the row is live."""
        return lambda branches: self._lm.branch_logits(self._index(row), branches)

    def _index(self, row: Row) -> int:
        return next(b for b, s in enumerate(self._slots) if s.rows[0] is row)

    @property
    def live(self) -> list[Row]:
        """The rows in the batch (running, held, or their prompt still filling), in batch order."""
        return [r for s in self._slots for r in s.rows]

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self._slots)

    # -- one step ----------------------------------------------------------------------------
    def step(self) -> list[Row]:
        ended = self._admit()
        ended += self._drop_cancelled()
        if not self._slots:
            return ended
        budget, rows = self._budgets()
        run: dict[int, int] = {}  # slot index -> tokens it runs (a running row: 1 counted, its feed fed)
        chunked = self._chunked
        for b, s in self._by_order([b for b, s in enumerate(self._slots) if s.ready]):
            if not chunked or (rows[s.group] > 0 and budget[s.group] > 0):
                run[b] = 1
                budget[s.group] -= 1
                rows[s.group] -= 1
        for b, s in self._by_order([b for b, s in enumerate(self._slots) if not s.ready]):
            n = min(len(s.prompt) - s.done, budget[s.group])
            if rows[s.group] > 0 and n > 0:
                run[b] = n
                budget[s.group] -= n
                rows[s.group] -= len(s.rows)
        feeds: dict[int, list[int]] = {}
        gone: list[int] = []
        look = sum(self._slots[b].ready for b in run) <= DRAFT_ROWS
        for b in sorted(run):
            s = self._slots[b]
            if not s.ready:
                continue
            row = s.rows[0]
            row.look = look
            try:
                feed = row.advance(s.logits)
            except Exception as e:  # a fault in one row (its matcher, a callback) ends that row only
                row.error = e
                row.end("error")
                feed = []
            if row.unfed:  # draft tokens the row did not decide: their cells go
                self._drop(b, row.unfed)
                row.unfed = 0
            if feed:
                feeds[b] = feed
                continue
            ended.append(row)
            gone.append(b)
            self._forget(row)
            if self.cache is not None and len(s.tokens) >= self.cache.min_tokens:
                self.cache.store(s.tokens, self._lm.row_kv(b))
        if gone:
            keep = [b for b in range(len(self._slots)) if b not in set(gone)]
            run = {keep.index(b): n for b, n in run.items() if b not in set(gone)}
            feeds = {keep.index(b): f for b, f in feeds.items()}
            self._remove(keep)
            if not self._slots:
                return ended
        if not run:
            return ended
        self._pass(run, feeds, ended)
        self.steps += 1
        return ended

    def _drop(self, b: int, n: int) -> None:
        """Forget slot b's last n fed tokens (draft tokens its row did not decide): their cells,
        and the tokens run for its request."""
        s = self._slots[b]
        self._lm.drop(b, n)
        del s.tokens[-n:]
        self._service[s.group] -= n

    def _budgets(self) -> tuple[dict, dict]:
        """(tokens, rows) each request in the batch may run this step (see the class docstring):
        fair, the request that has run the fewest tokens up to `step_tokens` tokens and the rows
        the others leave, every other one token and one row; else each up to both limits. A
        request alone in the batch with nobody queued: up to `alone_tokens` tokens, fewer deep
        into a long prompt (ALONE_DEPTH)."""
        groups = list(dict.fromkeys(s.group for s in self._slots))
        if len(groups) == 1 and not self.waiting:  # alone: no other row waits on this pass
            filled = max((s.done for s in self._slots if not s.ready), default=0)
            tokens = self.alone_tokens
            if filled > ALONE_DEPTH:  # deep in a long prompt: a pass of as many tokens costs more
                tokens = max(self.step_tokens, self.alone_tokens * ALONE_DEPTH // filled)
            return dict.fromkeys(groups, tokens), dict.fromkeys(groups, self.max_rows)
        if not self.fair or len(groups) == 1:
            return dict.fromkeys(groups, self.step_tokens), dict.fromkeys(groups, self.max_rows)
        rank = {g: k for k, g in enumerate(self._service)}
        groups.sort(key=lambda g: (self._service.get(g, 0), rank.get(g, 0)))
        tokens, rows = dict.fromkeys(groups, 1), dict.fromkeys(groups, 0)
        tokens[groups[0]] = self.step_tokens
        rows[groups[0]] = max(1, self.max_rows - len(groups) + 1)
        for g in groups[1: self.max_rows]:
            rows[g] = 1
        return tokens, rows

    def _by_order(self, slots: list[int]) -> list[tuple[int, _Slot]]:
        """Slots in the order their requests choose: fewest tokens run first (fair), else batch order."""
        if not self.fair:
            return [(b, self._slots[b]) for b in slots]
        rank = {g: k for k, g in enumerate(self._service)}  # arrival order among equals
        return sorted(((b, self._slots[b]) for b in slots),
                      key=lambda bs: (self._service.get(bs[1].group, 0), rank.get(bs[1].group, 0)))

    def _pass(self, run: dict[int, int], feeds: dict[int, list[int]], ended: list[Row]) -> None:
        """The step's one forward pass: the running rows' tokens and the filling prompts' chunks.

        A pass with chunks that fails (the KV cells full, say) drops the filling prompts: their
        cells are freed and their rows wait again at the front of the queue while other rows are
        in the batch (no admission until one of them leaves and frees cells), or end with the
        error where there are none; the running rows' tokens then run alone. Where every row of
        the batch is filling, the first half of them is kept and the pass tried again (many long
        prompts admitted together: 48 BFCL prompts of ~2,000 tokens need more than 8,192 cells),
        so only a prompt that cannot fit alone ends with the error."""
        slots = self._slots
        if not self._chunked:
            fed = [feeds[b] for b in range(len(slots))]
            logits = self._lm.feed(fed)
            self._took(run, feeds, logits, dict.fromkeys(range(len(slots)), 1))
            return
        tokens, wants = [], []
        for b, s in enumerate(slots):
            if b in feeds:
                tokens.append(feeds[b])
                wants.append(s.rows[0].wants)
            elif b in run:
                tokens.append(s.prompt[s.done: s.done + run[b]])
                wants.append(int(s.done + run[b] == len(s.prompt)))
            else:
                tokens.append([])
                wants.append(0)
        try:
            logits = self._lm.feed(tokens, wants)
        except Exception as e:
            drafted = [b for b in feeds if slots[b].rows[0].drafting]
            if drafted:  # the drafts may be what did not fit: the pass again without them
                for b in drafted:
                    feeds[b] = feeds[b][: len(feeds[b]) - slots[b].rows[0].undraft()]
                return self._pass(run, feeds, ended)
            filling = [b for b in run if b not in feeds]
            if not filling:
                raise
            self._full_at = self._ends
            # Where every row is filling a prompt (nothing runs that would free cells), the first
            # half of them goes on and the rest wait; otherwise every filling row waits.
            stay = set(filling[: len(filling) // 2]) if len(filling) == len(slots) else set()
            drop = set(filling) - stay
            keep = [b for b in range(len(slots)) if b not in drop]
            back = [(s.prompt, r) for b in sorted(drop) for s in [slots[b]] for r in s.rows]
            going = {keep.index(b): run[b] for b in stay}
            feeds = {keep.index(b): f for b, f in feeds.items()}
            self._remove(keep)
            if self._slots:
                self.waiting.extendleft(reversed(back))
            else:
                for _, r in back:
                    r.error = e
                    r.end("error")
                    ended.append(r)
                    self._forget(r)
            if not feeds and not going:
                return
            return self._pass({**dict.fromkeys(feeds, 1), **going}, feeds, ended)
        self._took(run, feeds, logits, {b: w for b, w in enumerate(wants) if w})

    def _took(self, run, feeds, logits, wanted: dict[int, int]) -> None:
        """Book a pass: running rows get their next logits (`wanted`: slot -> rows of `logits`
        it asked for, in slot order; more than one after a draft); prompts that finished filling
        become rows (copied, one per row riding along: n > 1 shares the prefill's cells)."""
        self.forward_passes += 1
        at, j = {}, 0
        for b in sorted(wanted):
            k = wanted[b]
            at[b] = j if k == 1 else slice(j, j + k)
            j += k
        split = []
        for b, n in run.items():
            s = self._slots[b]
            if b in feeds:
                s.tokens.extend(feeds[b])
                s.rows[0].passes += 1
                self._service[s.group] = self._service.get(s.group, 0) + len(feeds[b])
            else:
                s.done += n
                self.prefilled_tokens += n
                self._service[s.group] = self._service.get(s.group, 0) + n
            if b in at:
                s.logits = logits[at[b]]
                if len(s.rows) > 1:
                    split.append(b)
        if split:
            order = list(range(len(self._slots)))
            extra = []
            for b in split:
                s = self._slots[b]
                order += [b] * (len(s.rows) - 1)
                extra += [_Slot([r], s.prompt, s.group, s.done, s.logits.copy()) for r in s.rows[1:]]
                s.rows = s.rows[:1]
            self._lm.keep(order)
            self._slots += extra

    # -- admission ---------------------------------------------------------------------------
    def _admit(self) -> list[Row]:
        """Take queued rows into the batch, each request up to its share of the rows; returns
        rows that ended while queued (cancelled), or whose prefill failed.

        Chunked: a row starts holding its cached prefix (the prefix cache, or a row of the batch
        with the same prompt), and its prompt runs from the next pass on; a row whose prompt is
        filling already rides along with it. Whole prefill: the rows' prompts run now, up to
        `prefill_tokens` beyond the first row; one that fails (the model's KV cache full, say)
        takes nothing into the batch, and its rows wait again at the front of the queue while
        other rows are live (they free cells as they end); with none live nothing will free any,
        so they end with finish_reason "error" and the exception in `row.error`."""
        ended: list[Row] = []
        if not self.waiting:
            return ended
        if self._lm is None:
            self._lm = self.new_batch()
        if self._chunked is None:
            self._chunked = bool(getattr(self._lm, "chunked", False))
        if self._chunked and self._slots and self._ends == self._full_at:
            return ended  # the cells were full: wait for a row to leave
        held: dict[object, int] = collections.Counter(s.group for s in self._slots for _ in s.rows)
        groups = set(held) | {self._group[id(r)] for _, r in self.waiting}
        share = self.max_rows if not self.fair or len(groups) <= 1 else max(1, self.max_rows // len(groups))
        # chunked: rows past their share may be held (paused), so room is left for newcomers
        cap = 2 * self.max_rows if self._chunked and self.fair else self.max_rows
        total = sum(held.values())
        take: list[tuple[list[int], Row, int, list | None]] = []
        gone: set[int] = set()  # id(row) of rows admitted or ended
        budget = self.prefill_tokens
        # chunked: a row is admitted only while the KV cells can hold every admitted prompt and
        # the tokens its rows may still write (up to RESERVE each): admitted past that, the
        # passes find the cells full, drop prompts and prefill them again (48 BFCL rows
        # of ~400 prompt tokens and 192 output ones in 8,192 cells ran ~30x slower)
        cells = getattr(self._lm, "cells", None) if self._chunked else None
        used = sum(len(sl.prompt) + sum(_reserve(r) for r in sl.rows) for sl in self._slots) if cells else 0
        order = list(self.waiting)
        if self.fair:  # requests holding fewest rows first, arrival order among equals
            order.sort(key=lambda pr: held.get(self._group[id(pr[1])], 0))
        stop = False
        for prompt, row in order:
            g = self._group[id(row)]
            if row.cancelled is not None and row.cancelled():
                row.end("cancelled")
                ended.append(row)
                self._forget(row)
                gone.add(id(row))
                continue
            if stop or total >= cap or held.get(g, 0) >= share:
                continue
            if self._chunked:
                need = len(prompt) + _reserve(row)
                if self._slots and cells is not None and used + need > cells:
                    stop = True  # no row overtakes one whose cells are not there yet
                    continue
                used += need
                self._begin(prompt, row, g)
            else:
                m, kv = self.cache.lookup(prompt) if self.cache is not None else (0, None)
                cost = len(prompt) - m
                if take and cost > budget:
                    _unpin(kv)
                    stop = True  # no row overtakes one that did not fit
                    continue
                budget -= cost
                take.append((prompt, row, m, kv))
            gone.add(id(row))
            held[g] = held.get(g, 0) + 1
            total += 1
        self.waiting = collections.deque(pr for pr in self.waiting if id(pr[1]) not in gone)
        if take:
            ended += self._admit_whole(take)
        return ended

    def _begin(self, prompt: list[int], row: Row, group) -> None:
        """Chunked admission of one row: ride along with a filling slot of the same prompt, or
        start a slot holding the longest known prefix (a batch row's, else the prefix cache's).
        The row drafts (`Row.advance`) where it left the choice to the loop."""
        if row.draft is None and self.draft and hasattr(self._lm, "drop"):
            row.draft, row.prompt = self.draft, np.asarray(prompt, dtype=np.int64)
            row.trim = lambda n: self._drop(self._index(row), n)
        for s in self._slots:
            if not s.ready and s.prompt == prompt:
                s.rows.append(row)
                return
        m, source = 0, None
        for b, s in enumerate(self._slots):  # a row of the batch ran this prompt (another choice)
            if s.ready and len(prompt) > 1 and s.tokens[: len(prompt)] == prompt:
                m, source = len(prompt) - 1, b
                break
        if source is None and self.cache is not None:
            m, source = self.cache.lookup(prompt)
        try:
            used = self._lm.begin(m, source)
        except Exception:
            _unpin(source)
            raise
        row.prompt_cached = used
        self._slots.append(_Slot([row], prompt, group, used))

    def _admit_whole(self, take) -> list[Row]:
        ended: list[Row] = []
        parts: list[tuple[object, object]] = []
        try:
            order = self._prefill(take, parts)
        except Exception as e:
            for _, _, _, kv in take:
                _unpin(kv)
            for lm, _ in parts:
                release = getattr(lm, "release", None)
                if release is not None:
                    release()
            if self._slots:
                self.waiting.extendleft((p, r) for p, r, _, _ in reversed(take))
                return ended
            for _, r, _, _ in take:
                r.error = e
                r.end("error")
                ended.append(r)
                self._forget(r)
            return ended
        fresh = not self._slots  # no row in the batch: the first part becomes it, the rest join it
        for lm, _ in parts:
            self.forward_passes += 1
            if fresh:
                self._drop_batch()
                self._lm = lm
                fresh = False
            else:
                self._lm.join(lm)
        flat = [lg for _, logits in parts for lg in logits]
        for (p, r), lg in zip(order, flat):
            g = self._group[id(r)]
            self._service[g] = self._service.get(g, 0) + len(p) - r.prompt_cached
            self._slots.append(_Slot([r], p, g, len(p), lg))
        return ended

    def _prefill(self, take, parts: list) -> list[tuple[list[int], Row]]:
        """Start a batch for the rows of `take` (into `parts`: (batch, logits) each, in the
        order of the rows returned): rows with equal prompts share one prefill; a row with a
        cached prefix runs only the rest."""
        plain = [(p, r) for p, r, m, _ in take if not m]
        order: list[tuple[list[int], Row]] = []
        if plain:
            firsts: dict[tuple, int] = {}
            uniq, slots = [], []
            for p, r in plain:  # rows with equal prompts share one prefill
                key = tuple(p)
                if key not in firsts:
                    firsts[key] = len(uniq)
                    uniq.append(p)
                slots.append(firsts[key])
            lm = self.new_batch()
            logits = lm.start(uniq)
            parts.append((lm, logits))
            if slots != list(range(len(uniq))):
                lm.keep(slots)
                parts[-1] = (lm, logits[np.asarray(slots, dtype=np.int64)])
            order += plain
            self.prefilled_tokens += sum(len(p) for p in uniq)
        for p, r, m, kv in take:
            if m:
                lm = self.new_batch()
                parts.append((lm, lm.start_cached(p, m, kv)))
                used = getattr(lm, "last_cached", m)  # a kept prefix released meanwhile: all of it ran
                r.prompt_cached = used
                order.append((p, r))
                self.prefilled_tokens += len(p) - used
        return order

    # -- rows leaving ------------------------------------------------------------------------
    def _drop_cancelled(self) -> list[Row]:
        """Rows cancelled leave now, held ones and those whose prompt is filling included (a
        running row would see it in its advance; a held one may not run for a while)."""
        ended, keep = [], []
        for b, s in enumerate(self._slots):
            live = []
            for r in s.rows:
                if r.cancelled is not None and r.cancelled():
                    r.end("cancelled")
                    ended.append(r)
                    self._forget(r)
                else:
                    live.append(r)
            s.rows = live
            if live:
                keep.append(b)
        if len(keep) != len(self._slots):
            self._remove(keep)
        return ended

    def _remove(self, keep: list[int]) -> None:
        """The batch becomes slots `keep` (in order); the others free their cells now."""
        if not keep:
            self._drop_batch()
            return
        self._lm.keep(keep)
        self._slots = [self._slots[b] for b in keep]

    def _forget(self, row: Row) -> None:
        """`row` has ended: its request leaves the order once it has no other row."""
        self._ends += 1
        g = self._group.pop(id(row), None)
        if g is not None and g not in self._group.values():
            self._service.pop(g, None)

    def cancel_all(self, reason: str = "cancelled") -> list[Row]:
        """End every row, live or queued (the loop is stopping); returns them."""
        rows = [r for _, r in self.waiting] + self.live
        for r in rows:
            r.end(reason)
        self.waiting.clear()
        self._group.clear()
        self._service.clear()
        self._drop_batch()
        return rows

    def _drop_batch(self) -> None:
        """No row is in the batch: it goes (a batch holding native resources frees them now)."""
        release = getattr(self._lm, "release", None)
        if release is not None:
            release()
        self._slots, self._lm = [], None


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
    """Decode `requests` ((prompt, matcher or None) each, or (prompt, matcher, router): a
    `railcall.heuristics.routing.NameRouter` for scored routing, its scorer bound to the row's batch;
    an iterable, read as rows are admitted) with at most `max_rows` rows live; yield (request index, Generation) as each row
    ends, in the order rows end.

    Rows are admitted in order, in groups: whenever the live rows fall to half of `max_rows`, the
    next requests are prefilled together (equal prompts once: a request with and without a
    grammar shares its prefill) and join, so a few long replies do not hold the machine to a
    batch of one, and joins (each copies the batch's KV) stay few. `decided(i, tokens)`, if
    given, is asked after each token a free row samples; True ends that row early with
    finish_reason "decided" (an evaluation stops a reply that can no longer be a call).
    `Generation.seconds` is the row's latency from its admission to its last token,
    `forward_passes` the passes it took part in (its prefill included).
    """
    params = params or SamplingParams()
    # arrival order, and every prompt whole in its first pass: an evaluation wants throughput
    loop = BatchLoop(model, vocab, max_rows=max_rows, prefill_tokens=1 << 30, step_tokens=1 << 30, fair=False)
    source = enumerate(requests)
    try:
        yield from _drive(loop, source, vocab, params, max_rows, fast_forward, decided)
    finally:  # an error, or a consumer that stopped early: the rows' KV goes now, not with the model
        loop.cancel_all()


def _drive(loop, source, vocab, params, max_rows, fast_forward, decided):
    pending = next(source, None)
    index: dict[int, int] = {}
    while pending is not None or loop.busy:
        if pending is not None and len(loop.live) + len(loop.waiting) <= max_rows // 2:
            while pending is not None and len(loop.live) + len(loop.waiting) < max_rows:
                i, (prompt, m, *router) = pending
                row = Row(vocab, m, params, fast_forward=fast_forward,
                          decided=(lambda toks, i=i: decided(i, toks)) if decided is not None else None,
                          seed=params.seed + i if params.seed is not None else None,
                          router=router[0] if router else None)
                index[id(row)] = i
                loop.add(prompt, row)
                pending = next(source, None)
        for row in loop.step():
            if getattr(row, "error", None) is not None:
                raise row.error
            yield index.pop(id(row)), row.generation()
