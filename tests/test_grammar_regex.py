"""Pattern automata (grammar/regex.py): the same automaton and completion lengths as the plain
algorithms, built once per pattern, with lengths only where something asks for them.

The reference below is the construction this module used before it was made fast: subset
construction testing every NFA edge against every piece of the code-point line, and the
completion lengths swept over the whole automaton until nothing changed. The fast one must
give the same states in the same order, the same transitions and the same lengths, and so the
same masks (checked on random walks through corpus-like schemas)."""

from __future__ import annotations

import bisect
import random

import pytest

from railcall.grammar import regex, strings
from railcall.grammar.regex import MAX_UNICODE, SURROGATES, _NFA, CharDFA, RegexError
from railcall.grammar.schema import schema_grammar
from railcall.matcher import CompiledGrammar, Matcher

from conftest import byte_level_vocab

# Shaped like cfn-lint's slowest patterns, scaled down so that the reference stays quick: long
# bounded repetitions (chains of states), unanchored alternatives (one big cycle through the
# start), a repeated group, and the small cases (empty, a lone surrogate, a class that is all
# of Unicode).
PATTERNS = [
    r"^arn:.{16,200}$",
    r"\w+|arn:aws[-a-z]*:cloudformation:[a-z]{2}(-gov)?-[a-z]+-\d:\d{12}:stack/[a-zA-Z][-A-Za-z0-9]{0,12}/[0-9a-f]{8}",
    r"^(arn:aws(-[^:]+)?:kms:[a-z0-9-]*:[0-9]{4}:((key/[a-f0-9-]{8})|(alias/[a-zA-Z0-9-_/]+)))|([a-f0-9-]{8})",
    r"^arn:aws(?:-(?:cn|us-gov|iso))?:airflow:([a-z]{2}-(?:[a-z]+-)+[0-9]{1}):([0-9]{12}):wf/[a-zA-Z0-9_-]{1,20}$",
    r"^arn:[a-z0-9-\.]{1,20}:[a-z0-9-\.]{0,20}:[a-z0-9-\.]{0,20}:[^/].{0,60}$",
    r"^[a-zA-Z][a-zA-Z0-9-_]{0,40}-[a-zA-Z0-9]{10}$",
    r"^(?:[a-z]+-)+[0-9]$",
    r"(ab|a)*c{2,5}$",
    r"^\d{3}-\d{4}$",
    r"^[^\s\u00e9][\S]{0,5}\ud800?$",
    r"^$",
    r"",
    r"^[\s\S]*$",
    r"^\ud800",
]
CAPS = (0, 7, 64, 256)


def plain_ast(pattern: str):
    """The pattern's syntax tree as written (anchored), no repetition absorbed."""
    return regex._anchor(regex._Parser(pattern).parse(), pattern)


def reference_automaton(pattern: str):
    """(starts, targets, accepting): the plain subset construction, then dead states trimmed."""
    nfa = _NFA()
    s0 = nfa.state()
    final = nfa.build(plain_ast(pattern), s0)
    start = nfa.closure([s0])
    ids, order, trans = {start: 0}, [start], []
    i = 0
    while i < len(order):
        cur = order[i]
        i += 1
        pts = sorted({x for s in cur for ranges, _ in nfa.edges[s] for lo, hi in ranges for x in (lo, hi + 1)})
        row = []
        for a, b in zip(pts, pts[1:]):
            tgt = {t for s in cur for ranges, t in nfa.edges[s] if any(lo <= a <= hi for lo, hi in ranges)}
            if tgt:
                row.append((a, b - 1, nfa.closure(tgt)))
        for _, _, t in row:
            if t not in ids:
                if len(order) >= regex.MAX_DFA_STATES:
                    raise RegexError("pattern too complex")
                ids[t] = len(order)
                order.append(t)
        trans.append(row)
    accepting = [final in st for st in order]
    starts, targets = [], []
    for row in trans:
        st, tg, prev_end = [], [], None
        for a, b, t in row:
            if prev_end is not None and a > prev_end + 1:
                st.append(prev_end + 1)
                tg.append(-1)
            if tg and tg[-1] == ids[t] and prev_end == a - 1:
                prev_end = b
                continue
            st.append(a)
            tg.append(ids[t])
            prev_end = b
        if prev_end is not None and prev_end < MAX_UNICODE:
            st.append(prev_end + 1)
            tg.append(-1)
        if not st or st[0] > 0:
            st.insert(0, 0)
            tg.insert(0, -1)
        starts.append(st)
        targets.append(tg)
    live = {k for k in range(len(order)) if accepting[k]}
    changed = True
    while changed:
        changed = False
        for k in range(len(order)):
            if k not in live and any(t in live for t in targets[k]):
                live.add(k)
                changed = True
    if 0 not in live:
        raise RegexError("the pattern matches no string")
    return starts, [[t if t in live else -1 for t in row] for row in targets], accepting


