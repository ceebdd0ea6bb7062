"""Per-vocabulary indexes for JSON grammars: how every token behaves inside a JSON string or
number, token reach by prefix, and the sorted views the masks search. Built once per vocabulary
(vectorised, cached in `Vocabulary._extra`), shared by every grammar on it.
"""

from __future__ import annotations

import gc
from bisect import bisect_left
from typing import NamedTuple

import numpy as np

from railcall import speedups
from railcall.bitmask import pack_ids
from railcall.grammar.numbers import NUM_FINAL, NUM_NEXT
from railcall.grammar.strings import EXIT, JSTR_INC, JSTR_NEXT, N_SUB
from railcall.vocab import Vocabulary


def jstr_inside(vocab: Vocabulary, sub: int, words: int, room: int | None = None) -> tuple[np.ndarray, int]:
    """The packed mask of every token that stays inside a JSON string from substate `sub` and
    adds at most `room` characters (None: any token fits), and how many tokens that is: the bulk
    of every in-string mask, shared per vocabulary. Near a string's cap each remaining room has
    its own mask; they are kept too (at most the longest token's length of them per substate)."""
    cache = vocab._extra.setdefault("jstr_packed", {})
    if room is not None and room >= vocab.max_token_len:
        room = None
    hit = cache.get((sub, room))
    if hit is None:
        idx = jstr_index(vocab, sub)
        ids = idx.inside_ids if room is None else idx.inside_ids[idx.inside_chars <= room]
        hit = cache[(sub, room)] = (pack_ids(ids, words * 32), int(ids.size))
    return hit


class JStrIndex(NamedTuple):
    inside_ids: np.ndarray  # (k,) tokens that stay inside the string
    inside_chars: np.ndarray  # (k,) characters each adds
    inside_end: np.ndarray  # (k,) the substate each ends in
    exit_ids: np.ndarray  # (e,) tokens that close the string
    exit_chars: np.ndarray  # (e,) characters before the closing quote
    exit_pos: np.ndarray  # (e,) byte offset just after the closing quote


class JNumIndex(NamedTuple):
    inside_ids: np.ndarray  # (k,) tokens made only of number bytes the number accepts
    inside_len: np.ndarray  # (k,) their lengths
    exit_ids: np.ndarray  # (e,) tokens whose number part ends, in a final substate, before their end
    exit_pos: np.ndarray  # (e,) the byte offset where the number ends (>= 1)


def number_margin(vocab: Vocabulary) -> int:
    """The most characters of a JSON number one token can add, from any point of a number: the
    margin past which a number's masks no longer depend on its length. It counts every byte the
    number accepts before a token leaves it, wherever it leaves (what follows a number may itself
    start with a number character, `1e` then `ex`, say). Tighter than the longest run of number
    bytes in a token (SmolLM2 has a token of 64 dashes; no number holds two), so that number
    states far from the length cap share their masks."""
    hit = vocab._extra.get("number_margin")
    if hit is None:
        hit = 0
        lens = vocab.lengths
        B = vocab.byte_matrix
        for integer in (False, True):
            table = NUM_NEXT[int(integer)].astype(np.int64)
            for sub in range(table.shape[0]):
                idx = np.flatnonzero(lens > 0)
                cur = np.full(idx.size, sub, dtype=np.int64)
                j = 0
                while idx.size:
                    t = table[cur, B[j, idx]]
                    go = t >= 0
                    if not go.any():
                        break
                    j += 1  # some token's first j bytes all stay inside the number
                    idx, cur = idx[go], t[go]
                    keep = lens[idx] > j
                    idx, cur = idx[keep], cur[keep]
                hit = max(hit, j)
        vocab._extra["number_margin"] = hit
    return hit


