"""The decode loop on the embedded model (SmolLM2-135M-Instruct, greedy, a few short calls), on
transformers (the GGUF converted to float32): the golden output and Hugging Face's own `generate`
are that backend's (the llama.cpp backend's: tests/test_models_llama.py)."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.model

from railcall.runtime.decode import SamplingParams, generate
from railcall.demo import DEMO_TOOLS, parse_call
from railcall.grammar.tools import tool_grammar
from railcall.matcher import Matcher, compiled_grammar


@pytest.fixture(scope="module")
def setup():
    from railcall.models.backend import TransformersBackend
    from railcall.models.store import load_model
    from railcall.prompts.chat import chat_prompt_ids
    from railcall.vocab import Vocabulary

    lm = load_model(backend="transformers")
    vocab = Vocabulary.from_hf(lm.tokenizer, logits_width=lm.model.config.vocab_size)
    compiled = compiled_grammar(tool_grammar(DEMO_TOOLS), vocab)
    prompt = chat_prompt_ids(lm.tokenizer, DEMO_TOOLS, "What is 17 times 23?")
    return lm, vocab, compiled, TransformersBackend(lm.model), prompt


def test_golden_constrained_call(setup):
    """Temperature 0: the exact output, recorded from this loop (a change here is a change in
    decoding, masking or the prompt)."""
    lm, vocab, compiled, backend, prompt = setup
    g = generate(backend, vocab, prompt, Matcher(compiled), SamplingParams(max_tokens=48))
    assert g.text == '{"tool":"calc","args":{"expr":"17*23"}}'
    assert g.finish_reason == "stop" and not g.cut
    assert parse_call(g.text, DEMO_TOOLS) == {"tool": "calc", "args": {"expr": "17*23"}}
    # the trace: forced steps have one legal token; the model's steps many
    assert any(s.forced for s in g.steps) and max(s.legal or 0 for s in g.steps) > 1000
    assert g.passes_saved > 0 and g.forward_passes + g.passes_saved >= len(g.tokens)


def test_fast_forward_matches_one_token_at_a_time(setup, tmp_path):
    lm, vocab, compiled, backend, prompt = setup
    p = SamplingParams(max_tokens=48, temperature=0.8, seed=3)
    fast = generate(backend, vocab, prompt, Matcher(compiled), p, batch_forced=True)
    slow = generate(backend, vocab, prompt, Matcher(compiled), p, batch_forced=False)
    assert fast.tokens == slow.tokens
    assert fast.forward_passes < slow.forward_passes
    fast.save_trace(tmp_path / "trace.jsonl")
    rows = [json.loads(line) for line in (tmp_path / "trace.jsonl").read_text().splitlines()]
    assert len(rows) == len(fast.tokens) and {"legal", "forced", "token", "logprob"} <= set(rows[0])


def test_logits_processor_matches_own_loop(setup):
    import torch
    from transformers import LogitsProcessorList

    from railcall.integrations.hf import RailcallLogitsProcessor

    lm, vocab, compiled, backend, prompt = setup
    own = generate(backend, vocab, prompt, Matcher(compiled), SamplingParams(max_tokens=40), fast_forward=False)
    ids = torch.tensor([prompt])
    proc = RailcallLogitsProcessor(compiled, prompt_len=len(prompt))
    out = lm.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=40, do_sample=False,
                            logits_processor=LogitsProcessorList([proc]), eos_token_id=list(vocab.stop_ids),
                            pad_token_id=vocab.eos_id)
    new = [t for t in out[0, len(prompt):].tolist() if t not in vocab.stop_ids]
    assert new == own.tokens


def _generated(vocab, row, prompt_len):
    """A returned sequence's tokens up to its first stop token."""
    out = []
    for t in row[prompt_len:].tolist():
        if t in vocab.stop_ids:
            break
        out.append(t)
    return out


@pytest.mark.parametrize("kw", [dict(num_beams=2), dict(num_beams=4, num_return_sequences=4),
                                dict(do_sample=True, top_k=0, temperature=0.7, num_return_sequences=3)],
                         ids=["beams2", "beams4-return4", "sampling-return3"])
def test_logits_processor_is_right_under_beam_search_and_several_returns(setup, kw):
    """Beam search reorders and duplicates rows between steps; every sequence generate() returns
    is still one the grammar accepts, and a whole call."""
    import torch
    from transformers import LogitsProcessorList, set_seed

    from railcall.integrations.hf import RailcallLogitsProcessor

    from railcall.prompts.chat import chat_prompt_ids

    lm, vocab, compiled, backend, _ = setup
    # a request whose call is short: every beam closes it well inside max_new_tokens (on "17 times
    # 23" beam search prefers a string max_new_tokens cuts: a prefix of a call, never a stop)
    prompt = chat_prompt_ids(lm.tokenizer, DEMO_TOOLS, "Read the file notes.txt, please")
    set_seed(0)
    ids = torch.tensor([prompt])
    proc = RailcallLogitsProcessor(compiled, prompt_len=len(prompt))
    out = lm.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=40,
                            logits_processor=LogitsProcessorList([proc]), eos_token_id=list(vocab.stop_ids),
                            pad_token_id=vocab.eos_id, **kw)
    assert out.shape[0] == kw.get("num_return_sequences", 1)
    whole = 0
    for row in out:
        m = Matcher(compiled)
        tokens = _generated(vocab, row, len(prompt))
        assert all(m.consume_token(t) for t in tokens), vocab.decode(tokens)  # every token the grammar's
        stopped = len(tokens) < out.shape[1] - len(prompt) and row[len(prompt) + len(tokens)].item() in vocab.stop_ids
        if stopped:  # a stop token only where the call is whole
            assert m.is_done() and parse_call(vocab.decode(tokens).decode(), DEMO_TOOLS) is not None, vocab.decode(tokens)
            whole += 1
    assert whole == out.shape[0]


