"""What the command line says before it loads a model: a missing optional package is named with
the command that installs it, and a bad argument or path fails at once. Each test makes
`load_model` fail loudly, so a check that came too late shows as that failure."""

import sys

import pytest
from typer.testing import CliRunner

from railcall.cli import app
from railcall.errors import PackageMissing, from_import_error, package_missing, require

runner = CliRunner()


@pytest.fixture
def no_model(monkeypatch):
    """Loading a model is an error here: every check must come first."""
    import railcall.agent
    import railcall.models.store as store

    def loaded(*a, **k):
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr(store, "load_model", loaded)
    monkeypatch.setattr(railcall.agent.AgentModel, "load", staticmethod(loaded))


def missing(monkeypatch, *names):
    """Import `names` as a Python without them would: None in sys.modules makes an import fail."""
    for name in names:
        monkeypatch.setitem(sys.modules, name, None)


# --- a missing optional package ------------------------------------------------------------------

@pytest.mark.parametrize("args, package, install", [
    (["demo", "--backend", "transformers"], "torch", "pip install 'railcall[model]'"),
    (["info", "--backend", "transformers"], "torch", "pip install 'railcall[model]'"),
    (["agent", "hi", "-w", ".", "--backend", "transformers"], "torch", "pip install 'railcall[model]'"),
    (["eval", "ablation", "--backend", "transformers"], "torch", "pip install 'railcall[eval]'"),
])
def test_a_command_without_torch_names_it(monkeypatch, no_model, args, package, install):
    missing(monkeypatch, "torch")
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert f"the Python package '{package}', which is not installed" in r.output and install in r.output
    assert "truncated" not in r.output and "download" not in r.output  # the model file is not blamed


@pytest.mark.parametrize("args", [["demo", "--backend", "llama"], ["info", "--backend", "llama"],
                                  ["agent", "hi", "-w", ".", "--backend", "llama"], ["serve", "--backend", "llama"]])
def test_a_command_on_llama_cpp_without_it_names_it(monkeypatch, no_model, args):
    missing(monkeypatch, "llama_cpp")
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert "'llama_cpp', which is not installed" in r.output and "pip install 'railcall[llama]'" in r.output


def test_a_gguf_on_llama_cpp_needs_neither_torch_nor_transformers(monkeypatch, no_model):
    """The default backend of the embedded GGUF is llama.cpp: without torch and transformers the
    command gets as far as loading the model (here refused by the fixture), not a missing package."""
    pytest.importorskip("llama_cpp")
    missing(monkeypatch, "torch")
    missing(monkeypatch, "transformers")
    r = runner.invoke(app, ["info"])
    assert "not installed" not in r.output
    assert isinstance(r.exception, AssertionError) and "loaded before" in str(r.exception)


@pytest.mark.parametrize("args, package, install", [
    (["serve"], "fastapi", "pip install 'railcall[serve]'"),
    (["eval", "ablation"], "jsonschema", "pip install 'railcall[eval]'"),
    (["eval", "bfcl", "--category", "simple_python"], "matplotlib", "pip install 'railcall[eval]'"),
])
def test_a_command_without_its_extra_names_the_package(monkeypatch, no_model, args, package, install):
    missing(monkeypatch, package)
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert f"'{package}'" in r.output and install in r.output