def _surrogates_only(starts: list[int], i: int) -> bool:
    """Is the i-th interval of a state's sorted interval `starts` made of surrogates only?"""
    end = starts[i + 1] - 1 if i + 1 < len(starts) else MAX_UNICODE
    return SURROGATES[0] <= starts[i] and end <= SURROGATES[1]


def reference_lengths(starts, targets, accepting, length_cap: int) -> list[int]:
    """Every state swept, in order, until nothing changes."""
    n = len(starts)
    lengths = [1 if accepting[k] else 0 for k in range(n)]
    succ = [sorted({t for i, t in enumerate(targets[k]) if t >= 0 and not _surrogates_only(starts[k], i)})
            for k in range(n)]
    full = (1 << (length_cap + 1)) - 1
    changed = True
    while changed:
        changed = False
        for k in range(n):
            v = lengths[k]
            for t in succ[k]:
                v |= lengths[t] << 1
            v &= full
            if v != lengths[k]:
                lengths[k] = v
                changed = True
    return lengths


def random_pattern(rng: random.Random, depth: int = 0) -> str:
    atoms = ["a", "b", "[a-c]", "[^a]", ".", r"\d", r"\w", "(ab|c)", r"\ud800", "[\u00e9-\u00ea]"]
    parts = []
    for _ in range(rng.randint(1, 4)):
        x = rng.choice(atoms) if depth > 1 or rng.random() < 0.7 else f"({random_pattern(rng, depth + 1)})"
        q = rng.choice(["", "", "*", "+", "?", "{2}", "{0,3}", "{1,}", "{2,6}"])
        parts.append(x + q)
    body = "".join(parts)
    if rng.random() < 0.3:
        body += "|" + rng.choice(atoms)
    return rng.choice(["", "^"]) + body + rng.choice(["", "$"])


def _same_automaton(pattern: str, caps=CAPS) -> None:
    """The fast construction against the reference: the same language and completion lengths
    from every pair of states a string leads to, in no more states (every state that matches
    any rest of the string is one), and lengths equal to the plain sweep's over its own states."""
    try:
        ref = reference_automaton(pattern)
    except RegexError as e:
        if "no string" in str(e):
            with pytest.raises(RegexError):
                regex._automaton(plain_ast(pattern))
        return  # too many states for the plain construction: nothing to compare against
    ours = regex._automaton(plain_ast(pattern))
    assert len(ours[0]) <= len(ref[0]), pattern
    for cap in caps:
        dfa = CharDFA(*ours, cap)
        lengths = reference_lengths(*ours, cap)
        assert dfa.lengths == lengths, (pattern, cap)
        assert dfa.dist == [(v & -v).bit_length() - 1 if v else None for v in lengths]
        assert dfa.max_dist == max((d for d in dfa.dist if d is not None), default=0)
        assert equivalent(dfa, CharDFA(*ref, cap)), (pattern, cap)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_corpus_like_patterns_build_the_reference_automaton(pattern):
    _same_automaton(pattern)