def jnum_index(vocab: Vocabulary, sub: int, integer: bool) -> JNumIndex:
    """Per vocabulary, number substate and kind: how each text token continues a JSON number.
    Computed once (vectorised), shared by every grammar on this vocabulary."""
    cache = vocab._extra.setdefault("jnum", {})
    hit = cache.get((sub, integer))
    if hit is not None:
        return hit
    table = NUM_NEXT[int(integer)].astype(np.int64)
    lens = vocab.lengths
    B = vocab.byte_matrix
    idx = np.flatnonzero(lens > 0)
    cur = np.full(idx.size, sub, dtype=np.int64)
    inside_ids, inside_len, exit_ids, exit_pos = [], [], [], []
    j = 0
    while idx.size:
        b = B[j, idx]
        t = table[cur, b]
        stop = t < 0
        if j > 0 and stop.any():
            # the number ends before byte j: legal only from a final substate
            ends = stop & NUM_FINAL[cur]
            exit_ids.append(idx[ends])
            exit_pos.append(np.full(int(ends.sum()), j, dtype=np.int64))
        go = ~stop
        idx, cur = idx[go], t[go]
        j += 1
        done = lens[idx] == j
        if done.any():
            inside_ids.append(idx[done])
            inside_len.append(np.full(int(done.sum()), j, dtype=np.int64))
            keep = ~done
            idx, cur = idx[keep], cur[keep]

    def cat(xs):
        return np.concatenate(xs) if xs else np.zeros(0, dtype=np.int64)

    hit = JNumIndex(cat(inside_ids), cat(inside_len), cat(exit_ids), cat(exit_pos))
    cache[(sub, integer)] = hit
    return hit


def _common_prefix(sorted_bytes: list[bytes], data: bytes) -> int:
    """The length of the longest prefix of `data` that some item of `sorted_bytes` starts with
    (the longest common prefix with one of its neighbours in the sorted order)."""
    a = bisect_left(sorted_bytes, data)
    best = 0
    for t in (sorted_bytes[a - 1] if a else b"", sorted_bytes[a] if a < len(sorted_bytes) else b""):
        n = min(len(t), len(data))
        i = best
        if t[:i] != data[:i]:
            continue
        while i < n and t[i] == data[i]:
            i += 1
        best = i
    return best


def quote_rests(vocab: Vocabulary) -> list[bytes]:
    """Every text that follows a `"` in some text token (b"" where it ends one), sorted and
    distinct: all that a token that closes a JSON string can spell after the quote, whether the
    token started inside the string or before it (63 texts on SmolLM2, 325 on Gemma 3)."""
    hit = vocab._extra.get("quote_rests")
    if hit is None:
        found = {b""}
        for t in vocab.sorted_index[0]:
            i = t.find(b'"')
            while i >= 0:
                found.add(t[i + 1 :])
                i = t.find(b'"', i + 1)
        hit = vocab._extra["quote_rests"] = sorted(found)
    return hit


def quote_rests_within(vocab: Vocabulary, reach: int) -> list[bytes]:
    """`quote_rests` no longer than `reach` bytes: what a token that must close a string within
    a few bytes of where it starts can spell after the quote."""
    memo = vocab._extra.setdefault("quote_rests_within", {})
    hit = memo.get(reach)
    if hit is None:
        hit = memo[reach] = [r for r in quote_rests(vocab) if len(r) <= reach]
    return hit


# (prefix, skip) pairs whose quote texts are memoised per vocabulary: the tails of a table's
# literals before a string (`":"`, `["`, `"`), a few dozen; past this the memo starts again
QUOTE_PREFIXES_LIMIT = 4096


