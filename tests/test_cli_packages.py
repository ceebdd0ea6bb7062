"""Every command that needs an optional package says so before it does any work: the message names
the package and the pip command, and the command's work is never reached (`railcall bench --quick`
without matplotlib used to die with a raw ModuleNotFoundError after two minutes)."""

from __future__ import annotations

import importlib.util

import pytest
from typer.testing import CliRunner

from railcall.cli import app


@pytest.fixture
def missing(monkeypatch):
    """missing(*packages): those look uninstalled to railcall.errors.require."""
    real = importlib.util.find_spec

    def hide(*packages):
        monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in packages else real(name, *a))

    return hide


def no_work(monkeypatch, module: str):
    """The command's work: reaching it fails the test."""
    import importlib

    def worked(*a, **kw):
        raise AssertionError(f"{module}.run started before its packages were checked")

    monkeypatch.setattr(importlib.import_module(module), "run", worked)


@pytest.mark.parametrize("argv,module,package,install", [
    (["bench", "--quick"], "railcall.bench.run", "matplotlib", "railcall[eval]"),
    (["bench", "--quick", "--engine", "railcall", "--engine", "xgrammar"], "railcall.bench.run", "xgrammar",
     "pip install xgrammar"),
    (["bench", "steps"], "railcall.bench.steps", "llama_cpp", "railcall[llama]"),
    (["bench", "steps"], "railcall.bench.steps", "transformers", "railcall[model]"),
    (["bench", "serve", "--vllm-python", "none"], "railcall.bench.serve", "prometheus_client", "railcall[serve]"),
    (["bench", "serve", "--vllm-python", "none"], "railcall.bench.serve", "openai", "pip install openai"),
])
def test_bench_checks_its_packages_first(monkeypatch, missing, argv, module, package, install):
    no_work(monkeypatch, module)
    missing(package)
    r = CliRunner().invoke(app, argv)
    assert r.exit_code == 2, r.output
    assert repr(package) in r.output and install in r.output


def test_bench_without_a_peer_runs_when_the_peer_is_left_out(monkeypatch, missing):
    no_work(monkeypatch, "railcall.bench.run")
    missing("xgrammar")
    r = CliRunner().invoke(app, ["bench", "--quick", "--engine", "railcall"])
    assert isinstance(r.exception, AssertionError)  # past the checks: it reached the work


def test_serve_checks_prometheus_client_first(monkeypatch, missing):
    import railcall.server.app as server_app

    monkeypatch.setattr(server_app, "serve", lambda *a, **kw: pytest.fail("serve started"))
    missing("prometheus_client")
    r = CliRunner().invoke(app, ["serve"])
    assert r.exit_code == 2 and "'prometheus_client'" in r.output and "railcall[serve]" in r.output
