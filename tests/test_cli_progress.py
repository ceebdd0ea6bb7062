"""Long steps say how far they are: the demo each task with its time, eval and bench with an ETA
(a bar on a terminal, plain lines elsewhere)."""

from pathlib import Path

from typer.testing import CliRunner

from railcall import cli
from railcall.cli import app


def test_plain_progress_lines_say_done_elapsed_and_left():
    now = [0.0]
    lines = []
    progress = cli._plain_progress(lines.append, clock=lambda: now[0], every=30)
    progress("simple_python", 0, 400)
    for done, t in ((1, 5.0), (2, 10.0), (12, 62.0), (13, 70.0)):
        now[0] = t
        progress("simple_python", done, 400)
    assert lines == ["simple_python: 12/400, 1:02 elapsed, about 33:24 left"]  # 62 s / 12 tasks x 388
    now[0] = 95.0
    progress("simple_python", 400, 400)  # the end is always said, once
    progress("simple_python", 400, 400)
    assert lines[-1] == "simple_python: 400/400, 1:35 elapsed" and len(lines) == 2


def test_a_category_done_in_one_step_is_said():
    lines = []
    cli._plain_progress(lines.append, clock=lambda: 3.0)("multi_turn_base", 1, 1)
    assert lines == ["multi_turn_base: 1/1, 0:00 elapsed"]


def test_the_demo_names_each_task_as_it_starts_and_its_time_when_it_ends(monkeypatch):
    import railcall.demo as demo

    class Facts:
        pass

    monkeypatch.setattr(cli, "_load", lambda model: (Facts(), Facts()))
    monkeypatch.setattr(cli, "_facts", lambda lm, vocab: None)
    monkeypatch.setattr(cli, "_check_model_arg", lambda model, command, extra="model": None)

    def run(model, *, task, tools, grammar, seed, max_tokens, log, starting, lm=None):
        for i, text in enumerate(demo.TASKS[:2], 1):
            starting(i, 2, text)
            log({"task": text, "without_grammar": {"output": "hi", "parses": False}, "seconds": 1.25 * i})
        return {"tasks": [], "summary": {"parse_rate_without": 0.0, "parse_rate_with": None, "tokens_per_s_without": 1.0,
                                         "tokens_per_s_with": None, "forwards_saved_share": None}}

    monkeypatch.setattr(demo, "run", run)
    r = CliRunner().invoke(app, ["demo", "--no-grammar"])
    assert r.exit_code == 0, r.output
    out = r.output
    assert out.index("task 1 of 2: " + demo.TASKS[0]) < out.index("(1.2 s)") < out.index("task 2 of 2") < out.index("(2.5 s)")


def test_bench_reports_each_cell_done(monkeypatch, tmp_path):
    from railcall.bench import run as bench
    from railcall.bench import workloads

    monkeypatch.setattr(workloads, "workloads", lambda data, quick: [])  # --quick names its two
    monkeypatch.setattr(bench, "model_runs", lambda *a: {})
    monkeypatch.setattr(bench, "run_cell", lambda eng, vocab, wl, **k: {"engine": eng, "vocab": vocab, "workload": wl})
    monkeypatch.setattr(bench, "run_vocab_build", lambda vocab, timeout: {})
    monkeypatch.setattr(bench, "machine", lambda: {})
    monkeypatch.setattr(bench, "ratios", lambda results: [])
    monkeypatch.setattr(bench, "write_report", lambda report, out: None)
    seen = []
    bench.run(quick=True, vocabs=["smollm2"], out=tmp_path / "b.json", data=Path(tmp_path), engines=["railcall", "xgrammar"],
              log=lambda m: None, progress=lambda label, done, total: seen.append((done, total)))
    assert seen == [(0, 5), (1, 5), (2, 5), (3, 5), (4, 5), (5, 5)]  # 2 engines x 2 workloads, then the vocabulary build