def quote_rests_after(vocab: Vocabulary, p: bytes, skip: int = 0) -> list[bytes]:
    """The texts that follow a `"` at least `skip` bytes past the first len(p) of a text token
    starting with `p`, sorted and distinct: all that such a token, having spelled `p` and gone
    into a string that owes `skip` more characters, can spell after the quote that closes it
    (a handful where `quote_rests` has hundreds)."""
    memo = vocab._extra.setdefault("quote_rests_after", {})
    hit = memo.get((p, skip))
    if hit is None:
        if len(memo) > QUOTE_PREFIXES_LIMIT:
            memo.clear()
        a, b = vocab.prefix_range(p)
        found = set()
        for t in vocab.sorted_index[0][a:b]:
            i = t.find(b'"', len(p) + skip)
            while i >= 0:
                found.add(t[i + 1 :])
                i = t.find(b'"', i + 1)
        hit = memo[(p, skip)] = sorted(found)
    return hit


def rests_reach(rests: list[bytes], p: bytes) -> int:
    """How many bytes past `p` the longest of the sorted texts `rests` that start with `p`
    spells (0 where none does)."""
    a = bisect_left(rests, p)
    upper = _prefix_upper(p)
    b = bisect_left(rests, upper, a) if upper is not None else len(rests)
    return max((len(r) for r in rests[a:b]), default=len(p)) - len(p)


def quote_reach(vocab: Vocabulary) -> int:
    """The longest of `quote_rests`: how far past a quote a token can reach."""
    hit = vocab._extra.get("quote_reach")
    if hit is None:
        hit = vocab._extra["quote_reach"] = max(map(len, quote_rests(vocab)))
    return hit


def jnum_ext(vocab: Vocabulary) -> int:
    """The most bytes a token that ends a number spells after it, from any substate, where what
    follows cannot start with a number character (0 on SmolLM2 and Gemma 3: no token holds a
    digit and then something else)."""
    hit = vocab._extra.get("jnum_ext")
    if hit is None:
        lens = vocab.lengths
        hit = 0
        for integer in (False, True):
            for sub in range(9):
                idx = jnum_index(vocab, sub, integer)
                if idx.exit_ids.size:
                    hit = max(hit, int((lens[idx.exit_ids] - idx.exit_pos).max()))
        vocab._extra["jnum_ext"] = hit
    return hit


def prefix_reach(vocab: Vocabulary) -> dict[bytes, int]:
    """Per prefix of one to three bytes of some text token, the length of the longest text token
    that starts with it (absent: none does). How far a token that starts on a literal can reach
    into it, and whether any token starts with a short prefix, in one look-up."""
    hit = vocab._extra.get("prefix_reach")
    if hit is None:
        hit = {}
        get = hit.get
        for b in vocab.sorted_index[0]:
            n = len(b)
            for k in range(1, min(n, 3) + 1):
                q = b[:k]
                if get(q, 0) < n:
                    hit[q] = n
        vocab._extra["prefix_reach"] = hit
    return hit


def sorted_lengths(vocab: Vocabulary) -> np.ndarray:
    """The lengths of `vocab.sorted_index`'s tokens, in its order."""
    hit = vocab._extra.get("sorted_lengths")
    if hit is None:
        hit = vocab._extra["sorted_lengths"] = vocab.lengths[vocab.sorted_index[1]]
    return hit


def special_flags(vocab: Vocabulary) -> bytes:
    """(size,) each token's special flag as a byte (1: special): consume_token's check, where a
    bytes index costs less than a numpy one."""
    hit = vocab._extra.get("special_flags")
    if hit is None:
        hit = vocab._extra["special_flags"] = bytes(np.asarray(vocab.special, dtype=np.uint8))
    return hit


