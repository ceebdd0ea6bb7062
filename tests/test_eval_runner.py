"""Results files and reports, without a model: torn lines on resume, summary fields, table, chart."""

from __future__ import annotations

import json

import pytest

from railcall.eval import report
from railcall.eval.runner import CONDITIONS, read_results


def rec(cat, i, cond, parse, valid, ast, tokens=10):
    return {"category": cat, "id": f"{cat}_{i}", "condition": cond, "parse": parse, "valid": valid, "ast": ast,
            "tokens": tokens, "seconds": 1.5, "cut": False, "wall_share": 0.5}


def test_a_torn_last_line_is_dropped_and_cut_off(tmp_path):
    p = tmp_path / "results.jsonl"
    good = [rec("a", 0, "with_grammar", True, True, True), rec("a", 0, "without_grammar", False, False, False)]
    torn = "".join(json.dumps(r) + "\n" for r in good) + '{"category": "a", "id": "a_1", "cond'
    p.write_text(torn)
    assert read_results(p) == good and p.read_text() == torn  # reading alone never writes
    assert read_results(p, repair=True) == good
    assert p.read_text().endswith("\n") and len(p.read_text().splitlines()) == 2
    with open(p, "a") as f:  # appending after the cut gives whole lines again
        f.write(json.dumps(rec("a", 1, "with_grammar", True, True, False)) + "\n")
    assert len(read_results(p)) == 3
    assert read_results(tmp_path / "missing.jsonl") == []
    # a bad line in the middle (a file edited by hand) is skipped, not the end of the file
    lines = p.read_text().splitlines()
    p.write_text("\n".join([lines[0], "{not json", *lines[1:]]) + "\n")
    assert len(read_results(p, repair=True)) == 3 and "{not json" in p.read_text()


def test_summary_fields_table_and_chart(tmp_path):
    records = [rec("simple", i, "with_grammar", True, True, i < 3) for i in range(4)]
    records += [rec("simple", i, "without_grammar", i == 0, False, False) for i in range(4)]
    records += [rec("parallel", i, "with_grammar", True, i == 0, False) for i in range(2)]
    s = report.summarise(records, settings={"model": "m", "max_tokens": 8}, categories=["simple", "parallel"])
    simple = s["categories"]["simple"]
    assert set(simple) == set(CONDITIONS)
    assert simple["with_grammar"] == {**simple["with_grammar"], "n": 4, "parse_rate": 1.0, "valid_rate": 1.0,
                                      "ast_accuracy": 0.75}
    assert simple["without_grammar"]["parse_rate"] == 0.25 and simple["without_grammar"]["ast_accuracy"] == 0.0
    assert set(s["categories"]["parallel"]) == {"with_grammar"}  # a --no-grammar-less half is absent, not zero
    assert s["categories"]["parallel"]["with_grammar"]["valid_rate"] == 0.5
    assert s["throughput"]["generated_tokens"] == 100 and s["throughput"]["decode_seconds"] == 5.0
    report.write(s, tmp_path)
    back = json.loads((tmp_path / "summary.json").read_text())
    for per in back["categories"].values():
        for fields in per.values():
            assert {"n", "parse_rate", "valid_rate", "ast_accuracy"} <= set(fields)
    png = (tmp_path / "eval.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    md = (tmp_path / "table.md").read_text()
    assert "| simple | 4 | 25.0% | 100.0% |" in md and "| parallel | 2 | — | 100.0% |" in md


def test_terminal_table_shows_both_conditions():
    from rich.console import Console

    s = report.summarise([rec("c", 0, "with_grammar", True, True, True), rec("c", 0, "without_grammar", False, False, False)],
                         settings={}, categories=["c"])
    console = Console(width=160, record=True)
    console.print(report.table(s))
    text = console.export_text()
    assert "0.0% / 100.0%" in text and "AST accuracy" in text


def test_report_command_renders_a_run_folder(tmp_path):
    from typer.testing import CliRunner

    from railcall.cli import app

    records = [rec("multiple", i, cond, True, True, i == 0) for i in range(2) for cond in CONDITIONS]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "run.json").write_text(json.dumps({"settings": {"model": "m", "max_tokens": 192}, "machine": {}}))
    r = CliRunner().invoke(app, ["eval", "report", str(tmp_path)])
    assert r.exit_code == 0, r.output
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["categories"]["multiple"]["with_grammar"]["ast_accuracy"] == 0.5
    assert s["settings"]["max_tokens"] == 192 and (tmp_path / "eval.png").is_file()
    r = CliRunner().invoke(app, ["eval", "report", str(tmp_path / "nothing")])
    assert r.exit_code == 2 and "no results" in r.output


def test_report_files_are_replaced_whole(tmp_path, disk_full):
    """A write that fails half-way (a full disk) leaves the previous summary, table and chart."""
    s = report.summarise([rec("c", 0, "with_grammar", True, True, True)], settings={}, categories=["c"])
    report.write(s, tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert set(before) == {"summary.json", "table.md", "eval.png"}
    s2 = report.summarise([rec("d", 0, "with_grammar", False, False, False)], settings={}, categories=["d"])
    disk_full()
    with pytest.raises(OSError):
        report.write(s2, tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
