"""Results files and reports, without a model: torn lines on resume, summary fields, table, chart."""

from __future__ import annotations

import json


import pytest

from railcall.eval import report
from railcall.eval.results import CONDITIONS, append_records, read_results
from railcall.eval.runner import run_bfcl
from railcall.data import bfcl_data


DATA = bfcl_data()  # the installed bfcl-eval package's data


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
    # a bad line in the middle (a file edited by hand) is skipped and reported, not the end of the file
    lines = p.read_text().splitlines()
    p.write_text("\n".join([lines[0], "{not json", *lines[1:]]) + "\n")
    warnings = []
    assert len(read_results(p, repair=True, warn=warnings.append)) == 3 and "{not json" in p.read_text()
    assert warnings == [f"{p} line 2: does not parse (Expecting property name enclosed in double quotes: "
                        "line 1 column 2 (char 1)); skipped"]


def test_a_last_line_torn_just_before_its_newline_is_mended(tmp_path):
    """The record is whole but its newline never reached the disk: resume keeps it and writes the
    newline, so the next append starts a line of its own (joined, both records were lost)."""
    p = tmp_path / "results.jsonl"
    a, b, c = (rec("x", i, "with_grammar", True, True, True) for i in range(3))
    p.write_text(json.dumps(a) + "\n" + json.dumps(b))
    assert read_results(p) == [a, b] and not p.read_text().endswith("\n")  # reading alone never writes
    assert read_results(p, repair=True) == [a, b] and p.read_text().endswith("\n")
    with open(p, "a") as f:
        append_records(f, [c])
    warnings = []
    assert read_results(p, warn=warnings.append) == [a, b, c] and warnings == []


def test_a_record_the_summary_cannot_use_is_reported_and_skipped(tmp_path):
    p = tmp_path / "results.jsonl"
    good = rec("x", 0, "with_grammar", True, True, True)
    bad = [{"category": "simple"}, [1, 2], {**good, "tokens": "12"}, {**good, "parse": 1},
           {**good, "condition": "other"}]
    p.write_text("".join(json.dumps(r) + "\n" for r in [good, *bad]))
    warnings = []
    assert read_results(p, warn=warnings.append) == [good]
    assert [w.split(": ", 1)[1] for w in warnings] == [
        "not a results record (no 'id', 'condition', 'parse', 'valid', 'ast', 'tokens', 'seconds', 'cut'); skipped",
        "not a results record (not a JSON object but list); skipped",
        """not a results record ('tokens' is "12", not a whole number); skipped""",
        "not a results record ('parse' is 1, not true or false); skipped",
        "not a results record (condition 'other' is not one of with_grammar, without_grammar, bfcl_prompt); skipped"]
    assert warnings[0].startswith(f"{p} line 2: ")


def test_summary_fields_table_and_chart(tmp_path):
    records = [rec("simple", i, "with_grammar", True, True, i < 3) for i in range(4)]
    records += [rec("simple", i, "without_grammar", i == 0, False, False) for i in range(4)]
    records += [rec("parallel", i, "with_grammar", True, i == 0, False) for i in range(2)]
    s = report.summarise(records, settings={"model": "m", "max_tokens": 8}, categories=["simple", "parallel"])
    simple = s["categories"]["simple"]
    assert set(simple) == {"with_grammar", "without_grammar"}  # no bfcl_prompt record: absent
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
    assert "0.0% / 100.0%" in text and "AST" in text and "cut" in text


def test_a_cut_reply_fails_every_verdict_in_the_summary():
    """Records written before cut replies were scored as failures (parse/valid true beside cut)
    still count as failures."""
    cut = {**rec("c", 0, "with_grammar", True, True, False), "cut": True}
    s = report.summarise([cut, rec("c", 1, "with_grammar", True, True, True)], settings={}, categories=["c"])
    g = s["categories"]["c"]["with_grammar"]
    assert (g["parse_rate"], g["valid_rate"], g["ast_accuracy"], g["cut_rate"]) == (0.5, 0.5, 0.5, 0.5)


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