def test_random_patterns_build_the_reference_automaton():
    rng = random.Random(7)
    for _ in range(200):
        _same_automaton(random_pattern(rng), caps=(rng.randint(0, 40), 96))


def test_the_shortest_string_settles_most_length_checks():
    rng = random.Random(11)
    for _ in range(200):
        p = random_pattern(rng)
        try:
            dfa = regex.compile_pattern(p, 40)
            dist = dfa.dist[0]
        except RegexError:
            continue
        assert dfa.shortest() == dist, p
        for lo, hi in ((0, 40), (0, 1), (3, 5), (7, 7), (12, 40), (0, 0)):
            assert dfa.can_end_within(lo, hi) == dfa.fits(0, 0, lo, hi), (p, lo, hi)
    dfa = regex.compile_pattern(r"^arn:[a-z]{1,20}:.{0,300}$", 2048)
    assert dfa.can_end_within(1, 2048) and dfa._node_lengths is None  # no lengths needed
    assert not dfa.can_end_within(0, 5)


def equivalent(a: CharDFA, b: CharDFA) -> bool:
    """The same language, and the same completion lengths from every pair of states a string
    leads to (a product walk)."""
    seen, todo = {(0, 0)}, [(0, 0)]
    while todo:
        x, y = todo.pop()
        if a.accepting[x] != b.accepting[y] or a.lengths[x] != b.lengths[y]:
            return False
        for cp in sorted(set(a.starts[x]) | set(b.starts[y])):
            nxt = (a.step(x, cp), b.step(y, cp))
            if (nxt[0] < 0) != (nxt[1] < 0):
                return False
            if nxt[0] >= 0 and nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return True


ABSORBED = [  # (pattern, states after absorption at most)
    (r"[a-zA-Z0-9_\-]{1,300}$", 3),
    (r"^[-a-zA-Z0-9+&@#/%?=~_|!:,.;]*[-a-zA-Z0-9+&@#/%=~_|]{1,200}", 6),
    (r"^https?://[-a-zA-Z0-9+&@#/%?=~_|!:,.;]*[-a-zA-Z0-9+&@#/%=~_|]{1,200}", 14),
    (r"^x.*.{2,90}y", 8),
    (r"^[a-z]{3,50}[a-z0-9]*$", 5),
    (r"^[a-z0-9]*[a-z]{0,40}[0-9]{1,4}$", 3),  # [0-9] is in [a-z0-9]: absorbed too
]


UNIVERSAL = [  # (pattern, states at most): once matched, an unanchored end accepts any rest
    (r"512|1024|2048|(0.5|1|2) GB", 30),
    (r"af|sq|ar|hy|eu|bn|bg|ca|zh|hr|cs|da|nl|en|et|fi|fr", 30),
    (r"^x.*y", 5),
    (r"ab", 5),
]


@pytest.mark.parametrize("pattern,most", UNIVERSAL)
def test_every_state_past_an_unanchored_match_is_one(pattern, most):
    collapsed = regex._automaton(regex.parse(pattern))
    assert len(collapsed[0]) <= most
    try:
        plain = reference_automaton(pattern)
    except RegexError as e:  # the plain construction grows past MAX_DFA_STATES
        assert "too complex" in str(e)
        return
    assert len(plain[0]) > len(collapsed[0])
    for cap in (0, 5, 64):
        assert equivalent(CharDFA(*collapsed, cap), CharDFA(*plain, cap)), (pattern, cap)


def test_an_unanchored_alternation_of_many_words_compiles():
    # cfn-lint's language codes and memory sizes: past MAX_DFA_STATES when every partial match
    # went on being tracked after the first full one
    words = "|".join(f"{a}{b}" for a in "abcdefghijklmnop" for b in "qrstuvwxyz")
    dfa = regex.compile_pattern(words, 2048)
    assert dfa.size < 400
    assert dfa.matches("xx aq yy") and not dfa.matches("xx qa yy")
    assert dfa.lengths[0] >> 2 & 1 and not dfa.lengths[0] & 3


