"""railcall inside vLLM: a V1-engine logits processor that runs one railcall matcher per request.

    vllm serve MODEL --logits-processors railcall.integrations.vllm:RailcallLogitsProcessor
    LLM(model=..., logits_processors=[RailcallLogitsProcessor])

A request opts in through its SamplingParams' extra args (`extra_args={"railcall": spec}` with
`vllm.LLM`; `vllm_xargs={"railcall": json.dumps(spec)}` in an OpenAI request body, whose extra
args hold only strings and numbers). A request without them is untouched. The spec:

    tools      OpenAI-style tool dicts ({"type":"function","function":{...}}); a function with
               "x-mutates": true is a mutating tool
    read_only  build the grammar from the tools that do not mutate (read_only_view): a mutating
               tool's name is unspellable, not refused
    schema     a JSON Schema answer instead of tools (a response_format)
    grammar    a text answer of a general grammar instead: {"syntax": "lark" | "gbnf" | "regex",
               "definition": "..."} (docs/grammars.md)
    structural_tag
               free text with tagged parts: {"structures": [{"begin", "schema", "end"}, ...],
               "triggers": [...]} (vLLM's structural-tag format; mode "none" by default, "auto"
               with tools: calls and tagged parts in one reply)
    format     "json" ({"tool":…,"args":…}, the default), "openai" ({"name":…,"arguments":…}),
               "hermes" (<tool_call>{"name":…}) or "pythonic" ([get_weather(city="Paris")])
    parallel   several calls in one turn (an array, or several Hermes blocks)
    mode       "required" (the default: the turn is the call), "auto" (free content; the call's
               opening starts the grammar) or "none"; reasoning, reasoning_budget: a reasoning
               region first (see docs/reasoning.md)
    precompute compute every structural mask of the grammar when it is first compiled (once per
               tool table and worker; see docs/engine.md): later requests with the same table
               find every mask of a call cached. The walk runs inline, in the step that admits
               the request (~10 ms for a few tools, ~1 s for 128)
    prewarm    as in `compiled_grammar` by default (true for tools and schemas, false for a
               Lark, GBNF or regex grammar): every grammar position's keys and first mask when
               the grammar is first compiled, so the first call to a tool finds most of its
               masks' work done; false computes every mask on first use only (the cheapest
               compile, for a table seen once)

Lifecycles (vLLM builds the processor once per worker, in the worker process):
- RailcallLogitsProcessor: once per engine worker. Holds the model's Vocabulary (built from the
  model's tokenizer on the first railcall request, disk-cached), the bitmask buffer, and the
  per-request state keyed by the request's row in vLLM's persistent batch.
- Grammars and CompiledGrammars are shared across requests (`compiled_grammar`'s LRU, keyed by
  grammar content and vocabulary), so ten requests with one tool table compile it once.
- _Request: once per request (per row); a Matcher and a reference to vLLM's live list of the
  request's output token ids.

Each step, in vLLM's order: `update_state(batch_update)` applies the batch's changes (removed,
then added, then moved: vLLM condenses and reorders its persistent batch), then `apply(logits)`
consumes each tracked request's new output tokens, fills one bitmask row per tracked request and
sets the illegal logits of those rows to -inf. Tokens are consumed in `apply`, not in
`update_state`: with async scheduling (vLLM's GPU default) the last sampled token is a -1
placeholder at `update_state` and is filled in just before the sampler runs.

Stop tokens: a request ends only on a token vLLM stops on (the model's EOS and the request's
stop_token_ids). railcall's Vocabulary may know more end-of-turn tokens (SmolLM2's stop set is
<|im_end|> and <|endoftext|>; vLLM stops on <|im_end|> alone), so where the grammar allows a stop
token, only the ones vLLM stops on are offered -- otherwise a model that picks <|endoftext|>
would run on to max_tokens with nothing legal to write.

The token budget: railcall's own loop (railcall.runtime.decode.generate) completes a call cut by
max_tokens after the fact with Matcher.finish(); vLLM ends a request at max_tokens, so here the
shortest completion is forced while it still fits (a few tokens before the budget runs out, see
_Request._finish_plan). The output then parses and validates, with finish_reason "length" -- and
differs from railcall's loop, whose output runs past max_tokens by the completion's length.

What else differs from railcall's loop: vLLM samples one token per forward pass, so tokens the
grammar forces are each sampled from a one-token mask (no fast-forward). vLLM rejects custom
logits processors together with speculative decoding. A request must not combine railcall with
vLLM's own structured outputs.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.interface import MoveDirectionality

from railcall.bitmask import allocate_bitmask, apply_bitmask, pack_ids
from railcall.errors import RailcallError
from railcall.grammar import ir
from railcall.grammar.cfg import regex_grammar
from railcall.grammar.gbnf import gbnf_grammar
from railcall.grammar.lark import lark_grammar
from railcall.grammar.schema import schema_grammar
from railcall.grammar.tools import Tool, read_only_view, tool_grammar
from railcall.grammar.program import compile_grammar
from railcall.matcher import MAX_STRING, Matcher, compiled_grammar, fill_stops
from railcall.vocab import Vocabulary

log = logging.getLogger("railcall.integrations.vllm")

EXTRA_ARGS_KEY = "railcall"
MODES = ("required", "auto", "none")
_SPEC_KEYS = {"tools", "read_only", "schema", "grammar", "format", "parallel", "mode", "reasoning", "reasoning_budget", "precompute",
              "prewarm", "structural_tag"}


# -- the per-request spec ----------------------------------------------------------------------


@dataclass(frozen=True)
class RequestSpec:
    """What one request asks railcall to enforce, parsed from its extra args (per request)."""

    grammar: ir.Grammar | None  # None: mode "none" without an answer grammar
    mode: str = "required"
    reasoning: bool = False
    reasoning_budget: int | None = None
    precompute: bool = False
    prewarm: bool | None = None  # None: compiled_grammar's default for the grammar
    tags: tuple = ()  # a structural tag's tagged parts in the free text (railcall.grammar.turn.Tag)


def _bad(what: str) -> ValueError:
    # vLLM turns a ValueError from validate_params into HTTP 400 with this message.
    return ValueError(f"extra_args[{EXTRA_ARGS_KEY!r}]: {what}")


_SPECS: "OrderedDict[str, RequestSpec]" = OrderedDict()
_SPECS_LOCK = threading.Lock()
_SPECS_SIZE = 256  # distinct specs kept parsed; a grammar is rebuilt (milliseconds) past that
# Finishing at max_tokens (see _Request._finish_plan): recompute the shortest completion in the
# last FINISH_SLACK tokens before it would no longer fit; commit it FINISH_MARGIN tokens early.
FINISH_SLACK = 8
FINISH_MARGIN = 4
FINISH_FIRST = 24  # the first look, this many tokens (+ FINISH_SLACK) before max_tokens


def request_spec(params: SamplingParams) -> RequestSpec | None:
    """The request's railcall spec, or None when it has none. Raises ValueError naming the field
    for a malformed one. Parsed specs (and their grammars) are cached by the spec's JSON text."""
    raw = (params.extra_args or {}).get(EXTRA_ARGS_KEY)
    if raw is None:
        return None
    if isinstance(raw, str):
        text = raw
    else:
        try:
            text = json.dumps(raw)  # key order kept: properties are written in declared order
        except (TypeError, ValueError) as e:
            raise _bad(f"must be JSON data (a dict, or its JSON text): {e}") from None
    with _SPECS_LOCK:
        hit = _SPECS.get(text)
        if hit is not None:
            _SPECS.move_to_end(text)
            return hit
    spec = _parse_spec(text)
    with _SPECS_LOCK:
        _SPECS[text] = spec
        while len(_SPECS) > _SPECS_SIZE:
            _SPECS.popitem(last=False)
    return spec


