"""Drafts (`railcall.runtime.decode.Row.advance`): a row feeds, after its decided tokens, the
tokens the grammar forces next and tokens looked up in its prompt and output, in the same pass;
each one it then decides saves a pass, and the cells of the rest are dropped.

A draft must change no decision. On a model whose logits depend only on the tokens before them
(the `CopyModel` here: exactly batch-invariant, unlike llama.cpp; the real model's runs are in
tests/test_models_llama.py), a run with drafts writes the same tokens with the same logprobs as
a run without, greedy and sampled, with and without a grammar, alone and batched; it takes fewer
passes; and the cells a backend holds are always the prompt and the decided tokens, never a
draft token the row did not decide.
"""

from __future__ import annotations

import json
import zlib

import numpy as np
import pytest
from typer.testing import CliRunner

from conftest import byte_level_vocab
from railcall.grammar.tools import Tool, tool_grammar
from railcall.matcher import Matcher, compiled_grammar
from railcall.runtime.batch import BatchLoop
from railcall.runtime.decode import Row, SamplingParams, generate

TOOLS = [Tool("read_file", "Read a file", {"type": "object", "properties": {"path": {"type": "string"}},
                                           "required": ["path"]}),
         Tool("write_file", "Write a file", {"type": "object", "properties": {
             "path": {"type": "string"}, "text": {"type": "string"}}, "required": ["path", "text"]})]


class CopyModel:
    """Logits that depend only on the context: mostly a copy of what followed the latest earlier
    occurrence of the last token (what drafts look up), else a token chosen by a hash of the last
    three; noise from the same hash makes some copies lose, so some drafts are wrong."""

    def __init__(self, width: int):
        self.width = width

    def logits(self, ctx: list[int]) -> np.ndarray:
        key = zlib.crc32(np.asarray(ctx[-3:], dtype=np.int64).tobytes())
        rng = np.random.default_rng(key)
        out = rng.normal(0.0, 1.0, self.width).astype(np.float32)
        out[key % self.width] += 2.5
        last = ctx[-1]
        earlier = [i for i in range(len(ctx) - 1) if ctx[i] == last]
        if earlier:
            out[ctx[earlier[-1] + 1]] += 5.0
        return out


class CopyBackend:
    """A single sequence (`start`, `feed(tokens, keep)`, `drop`) over CopyModel; `tokens` is what
    its cells hold; `passes` the (fed, logits wanted) of each pass."""

    def __init__(self, model: CopyModel):
        self.model, self.tokens, self.passes, self.scored = model, [], [], []

    def start(self, prompt):
        self.tokens = list(prompt)
        return self.model.logits(self.tokens)

    def feed(self, tokens, keep: int = 0):
        keep = keep or len(tokens)
        self.passes.append((len(tokens), keep))
        self.tokens += list(tokens)
        n = len(self.tokens)
        return np.stack([self.model.logits(self.tokens[:n - i]) for i in range(keep - 1, -1, -1)])

    def drop(self, n: int) -> None:
        assert 0 < n <= len(self.tokens)
        del self.tokens[-n:]

    def branch_logits(self, branches):
        """Scored routing's pass: each branch's logits after each of its tokens, fed after what
        the cells hold now (a draft's cells left there would be read as part of the context)."""
        self.scored.append(list(self.tokens))
        return [np.stack([self.model.logits(self.tokens + list(br[:i + 1])) for i in range(len(br))])
                for br in branches]


class CopyBatch:
    """The chunked batch verbs of railcall.models.llama.LlamaBatch over CopyModel: rows as token
    lists, `wants[b]` logits rows for row b (after its last tokens), `drop(b, n)`."""

    chunked = True

    def __init__(self, model: CopyModel, log: list):
        self.model, self.rows, self.log = model, [], log
        self.cells = 1 << 20

    def begin(self, m=0, source=None):
        self.rows.append(list(self.rows[source][:m]) if isinstance(source, int) else [])
        return len(self.rows[-1])

    def feed(self, tokens, wants=None):
        wants = [1] * len(tokens) if wants is None else wants
        self.log.append(sum(map(len, tokens)))
        out = []
        for r, t, w in zip(self.rows, tokens, wants):
            r.extend(t)
            out += [self.model.logits(r[:len(r) - i]) for i in range(int(w) - 1, -1, -1)]
        return np.stack(out) if out else np.zeros((0, self.model.width), dtype=np.float32)

    def drop(self, b: int, n: int) -> None:
        del self.rows[b][-n:]

    def keep(self, rows):
        self.rows = [list(self.rows[b]) for b in rows]

    def release(self):
        self.rows = []


@pytest.fixture(scope="module")
def vocab():
    return byte_level_vocab()


@pytest.fixture(scope="module")
def grammar(vocab):
    return compiled_grammar(tool_grammar(TOOLS, "json"), vocab)


