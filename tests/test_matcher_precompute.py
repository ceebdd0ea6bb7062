"""`precompute`: every structural mask computed at compile time, exactly as it would be on first use.

A precomputed grammar must offer the same tokens at every step as a lazily computed one, its
stored (state, token) transitions must be the ones a byte walk gives, and a matcher on it should
find the masks of a valid call already there. The two grammars run on twin vocabularies (the
same tokens, separate caches), so neither can borrow the other's masks.
"""

from __future__ import annotations

import dataclasses
import itertools
import random

import numpy as np
import pytest

from railcall.bench.workloads import valid_calls
from railcall.bitmask import allocate_bitmask
from railcall.grammar.tools import Tool, tool_grammar
from railcall.vocab import Vocabulary
from railcall.matcher import CompiledGrammar, Matcher, compiled_grammar, entry_dense, entry_ids
from toolgen import pick_token, random_tools



_TWINS = itertools.count()


def twin(vocab):
    """The same vocabulary with empty caches and a key of its own (so that no compiled grammar
    cached for the original, or for another twin, is handed back)."""
    return dataclasses.replace(vocab, key=f"{vocab.key}-twin{next(_TWINS)}",
                               _extra={})


def walk_against_oracle(g: CompiledGrammar, rng: random.Random, walks: int, steps: int = 40) -> None:
    """Random walks through `g`: at every step the mask must be exactly `byte_legal`."""
    v = g.vocab
    for _ in range(walks):
        m = Matcher(g)
        for _ in range(steps):
            ids = m.legal_token_ids().tolist()
            assert ids == byte_legal(m)
            if m.is_done():
                break
            assert m.consume_token(pick_token(rng, ids, v, set(v.stop_ids)))


def byte_legal(m: Matcher) -> list[int]:
    """The oracle: every token whose bytes the grammar accepts from here, one byte at a time
    (text tokens), the special tokens the state allows, and the stop tokens once accepting."""
    g, v = m.g, m.g.vocab
    out = {t for t in range(v.size) if not v.special[t] and t not in g._stop_set and v.token_bytes[t]
           and m.copy().consume_bytes(v.token_bytes[t])}
    out |= set(g.specials(m.state))
    if m.is_accepting():
        out |= set(v.stop_ids)
    return sorted(out)


def _walk_both(lazy: CompiledGrammar, eager: CompiledGrammar, rng: random.Random, steps: int = 60) -> int:
    """A random walk driven by the lazy grammar's masks; both must agree at every step."""
    a, b = Matcher(lazy), Matcher(eager)
    bm_a, bm_b = allocate_bitmask(lazy.width), allocate_bitmask(eager.width)
    stop = set(lazy.vocab.stop_ids)
    n = 0
    for _ in range(steps):
        ca, cb = a.fill_bitmask(bm_a), b.fill_bitmask(bm_b)
        assert ca == cb and np.array_equal(bm_a, bm_b)
        n += 1
        if a.is_done():
            break
        t = pick_token(rng, a.legal_token_ids(), lazy.vocab, stop)
        assert a.consume_token(t) and b.consume_token(t)
    return n


@pytest.mark.parametrize("seed", range(12))
def test_precomputed_masks_equal_lazy_masks(vocab, seed):
    rng = random.Random(seed)
    tools = random_tools(rng)
    # Hermes calls (a special token opens and closes each, where the vocabulary has them) and
    # parallel calls on some seeds
    fmt, parallel = ("hermes", seed % 4 == 1) if seed % 2 else ("json", seed % 4 == 2)
    lazy = CompiledGrammar(tool_grammar(tools, fmt, parallel=parallel), twin(vocab))
    eager = CompiledGrammar(tool_grammar(tools, fmt, parallel=parallel), twin(vocab))
    assert eager.precompute() > 1 and eager.precomputed
    steps = sum(_walk_both(lazy, eager, rng) for _ in range(4))
    assert steps > 8


def test_stored_transitions_are_the_byte_walk(smollm2_vocab):
    rng = random.Random(7)
    g = CompiledGrammar(tool_grammar(random_tools(rng, 4)), twin(smollm2_vocab))
    g.precompute()
    v = g.vocab
    stored = [(s, t, n) for s, row in enumerate(g._token_next) for t, n in row.items()]
    assert len(stored) > 100
    assert not any(t in g._stop_set for _, t, _ in stored)
    for s, t, n in rng.sample(stored, min(400, len(stored))):
        walked = s
        if v.special[t]:
            walked = g.specials(s).get(t, -1)
        else:
            for byte in v.token_bytes[t]:
                walked = g.step(walked, byte)
                if walked < 0:
                    break
        assert walked == n, (v.token_text(t), s)
        legal = entry_dense(g.mask(s), g.words)
        assert (legal[t >> 5] >> (t & 31)) & 1  # only legal tokens are stored