def test_a_conversion_without_torch_is_not_the_files_fault(tmp_path, monkeypatch):
    """The GGUF converter imports torch; without it the error names torch, not a truncated download."""
    from railcall.models import store

    missing(monkeypatch, "torch")
    monkeypatch.setenv("RAILCALL_HOME", str(tmp_path / "home"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    with pytest.raises(PackageMissing, match=r"(?s)converting m.gguf needs the Python package 'torch'.*railcall\[model\]"):
        store.ensure_converted(store.ModelSource("gguf", gguf, "m"), log=lambda m: None)


def test_an_import_error_without_a_name_still_says_the_extra():
    """transformers' own message when the gguf package is missing names no module."""
    e = from_import_error("converting m.gguf", ImportError("Loading a GGUF checkpoint requires GGUF>=0.10.0"), extra="model")
    assert "needs a Python package" in str(e) and "GGUF>=0.10.0" in str(e) and "pip install 'railcall[model]'" in str(e)
    assert isinstance(e, ImportError) and e.extra == "model" and e.package is None


def test_require_finds_without_importing(monkeypatch):
    require("x", "json")  # present: nothing raised
    with pytest.raises(PackageMissing, match="(?s)'no_such_package_railcall'.*pip install no_such_package_railcall"):
        require("x", "no_such_package_railcall")
    assert "railcall[serve]" in str(package_missing("railcall serve", "uvicorn"))


# --- arguments and paths, before the model ------------------------------------------------------

@pytest.mark.parametrize("args, said", [
    (["demo", "--model", "/nonexistent/model.gguf"], "not found"),
    (["demo", "--tools", "calc,launch"], "--tools: no tool launch"),
    (["demo", "--max-tokens", "0"], "--max-tokens must be at least 1"),
    (["info", "--model", "/nonexistent/folder"], "not found"),
    (["agent", "hi", "-w", "/nonexistent/workspace"], "/nonexistent/workspace"),
    (["agent", "hi", "-w", ".", "--model", "/nonexistent/m.gguf"], "not found"),
    (["agent", "hi", "-w", ".", "--max-steps", "0"], "--max-steps must be at least 1"),
    (["eval", "bfcl", "--category", "simple_pyton"], "no BFCL file for category 'simple_pyton'"),
    (["eval", "bfcl", "--category", "simple_python", "--data", "/nonexistent/bfcl"], "not found"),
    (["eval", "bfcl", "--category", "simple_python", "--batch", "0"], "--batch must be at least 1"),
    (["eval", "multi-turn", "--category", "multi_turn_bse"], "unknown multi-turn category"),
    (["eval", "ablation", "--model", "/nonexistent/m.gguf"], "not found"),
    (["serve", "--model", "/nonexistent/m.gguf"], "not found"),
    (["bench", "--engine", "railcal"], "unknown engine railcal"),
    (["eval", "bfcl", "--category", "simple_python", "--format", "xml"], "--format must be one of json"),
    (["eval", "bfcl", "--category", "simple_python", "--routing", "best"], "--routing must be greedy, scored or matched"),
    (["agent", "hi", "-w", ".", "--format", "yaml"], "--format must be one of json"),
    (["chat", "-w", ".", "--routing", "first"], "--routing must be greedy or scored"),
    (["serve", "--format", "xml"], "--format must be one of json"),
    (["eval", "agent", "--routing", "best"], "--routing must be greedy or scored"),
    (["eval", "bfcl", "--category", "multiple", "--variants", "format=yaml"], "format 'yaml' is not one of"),
    (["eval", "bfcl", "--category", "multiple", "--variants", "colour=red"], "AXIS=VALUE"),
    (["eval", "bfcl", "--category", "multiple", "--shot-pair"], "give --shots 1 or more"),
    (["eval", "bfcl", "--category", "multiple", "--variants", "model=/nonexistent/m.gguf"], "not found"),
    (["eval", "bfcl", "--category", "multiple", "--variants", "routing=scored", "--no-grammar"], "drop --no-grammar"),
])
def test_a_bad_argument_fails_before_the_model_loads(no_model, args, said):
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert said in " ".join(r.output.split())


def test_eval_bad_shard_is_refused_before_the_model_loads(no_model):
    for bad in ("3", "0/2", "3/2", "a/b"):
        r = runner.invoke(app, ["eval", "bfcl", "--category", "simple_python", "--shard", bad])
        assert r.exit_code == 2 and "--shard takes K/N" in r.output, (bad, r.output)


def test_eval_merge_of_a_folder_that_is_no_run_says_so(tmp_path):
    r = runner.invoke(app, ["eval", "merge", str(tmp_path / "dest"), str(tmp_path)])
    assert r.exit_code == 2 and "holds no run.json" in r.output


def test_eval_out_of_gpu_memory_says_what_is_kept_and_how_to_go_on(tmp_path, monkeypatch):
    import torch

    import railcall.eval.runner

    def oom(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.78 GiB.\nmore detail")

    monkeypatch.setattr(railcall.eval.runner, "run_bfcl", oom)
    r = runner.invoke(app, ["eval", "bfcl", "--category", "simple_python", "--device", "cuda", "--out", str(tmp_path)])
    assert r.exit_code == 2
    text = " ".join(r.output.split())
    assert "the GPU ran out of memory (CUDA out of memory. Tried to allocate 1.78 GiB.)" in text
    assert "--resume and a smaller --batch" in text and "more detail" not in text
