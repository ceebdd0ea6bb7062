"""The model a server process serves: loaded once, with its vocabulary, call format, delimiters,
decode-loop settings (rows per step, the prefix cache) and how a request's messages become
prompt ids."""

from __future__ import annotations

from railcall.runtime.batch import OneRowBatch, PrefixCache
from railcall.runtime.decode import DRAFT_TOKENS
from railcall.errors import RequestError
from railcall.matcher import MAX_STRING
from railcall.output import Delimiters
from railcall.prompts.chat import has_native_tools
from railcall.server.messages import messages_for_template
from railcall.vocab import single_token


# The engine's state shared by every request's grammar (automaton states, masks), per served
# vocabulary: past it, the next grammar starts a fresh store and older state is dropped (masks
# unchanged; docs/engine.md). A server takes schemas from any client: 1,000 requests with fresh
# schemas grew its resident memory by 35% (493 -> 666 MiB) under the engine's 512 MiB default,
# 26% under 128 MiB and 16% under 64 MiB (tests/hostile.py). A 128-tool table peaks at 8-20 MB
# (docs/benchmarks.md).
ENGINE_BYTES = 64 << 20


class ServedModel:
    """The model a server process serves. Built once per process.

    Holds the loaded model and tokenizer, its Vocabulary, the call format its tool calls are
    written in by default (Hermes tags where `<tool_call>` is one token, special or added as an
    ordinary one as in Qwen, and the chat template knows tools; railcall's JSON format otherwise,
    as for SmolLM2; `railcall serve --format` or a request's `call_format` choose another) and
    the context length.
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
        self.call_format = "hermes" if self.native else "json"  # a request's call_format may choose another
        self.keys = ("name", "arguments") if self.native else ("tool", "args")
        self.scores_branches = True  # routing "scored" can run (the batch scores a row's branches)
        # Reasoning is parsed and given its region only where both think delimiters are single
        # tokens: on a model without them (SmolLM2) a spelled "<think>" is just text.
        think = Delimiters.from_vocab(vocab, tool_call=None)
        self.reasoning = all(d is not None and d.token_id is not None for d in (think.reasoning_open, think.reasoning_close))
        self.delimiters = Delimiters.from_vocab(vocab, reasoning=("<think>", "</think>") if self.reasoning else None)
        # Rows decoded together per forward pass: on 2 cores a pass over 8 rows costs about 1.5x
        # a pass over one, over 16 about 2x (memory-bound: the weights are read once per pass).
        self.max_rows = 16
        self.draft = DRAFT_TOKENS  # tokens a row drafts a step where the batch can drop them (llama.cpp)
        self.prefix_cache: PrefixCache | None = PrefixCache(self.prefix_budget(256 << 20))

    def prefix_budget(self, max_bytes: int) -> int:
        """The prefix cache's byte budget: `max_bytes`, and under llama.cpp at most the KV of a
        quarter of its cells. Kept prefixes there hold cells of the one shared cache, and every
        step attends over the span of cells in use: with kept prefixes spread over 8,192 cells a
        new 1,400-token prompt took 14.0 s to prefill against 6.4 s with none kept (2 cores)."""
        cells = getattr(self.lm.model, "cells", None)
        per_token = getattr(self.lm.model, "bytes_per_token", None)
        if cells is None or per_token is None:
            return max_bytes
        return min(max_bytes, (cells // 4) * per_token)

    def use_format(self, fmt: str) -> None:
        """Write calls in `fmt` where a request names no call_format (`railcall serve --format`)."""
        from railcall.grammar.tools import FORMATS

        if fmt not in FORMATS:
            raise RequestError(f"unknown call format {fmt!r}; use {', '.join(FORMATS)}")
        self.call_format = fmt
        self.keys = {"json": ("tool", "args"), "pythonic": None}.get(fmt, ("name", "arguments"))

    @classmethod
    def load(cls, model: str | None = None, backend: str | None = None,
             engine_bytes: int | None = ENGINE_BYTES) -> "ServedModel":
        """`model` loaded, its vocabulary's engine state held to `engine_bytes` (None: the
        engine's own budget, `matcher.set_memory_budget`)."""
        from railcall.matcher import prepare_vocabulary, set_memory_budget
        from railcall.models.store import load_model

        lm = load_model(model, backend=backend)
        vocab = lm.vocabulary()
        if engine_bytes is not None:
            set_memory_budget(vocab, engine_bytes)
        prepare_vocabulary(vocab)  # the engine's indexes now, not on the first request
        return cls(lm, vocab)

    def batch(self):
        """A fresh batch of rows over this model (one per run of the decode loop)."""
        pad = self.vocab.eos_id if self.vocab.eos_id is not None else 0
        return self.lm.new_batch(pad)

    def serve_one_at_a_time(self, backend) -> None:
        """Decode through a single-sequence backend (`start`/`feed`: a test double, or a runtime
        that cannot batch): the same loop, one row at a time, no prefix cache."""
        self.batch = lambda: OneRowBatch(backend)
        self.scores_branches = hasattr(backend, "branch_logits")
        self.max_rows = 1
        self.prefix_cache = None

    def prompt_ids(self, req, tools, choice, named, kind, has_schema, fmt: str | None = None) -> list[int]:
        """The request's prompt; calls in `fmt` (default: this model's format). The chat template
        presents the tools only where the calls are its own Hermes blocks; for another format
        railcall's system prompt describes the tools and that format."""
        fmt = fmt or self.call_format
        messages, specs = messages_for_template(req, tools, choice, kind, has_schema, fmt, self.native and fmt == "hermes")
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
