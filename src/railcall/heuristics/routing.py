"""Tool choice by whole-name likelihood (`routing="scored"`).

Under the grammar the model picks a tool name one token at a time, so the first token decides:
a name whose first token is unlikely loses even where the model, asked about whole names, would
prefer it (`lookup_price` against `list_items` when the model starts `l`...`ookup` badly but
`list` well). Scored routing asks the whole question: where the matcher stands at the name
position, every name the grammar still allows is scored by the log-probability of its complete
token sequence, and the best (temperature 0) is written, or one is sampled from
softmax(score / temperature).

    score(name) = sum_i log p(t_i | prompt, output, t_<i)         the name's tokens
                + log P(next byte is the terminator | ..., t_1..t_k)

The last term is the mass of every token that starts with the byte ending the name (`"` for
the JSON formats, `(` for pythonic), so `read` is not preferred to `read_file` just for being
shorter. The name's tokens are its canonical tokenization alone (a tokenizer could have merged
its last piece with the terminator: an approximation). Log-probabilities are the model's own
(unmasked): the ranking is the model's judgement of whole names.

Where the name position is: a matcher state whose every thread waits inside the names' trie
(the Select the call format builds from the tool table; recognised by its keys, which are the
format's name keys). States are cached per router. A state with other threads too (free text
beside a call) is left to ordinary sampling. Under a turn matcher (tool_choice "auto",
`railcall.runtime.regions`) the same is asked of its grammar phase, once a call has started.

Cost, per routed call with N candidate names: one forward pass over the names' trie
(`railcall.models.backend.BranchTree`): the names' token sequences laid out as one flat sequence of
the trie's nodes (a shared prefix such as `get_` once), each node at position (sequence length +
its depth) and seeing the cached prefix, its ancestors and itself only, so every node's logits
are those its name alone would have had. On the single-sequence backend the pass runs on the
sequence's KV, which is cropped back after (`TransformersBackend.branch_logits`); in the batched
loop on a copy of the row's KV (`TransformersBatch.branch_logits`). Then the usual pass feeds the
chosen name. Measured on SmolLM2-135M, 2 shared CPU cores, a BFCL `multiple` prompt of 328
tokens with 3 names (24 name tokens, 15 trie nodes): one decode step 63 ms, the trie pass 140 ms,
one pass per name (the way before it) 350 ms. On BFCL `multiple`'s first 20 tasks (`railcall
eval bfcl`, batched, both conditions) a scored run took 1.47 s per task against greedy's 1.42.
The scorer is whatever runs the row: a router built with `score=None` is bound to the backend by
`generate` and to the row's batch by `BatchLoop.add`.

Matched routing (`routing="matched"`, `NameRouter.for_tools(..., prefer=...)`): before the
scoring, the candidates narrow to the tools `matching_tools` finds for the request, the ones
whose name and description share the most words with it (each word weighted by how few of the
table's tools have it, a name's words twice a description's); the model's whole-name likelihood
decides among those that tie, and among all where none shares a word. A 135M model picks the
wrong tool of two to four in a third of BFCL's `multiple` tasks ("the LCM of 18 and 12" ->
`math.gcd`); the words pick the gold one alone in 187 of its 200 (and tie it with another in
12). It is a lexical heuristic: it helps where a request uses the tools' own words, and a
request that names a tool by a synonym falls back to the model only where no tool shares a word.

Per request (a router keeps per-request state caches); built for one tool table and format.
"""

from __future__ import annotations

import math
import re
from typing import Callable, Sequence

import numpy as np

from railcall.bitmask import log_softmax

# branches (token lists) -> for each, the (len(branch), width) logits after each of its tokens
Scorer = Callable[[list[list[int]]], list]