@pytest.mark.parametrize("pattern,most", ABSORBED)
def test_a_star_absorbs_the_repetition_beside_it(pattern, most):
    absorbed = regex._automaton(regex.parse(pattern))
    plain = reference_automaton(pattern)
    assert len(absorbed[0]) <= most < len(plain[0])
    for cap in (0, 9, 256):
        assert equivalent(CharDFA(*absorbed, cap), CharDFA(*plain, cap)), (pattern, cap)


@pytest.mark.parametrize("pattern", ["^[a-z]*[a-z0-9]{1,5}$", "^a*(ab){1,3}$", "^[a-z]+[a-z]{2,4}$", "^(a|b)*a{1,3}$"])
def test_only_what_a_star_can_take_is_absorbed(pattern):
    # a class wider than the star's, a group, a star with a lower bound, a star over a group
    assert regex.parse(pattern) == plain_ast(pattern)


def test_random_patterns_absorb_to_the_same_language():
    rng = random.Random(11)
    for _ in range(200):
        p = random_pattern(rng)
        try:
            plain = CharDFA(*reference_automaton(p), 24)
        except RegexError:
            continue
        assert equivalent(CharDFA(*regex._automaton(regex.parse(p)), 24), plain), p


def test_excluding_and_product_keep_their_lengths():
    words = ["a", "ab", "name", "names", "é"]
    for cap in (0, 3, 40):
        ex = regex.excluding(words, cap)
        assert ex.lengths == reference_lengths(ex.starts, ex.targets, ex.accepting, cap)
        pr = regex.product([(ex, True), (regex.compile_pattern("^[a-z]{2,9}$", cap), True),
                            (regex.compile_pattern("x", cap), False)], cap)
        assert pr.lengths == reference_lengths(pr.starts, pr.targets, pr.accepting, cap)


def test_a_long_bounded_repetition_needs_no_dfa_for_its_lengths():
    # cfn-lint's ARN shape at its maxLength: 2,049 DFA states in a chain. Its completion lengths
    # come from the NFA (one loop on one node fills every length from its shortest on), so none
    # of those states is built to answer them.
    dfa = regex.compile_pattern(r"^arn:.{16,2044}$", 2048)
    assert dfa.fits(0, 0, 20, 2048) and not dfa.fits(0, 0, 0, 19)
    assert dfa.fits(0, 0, 2048, 2048) and not dfa.fits(0, 0, 2049, 2100)
    assert dfa.size == 1


def test_states_and_lengths_are_built_on_first_use_only():
    pattern = r"^lazy-[a-z]{1,30}$"
    dfa = regex.compile_pattern(pattern, 256)
    assert dfa.size == 1 and dfa._node_lengths is None  # the start state, nothing stepped from
    assert dfa.matches("lazy-abc") and not dfa.matches("lazy-")  # matching needs no lengths
    assert dfa.size <= 10 and dfa._node_lengths is None  # the states those strings visited
    assert dfa.fits(0, 0, 6, 256) and not dfa.fits(0, 0, 36, 256)
    assert dfa._node_lengths is not None
    assert dfa.max_dist == 6  # "lazy-" + one letter, from the start
    assert dfa.size <= 10


def test_a_schema_builds_a_pattern_once_and_its_lengths_at_its_own_cap():
    # The front end checks the pattern (at 256), the compiler builds it at maxLength: one
    # automaton, lengths at 2,048 only, and no state beyond the start before a string visits one.
    pattern = r"^arn:aws:once-[a-z]{2}:[0-9]{12}:.{1,300}$"
    schema = {"type": "object", "properties": {"Arn": {"type": "string", "pattern": pattern, "maxLength": 2048}},
              "required": ["Arn"], "additionalProperties": False}
    before = regex._pattern_automaton.cache_info().misses
    g = CompiledGrammar(schema_grammar(schema), byte_level_vocab())
    m = Matcher(g)
    m.legal_token_ids()
    assert regex._pattern_automaton.cache_info().misses == before + 1
    assert regex.compile_pattern(pattern, 2048)._node_lengths is None  # the shortest string sufficed
    for b in b'{"Arn":"':
        assert m.consume_token(b)
    m.legal_token_ids()  # inside the string: its lengths, at its own cap
    assert regex.compile_pattern(pattern, 256)._node_lengths is None
    assert regex.compile_pattern(pattern, 2048)._node_lengths is not None
    assert regex._pattern_automaton(pattern).explore() > 300  # what it would have cost eagerly
    assert len(regex._pattern_automaton(pattern).rows) > 300


