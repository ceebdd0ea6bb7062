"""railcall.eval.variants: the --variants spec, the run plan (a scored variant shares its greedy
baseline's free replies), and the table, with a stand-in runner that records its calls."""

from __future__ import annotations

import json

import pytest

from railcall.eval import variants


def test_the_spec_gives_every_combination_in_the_order_written():
    vs = variants.parse("format=json,pythonic routing=greedy,scored")
    assert [(v["format"], v["routing"]) for v in vs] == [("json", "greedy"), ("json", "scored"),
                                                         ("pythonic", "greedy"), ("pythonic", "scored")]
    assert all(v["shots"] == 0 and v["model"] == "smollm2" for v in vs)  # the axes not named keep their defaults
    vs = variants.parse("shots=0,2;model=smollm2,gemma3")
    assert [(v["shots"], v["model"]) for v in vs] == [(0, "smollm2"), (0, "gemma3"), (2, "smollm2"), (2, "gemma3")]
    assert variants.label(vs[3]) == "json-greedy-2shot-gemma3"
    vs = variants.parse("format=json,pythonic | model=gemma3 format=json | format=json model=smollm2")
    assert [variants.label(v) for v in vs] == ["json-greedy-0shot-smollm2", "pythonic-greedy-0shot-smollm2",
                                               "json-greedy-0shot-gemma3"]
    # 2p: two examples, the last a pair of calls
    vs = variants.parse("shots=2,2p")
    assert [variants.label(v) for v in vs] == ["json-greedy-2shot-smollm2", "json-greedy-2pshot-smollm2"]
    assert [variants.shot_count(v) for v in vs] == [(2, False), (2, True)]


@pytest.mark.parametrize("spec, says", [
    ("", "name at least one axis"),
    ("format=yaml", "'yaml' is not one of"),
    ("routing=best", "not greedy, scored or matched"),
    ("values=exact", "not free or grounded"),
    ("shots=two", "whole numbers"),
    ("shots=0p", "whole numbers"),
    ("shots=p2", "whole numbers"),
    ("colour=red", "AXIS=VALUE"),
    ("format", "AXIS=VALUE"),
    ("format=json format=openai", "given twice"),
    ("format=json,json", "a value twice"),
    ("format=", "no values"),
    ("format=json | ", "name at least one axis"),
])
def test_a_bad_spec_says_what_is_wrong(spec, says):
    with pytest.raises(variants.VariantError, match=says):
        variants.parse(spec)


def test_a_scored_variant_runs_the_grammar_alone_after_its_greedy_baseline():
    steps = variants.plan(variants.parse("format=json,pythonic routing=scored"))
    assert [(variants.label(v), without) for v, without in steps] == [
        ("json-greedy-0shot-smollm2", True), ("json-scored-0shot-smollm2", False),
        ("pythonic-greedy-0shot-smollm2", True), ("pythonic-scored-0shot-smollm2", False)]
    # a baseline asked for as well runs once
    steps = variants.plan(variants.parse("routing=scored,greedy"))
    assert [variants.label(v) for v, _ in steps] == ["json-greedy-0shot-smollm2", "json-scored-0shot-smollm2"]


def test_a_grounded_variant_shares_its_free_baseline_too():
    vs = variants.parse("values=free,grounded routing=greedy,scored")
    assert [variants.label(v) for v in vs] == ["json-greedy-0shot-smollm2", "json-greedy-0shot-grounded-smollm2",
                                               "json-scored-0shot-smollm2", "json-scored-0shot-grounded-smollm2"]
    steps = variants.plan(variants.parse("values=grounded routing=scored"))
    assert [(variants.label(v), without) for v, without in steps] == [
        ("json-greedy-0shot-smollm2", True), ("json-scored-0shot-grounded-smollm2", False)]


def _summary(acc_with, acc_without, n=4):
    def cond(acc):
        return {"n": n, "parse_rate": 1.0, "valid_rate": 1.0, "ast_accuracy": acc, "tokens_mean": 20.0,
                "seconds_mean": 1.5, "cut_rate": 0.0}
    per = {"with_grammar": cond(acc_with)}
    if acc_without is not None:
        per["without_grammar"] = cond(acc_without)
    return {"categories": {"multiple": per}}


def test_run_writes_one_table_and_shares_the_baselines_free_replies(tmp_path):
    calls = []

    def runner(categories, out, **kw):
        calls.append((out.name, kw))
        scored = kw["routing"] == "scored"
        assert kw["without_grammar"] is not scored and kw["limit"] == 4
        return _summary(0.5 if scored else 0.25, None if scored else 0.0)

    table = variants.run(["multiple"], tmp_path, variants.parse("routing=scored"), runner=runner, limit=4)
    # asked for the scored variant only: the baseline ran for it, but only what was asked is tabled
    assert [c[0] for c in calls] == ["json-greedy-0shot-smollm2", "json-scored-0shot-smollm2"]
    assert calls[1][1]["call_format"] == "json" and calls[1][1]["shots"] == 0 and calls[1][1]["model"] == "smollm2"
    assert calls[1][1]["shot_pair"] is False and calls[1][1]["values"] == "free"
    (row,) = table["rows"]
    assert row["variant"] == "json-scored-0shot-smollm2" and row["with_grammar"]["ast_accuracy"] == 0.5
    assert row["without_grammar"]["ast_accuracy"] == 0.0  # the greedy run's
    assert json.loads((tmp_path / "variants.json").read_text()) == table
    md = (tmp_path / "variants.md").read_text()
    assert "| json-scored-0shot-smollm2 | multiple | 4 | **50.0%** / 0.0% |" in md
    assert (tmp_path / "variants.png").stat().st_size > 0
