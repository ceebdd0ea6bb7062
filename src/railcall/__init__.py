"""railcall: grammar-constrained tool calling.

The set of valid calls is compiled, from the live tool table, into a grammar enforced over the
model's tokens: every token that would break the call is masked before sampling, so a malformed
or forbidden call is unreachable rather than rejected. The grammar guarantees the syntax; the
model supplies the semantics.

    vocab = Vocabulary.from_hf(tokenizer)                        # once per tokenizer
    compiled = compiled_grammar(tool_grammar(tools), vocab)      # once per tool table (cached)
    # or schema_grammar(schema), lark_grammar(text), gbnf_grammar(text), regex_grammar(pattern)
    matcher = Matcher(compiled)                                  # once per request
    # or turn_matcher(Turn(structural_tag(...)), vocab): free text with tagged parts (a Turn)
    bitmask = allocate_bitmask(vocab.logits_width)
    matcher.fill_bitmask(bitmask); apply_bitmask(logits, bitmask)  # each step, then sample
    matcher.consume_token(token_id)
"""

from railcall.version import __version__

from railcall import speedups as _speedups

_speedups.guard()  # before the engine's modules load: a compiled one is used only if built from this source

from railcall.bitmask import allocate_bitmask, apply_bitmask
from railcall.errors import GrammarError, MatcherError, ModelError, RailcallError, SchemaError, VocabularyError
from railcall.grammar.cfg import regex_grammar
from railcall.grammar.gbnf import gbnf_grammar
from railcall.grammar.lark import lark_grammar
from railcall.grammar.schema import SchemaOptions, schema_grammar
from railcall.grammar.tools import Tool, read_only_view, tool_grammar
from railcall.grammar.turn import Turn, structural_tag
from railcall.matcher import CompiledGrammar, Matcher, compiled_grammar
from railcall.matcher.turn import turn_matcher
from railcall.output import Delimiters, OutputParser
from railcall.runtime.regions import answer_matcher
from railcall.vocab import Vocabulary

__all__ = [
    "CompiledGrammar",
    "Delimiters",
    "GrammarError",
    "Matcher",
    "MatcherError",
    "ModelError",
    "OutputParser",
    "RailcallError",
    "SchemaError",
    "SchemaOptions",
    "Tool",
    "Turn",
    "Vocabulary",
    "VocabularyError",
    "__version__",
    "allocate_bitmask",
    "answer_matcher",
    "apply_bitmask",
    "compiled_grammar",
    "gbnf_grammar",
    "lark_grammar",
    "read_only_view",
    "regex_grammar",
    "schema_grammar",
    "structural_tag",
    "tool_grammar",
    "turn_matcher",
]
