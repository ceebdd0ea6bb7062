"""On the embedded model: batched decoding equals the one-row loop; `railcall eval bfcl` end to
end (--limit 3) with --resume; a hand-made category whose right answer is no call; the ablation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from railcall.data import bfcl_data

pytestmark = pytest.mark.model

SHARED = bfcl_data()  # the installed bfcl-eval package's data
TINY = Path(__file__).resolve().parent / "data" / "bfcl"


@pytest.fixture(scope="module")
def lm_vocab():
    from railcall.models.store import load_model
    from railcall.vocab import Vocabulary

    lm = load_model(backend="transformers")  # the padded-batch paths of TransformersBatch
    return lm, Vocabulary.from_hf(lm.tokenizer, logits_width=lm.model.config.vocab_size, name=lm.name)


def test_batched_greedy_equals_the_one_row_loop(lm_vocab):
    """Two BFCL tasks, each free and under the grammar; at most 3 rows live, so rows join a
    running batch (left-padded caches) and leave it (row selection) while others decode."""
    from railcall.runtime.batch import decode_stream, generate_batch
    from railcall.runtime.decode import SamplingParams, generate
    from railcall.eval import bfcl
    from railcall.eval.runner import make_matcher
    from railcall.models.backend import TransformersBackend

    lm, vocab = lm_vocab
    tasks = bfcl.load_category(SHARED, "multiple", 2)
    reqs = [(bfcl.prompt_ids(lm.tokenizer, t), t.tools if g else None) for t in tasks for g in (False, True)]
    mk = lambda tools: make_matcher(tools, vocab, "required") if tools else None  # noqa: E731
    params = SamplingParams(max_tokens=24)
    one = [generate(TransformersBackend(lm.model), vocab, p, mk(tools), params) for p, tools in reqs]
    streamed = dict(decode_stream(lm.model, vocab, [(p, mk(tools)) for p, tools in reqs], params, max_rows=3))
    together = generate_batch(lm.model, vocab, [p for p, _ in reqs], [mk(tools) for _, tools in reqs], params)
    for i, g in enumerate(one):
        assert streamed[i].tokens == g.tokens, (i, g.text, streamed[i].text)
        assert together[i].tokens == g.tokens
        assert (streamed[i].finish_reason, streamed[i].cut) == (g.finish_reason, g.cut)
    assert all(g.text.startswith('{"tool":"') for g in one[1::2])


def test_eval_bfcl_end_to_end_and_resume(tmp_path):
    from typer.testing import CliRunner

    from railcall.cli import app

    out = tmp_path / "run"
    args = ["eval", "bfcl", "--category", "simple_python", "--limit", "3", "--max-tokens", "40",
            "--data", str(SHARED), "--out", str(out)]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "AST" in r.output and "cut" in r.output and "simple_python" in r.output  # the table, at 80 columns
    s = json.loads((out / "summary.json").read_text())
    per = s["categories"]["simple_python"]
    for cond in ("with_grammar", "without_grammar", "bfcl_prompt"):
        assert per[cond]["n"] == 3
        assert {"parse_rate", "valid_rate", "ast_accuracy"} <= set(per[cond])
    assert per["with_grammar"]["parse_rate"] == 1.0 and per["with_grammar"]["valid_rate"] == 1.0
    assert (out / "eval.png").stat().st_size > 10_000
    lines = (out / "results.jsonl").read_text().splitlines()
    assert len(lines) == 9 and {json.loads(x)["condition"] for x in lines} == {"with_grammar", "without_grammar",
                                                                                "bfcl_prompt"}

    # an interrupted run: one task's lines gone and a torn line left; --resume redoes that task only
    (out / "results.jsonl").write_text("\n".join(lines[:6]) + "\n" + lines[6][:30])
    r = CliRunner().invoke(app, args + ["--resume"])
    assert r.exit_code == 0, r.output
    again = (out / "results.jsonl").read_text().splitlines()
    assert again[:6] == lines[:6] and len(again) == 9
    # greedy: the redone task, the same verdicts (its free prose may part at a near-tie: llama.cpp
    # decodes it in a batch of another size)
    key = lambda line: tuple(json.loads(line)[k] for k in ("id", "condition", "parse", "ast"))  # noqa: E731
    assert sorted(map(key, again[6:])) == sorted(map(key, lines[6:]))
    # other settings are refused rather than mixed into the same results
    r = CliRunner().invoke(app, [*args[:6], "--max-tokens", "41", *args[8:], "--resume"])
    assert r.exit_code == 2 and "other settings" in r.output


def test_a_category_whose_right_answer_is_no_call(tmp_path):
    """tool_choice "auto": the grammar lets the reply be text, and text is right; the unseen
    parallel-multiple category runs in the same pass under the call grammar."""
    from railcall.eval.runner import run_bfcl

    s = run_bfcl(["tiny_irrelevance", "tiny_parallel_multiple"], tmp_path, data=TINY, max_tokens=24)
    recs = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    auto = [r for r in recs if r["category"] == "tiny_irrelevance" and r["condition"] == "with_grammar"]
    assert [r["tool_choice"] for r in auto] == ["auto", "auto"]
    assert all(not r["output"].lstrip().startswith("{") and r["ast"] for r in auto), auto
    assert s["categories"]["tiny_irrelevance"]["with_grammar"]["ast_accuracy"] == 1.0
    (par,) = [r for r in recs if r["category"] == "tiny_parallel_multiple" and r["condition"] == "with_grammar"]
    assert par["tool_choice"] == "required" and par["parse"] and par["valid"]
    # the second baseline, BFCL's own prompt mode, is decoded in the same pass and summarised beside
    bfcl_rows = [r for r in recs if r["condition"] == "bfcl_prompt"]
    assert len(bfcl_rows) == 3 and all(r["tool_choice"] == "free" for r in bfcl_rows)
    assert all(r["prompt_tokens"] > 100 for r in bfcl_rows)  # BFCL's system prompt and function docs
    assert s["categories"]["tiny_irrelevance"]["bfcl_prompt"]["n"] == 2


def test_auto_calls_reads_a_call_between_texts(lm_vocab):
    from railcall.eval.runner import auto_calls

    lm, vocab = lm_vocab
    ids = lm.tokenizer.encode('Sure. {"tool":"get_time","args":{"city":"Rome"}} Done.', add_special_tokens=False)
    assert auto_calls(vocab, ids) == [{"tool": "get_time", "args": {"city": "Rome"}}]
    assert auto_calls(vocab, lm.tokenizer.encode("Paris is the capital.", add_special_tokens=False)) is None


def test_ablation_parse_rates():
    from railcall.eval.ablation import run

    res = run(n=4, max_tokens=24, seed=1)
    s = res["summary"]
    assert s["n"] == 4 and len(res["replies"]) == 8
    assert s["parse_rate_with"] == 1.0 and s["valid_rate_with"] == 1.0
    assert 0.0 <= s["parse_rate_without"] <= 1.0
