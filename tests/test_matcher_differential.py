"""Differential test against llguidance as an oracle: the same language, token by token.

Random tool tables are compiled by railcall and, as an equivalent JSON schema, by llguidance
(an `anyOf` over `{"tool": const, "args": schema}` objects, compact separators, properties in
declared order, no additional properties, railcall's string rules made explicit: `maxLength`
capped at railcall's string cap and `minLength >= 1` for required strings). Random walks through
the grammar then compare, at every step, the set of tokens each engine accepts.

What is compared, and what is excluded (and why):
- llguidance's *mask* is narrower than the set of tokens it accepts where the grammar forces
  bytes: it offers only the canonical tokenization of a forced run (`{"`, not `{`), yet accepts
  the others when consumed. So a token railcall allows and llguidance's mask does not is checked
  with llguidance's `validate_tokens`; only a token llguidance then rejects is a mismatch.
- llguidance writes every character that can be raw as raw: it accepts `\\uXXXX` only for the
  control characters U+0000-U+001F and rejects the escape `\\/`. Both are valid JSON and railcall
  accepts every JSON escape (the issue asks for full escapes). Tokens whose only difference is
  such an escape are excluded from the comparison and counted separately.
- Gemma 3's non-special added tokens (`<table>`, runs of newlines): railcall treats them as the
  text they stand for, since the tokenizer produces them for that text; llguidance never offers
  an added token as text. They are excluded on Gemma 3 only.
- Numbers: railcall caps a number at 24 characters (a model can loop on digits as easily as on
  whitespace); llguidance has no cap. The cap is lifted for this test so the languages agree.
Everything else must agree exactly: zero mismatches over at least 10,000 steps per vocabulary.
"""

from __future__ import annotations

import random
import re

import numpy as np
import pytest

import llguidance  # a dev dependency (pyproject [dev]), installed by `make test`
import llguidance.hf

from railcall.bench.workloads import peer_schema
from railcall.bitmask import allocate_bitmask, unpack_bitmask
from railcall.grammar import numbers, program
from railcall.grammar.tools import tool_grammar
from railcall.matcher import CompiledGrammar, Matcher

from toolgen import pick_token, random_tools

MAX_STRING = 256
STEPS_PER_VOCAB = 10_000


def ll_schema(tools) -> dict:
    """The same language for llguidance: the benchmark's peer schema, compact separators."""
    return {**peer_schema(tools, MAX_STRING),
            "x-guidance": {"item_separator": ",", "key_separator": ":", "whitespace_flexible": False}}


_ESCAPE = re.compile(rb'\\(u[0-9a-fA-F]{0,4}|.)', re.S)


def escape_only_difference(before: bytes, token: bytes) -> bool:
    """True if `before + token` contains, in the part the token adds, an escape llguidance
    refuses but JSON allows: `\\/`, or `\\u` not followed by 00[01] (a partial one included)."""
    text = before + token
    start = len(before)
    for m in _ESCAPE.finditer(text):
        if m.end() <= start:
            continue
        esc = m.group(1)
        if esc == b"/":
            return True
        if esc.startswith(b"u"):
            hexd = esc[1:]
            if not b"00"[: len(hexd)] == hexd[:2] or (len(hexd) >= 3 and hexd[2:3] not in b"01"):
                return True
    return False


