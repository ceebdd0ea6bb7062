"""Scored routing on a scripted model: the tool whose first token is the likelier one is not the
tool the model prefers as a whole name; greedy routing follows the first token, scored routing
the whole name."""

from __future__ import annotations

import math

import pytest

from railcall.runtime.decode import SamplingParams, generate
from railcall.grammar.tools import Tool, tool_grammar
from railcall.matcher import CompiledGrammar, Matcher
from railcall.output import Delimiters, OutputParser
from railcall.heuristics.routing import NameRouter, branch_scorer
from railcall.vocab import Vocabulary

END = "<|end|>"
TOOLS = [Tool("lookup"), Tool("search"), Tool("sum", "", {"type": "object", "properties": {"x": {"type": "integer"}},
                                                           "required": ["x"]})]


def vocab() -> Vocabulary:
    return Vocabulary.from_pieces([bytes([b]) for b in range(256)], specials=[END], stop=[END], name="route-bytes")


class Scripted:
    """Logits as a function of the text written so far. At the name position the model gives
    `l` 0.6 and `s` 0.4; after `l` it has no idea how to go on (uniform over bytes: "lookup" as a
    whole is ~1e-12 likely); after `s` it writes "search" with near certainty. Elsewhere it
    follows `target` and then the stop token."""

    def __init__(self, v: Vocabulary, opener: str, target: str):
        import torch

        self.v, self.opener, self.target = v, opener.encode(), target.encode()
        self.width = v.logits_width
        self.written = b""
        self.torch = torch
        self.branches = 0

    def start(self, prompt):
        self.written = b""
        return self._logits(b"")

    def feed(self, tokens):
        rows = []
        for t in tokens:
            self.written += self.v.token_bytes[t]
            rows.append(self._logits(self.written))
        return self.torch.stack(rows)

    def branch_logits(self, branches):
        self.branches += len(branches)
        out = []
        for b in branches:
            w, rows = self.written, []
            for t in b:
                w += self.v.token_bytes[t]
                rows.append(self._logits(w))
            out.append(self.torch.stack(rows))
        return out

    def _logits(self, w: bytes):
        t = self.torch
        out = t.full((self.width,), -30.0)
        if w == self.opener:
            out[ord("l")], out[ord("s")] = math.log(0.6), math.log(0.4)
        elif w == self.opener + b"l":
            out[:256] = 0.0  # uniform: the model does not know this name
        elif self.target.startswith(w) and len(w) < len(self.target):
            out[self.target[len(w)]] = 0.0
        elif w.startswith(self.target):
            out[self.v.stop_ids[0]] = 0.0
        else:
            out[:256] = 0.0
        return out


CASES = [("json", '{"tool":"', '{"tool":"search","args":{}}'),
         ("openai", '{"name":"', '{"name":"search","arguments":{}}'),
         ("pythonic", "[", "[search()]")]


def run(fmt, opener, target, routing, temperature=0.0, seed=None):
    v = vocab()
    backend = Scripted(v, opener, target)
    m = Matcher(CompiledGrammar(tool_grammar(TOOLS, fmt), v))
    router = None
    if routing == "scored":
        router = NameRouter.for_tools(v, TOOLS, fmt, branch_scorer(backend), temperature=temperature)
    g = generate(backend, v, [0], m, SamplingParams(max_tokens=40, temperature=temperature, seed=seed), router=router)
    p = OutputParser(Delimiters(), call_format=fmt, tool_choice="required")
    for t in g.tokens:
        p.feed(t, v.token_text(t))
    p.finish()
    return g, p.result().tool_calls, router, backend


@pytest.mark.parametrize("fmt, opener, target", CASES)
def test_greedy_follows_the_first_token_scored_the_whole_name(fmt, opener, target):
    g, calls, _, _ = run(fmt, opener, target, "greedy")
    assert [c.name for c in calls] == ["lookup"]  # `l` was likelier than `s`
    g, calls, router, backend = run(fmt, opener, target, "scored")
    assert [c.name for c in calls] == ["search"], g.text
    assert router.routed == 1 and backend.branches == 3  # the three names scored once
    assert g.text == target


def test_scored_routing_records_the_names_tokens():
    g, _, router, _ = run("json", *CASES[0][1:], "scored")
    name_steps = [s for s in g.steps if not s.forced]
    assert "".join(s.text for s in name_steps) == "search"
    assert all(s.logprob is not None and s.logprob <= 0 for s in name_steps)
    assert g.forward_passes >= router.passes


def test_sampled_routing_follows_the_scores():
    # search (~0.4) against lookup (~1e-12) and sum (~0): sampling at temperature 1 picks search
    names = {run("json", *CASES[0][1:], "scored", temperature=1.0, seed=s)[1][0].name for s in range(5)}
    assert names == {"search"}