def test_report_command_on_malformed_files_says_what_and_where(tmp_path):
    from typer.testing import CliRunner

    from railcall.cli import app

    good = rec("multiple", 0, "with_grammar", True, True, True)
    (tmp_path / "results.jsonl").write_text(json.dumps({"category": "simple"}) + "\n" + json.dumps(good) + "\n")
    r = CliRunner().invoke(app, ["eval", "report", str(tmp_path)])
    assert r.exit_code == 0, (r.output, r.exception)
    out = " ".join(r.output.split())
    assert f"warning: {tmp_path / 'results.jsonl'} line 1: not a results record (no 'id'" in out
    assert json.loads((tmp_path / "summary.json").read_text())["throughput"]["rows"] == 1
    (tmp_path / "results.jsonl").write_text(json.dumps({"category": "simple"}) + "\n")
    r = CliRunner().invoke(app, ["eval", "report", str(tmp_path)])
    assert r.exit_code == 2 and "error: no results in" in " ".join(r.output.split()), (r.output, r.exception)
    (tmp_path / "results.jsonl").write_text(json.dumps(good) + "\n")
    for broken in ("{", "[]", '{"settings": 5}'):
        (tmp_path / "run.json").write_text(broken)
        r = CliRunner().invoke(app, ["eval", "report", str(tmp_path)])
        out = " ".join(r.output.split())
        assert r.exit_code == 2 and f"error: {tmp_path / 'run.json'}" in out.replace("cannot read ", ""), out


def test_a_fresh_run_never_replaces_an_earlier_ones_results(tmp_path, monkeypatch, smollm2_tokenizer):
    """Rerunning without --resume keeps what the folder held as results.jsonl.old.N / run.json.old.N
    (N counting up); an interrupted rerun that wrote nothing leaves no empty backup behind."""

    import railcall.runtime.batch

    stub_model(monkeypatch, smollm2_tokenizer)

    def interrupted(*a, **k):  # Ctrl-C as decoding starts: nothing decoded, no model run
        raise KeyboardInterrupt
        yield

    monkeypatch.setattr(railcall.runtime.batch, "decode_stream", interrupted)

    def rerun():
        with pytest.raises(KeyboardInterrupt):
            run_bfcl(["simple_python"], tmp_path, data=DATA, limit=2)

    first = "".join(json.dumps(rec("simple_python", i, c, True, True, True)) + "\n" for i in range(3) for c in CONDITIONS)
    (tmp_path / "results.jsonl").write_text(first)
    (tmp_path / "run.json").write_text('{"settings": {"model": "first"}}')
    (tmp_path / "results.jsonl.old").write_text("from an older railcall\n")
    rerun()
    rerun()
    assert (tmp_path / "results.jsonl.old.1").read_text() == first
    assert (tmp_path / "run.json.old.1").read_text() == '{"settings": {"model": "first"}}'
    assert (tmp_path / "results.jsonl.old").read_text() == "from an older railcall\n"
    second = first.replace("true", "false")
    (tmp_path / "results.jsonl").write_text(second)
    rerun()
    rerun()
    assert (tmp_path / "results.jsonl.old.1").read_text() == first
    assert (tmp_path / "results.jsonl.old.2").read_text() == second
    assert sorted(p.name for p in tmp_path.glob("*.old*")) == [
        "results.jsonl.old", "results.jsonl.old.1", "results.jsonl.old.2", "run.json.old.1", "run.json.old.2"]


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


def test_auto_calls_read_a_character_split_across_tokens(bytes_vocab):
    """Byte-level tokens may split a character; the call's arguments hold the character itself."""
    from railcall.eval.runner import auto_calls

    ids = [bytes_vocab.lookup[bytes([b])] for b in 'é {"tool":"f","args":{"city":"北京"}} 🎉'.encode()]
    assert auto_calls(bytes_vocab, ids) == [{"tool": "f", "args": {"city": "北京"}}]


# -- call formats and routing ---------------------------------------------------------------------

FMT_TOOLS = None


