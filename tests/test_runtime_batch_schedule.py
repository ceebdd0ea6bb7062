"""railcall.runtime.batch's scheduling, on a fake chunked batch: the order in which rows and prompt
chunks run, step by step (deterministic, no model).

The fake batch records every pass (tokens per row) and answers logits whose best token is always
the same, so each row's reply is known: it runs `max_tokens` tokens. What is checked is who runs
when: a long prompt in chunks beside the rows decoding, the request that has run least first, a
request's n rows sharing the step with a newcomer, one prefill for n rows, cancellation, and a
full cache (rows wait, or end with the error when nothing else runs).
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import byte_level_vocab
from railcall.runtime.batch import BatchLoop
from railcall.runtime.decode import Row, SamplingParams

TOKEN = ord("a")


class Full(Exception):
    pass


class FakeBatch:
    """A chunked batch (the verbs of railcall.models.llama.LlamaBatch) over token lists."""

    chunked = True

    def __init__(self, width: int, passes: list, cells: int = 1 << 30):
        self.width, self.passes, self.limit = width, passes, cells  # cells it holds, not advertised
        self.rows: list[list[int]] = []

    def begin(self, m=0, source=None):
        self.rows.append(list(self.rows[source][:m]) if isinstance(source, int) else [])
        return len(self.rows[-1])

    def feed(self, tokens, wants=None):
        if sum(map(len, self.rows)) + sum(map(len, tokens)) > self.limit:
            raise Full("the cells are full")
        self.passes.append([len(t) for t in tokens])
        wants = [True] * len(tokens) if wants is None else wants
        for r, t in zip(self.rows, tokens):
            r.extend(t)
        out = np.zeros((sum(wants), self.width), dtype=np.float32)
        out[:, TOKEN] = 10.0
        return out

    def keep(self, rows):
        self.rows = [list(self.rows[b]) for b in rows]

    def release(self):
        self.rows = []


@pytest.fixture()
def vocab():
    return byte_level_vocab()


def make(vocab, cells=1 << 30, **kw):
    passes: list = []
    loop = BatchLoop(None, vocab, new_batch=lambda: FakeBatch(vocab.logits_width, passes, cells), **kw)
    return loop, passes


def row(vocab, n, **kw):
    return Row(vocab, None, SamplingParams(max_tokens=n, temperature=0.0), **kw)


def run(loop, steps=1000):
    ended = []
    for _ in range(steps):
        if not loop.busy:
            break
        ended += loop.step()
    return ended


def test_a_long_prompt_runs_in_chunks_beside_a_decoding_row(vocab):
    """Its first chunk runs beside the decoding row; once it has run more than that row's request,
    it runs one token a step until the row ends (the row's steps stay small), then whole chunks."""
    loop, passes = make(vocab, step_tokens=32)
    a = row(vocab, 8)
    loop.add([1] * 10, a, group="a")
    loop.step()  # a's prompt
    loop.step()  # a's first token
    hog = row(vocab, 3)
    loop.add([2] * 100, hog, group="hog")
    loop.step()
    assert passes[-1] == [1, 32]  # the newcomer has run least: a chunk, beside a's token
    while not a.ended:
        loop.step()
        assert passes[-1] in ([1, 1], [1]), passes[-1]  # a's token and one prompt token (or a left)
    loop.step()
    assert passes[-1] == [32]  # alone, nobody queued: a chunk of alone_tokens (by default step_tokens')
    run(loop)
    assert len(a.out) == 8 and len(hog.out) == 3
    assert sum(sum(p) for p in passes) == 10 + 7 + 100 + 2  # every prompt token once, every fed token once


def test_the_request_that_has_run_least_goes_first(vocab):
    """A long prompt alone runs alone_tokens a step; once a short request comes, the short one runs
    whole steps and the long one one token a step, until the short one ends."""
    loop, passes = make(vocab, step_tokens=32, alone_tokens=32)
    hog = row(vocab, 2)
    loop.add(list(range(1, 201)), hog, group="hog")
    loop.step()
    loop.step()
    assert passes == [[32], [32]]
    short = row(vocab, 4)
    loop.add([7] * 20, short, group="short")
    loop.step()
    assert passes[-1] == [1, 20]  # the short prompt whole, the long one a token
    for _ in range(3):
        loop.step()
        assert passes[-1] == [1, 1]  # the short row's token, one more prompt token of the long one
    loop.step()  # the short row's last token: sampled, not fed
    assert short.ended and len(short.out) == 4
    loop.step()
    assert passes[-1] == [32]  # alone again: whole chunks
    run(loop)
    assert hog.ended and len(hog.out) == 2


def test_a_request_alone_runs_larger_chunks_until_another_is_queued(vocab):
    """Alone in the batch with nobody queued, a prompt runs alone_tokens a step (no other row
    waits on the pass); a request queued before a step brings it back to step_tokens at once, the
    newcomer leading; alone again, the larger chunks resume."""
    loop, passes = make(vocab, step_tokens=16, alone_tokens=64)
    hog = row(vocab, 2)
    loop.add(list(range(1, 301)), hog, group="hog")
    loop.step()
    loop.step()
    assert passes == [[64], [64]]
    short = row(vocab, 2)
    loop.add([7] * 40, short, group="short")
    assert loop.waiting  # queued until the next step admits it
    loop.step()
    assert passes[-1] == [1, 16]  # the newcomer leads with step_tokens, the long prompt a token
    while not short.ended:
        loop.step()
        assert max(passes[-1]) <= 16, passes[-1]
    loop.step()
    assert passes[-1] == [64]  # alone again
    run(loop)
    assert hog.ended and len(hog.out) == 2 and len(short.out) == 2
    assert sum(sum(p) for p in passes) == 300 + 40 + 1 + 1  # every prompt token once, each row's one fed token


def test_a_lone_prompt_runs_smaller_chunks_deep_into_it(vocab):
    """Past ALONE_DEPTH tokens filled, a lone prompt's chunk shrinks in proportion (each token's
    attention spans more cells), never below step_tokens, so a pass, what a newcomer waits for,
    stays about as long; every prompt token still runs once."""
    from railcall.runtime.batch import ALONE_DEPTH

    loop, passes = make(vocab, step_tokens=16, alone_tokens=128)
    n = 4 * ALONE_DEPTH + 500
    hog = row(vocab, 1)
    loop.add([5] * n, hog, group="hog")
    filled = 0
    while filled < n:
        loop.step()
        want = 128 if filled <= ALONE_DEPTH else max(16, 128 * ALONE_DEPTH // filled)
        assert passes[-1] == [min(want, n - filled)], (filled, passes[-1])
        filled += passes[-1][0]
    assert passes[0] == [128] and passes[-2][0] < 128 and run(loop) == [hog]
    assert sum(sum(p) for p in passes) == n


def test_n_rows_of_one_request_leave_room_for_another(vocab):
    loop, passes = make(vocab, max_rows=16, step_tokens=64)
    hogs = [row(vocab, 40) for _ in range(16)]
    for r in hogs:
        loop.add([3] * 30, r, group="hog")
    loop.step()
    assert passes == [[30]]  # one prefill for the 16 rows
    loop.step()
    assert passes[-1] == [1] * 16  # alone: every row
    short = row(vocab, 5)
    loop.add([4] * 12, short, group="short")
    loop.step()
    # the newcomer is admitted beside the 16 held rows and runs first; the hog runs one of its
    # rows a step while it does (the others held, cells and logits kept)
    assert passes[-1] == [1] + [0] * 15 + [12]
    for _ in range(4):
        loop.step()
        assert passes[-1] == [1] + [0] * 15 + [1]
    loop.step()
    assert short.ended and len(short.out) == 5
    run(loop)
    assert [len(r.out) for r in hogs] == [40] * 16


def test_a_request_holds_its_share_of_rows_while_others_wait(vocab):
    loop, _ = make(vocab, max_rows=4, step_tokens=64)
    a = [row(vocab, 5) for _ in range(8)]
    b = [row(vocab, 5) for _ in range(8)]
    for r in a:
        loop.add([1] * 8, r, group="a")
    for r in b:
        loop.add([2] * 8, r, group="b")
    loop.step()
    held = [next(g for g, rows in (("a", a), ("b", b)) if r in rows) for r in loop.live]
    assert held.count("a") == 2 and held.count("b") == 2  # max_rows // 2 each
    run(loop)
    assert all(len(r.out) == 5 for r in a + b)


def test_a_later_choice_copies_the_prompt_of_a_running_one(vocab):
    loop, passes = make(vocab, max_rows=2, step_tokens=64)
    rows = [row(vocab, 3), row(vocab, 6), row(vocab, 3)]
    for r in rows:
        loop.add([5] * 40, r, group="a")
    run(loop)
    assert [len(r.out) for r in rows] == [3, 6, 3]
    # the third row, admitted when a row left, ran the prompt's last token only
    assert rows[2].prompt_cached == 39 and sum(sum(p) for p in passes) == 40 + 1 + (2 + 5 + 2)


def test_a_cancelled_row_leaves_while_its_prompt_fills(vocab):
    loop, _ = make(vocab, step_tokens=16)
    flag = {"stop": False}
    r = row(vocab, 5, cancelled=lambda: flag["stop"])
    loop.add([1] * 100, r)
    loop.step()
    flag["stop"] = True
    assert loop.step() == [r] and r.finish_reason == "cancelled" and not loop.busy


def test_full_cells_requeue_the_filling_prompt_or_end_it(vocab):
    loop, passes = make(vocab, cells=100, step_tokens=32)
    a = row(vocab, 30)
    loop.add([1] * 40, a, group="a")
    loop.step()
    loop.step()
    loop.step()  # a: 40 prompt tokens + 2 fed
    b = row(vocab, 3)
    loop.add([2] * 70, b, group="b")  # 70 more do not fit beside a
    run(loop, 200)
    assert len(a.out) == 30 and a.finish_reason == "length"
    assert b.ended and len(b.out) == 3  # ran once a left
    alone = row(vocab, 3)
    loop.add([3] * 150, alone)  # more than the cells, nothing else running: ends with the error
    assert run(loop) == [alone] and alone.finish_reason == "error" and isinstance(alone.error, Full)


def test_prompts_admitted_together_that_overflow_the_cells_take_turns(vocab):
    """Four 40-token prompts admitted in one step need 160 cells of 100: when the pass in which
    every row is filling fails, half of them go on and the rest wait; each prompt fits alone,
    so all four are answered and none ends with the error."""
    loop, passes = make(vocab, cells=100, step_tokens=32)
    rows = [row(vocab, 3) for _ in range(4)]
    for k, r in enumerate(rows):
        loop.add([k + 1] * 40, r, group=str(k))
    ended = run(loop)
    assert sorted(map(id, ended)) == sorted(map(id, rows))
    assert all(r.finish_reason == "length" and len(r.out) == 3 for r in rows), [r.finish_reason for r in rows]


def test_admission_counts_the_cells_so_passes_do_not_overflow_them(vocab):
    """Where the batch says how many KV cells it has, a row is admitted only while every admitted
    prompt and what its rows may still write fit: the same four 40-token prompts in 100 cells
    run two at a time, and no pass finds the cells full (a full pass throws its prefill away)."""
    fails = []

    class Counted(FakeBatch):
        cells = 100  # the batch says how many cells it has

        def feed(self, tokens, wants=None):
            try:
                return super().feed(tokens, wants)
            except Full:
                fails.append(1)
                raise

    passes: list = []
    loop = BatchLoop(None, vocab, new_batch=lambda: Counted(vocab.logits_width, passes, 100), step_tokens=32)
    rows = [row(vocab, 3) for _ in range(4)]
    for k, r in enumerate(rows):
        loop.add([k + 1] * 40, r, group=str(k))
    run(loop)
    assert all(r.finish_reason == "length" and len(r.out) == 3 for r in rows)
    assert not fails
    assert max(sum(1 for n in p if n) for p in passes) <= 2  # never more than two rows at once