def prepare_vocabulary(vocab: Vocabulary) -> None:
    """Build the per-vocabulary indexes the matcher uses (byte matrix, first-byte groups, the
    JSON-string index) now rather than on the first mask that needs them. Once per vocabulary:
    when a model is loaded, before the first request."""
    if vocab._extra.get("prepared"):
        return
    vocab.byte_matrix
    vocab.first_byte_index
    vocab.sorted_index
    sorted_ids_list(vocab)
    vocab.lookup
    vocab.duplicates
    vocab.special_id("")  # the special tokens by text (each compile resolves its tags there)
    special_flags(vocab)
    number_margin(vocab)
    words = (vocab.logits_width + 31) // 32
    for sub in range(N_SUB):
        jstr_index(vocab, sub)
        jstr_inside(vocab, sub, words)
    for room in range(vocab.max_token_len):  # between characters, near a string's cap
        jstr_inside(vocab, 0, words, room)
    for sub in range(N_SUB):
        jstr_exit_rests(vocab, sub)
        jstr_exit_groups(vocab, sub)
    for integer in (False, True):
        for sub in range(9):
            jnum_index(vocab, sub, integer)
    for p in STRING_OPENERS:
        jstr_after_prefix(vocab, p, 0)
        for skip in (0, 1):  # an optional string's characters owed, a required one's
            quote_rests_after(vocab, p, skip)
    for reach in range(quote_reach(vocab)):
        quote_rests_within(vocab, reach)
    jnum_ext(vocab)
    sorted_lengths(vocab)
    prefix_reach(vocab)
    # the token trie as the first-mask walk reads it (transitions.COMPILED): depth first where
    # the matcher runs compiled, by level from source; not both (Gemma 3: 10 MB and 37 MB)
    if "railcall.matcher.transitions" in speedups.status()["compiled"]:
        token_nodes(vocab)
    else:
        token_trie(vocab)
    vocab._extra["prepared"] = True
    # The indexes (and the tokenizer's objects before them) live as long as the vocabulary. One
    # full collection now moves them to the oldest generation; otherwise the young-generation
    # collections that a compile's allocations trigger traverse them all again (on Gemma 3's
    # 262k tokens, two such collections took ~17 ms of a 128-tool compile).
    gc.collect()


def _jstr_reach() -> list[bytes]:
    """The shortest bytes from between-characters (substate 0) into each substate of a JSON
    string body: an ordinary character, and the inside of each escape and multi-byte character."""
    table = JSTR_NEXT.tolist()
    reach = {0: b""}
    todo = [0]
    while todo:
        sub = todo.pop(0)
        for b in range(256):
            n = table[sub][b]
            if n >= 0 and n not in reach:
                reach[n] = reach[sub] + bytes([b])
                todo.append(n)
    return [b"a"] + [r for sub, r in sorted(reach.items()) if sub]


_JSTR_REACH = _jstr_reach()


def fill_stops(row: np.ndarray, vocab: Vocabulary) -> int:
    """Write the mask of the stop tokens alone into `row` (a matcher in its error state, or one
    whose grammar could not be built); return their count."""
    packed = vocab._extra.get("stop_mask")
    if packed is None:
        packed = vocab._extra["stop_mask"] = pack_ids(np.array(sorted(vocab.stop_ids), dtype=np.int64),
                                                      vocab.logits_width)
    row[...] = packed
    return len(vocab.stop_ids)


def sorted_ids_list(vocab: Vocabulary) -> list[int]:
    """`vocab.sorted_index[1]` as a Python list (slices of a few ids without numpy calls)."""
    hit = vocab._extra.get("sorted_ids_list")
    if hit is None:
        hit = vocab._extra["sorted_ids_list"] = vocab.sorted_index[1].tolist()
    return hit


class TokenTrie(NamedTuple):
    """The vocabulary's text tokens as a trie, one level per byte position: level d holds a node
    per distinct prefix of d + 1 bytes, ordered as the sorted tokens are, so a node's children
    are one contiguous run of the next level and the tokens under it one run of
    `vocab.sorted_index`. Per level (lists indexed by d, arrays by node):"""

    byte: list  # (n_d,) int64: the node's last byte
    child_lo: list  # (n_d,) int64: its children are nodes [child_lo, child_hi) of level d + 1
    child_hi: list
    end_lo: list  # (n_d,) int64: the tokens that are exactly its prefix: end_ids[d][end_lo:end_hi]
    end_hi: list
    end_ids: list  # token ids, grouped by node (several where a vocabulary repeats a text)
    under_lo: list  # (n_d,) int64: the tokens that start with its prefix are sorted_index[under_lo:under_hi]
    under_hi: list