def run_differential(vocab, ll_tok, seed: int, steps_target: int, text_added=frozenset()):
    rng = random.Random(seed)
    W = vocab.logits_width
    stop_ids = set(vocab.stop_ids)
    steps = mismatches = excluded = tables = 0
    examples = []
    bm = allocate_bitmask(W)
    added_mask = np.zeros(W, dtype=bool)
    added_mask[list(text_added)] = True
    while steps < steps_target:
        tools = random_tools(rng)
        tables += 1
        cg = CompiledGrammar(tool_grammar(tools), vocab, max_string=MAX_STRING)
        grm = llguidance.LLMatcher.grammar_from_json_schema(ll_schema(tools))
        for _walk in range(3):
            ours, theirs = Matcher(cg), llguidance.LLMatcher(ll_tok, grm)
            assert not theirs.is_error(), theirs.get_error()
            text = b""
            for _ in range(150):
                if ours.is_done():
                    break
                a = np.frombuffer(theirs.compute_bitmask(), dtype=np.int32)
                ours.fill_bitmask(bm)
                steps += 1
                lb = np.flatnonzero(unpack_bitmask(bm, W))
                if np.array_equal(a, bm):
                    t = pick_token(rng, lb, vocab, stop_ids)
                    assert ours.consume_token(t) and theirs.consume_token(t)
                    if t not in stop_ids:
                        text += vocab.token_bytes[t]
                    continue
                a_bits, b_bits = unpack_bitmask(a, W), unpack_bitmask(bm, W)
                only_theirs = np.flatnonzero(a_bits & ~b_bits)
                cand = b_bits & ~a_bits
                added = cand & added_mask
                esc = np.flatnonzero(added).tolist()
                only_ours = []
                for t in np.flatnonzero(cand & ~added).tolist():
                    if escape_only_difference(text, vocab.token_bytes[t]):
                        esc.append(t)
                    elif theirs.validate_tokens([t]) != 1:
                        only_ours.append(t)
                excluded += len(esc)
                real = only_ours
                if only_theirs.size or real:
                    mismatches += 1
                    if len(examples) < 5:
                        examples.append((text, [vocab.token_text(t) for t in only_theirs[:8]],
                                         [vocab.token_text(t) for t in real[:8]]))
                    break
                keep = b_bits.copy()
                keep[esc] = False
                pool = np.flatnonzero(keep)  # tokens both engines accept
                t = pick_token(rng, pool, vocab, stop_ids)
                assert ours.consume_token(t) and theirs.consume_token(t)
                if t not in stop_ids:
                    text += vocab.token_bytes[t]
    return steps, mismatches, excluded, tables, examples


@pytest.fixture()
def uncapped_numbers(monkeypatch):
    for module in (numbers, program):  # read where numbers step and where the compiler checks bounds
        monkeypatch.setattr(module, "MAX_NUMBER_CHARS", 400)


def test_escape_filter():
    assert escape_only_difference(b'"a\\', b"/")
    assert escape_only_difference(b'"a\\', b"ue")
    assert escape_only_difference(b'"a', b"\\u00e9")
    assert not escape_only_difference(b'"a\\', b"u001")
    assert not escape_only_difference(b'"a\\', b"n")
    assert not escape_only_difference(b'"a', b"bc")


def check(vocab, ll_tok, seed: int, label: str, text_added=frozenset()) -> None:
    steps, mismatches, excluded, tables, examples = run_differential(vocab, ll_tok, seed, STEPS_PER_VOCAB, text_added)
    print(f"{label}: {steps} steps over {tables} tables, {mismatches} mismatches, {excluded} escape tokens excluded")
    assert steps >= STEPS_PER_VOCAB
    assert mismatches == 0, examples


def test_differential_tiny_bpe(bpe_tokenizer, bpe_vocab, uncapped_numbers):
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_object=bpe_tokenizer, eos_token="<|end|>")
    check(bpe_vocab, llguidance.hf.from_tokenizer(hf, eos_token=list(bpe_vocab.stop_ids)), 1, "tiny BPE")


@pytest.mark.model
def test_differential_smollm2(smollm2_tokenizer, smollm2_vocab, uncapped_numbers):
    ll_tok = llguidance.hf.from_tokenizer(smollm2_tokenizer, eos_token=list(smollm2_vocab.stop_ids))
    check(smollm2_vocab, ll_tok, 2, "SmolLM2")


@pytest.mark.gemma
def test_differential_gemma3(gemma3_tokenizer, gemma3_vocab, uncapped_numbers):
    ll_tok = llguidance.hf.from_tokenizer(gemma3_tokenizer, eos_token=list(gemma3_vocab.stop_ids))
    # Gemma's non-special added tokens (HTML tags, whitespace runs) are text: the tokenizer
    # produces them for that text. llguidance never offers an added token as text.
    specials = set(gemma3_tokenizer.all_special_ids)
    text_added = frozenset(i for i in gemma3_tokenizer.get_added_vocab().values() if i not in specials)
    check(gemma3_vocab, ll_tok, 3, "Gemma 3", text_added)