class NameRouter:
    """Chooses whole tool names at the name position (see the module docstring). Per request."""

    def __init__(self, vocab, name_keys: dict[bytes, str], score: Scorer | None = None, *,
                 temperature: float = 0.0, prefer: Sequence[str] = ()):
        self.vocab = vocab
        self.prefer = frozenset(prefer)  # matched routing: the names chosen among first (module docstring)
        self.keys = name_keys  # the format's name key (e.g. b'get_weather"') -> the tool name
        self.score = score  # None: bound by the loop that runs the row (module docstring)
        self.temperature = temperature
        self._selects: dict[int, tuple] = {}  # id(Select) -> (the Select, {trie node: [key, depth]...} or None)
        self._at: dict[int, list | None] = {}  # matcher state -> its candidates (None: not a name position)
        self._term_ids: dict[int, np.ndarray] = {}  # terminator byte -> ids of the tokens starting with it
        self.routed = 0  # calls routed (for tests and traces)
        self.passes = 0  # forward passes spent scoring (one per routed call)

    @classmethod
    def for_tools(cls, vocab, tools: Sequence, fmt, score: Scorer | None = None, *,
                  temperature: float = 0.0, values: bool = False, prefer: Sequence[str] = ()) -> "NameRouter":
        """A router for the grammar `tool_grammar(tools, fmt)` builds. With `values`, each
        top-level argument whose schema is an enum of strings is chosen the same way, by the
        likelihood of each whole value (its JSON string: the JSON formats only; a pythonic
        call's values are left to the tokens). `prefer`: the tool names chosen among first
        where the grammar allows any of them (matched routing: `matching_tools`)."""
        from railcall.grammar.ir import json_literal
        from railcall.grammar.tools import FORMATS

        fmt = FORMATS[fmt]() if isinstance(fmt, str) else fmt
        keys = {fmt.name_key(t.name): t.name for t in tools}
        if values and fmt.name != "pythonic":
            for t in tools:
                for arg, schema in t.parameters.get("properties", {}).items():
                    choices = schema.get("enum") if isinstance(schema, dict) else None
                    if isinstance(choices, list) and all(isinstance(c, str) for c in choices):
                        keys.update((json_literal(c), f"{t.name}.{arg}={c}") for c in choices)
        return cls(vocab, keys, score, temperature=temperature, prefer=prefer)

    # -- where the name position is ------------------------------------------------------------
    def candidates(self, matcher) -> list[tuple[str, bytes]] | None:
        """(tool name, the bytes of its key still to write) for every name allowed here, or None
        where the matcher is not at a name position."""
        if matcher.is_error():
            return None
        phase = getattr(matcher, "phase", None)  # a TurnMatcher (tool_choice "auto"): its call phase
        if phase is not None:
            if getattr(phase, "kind", None) != "grammar":
                return None
            matcher = phase.m
        s = matcher.state
        if s in self._at:
            return self._at[s]
        out: list | None = []
        for ins, loc, _ in matcher.g.threads(s):
            paths = self._name_paths(ins)
            if paths is None:
                out = None
                break
            for key, nodes in paths:
                if loc in nodes:
                    out.append((self.keys[key], key[nodes.index(loc):]))
        if out is not None and len(out) < 2:
            out = None  # one name left: the grammar forces it (fast-forward)
        self._at[s] = out
        return out

    def _name_paths(self, ins):
        """For a Select over name keys: [(key, [trie node before each byte])]; None otherwise."""
        from railcall.grammar.instructions import Select

        if type(ins) is not Select:
            return None
        hit = self._selects.get(id(ins))
        if hit is None:
            paths, stack = [], [(0, b"", [])]
            while stack:
                node, key, nodes = stack.pop()
                if node in ins.terminal and node != 0:
                    paths.append((key, nodes))
                for b, child in ins.children[node].items():
                    stack.append((child, key + bytes([b]), nodes + [node]))
            ok = bool(paths) and all(k in self.keys for k, _ in paths)
            hit = self._selects[id(ins)] = (ins, paths if ok else None)  # the Select kept: its id stays unique
        return hit[1]

    # -- scoring -------------------------------------------------------------------------------
    def _tokens(self, data: bytes) -> list[int]:
        v = self.vocab
        if v.encoder is not None and data:
            try:
                ids = v.encode(data.decode("utf-8"))
                if v.decode(ids) == data:
                    return ids
            except UnicodeDecodeError:
                pass
        return v.greedy_tokenize(data) or []

    def _terminator_ids(self, b: int) -> np.ndarray:
        ids = self._term_ids.get(b)
        if ids is None:
            v = self.vocab
            ids = self._term_ids[b] = np.array([i for i, t in enumerate(v.token_bytes)
                                                if t[:1] == bytes([b]) and not v.is_special(i)], dtype=np.int64)
        return ids

    def _end_logp(self, logits, b: int) -> float:
        logp = log_softmax(logits)
        ids = self._terminator_ids(b)
        ids = ids[ids < logp.shape[-1]]
        if not len(ids):
            return float("-inf")
        if isinstance(logp, np.ndarray):
            x = logp[ids].astype(np.float64)
            top = x.max()
            return float(top + np.log(np.exp(x - top).sum())) if np.isfinite(top) else float(top)
        import torch

        return float(torch.logsumexp(logp[torch.from_numpy(ids)], dim=0))

    def route(self, matcher, logits, gen=None, budget: int | None = None):
        """At a name position: (the tokens of the chosen name, their log-probabilities); None
        elsewhere. `logits` are the (width,) logits of the next token; `budget` the tokens left.
        The caller feeds the tokens (they are legal: each spells part of an allowed name)."""
        cands = self.candidates(matcher)
        if cands is None:
            return None
        if self.prefer:
            cands = [c for c in cands if c[0] in self.prefer] or cands
        names = [rest[:-1] for _, rest in cands]  # the name's bytes still to write, terminator apart
        branches = [self._tokens(n) for n in names]
        if budget is not None and max(len(b) + 1 for b in branches) > budget:
            return None  # near the ceiling: the close logic decides, not the router
        if self.score is None:
            raise TypeError("this NameRouter has no scorer: pass score=, or run it through generate or a BatchLoop")
        scored = [b for b in branches if b]
        rows = self.score(scored) if scored else []
        self.passes += 1 if scored else 0
        base = log_softmax(logits)
        scores, per_token, it = [], [], iter(rows)
        for (_, rest), toks in zip(cands, branches):
            lps = []
            if toks:
                r = next(it)
                lp = log_softmax(r)
                lps = [float(base[toks[0]])] + [float(lp[i, t]) for i, t in enumerate(toks[1:])]
                end = self._end_logp(r[-1], rest[-1])
            else:
                end = self._end_logp(logits, rest[-1])
            per_token.append(lps)
            scores.append(sum(lps) + end)
        s = np.asarray(scores, dtype=np.float64)
        if self.temperature > 0 and np.isfinite(s).any():
            if isinstance(logits, np.ndarray):  # the llama.cpp backend: numpy all through
                p = np.exp((s - s.max()) / self.temperature)
                k = int((gen if gen is not None else np.random.default_rng()).choice(len(s), p=p / p.sum()))
            else:
                import torch

                t = torch.from_numpy(s)
                k = int(torch.multinomial(torch.softmax(t / self.temperature, dim=0), 1, generator=gen))
        else:
            k = int(np.argmax(s))
        toks, lps = branches[k], per_token[k]
        if any(n != names[k] and n.startswith(names[k]) for n in names):
            # another allowed name goes on from this one: write the terminator too, or the
            # model could still turn `read` into `read_file`
            toks = toks + self._tokens(cands[k][1][-1:])
            lps = lps + [0.0] * (len(toks) - len(lps))
        self.routed += 1
        return toks, lps


