"""Each embedded model's own call format (railcall.models.store.CALL_FORMATS): what `railcall eval
bfcl`, `railcall eval agent` and `railcall serve` use where --format is not given, and --format
still wins. The model never loads: the command's runner is replaced by one that records what
it was given."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from railcall.cli import app
from railcall.models.store import CALL_FORMATS, DEFAULT_MODEL, EMBEDDED, default_call_format


def test_the_measured_formats():
    assert default_call_format() == default_call_format(DEFAULT_MODEL) == "json"
    assert default_call_format("gemma3") == "pythonic"
    assert default_call_format("/models/other.gguf") == "json"  # a model given by path: not measured
    assert set(CALL_FORMATS) <= set(EMBEDDED)


def eval_bfcl_settings(monkeypatch, tmp_path, args) -> dict:
    """What `railcall eval bfcl ... ARGS` passes its runner (a stand-in that stops it there)."""
    import railcall.eval.runner

    seen = {}

    def stand_in(categories, out, **kw):
        seen.update(kw)
        raise ValueError("stopped before decoding")

    monkeypatch.setattr(railcall.eval.runner, "run_bfcl", stand_in)
    r = CliRunner().invoke(app, ["eval", "bfcl", "--category", "multiple", "--limit", "1", "--out", str(tmp_path), *args])
    assert "stopped before decoding" in r.output
    return seen


@pytest.mark.parametrize("args, fmt", [([], "json"), (["--model", "gemma3"], "pythonic"),
                                       (["--model", "gemma3", "--format", "openai"], "openai")])
def test_eval_bfcl_takes_the_models_format(monkeypatch, tmp_path, args, fmt):
    seen = eval_bfcl_settings(monkeypatch, tmp_path, args)
    assert seen["call_format"] == fmt


@pytest.mark.parametrize("args, values, routing", [
    ([], "free", "greedy"),  # the grammar alone, for every model: heuristics are opt-in rows
    (["--model", "gemma3"], "free", "greedy"),
    (["--values", "grounded", "--routing", "matched"], "grounded", "matched"),
    (["--values", "free", "--routing", "greedy"], "free", "greedy"),
    (["--model", "gemma3", "--routing", "scored"], "free", "scored"),
])
def test_eval_bfcl_takes_the_models_values_and_routing(monkeypatch, tmp_path, args, values, routing):
    seen = eval_bfcl_settings(monkeypatch, tmp_path, args)
    assert (seen["values"], seen["routing"]) == (values, routing)


@pytest.mark.parametrize("args, fmt", [([], "json"), (["--model", "gemma3"], "pythonic"),
                                       (["--model", "gemma3", "--format", "json"], "json")])
def test_eval_agent_takes_the_models_format(monkeypatch, tmp_path, args, fmt):
    import railcall.cli
    import railcall.eval.agent

    seen = {}

    def stand_in(out, **kw):
        seen.update(kw)
        raise ValueError("stopped before the suite")

    monkeypatch.setattr(railcall.cli, "_agent_model", lambda model: object())
    monkeypatch.setattr(railcall.eval.agent, "run", stand_in)
    r = CliRunner().invoke(app, ["eval", "agent", "--limit", "1", "--out", str(tmp_path), *args])
    assert "stopped before the suite" in r.output
    assert seen["call_format"] == fmt


@pytest.mark.parametrize("args, fmt", [([], "json"), (["--model", "gemma3"], "pythonic"),
                                       (["--model", "gemma3", "--format", "hermes"], "hermes")])
def test_serve_takes_the_models_format(monkeypatch, args, fmt):
    import railcall.server.app

    seen = {}
    monkeypatch.setattr(railcall.server.app, "serve", lambda model, **kw: seen.update(kw))
    r = CliRunner().invoke(app, ["serve", *args])
    assert r.exit_code == 0, r.output
    assert seen["call_format"] == fmt


def test_eval_bfcl_gives_the_baseline_its_best_chance_by_default(monkeypatch, tmp_path):
    seen = eval_bfcl_settings(monkeypatch, tmp_path, [])
    assert (seen["baseline"], seen["baseline_shots"], seen["ceiling"], seen["distinct_calls"]) == ("tolerant", 2, "fit", True)
    seen = eval_bfcl_settings(monkeypatch, tmp_path, ["--baseline", "whole", "--baseline-shots", "0", "--ceiling",
                                                      "complete", "--repeats"])
    assert (seen["baseline"], seen["baseline_shots"], seen["ceiling"], seen["distinct_calls"]) == ("whole", 0, "complete", False)
