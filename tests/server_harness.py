"""One live railcall server per test session: uvicorn in a thread on a free loopback port,
serving the embedded SmolLM2 behind an API key. Shared by tests/test_server_*.py."""

from __future__ import annotations

import atexit
import threading
import time
from dataclasses import dataclass

API_KEY = "test-key-railcall"
MODEL = "smollm2"  # the embedded model's short name (the server answers to it and to its full id)
MAX_BODY = 256 << 10  # small, so the 413 test sends little

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CALC = {"type": "function", "function": {
    "name": "calc", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]}}}
TOOLS = [WEATHER, CALC]


@dataclass
class Live:
    url: str  # http://127.0.0.1:PORT
    app: object
    served: object
    engine: object
    server: object
    thread: threading.Thread

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def client(self, key: str | None = API_KEY, **kw):
        import openai

        return openai.OpenAI(api_key=key or "none", base_url=self.base_url, max_retries=0, timeout=kw.pop("timeout", 120), **kw)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


_LIVE: Live | None = None
_LOCK = threading.Lock()


def live() -> Live:
    global _LIVE
    with _LOCK:
        if _LIVE is None:
            _LIVE = _start()
            atexit.register(_LIVE.stop)
        return _LIVE


def _start() -> Live:
    from railcall.server.app import start_in_thread

    run = start_in_thread(api_key=API_KEY, max_body=MAX_BODY, max_pending=32)
    return Live(run.url, run.app, run.app.state.served, run.app.state.engine, run.server, run.thread)


def wait_idle(engine, timeout: float = 30.0) -> bool:
    t0 = time.monotonic()
    while engine.pending:
        if time.monotonic() - t0 > timeout:
            return False
        time.sleep(0.05)
    return True