def token_trie(vocab: Vocabulary) -> TokenTrie:
    """The vocabulary's token trie (see TokenTrie), built from the sorted tokens level by level,
    vectorised; once per vocabulary. A walk over it steps each distinct prefix once, where a walk
    over the tokens steps every token's every byte (SmolLM2: ~100k nodes against ~332k bytes),
    and drops a prefix's whole subtree where its byte is illegal."""
    hit = vocab._extra.get("token_trie")
    if hit is None:
        hit = vocab._extra["token_trie"] = _trie_levels(vocab)
    return hit


def _trie_levels(vocab: Vocabulary) -> TokenTrie:
    """`token_trie`, built (not cached)."""
    _, sid = vocab.sorted_index
    lens = vocab.lengths[sid]
    B = vocab.byte_matrix
    levels: tuple[list, ...] = ([], [], [], [], [], [], [], [])
    byte, child_lo, child_hi, end_lo, end_hi, end_ids, under_lo, under_hi = levels
    pos = np.arange(sid.size, dtype=np.int64)  # sorted positions of the tokens at least d + 1 bytes long
    parent = np.zeros(sid.size, dtype=np.int64)  # each one's node on the level above
    d = 0
    while pos.size:
        b = B[d, sid[pos]].astype(np.int64)
        start = np.ones(pos.size, dtype=bool)
        start[1:] = (parent[1:] != parent[:-1]) | (b[1:] != b[:-1])
        node = np.cumsum(start) - 1
        first = np.flatnonzero(start)
        n = first.size
        if d:  # this level's nodes run in their parents' order: each parent's children are a run
            above = np.arange(byte[d - 1].size)
            par = parent[first]
            child_lo.append(np.searchsorted(par, above, "left"))
            child_hi.append(np.searchsorted(par, above, "right"))
        byte.append(b[first])
        under_lo.append(pos[first])
        under_hi.append(np.append(pos[first[1:] - 1], pos[-1]) + 1)
        ends = lens[pos] == d + 1
        end_nodes = node[ends]
        at = np.arange(n)
        end_lo.append(np.searchsorted(end_nodes, at, "left"))
        end_hi.append(np.searchsorted(end_nodes, at, "right"))
        end_ids.append(sid[pos[ends]])
        keep = ~ends
        pos, parent = pos[keep], node[keep]
        d += 1
    if byte:  # the deepest level has no children
        child_lo.append(np.zeros(byte[-1].size, dtype=np.int64))
        child_hi.append(np.zeros(byte[-1].size, dtype=np.int64))
    return TokenTrie(*levels)


class TokenNodes(NamedTuple):
    """The token trie (TokenTrie) laid out depth first, for a walk node by node
    (`transitions.TransitionTable._walk_nodes`): a node, then its subtree, then its next sibling.
    Per node, (n,) arrays:"""

    byte: np.ndarray  # uint8: the node's last byte
    depth: np.ndarray  # int32: its prefix's length less one (0: a first byte)
    skip: np.ndarray  # int32: the first node after its subtree (a dead byte jumps there)
    lo: np.ndarray  # int32: the tokens that are exactly its prefix are ids[lo:lo + count]
    count: np.ndarray  # int32
    ids: np.ndarray  # (text tokens,) int64: vocab.sorted_index's ids