def test_candidates_only_at_the_name_position(bytes_vocab):
    tools = [Tool("read_file"), Tool("read_dir"), Tool("write")]
    m = Matcher(CompiledGrammar(tool_grammar(tools, "json"), bytes_vocab))
    r = NameRouter.for_tools(bytes_vocab, tools, "json", lambda b: [])
    assert r.candidates(m) is None  # before `{"tool":"`
    assert m.consume_bytes(b'{"tool":"')
    assert sorted(r.candidates(m)) == [("read_dir", b'read_dir"'), ("read_file", b'read_file"'), ("write", b'write"')]
    assert m.consume_bytes(b"read_")
    assert sorted(r.candidates(m)) == [("read_dir", b'dir"'), ("read_file", b'file"')]
    assert m.consume_bytes(b'f')
    assert r.candidates(m) is None  # one name left: the grammar forces it
    assert m.consume_bytes(b'ile","args":{}}')
    assert r.candidates(m) is None


def test_a_name_that_is_a_prefix_of_another_is_closed_when_chosen(bytes_vocab):
    tools = [Tool("read"), Tool("read_file")]
    m = Matcher(CompiledGrammar(tool_grammar(tools, "pythonic"), bytes_vocab))
    import torch

    width = bytes_vocab.logits_width

    def score(branches):  # every byte equally likely: the shorter name wins
        return [torch.zeros((len(b), width)) for b in branches]

    r = NameRouter.for_tools(bytes_vocab, tools, "pythonic", score)
    assert m.consume_bytes(b"[")
    toks, _ = r.route(m, torch.zeros(width))
    assert bytes_vocab.decode(toks) == b"read("


def test_scored_values_choose_an_enumerated_argument_by_its_whole_value():
    tools = [Tool("open", "", {"type": "object", "properties": {"path": {"type": "string", "enum": [
        "lookup.txt", "search.txt", "sum.txt"]}}, "required": ["path"]})]
    v = vocab()

    def run_values(values):
        # the same script with the choice at the path: `"l` 0.6, `"s` 0.4, only "search.txt" known
        backend = Scripted(v, '{"tool":"open","args":{"path":"', '{"tool":"open","args":{"path":"search.txt"}}')
        m = Matcher(CompiledGrammar(tool_grammar(tools, "json"), v))
        router = NameRouter.for_tools(v, tools, "json", branch_scorer(backend), values=values)
        g = generate(backend, v, [0], m, SamplingParams(max_tokens=60), router=router)
        return g.text, router

    text, router = run_values(False)
    assert text.startswith('{"tool":"open","args":{"path":"l') and router.routed == 0  # token by token: `l` first
    text, router = run_values(True)
    assert text == '{"tool":"open","args":{"path":"search.txt"}}' and router.routed == 1
    # the keys: every string enum of a top-level argument, as its JSON string; not in pythonic
    keys = NameRouter.for_tools(v, tools, "json", values=True).keys
    assert keys[b'"sum.txt"'] == "open.path=sum.txt" and b'open"' in keys
    assert b'"sum.txt"' not in NameRouter.for_tools(v, tools, "pythonic", values=True).keys


def test_matched_routing_chooses_among_the_tools_the_request_names():
    """prefer: the model's likeliest whole name is `search`, but the request's words point at
    `sum`; matched routing writes `sum` (then the model's own arguments), and where the
    preferred names are not allowed here (a value position) the choice is the model's."""
    v = vocab()
    backend = Scripted(v, '{"tool":"', '{"tool":"sum","args":{"x":4}}')
    m = Matcher(CompiledGrammar(tool_grammar(TOOLS, "json"), v))
    router = NameRouter.for_tools(v, TOOLS, "json", branch_scorer(backend), prefer=["sum"])
    g = generate(backend, v, [0], m, SamplingParams(max_tokens=40), router=router)
    assert g.text == '{"tool":"sum","args":{"x":4}}' and router.routed == 1
    assert backend.branches == 1  # only the preferred name was scored


@pytest.mark.parametrize("text, chosen", [
    ("What is the LCM of 18 and 12?", ["math.lcm"]),
    ("Find the greatest common divisor of 12 and 18", ["math.gcd"]),
    ("please help", []),  # no tool shares a word: the model chooses among all
    ("a math question", []),  # every tool shares it: no narrowing
])
def test_matching_tools_weigh_the_words_a_request_shares_with_each_tool(text, chosen):
    from railcall.heuristics.routing import matching_tools

    tools = [Tool("math.gcd", "Greatest common divisor of two integers."),
             Tool("math.lcm", "Least common multiple (LCM) of two integers."),
             Tool("math.sqrt", "Square root of a number.")]
    assert matching_tools(tools, text) == chosen
