"""The served model and its decode loop: concurrent requests share forward passes.

    request --validate/plan (thread pool)--> Engine.submit --bounded queue--> worker thread
    worker: BatchLoop.add(prompt, Row(matcher, params, on_step=job.push, cancelled=job.cancelled))
            BatchLoop.step() until every row has ended; new rows join at every step
    job.push --loop.call_soon_threadsafe--> the request's asyncio.Queue --> response / SSE stream

One model per process (`ServedModel`, built once) and one worker thread running a
`railcall.runtime.batch.BatchLoop` (continuous batching): every request is a row with its own matcher,
sampling settings, stop rules, cancellation and stream, and all rows in flight share one forward
pass per step (up to `max_rows`), shared fairly: a long prompt runs in chunks, and the request
that has run the fewest tokens goes first, so none waits behind another's prompt or n rows
(BatchLoop's docstring, docs/server.md "Scheduling"). The
`PrefixCache` keeps the KV of finished requests, so a prompt that starts like an earlier one (the
same system prompt and tools, a conversation's next turn) prefills only its new part. A full queue
answers 429 with Retry-After at once instead of letting latency grow without bound; a stopped
engine answers 503. A row whose client went away ends at its next step.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from dataclasses import dataclass, field

from railcall.runtime.batch import BatchLoop
from railcall.runtime.decode import Row
from railcall.errors import RequestError
from railcall.server.model import ServedModel
from railcall.server.plan import Plan

log = logging.getLogger("railcall.server")


@dataclass
class Job:
    """One queued request. Built per request on the event loop; filled by the worker thread."""

    plan: Plan
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancel_event: threading.Event = field(default_factory=threading.Event)
    enqueued: float = field(default_factory=time.monotonic)
    first_token: float | None = None  # when the first step was pushed (time to first token)
    left: int = 0  # choices still generating (set when its rows join the loop)
    rid: str = ""  # the response id, for the log line

    def push(self, kind: str, value) -> None:
        """From the worker thread: hand an event to the request's coroutine."""
        if kind == "step" and self.first_token is None:
            self.first_token = time.monotonic()
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self.cancel_event.set()

    def cancel(self) -> None:
        self.cancel_event.set()

    def cancelled(self) -> bool:
        return self.cancel_event.is_set()