def prompt_of(text: str) -> list[int]:
    return list(text.encode())


PROMPTS = [prompt_of('Read notes/todo.txt please. {"tool":"read_file","args":{"path":"notes/todo.txt"}} again: '),
           prompt_of('write "hello world" to a.txt; {"tool":"write_file","args":{"path":"a.txt","text":"hello'),
           prompt_of("the the the quick brown fox, the quick brown fox, the quick")]
CASES = {"greedy": SamplingParams(max_tokens=40),
         "sampled": SamplingParams(max_tokens=40, temperature=1.0, seed=7),
         "penalised": SamplingParams(max_tokens=40, frequency_penalty=0.5, top_logprobs=2)}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("constrained", [True, False])
def test_drafts_change_no_decision_and_save_passes(vocab, grammar, case, constrained):
    params = CASES[case]
    model = CopyModel(vocab.logits_width)
    saved = drafted = accepted = 0
    for p in PROMPTS:
        plain_backend, draft_backend = CopyBackend(model), CopyBackend(model)
        want = generate(plain_backend, vocab, p, Matcher(grammar) if constrained else None, params, draft=0)
        got = generate(draft_backend, vocab, p, Matcher(grammar) if constrained else None, params, draft=8)
        assert got.tokens == want.tokens
        assert [s.logprob for s in got.steps] == pytest.approx([s.logprob for s in want.steps])
        assert [s.top for s in got.steps] == [s.top for s in want.steps]
        assert got.finish_reason == want.finish_reason and not got.grammar_error
        assert want.drafted == 0 and all(k == 1 for _, k in plain_backend.passes)
        # the cells hold the prompt and the decided tokens: the row's last token, and no draft's
        fed = draft_backend.tokens[len(p):]
        assert draft_backend.tokens[:len(p)] == p and fed == got.tokens[:len(fed)]
        assert len(fed) >= len(got.tokens) - 1
        saved += len(plain_backend.passes) - len(draft_backend.passes)
        drafted, accepted = drafted + got.drafted, accepted + got.accepted
        if constrained:
            json.loads(got.text)
    assert saved > 0 and accepted > 0
    assert drafted > accepted  # some drafts were wrong, and still nothing changed


def test_a_forced_run_wants_no_logits_of_its_own(vocab, grammar):
    """The tokens the grammar forces ride in the draft without logits rows: a pass wants one row
    after its last token and one after each looked-up token, never one per forced token."""
    model = CopyModel(vocab.logits_width)
    backend = CopyBackend(model)
    g = generate(backend, vocab, prompt_of("call a tool: "), Matcher(grammar), SamplingParams(max_tokens=40), draft=8)
    assert g.text.startswith('{"tool":"')
    # the first pass carries the decided `{` (or `{"`) and the forced rest of `{"tool":"`
    fed, keep = backend.passes[0]
    assert fed > 1 and keep < fed


def test_a_draft_is_never_past_the_token_ceiling_or_a_stop(vocab):
    model = CopyModel(vocab.logits_width)
    for n in (1, 2, 5):
        backend = CopyBackend(model)
        g = generate(backend, vocab, PROMPTS[2], None, SamplingParams(max_tokens=n), draft=8)
        assert len(g.tokens) == n and len(backend.tokens) <= len(PROMPTS[2]) + n
    stop = vocab.stop_ids[0]
    row = Row(vocab, None, SamplingParams(max_tokens=30), draft=8, prompt=[1, 2, stop, 1, 2])
    row.out = [1, 2]  # the context ends with 1 2, which a stop followed: no draft holds it
    assert stop not in row._drafted([2])


@pytest.mark.parametrize("constrained", [True, False])
def test_batched_rows_with_drafts_equal_rows_without(vocab, grammar, constrained):
    """Rows in one BatchLoop (a chunked batch that can drop cells) decide as without drafts, and
    after every step each row's cells hold its prompt and decided tokens only."""
    model = CopyModel(vocab.logits_width)
    params = SamplingParams(max_tokens=30)

    def run(draft: int):
        log: list = []
        batch = CopyBatch(model, log)
        loop = BatchLoop(None, vocab, max_rows=3, new_batch=lambda: batch, draft=draft)
        rows = [Row(vocab, Matcher(grammar) if constrained else None, params) for _ in PROMPTS]
        for p, r in zip(PROMPTS * 2, rows):
            loop.add(p, r)
        while loop.busy:
            loop.step()
            for s, cells in zip(loop._slots, batch.rows):
                assert cells == s.tokens[:len(cells)]
                if s.ready:  # the prompt, the decided tokens, and the draft waiting for its logits
                    assert cells == s.prompt + s.rows[0].out + s.rows[0]._draft
        return [r.generation() for r in rows], len(log)

    want, passes = run(0)
    got, drafted_passes = run(8)
    assert [g.tokens for g in got] == [w.tokens for w in want]
    assert sum(g.accepted for g in got) > 0 and drafted_passes < passes


