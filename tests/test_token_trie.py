"""The vocabulary's token trie (matcher.indexes.token_trie, and token_nodes: the same trie depth
first) and the first-visit walk over it (`_walk_from`: `_walk_nodes` where the matcher runs
compiled, `_walk_levels` from source): the trie holds every text token once, at the node its
bytes spell; both walks find exactly the tokens a token-by-token check accepts, from states of
general grammars (where a state's text may run anywhere), JSON Schema and tool tables."""

from __future__ import annotations

import random

import numpy as np
import pytest

from railcall import Matcher, compiled_grammar, gbnf_grammar, lark_grammar, regex_grammar
from railcall.bench.grammars import CALC_LARK, REGEXES, SHELL_LARK, SQL_LARK
from railcall.grammar.schema import schema_grammar
from railcall.matcher.indexes import runs, token_nodes, token_trie


def test_runs_concatenates_ranges():
    assert runs(np.array([3, 0, 7]), np.array([5, 0, 9])).tolist() == [3, 4, 7, 8]
    assert runs(np.array([], dtype=np.int64), np.array([], dtype=np.int64)).size == 0


@pytest.mark.parametrize("name", ["bytes_vocab", "bpe_vocab", "smollm2_vocab"])
def test_every_token_sits_once_at_the_node_its_bytes_spell(request, name):
    vocab = request.getfixturevalue(name)
    trie = token_trie(vocab)
    sb, sid = vocab.sorted_index
    seen = np.concatenate(trie.end_ids)
    assert sorted(seen.tolist()) == sorted(sid.tolist())  # each text token once, no special
    # rebuild each node's prefix from its parent chain and check the tokens at and under it
    prefixes = [[bytes((b,)) for b in trie.byte[0].tolist()]]
    for d in range(1, len(trie.byte)):
        parent = np.empty(trie.byte[d].size, dtype=np.int64)
        for p, (lo, hi) in enumerate(zip(trie.child_lo[d - 1].tolist(), trie.child_hi[d - 1].tolist())):
            parent[lo:hi] = p
        prefixes.append([prefixes[d - 1][p] + bytes((b,)) for p, b in zip(parent.tolist(), trie.byte[d].tolist())])
    for d, level in enumerate(prefixes):
        assert len(set(level)) == len(level)  # one node per distinct prefix
        for k in random.Random(d).sample(range(len(level)), min(40, len(level))):
            p = level[k]
            ends = trie.end_ids[d][trie.end_lo[d][k]:trie.end_hi[d][k]]
            assert all(vocab.token_bytes[t] == p for t in ends.tolist())
            under = sb[trie.under_lo[d][k]:trie.under_hi[d][k]]
            assert under and all(x.startswith(p) for x in under)
            assert sum(x.startswith(p) for x in sb) == len(under)


@pytest.mark.parametrize("name", ["bytes_vocab", "bpe_vocab", "smollm2_vocab"])
def test_the_depth_first_trie_spells_every_token_once_and_skips_whole_subtrees(request, name):
    vocab = request.getfixturevalue(name)
    nodes = token_nodes(vocab)
    sb, sid = vocab.sorted_index
    byte, depth, skip = nodes.byte.tolist(), nodes.depth.tolist(), nodes.skip.tolist()
    n = len(byte)
    assert n == sum(level.size for level in token_trie(vocab).byte)
    path: list[int] = []
    prefixes = []
    for i in range(n):  # depth first: a node's depth is at most one more than the node before's
        assert depth[i] <= len(path)
        del path[depth[i]:]
        path.append(byte[i])
        prefixes.append(bytes(path))
    assert len(set(prefixes)) == n  # one node per distinct prefix
    assert prefixes == sorted(prefixes)  # depth first is sorted order
    spelled = []
    for i in range(n):
        ends = nodes.ids[nodes.lo[i]:nodes.lo[i] + nodes.count[i]].tolist()
        assert all(vocab.token_bytes[t] == prefixes[i] for t in ends)
        spelled += ends
    assert sorted(spelled) == sorted(sid.tolist())  # each text token once, no special
    for i in random.Random(1).sample(range(n), min(300, n)):  # the subtree is exactly [i, skip)
        inside = [j for j in range(i, min(n, skip[i] + 1)) if prefixes[j].startswith(prefixes[i])]
        assert inside == list(range(i, skip[i]))


GRAMMARS = {
    "calc": lambda: lark_grammar(CALC_LARK),
    "sql": lambda: lark_grammar(SQL_LARK),
    "shell": lambda: lark_grammar(SHELL_LARK),
    "email": lambda: regex_grammar(REGEXES["email"]),
    "text": lambda: gbnf_grammar('root ::= [^\\n]{1,200} "\\n" [0-9]+'),
    "schema": lambda: schema_grammar({"type": "object", "properties": {"a": {"type": "string", "pattern": "^[a-z ]+$"},
                                                                         "b": {"type": "array", "items": {"type": "number"}}},
                                      "required": ["a", "b"]}),
}


@pytest.mark.parametrize("name", sorted(GRAMMARS))
def test_the_trie_walk_finds_what_a_token_by_token_check_accepts(smollm2_vocab, name):
    vocab = smollm2_vocab
    compiled = compiled_grammar(GRAMMARS[name](), vocab)
    rng = random.Random(7)
    tb = vocab.token_bytes
    text_ids = vocab.sorted_index[1].tolist()
    checked = 0
    for _ in range(3):
        m = Matcher(compiled)
        for _ in range(12):
            a = m.g
            s = m.state
            memo: dict = {}
            want = {t for t in text_ids if a._accepts(s, tb[t], 0, memo)}
            for walk in (a._walk_from, a._walk_nodes, a._walk_levels):
                got = set(walk(s).tolist())
                assert got == want, (name, walk.__name__, sorted(got ^ want)[:10])
            checked += 1
            legal = [t for t in m.legal_token_ids().tolist() if t not in vocab.stop_ids]
            if not legal:
                break
            assert m.consume_token(rng.choice(legal))
    assert checked >= 12


@pytest.mark.parametrize("name", ["calc", "email", "text", "japanese"])
def test_a_transition_built_for_a_run_of_bytes_holds_for_each_byte_alone(smollm2_vocab, name):
    """A lone regex thread builds one transition for a run of bytes that step alike
    (`Instr.alike`: an ASCII interval of its automaton's row, or a character's continuation
    bytes). After walks that filled the table so, every transition the table holds equals the
    threads the instructions give for that byte alone."""
    grammars = {**GRAMMARS, "japanese": lambda: gbnf_grammar('root ::= [ぁ-ゖァ-ヺ一-龯ー。、]+ ("\\n" [a-z0-9]{2,5})?')}
    vocab = smollm2_vocab
    compiled = compiled_grammar(grammars[name](), vocab)
    rng = random.Random(3)
    for _ in range(4):
        m = Matcher(compiled)
        for _ in range(10):
            legal = [t for t in m.legal_token_ids().tolist() if t not in vocab.stop_ids]
            if not legal:
                break
            assert m.consume_token(rng.choice(legal))
    a = compiled.auto
    from railcall.matcher import UNBUILT

    checked = 0
    for s in range(len(a._sets)):
        for b in range(256):
            held = int(a._table[s, b])
            if held == UNBUILT:
                continue
            out: set = set()
            for ins, loc, st in a._sets[s]:
                ins.step(loc, st, b, out)
            assert (a._sets[held] if held >= 0 else frozenset()) == frozenset(out), (name, s, b)
            checked += 1
    assert checked > 500
