"""The region matcher inside railcall.runtime.decode.generate, on SmolLM2's real tokenizer.

The backend is a test double, said plainly: a scripted backend whose logits put the highest
score on the next token of a given script, so greedy decoding emits exactly those ids wherever
the mask allows them. It exercises the decode loop's verbs (fill_bitmask, consume_token,
forced_tokens, is_done, finish) on the region matcher without a model.
"""

from __future__ import annotations

import json

import pytest
import torch

from output_script import detokenize
from railcall import compiled_grammar, schema_grammar
from railcall.runtime.decode import SamplingParams, generate
from railcall.output import Delimiters, OutputParser
from railcall.runtime.regions import answer_matcher


class ScriptedBackend:
    """Emits a given token script: each row of logits prefers the script's next token."""

    def __init__(self, script, width):
        self.script, self.width, self.pos = list(script), width, 0

    def _row(self, i):
        row = torch.zeros(self.width)
        if i < len(self.script):
            row[self.script[i]] = 10.0
        return row

    def start(self, prompt):
        self.pos = 0
        return self._row(0)

    def feed(self, tokens):
        rows = []
        for _ in tokens:
            self.pos += 1
            rows.append(self._row(self.pos))
        return torch.stack(rows)


def test_generate_with_reasoning_and_a_structured_answer(smollm2_tokenizer, smollm2_vocab):
    v = smollm2_vocab
    encode = lambda s: smollm2_tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    text = '<think>plan it</think>{"literal":"a </think> tag"}'
    ids = encode(text) + [v.stop_ids[0]]
    d = Delimiters.from_vocab(v)
    schema = {"type": "object", "properties": {"literal": {"type": "string"}}, "required": ["literal"]}
    m = answer_matcher(v, compiled_grammar(schema_grammar(schema), v), d, reasoning=True)
    g = generate(ScriptedBackend(ids, v.logits_width), v, [1], m, SamplingParams(max_tokens=64))
    assert not g.grammar_error and g.finish_reason == "stop"
    assert g.text == text  # every scripted token was legal (forced ones included)
    assert g.passes_saved > 0  # the open and the answer's keys were fast-forwarded
    p = OutputParser(d, stop_ids=v.stop_ids)
    for tid, t in detokenize(v, g.tokens):
        p.feed(tid, t)
    p.finish()
    # SmolLM2 has no <think> token: the close is text-matched, and its first spelling ends
    # reasoning in both the grammar and the parser (the documented fallback); the one inside the
    # JSON string is answer text.
    assert p.result().reasoning_content == "plan it"
    assert json.loads(p.result().content) == {"literal": "a </think> tag"}


@pytest.mark.qwen2
def test_generate_with_reasoning_and_an_auto_hermes_call_on_qwen2(qwen2_tokenizer):
    """On Qwen's vocabulary the tags are single ordinary tokens: reasoning ends only at 151649
    (a `</think>` spelled in pieces stays reasoning), and the call grammar starts at 151657."""
    from railcall import Tool, tool_grammar
    from railcall.vocab import Vocabulary

    v = Vocabulary.from_hf(qwen2_tokenizer, logits_width=152064, name="qwen2")
    encode = lambda s: qwen2_tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    ids = ([151648] + encode("a </") + encode("think> is text") + [151649] + encode("On it.") + [151657]
           + encode('{"name":"calc","arguments":{"expr":"6*7"}}') + [151658, v.stop_ids[0]])
    calc = Tool("calc", "", {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]})
    d = Delimiters.from_vocab(v)
    m = answer_matcher(v, compiled_grammar(tool_grammar([calc], "hermes"), v), d, mode="auto", reasoning=True)
    g = generate(ScriptedBackend(ids, v.logits_width), v, [1], m, SamplingParams(max_tokens=64))
    assert not g.grammar_error and g.finish_reason == "stop"
    assert g.tokens == ids[:-1]  # every scripted token was legal, none replaced (the stop is not kept)
    p = OutputParser(d, stop_ids=v.stop_ids)
    for tid, t in detokenize(v, g.tokens):
        p.feed(tid, t)
    p.finish()
    r = p.result()
    assert (r.reasoning_content, r.content) == ("a </think> is text", "On it.")
    assert [(c.name, json.loads(c.arguments)) for c in r.tool_calls] == [("calc", {"expr": "6*7"})]