def test_serve_refuses_a_negative_draft():
    from railcall.cli import app

    r = CliRunner().invoke(app, ["serve", "--draft", "-1"])
    assert r.exit_code == 2 and "--draft" in r.output


def test_draft_caps_every_looked_up_draft(vocab):
    """`draft=1` feeds at most one looked-up token a step, from the first draft on."""
    model = CopyModel(vocab.logits_width)
    backend = CopyBackend(model)
    prompt = [5, 6, 7, 8, 9] * 4
    generate(backend, vocab, prompt, None, SamplingParams(max_tokens=20), draft=1)
    assert max(keep for _, keep in backend.passes) <= 2


def test_a_pass_the_cells_cannot_hold_runs_again_without_the_drafts(vocab):
    """Where a pass with a draft does not fit the cells, it runs again without the draft, and
    the row decides as it would have: drafts are a saving, never a reason to fail. The cells
    here hold the prompt and every token the row feeds without drafts, not one more."""
    model = CopyModel(vocab.logits_width)
    prompt, n = PROMPTS[2], 24
    refused = [0]

    def run(draft: int, cells: int):
        batch = CopyBatch(model, [])
        plain_feed = batch.feed

        def feed(tokens, wants=None):  # a cache of `cells` cells in all
            if sum(map(len, batch.rows)) + sum(map(len, tokens)) > cells:
                refused[0] += 1
                raise RuntimeError("the KV cells are full")
            return plain_feed(tokens, wants)

        batch.feed = feed
        loop = BatchLoop(None, vocab, max_rows=1, new_batch=lambda: batch, draft=draft)
        row = Row(vocab, None, SamplingParams(max_tokens=n))
        loop.add(prompt, row)
        while loop.busy:
            loop.step()
        return row.generation()

    want = run(0, len(prompt) + n - 1)  # the last token is decided, never fed
    assert refused[0] == 0
    got = run(8, len(prompt) + n - 1)
    assert refused[0] > 0 and got.accepted > 0
    assert got.tokens == want.tokens and got.finish_reason == want.finish_reason == "length"


def test_a_fault_inside_a_draft_keeps_none_of_it(vocab):
    """A step that raises while the row checks its draft leaves every draft token to be dropped."""
    model = CopyModel(vocab.logits_width)
    prompt = [5, 6, 7, 8, 9] * 4
    calls = []

    def on_step(step):
        calls.append(step)
        if len(calls) == 3:
            raise RuntimeError("a callback failed")

    row = Row(vocab, None, SamplingParams(max_tokens=20), draft=8, prompt=prompt, on_step=on_step)
    feed = row.advance(model.logits(prompt))
    assert row.drafting > 0 and feed[0] == 5
    ctx = prompt + feed
    logits = np.stack([model.logits(ctx[:len(ctx) - i]) for i in range(row.wants - 1, -1, -1)])
    drafted = row.drafting
    with pytest.raises(RuntimeError):
        row.advance(logits)
    assert row.unfed == drafted


@pytest.mark.parametrize("batched", [False, True])
def test_scored_routing_scores_names_on_decided_cells_only(vocab, grammar, batched):
    """A row with scored routing drafts too; where it reaches a name while its draft's cells are
    in place, they are dropped before the names are scored, and the row decides what it decides
    without drafts: the same tokens, the names scored on the same context."""
    from railcall.heuristics.routing import NameRouter

    model = CopyModel(vocab.logits_width)
    # in the vocabulary's own pieces (`{"`, `tool`, `":"`), as the output will be: drafts look up tokens
    prompt = vocab.greedy_tokenize(b'write_file: {"tool":"write_file","args":{"path":"a.txt","text":"hi"}} again: ')
    params = SamplingParams(max_tokens=40)

    def run(draft: int):
        router = NameRouter.for_tools(vocab, TOOLS, "json")
        if not batched:
            backend = CopyBackend(model)
            g = generate(backend, vocab, prompt, Matcher(grammar), params, router=router, draft=draft)
            return g, backend.scored
        batch = CopyBatch(model, [])
        scored: list = []

        def branch_logits(b, branches):
            scored.append(list(batch.rows[b]))
            return [np.stack([model.logits(batch.rows[b] + list(br[:i + 1])) for i in range(len(br))])
                    for br in branches]

        batch.branch_logits = branch_logits
        loop = BatchLoop(None, vocab, max_rows=2, new_batch=lambda: batch, draft=draft)
        row = Row(vocab, Matcher(grammar), params, router=router)
        loop.add(prompt, row)
        while loop.busy:
            loop.step()
        return row.generation(), scored

    want, want_scored = run(0)
    got, got_scored = run(8)
    assert got.tokens == want.tokens and want_scored and got_scored == want_scored
    assert got.drafted > 0
