"""A request's turn: tool_choice's mode and the model's delimiters as a Turn (railcall.grammar.turn).

`answer_matcher()` says the turn in the grammar's terms and returns its matcher
(`railcall.matcher.turn.TurnMatcher`, with the Matcher verbs):

    mode "required":  [<think>] reasoning </think>  ANSWER
    mode "auto":      [<think>] reasoning </think>  ( content TRIGGER CALL )* content STOP
    mode "none":      [<think>] reasoning </think>  content STOP

The reasoning part only with `reasoning=True`; its open is left out when the prompt already
opened it. The delimiters come from `railcall.output.Delimiters`, the object the output parser
reads, so the grammar and the parser end reasoning and start calls at the same place. The "auto"
trigger is the tool-call open token where the call grammar starts with it; else a trigger text:
the open's text (Hermes without a `<tool_call>` token) or `{"tool":"` (the JSON wire format),
the latter with any JSON whitespace where JSON allows it (`{\\n  "tool": "`, as a model writes
it unprompted; `output.json_gaps`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from railcall.errors import GrammarError
from railcall.grammar.turn import Free, Reasoning, Tag, Trigger, Turn
from railcall.matcher import MAX_STRING, CompiledGrammar
from railcall.matcher.turn import TurnMatcher, starts_with, turn_matcher
from railcall.output import JSON_CALL_TRIGGER, Delimiters, json_gaps
from railcall.vocab import Vocabulary

MODES = ("none", "auto", "required")
# A request's shape -> its Turn: the server asks for the same few turns over and over, and the
# trigger choice (a walk of the call grammar) is made once per shape.
_SHAPES: "OrderedDict[tuple, Turn]" = OrderedDict()
_LOCK = threading.Lock()


def answer_matcher(vocab: Vocabulary, answer: CompiledGrammar | None, delimiters: Delimiters, *,
                   mode: str = "required", reasoning: bool = False, reasoning_budget: int | None = None,
                   reasoning_opened: bool = False, trigger: str | None = None, tags: tuple = (),
                   max_string: int | None = None) -> TurnMatcher:
    """A per-request matcher for one turn (see the module docstring for the three modes).

    vocab             the model's Vocabulary; `answer` must be compiled against it.
    answer            the answer grammar: a tool-call grammar or a response_format schema
                      (CompiledGrammar), or None for free text ("none" mode only).
    delimiters        `Delimiters.from_vocab(vocab, ...)`, the same object the OutputParser uses.
    reasoning         a reasoning region first; `reasoning_opened`: the prompt already wrote its
                      open delimiter; `reasoning_budget`: tokens of reasoning before its close is
                      forced (None: no limit).
    trigger           "auto" only: the text that starts a call, overriding the choice made from
                      the delimiters and the call grammar.
    tags              "none" and "auto": more tagged parts in the free text (`Tag`s: a structural
                      tag's, `railcall.grammar.turn.structural_tag`), beside the call.
    max_string        the string cap the grammars are compiled with (default: the answer's).
    """
    if mode not in MODES:
        raise GrammarError(f"unknown mode {mode!r}; use one of {', '.join(MODES)}")
    if answer is None and mode != "none":
        raise GrammarError(f"mode {mode!r} needs an answer grammar; pass mode='none' for free text")
    if answer is not None and answer.vocab is not vocab and answer.vocab.key != vocab.key:
        raise GrammarError("the answer grammar was compiled against another vocabulary; compile it with this one")
    if reasoning and (delimiters.reasoning_open is None or delimiters.reasoning_close is None):
        raise GrammarError("reasoning=True needs reasoning delimiters; resolve Delimiters with reasoning=(open, close)")
    if reasoning_budget is not None and reasoning_budget < 0:
        raise GrammarError(f"reasoning_budget must be >= 0 tokens, not {reasoning_budget}")
    if max_string is None:
        max_string = answer.max_string if answer is not None else MAX_STRING
    shape = (vocab.key, answer.grammar.key if answer is not None else None, mode, reasoning, reasoning_budget,
             reasoning_opened, trigger, tuple((t.trigger, t.grammar.key) for t in tags), delimiters)
    with _LOCK:
        turn = _SHAPES.get(shape)
        if turn is not None:
            _SHAPES.move_to_end(shape)
    if turn is None:
        turn = _turn(answer, delimiters, mode, reasoning, reasoning_budget, reasoning_opened, trigger, tags)
        with _LOCK:
            _SHAPES[shape] = turn
            while len(_SHAPES) > 512:
                _SHAPES.popitem(last=False)
    return turn_matcher(turn, vocab, max_string=max_string)



def _turn(answer, delimiters: Delimiters, mode: str, reasoning: bool, reasoning_budget, reasoning_opened: bool,
          trigger, tags) -> Turn:
    if mode == "required":
        if tags:
            raise GrammarError("tagged parts live in free text, and mode 'required' has none; use mode 'auto' or 'none'")
        body = answer.grammar
    elif mode == "none":
        body = Free(tuple(tags))
    else:
        body = Free((Tag(_auto_trigger(answer, delimiters, trigger), answer.grammar),) + tuple(tags))
    think = None
    if reasoning:
        think = Reasoning(delimiters.reasoning_close.text,
                          None if reasoning_opened else delimiters.reasoning_open.text, reasoning_budget)
    return Turn(body, think, tuple(d.text for d in delimiters.all() if d.token_id is not None))


def _auto_trigger(answer: CompiledGrammar, d: Delimiters, override: str | None) -> Trigger:
    """What starts a call in "auto" mode: the call-open token, its text, or the JSON wire
    format's `{"tool":"`, whichever the call grammar starts with."""
    candidates: list[Trigger] = []
    if override is not None:
        candidates.append(Trigger(override, gaps=json_gaps(override) if override == JSON_CALL_TRIGGER else frozenset()))
    else:
        if d.call_open is not None:
            if d.call_open.token_id is not None:
                candidates.append(Trigger(d.call_open.text, token=True))
            candidates.append(Trigger(d.call_open.text))
        candidates.append(Trigger(JSON_CALL_TRIGGER, gaps=json_gaps(JSON_CALL_TRIGGER)))
    for t in candidates:
        if starts_with(answer, d.call_open.token_id if t.token else None, b"" if t.token else t.text.encode()):
            return t
    raise GrammarError(
        "mode 'auto' needs to know where a call starts, and the call grammar starts with none of "
        f"{[d.call_open.text if d.call_open else None, JSON_CALL_TRIGGER] if override is None else override!r}; "
        "pass trigger='<the text every call starts with>'")
