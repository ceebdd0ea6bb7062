"""A Hugging Face `LogitsProcessor` that runs railcall matchers inside `model.generate`.

    import torch
    from transformers import LogitsProcessorList

    from railcall import Tool, Vocabulary, compiled_grammar, tool_grammar
    from railcall.integrations.hf import RailcallLogitsProcessor
    from railcall.models.store import load_model
    from railcall.prompts.chat import chat_prompt_ids

    lm = load_model(backend="transformers")  # the embedded SmolLM2 as a transformers model
    vocab = Vocabulary.from_hf(lm.tokenizer, logits_width=lm.model.config.vocab_size)
    tools = [Tool("get_weather", "Current weather for a city.",
                  {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})]
    compiled = compiled_grammar(tool_grammar(tools), vocab)
    inputs = torch.tensor([chat_prompt_ids(lm.tokenizer, tools, "What is the weather in Paris?")])
    proc = RailcallLogitsProcessor(compiled, prompt_len=inputs.shape[1])
    out = lm.model.generate(inputs, attention_mask=torch.ones_like(inputs), max_new_tokens=40, num_beams=2,
                            logits_processor=LogitsProcessorList([proc]), eos_token_id=list(vocab.stop_ids),
                            pad_token_id=vocab.eos_id)
    print(lm.tokenizer.decode(out[0, inputs.shape[1]:], skip_special_tokens=True))

A row's grammar state depends only on the tokens generated in it (one grammar for every row), so
the processor finds each row's matcher from the row's own generated tokens at every call, not from
the row's position: beam search reorders and duplicates rows between steps, and a row whose
parent was row 3 one step ago gets a copy of that parent's matcher with its new token consumed.
Any number of rows works (a batch, `num_beams`, `num_return_sequences`, sampling). A token the
grammar refuses in a live row is a MatcherError naming the row and the token (something after
this processor changed the scores, or generate() ignored -inf); the tokens after a row's stop
token (generate's padding of a finished row) are not the grammar's. Pass every stop id as
`eos_token_id` so that generation ends when the grammar allows nothing else.

A processor serves one prompt length: a call whose sequences are not longer than the last call's
starts a new generate() (its matchers are dropped), and a new generate() whose prompt is not
`prompt_len` tokens long is a MatcherError saying to build a processor for it.
"""

from __future__ import annotations

from transformers import LogitsProcessor

from railcall.bitmask import allocate_bitmask, apply_bitmask
from railcall.errors import MatcherError
from railcall.matcher import CompiledGrammar, Matcher


class RailcallLogitsProcessor(LogitsProcessor):
    def __init__(self, compiled: CompiledGrammar, prompt_len: int, batch_size: int | None = None):
        """`prompt_len`: the (padded) prompt length of the generate() calls this serves.
        `batch_size` is accepted for callers of the per-row version; rows are counted per call."""
        self.compiled = compiled
        self.prompt_len = prompt_len
        self.stops = frozenset(compiled.vocab.stop_ids)
        self._matchers: dict[tuple[int, ...], Matcher] = {}  # the last call's rows, by their generated tokens
        self._length: int | None = None  # the sequences' length at the last call
        self.bitmask = None

    def _matcher(self, generated: tuple[int, ...], row: int) -> Matcher:
        """The matcher of a row that generated `generated` (up to and with its first stop token):
        the last call's parent copied with one token more, or a new one fed every token."""
        m = self._matchers.get(generated)
        if m is not None:
            return m
        parent = self._matchers.get(generated[:-1]) if generated else None
        todo = generated[-1:] if parent is not None else generated
        m = parent.copy() if parent is not None else Matcher(self.compiled)
        for k, t in enumerate(todo):
            if not m.consume_token(t):
                at = len(generated) - len(todo) + k
                raise MatcherError(
                    f"row {row}: generated token {t} (position {at}) is refused by the grammar "
                    f"({m.error_message or 'not legal here'}); a processor after railcall's or a sampler that "
                    f"ignores -inf chose it: put RailcallLogitsProcessor last and sample from its scores")
        return m

    def __call__(self, input_ids, scores):
        length = input_ids.shape[1]
        if self._length is None or length <= self._length:  # a new generate(): new rows, new matchers
            if length != self.prompt_len:
                raise MatcherError(
                    f"the logits processor was built for prompts of {self.prompt_len} tokens but generate() "
                    f"started with {length}: build one with prompt_len={length} for this prompt")
            self._matchers = {}
        self._length = length
        if self.bitmask is None or self.bitmask.shape[0] != scores.shape[0]:
            self.bitmask = allocate_bitmask(scores.shape[-1], batch=scores.shape[0])
        rows: dict[tuple[int, ...], Matcher] = {}
        for i in range(scores.shape[0]):
            generated = input_ids[i, self.prompt_len:].tolist()
            stop = next((k for k, t in enumerate(generated) if t in self.stops), None)
            key = tuple(generated if stop is None else generated[: stop + 1])
            m = rows.get(key) or self._matcher(key, i)
            rows[key] = m
            m.fill_bitmask(self.bitmask, i)
        self._matchers = rows
        apply_bitmask(scores, self.bitmask)
        return scores
