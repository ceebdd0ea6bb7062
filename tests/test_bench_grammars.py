"""`railcall bench grammars` end to end on a small corpus laid out as the llama-cpp-python sdist
lays out llama.cpp's grammars (no download): every engine timed on the same paths, and the
differential check's independent parsers (llama.cpp's grammar engine for GBNF) agreeing."""

from __future__ import annotations

import json

import pytest

from railcall.bench import grammars

pytestmark = pytest.mark.model


def test_bench_grammars_runs_every_engine_and_checks_the_masks(tmp_path, monkeypatch):
    folder = tmp_path / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp" / "grammars"
    folder.mkdir(parents=True)
    (folder / "pairs.gbnf").write_text('root ::= pair ("," pair)*\npair ::= [a-z]+ "=" [0-9]{1,3}\n')
    monkeypatch.setattr(grammars, "LARK", {"shell": grammars.SHELL_LARK})
    monkeypatch.setattr(grammars, "REGEXES", {"date": grammars.REGEXES["date"]})
    r = grammars.run(tmp_path / "out", n_walks=3, max_steps=12, folder=tmp_path, log=lambda m: None)
    assert [row["grammar"] for row in r["rows"]] == ["pairs", "shell", "date", "tools+note"]
    *general, tag = r["rows"]
    assert tag["syntax"] == "tag" and tag["engines"]["railcall"]["steps"] > 0
    assert tag["engines"]["railcall"]["refused_paths"] == 0
    assert tag["engines"]["xgrammar"]["refused_paths"] == 0  # XGrammar's structural tag takes railcall's paths
    assert "no structural-tag input" in tag["engines"]["llguidance"]["error"]
    assert "tools+note" not in r["differential"]
    for row in general:
        assert set(row["engines"]) == {"railcall", "llguidance", "xgrammar"}
        ours = row["engines"]["railcall"]
        assert ours["steps"] > 0 and ours["refused_paths"] == 0 and ours["mask_p50_us"] > 0
        assert row["engines"]["llguidance"]["refused_paths"] == 0  # the paths were chosen among its tokens
    for name, d in r["differential"].items():
        assert d["steps"] > 0 and d["theirs_only_steps"] == 0 and d["ours_only_valid"] == d["ours_only_checked"], name
    md = (tmp_path / "out" / "grammars.md").read_text()
    assert "| gbnf pairs |" in md and "## Masks beside llguidance" in md and "load average" in md
    assert json.loads((tmp_path / "out" / "grammars.json").read_text())["vocab"] == "smollm2"
    one = grammars.run(tmp_path / "one", n_walks=2, max_steps=8, folder=tmp_path, log=lambda m: None, only=["date"])
    assert [row["grammar"] for row in one["rows"]] == ["date"]
    with pytest.raises(ValueError, match="no grammar named nope"):
        grammars.run(tmp_path / "one", folder=tmp_path, log=lambda m: None, only=["nope"])


def test_llama_cpp_reads_gbnf_as_railcall_does(smollm2_vocab):
    """The GBNF oracle is llama.cpp's own engine: it accepts and refuses what railcall does."""
    from railcall import Matcher, compiled_grammar, gbnf_grammar

    text = 'root ::= "[" ( item ( "," item )* )? "]"\nitem ::= [0-9]+ | "[" ( item ( "," item )* )? "]"\n'
    check = grammars._LlamaGBNF.get().checker(text)
    compiled = compiled_grammar(gbnf_grammar(text), smollm2_vocab)
    for s in ["[]", "[1,[2,[3]],45]", "[1,]", "[[", "1", "[1][2]", "[[[[]]]]"]:
        m = Matcher(compiled)
        assert check(s) == (m.consume_bytes(s.encode()) and m.is_accepting()), s
