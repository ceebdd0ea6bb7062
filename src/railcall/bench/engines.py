"""One small adapter per engine: set up for a vocabulary, compile a table, run a matcher.

Every engine gets the same tokenizer (tokenizer.json), the same stop tokens and, as far as it can
express it, the same language: compact JSON, properties in declared order, no additional keys.
Differences that remain are stated in `NOTES` and printed with the results.
"""

from __future__ import annotations

import json

from railcall.bench.workloads import peer_schema

NOTES = {
    "railcall": "tool grammar; strings capped at 256 characters, required strings non-empty; compiled as by "
                "default, with prewarm: every grammar position's keys and first mask at compile time (TTFM "
                "includes that), other masks on first use",
    "railcall-py": "railcall's default mode run from its Python source (RAILCALL_PURE=1), without the "
                   "Cython-compiled modules: what the compiled build buys",
    "railcall-lazy": "the same grammar compiled with prewarm=False: every mask computed on first use",
    "railcall-eager": "the same grammar compiled with precompute=True: every structural mask is computed at "
                      "compile time, so TTFM includes that walk",
    "llguidance": "JSON schema with the same caps; accepts \\uXXXX only for control characters and no \\/",
    "xgrammar": "JSON schema with the same caps, any_whitespace=False, separators (',', ':')",
    "outlines-core": "regex from the JSON schema; free strings left unbounded (a 256-character cap makes the "
                     "regex automaton explode); no \\uXXXX escapes; excludes U+007F-U+009F",
}


class Engine:
    name = "engine"

    def setup(self, vocab, tokenizer_json: str, stop_ids: list[int]) -> None:
        raise NotImplementedError

    def compile(self, tools):
        raise NotImplementedError

    def matcher(self, compiled):
        raise NotImplementedError

    def fill(self, m, bitmask) -> None:
        raise NotImplementedError

    def fresh(self, tables, compiled) -> list:
        """The tables ready for another cold walk: the engine's state carried from one request
        to the next dropped. A peer's matchers keep none (each path gets a new one; what is
        compiled is not changed by matching), so its compiled tables serve again."""
        return list(compiled)

    def consume(self, m, token: int) -> bool:
        raise NotImplementedError


class Railcall(Engine):
    name = "railcall"
    precompute = False
    prewarm = True

    def setup(self, vocab, tokenizer_json, stop_ids):
        from railcall.grammar.tools import tool_grammar
        from railcall.matcher import Matcher, compiled_grammar, prepare_vocabulary

        self.vocab = vocab
        self._tool_grammar, self._compiled, self._Matcher = tool_grammar, compiled_grammar, Matcher
        prepare_vocabulary(vocab)

    def compile(self, tools):
        return self._compiled(self._tool_grammar(tools), self.vocab, precompute=self.precompute, prewarm=self.prewarm)

    def fresh(self, tables, compiled):
        # masks and states are cached per vocabulary across requests: drop them, compile again
        from railcall.matcher import clear_caches

        clear_caches(self.vocab)
        return [self.compile(tools) for tools in tables]

    def matcher(self, compiled):
        return self._Matcher(compiled)

    def fill(self, m, bitmask):
        m.fill_bitmask(bitmask)

    def consume(self, m, token):
        return m.consume_token(token)


class RailcallPy(Railcall):
    """The default mode from the Python source: the runner starts its cell with RAILCALL_PURE=1
    (see PURE), so railcall's compiled modules are not loaded."""

    name = "railcall-py"

    def setup(self, vocab, tokenizer_json, stop_ids):
        from railcall.speedups import status

        if status()["compiled"] or not status()["pure"]:
            raise RuntimeError("railcall-py must run with RAILCALL_PURE=1 (the bench runner sets it)")
        super().setup(vocab, tokenizer_json, stop_ids)


class RailcallLazy(Railcall):
    name = "railcall-lazy"
    prewarm = False


class RailcallEager(Railcall):
    name = "railcall-eager"
    precompute = True


class LLGuidance(Engine):
    name = "llguidance"

    def setup(self, vocab, tokenizer_json, stop_ids):
        import llguidance

        self.ll = llguidance
        self.tok = llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab.logits_width, eos_token=stop_ids)

    def compile(self, tools):
        return self.ll.LLMatcher.grammar_from_json_schema(
            peer_schema(tools), defaults={"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"})

    def matcher(self, compiled):
        m = self.ll.LLMatcher(self.tok, compiled)
        if m.is_error():
            raise RuntimeError(m.get_error())
        return m

    def fill(self, m, bitmask):
        m.unsafe_compute_mask_ptr(bitmask.ctypes.data, bitmask.nbytes)

    def consume(self, m, token):
        return m.consume_token(token)


class XGrammar(Engine):
    name = "xgrammar"

    def setup(self, vocab, tokenizer_json, stop_ids):
        import torch
        import xgrammar as xgr

        self.xgr, self.torch = xgr, torch
        encoded = [b if not vocab.special[i] else vocab.special_text.get(i, "").encode() for i, b in enumerate(vocab.token_bytes)]
        info = xgr.TokenizerInfo(encoded, xgr.VocabType.RAW, vocab_size=vocab.logits_width, stop_token_ids=stop_ids)
        self.info = info
        self.compiler = xgr.GrammarCompiler(info, cache_enabled=True)
        self.tbm = None

    def compile(self, tools):
        return self.compiler.compile_json_schema(json.dumps(peer_schema(tools)), any_whitespace=False,
                                                 separators=(",", ":"), strict_mode=True)

    def matcher(self, compiled):
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, m, bitmask):
        if self.tbm is None or self.tbm.data_ptr() != bitmask.ctypes.data:
            self.tbm = self.torch.from_numpy(bitmask).view(1, -1)
        m.fill_next_token_bitmask(self.tbm, 0)

    def consume(self, m, token):
        return m.accept_token(token)


class OutlinesCore(Engine):
    name = "outlines-core"

    def setup(self, vocab, tokenizer_json, stop_ids):
        from outlines_core import Vocabulary as OV

        mapping: dict[bytes, list[int]] = {}
        for i, b in enumerate(vocab.token_bytes):
            if b and not vocab.special[i] and i not in stop_ids:
                mapping.setdefault(b, []).append(i)
        self.vocab = OV(stop_ids[0], mapping)

    def compile(self, tools):
        from outlines_core import Index
        from outlines_core.json_schema import build_regex_from_schema

        regex = build_regex_from_schema(json.dumps(peer_schema(tools, max_string=None)), whitespace_pattern="")
        return Index(regex, self.vocab)

    def matcher(self, compiled):
        from outlines_core import Guide

        return Guide(compiled)

    def fill(self, m, bitmask):
        m.write_mask_into(bitmask.ctypes.data, bitmask.size, bitmask.itemsize)

    def consume(self, m, token):
        try:
            m.advance(token, return_tokens=False)
            return True
        except Exception:
            return False


ENGINES = {e.name: e for e in (Railcall, RailcallPy, RailcallLazy, RailcallEager, LLGuidance, XGrammar, OutlinesCore)}
PURE = {"railcall-py"}  # engines whose cell runs with RAILCALL_PURE=1


def engine_version(name: str) -> str:
    import importlib.metadata

    dist = {"railcall": "railcall", "railcall-py": "railcall", "railcall-lazy": "railcall", "railcall-eager": "railcall", "llguidance": "llguidance", "xgrammar": "xgrammar", "outlines-core": "outlines_core"}[name]
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"
