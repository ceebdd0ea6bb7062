"""The served model and the generation queue.

    request --validate/plan (thread pool)--> Engine.submit --bounded FIFO--> worker thread
    worker: generate(backend, vocab, plan.prompt, plan.matcher(), on_step=job.push, cancelled=job.cancelled)
    job.push --loop.call_soon_threadsafe--> the request's asyncio.Queue --> response / SSE stream

One model per process (`ServedModel`, built once), one backend and one worker thread: the
transformers backend holds one sequence's KV cache, so requests run one at a time, in arrival
order, and the event loop only ever waits on a queue. A full queue answers 429 at once instead
of letting latency grow without bound; a stopped engine answers 503. A job whose client went
away is skipped if still queued, or stopped at its next token (`cancelled`).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from dataclasses import dataclass, field

from railcall.decode import generate
from railcall.errors import RequestError
from railcall.matcher import MAX_STRING
from railcall.output import Delimiters
from railcall.prompt import has_native_tools
from railcall.server.plan import Plan, messages_for_template
from railcall.vocab import single_token

log = logging.getLogger("railcall.server")


class ServedModel:
    """The model a server process serves. Built once per process.

    Holds the loaded model and tokenizer, its Vocabulary, the call format its tool calls are
    written in (Hermes tags where `<tool_call>` is one token, special or added as an ordinary one
    as in Qwen, and the chat template knows tools; railcall's JSON format otherwise, as for
    SmolLM2) and the context length.
    """

    def __init__(self, lm, vocab, name: str | None = None):
        self.lm = lm
        self.tokenizer = lm.tokenizer
        self.vocab = vocab
        self.name = name or lm.name
        cfg = lm.model.config
        self.context_length = int(getattr(cfg, "max_position_embeddings", 0) or 2048)
        self.max_string = MAX_STRING  # the most characters of a generated string without maxLength
        # the grammar and the output parser both take a one-token tag by its id (TagIds, Delimiters)
        self.native = has_native_tools(self.tokenizer) and single_token(vocab, "<tool_call>") is not None
        self.call_format = "hermes" if self.native else "json"
        self.keys = ("name", "arguments") if self.native else ("tool", "args")
        # Reasoning is parsed and given its region only where both think delimiters are single
        # tokens: on a model without them (SmolLM2) a spelled "<think>" is just text.
        think = Delimiters.from_vocab(vocab, tool_call=None)
        self.reasoning = all(d is not None and d.token_id is not None for d in (think.reasoning_open, think.reasoning_close))
        self.delimiters = Delimiters.from_vocab(vocab, reasoning=("<think>", "</think>") if self.reasoning else None)

    @classmethod
    def load(cls, model: str | None = None) -> "ServedModel":
        from railcall.models.store import load_model
        from railcall.vocab import Vocabulary

        from railcall.matcher import prepare_vocabulary

        lm = load_model(model)
        vocab = Vocabulary.from_hf(lm.tokenizer, logits_width=lm.model.config.vocab_size, name=lm.name)
        prepare_vocabulary(vocab)  # the engine's indexes now, not on the first request
        return cls(lm, vocab)

    def backend(self):
        from railcall.models.backend import TransformersBackend

        return TransformersBackend(self.lm.model)

    def prompt_ids(self, req, tools, choice, named, kind, has_schema) -> list[int]:
        messages, specs = messages_for_template(req, tools, choice, kind, has_schema, self.keys, self.native)
        try:
            kw = {"tools": specs} if specs else {}
            out = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **kw)
        except Exception as e:  # jinja's TemplateError and friends: the template refused these messages
            raise RequestError(f"the model's chat template rejected the messages: {e}", param="messages") from None
        ids = out["input_ids"] if hasattr(out, "keys") else out
        return [int(i) for i in (ids[0] if ids and isinstance(ids[0], list) else ids)]

    def warm_up(self) -> None:
        """Compile a small grammar and fill one mask, so per-vocabulary indexes are built before
        the first request rather than inside it."""
        from railcall.bitmask import allocate_bitmask
        from railcall.grammar.tools import Tool, tool_grammar
        from railcall.matcher import Matcher, compiled_grammar

        m = Matcher(compiled_grammar(tool_grammar([Tool("f", "", {"type": "object", "properties": {"a": {"type": "string"}}})],
                                                  self.call_format), self.vocab))
        m.fill_bitmask(allocate_bitmask(self.vocab.logits_width))


@dataclass
class Job:
    """One queued request. Built per request on the event loop; filled by the worker thread."""

    plan: Plan
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancel_event: threading.Event = field(default_factory=threading.Event)
    enqueued: float = field(default_factory=time.monotonic)

    def push(self, kind: str, value) -> None:
        """From the worker thread: hand an event to the request's coroutine."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self.cancel_event.set()

    def cancel(self) -> None:
        self.cancel_event.set()

    def cancelled(self) -> bool:
        return self.cancel_event.is_set()


class Engine:
    """The generation queue and its worker thread. Built once per server process."""

    def __init__(self, served: ServedModel, *, max_pending: int = 32):
        self.served = served
        self.max_pending = max_pending
        self._queue: collections.deque[Job] = collections.deque()
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._running = False
        self.active: Job | None = None
        self.stats = {"completed": 0, "cancelled": 0, "failed": 0, "rejected": 0, "generated_tokens": 0}

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
        return len(self._queue) + (1 if self.active is not None else 0)

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
                raise RequestError(f"the server is busy: {self.pending} requests are running or queued (limit "
                                   f"{self.max_pending}); retry later", status=429, type="rate_limit_error",
                                   code="overloaded")
            job = Job(plan, loop)
            self._queue.append(job)
            self._cv.notify()
        return job

    def _work(self) -> None:
        backend = self.served.backend()
        while True:
            with self._cv:
                while self._running and not self._queue:
                    self._cv.wait()
                if not self._running:
                    return
                job = self._queue.popleft()
                self.active = job
            try:
                if job.cancelled():
                    self.stats["cancelled"] += 1
                    continue
                plan = job.plan
                gen = generate(backend, self.served.vocab, plan.prompt, plan.matcher(self.served), plan.params,
                               on_step=lambda step: job.push("step", step), cancelled=job.cancelled)
                self.stats["generated_tokens"] += len(gen.tokens)
                self.stats["cancelled" if gen.finish_reason == "cancelled" else "completed"] += 1
                job.push("done", gen)
            except Exception as e:  # a fault in generation ends this request, never the worker
                log.exception("generation failed")
                self.stats["failed"] += 1
                job.push("error", e)
            finally:
                with self._cv:
                    self.active = None
