"""CompiledGrammar (shared) and Matcher (per request): token masks from a byte grammar.

Modules, in the order a mask is made:
- `automaton`: the DFA over thread sets with its masks and precomputation (`Automaton`), one
  class built from four layers, each a module:
  - `content_keys`: content keys, which let states of any grammar share a mask
    (`ContentKeyBuilder`);
  - `completion`: forced tokens and the forced finish (`ForcedCompletions`);
  - `transitions`: states interned from thread sets, byte and special-token transitions, the
    walk of the token trie (`TransitionTable`);
  - `legal`: the tokens one thread may take, walked through the indexes (`ThreadLegalTokens`);
- `entries`: mask entries and the per-vocabulary caches that hold them;
- `indexes`: per-vocabulary indexes (tokens inside JSON strings and numbers, token reach);
- `matcher`: `CompiledGrammar`, `Matcher` and the LRU of compiled grammars.

Lifecycles:
- `Automaton` is built once per vocabulary (and string cap) and shared by every grammar on it:
  a lazily built DFA over thread sets (see grammar.instructions), its transition table, per-state
  masks and token transitions. Thread sets mean the same thing in every grammar (instructions
  are continuation-passing and shared), so grammars that share tools share their states.
  Masks are also cached per vocabulary by a content key (`MaskCache`).
- `CompiledGrammar` is built once per (grammar, vocabulary) and shared by every request that uses
  that grammar: its compiled program and its start state in the automaton.
  `compiled_grammar()` keeps an LRU of them keyed by grammar content, and by default prewarms
  each once (every grammar position's content keys and first mask).
- `Matcher` is built per request. It holds the current DFA state, the history for rollback, and
  the error flag. It is cheap (a list and a few ints).
- All that is shared per vocabulary (fragments, automata, masks, content keys) is one store
  (`entries.VocabCache`) with a byte budget (`set_memory_budget`, 512 MiB by default): over it,
  new grammars start a fresh store and the old one is freed when its last request ends (see
  `matcher.matcher`'s docstring). `memory_used` is the current store's estimate.

How a mask is computed (once per cache key, then a lookup and a copy):
- A DFA state is a frozen set of threads; its transitions are a row of an (n_states, 256) int32
  table, filled entry by entry as tokens are walked.
- Generic states use a vectorised walk: every candidate token's j-th byte is gathered from the
  vocabulary's byte matrix and pushed through the table at once, so the Python cost is one numpy
  step per byte position, not one per token. The first step only looks at tokens whose first
  byte the state allows (the vocabulary groups tokens by first byte), which makes literal states
  -- most of a tool call -- cost a few dozen token checks.
- A state inside a JSON string body (a single string thread) uses a per-vocabulary precomputation:
  for each token, whether it stays inside the string, how many characters it adds, or where it
  closes the string. Only the tokens that close the string are walked further, through what
  follows the string.
- Masks are cached by a content key (`Automaton._state_content_key`): what a state accepts, as
  far as some token reaches. Coarsening (string positions far from the cap share a mask) is one
  case of it; states of different tools, tables and grammars with the same key share too.
"""

from railcall.matcher.automaton import Automaton
from railcall.matcher.entries import MaskCache, entry_dense, entry_ids, vocab_cache
from railcall.matcher.indexes import fill_stops, number_margin, prepare_vocabulary, quote_rests
from railcall.matcher.matcher import (
    MAX_STRING, CompiledGrammar, Matcher, clear_caches, compiled_grammar, memory_used, set_memory_budget,
)
from railcall.matcher.transitions import DEAD, UNBUILT

__all__ = [
    "DEAD", "MAX_STRING", "UNBUILT", "Automaton", "CompiledGrammar", "MaskCache", "Matcher", "clear_caches",
    "compiled_grammar", "entry_dense", "entry_ids", "fill_stops", "memory_used", "number_margin",
    "prepare_vocabulary", "quote_rests", "set_memory_budget", "vocab_cache",
]