def test_logits_processor_serves_a_padded_batch_and_says_when_rebuilt(setup):
    """Two prompts left-padded to one length: each row's call is the grammar's; the same
    processor serves a second generate() of that length, and one of another length is refused
    with what to do."""
    import torch
    from transformers import LogitsProcessorList

    from railcall.errors import MatcherError
    from railcall.integrations.hf import RailcallLogitsProcessor
    from railcall.prompts.chat import chat_prompt_ids

    lm, vocab, compiled, backend, prompt = setup
    other = chat_prompt_ids(lm.tokenizer, DEMO_TOOLS, "Read the file notes.txt, please")
    width = max(len(prompt), len(other))
    pad = vocab.eos_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in (prompt, other)])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in (prompt, other)])
    proc = RailcallLogitsProcessor(compiled, prompt_len=width)
    run = lambda i, a: lm.model.generate(i, attention_mask=a, max_new_tokens=40, do_sample=False,
                                         logits_processor=LogitsProcessorList([proc]),
                                         eos_token_id=list(vocab.stop_ids), pad_token_id=pad)
    first = run(ids, mask)
    texts = [vocab.decode(_generated(vocab, row, width)).decode() for row in first]
    assert all(parse_call(t, DEMO_TOOLS) is not None for t in texts), texts
    again = run(ids, mask)  # a new generate(): the matchers start over
    assert torch.equal(first, again)
    short = torch.tensor([prompt[1:]])
    with pytest.raises(MatcherError, match=f"prompt_len={len(prompt) - 1}"):
        run(short, torch.ones_like(short))


def test_forced_finish_at_a_tiny_token_ceiling(setup):
    lm, vocab, compiled, backend, prompt = setup
    for n in (1, 3, 9):
        g = generate(backend, vocab, prompt, Matcher(compiled), SamplingParams(max_tokens=n, cut="complete"))
        assert g.cut and g.finish_reason == "length"
        assert parse_call(g.text, DEMO_TOOLS) is not None, g.text


def test_fit_closes_the_models_own_call_inside_the_ceiling_or_reports_it_cut(setup):
    """"fit" (the default): for every ceiling the reply is a whole call the model's tokens closed
    within max_tokens, or, below the shortest call the model can write itself (the grammar's
    shortest, `{"expr":"?"}`, with a token of its own for the value), marked truncated -- never
    completed past it, never "?" passed off as its value."""
    lm, vocab, compiled, backend, prompt = setup
    close = Matcher(compiled).finish()
    shortest = len(close) + vocab.decode(close).count(b'?"')
    for n in (3, shortest - 1, shortest, shortest + 2, 24):
        g = generate(backend, vocab, prompt, Matcher(compiled), SamplingParams(max_tokens=n))
        assert len(g.tokens) <= n and not g.cut
        if n < shortest:
            assert g.truncated and g.finish_reason == "length" and parse_call(g.text, DEMO_TOOLS) is None
        else:
            call = parse_call(g.text, DEMO_TOOLS)
            assert not g.truncated and g.finish_reason == "stop" and call is not None, (n, g.text)
            assert call["args"]["expr"] not in ("", "?") and "17*23".startswith(call["args"]["expr"])


def test_unconstrained_generation_stops_at_a_stop_token(setup):
    lm, vocab, compiled, backend, prompt = setup
    g = generate(backend, vocab, prompt, None, SamplingParams(max_tokens=30))
    assert g.steps and all(s.legal is None for s in g.steps)
    assert not any(t in vocab.stop_ids for t in g.tokens)


def test_demo_json(capsys):
    from typer.testing import CliRunner

    from railcall.cli import app

    r = CliRunner().invoke(app, ["demo", "--json", "--task", "3", "--max-tokens", "32"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout[r.stdout.index("{"):])
    s = out["summary"]
    for k in ("parse_rate_without", "parse_rate_with", "forwards_saved_share", "tokens_per_s_without", "tokens_per_s_with"):
        assert k in s
    assert s["parse_rate_with"] == 1.0 and len(out["tasks"]) == 1
    segs = out["tasks"][0]["with_grammar"]["segments"]
    assert {who for _, who in segs} == {"grammar", "model"}


def test_demo_workspace_tools(tmp_path):
    from railcall.demo import calc, execute, workspace

    root = workspace(tmp_path / "ws")
    assert execute({"tool": "list_dir", "args": {"path": "."}}, root) == "data/, notes.txt, todo.md"
    assert "buy milk" in execute({"tool": "read_file", "args": {"path": "todo.md"}}, root)
    assert "outside" in execute({"tool": "read_file", "args": {"path": "../../etc/passwd"}}, root)
    assert "not run" in execute({"tool": "write_file", "args": {"path": "a", "text": "b"}}, root)
    assert not (root / "a").exists()
    assert calc("17*23") == "391" and calc("2 ** 10") == "1024"
    assert calc("__import__('os')").startswith("error") and calc("9 ** 9999").startswith("error")


def test_the_hf_processor_docstring_example_runs(capsys):
    """The example at the top of railcall.integrations.hf, run as written (beam search included)."""
    import railcall.integrations.hf as hf

    block = []
    for line in hf.__doc__.splitlines()[1:]:
        if line.strip() and not line.startswith("    "):
            break
        block.append(line[4:])
    code = "\n".join(block)
    exec(compile(code, "railcall/integrations/hf.py (docstring)", "exec"), {})
    printed = capsys.readouterr().out.strip()
    call = json.loads(printed)
    assert call["tool"] == "get_weather" and isinstance(call["args"]["city"], str) and call["args"]["city"], printed