class Engine:
    """The request queue and the worker thread that runs the decode loop. Built once per server
    process. `stats` counts requests and tokens; `metrics()` adds the live figures."""

    def __init__(self, served: ServedModel, *, max_pending: int = 32):
        self.served = served
        self.max_pending = max_pending
        self._queue: collections.deque[Job] = collections.deque()
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._running = False
        self._rows: dict[int, Job] = {}  # id(row) -> its job, rows in the loop (queued or live)
        self._loop: BatchLoop | None = None
        self.stats = {"completed": 0, "cancelled": 0, "failed": 0, "rejected": 0, "generated_tokens": 0,
                      "prompt_tokens": 0, "cached_prompt_tokens": 0, "steps": 0, "row_steps": 0}
        self.ttft: collections.deque[float] = collections.deque(maxlen=1000)  # seconds, the last 1000 requests
        self.latency: collections.deque[float] = collections.deque(maxlen=1000)
        self.batch_rows = 0  # rows in the last step

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        if self._running:
            return
        self._running = True
        self._thread = threading.Thread(target=self._work, name="railcall-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cv:
            self._running = False
            for job in self._queue:
                job.cancel()
                job.push("error", RequestError("the server is shutting down", status=503, type="server_error"))
            self._queue.clear()
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)

    @property
    def pending(self) -> int:
        """Requests queued or in the decode loop."""
        return len(self._queue) + len(self._rows)

    def retry_after(self) -> int:
        """Seconds a client turned away should wait: about one request's time (the recent median)."""
        times = sorted(self.latency)
        return max(1, round(times[len(times) // 2])) if times else 5

    def metrics(self) -> dict:
        loop = self._loop
        cache = self.served.prefix_cache
        return {**self.stats, "pending": self.pending, "queued": len(self._queue) + (len(loop.waiting) if loop else 0),
                "running": len(loop.live) if loop else 0, "batch_rows": self.batch_rows,
                "prefix_cache_bytes": cache.bytes if cache else 0, "prefix_cache_hits": cache.hits if cache else 0,
                "prefix_cache_misses": cache.misses if cache else 0}

    # -- requests ----------------------------------------------------------------------------
    def submit(self, plan: Plan, loop: asyncio.AbstractEventLoop) -> Job:
        """Queue a planned request; 503 if the engine is not running, 429 if the queue is full."""
        with self._cv:
            if not self._running:
                self.stats["rejected"] += 1
                raise RequestError("the model is not ready to generate (starting up or shutting down); retry shortly",
                                   status=503, type="server_error", code="unavailable")
            if self.pending >= self.max_pending:
                self.stats["rejected"] += 1
                wait = self.retry_after()
                raise RequestError(f"the server is busy: {self.pending} requests are running or queued (limit "
                                   f"{self.max_pending}); retry in about {wait} s", status=429,
                                   type="rate_limit_error", code="overloaded", headers={"Retry-After": str(wait)})
            job = Job(plan, loop)
            self._queue.append(job)
            self._cv.notify()
        return job

    def _work(self) -> None:
        served = self.served
        loop = self._loop = BatchLoop(None, served.vocab, max_rows=served.max_rows, prefix_cache=served.prefix_cache,
                                      new_batch=served.batch, draft=served.draft)
        while True:
            with self._cv:
                while self._running and not self._queue and not loop.busy:
                    self._cv.wait()
                if not self._running:
                    break
                jobs = list(self._queue)
                self._queue.clear()
                for job in jobs:  # registered under the lock: `pending` never misses a job
                    self._rows[id(job)] = job
            for job in jobs:
                self._add(loop, job)
                self._rows.pop(id(job), None)
            try:
                ended = loop.step()
            except Exception as e:  # the forward pass itself failed: every row in it ends
                log.exception("decode step failed")
                ended = loop.cancel_all("error")
                for row in ended:
                    row.error = e
            self.batch_rows = len(loop.live)
            self.stats["steps"] += 1
            self.stats["row_steps"] += len(loop.live)
            for row in ended:
                self._finish(row)
        for row in loop.cancel_all():
            self._finish(row)

    def _add(self, loop: BatchLoop, job: Job) -> None:
        if job.cancelled():
            self.stats["cancelled"] += 1
            return
        plan = job.plan
        rows = []
        try:
            for k in range(plan.n):  # n choices: n rows, each its own matcher (and seed, if one is given)
                seed = plan.params.seed + k if plan.params.seed is not None else None
                rows.append(Row(self.served.vocab, plan.matcher(self.served), plan.params, seed=seed,
                                on_step=lambda step, k=k: job.push("step", (k, step)), cancelled=job.cancelled,
                                router=plan.router(self.served)))
        except Exception as e:
            log.exception("building the request's matcher failed")
            self.stats["failed"] += 1
            job.push("error", e)
            return
        job.left = len(rows)
        for k, row in enumerate(rows):
            self._rows[id(row)] = (job, k)
            loop.add(plan.prompt, row, group=id(job))  # the n choices share the request's turn

    def _finish(self, row: Row) -> None:
        job, k = self._rows.pop(id(row), (None, 0))
        if job is None:
            return
        gen = row.generation()
        job.left -= 1
        self.stats["generated_tokens"] += len(gen.tokens)
        self.stats["prompt_tokens"] += len(job.plan.prompt)
        self.stats["cached_prompt_tokens"] += row.prompt_cached
        if row.error is not None:
            log.error("generation failed: %s: %s", type(row.error).__name__, row.error)
            self.stats["failed"] += 1
            job.cancel()  # the request has failed: its other choices stop too
            job.push("error", row.error)
            return
        self.stats["cancelled" if gen.finish_reason == "cancelled" else "completed"] += 1
        if job.left == 0:
            if job.first_token is not None:
                self.ttft.append(job.first_token - job.enqueued)
            self.latency.append(time.monotonic() - job.enqueued)
            log.info("request %s: %d prompt tokens (%d cached), %d choice(s), %d tokens, %s, %.2f s",
                     job.rid, len(job.plan.prompt), row.prompt_cached, job.plan.n, len(gen.tokens), gen.finish_reason,
                     time.monotonic() - job.enqueued)
        job.push("done", (k, gen))
