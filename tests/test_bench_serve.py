"""`railcall bench serve`'s client side against the live test server (the embedded model): the
levels count every request and find none malformed or lost, a prefix sent before is cheaper to
start, and the report renders. The vLLM half runs only in `railcall bench serve` itself."""

from __future__ import annotations

import pytest

from railcall.bench import serve
from server_harness import wait_idle

pytestmark = pytest.mark.model


@pytest.fixture
def open_server(srv, monkeypatch):
    """The live server without its API key (bench clients send none), short replies."""
    monkeypatch.setitem(srv.app.state._state, "api_key", None)
    monkeypatch.setattr(serve, "MAX_TOKENS", 12)
    assert wait_idle(srv.engine)
    return srv


def test_a_level_counts_every_request_and_checks_each(open_server):
    r = serve.level(open_server.base_url, clients=3, per_client=1)
    assert r["requests"] == 3 and r["lost"] == 0 and r["malformed"] == 0 and r["no_call"] == 0
    assert r["tokens_per_s"] > 0 and r["ttft_p50_s"] is not None  # clients 0 and 2 streamed


def test_a_cached_prefix_starts_faster(open_server):
    before = open_server.served.prefix_cache.hits
    r = serve.prefix(open_server.base_url, repeats=1)
    assert open_server.served.prefix_cache.hits > before
    assert r["cached_ttft_s"] < r["uncached_ttft_s"]


def test_the_report(tmp_path):
    lv = {"clients": 1, "requests": 2, "lost": 0, "malformed": 0, "wall_s": 1.0, "requests_per_s": 2.0,
          "tokens_per_s": 20.0, "ttft_p50_s": 0.1, "ttft_p95_s": 0.2, "latency_p50_s": 0.5, "latency_p95_s": 0.6}
    r = {"model": "m", "cpus": 2, "max_tokens": 48, "servers": {
        "railcall": {"levels": [lv, {**lv, "clients": 4}], "prefix": {"uncached_ttft_s": 1.0, "cached_ttft_s": 0.1,
                                                                       "cached_over_uncached": 0.1},
                     "agent": {"step_s": [2, 1, 1, 1], "first_step_s": 2, "later_steps_mean_s": 1}}}}
    md = serve.markdown(r)
    assert "| railcall | 4 | 2.0 | 20.0 |" in md and "| 0 | 0 |" in md and "| railcall | 1.0 / 0.1 | 0.1 | 2 / 1 |" in md
    serve.chart(r, tmp_path / "serve.png")
    assert (tmp_path / "serve.png").stat().st_size > 1000