def test_valid_calls_find_their_masks_computed(smollm2_vocab, smollm2_tokenizer):
    """After precompute, walking valid calls (strings, numbers, enums, nested objects) computes
    no new mask: every state on the way is either precomputed or shares a precomputed mask."""
    tools = [
        Tool("get_weather", "", {"type": "object", "properties": {
            "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 14}}, "required": ["city"]}),
        Tool("search", "", {"type": "object", "properties": {
            "query": {"type": "string"}, "limit": {"type": "number"},
            "filters": {"type": "object", "properties": {"lang": {"type": "string"}, "safe": {"type": "boolean"}}}},
            "required": ["query"]}),
    ]
    g = CompiledGrammar(tool_grammar(tools), twin(smollm2_vocab))
    g.precompute()
    before = g.mask_computations
    bm = allocate_bitmask(g.width)
    texts = valid_calls(tools, 30, seed=3)
    assert len(texts) == 30
    for text in texts:
        m = Matcher(g)
        for t in smollm2_tokenizer.encode(text, add_special_tokens=False):
            m.fill_bitmask(bm)
            assert m.consume_token(t), text
        m.fill_bitmask(bm)
        assert m.is_accepting()
    assert g.mask_computations == before


def test_compiled_grammar_precomputes_once(bpe_vocab, monkeypatch):
    v = twin(bpe_vocab)
    grammar = tool_grammar(random_tools(random.Random(3), 2))
    g = compiled_grammar(grammar, v)
    assert not g.precomputed
    calls = []
    real = CompiledGrammar.precompute
    monkeypatch.setattr(CompiledGrammar, "precompute", lambda self, *a, **k: calls.append(self) or real(self, *a, **k))
    assert compiled_grammar(grammar, v, precompute=True) is g and g.precomputed
    assert compiled_grammar(grammar, v, precompute=True) is g
    assert calls == [g]  # the LRU hit does not walk again


def test_entry_ids_round_trip(bpe_vocab):
    g = CompiledGrammar(tool_grammar(random_tools(random.Random(5), 3)), twin(bpe_vocab))
    m = Matcher(g)
    for _ in range(10):
        e = g.mask(m.state)
        ids = entry_ids(e, g.width)
        assert ids == m.legal_token_ids().tolist() and len(ids) == e[1]
        if m.is_done():
            break
        m.consume_token(ids[len(ids) // 2])


@pytest.mark.parametrize("seed", range(6))
def test_whole_token_moves_equal_byte_steps(smollm2_vocab, seed):
    """consume_token moves a string's or a literal's thread by a whole token at once; the state
    it reaches must be the one stepping the token's bytes reaches, and an illegal token (a
    string past its maxLength) must still be refused."""
    rng = random.Random(seed)
    v = twin(smollm2_vocab)
    g = CompiledGrammar(tool_grammar(random_tools(rng)), v)
    stop = set(v.stop_ids)
    for _ in range(6):
        m = Matcher(g)
        for _ in range(40):
            if m.is_done():
                break
            ids = m.legal_token_ids()
            illegal = np.setdiff1d(np.arange(v.size), ids)
            probe = m.copy()
            assert not probe.consume_token(int(illegal[rng.randrange(illegal.size)])) and probe.is_error()
            t = pick_token(rng, ids, v, stop)
            if not v.special[t]:
                byte_walk = m.copy()
                assert byte_walk.consume_bytes(v.token_bytes[t])
                assert m.consume_token(t) and m.state == byte_walk.state
            else:
                assert m.consume_token(t)


def test_a_string_at_its_cap_refuses_a_token_that_stays_inside(smollm2_vocab):
    v = twin(smollm2_vocab)
    tool = Tool("f", "", {"type": "object", "properties": {"s": {"type": "string", "maxLength": 3}}, "required": ["s"]})
    g = CompiledGrammar(tool_grammar([tool]), v)
    m = Matcher(g)
    assert m.consume_bytes(b'{"tool":"f","args":{"s":"ab')
    assert not m.copy().consume_token(v.lookup[b"cd"])  # would make 4 characters
    assert m.consume_token(v.lookup[b"c"]) and m.consume_token(v.lookup[b'"}}'] if b'"}}' in v.lookup else v.lookup[b'"'])


def test_number_masks_shared_only_where_length_cannot_matter(smollm2_vocab):
    """Number states far from the length cap share one mask per substate; the margin is the
    most number characters one token can add (SmolLM2 splits digits, so 1, though it has a
    token of 64 dashes). Every mask along a number that runs into the cap equals the tokens
    whose bytes the grammar accepts, token by token (brute force on a small vocabulary)."""
    from railcall.matcher import number_margin

    assert number_margin(smollm2_vocab) == 1
    pieces = [bytes([b]) for b in range(32, 127)] + ["12", "345", "0.5", "e+1", "-1", "1}", "2,", '3"', "9999", "----"]
    v = Vocabulary.from_pieces(pieces, specials=["<end>"], stop=["<end>"])
    assert number_margin(v) == 4  # "9999"; "----" is no number
    tool = Tool("f", "", {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]})
    g = CompiledGrammar(tool_grammar([tool]), v)
    m = Matcher(g)
    assert m.consume_bytes(b'{"tool":"f","args":{"x":-')
    for digit in b"12345678901234567890123.":
        want = sorted(t for t in range(v.size) if not v.special[t] and v.token_bytes[t]
                      and m.copy().consume_bytes(v.token_bytes[t]))
        assert m.legal_token_ids().tolist() == want
        if not m.consume_bytes(bytes([digit])):
            break


SMALL = ([bytes([b]) for b in range(32, 127)]
         + ['"}', '"}}', '",', '":', '":"', '","', '{"', '"]', "ab", "abc", "12", "3.5", "e+1", "-1", "1}", "2,",
            '3"', "00", "\\n", "\\u00", "\\\"", "\u00e9", "\u20ac", "é!", "true", "null", "tr", "ue}", "[1", "]}", "},{"])


@pytest.mark.parametrize("seed", range(10))
def test_precomputed_masks_equal_the_byte_oracle(seed):
    """Every mask of a precomputed grammar, along random walks, is exactly the set of tokens
    whose bytes the grammar accepts one by one (brute force over a small vocabulary with
    quotes, escapes, digits and multi-byte characters in its tokens)."""
    rng = random.Random(seed)
    v = Vocabulary.from_pieces(SMALL, specials=["<end>"], stop=["<end>"])
    g = CompiledGrammar(tool_grammar(random_tools(rng)), v)
    g.precompute()
    walk_against_oracle(g, rng, walks=3)


def test_a_stop_token_that_is_text_is_still_a_stop():
    """A vocabulary may stop on a token that also spells text (`"}}` here): a precomputed
    grammar must treat it as the lazy one does, as a stop, never as the string's closing text."""
    base = Vocabulary.from_pieces([bytes([b]) for b in range(32, 127)] + ['"}}'], specials=["<end>"], stop=["<end>"])
    stop = base.lookup[b'"}}']
    tool = Tool("f", "", {"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]})
    seen = []
    for eager in (False, True):
        v = Vocabulary(token_bytes=list(base.token_bytes), special=base.special.copy(),
                       special_text=dict(base.special_text), stop_ids=(stop,), logits_width=base.logits_width)
        g = CompiledGrammar(tool_grammar([tool]), v)
        if eager:
            g.precompute()
        m = Matcher(g)
        assert m.consume_bytes(b'{"tool":"f","args":{"s":"a')
        seen.append((m.consume_token(stop), m.is_error()))
    assert seen == [(False, True), (False, True)]


def test_number_margin_counts_what_a_number_may_be_followed_by():
    """Where what follows a number may itself start with a number character (`1e` then `ex`), a
    token can add number characters and go on past the number; the margin must count those, or
    number states near the cap would share a mask with states far from it."""
    from railcall.grammar import ir
    from railcall.matcher import number_margin

    v = Vocabulary.from_pieces([bytes([b]) for b in range(32, 127)] + ["1.23456789ex"], specials=["<end>"], stop=["<end>"])
    assert number_margin(v) == 11  # "1.23456789e": eleven bytes a number accepts
    g = CompiledGrammar(ir.Grammar(ir.Seq(ir.JsonNumber(), ir.Lit("ex"))), v)
    m = Matcher(g)
    assert m.consume_bytes(b"1")
    for _ in range(22):
        assert m.legal_token_ids().tolist() == byte_legal(m)
        if not m.consume_bytes(b"1"):
            break


def test_a_live_table_change_walks_only_what_changed():
    """Grammars on one vocabulary share their automaton: after a tool is added, precompute walks
    the new tool and the new name trie, not the tools it already walked, and the new grammar's
    masks are still exactly the byte oracle's."""
    rng = random.Random(11)
    v = Vocabulary.from_pieces(SMALL, specials=["<end>"], stop=["<end>"])
    tools = random_tools(rng, 5)
    g1 = CompiledGrammar(tool_grammar(tools), v)
    g1.precompute()
    first = len(g1.auto._walked)
    extra = Tool("zz_extra", "", {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]})
    g2 = CompiledGrammar(tool_grammar(tools + [extra]), v)
    assert g2.auto is g1.auto
    g2.precompute()
    added = len(g2.auto._walked) - first
    assert 0 < added < first / 2, (added, first)
    walk_against_oracle(g2, rng, walks=6)
    m = Matcher(g2)
    assert m.consume_tokens(v.lookup[bytes([b])] for b in b'{"tool":"zz_extra","args":{"q":"x"}}')
    assert m.is_accepting()


def test_a_walk_cut_short_does_not_hide_states_from_the_next():
    """A walk stopped at max_states leaves successors unreached; a later walk on the shared
    automaton must reach them anyway (as many states walked as on a fresh automaton)."""
    tools = random_tools(random.Random(12), 4)
    extra = Tool("zz_extra", "", {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
    shared = Vocabulary.from_pieces(SMALL, specials=["<end>"], stop=["<end>"])
    CompiledGrammar(tool_grammar(tools), shared).precompute(max_states=40)
    g = CompiledGrammar(tool_grammar(tools + [extra]), shared)
    g.precompute()
    fresh = CompiledGrammar(tool_grammar(tools + [extra]), Vocabulary.from_pieces(SMALL, specials=["<end>"], stop=["<end>"]))
    fresh.precompute()
    assert len(g.auto._walked) == len(fresh.auto._walked) > 40


# Tokens that run across the joints of a call: a string's end into the next key, a key's end
# into its value, a number into what follows.
CROSSING = SMALL + ['a","', 'h":"', '1,"', '"},{"', 'ue,"', 'x":', '":{"', '"]}', 'e"}', '_1":', '},"c', '},"t', '],"p',
                    '","u', '":"a', '},"m']


def test_content_keys_shared_across_tables_keep_masks_exact():
    """Masks are cached by what a state accepts as far as a token reaches, not by which
    instruction it is, so tools, tables and grammars share them. Twelve random tables on one
    vocabulary (one cache): every mask along random walks is exactly the byte oracle's, and far
    fewer masks were computed than states were met (the sharing is real)."""
    rng = random.Random(21)
    v = Vocabulary.from_pieces(CROSSING, specials=["<end>"], stop=["<end>"])
    grammars = [CompiledGrammar(tool_grammar(random_tools(rng)), v) for _ in range(12)]
    for g in grammars:
        walk_against_oracle(g, rng, walks=4)
    auto = grammars[0].auto
    met = sum(e is not None for e in auto._state_mask)
    assert auto.mask_computations < met / 2, (auto.mask_computations, met)


@pytest.mark.parametrize("seed", range(4))
def test_content_keys_of_recursive_and_parallel_grammars_are_exact(seed):
    """Threads with a stack (a `$ref` recursion, array items) and several threads at once (parallel
    calls, optional keys) keyed by content still give the byte oracle's masks, with tool tables
    compiled before them on the same vocabulary filling the cache."""
    from railcall.grammar.schema import schema_grammar

    rng = random.Random(100 + seed)
    v = Vocabulary.from_pieces(CROSSING, specials=["<end>"], stop=["<end>"])
    tree = {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer", "minimum": 0, "maximum": 30},
                                                                "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                               "required": ["v"]}},
            "$ref": "#/$defs/node"}
    for _ in range(3):
        walk_against_oracle(CompiledGrammar(tool_grammar(random_tools(rng)), v), rng, walks=2)
    walk_against_oracle(CompiledGrammar(schema_grammar(tree), v), rng, walks=6, steps=60)
    walk_against_oracle(CompiledGrammar(tool_grammar(random_tools(rng), parallel=True), v), rng, walks=4, steps=60)


def test_a_key_looks_past_a_literal_as_far_as_a_token_reaches():
    """After a number that ends an inner object, `}` may be followed by an optional `,"city":"`
    in one tool and by `,"text":"` in another; the token `},"c` fits only the first. The two
    states must not share a mask, though everything before them is alike."""
    v = Vocabulary.from_pieces(CROSSING, specials=["<end>"], stop=["<end>"])
    inner = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    for key in ("city", "text", "mode"):
        tool = Tool("f", "", {"type": "object", "properties": {"o": inner, key: {"type": "string"}}, "required": ["o"]})
        m = Matcher(CompiledGrammar(tool_grammar([tool]), v))
        assert m.consume_bytes(b'{"tool":"f","args":{"o":{"n":1')
        legal = m.legal_token_ids().tolist()
        assert legal == byte_legal(m)
        assert (v.lookup[b'},"c'] in legal) == (key == "city") and (v.lookup[b'},"t'] in legal) == (key == "text")


def test_token_reach_and_next_bytes_match_brute_force():
    """`_longest_extension(p)` (how far the longest token starting with p reaches past it, -1 if
    none) and `_next_bytes(p)` (the bytes that follow p in some token), from the per-vocabulary
    tables and binary searches, equal a scan of every token, for prefixes of one to five bytes."""
    v = Vocabulary.from_pieces(CROSSING, specials=["<end>"], stop=["<end>"])
    auto = CompiledGrammar(tool_grammar(random_tools(random.Random(5))), v).auto
    texts = [v.token_bytes[t] for t in range(v.size) if v.token_bytes[t] and not v.special[t]]
    rng = random.Random(6)
    probes = {t[:k] for t in texts for k in range(1, 6) if len(t) >= k} | {bytes(rng.choices(b'"{},:ab1', k=rng.randint(1, 4))) for _ in range(200)}
    for p in probes:
        longer = [t for t in texts if t.startswith(p)]
        assert auto._longest_extension(p) == (max(map(len, longer)) - len(p) if longer else -1), p
        assert set(np.flatnonzero(auto._next_bytes(p)).tolist()) == {t[len(p)] for t in longer if len(t) > len(p)}, p


def test_a_trie_node_with_one_key_left_is_a_literal():
    """`Select.chain`: below a node where one key alone remains, its bytes and continuation; not
    where a shorter key ends on the way or the trie still branches."""
    from railcall.grammar.instructions import Accept, Select

    end = Accept()
    sel = Select([(b"read", end), (b"read_file", end), (b"run", end)])
    assert sel.chain(_walk_trie(sel, b"read_")) == (b"file", end)
    assert sel.chain(_walk_trie(sel, b"ru")) == (b"n", end)
    assert sel.chain(_walk_trie(sel, b"r")) is None  # branches
    assert sel.chain(_walk_trie(sel, b"rea")) is None  # "read" ends on the way
    assert sel.chain(0) is None


def count_calls(monkeypatch, cls, name: str) -> itertools.count:
    """Count the calls of method `name` of `cls` (one `next()` per call) for this test."""
    calls = itertools.count()
    method = getattr(cls, name)

    def counted(self, *args):
        next(calls)
        return method(self, *args)

    monkeypatch.setattr(cls, name, counted)
    return calls


def spy_automaton(monkeypatch, **wrappers):
    """From here on in this test, new automata (one per vocabulary) are a subclass of Automaton
    whose methods named in `wrappers` run `wrappers[name](real, self, *args)`, `real` being
    Automaton's own. Compiled, Automaton is an extension type: its methods cannot be replaced
    on the class, but a subclass's are called in their place."""
    from railcall.matcher import matcher as matcher_module
    from railcall.matcher.automaton import Automaton

    def wrapped(wrap, real):
        return lambda self, *args, **kwargs: wrap(real, self, *args, **kwargs)

    methods = {name: wrapped(wrap, getattr(Automaton, name)) for name, wrap in wrappers.items()}
    monkeypatch.setattr(matcher_module, "Automaton", type("SpiedAutomaton", (Automaton,), methods))


def _walk_trie(sel, key: bytes) -> int:
    """The trie node reached by `key` from the root."""
    n = 0
    for b in key:
        n = sel.children[n][b]
    return n


def test_a_branch_cut_by_the_depth_limit_is_part_of_a_literals_key():
    """Near the recursion limit a `$ref`'s object branch is no longer offered (it could not be
    finished), so a string followed by `,"b":` and a value that may be an object must not share
    its mask with one where it may only be an integer: the token `","b":{` closes the first and
    not the second, whichever depth is met first."""
    from railcall.grammar.schema import schema_grammar

    node = {"anyOf": [{"type": "integer"}, {"type": "object", "properties": {"s": {"type": "string"}, "b": {"$ref": "#/$defs/n"}},
                                             "required": ["s", "b"], "additionalProperties": False}]}
    schema = {"$defs": {"n": node}, "$ref": "#/$defs/n"}
    from railcall.grammar.instructions import MAX_DEPTH

    for order in ([MAX_DEPTH - 2, MAX_DEPTH - 3], [MAX_DEPTH - 3, MAX_DEPTH - 2]):
        v = Vocabulary.from_pieces([bytes([b]) for b in range(32, 127)] + ['","b":', '","b":{'], specials=["<end>"],
                                   stop=["<end>"])
        g = CompiledGrammar(schema_grammar(schema), v)
        for depth in order:
            m = Matcher(g)
            assert m.consume_bytes(b'{"s":"x","b":' * depth + b'{"s":"x')
            legal = m.legal_token_ids().tolist()
            assert legal == byte_legal(m), (order, depth)
            # the object inside this one would be at depth depth + 2; it needs one more level
            assert (v.lookup[b'","b":{'] in legal) == (depth + 3 <= MAX_DEPTH) and v.lookup[b'","b":'] in legal


def test_a_special_token_path_is_offered_only_while_it_fits_under_the_limit():
    """`(<s>` recurses: it is offered while the recursion it enters could still be finished,
    and states on either side of the limit must not share a mask, whichever is met first."""
    from railcall.grammar import ir
    from railcall.grammar.instructions import MAX_DEPTH

    rule = ir.Alt(ir.Lit(b"x"), ir.Seq(ir.Lit(b"("), ir.Special("<s>"), ir.Ref("R"), ir.Lit(b")")))
    grammar = ir.Grammar(ir.Ref("R"), rules=(("R", rule),))
    for order in ([MAX_DEPTH - 1, MAX_DEPTH - 2], [MAX_DEPTH - 2, MAX_DEPTH - 1]):
        v = Vocabulary.from_pieces([bytes([b]) for b in range(32, 127)], specials=["<end>", "<s>"], stop=["<end>"])
        g = CompiledGrammar(grammar, v)
        for depth in order:
            m = Matcher(g)
            for _ in range(depth):
                assert m.consume_bytes(b"(") and m.consume_token(v.special_id("<s>"))
            legal = m.legal_token_ids().tolist()
            assert legal == byte_legal(m) and v.lookup[b"x"] in legal, (order, depth)
            # R is entered at depth depth + 1; another `(` needs one level more
            assert (v.lookup[b"("] in legal) == (depth + 2 <= MAX_DEPTH), (order, depth)
            if depth <= MAX_DEPTH - 2:
                assert m.consume_bytes(b"(") and m.legal_token_ids().tolist() == [v.special_id("<s>")]


def test_matchers_on_several_threads_share_one_automaton_exactly():
    """Four threads walk random tables on one vocabulary at once, the interpreter switching
    between them as often as it can: they share states, transitions, content keys and masks,
    and every mask must still be exactly the byte oracle's. (A write lost to a table growing on
    another thread is rare here; the next test forces it.)"""
    import sys
    import threading

    v = Vocabulary.from_pieces(CROSSING, specials=["<end>"], stop=["<end>"])
    # free-form values and patterns take the vectorised walk, which reads the table back
    loose = {"type": "object", "properties": {"any": {}, "code": {"type": "string", "pattern": "^[a-z]+-[0-9]{2,4}$"},
                                              "tags": {"type": "array", "items": {"type": "string", "format": "date"}}},
             "required": ["any", "code", "tags"]}
    tables = [random_tools(random.Random(300 + i)) + [Tool(f"loose{i}", "", loose)] for i in range(8)]
    failures = []

    def work(i):
        rng = random.Random(i)
        try:
            for tools in rng.sample(tables, len(tables)):
                walk_against_oracle(CompiledGrammar(tool_grammar(tools), v), rng, walks=4, steps=40)
        except AssertionError as e:  # pragma: no cover - reported below
            failures.append(e)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert not failures, failures[0]


@pytest.mark.parametrize("by_nodes", [True, False], ids=["node walk", "level walk"])
def test_a_transition_lost_from_the_table_is_not_read_as_dead(monkeypatch, by_nodes):
    """Another thread growing the transition table can lose a write (the table is copied). The
    trie walks (node by node, and vectorised by level) must then use the transition just
    computed, never read the slot back as dead: here every other write is dropped on purpose,
    and the masks still equal the oracle."""
    from railcall.matcher import UNBUILT, transitions

    monkeypatch.setattr(transitions, "COMPILED", by_nodes)  # which walk _walk_from takes

    dropped, calls = itertools.count(), itertools.count()

    def lossy(step, self, s, b):
        r = step(self, s, b)
        if next(dropped) % 2:
            self._table[s, b] = UNBUILT
        return r

    def counted(real, self, *args):
        next(calls)
        return real(self, *args)

    spy_automaton(monkeypatch, step=lossy, **{"_built_step" if by_nodes else "_delta": counted})
    # two-letter tokens: a pattern's first mask has hundreds of candidates, so the walk is vectorised
    pairs = [a + b for a in "abcdefghijklmnopqrstuvwxyz" for b in "abcdefghijklmnopqrstuvwxyz"]
    v = Vocabulary.from_pieces(CROSSING + pairs, specials=["<end>"], stop=["<end>"])
    loose = {"type": "object", "properties": {"any": {}, "code": {"type": "string", "pattern": "^[a-z]+-[0-9]{2,4}$"}},
             "required": ["any", "code"]}
    rng = random.Random(8)
    g = CompiledGrammar(tool_grammar(random_tools(rng) + [Tool("loose", "", loose)]), v)
    m = Matcher(g)
    assert m.consume_bytes(b'{"tool":"loose","args":{"any":{"k":"v"},"code":"')
    assert m.legal_token_ids().tolist() == byte_legal(m)
    walk_against_oracle(g, rng, walks=8)
    assert next(dropped) > 20 and next(calls) > 0


def test_an_integer_key_stays_small_where_tokens_hold_long_runs_of_digits(monkeypatch):
    """A bounded integer is keyed by the digits a token can reach, ten branches a level; with a
    vocabulary whose tokens hold seven digits that tree would have ten million leaves, so the
    key falls back to the instruction, and the masks stay exact."""
    from railcall.grammar.numbers import JInt

    steps = count_calls(monkeypatch, JInt, "_next")
    v = Vocabulary.from_pieces([bytes([b]) for b in range(32, 127)] + ["0000000", "1234567", "99"], specials=["<end>"], stop=["<end>"])
    tool = Tool("f", "", {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 10**12}},
                          "required": ["n"]})
    m = Matcher(CompiledGrammar(tool_grammar([tool]), v))
    assert m.consume_bytes(b'{"tool":"f","args":{"n":')
    for digits in (b"1", b"2", b"34"):
        assert m.legal_token_ids().tolist() == byte_legal(m)
        assert m.consume_bytes(digits)
    assert next(steps) < 100_000


def test_allowed_bytes_are_what_a_step_accepts():
    """`allowed(local)` (shared between instructions that differ only in where they continue)
    is exactly the set of bytes `step` accepts, for literals, strings at every substate and
    count near their bounds, numbers, integers with bounds of either sign and bounded decimals:
    asked in random order, so that arrays shared by one instruction are checked against
    another's steps."""
    import gc
    from decimal import Decimal

    from railcall.grammar.instructions import Accept, Lit
    from railcall.grammar.numbers import JDec, JInt, JNum
    from railcall.grammar.strings import N_SUB, JStr

    end = Accept()
    for _ in range(20):  # a freed instruction's id, reused by one with other bounds, shares nothing
        for lo, hi in ((Decimal(0), Decimal(1)), (Decimal(5), Decimal(9))):
            assert set(np.flatnonzero(JDec(lo, hi, False, False, end).allowed("")).tolist()) == (
                set(b"-01") if lo == 0 else set(b"56789"))
        gc.collect()
    cases = [(Lit(b'ab"{', end), loc) for loc in range(4)]
    for lo, hi in [(0, 9), (-5, 5), (-100, -7), (3, 3), (None, 40), (-40, None), (None, None), (10, 99)]:
        ins = JInt(lo, hi, end)
        locals_ = {0}
        for _ in range(3):  # every local reachable in three steps
            nxt = set()
            for loc in locals_:
                for b in b"-0123456789":
                    n = ins._next((0, False, 0) if loc == 0 else loc, b)
                    if n is not None:
                        nxt.add(n)
            locals_ |= nxt
        cases += [(ins, (0, False, 0) if loc == 0 else loc) for loc in locals_]
    for lo, hi in [(0, 256), (1, 3), (2, 2), (0, 0)]:
        ins = JStr(lo, hi, end)
        cases += [(ins, count << 5 | sub) for count in range(0, 4) for sub in range(N_SUB) if count <= hi]
    for integer in (False, True):
        ins = JNum(integer, end)
        cases += [(ins, n << 4 | sub) for n in (0, 3) for sub in range(9)]
    D = Decimal
    for lo, hi, xlo, xhi in [(D(0), D(1), False, False), (D(5), D(9), False, False), (D(0), D(1), True, True),
                             (D("-2.5"), D("0.5"), False, True), (None, D(3), False, False), (D("0.25"), None, True, False)]:
        ins = JDec(lo, hi, xlo, xhi, end)
        texts = {""}
        for _ in range(3):
            texts |= {n for t in texts for b in JDec._BYTES if (n := ins._next(t, b)) is not None}
        cases += [(ins, t) for t in texts]
    random.Random(7).shuffle(cases)
    for ins, loc in cases:
        got = ins.allowed(loc)
        assert not got.flags.writeable
        want = set()
        for b in range(256):
            out: set = set()
            ins.step(loc, None, b, out)
            if out:
                want.add(b)
        assert set(np.flatnonzero(got).tolist()) == want, (ins, loc)


def test_a_string_key_describes_exactly_what_may_follow_its_quote():
    """A string's content key describes what follows its closing quote only as far as the texts
    tokens spell after a quote (`quote_rests`): strings followed by `,"city":` and `,"text":`
    share it where no token spells `","c` or `","t`, and differ where one does. Over many
    tables on one vocabulary: equal keys mean equal sets of those texts accepted, and some
    continuations share a key."""
    from railcall.matcher import DEAD, quote_rests

    v = Vocabulary.from_pieces(CROSSING + ['","c', '","n', 'a"],', '"]]'], specials=["<end>"], stop=["<end>"])
    rests = quote_rests(v)
    assert b',"c' in rests and b',"u' in rests and b',"t' not in rests
    rng = random.Random(31)
    grammars = [CompiledGrammar(tool_grammar(random_tools(rng)), v) for _ in range(16)]
    for g in grammars:
        walk_against_oracle(g, rng, walks=3)
    # a string followed by another string (`","c` reaches into it) and by a key (`","x` doesn't);
    # one ending an object in an array (`},{"` reaches past the `}`) and one ending an object
    # followed by a key
    words = {"type": "array", "items": {"type": "string"}}
    inner = {"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]}
    fixed = CompiledGrammar(tool_grammar([
        Tool("arr", "", {"type": "object", "properties": {"tags": words, "x": {"type": "integer"}}, "required": ["tags"]}),
        Tool("obj", "", {"type": "object", "properties": {"s": {"type": "string"}, "x": {"type": "integer"}}, "required": ["s"]}),
        Tool("objs", "", {"type": "object", "properties": {"all": {"type": "array", "items": inner}}, "required": ["all"]}),
        Tool("nest", "", {"type": "object", "properties": {"o": inner, "t": {"type": "integer"}}, "required": ["o", "t"]}),
    ]), v)
    for text in (b'{"tool":"arr","args":{"tags":["a","b"],"x":1}}', b'{"tool":"obj","args":{"s":"a","x":1}}',
                 b'{"tool":"objs","args":{"all":[{"s":"a"},{"s":"b"}]}}', b'{"tool":"nest","args":{"o":{"s":"a"},"t":1}}'):
        assert Matcher(fixed).consume_bytes(text)
    auto = grammars[0].auto
    seen: dict[int, frozenset] = {}
    conts = set()
    for threads in list(auto._sets):
        for ins, _, st in threads:
            if type(ins).__name__ != "JStr" or (ins.next, st) in conts:
                continue
            conts.add((ins.next, st))
            x = auto._arrival_state(ins.next, st)
            accepted = frozenset(r for r in rests if x != DEAD and auto._walk_bytes(x, r, 0, {}) != DEAD)
            k = auto._quote_key(ins.next, st)
            assert seen.setdefault(k, accepted) == accepted, (ins.next, accepted, seen[k])
    assert len(conts) >= 15 and len(seen) < len(conts), (len(conts), len(seen))


def test_a_lookahead_through_a_string_is_keyed_by_what_tokens_spell_after_its_quote():
    """A key that looks into a string and past its closing quote describes what follows the
    quote only as far as the texts tokens spell after a quote (`quote_rests`), not everything
    the next bytes may be. `a","xy` closes an array item and spells two characters of the next,
    so items of at most one character and of two must not share a mask; the long token
    `"abcdefghij` makes the key of an item's opening quote look ten bytes on, past the array
    (`],"city":` or `],"text":`), but no token spells `],"c` or `],"t` after a quote, so those
    two share one; with `""],"c` they must not. On one vocabulary, compiled in both orders:
    masks exactly the byte oracle's."""
    pieces = CROSSING + ['a","xy', '"abcdefghij']
    items = lambda n: {"type": "array", "items": {"type": "string", "maxLength": n}}  # noqa: E731

    def tool(key, n=16):
        return Tool("t", "", {"type": "object", "properties": {"tags": items(n), key: {"type": "integer"}},
                              "required": ["tags", key]})

    for order in ((1, 2), (2, 1)):
        v = Vocabulary.from_pieces(pieces, specials=["<end>"], stop=["<end>"])
        for n in order:
            m = Matcher(CompiledGrammar(tool_grammar([tool("x", n)]), v))
            assert m.consume_bytes(b'{"tool":"t","args":{"tags":["')
            legal = m.legal_token_ids().tolist()
            assert legal == byte_legal(m)
            assert (v.lookup[b'a","xy'] in legal) == (n == 2)
    v = Vocabulary.from_pieces(pieces, specials=["<end>"], stop=["<end>"])
    keys = []
    for key in ("city", "text"):
        g = CompiledGrammar(tool_grammar([tool(key)]), v)
        m = Matcher(g)
        assert m.consume_bytes(b'{"tool":"t","args":{"tags":[')
        assert m.legal_token_ids().tolist() == byte_legal(m)
        assert v.lookup[b'"abcdefghij'] in m.legal_token_ids().tolist()
        keys.append(g.auto._state_content_key(m.state))
    assert keys[0] == keys[1]
    # `""],"c` (an empty last item, then `],"c`) is the longest token after `"`: the whole
    # lookahead past the inner quote decides it, legal before `],"city"` only
    for order in (("city", "text"), ("text", "city")):
        v = Vocabulary.from_pieces(CROSSING + ['""],"c'], specials=["<end>"], stop=["<end>"])
        for key in order:
            m = Matcher(CompiledGrammar(tool_grammar([tool(key)]), v))
            assert m.consume_bytes(b'{"tool":"t","args":{"tags":[')
            legal = m.legal_token_ids().tolist()
            assert legal == byte_legal(m)
            assert (v.lookup[b'""],"c'] in legal) == (key == "city")


def test_a_key_into_a_number_is_what_the_tokens_after_the_prefix_find_there():
    """A literal's last byte before a number (`:` of `"n":`) is keyed by which of the texts that
    tokens starting with `:` spell after it (`1`, `12`, `-`, `1.`) the number takes, so numbers
    of other bounds share its mask where those fare alike and differ where one does not. On one
    vocabulary, in both orders: masks exactly the byte oracle's, each token where it belongs."""
    kinds = {"digit": ({"type": "integer", "minimum": 0, "maximum": 9}, {":1"}),
             "two": ({"type": "integer", "minimum": 10, "maximum": 99}, {":1", ":12"}),
             "small": ({"type": "integer", "minimum": -5, "maximum": 5}, {":1", ":-"}),
             "other": ({"type": "integer", "minimum": 0, "maximum": 8}, {":1"}),
             "number": ({"type": "number"}, {":1", ":12", ":-", ":1."})}
    probes = [":1", ":12", ":-", ":1."]
    for order in (list(kinds), list(reversed(kinds))):
        v = Vocabulary.from_pieces(CROSSING + probes, specials=["<end>"], stop=["<end>"])
        computed = []
        for name in order:
            schema, legal_probes = kinds[name]
            g = CompiledGrammar(tool_grammar([Tool("t", "", {"type": "object", "properties": {"n": schema},
                                                                 "required": ["n"]})]), v)
            m = Matcher(g)
            assert m.consume_bytes(b'{"tool":"t","args":{"n"')
            n = g.auto.mask_computations
            legal = m.legal_token_ids().tolist()
            computed.append(g.auto.mask_computations - n)
            assert legal == byte_legal(m)
            assert {p for p in probes if v.lookup[p.encode()] in legal} == legal_probes, name
        assert computed[order.index("other")] == 0 or computed[order.index("digit")] == 0  # one shares


def test_clear_caches_starts_the_next_compile_cold(bpe_vocab):
    """`clear_caches(vocab)`: the next compile of a table builds a new grammar on a new
    automaton and computes its masks again; a grammar compiled before keeps working."""
    from railcall.matcher import clear_caches

    v = twin(bpe_vocab)
    tools = random_tools(random.Random(3))
    old = compiled_grammar(tool_grammar(tools), v, prewarm=False)
    Matcher(old).legal_token_ids()
    assert compiled_grammar(tool_grammar(tools), v, prewarm=False) is old
    clear_caches(v)
    new = compiled_grammar(tool_grammar(tools), v, prewarm=False)
    assert new is not old and new.auto is not old.auto and new.mask_computations == 0
    assert Matcher(new).legal_token_ids().tolist() == Matcher(old).legal_token_ids().tolist()
    assert new.mask_computations > 0


QUOTED = SMALL + ['"ab', '"a"', '""', '"\\n', '"\u00e9', '"x",', '":"ab', '["a', '"a"}', '"ab"]', '"\\u00', '"a\\"',
                  '"abc"', '":""', '[""', '"}}']


@pytest.mark.parametrize("eager", [False, True])
def test_tokens_that_run_into_a_string_match_the_byte_oracle(eager, monkeypatch):
    """Tokens that spell a literal's end and go on into a string (`":"ab`, `["a`, `"a"}`) are
    classified per vocabulary rather than walked; near a string's minimum and maximum, inside
    arrays and before what follows the closing quote, the masks are still exactly the oracle's."""
    calls = []
    spy_automaton(monkeypatch, _into_string=lambda real, self, *a: calls.append(a[0]) or real(self, *a))
    v = Vocabulary.from_pieces(QUOTED, specials=["<end>"], stop=["<end>"])
    s = lambda lo, hi: {"type": "string", "minLength": lo, "maxLength": hi}  # noqa: E731
    tools = [Tool("f", "", {"type": "object", "properties": {
        "a": s(0, 1), "b": s(2, 3), "c": {"type": "array", "items": s(1, 2), "maxItems": 3}, "d": s(0, 4)},
        "required": ["a", "b"]}),
             Tool("g", "", {"type": "object", "properties": {"e": {"type": "array", "items": s(0, 3)}}})]
    g = CompiledGrammar(tool_grammar(tools), v)
    if eager:
        g.precompute()
    rng = random.Random(5)
    walk_against_oracle(g, rng, walks=25)
    assert {b'":"', b'["', b'"'} & set(calls)


CLOSING = SMALL + ['"}', '"},', '","b', '","b":', '","c":"', '"}}', '"]', '"],"', 'a","', 'a"}', '","', '"}]']


def test_a_string_followed_by_several_literals_closes_exactly(monkeypatch):
    """After a string that an optional property may follow, what comes after the closing quote
    is one of several literals (`,"b":` or `}`). The closing tokens are then matched against
    each literal by binary search, not walked one text at a time; the masks along random walks
    are still exactly the byte oracle's, tokens that run past a literal's end included."""
    by_literal, by_walk = [], []
    spy_automaton(monkeypatch,
                  _exits_into_literal=lambda real, self, sub, t, idx: by_literal.append(t[0].data[t[1]:]) or real(self, sub, t, idx),
                  _exits_by_rest=lambda real, self, *a: by_walk.append(a) or real(self, *a))
    v = Vocabulary.from_pieces(CLOSING, specials=["<end>"], stop=["<end>"])
    s = {"type": "string", "minLength": 1, "maxLength": 3}
    tools = [Tool("f", "", {"type": "object", "properties": {
        "a": s, "b": {"type": "integer"}, "c": s, "d": {"type": "array", "items": s, "maxItems": 2}},
        "required": ["a"]})]
    g = CompiledGrammar(tool_grammar(tools), v)
    walk_against_oracle(g, random.Random(9), walks=40)
    for text in (b'{"tool":"f","args":{"a":"x","b":1}}', b'{"tool":"f","args":{"a":"x","c":"y"}}',
                 b'{"tool":"f","args":{"a":"x"}}', b'{"tool":"f","args":{"a":"x","d":["y"]}}'):
        m = Matcher(g)
        for b in text[:-2]:
            assert m.consume_bytes(bytes([b]))
            assert m.legal_token_ids().tolist() == byte_legal(m)
    assert {b',"b":', b'}}'} <= set(by_literal) and not by_walk


@pytest.mark.parametrize("seed", range(4))
def test_a_text_is_accepted_through_literals_as_a_byte_walk_accepts_it(seed):
    """`_accepts` (a text taken through literals, tries, strings and numbers by comparing bytes,
    without a state per byte) agrees with the byte walk for every state random walks meet, on
    the texts tokens spell after a quote, on the tails of the grammar's own literals and keys,
    and on random bytes (quotes, escapes, a two-byte character, number characters)."""
    from railcall.grammar.instructions import Lit, Select
    from railcall.grammar.numbers import JInt, JNum
    from railcall.grammar.strings import JStr
    from railcall.matcher import DEAD, quote_rests

    rng = random.Random(seed)
    v = Vocabulary.from_pieces(CLOSING, specials=["<end>"], stop=["<end>"])
    strings = Tool("strs", "", {"type": "object", "properties": {
        "a": {"type": "string", "maxLength": 4}, "b": {"type": "array", "items": {"type": "string", "minLength": 2}}},
        "required": ["a"]})
    nums = Tool("nums", "", {"type": "object", "properties": {
        "i": {"type": "integer", "minimum": -12, "maximum": 120}, "n": {"type": "number"},
        "t": {"type": "integer", "minimum": 10, "maximum": 99},
        "k": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}}}, "required": ["i"]})
    g = CompiledGrammar(tool_grammar(random_tools(rng) + [strings, nums]), v)
    walk_against_oracle(g, rng, walks=10)
    for text in (b'{"tool":"strs","args":{"a":"ab","b":["xy","\\n\\u00e9"]}}', b'{"tool":"strs","args":{"a":"x"}}',
                 b'{"tool":"nums","args":{"i":-12,"n":-0.5e+3,"t":10,"k":[1,0]}}',
                 b'{"tool":"nums","args":{"i":119,"n":10,"t":99}}'):
        assert Matcher(g).consume_bytes(text)
    auto = g.auto
    lits = {ins.data[k:] + tail for threads in auto._sets for ins, _, _ in threads if type(ins) is Lit
            for k in range(len(ins.data)) for tail in (b"", b"a", b'"', b"1}", b'"}}')}

    def keys_below(trie, node, acc=b""):  # the keys of a trie from `node`, and what they may end in
        for b, child in trie.children[node].items():
            if child in trie.terminal:
                yield acc + bytes([b])
            yield from keys_below(trie, child, acc + bytes([b]))

    lits |= {k + tail for threads in auto._sets for ins, loc, _ in threads if type(ins) is Select
             for k in keys_below(ins, loc) for tail in (b"", b'"', b'",', b'"}', b"x")}
    # numbers: within and past an integer's bounds, and past the longest number
    lits |= {n + tail for n in (b"1", b"12", b"-1", b"-13", b"121", b"0.5", b"1e5", b"9" * 40) for tail in (b"", b",", b"}")}
    alphabet = b'{}[],:"a1x\\nu0-.e92' + "\u00e9".encode()
    texts = sorted(set(quote_rests(v)) | lits | {bytes(rng.choice(alphabet) for _ in range(rng.randint(1, 9)))
                                                 for _ in range(300)})
    checked = literal_states = trie_states = string_states = number_states = 0
    for s in range(len(auto._sets)):
        if not auto._sets[s]:
            continue
        literal_states += all(type(t[0]) is Lit for t in auto._sets[s])
        trie_states += any(type(t[0]) is Select for t in auto._sets[s])
        string_states += any(type(t[0]) is JStr for t in auto._sets[s])
        number_states += any(type(t[0]) in (JNum, JInt) for t in auto._sets[s])
        for text in texts:
            for start in {0, len(text) // 2}:
                walked = auto._walk_bytes(s, text, start, {}) != DEAD
                assert auto._accepts(s, text, start, {}) == walked, (auto._sets[s], text, start)
                checked += 1
    assert literal_states >= 20 and trie_states >= 5 and string_states >= 10 and number_states >= 10
    assert checked > 10_000


ENUMS = SMALL + ['":"', '":"re', '":"red', 'r":"b', '":"blue"', '","c":"g', 'e","', 'ed"}', '"re', 'lue']


def test_tokens_that_run_into_a_trie_of_values_match_the_byte_oracle(monkeypatch):
    """Tokens that spell the end of a key and go on into an enum's values (`":"re`, `r":"b`) are
    found by walking the values' trie with what they spelled so far, and those that spell a
    value's end and go on into an optional key or the object's end (`ed"}`, `e","`) by look-ups
    along each literal, not token by token; the masks along random walks are still exactly the
    oracle's."""
    from railcall.grammar.instructions import Lit

    prefixes, into_literals = [], []

    def select(real, self, ins, node, st, bits, prefix=b""):
        prefixes.append(prefix)
        return real(self, ins, node, st, bits, prefix)

    def chain(real, self, p, x, bits, exact_ok=True):
        threads = self._sets[x] if x >= 0 else ()
        if len(threads) > 1 and all(type(t[0]) is Lit for t in threads):
            into_literals.append(p)
        return real(self, p, x, bits, exact_ok)

    spy_automaton(monkeypatch, _select_legal=select, _prefix_tokens=chain)
    v = Vocabulary.from_pieces(ENUMS, specials=["<end>"], stop=["<end>"])
    colour = {"type": "string", "enum": ["red", "reed", "blue", "green"]}
    tools = [Tool("f", "", {"type": "object", "properties": {"c": colour, "r": colour, "n": {"type": "integer"}},
                           "required": ["c"]})]
    g = CompiledGrammar(tool_grammar(tools), v)
    walk_against_oracle(g, random.Random(2), walks=30)
    for text in (b'{"tool":"f","args":{"c":"red","r":"blue"}}', b'{"tool":"f","args":{"c":"green","n":1}}'):
        m = Matcher(g)
        for b in text[:-2]:
            assert m.consume_bytes(bytes([b]))
            assert m.legal_token_ids().tolist() == byte_legal(m)
    assert any(p.endswith(b'":"') for p in prefixes)
    assert into_literals  # a value's end followed by an optional key or the object's end


def _position_start(g: CompiledGrammar, s: int) -> bool:
    """Whether state `s` is one thread at a place `prewarm` keys and masks: a literal at its
    first byte, a string just inside its quote, a trie at its root, a number before its first
    digit (at most one frame of recursion deep)."""
    from railcall.grammar.instructions import Lit, Select
    from railcall.grammar.numbers import JInt, JNum
    from railcall.grammar.strings import JStr

    threads = g._sets[s]
    if len(threads) != 1:
        return False
    (ins, loc, st), = threads
    if st is not None and st[3] > 1:
        return False
    if type(ins) in (Lit, JStr, JNum, Select):
        return loc == 0
    return type(ins) is JInt and loc == (0, False, 0)


@pytest.mark.parametrize("seed", range(10))
def test_prewarmed_masks_equal_lazy_masks_and_are_there_at_every_position(vocab, seed):
    """`prewarm` changes no mask, and a matcher finds the mask of every position start it
    reaches already computed (the lazy grammar computes them as it goes)."""
    rng = random.Random(seed)
    tools = random_tools(rng)
    fmt, parallel = ("hermes", seed % 4 == 1) if seed % 2 else ("json", seed % 4 == 2)
    lazy = CompiledGrammar(tool_grammar(tools, fmt, parallel=parallel), twin(vocab))
    warm = CompiledGrammar(tool_grammar(tools, fmt, parallel=parallel), twin(vocab))
    assert warm.prewarm() > 1 and warm.prewarmed and not warm.precomputed
    starts = lazy_new = 0
    for _ in range(4):
        a, b = Matcher(lazy), Matcher(warm)
        bm_a, bm_b = allocate_bitmask(lazy.width), allocate_bitmask(warm.width)
        for _ in range(60):
            before_a, before_b = lazy.auto.mask_computations, warm.auto.mask_computations
            assert a.fill_bitmask(bm_a) == b.fill_bitmask(bm_b) and np.array_equal(bm_a, bm_b)
            if _position_start(warm, b.state):
                starts += 1
                lazy_new += lazy.auto.mask_computations - before_a
                assert warm.auto.mask_computations == before_b, warm._sets[b.state]
            if a.is_done():
                break
            t = pick_token(rng, a.legal_token_ids(), lazy.vocab, set(lazy.vocab.stop_ids))
            assert a.consume_token(t) and b.consume_token(t)
    assert starts > 4


def test_prewarm_computes_what_first_visits_would(smollm2_vocab, smollm2_tokenizer):
    """Calls to tools not seen before: after prewarm, the walk builds a third of the content keys
    and computes fewer masks than the lazy grammar does on the same calls."""
    from railcall.bench.workloads import synthetic_tools

    tools = synthetic_tools(24, seed=5)
    lazy = CompiledGrammar(tool_grammar(tools), twin(smollm2_vocab))
    warm = CompiledGrammar(tool_grammar(tools), twin(smollm2_vocab))
    warm.prewarm()
    computed, keys = [], []
    for g in (lazy, warm):
        before, keys_before = g.auto.mask_computations, len(g.auto._cids)
        bm = allocate_bitmask(g.width)
        for text in valid_calls(tools, 12, seed=7):
            m = Matcher(g)
            for t in smollm2_tokenizer.encode(text, add_special_tokens=False):
                m.fill_bitmask(bm)
                assert m.consume_token(t)
        computed.append(g.auto.mask_computations - before)
        keys.append(len(g.auto._cids) - keys_before)
    # the masks left are states inside a position (a string's count near its cap, a digit, a
    # trie's inner node, several optional keys at once, a literal's last bytes keyed with what
    # follows), mostly unions and look-ups of keys prewarm built
    assert computed[1] < computed[0] * 0.8 and keys[1] * 2 < keys[0], (computed, keys)


def test_prewarm_finds_the_tokens_that_close_a_string_from_inside_an_escape(monkeypatch):
    """`n"}` ends an escape, closes the string and goes on: prewarm computes those closing tokens
    once per continuation, so the first mask after a backslash walks none of them again; the
    mask is exactly the byte oracle's, and a lazy grammar does walk them there."""
    v = Vocabulary.from_pieces(CLOSING + ['n"}', 'n","', '\\n'], specials=["<end>"], stop=["<end>"])
    tool = Tool("t", "", {"type": "object", "properties": {"s": {"type": "string"}, "b": {"type": "integer"}},
                          "required": ["s"]})
    calls, recording = [], []

    def found(real, self, sub, *a):
        if recording:
            calls.append(sub)
        return real(self, sub, *a)

    # the two ways they are found
    spy_automaton(monkeypatch, _exits_into_literal=found, _exits_by_rest=found)
    for warm in (True, False):
        g = CompiledGrammar(tool_grammar([tool]), twin(v))
        if warm:
            g.prewarm()
        m = Matcher(g)
        assert m.consume_bytes(b'{"tool":"t","args":{"s":"ab\\')
        calls.clear()
        recording.append(True)
        legal = m.legal_token_ids().tolist()
        recording.clear()
        assert legal == byte_legal(m) and v.lookup[b'n"}'] in legal and v.lookup[b'n","'] in legal
        assert (calls == []) == warm, calls


def test_prewarm_masks_where_many_names_part_ways(bpe_vocab):
    """Names in namespaces (`github_` and `slack_`, forty each): where a namespace's names part
    ways, more than 2 * KEY_BUDGET trie nodes lie below, so the node is keyed as itself and no
    other state can lend it a mask. Prewarm computes it: the first visit there computes nothing,
    where a lazy grammar computes it; nodes with few names below stay lazy. Masks are exactly
    the byte oracle's either way."""
    from railcall.matcher.content_keys import KEY_BUDGET

    words = ["alpha", "bravo", "city", "delta", "echo", "file", "golf", "hotel"]
    tools = [Tool(f"{ns}_{w}_{i}", "", {"type": "object", "properties": {}}) for ns in ("github", "slack")
             for w in words for i in range(5)]
    g0 = CompiledGrammar(tool_grammar(tools), twin(bpe_vocab))
    m = Matcher(g0)
    assert m.consume_bytes(b'{"tool":"github_')
    (ins, node, _), = g0._sets[m.state]
    assert ins.size(node) > 2 * KEY_BUDGET and len(ins.children[node]) == len(words)
    for warm in (True, False):
        g = CompiledGrammar(tool_grammar(tools), twin(bpe_vocab))
        if warm:
            g.prewarm()
        m = Matcher(g)
        new = []
        for b in b'{"tool":"github_echo_':
            before = g.auto.mask_computations
            assert m.legal_token_ids().tolist() == byte_legal(m)
            new.append(g.auto.mask_computations - before)
            assert m.consume_bytes(bytes([b]))
        at_split = new[len(b'{"tool":"github_')]  # the state after `github_`
        assert (at_split == 0) == warm, new
        assert sum(new) > 0  # below the split (`echo_`: five names), first visits stay lazy


def test_compiled_grammar_prewarms_once(bpe_vocab, monkeypatch):
    """Prewarm is the default, once per grammar; prewarm=False leaves a grammar lazy until a
    later compile asks for it."""
    v = twin(bpe_vocab)
    assert compiled_grammar(tool_grammar(random_tools(random.Random(6), 2)), v).prewarmed  # the default
    grammar = tool_grammar(random_tools(random.Random(4), 2))
    g = compiled_grammar(grammar, v, prewarm=False)
    assert not g.prewarmed and g.mask_computations == 0
    calls = []
    real = CompiledGrammar.prewarm
    monkeypatch.setattr(CompiledGrammar, "prewarm", lambda self: calls.append(self) or real(self))
    assert compiled_grammar(grammar, v) is g and g.prewarmed
    assert compiled_grammar(grammar, v, prewarm=True) is g and compiled_grammar(grammar, v, prewarm=False) is g
    assert calls == [g]  # the LRU hit does not warm again
    other = compiled_grammar(tool_grammar(random_tools(random.Random(5), 2)), v, precompute=True)
    assert compiled_grammar(other.grammar, v, prewarm=True) is other and calls == [g]  # precompute covers it


def test_prewarm_counts_in_mask_computations_as_precompute_does(bpe_vocab):
    """`mask_computations` counts every mask computed since the grammar was compiled, whether
    prewarm, precompute or a matcher computed it."""
    tools = random_tools(random.Random(8), 3)
    warm = CompiledGrammar(tool_grammar(tools), twin(bpe_vocab))
    assert warm.mask_computations == 0
    warm.prewarm()
    assert warm.mask_computations == warm.auto.mask_computations > 0
    pre = CompiledGrammar(tool_grammar(tools), twin(bpe_vocab))
    pre.precompute()
    assert pre.mask_computations == pre.auto.mask_computations > 0


def test_prewarm_stops_at_its_position_budget(bpe_vocab):
    """Nested arrays with minItems give a position per item count at every level (here 60 x 60):
    prewarm visits at most `max_positions` of them, and the matcher stays exact past them."""
    inner = {"type": "array", "items": {"type": "string", "maxLength": 3}, "minItems": 60, "maxItems": 60}
    tool = Tool("grid", "", {"type": "object", "properties": {"rows": {"type": "array", "items": inner,
                                                                       "minItems": 60, "maxItems": 60}},
                             "required": ["rows"]})
    g = CompiledGrammar(tool_grammar([tool]), twin(bpe_vocab))
    assert g.auto.prewarm(g.start_state, max_positions=500) == 500
    full = CompiledGrammar(tool_grammar([tool]), twin(bpe_vocab))
    assert full.auto.prewarm(full.start_state, max_positions=10**6) > 3_600  # what the budget cut
    walk_against_oracle(g, random.Random(3), walks=2, steps=30)


def test_a_prepared_vocabulary_leaves_no_index_for_the_first_compile_to_build(smollm2_vocab):
    """`prepare_vocabulary` builds every per-vocabulary index a tool table's masks use, so the
    first compile and its masks (prewarm: every position) pay only for the grammar. SmolLM2,
    the three-tool table and 128 mixed tools: no index is added or grown."""
    from railcall.bench.workloads import seed_tools, synthetic_tools
    from railcall.matcher import prepare_vocabulary

    v = dataclasses.replace(smollm2_vocab, key="prepared-twin", _extra={})
    prepare_vocabulary(v)
    grammar_caches = {"railcall_cache", "tag_ids", "tag_token_ids"}  # per grammar, not indexes

    def indexes():
        return {k: len(x) if isinstance(x, (dict, list, set)) else id(x) for k, x in v._extra.items()
                if k not in grammar_caches}

    before = indexes()
    for tools in (seed_tools(), synthetic_tools(128)):
        CompiledGrammar(tool_grammar(tools), v).prewarm()
    assert indexes() == before


def test_a_bounded_integer_takes_exactly_the_prefixes_of_its_values():
    """A bounded integer's steps, against every value in its range written out: a prefix (sign
    and digits, up to four characters) is taken exactly when some in-range integer starts with
    it, and the integer may end exactly where the prefix is such a value. Bounds of either sign,
    open on either side, one value, and spans that cross a power of ten."""
    from railcall.grammar.instructions import Accept
    from railcall.grammar.numbers import JInt

    window = 10**5  # an open side, cut far beyond the prefixes tried
    for lo, hi in [(0, 9), (-5, 5), (-100, -7), (3, 3), (None, 40), (-40, None), (10, 99), (150, 2100),
                   (7, 7000), (-7000, -7), (0, 0), (-1, 0), (95, 105), (None, -3), (12, None), (-999, 999)]:
        ins = JInt(lo, hi, Accept())
        values = range(-window if lo is None else lo, (window if hi is None else hi) + 1)
        # JSON also writes 0 as -0: taken where a minus sign may start the integer at all
        texts = {str(v) for v in values} | ({"-0"} if 0 in values and values[0] < 0 else set())
        prefixes = {t[:k] for t in texts for k in range(1, 5)}
        level = {"": (0, False, 0)}
        for _ in range(4):
            nxt = {}
            for text, loc in level.items():
                for b in b"-0123456789":
                    n = ins._next(loc, b)
                    t = text + chr(b)
                    assert (n is not None) == (t in prefixes), (lo, hi, t)
                    if n is not None:
                        assert ins.ends(n) == (t in texts), (lo, hi, t)
                        nxt[t] = n
            level = nxt


def test_the_longest_prefix_tokens_start_with_is_found_from_the_reach_index_or_a_search():
    """`_token_lcp` answers up to three bytes from the reach index and searches the sorted tokens
    past that: the same length as the search alone, for texts that stop before, at and past
    three bytes, and where the longest token under a prefix is exactly three bytes long."""
    from railcall.matcher.indexes import _common_prefix

    pieces = [bytes([b]) for b in range(97, 103)] + ["ab", "abc", "abcd", "abcde", "bcd", "cd", "dea", "deab", "ef"]
    v = Vocabulary.from_pieces(pieces, specials=["<end>"], stop=["<end>"])
    auto = CompiledGrammar(tool_grammar([Tool("f", "", {"type": "object", "properties": {}})]), v).auto
    rng = random.Random(3)
    texts = [b"", b"z", b"a", b"ab", b"abc", b"abcz", b"abcdef", b"bcd", b"bcdd", b"dez", b"deabz", b"ef", b"efg"]
    texts += [bytes(rng.choice(b"abcdefz") for _ in range(rng.randrange(7))) for _ in range(3000)]
    for text in texts:
        assert auto._token_lcp(text) == _common_prefix(v.sorted_index[0], text), text
