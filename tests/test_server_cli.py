"""`railcall serve` on the command line, and the framework boundary: `import railcall` does not
import FastAPI, uvicorn or pydantic."""

from __future__ import annotations

import subprocess
import sys

from typer.testing import CliRunner

from railcall.cli import app


def test_serve_help_lists_the_options():
    r = CliRunner().invoke(app, ["serve", "--help"])
    assert r.exit_code == 0
    for opt in ("--model", "--host", "--port", "--api-key", "RAILCALL_API_KEY", "--max-pending", "--max-body"):
        assert opt in r.output, opt


def test_serve_rejects_bad_limits_before_loading_a_model():
    r = CliRunner().invoke(app, ["serve", "--max-pending", "0"])
    assert r.exit_code == 2 and "--max-pending" in r.output


def test_serve_passes_its_engine_budget_and_refuses_a_zero_one(monkeypatch):
    import railcall.server.app as server_app

    r = CliRunner().invoke(app, ["serve", "--engine-memory-mb", "0"])
    assert r.exit_code == 2 and "--engine-memory-mb" in r.output
    seen = {}
    monkeypatch.setattr(server_app, "serve", lambda model, **kw: seen.update(kw))
    assert CliRunner().invoke(app, ["serve", "--engine-memory-mb", "32"]).exit_code == 0
    assert seen["engine_bytes"] == 32 << 20
    assert CliRunner().invoke(app, ["serve"]).exit_code == 0
    assert seen["engine_bytes"] == server_app.ENGINE_BYTES == 64 << 20


def test_import_railcall_does_not_import_the_server_frameworks():
    code = ("import sys, railcall, railcall.runtime.decode, railcall.output, railcall.runtime.regions; "
            "print(sorted(m for m in ('fastapi', 'uvicorn', 'starlette', 'pydantic', 'openai') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
