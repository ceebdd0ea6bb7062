"""No request starves the others: a short request sent while another request holds the engine
(n = 16 rows of long replies, or a prompt of thousands of tokens) finishes within 3x its time
alone, on the real embedded model under llama.cpp (BatchLoop's scheduling, docs/server.md).

Each test times the short request alone first (the median of three), then starts the other
request, sends the short one behind it, and stops the other one once the short one is back (its
stream closed: the engine cancels its rows), so a test takes seconds, not the other request's time.
"""

from __future__ import annotations

import statistics
import threading
import time

import pytest

from server_harness import wait_idle

pytestmark = pytest.mark.model

# 16 tokens, always (min_tokens), and a prompt of its own each time (no whole-prompt cache hit)
SHORT = dict(max_tokens=16, temperature=0.0, extra_body={"min_tokens": 16})
_asked = iter(range(1 << 30))
RATIO = 3.0


def timed(client, model: str) -> float:
    t0 = time.monotonic()
    ask = [{"role": "user", "content": f"Say hi to visitor number {next(_asked)}."}]
    out = client.chat.completions.create(model=model, messages=ask, **SHORT)
    assert out.choices[0].finish_reason in ("length", "stop")
    return time.monotonic() - t0


def alone(srv) -> float:
    client = srv.client()
    assert wait_idle(srv.engine, 120)
    timed(client, srv.served.name)  # warm: the first request of a kind builds what later ones reuse
    return statistics.median(timed(client, srv.served.name) for _ in range(3))


class Hog:
    """A streamed request in a thread, held open until `stop()` (which closes its stream)."""

    def __init__(self, srv, **kw):
        self.started = threading.Event()
        self.stopping = threading.Event()
        self.error: Exception | None = None
        self._client = srv.client(timeout=300)
        self._kw = kw
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        try:
            stream = self._client.chat.completions.create(stream=True, **self._kw)
            with stream:
                for _ in stream:
                    self.started.set()
                    if self.stopping.is_set():
                        break
        except Exception as e:  # noqa: BLE001  (reported by the test)
            self.error = e
        self.started.set()

    def stop(self):
        self.stopping.set()
        self._client.close()
        self._thread.join(timeout=120)


def behind(srv, hog_kw: dict, ready) -> tuple[float, float]:
    """(alone, behind): the short request's seconds alone and sent behind a request of `hog_kw`
    once `ready(srv)` holds."""
    t_alone = alone(srv)
    hog = Hog(srv, model=srv.served.name, **hog_kw)
    try:
        t0 = time.monotonic()
        while not ready(srv):
            assert time.monotonic() - t0 < 60 and hog.error is None, hog.error
            time.sleep(0.02)
        time.sleep(0.5)  # well inside the other request's work
        client = srv.client(timeout=120)
        t_behind = timed(client, srv.served.name)
    finally:
        hog.stop()
    assert wait_idle(srv.engine, 120)  # the other request's rows were cancelled and freed
    print(f"short request: {t_alone:.2f} s alone, {t_behind:.2f} s behind ({t_behind / t_alone:.1f}x)")
    return t_alone, t_behind


def test_a_short_request_behind_sixteen_long_choices(srv):
    """n = 16 used to take every row: the short request waited for one of them to end."""
    if srv.engine.served.lm.backend_name != "llama.cpp":
        pytest.skip("the rows a request waits behind are llama.cpp's held rows")
    hog = dict(n=16, max_tokens=120, temperature=0.8, seed=1, extra_body={"min_tokens": 120},
               messages=[{"role": "user", "content": "Write a long story about a lighthouse keeper."}])
    t_alone, t_behind = behind(srv, hog, lambda s: s.engine.metrics()["running"] >= 16 and s.engine.stats["steps"] > 0)
    assert t_behind <= RATIO * t_alone, f"{t_behind:.2f} s behind n=16 against {t_alone:.2f} s alone"


def test_a_short_request_behind_a_long_prompt(srv):
    """A prompt of ~7,000 tokens used to prefill whole in one call: the short request waited for it."""
    if srv.engine.served.lm.backend_name != "llama.cpp":
        pytest.skip("the prefill runs in chunks under llama.cpp")
    text = " ".join(f"item {i} is filed under shelf {i % 37}." for i in range(560))  # ~7,000 tokens
    hog = dict(max_tokens=4, temperature=0.0, messages=[{"role": "user", "content": text}])
    prompt_len = len(srv.served.tokenizer.encode(text))
    assert 6500 < prompt_len < 7600, prompt_len
    t_alone, t_behind = behind(srv, hog, lambda s: s.engine.pending >= 1)  # its prompt is being run
    assert t_behind <= RATIO * t_alone, f"{t_behind:.2f} s behind a {prompt_len}-token prompt against {t_alone:.2f} s alone"