def test_an_exploding_pattern_is_bounded_where_strings_take_it():
    # `(a|b)*a(a|b){8}`: its DFA remembers the last nine characters (2^9 states). Built on
    # demand, it costs what strings visit; past the bound, a clean RegexError.
    ast = regex.parse("^(a|b)*a(a|b){8}$")
    nfa = _NFA()
    final = nfa.build(ast, nfa.state())
    auto = regex._Subsets(nfa, frozenset((final,)), limit=40)
    dfa = CharDFA.over(auto, 64)
    assert dfa.matches("ab" * 3 + "a" + "b" * 8) and dfa.size <= 40
    rng = random.Random(3)
    with pytest.raises(RegexError, match="more than 40 automaton states"):
        for _ in range(200):
            dfa.matches("".join(rng.choice("ab") for _ in range(12)))
    assert dfa.size == 40


# Corpus-like schemas (CloudFormation resource properties), written here rather than read
# from the corpus.
SCHEMAS = [
    {"type": "object", "additionalProperties": False, "required": ["VpcID", "Region"],
     "properties": {
         "Arn": {"type": "string", "minLength": 20, "maxLength": 300, "pattern": "^arn:.{16,296}$"},
         "VpcID": {"type": "string", "minLength": 12, "maxLength": 21, "pattern": "^vpc-[0-9a-fA-F]{8,}$"},
         "Region": {"type": "string", "maxLength": 255, "pattern":
                    "^(us(-gov)?|ap|ca|cn|eu|sa)-([a-z]{2}-)?(central|north|south(?:east|west)|east|west)-[0-9]$"},
         "Key": {"type": "string", "maxLength": 400, "pattern":
                 r"^(arn:aws(-[^:]+)?:kms:[a-z0-9-]*:[0-9]{4}:((key/[a-f0-9-]{8})|(alias/[a-zA-Z0-9-_/]+)))|([a-f0-9-]{8})"}}},
    {"type": "object", "additionalProperties": False, "required": ["Stack"],
     "properties": {
         "Stack": {"type": "string", "pattern":
                   r"\w+|arn:aws[-a-z]*:cloudformation:[a-z]{2}(-gov)?-[a-z]+-\d:\d{12}:stack/[a-zA-Z][-A-Za-z0-9]{0,12}"},
         "Tags": {"type": "array", "maxItems": 3, "items": {
             "type": "object", "additionalProperties": False, "required": ["Key"],
             "properties": {"Key": {"type": "string", "minLength": 1, "maxLength": 128,
                                    "pattern": "^(?:[a-z]+-)+[0-9]$"},
                            "Value": {"type": "string", "maxLength": 40, "pattern": r"^[\s\S]*$"}}}}}},
    {"type": "object", "additionalProperties": False, "required": ["Name", "Url"],
     "properties": {
         "Name": {"type": "string", "minLength": 1, "maxLength": 300, "pattern": r"[a-zA-Z0-9_\-]{1,300}$"},
         "Url": {"type": "string", "maxLength": 220, "pattern":
                 r"^https?://[-a-zA-Z0-9+&@#/%?=~_|!:,.;]*[-a-zA-Z0-9+&@#/%=~_|]{1,200}"},
         "Id": {"type": "string", "maxLength": 60, "pattern": r"^[a-z0-9]*[a-z]{0,40}[0-9]{1,4}$"}}},
]


