"""A Hugging Face `LogitsProcessor` that runs railcall matchers inside `model.generate`.

    proc = RailcallLogitsProcessor(compiled, prompt_len=inputs.shape[1])
    model.generate(inputs, logits_processor=LogitsProcessorList([proc]), eos_token_id=list(vocab.stop_ids))

One matcher per batch row (per request; `batch_size` rows, counting beams and returned sequences:
a call with another number of rows is a MatcherError); each call consumes the tokens generated
since the last call, then masks the scores in place. Pass every stop id as `eos_token_id` so that generation ends
when the grammar allows nothing else.
"""

from __future__ import annotations

from transformers import LogitsProcessor

from railcall.bitmask import allocate_bitmask, apply_bitmask
from railcall.errors import MatcherError
from railcall.matcher import CompiledGrammar, Matcher


class RailcallLogitsProcessor(LogitsProcessor):
    def __init__(self, compiled: CompiledGrammar, prompt_len: int, batch_size: int = 1):
        self.matchers = [Matcher(compiled) for _ in range(batch_size)]
        self.prompt_len = prompt_len
        self.bitmask = None

    def __call__(self, input_ids, scores):
        if scores.shape[0] != len(self.matchers):
            # a row without a matcher would be masked by another row's grammar, or not at all
            raise MatcherError(
                f"the logits processor was built for {len(self.matchers)} row(s) but generate() passed "
                f"{scores.shape[0]} (num_beams and num_return_sequences multiply the rows): build it with "
                f"batch_size={scores.shape[0]}")
        if self.bitmask is None:
            self.bitmask = allocate_bitmask(scores.shape[-1], batch=scores.shape[0])
        for i, m in enumerate(self.matchers):
            seen = self.prompt_len + m.num_consumed()
            for t in input_ids[i, seen:].tolist():
                m.consume_token(t)
            m.fill_bitmask(self.bitmask, i)
        apply_bitmask(scores, self.bitmask)
        return scores