def fmt_tools():
    from railcall.grammar.tools import Tool

    return [Tool("get_weather", "", {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
            Tool("get_time", "", {"type": "object", "properties": {"zone": {"type": "string"}}})]


ONE_AND_TWO = {
    "json": ('{"tool":"get_weather","args":{"city":"Paris"}}',
             '[{"tool":"get_weather","args":{"city":"Paris"}},{"tool":"get_time","args":{}}]'),
    "openai": ('{"name":"get_weather","arguments":{"city":"Paris"}}',
               '[{"name":"get_weather","arguments":{"city":"Paris"}},{"name":"get_time","arguments":{}}]'),
    "hermes": ('<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>',
               '<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>\n'
               '<tool_call>{"name":"get_time","arguments":{}}</tool_call>'),
    "pythonic": ('[get_weather(city="Paris")]', '[get_weather(city="Paris"), get_time()]'),
}


@pytest.mark.parametrize("fmt", list(ONE_AND_TWO))
def test_each_format_grammar_and_reading_agree(fmt):
    """The run's grammar spells one call and two in the format; the reply reads back as the same
    calls, as a reply of calls alone, and under tool_choice auto."""
    from agentkit import byte_vocab
    from railcall.eval.runner import auto_calls, call_grammar, decided, whole_calls
    from railcall.matcher import Matcher, compiled_grammar

    v = byte_vocab()
    g = compiled_grammar(call_grammar(fmt_tools(), fmt), v)
    want = [[{"tool": "get_weather", "args": {"city": "Paris"}}],
            [{"tool": "get_weather", "args": {"city": "Paris"}}, {"tool": "get_time", "args": {}}]]
    for text, calls in zip(ONE_AND_TWO[fmt], want):
        m = Matcher(g)
        assert m.consume_bytes(text.encode()) and m.is_accepting(), text
        ids = [v.lookup[bytes([b])] for b in text.encode()]
        assert whole_calls(v, ids, fmt) == calls
        assert auto_calls(v, ids, fmt) == calls
        assert not decided(text[:5], fmt)  # a call's start is never decided
    prose = [v.lookup[bytes([b])] for b in ("Sure. " + ONE_AND_TWO[fmt][0]).encode()]
    assert whole_calls(v, prose, fmt) is None  # text beside the calls: not a reply of calls alone
    assert decided("Sure, the weather", fmt)


def stub_model(monkeypatch, tokenizer) -> None:
    """`load_model` gives a model with SmolLM2's tokenizer and no weights (decoding is stubbed too)."""
    import types

    from railcall.models import store

    from railcall.vocab import Vocabulary

    lm = types.SimpleNamespace(tokenizer=tokenizer, name="stub",
                               model=types.SimpleNamespace(config=types.SimpleNamespace(vocab_size=len(tokenizer))),
                               vocabulary=lambda: Vocabulary.from_hf(tokenizer, logits_width=len(tokenizer), name="stub"))
    monkeypatch.setattr(store, "load_model", lambda model=None, device=None, **kw: lm)


@pytest.mark.parametrize("fmt, routing", [("pythonic", "scored"), ("openai", "greedy"), ("hermes", "scored")])
def test_a_run_records_its_format_and_routing(tmp_path, monkeypatch, smollm2_tokenizer, fmt, routing):
    """The grammar rows get a matcher of the format and, when scored, a router; the prompt asks
    for the format in both conditions; the settings, every record and the summary name both."""

    import railcall.runtime.batch
    from railcall.runtime.decode import Generation
    from railcall.heuristics.routing import NameRouter

    stub_model(monkeypatch, smollm2_tokenizer)
    seen = []

    def replies(model, vocab, requests, params, max_rows, decided):
        for i, (prompt, matcher, *router) in enumerate(requests):
            seen.append((smollm2_tokenizer.decode(prompt), matcher, router[0] if router else None))
            text = '[calc()]' if fmt == "pythonic" else "no"
            yield i, Generation(tokens=smollm2_tokenizer.encode(text), text=text)

    monkeypatch.setattr(railcall.runtime.batch, "decode_stream", replies)
    s = run_bfcl(["simple_python"], tmp_path, data=DATA, limit=2, call_format=fmt, routing=routing)
    from railcall.prompts.chat import skeleton

    # each task: the grammar's row and the free row in railcall's prompt (asking for the format),
    # and the free row in BFCL's own prompt mode (the second baseline)
    ours = [p for p, _, _ in seen if "You are an expert in composing functions." not in p]
    assert len(seen) == 6 and len(ours) == 4 and all(skeleton(fmt) in p for p in ours)
    grammar_rows = [(m, r) for _, m, r in seen if m is not None]
    assert len(grammar_rows) == 2
    assert all(isinstance(r, NameRouter) if routing == "scored" else r is None for _, r in grammar_rows)
    run = json.loads((tmp_path / "run.json").read_text())["settings"]
    assert (run["call_format"], run["routing"]) == (fmt, routing) and fmt in run["grammar"].lower()
    recs = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert {r["call_format"] for r in recs} == {fmt}
    assert {r["routing"] for r in recs if r["condition"] == "with_grammar"} == {routing}
    assert s["variant"] == {"call_format": fmt, "routing": routing, "values": "free"}
    with pytest.raises(ValueError, match="other settings"):  # a resume with another variant is refused
        run_bfcl(["simple_python"], tmp_path, data=DATA, limit=2, call_format="json", routing=routing, resume=True)


def test_a_grounded_run_narrows_the_grammar_rows_to_the_requests_numbers(tmp_path, monkeypatch, smollm2_tokenizer):
    """values="grounded": the grammar row of "a base of 10 units and height of 5 units" may write
    10 and 5 alone; the free row has no matcher; the settings and summary say grounded."""

    import railcall.runtime.batch
    from railcall.runtime.decode import Generation

    stub_model(monkeypatch, smollm2_tokenizer)
    matchers = []

    def replies(model, vocab, requests, params, max_rows, decided):
        for i, (prompt, matcher, *_) in enumerate(requests):
            matchers.append(matcher)
            yield i, Generation(tokens=smollm2_tokenizer.encode("no"), text="no")

    monkeypatch.setattr(railcall.runtime.batch, "decode_stream", replies)
    s = run_bfcl(["simple_python"], tmp_path, data=DATA, limit=1, values="grounded")
    [m] = [m for m in matchers if m is not None]
    call = '{"tool":"calculate_triangle_area","args":{"base":%d,"height":%d}}'
    assert m.copy().consume_bytes((call % (10, 5)).encode()) and m.copy().consume_bytes((call % (5, 10)).encode())
    assert not m.copy().consume_bytes((call % (10, 7)).encode())
    assert s["variant"]["values"] == "grounded"
    assert json.loads((tmp_path / "run.json").read_text())["settings"]["values"] == "grounded"
    # irrelevance_7 states numbers for several calls, but the category runs under "auto" (text,
    # or one call at the trigger): its grammar row is grounded without a call count
    matchers.clear()
    run_bfcl(["irrelevance"], tmp_path / "auto", data=DATA, limit=8, values="grounded")
    assert sum(m is not None for m in matchers) == 8
    with pytest.raises(ValueError, match="unknown values"):
        run_bfcl(["simple_python"], tmp_path, data=DATA, limit=1, values="exact")


def test_a_run_from_before_the_variants_resumes_as_json_greedy(tmp_path):
    """A run.json written before a setting existed reads as what it ran with: json, greedy, the
    forced finish, repeats allowed, the strict baseline and no BFCL prompt-mode rows -- so
    today's defaults, which differ in these, do not resume it silently."""
    from railcall.eval.runner import SETTINGS_BEFORE, Settings

    now = Settings(model="m").__dict__
    old = {k: v for k, v in now.items() if k not in SETTINGS_BEFORE}
    before = {**SETTINGS_BEFORE, **old}
    assert {k for k in now if before[k] != now[k]} == {"ceiling", "distinct_calls", "baseline", "baseline_shots",
                                                        "bfcl_prompt"}
    assert (before["call_format"], before["routing"]) == ("json", "greedy")
    assert before == Settings(model="m", ceiling="complete", distinct_calls=False, baseline="whole", baseline_shots=0,
                              bfcl_prompt=False).__dict__


def test_a_task_with_no_tools_is_answered_as_text(tmp_path, monkeypatch, smollm2_tokenizer):
    """live_irrelevance has tasks whose tool table is empty: no call can be written, so the grammar
    row decodes without a grammar (as a server given no tools would) and scores the reply as text;
    the run goes on (it stopped with 'the tool table is empty')."""

    import railcall.runtime.batch
    from railcall.eval import bfcl
    from railcall.runtime.decode import Generation

    stub_model(monkeypatch, smollm2_tokenizer)
    tasks = bfcl.load_category(DATA, "live_irrelevance")
    empty = [t for t in tasks if not t.tools]
    assert empty  # BFCL ships such tasks
    monkeypatch.setattr(bfcl, "load_category", lambda data, cat, limit=None: [empty[0], tasks[0]])
    seen = []

    def replies(model, vocab, requests, params, max_rows, decided):
        for i, (prompt, matcher, *_) in enumerate(requests):
            seen.append(matcher)
            text = '{"tool": "x", "args": {}}' if i % 2 else "I cannot help with that."
            yield i, Generation(tokens=smollm2_tokenizer.encode(text), text=text)

    monkeypatch.setattr(railcall.runtime.batch, "decode_stream", replies)
    run_bfcl(["live_irrelevance"], tmp_path, data=DATA)
    recs = {(r["id"], r["condition"]): r for r in map(json.loads, (tmp_path / "results.jsonl").read_text().splitlines())}
    row = recs[(empty[0].id, "with_grammar")]
    assert row["tool_choice"] == "none" and row["calls"] == 0 and row["ast"] is True
    assert recs[(tasks[0].id, "with_grammar")]["tool_choice"] == "auto"
    assert sum(m is not None for m in seen) == 1  # only the task with tools got a matcher


def test_shards_split_each_category_and_merge_back_into_the_whole_run(tmp_path, monkeypatch, smollm2_tokenizer):
    """--shard k/n takes every n-th task of each category from the k-th: the shards' tasks are
    disjoint and together the whole run; `merge_runs` joins their folders into one with the
    same records as a single-process run, and names every machine that wrote a part."""

    import railcall.runtime.batch
    from railcall.eval.runner import merge_runs
    from railcall.runtime.decode import Generation

    stub_model(monkeypatch, smollm2_tokenizer)

    def replies(model, vocab, requests, params, max_rows, decided):
        for i, _ in enumerate(requests):
            yield i, Generation(tokens=smollm2_tokenizer.encode("no"), text="no")

    monkeypatch.setattr(railcall.runtime.batch, "decode_stream", replies)
    cats = ["simple_python", "multiple"]
    whole = run_bfcl(cats, tmp_path / "whole", data=DATA, limit=5)
    parts = []
    for k in (1, 2, 3):
        run_bfcl(cats, tmp_path / f"s{k}", data=DATA, limit=5, shard=(k, 3))
        parts.append({(r["category"], r["id"]) for r in read_results(tmp_path / f"s{k}" / "results.jsonl")})
    assert [len(p) for p in parts] == [4, 4, 2]  # tasks 0,3 / 1,4 / 2 of each category
    assert not (parts[0] & parts[1] or parts[0] & parts[2] or parts[1] & parts[2])
    run = json.loads((tmp_path / "s2" / "run.json").read_text())
    gpu = {**run["machine"], "device": "NVIDIA H200"}  # a part decoded on another machine
    (tmp_path / "s2" / "run.json").write_text(json.dumps({**run, "machine": gpu, "machines": [gpu]}))
    merged = merge_runs(tmp_path / "merged", [tmp_path / f"s{k}" for k in (1, 2, 3)])
    key = lambda r: (r["category"], r["id"], r["condition"], r["output"])  # noqa: E731
    assert sorted(map(key, read_results(tmp_path / "merged" / "results.jsonl"))) == \
        sorted(map(key, read_results(tmp_path / "whole" / "results.jsonl")))
    assert merged["categories"] == whole["categories"]
    assert merged["machines"] == [run["machine"], gpu]
    assert (tmp_path / "merged" / "table.md").is_file() and (tmp_path / "merged" / "eval.png").is_file()
    # merging into a folder keeps its records first; a part of another run is refused
    (tmp_path / "s1" / "results.jsonl").write_text("")
    again = merge_runs(tmp_path / "merged", [tmp_path / "s1"])
    assert again["throughput"]["rows"] == whole["throughput"]["rows"]
    other = json.loads((tmp_path / "s3" / "run.json").read_text())
    other["settings"]["max_tokens"] = 7
    (tmp_path / "s3" / "run.json").write_text(json.dumps(other))
    with pytest.raises(ValueError, match="other settings.*max_tokens"):
        merge_runs(tmp_path / "merged", [tmp_path / "s3"])
    with pytest.raises(FileNotFoundError, match="no run.json"):
        merge_runs(tmp_path / "merged", [tmp_path / "nowhere"])
    with pytest.raises(ValueError, match="shard 4/3"):
        run_bfcl(cats, tmp_path / "bad", data=DATA, limit=5, shard=(4, 3))


def test_a_resumed_run_keeps_the_machines_that_wrote_before_it(tmp_path, monkeypatch, smollm2_tokenizer):
    import railcall.runtime.batch
    from railcall.runtime.decode import Generation

    stub_model(monkeypatch, smollm2_tokenizer)

    def replies(model, vocab, requests, params, max_rows, decided):
        for i, _ in enumerate(requests):
            yield i, Generation(tokens=smollm2_tokenizer.encode("no"), text="no")

    monkeypatch.setattr(railcall.runtime.batch, "decode_stream", replies)
    run_bfcl(["simple_python"], tmp_path, data=DATA, limit=1)
    run = json.loads((tmp_path / "run.json").read_text())
    here = run["machine"]
    elsewhere = {**here, "device": "NVIDIA H200"}
    (tmp_path / "run.json").write_text(json.dumps({**run, "machine": elsewhere, "machines": [elsewhere]}))
    s = run_bfcl(["simple_python"], tmp_path, data=DATA, limit=2, resume=True)
    assert json.loads((tmp_path / "run.json").read_text())["machines"] == [elsewhere, here]
    assert s["machines"] == [elsewhere, here]
