"""`GET /metrics` through prometheus_client: the families and their types, and counts that only
grow (a histogram's `_count` after N more requests is N more, however many came before; the
summary it replaced counted a window of the last 1,000 requests)."""

from __future__ import annotations

from types import SimpleNamespace

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from server_harness import MODEL, wait_idle

pytestmark = pytest.mark.model


def scrape(srv) -> dict:
    """{sample name with labels: value}, and the families' types under "TYPE name"."""
    out = {}
    for family in text_string_to_metric_families(httpx.get(srv.url + "/metrics").text):
        out["TYPE " + family.name] = family.type
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[s.name + (f"{{{labels}}}" if labels else "")] = s.value
    return out


def test_the_families_and_their_types(srv, client):
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi."}], max_tokens=3,
                                   temperature=0)
    m = scrape(srv)
    for name, kind in {"railcall_requests": "counter", "railcall_prompt_tokens": "counter",
                       "railcall_generated_tokens": "counter", "railcall_errors": "counter",
                       "railcall_time_to_first_token_seconds": "histogram",
                       "railcall_time_per_output_token_seconds": "histogram",
                       "railcall_queue_wait_seconds": "histogram", "railcall_queue_depth": "gauge",
                       "railcall_running_rows": "gauge", "railcall_batch_rows": "gauge"}.items():
        assert m["TYPE " + name] == kind, name
    assert m['railcall_requests_total{outcome="completed"}'] >= 1 and m["railcall_generated_tokens_total"] >= 1


def test_counts_grow_by_the_requests_answered(srv, client):
    assert wait_idle(srv.engine)
    before = scrape(srv)
    n = 3
    for _ in range(n):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi."}], max_tokens=3,
                                       temperature=0)
    httpx.post(srv.base_url + "/chat/completions", json={"model": "nope", "messages": []})  # 401: no key
    assert wait_idle(srv.engine)
    after = scrape(srv)
    for name in ("railcall_time_to_first_token_seconds_count", "railcall_queue_wait_seconds_count"):
        assert after[name] - before[name] == n, name
    assert after["railcall_time_to_first_token_seconds_sum"] > before["railcall_time_to_first_token_seconds_sum"]
    assert after['railcall_requests_total{outcome="completed"}'] - before['railcall_requests_total{outcome="completed"}'] == n
    key = 'railcall_errors_total{code="invalid_api_key",status="401"}'
    assert after[key] - before.get(key, 0) == 1


def test_past_a_thousand_requests_the_count_is_still_the_count():
    """The summary this replaced kept the last 1,000 times: after 1,005 requests its _count said
    1,000 (and fell whenever the window's oldest were slow ones leaving it)."""
    from railcall.server.metrics import ServerMetrics

    engine = SimpleNamespace(metrics=lambda: {k: 0 for k in ("completed", "cancelled", "failed", "rejected",
                                                              "prompt_tokens", "generated_tokens", "cached_prompt_tokens",
                                                              "steps", "queued", "running", "batch_rows",
                                                              "prefix_cache_bytes")})
    metrics = ServerMetrics(engine)
    gen = SimpleNamespace(tokens=[1, 2, 3], seconds=0.01, finish_reason="stop")
    counts = []
    for i in range(1005):
        job = SimpleNamespace(plan=SimpleNamespace(n=1), enqueued=0.0, first_token=0.02, push=lambda kind, value: None)
        metrics.track(job)
        job.push("done", (0, gen))
        if i % 100 == 99 or i == 1004:
            m = {s.name: s.value for f in text_string_to_metric_families(metrics.text().decode()) for s in f.samples}
            counts.append(m["railcall_time_to_first_token_seconds_count"])
    assert counts == sorted(counts) and counts[-1] == 1005