def _walk_masks(schema, seed: int, walks: int = 6, steps: int = 120) -> list[list[int]]:
    g = CompiledGrammar(schema_grammar(schema), byte_level_vocab())
    rng = random.Random(seed)
    out = []
    for _ in range(walks):
        m = Matcher(g)
        for _ in range(steps):
            if m.is_done():
                break
            legal = m.legal_token_ids().tolist()
            out.append(legal)
            if not legal:
                break
            closers = [t for t in legal if t < 256 and bytes([t]) in b'"}],']
            t = rng.choice(closers) if closers and rng.random() < 0.3 else rng.choice(legal)
            assert m.consume_token(t)
    return out


def _clear_pattern_caches():
    regex._pattern_automaton.cache_clear()
    regex.compile_pattern.cache_clear()
    strings.char_dfa.cache_clear()


class ReferenceDFA(CharDFA):
    """The plain automaton built whole, its lengths swept over every state: what a CharDFA was
    before it was built on demand, through the interface the byte machine uses."""

    def __init__(self, pattern: str, length_cap: int):
        self._st, self._tg, self.accepting = reference_automaton(pattern)
        self._ls = reference_lengths(self._st, self._tg, self.accepting, length_cap)
        self.length_cap = length_cap

    def row(self, k):
        return self._st[k], self._tg[k]

    def step(self, k, cp):
        i = bisect.bisect_right(self._st[k], cp) - 1
        return self._tg[k][i] if i >= 0 else -1

    def targets_in(self, k, lo, hi):
        st, tg = self._st[k], self._tg[k]
        ends = [b - 1 for b in st[1:]] + [MAX_UNICODE]
        return {t for a, b, t in zip(st, ends, tg) if t >= 0 and a <= hi and b >= lo}

    def length_set(self, k):
        return self._ls[k]

    def shortest(self):
        v = self._ls[0]
        return (v & -v).bit_length() - 1 if v else None

    @property
    def max_dist(self):
        return max(((v & -v).bit_length() - 1 for v in self._ls if v), default=0)


@pytest.mark.parametrize("i", range(len(SCHEMAS)))
def test_masks_are_those_of_the_reference_automaton(i, monkeypatch):
    calls = {"reference": 0}

    def ref_pattern(pattern, length_cap=256):  # nothing absorbed, nothing collapsed, nothing lazy
        calls["reference"] += 1
        return ReferenceDFA(pattern, length_cap)

    _clear_pattern_caches()
    monkeypatch.setattr(regex, "compile_pattern", ref_pattern)
    try:
        expected = _walk_masks(SCHEMAS[i], seed=i)
        assert calls["reference"]  # the reference was what ran
    finally:
        monkeypatch.undo()
        _clear_pattern_caches()
    assert _walk_masks(SCHEMAS[i], seed=i) == expected


@pytest.mark.parametrize("pattern, words, not_words", [
    (r"^([a-c]|[x-z]|[0-2])+$", ["a", "x0b", "2zc1"], ["", "d", "a-"]),
    (r"^([ぁ-ゟ]|[ァ-ヿ]|[一-鿿])+( ([ぁ-ゟ]|[ァ-ヿ]|[一-鿿])+)*$", ["ひらがな", "カタ 漢字", "日本"], ["", " 日", "日 ", "a"]),
])
def test_states_that_differ_only_in_which_alternative_ended_are_one(pattern, words, not_words):
    """After any character of a repeated alternation the future is the same, whichever
    alternative matched it: one state, not one per alternative (each would be a new matcher
    state and a new walk of the vocabulary for its first mask)."""
    dfa = regex.compile_pattern(pattern)
    assert dfa.size == 1
    for w in words:
        assert dfa.matches(w), w
    for w in not_words:
        assert not dfa.matches(w), w
    dfa.auto.explore()
    # the start and after a character; the second pattern adds after a space and after a
    # character of a later word (its classes are other NFA states: equal futures, not merged)
    assert dfa.size == (2 if "( " not in pattern else 4)
    ref = CharDFA(*reference_automaton(pattern), 256)
    assert ref.auto.explore() > dfa.size and equivalent(dfa, ref)