def _parse_spec(text: str) -> RequestSpec:
    try:
        d = json.loads(text)
    except ValueError as e:
        raise _bad(f"is not valid JSON: {e}") from None
    if not isinstance(d, dict):
        raise _bad(f"must be an object with 'tools', 'schema' or 'grammar', not {type(d).__name__}")
    unknown = set(d) - _SPEC_KEYS
    if unknown:
        raise _bad(f"unknown field(s) {sorted(unknown)}; known: {sorted(_SPEC_KEYS)}")
    tagged = d.get("structural_tag")
    mode = d.get("mode", ("auto" if d.get("tools") is not None else "none") if tagged is not None else "required")
    if mode not in MODES:
        raise _bad(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    budget = d.get("reasoning_budget")
    if budget is not None and (not isinstance(budget, int) or budget < 0):
        raise _bad(f"reasoning_budget must be a non-negative integer, not {budget!r}")
    precompute, prewarm = d.get("precompute", False), d.get("prewarm")
    if not isinstance(precompute, bool):
        raise _bad(f"precompute must be true or false, not {precompute!r}")
    if prewarm is not None and not isinstance(prewarm, bool):
        raise _bad(f"prewarm must be true or false, not {prewarm!r}")
    tools, schema, text = d.get("tools"), d.get("schema"), d.get("grammar")
    if sum(x is not None for x in (tools, schema, text)) > 1:
        raise _bad("give one of 'tools', 'schema' and 'grammar'")
    try:
        if tools is not None:
            if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
                raise _bad("tools must be a list of OpenAI-style tool objects")
            table = [Tool.from_openai(t) for t in tools]
            if d.get("read_only"):
                table = read_only_view(table)
            grammar = tool_grammar(table, d.get("format", "json"), parallel=bool(d.get("parallel")))
        elif schema is not None:
            if not isinstance(schema, dict):
                raise _bad("schema must be a JSON Schema object")
            grammar = schema_grammar(schema)
        elif text is not None:
            front = {"lark": lark_grammar, "gbnf": gbnf_grammar, "regex": regex_grammar}
            if not isinstance(text, dict) or text.get("syntax") not in front or not isinstance(text.get("definition"), str):
                raise _bad('grammar must be {"syntax": "lark" | "gbnf" | "regex", "definition": "..."}')
            grammar = front[text["syntax"]](text["definition"])
        elif mode == "none":
            grammar = None
        else:
            raise _bad(f"mode {mode!r} needs 'tools', 'schema' or 'grammar'")
        tags = _tags(tagged, mode, schema, text) if tagged is not None else ()
        for g in ([grammar] if grammar is not None else []) + [t.grammar for t in tags]:
            # what does not depend on the vocabulary (a value with no finite form, a string length
            # range, a pattern, number bounds) fails here, as a 400, not in the engine step
            compile_grammar(g, {}, max_string=MAX_STRING)
    except RailcallError as e:
        raise _bad(str(e)) from None
    return RequestSpec(grammar, mode, bool(d.get("reasoning")), budget, precompute, prewarm, tags)


def _tags(tagged, mode: str, schema, text) -> tuple:
    """A spec's structural tag as the turn's tagged parts."""
    from railcall.grammar.turn import structural_tag_json

    if schema is not None or text is not None or mode == "required":
        raise _bad("a structural_tag puts tagged parts in free text: give it alone (mode 'none') or with 'tools' "
                   "(mode 'auto'), not with 'schema', 'grammar' or mode 'required'")
    return structural_tag_json(tagged).tags


# -- the per-request state ---------------------------------------------------------------------


class _Refused:
    """The matcher of a request whose grammar could not be built on the worker: in its error
    state from the start, offering only stop tokens (the Matcher verbs _Request uses)."""

    def __init__(self, vocab: Vocabulary, why: str):
        self.vocab = vocab
        self.error_message = why

    def is_error(self) -> bool:
        return True

    def consume_token(self, token_id: int) -> bool:
        return False

    def fill_bitmask(self, bitmask: np.ndarray, index: int = 0) -> int:
        return fill_stops(bitmask[index], self.vocab)


class _Request:
    """One request's grammar state (per request): a matcher, the live list of its output ids
    (vLLM appends to it; -1 marks a token still on its way under async scheduling), how many of
    them the matcher has consumed, and the finish plan for the end of its token budget."""

    __slots__ = ("matcher", "output_ids", "consumed", "stops", "not_stops", "max_tokens", "estimate",
                 "plan", "plan_start", "ended", "warned")

    def __init__(self, matcher, output_ids: list[int], stops: frozenset, not_stops: np.ndarray,
                 max_tokens: int | None):
        self.matcher = matcher
        self.output_ids = output_ids
        self.consumed = 0
        self.stops = stops  # the grammar's stop ids
        self.not_stops = not_stops  # those of them vLLM does not stop on for this request
        self.max_tokens = max_tokens
        self.estimate = FINISH_FIRST  # length of the shortest completion, when last computed
        self.plan: list[int] | None = None  # the completion being forced, once committed
        self.plan_start = 0  # output tokens consumed when it was committed
        self.ended = False  # a stop token was consumed: the mask stays stop-only
        self.warned = False

    def advance(self) -> None:
        ids, k = self.output_ids, self.consumed
        while k < len(ids) and not self.ended:
            t = ids[k]
            if t < 0:  # an async-scheduling placeholder, filled in before the next apply
                break
            self.matcher.consume_token(t)
            # vLLM goes on past a stop token only with ignore_eos: what follows is not the answer
            self.ended = t in self.stops and not self.matcher.is_error()
            k += 1
        self.consumed = k
        if self.matcher.is_error() and not self.warned:
            # A decoding fault (a token that bypassed the mask, e.g. another processor's doing):
            # the matcher offers only stop tokens from here, so the request ends.
            log.warning("railcall: a request left its grammar after %d tokens: %s", k, self.matcher.error_message)
            self.warned = True

    def _finish_plan(self) -> list[int] | None:
        """The forced completion once the token budget is about to run out, else None.

        railcall's own loop completes a call cut by max_tokens after the fact (Matcher.finish);
        vLLM ends the request at max_tokens, so the completion has to start while it still fits.
        The shortest completion costs ~10 ms to compute (SmolLM2, a string argument), so it is
        recomputed only in the last FINISH_SLACK tokens before the previous estimate runs out,
        and committed FINISH_MARGIN tokens early: one token can lengthen the completion by more
        than one (choosing a tool with more required arguments, opening a nested object). A
        jump larger than the margin in the last tokens, or a budget shorter than the shortest
        call, still leaves the call cut (best effort, not a guarantee)."""
        if self.max_tokens is None or self.ended or self.matcher.is_error():
            return None
        left = self.max_tokens - self.consumed
        if self.plan is not None:
            done = self.consumed - self.plan_start
            return self.plan[done:] if 0 <= done < len(self.plan) else None
        if left > self.estimate + FINISH_SLACK:
            return None
        try:
            tail = self.matcher.copy().finish()
        except RailcallError:  # no tokenizable completion: the request is cut as it stands
            tail = []
        self.estimate = len(tail)
        if tail and left <= self.estimate + FINISH_MARGIN:
            self.plan, self.plan_start = tail, self.consumed
            return tail
        return None

    def fill(self, bitmask: np.ndarray, row: int) -> None:
        plan = self._finish_plan()
        if plan:
            bitmask[row] = pack_ids([plan[0]], self.matcher.g.width)
            return
        self.matcher.fill_bitmask(bitmask, row)
        if self.not_stops.size:
            words = bitmask[row].view(np.uint32)
            np.bitwise_and.at(words, self.not_stops >> 5, ~(np.uint32(1) << (self.not_stops & 31).astype(np.uint32)))


# -- the processor -----------------------------------------------------------------------------


class RailcallLogitsProcessor(LogitsProcessor):
    """railcall's grammar for every request that asks for it (see the module docstring).

    Built once per vLLM worker; the Vocabulary is loaded from the model's tokenizer on the first
    request that carries a railcall spec, so an engine serving none pays nothing."""

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams):
        """Front-end check (HTTP 400 on a bad spec): parse the spec and build its grammar."""
        if request_spec(sampling_params) is None:
            return
        if getattr(sampling_params, "structured_outputs", None) is not None:
            raise _bad("cannot be combined with vLLM's structured outputs on one request; use one of them")

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool):
        self.device = device
        model_config = vllm_config.model_config
        self.model_config = model_config
        self.width = int(model_config.get_vocab_size())
        self.max_rows = int(vllm_config.scheduler_config.max_num_seqs)
        self.vocab: Vocabulary | None = None
        self.bitmask: np.ndarray | None = None  # (max_rows, words) int32, reused every step
        self.requests: dict[int, _Request] = {}  # persistent-batch row -> request state

    # vLLM's interface ---------------------------------------------------------------------------

    def is_argmax_invariant(self) -> bool:
        return False  # a mask changes the greedy choice: vLLM must run it for greedy requests too

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        # vLLM's documented order: removed, added, moved.
        for row in batch_update.removed:
            self.requests.pop(row, None)
        for row, params, _prompt_ids, output_ids in batch_update.added:
            state = self._new_request(params, output_ids)
            if state is None:
                self.requests.pop(row, None)  # a request without a spec may take a tracked row
            else:
                self.requests[row] = state
        for a, b, how in batch_update.moved:
            ra, rb = self.requests.pop(a, None), self.requests.pop(b, None)
            if ra is not None:
                self.requests[b] = ra
            if rb is not None and how == MoveDirectionality.SWAP:
                self.requests[a] = rb

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.requests:
            return logits
        rows = sorted(self.requests)
        n = len(rows)
        if self.bitmask is None or self.bitmask.shape[0] < n:
            self.bitmask = allocate_bitmask(self.width, batch=max(n, self.max_rows))
        bm = self.bitmask[:n]
        for k, row in enumerate(rows):
            req = self.requests[row]
            req.advance()
            req.fill(bm, k)
        mask = torch.from_numpy(bm)
        if rows[-1] == n - 1 == logits.shape[0] - 1:
            apply_bitmask(logits, mask)  # every row is railcall's: mask the batch in place
        else:
            index = torch.tensor(rows, device=logits.device)
            sub = logits.index_select(0, index)
            apply_bitmask(sub, mask)
            logits.index_copy_(0, index, sub)
        return logits

    # railcall's side ---------------------------------------------------------------------------

    def _new_request(self, params: SamplingParams, output_ids: list[int]) -> _Request | None:
        spec = request_spec(params)
        if spec is None:
            return None
        vocab = self._vocabulary()
        try:
            compiled = (compiled_grammar(spec.grammar, vocab, max_string=MAX_STRING, precompute=spec.precompute,
                                         prewarm=spec.prewarm)
                        if spec.grammar is not None else None)
            if spec.mode == "required" and not spec.reasoning:
                matcher = Matcher(compiled)
            else:
                from railcall.output import Delimiters
                from railcall.runtime.regions import answer_matcher

                matcher = answer_matcher(vocab, compiled, Delimiters.from_vocab(vocab), mode=spec.mode,
                                         reasoning=spec.reasoning, reasoning_budget=spec.reasoning_budget,
                                         tags=spec.tags)
        except RailcallError as e:
            # This runs inside vLLM's engine step, where an exception would take the engine down
            # with every request in it: this request alone ends, at once, and the log says why.
            log.error("railcall: a request's grammar could not be built for this model (%s); it is ended", e)
            matcher = _Refused(vocab, f"the grammar could not be built for this model: {e}")
        vllm_stops = set(params.all_stop_token_ids)
        ours = [int(t) for t in vocab.stop_ids]
        not_stops = [t for t in ours if t not in vllm_stops]
        if len(not_stops) == len(ours):
            not_stops = []  # vLLM stops on none of them (ignore_eos): leave the grammar's set
        return _Request(matcher, output_ids, frozenset(ours), np.asarray(not_stops, dtype=np.int64), params.max_tokens)

    def _vocabulary(self) -> Vocabulary:
        if self.vocab is None:
            from transformers import AutoTokenizer

            mc = self.model_config
            tokenizer = AutoTokenizer.from_pretrained(
                mc.tokenizer, revision=getattr(mc, "tokenizer_revision", None),
                trust_remote_code=bool(getattr(mc, "trust_remote_code", False)))
            self.vocab = Vocabulary.from_hf(tokenizer, logits_width=self.width)
            from railcall.matcher import prepare_vocabulary

            prepare_vocabulary(self.vocab)
        return self.vocab


def railcall_args(tools: list[dict] | None = None, *, read_only: bool = False, schema: dict | None = None,
                  **more: Any) -> dict:
    """`extra_args` for a SamplingParams: `SamplingParams(..., extra_args=railcall_args(tools))`."""
    spec: dict[str, Any] = dict(more)
    if tools is not None:
        spec["tools"] = tools
    if read_only:
        spec["read_only"] = True
    if schema is not None:
        spec["schema"] = schema
    return {EXTRA_ARGS_KEY: spec}