_STOP = frozenset("a an the of for in on to and or is are be by with what how my i me can you from at as it "
                  "this that which do does get find calculate given".split())


def _words(text: str) -> set[str]:
    """Lower-case words of `text` (camelCase and snake_case split, a plural's s dropped, common
    words left out)."""
    out = set()
    for w in re.split(r"[^a-z0-9]+", re.sub(r"([a-z])([A-Z])", r"\1 \2", text).lower()):
        if w and w not in _STOP:
            out.add(w[:-1] if len(w) > 3 and w.endswith("s") else w)
    return out


def matching_tools(tools: Sequence, text: str) -> list[str]:
    """The names of the tools whose name and description share the most words with `text`
    (module docstring, matched routing); [] where no tool shares a word, or all tie."""
    asked = _words(text)
    docs = [(_words(t.name), _words(t.description)) for t in tools]
    held = {w: sum(1 for n, d in docs if w in n or w in d) for w in asked}
    scores = [sum((2.0 if w in n else 1.0) * math.log(1 + len(docs) / held[w]) for w in asked if w in n or w in d)
              for n, d in docs]
    best = max(scores, default=0.0)
    chosen = [t.name for t, s in zip(tools, scores) if s == best and s > 0]
    return [] if len(chosen) == len(tools) else chosen


def branch_scorer(backend) -> Scorer:
    """The backend's branch scoring (`branch_logits`), or a clear error where it has none."""
    fn = getattr(backend, "branch_logits", None)
    if fn is None:
        raise TypeError(f"{type(backend).__name__} cannot score branches (no branch_logits): scored routing "
                        "needs a backend that can run tokens on a copy of its cache; use routing='greedy'")
    return fn
