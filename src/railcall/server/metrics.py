"""`GET /metrics`: the server's Prometheus metrics, through `prometheus_client`.

Built once per app (`ServerMetrics`), in a registry of its own (several apps in one process, as
in the tests, do not share counts). Two kinds of source:

- the engine's own counts and live figures, read at scrape time (`Engine.metrics()`): requests
  by outcome, prompt / generated / cached tokens and decode steps (counters, as the engine only
  ever adds to them), the queue depth, the rows running and in the last pass, the prefix cache's
  bytes (gauges);
- what each request's timing shows, observed once when its last choice ends (`track`):
  histograms of the time to first token, the time per output token after the first, and the
  queue wait; and the errors answered, by status and code (`error`).

Histograms, not the summary of recent requests this endpoint had before: a summary's `_count`
and `_sum` came from a window of the last 1,000 requests, so they fell as old requests left it
(`_count 68` after 71 requests), and Prometheus' `rate()` reads a fall as a counter reset. A
histogram's `_count` and `_sum` only grow, and its buckets give quantiles over any range
(`histogram_quantile(0.95, rate(railcall_time_to_first_token_seconds_bucket[5m]))`).

The queue wait is from a request's arrival until the engine's worker took it and built its rows;
a wait for a free row of the batch after that (more than `--max-rows` requests running), and the
prefill, count in the time to first token.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Seconds. On 2 cores a short prompt's first token comes in ~0.05 s alone and ~1.5 s behind 15
# other rows; a 1,400-token prefill takes ~7 s; a step is ~12 ms for one row, ~80 ms for 16.
TTFT_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TPOT_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
WAIT_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0)


class _EngineCollector:
    """The engine's counts, read when /metrics is scraped."""

    def __init__(self, engine):
        self.engine = engine

    def collect(self):
        m = self.engine.metrics()
        requests = CounterMetricFamily("railcall_requests", "Requests by outcome.", labels=["outcome"])
        for outcome in ("completed", "cancelled", "failed", "rejected"):
            requests.add_metric([outcome], m[outcome])
        yield requests
        for name, key, help_ in (
                ("railcall_prompt_tokens", "prompt_tokens", "Prompt tokens of finished requests."),
                ("railcall_generated_tokens", "generated_tokens", "Tokens generated (completion tokens)."),
                ("railcall_cached_prompt_tokens", "cached_prompt_tokens",
                 "Prompt tokens whose KV came from the prefix cache."),
                ("railcall_decode_steps", "steps", "Forward passes of the decode loop.")):
            yield CounterMetricFamily(name, help_, value=m[key])
        for name, key, help_ in (
                ("railcall_queue_depth", "queued", "Requests waiting for a row."),
                ("railcall_running_rows", "running", "Rows in the decode loop."),
                ("railcall_batch_rows", "batch_rows", "Rows in the last forward pass."),
                ("railcall_prefix_cache_bytes", "prefix_cache_bytes", "Bytes of KV held by the prefix cache.")):
            yield GaugeMetricFamily(name, help_, value=m[key])


class ServerMetrics:
    """The metrics of one app. Built once per app; `track` and `error` are called per request."""

    def __init__(self, engine):
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_EngineCollector(engine))
        self.ttft = Histogram("railcall_time_to_first_token_seconds", "Time from arrival to the first token.",
                              buckets=TTFT_BUCKETS, registry=self.registry)
        self.tpot = Histogram("railcall_time_per_output_token_seconds",
                              "Time per generated token after the first, per choice.", buckets=TPOT_BUCKETS,
                              registry=self.registry)
        self.wait = Histogram("railcall_queue_wait_seconds", "Time from arrival until the decode loop took the request.",
                              buckets=WAIT_BUCKETS, registry=self.registry)
        self.errors = Counter("railcall_errors", "Errors answered, by HTTP status and code (an error event in a "
                              "stream counts with the status it would have had).", ["status", "code"],
                              registry=self.registry)

    def track(self, job) -> None:
        """Observe `job`'s timing when its last choice ends. Wraps the job's `push`, which the
        engine's worker thread calls with each event ("done" once per choice)."""
        push, left = job.push, [job.plan.n]

        def observing(kind: str, value) -> None:
            if kind == "done":
                self._done(job, value[1], first=left[0] == job.plan.n)
                left[0] -= 1
            push(kind, value)

        job.push = observing

    def _done(self, job, gen, first: bool) -> None:
        now = time.monotonic()
        if first:  # once per request: its wait, and its first token (shared by its choices)
            self.wait.observe(max(0.0, now - job.enqueued - gen.seconds))
            if job.first_token is not None:
                self.ttft.observe(job.first_token - job.enqueued)
        if job.first_token is not None and len(gen.tokens) > 1 and gen.finish_reason != "cancelled":
            self.tpot.observe((now - job.first_token) / (len(gen.tokens) - 1))

    def error(self, status: int, code: str | None) -> None:
        self.errors.labels(str(status), code or "").inc()

    def text(self) -> bytes:
        return generate_latest(self.registry)