def token_nodes(vocab: Vocabulary) -> TokenNodes:
    """The vocabulary's token trie in depth-first order (see TokenNodes); once per vocabulary.
    Sorting the trie's nodes by (first token under them, depth) gives the depth-first order:
    a node comes after its ancestors (which share its first token, higher up) and before the
    nodes of its subtree, whose first tokens fall inside its run of sorted tokens. A node's
    own tokens are the first of that run (a text sorts before its extensions), so its subtree
    ends at the first node whose run starts at or past the end of its own."""
    hit = vocab._extra.get("token_nodes")
    if hit is not None:
        return hit
    trie = vocab._extra.get("token_trie") or _trie_levels(vocab)  # kept only where walks go by level
    depth = np.concatenate([np.full(b.size, d, dtype=np.int32) for d, b in enumerate(trie.byte)] or [np.zeros(0, np.int32)])
    cat = lambda parts: np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)  # noqa: E731
    lo, hi = cat(trie.under_lo), cat(trie.under_hi)
    count = cat(trie.end_hi) - cat(trie.end_lo)
    order = np.lexsort((depth, lo))
    lo, hi = lo[order], hi[order]
    hit = vocab._extra["token_nodes"] = TokenNodes(
        byte=cat(trie.byte)[order].astype(np.uint8), depth=depth[order],
        skip=np.searchsorted(lo, hi, "left").astype(np.int32), lo=lo.astype(np.int32),
        count=count[order].astype(np.int32), ids=vocab.sorted_index[1])
    return hit


