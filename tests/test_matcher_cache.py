"""The per-vocabulary mask cache: bounded in bytes, oldest entries dropped first, and masks stay
exact when it holds almost nothing (a state keeps its own mask; a new state recomputes)."""

from __future__ import annotations

import numpy as np

from railcall import CompiledGrammar, Matcher, Tool, allocate_bitmask, tool_grammar
from railcall.matcher import MaskCache, clear_caches, vocab_cache

from conftest import byte_level_vocab

TOOLS = [
    Tool("read_file", "", {"type": "object", "properties": {"path": {"type": "string"}, "n": {"type": "integer"}},
                           "required": ["path"]}),
    Tool("list_dir", "", {"type": "object", "properties": {"deep": {"type": "boolean"}}}),
]
CALLS = [b'{"tool":"read_file","args":{"path":"a\\"b","n":-12}}', b'{"tool":"list_dir","args":{"deep":true}}',
         b'{"tool":"list_dir","args":{}}', b'{"tool":"read_file","args":{"path":"x"}}']


def _entry(nbytes: int) -> tuple:
    return np.zeros(nbytes // 4, dtype=np.int32), 0, None, None


def test_cache_drops_oldest_first_within_its_budget():
    size = 64 + 400  # what one entry below counts for
    c = MaskCache(budget_bytes=8 * size)
    for k in range(8):
        c.put(k, _entry(400))
    assert len(c) == 8 and c.used == 8 * size
    assert c.get(0) is not None  # a hit does not make 0 the newest
    c.put(8, _entry(400))  # over budget: the oldest go in one batch, down to 7/8 of it (so a
    # full cache rebuilds once per eighth of its budget, not once per insertion)
    assert [k for k in range(9) if c.get(k) is not None] == list(range(2, 9))
    assert c.used == 7 * size <= c.budget * 7 // 8
    c.put(8, _entry(400))  # a key already held: nothing changes
    assert len(c) == 7 and c.used == 7 * size
    c.put("big", _entry(40_000))  # larger than the budget: kept alone (the newest always stays)
    assert len(c) == 1 and c.get("big") is not None and c.used == 64 + 40_000


def _walk_masks(vocab) -> list[np.ndarray]:
    cg = CompiledGrammar(tool_grammar(TOOLS), vocab)
    bm = allocate_bitmask(vocab.logits_width)
    out = []
    for call in CALLS:
        m = Matcher(cg)
        for b in call:
            m.fill_bitmask(bm)
            out.append(bm.copy())
            assert m.consume_bytes(bytes([b]))
        m.fill_bitmask(bm)
        out.append(bm.copy())
        assert m.is_accepting()
    return out


def test_masks_exact_when_the_cache_keeps_almost_nothing():
    roomy = byte_level_vocab()
    expected = _walk_masks(roomy)
    tight = byte_level_vocab()
    vocab_cache(tight).masks = MaskCache(budget_bytes=1)  # before any automaton is built on it
    got = _walk_masks(tight)
    assert len(vocab_cache(tight).masks) == 1
    assert all(np.array_equal(a, b) for a, b in zip(expected, got)) and len(got) == len(expected)
    # again after the state masks are dropped too: every mask recomputed from scratch
    clear_caches(tight)
    vocab_cache(tight).masks = MaskCache(budget_bytes=1)
    assert all(np.array_equal(a, b) for a, b in zip(expected, _walk_masks(tight)))


def test_literal_keys_stay_bounded_and_exact(monkeypatch):
    """The memo of literal texts' offset keys is bounded (a server compiling table after table
    must not grow it forever): past its limit it starts again, and masks stay exact."""
    from railcall.matcher import content_keys

    roomy = byte_level_vocab()
    expected = _walk_masks(roomy)
    monkeypatch.setattr(content_keys, "LITERAL_TEXTS_LIMIT", 3)
    tight = byte_level_vocab()
    got = _walk_masks(tight)
    assert all(np.array_equal(a, b) for a, b in zip(expected, got)) and len(got) == len(expected)
    memo = vocab_cache(tight).literal_cuts
    assert 0 < len(memo) <= 4
    assert len(vocab_cache(roomy).literal_cuts) > 4  # the same walks keep more where there is room


def _dense(entry: tuple, words: int) -> np.ndarray:
    from railcall.matcher.entries import entry_dense

    return entry_dense(entry, words)


def test_mask_entries_from_ids_and_unions_are_exact_in_every_branch():
    """`_Bits.entry` (a dict of words for a few ids, packed bits for many) and `_union` (a dict for
    a few sparse words, one dense accumulation otherwise, back to sparse where few words are
    set) against the bits set one id at a time, with the exact count."""
    from railcall.matcher.entries import _Bits, _union

    rng = np.random.default_rng(7)
    words = 1536
    for n_ids in (0, 1, 5, 40, 256, 257, 3000):
        for parts in (1, 3):
            ids = rng.choice(words * 32, size=n_ids, replace=False)
            want = np.zeros(words * 32, dtype=bool)
            want[ids] = True
            bits = _Bits(words)
            for k, part in enumerate(np.array_split(ids, parts)):
                bits.add(part.tolist() if k % 2 else part)  # lists and arrays alike
            bits.add(ids[: n_ids // 3])  # an id added twice counts once
            e = bits.entry()
            assert e[1] == n_ids and (e[0] is None) == (n_ids + n_ids // 3 <= 256)  # ids as added
            got = np.unpackbits(_dense(e, words).view(np.uint8), bitorder="little").astype(bool)
            assert (got == want).all()
    for sizes in ((1, 2), (3, 4, 5), (40, 50), (200, 200), (2000, 3)):
        entries, want = [], np.zeros(words * 32, dtype=bool)
        for n in sizes:
            ids = rng.choice(words * 32, size=n, replace=False)
            want[ids] = True
            b = _Bits(words)
            b.add(ids)
            entries.append(b.entry())
        u = _union(entries, words)
        got = np.unpackbits(_dense(u, words).view(np.uint8), bitorder="little").astype(bool)
        assert (got == want).all() and u[1] == int(want.sum())
        assert (u[0] is None) == (int(np.count_nonzero(_dense(u, words))) <= 256)
