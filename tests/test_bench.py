"""`railcall bench --quick` runs, side by side with the peers, and produces every figure.

What the figures are is the benchmark's business, not a test's: nothing here is timed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from railcall.bench.run import FIGURES
from railcall.cli import app
from railcall.data import bfcl_data

DATA = bfcl_data()  # the installed bfcl-eval package's data


@pytest.mark.model
def test_quick_bench_produces_every_figure(tmp_path):
    out = tmp_path / "bench.json"
    r = CliRunner().invoke(app, ["bench", "--quick", "--out", str(out), "--data", str(DATA)])
    assert r.exit_code == 0, r.output
    report = json.loads(out.read_text())
    assert {x["engine"] for x in report["results"]} == {"railcall", "railcall-py", "railcall-lazy", "railcall-eager",
                                                        "llguidance", "xgrammar", "outlines-core"}
    assert {x["workload"] for x in report["results"]} == {"seed3", "bfcl20"}
    for rec in report["results"]:
        for f in FIGURES + ["engine", "vocab", "workload", "note"]:
            assert f in rec
        if rec["note"] is None or "rejects" in rec["note"]:
            assert all(isinstance(rec[f], (int, float)) for f in FIGURES), rec
            assert rec["walks"] == 3 and len(rec["tbm_us_p99_each_walk"]) == 3, rec
    ours = [x for x in report["results"] if x["engine"].startswith("railcall")]
    assert len(ours) == 8 and all(x["rejected_paths"] == 0 for x in ours)  # railcall accepts every valid call
    # railcall-py really ran from the Python source; the default mode as this checkout is built
    from railcall import speedups

    assert all(x["build"] == "Python source (RAILCALL_PURE=1)" for x in ours if x["engine"] == "railcall-py")
    built = speedups.describe() if not speedups.status()["pure"] else None
    assert built is None or all(x["build"] == built for x in ours if x["engine"] == "railcall")
    assert report["machine"]["railcall_build"] == speedups.describe()
    for row in report["ratios"]:
        assert all(row[f] is not None and row[f]["ratio"] is not None for f in FIGURES if f != "peak_mem_mb")
    assert report["machine"]["engines"]["llguidance"] != "not installed"
    assert out.with_suffix(".png").stat().st_size > 1000
    md = out.with_suffix(".md").read_text()
    assert "railcall / best peer" in md and "railcall-eager / best peer" in md and "railcall-py / best peer" in md
    assert {(x["engine"], x["workload"]) for x in report["ratios"]} == {
        (e, w) for e in ("railcall", "railcall-py", "railcall-lazy", "railcall-eager") for w in ("seed3", "bfcl20")}
    (build,) = report["vocab_builds"]
    assert build["tokens"] == 49152 and build["build_cached_s"] > 0
    e2e = report["end_to_end"]
    assert e2e["ms_per_token_with_grammar"] > 0 and 0 < e2e["forward_passes_saved_share"] < 1
    assert all(x["sampled_paths"] > 0 for x in report["results"] if x["engine"] == "railcall")


def test_report_files_are_replaced_whole(tmp_path, disk_full):
    """A write that fails half-way (a full disk) leaves the previous report files as they were."""
    from railcall.bench.run import write_report

    report = {"machine": {"processor": "cpu", "cpu_count": 2, "python": "3", "numpy": "2", "engines": {}},
              "results": [{"engine": "railcall", "vocab": "smollm2", "workload": "seed3", "tbm_us_p50": 9.0,
                           "tbm_us_p99": 20.0, "ttfm_cold_us_p50": 300.0}], "ratios": []}
    out = tmp_path / "bench.json"
    write_report(report, out)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert set(before) == {"bench.json", "bench.md", "bench.png"}
    disk_full()
    with pytest.raises(OSError):
        write_report({**report, "quick": True}, out)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_bench_names_its_vocabularies():
    r = CliRunner().invoke(app, ["bench", "--vocab", "llama9", "--data", str(DATA)])
    assert r.exit_code != 0 and "smollm2, gemma3, qwen2" in r.output


@pytest.mark.qwen2
def test_the_qwen2_cell_vocabulary_is_the_tokenizers():
    """A bench cell's qwen2 vocabulary: Qwen's tokenizer rebuilt from the GGUF metadata, whose
    tags are single ordinary tokens, and the tokenizer.json the peers are built from."""
    import json as _json

    from railcall.bench.cell import load_vocab

    vocab, tok, text = load_vocab("qwen2")  # a bare tokenizer.json: no eos_token_id beside it
    assert vocab.stop_ids == (151643,)  # <｜end▁of▁sentence｜>, known by name
    assert vocab.size == 151665 == len(_json.loads(text)["model"]["vocab"]) + len(_json.loads(text)["added_tokens"])
    for tag, tid in {"<think>": 151648, "</tool_call>": 151658}.items():
        assert tok.encode(tag, add_special_tokens=False).ids == [tid] and not vocab.is_special(tid)