def runs(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The concatenation of arange(lo[i], hi[i]) over i, without a Python loop."""
    count = hi - lo
    total = int(count.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    shift = np.repeat(lo - (np.cumsum(count) - count), count)
    return shift + np.arange(total, dtype=np.int64)


ONE_BYTE = [bytes((b,)) for b in range(256)]  # each byte as a bytes object: no bytes((b,)) per use


def _prefix_upper(p: bytes) -> bytes | None:
    """The least byte string greater than every string that starts with `p` (None: no bound)."""
    q = p.rstrip(b"\xff")
    if not q:
        return None
    return q[:-1] + bytes([q[-1] + 1])


def jstr_exit_rests(vocab: Vocabulary, sub: int) -> tuple[list[bytes], np.ndarray]:
    """Per vocabulary and substate: each string-closing token's text after its quote, sorted
    (the remainders), and the matching positions in `jstr_index(...).exit_ids`."""
    cache = vocab._extra.setdefault("jstr_rests", {})
    hit = cache.get(sub)
    if hit is None:
        idx = jstr_index(vocab, sub)
        tb = vocab.token_bytes
        rests = [tb[t][p:] for t, p in zip(idx.exit_ids.tolist(), idx.exit_pos.tolist())]
        order = sorted(range(len(rests)), key=rests.__getitem__)
        hit = cache[sub] = ([rests[i] for i in order], np.array(order, dtype=np.int64))
    return hit


def jstr_exit_groups(vocab: Vocabulary, sub: int) -> tuple[np.ndarray, list[bytes]]:
    """Per vocabulary and substate: the string-closing tokens grouped by their text after the
    quote. (group of each entry of `jstr_index(...).exit_ids`, the text of each group)."""
    cache = vocab._extra.setdefault("jstr_groups", {})
    hit = cache.get(sub)
    if hit is None:
        keys, order = jstr_exit_rests(vocab, sub)
        gid = np.zeros(len(keys), dtype=np.int64)
        rests: list[bytes] = []
        for i, k in enumerate(keys):
            if not rests or rests[-1] != k:
                rests.append(k)
            gid[order[i]] = len(rests) - 1
        hit = cache[sub] = (gid, rests)
    return hit


def jstr_moves(vocab: Vocabulary, sub: int) -> tuple[np.ndarray, np.ndarray]:
    """Per vocabulary and string substate, indexed by token id: the characters a token adds
    when it stays inside the string (-1 if it does not), and the substate it ends in. Lets
    consume_token move a string's thread by a whole token without stepping byte by byte."""
    cache = vocab._extra.setdefault("jstr_moves", {})
    hit = cache.get(sub)
    if hit is None:
        idx = jstr_index(vocab, sub)
        chars = np.full(vocab.size, -1, dtype=np.int32)
        end = np.zeros(vocab.size, dtype=np.int8)
        chars[idx.inside_ids] = idx.inside_chars
        end[idx.inside_ids] = idx.inside_end
        hit = cache[sub] = (chars, end)
    return hit


def jstr_index(vocab: Vocabulary, sub: int) -> JStrIndex:
    """Per vocabulary and string substate: how each text token behaves inside a JSON string.

    Tokens that stay inside the string and the characters they add; tokens that close it, the
    characters before the closing quote, and the byte offset just after it. Tokens that break
    the string (a raw control character, a bad escape, invalid UTF-8) are in neither. Computed
    once per substate (vectorised), shared by every grammar on this vocabulary.
    """
    cache = vocab._extra.setdefault("jstr", {})
    hit = cache.get(sub)
    if hit is None:
        hit = cache[sub] = _jstr_classify(vocab, np.flatnonzero(vocab.lengths > 0), 0, sub)
    return hit


def jstr_after_prefix(vocab: Vocabulary, p: bytes, sub: int) -> JStrIndex:
    """Per vocabulary, prefix and substate: `jstr_index` for the tokens longer than `p` that
    start with it, read from just after `p` (a literal that ends in a string's opening quote,
    `":"` or `["`, and the tokens that spell it and go on into the string). Cached: such
    prefixes are few, the tails of a grammar's literals."""
    cache = vocab._extra.setdefault("jstr_after", {})
    hit = cache.get((p, sub))
    if hit is None:
        a, b = vocab.prefix_range(p)
        ids = vocab.sorted_index[1][a:b]
        if len(cache) > JSTR_AFTER_LIMIT:
            cache.clear()
        hit = cache[(p, sub)] = _jstr_classify(vocab, ids[vocab.lengths[ids] > len(p)], len(p), sub)
    return hit


JSTR_AFTER_LIMIT = 4096  # cached (prefix, substate) classifications per vocabulary
# What precedes a string in compact JSON, ending in its opening quote: the tokens that spell one
# and go on into the string are classified when the vocabulary is prepared, not by the first
# mask that meets one (`"` alone, every string value's: ~0.6 ms on Gemma 3's vocabulary).
STRING_OPENERS = (b'"', b',"', b'["', b':"', b'":"', b'{"')


def _jstr_classify(vocab: Vocabulary, ids: np.ndarray, start: int, sub: int) -> JStrIndex:
    """How tokens `ids` behave in a JSON string entered in substate `sub` at their byte
    `start`: one vectorised step of the string automaton per byte position."""
    lens = vocab.lengths
    B = vocab.byte_matrix
    idx = np.asarray(ids, dtype=np.int64)
    cur = np.full(idx.size, sub, dtype=np.int64)
    chars = np.zeros(idx.size, dtype=np.int64)
    inside_ids, inside_chars, inside_end, exit_ids, exit_chars, exit_pos = [], [], [], [], [], []
    j = start
    while idx.size:
        b = B[j, idx]
        t = JSTR_NEXT[cur, b].astype(np.int64)
        inc = JSTR_INC[cur, b]
        ex = t == EXIT
        if ex.any():
            exit_ids.append(idx[ex])
            exit_chars.append(chars[ex])
            exit_pos.append(np.full(int(ex.sum()), j + 1, dtype=np.int64))
        ok = t >= 0
        idx, cur, chars = idx[ok], t[ok], chars[ok] + inc[ok]
        j += 1
        done = lens[idx] == j
        if done.any():
            inside_ids.append(idx[done])
            inside_chars.append(chars[done])
            inside_end.append(cur[done])
            keep = ~done
            idx, cur, chars = idx[keep], cur[keep], chars[keep]

    def cat(xs):
        return np.concatenate(xs) if xs else np.zeros(0, dtype=np.int64)

    return JStrIndex(cat(inside_ids), cat(inside_chars), cat(inside_end), cat(exit_ids), cat(exit_chars), cat(exit_pos))
