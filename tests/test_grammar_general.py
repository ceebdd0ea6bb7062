"""General grammars over text: regex, Lark and GBNF front ends (railcall.grammar.cfg, .lark, .gbnf).

Every text a random walk writes under a grammar is checked by a parser railcall does not share:
Python's `re.fullmatch` for regexes, the `lark` package (Earley, every tokenization) for Lark,
and for GBNF the same language written in Lark. Errors name the rule, line and column."""

from __future__ import annotations

import random
import re

import lark
import pytest

from railcall import GrammarError, Matcher, compiled_grammar, gbnf_grammar, lark_grammar, regex_grammar
from railcall.bench.grammars import CALC_LARK, REGEXES, SHELL_LARK, SQL_LARK
from railcall.grammar import ir

# The same languages in GBNF and in Lark (the Lark one checks what the GBNF one lets a model write).
GBNF_PAIRS = {
    "list": (r'''
root ::= item+
item ::= "- " [^\r\n]{1,40} "\n"
''', r'''
start: item+
item: "- " /[^\r\n]{1,40}/ "\n"
'''),
    "nested": (r'''
root  ::= value
value ::= "[" ws ( value ( "," ws value )* )? "]" | num
num   ::= "-"? [0-9]+
ws    ::= [ ]?
''', r'''
start: value
value: "[" WS? (value ("," WS? value)*)? "]" | NUM
NUM: /-?[0-9]+/
WS: " "
'''),
    "kv": (r'''
# key=value lines, quoted or bare values
root   ::= line{1,5}
line   ::= key "=" (bare | quoted) "\n"
key    ::= [a-z] [a-z0-9_]*
bare   ::= [A-Za-z0-9.]+
quoted ::= "\"" ( [^"\\\n] | "\\" ["\\n] )* "\""
''', r'''
start: line ~ 1..5
line: KEY "=" (BARE | QUOTED) "\n"
KEY: /[a-z][a-z0-9_]*/
BARE: /[A-Za-z0-9.]+/
QUOTED: /"([^"\\\n]|\\["\\n])*"/
'''),
}

# with \d and \w: ASCII in railcall's dialect, Unicode in Python's `re`, so every text fits both
PATTERNS = [*REGEXES.values(), r"\d{4}-\d{2}", r"(yes|no|maybe)( because [a-z ]{1,30})?\.", r"\w+@\w+\.com"]


def walk(compiled, vocab, rng: random.Random, steps: int = 40) -> bytes:
    """A random walk under the grammar, ended by a stop token where one is legal (often) or by
    the forced finish; the text it wrote."""
    m = Matcher(compiled)
    out = bytearray()
    stops = set(vocab.stop_ids)
    for _ in range(steps):
        legal = m.legal_token_ids().tolist()
        assert legal, f"a dead end after {bytes(out)!r}"
        if any(t in stops for t in legal) and rng.random() < 0.25:
            return bytes(out)
        t = rng.choice([t for t in legal if t not in stops] or legal)
        if t in stops:
            return bytes(out)
        assert m.consume_token(t)
        out += vocab.token_bytes[t]
    for t in m.finish():
        out += vocab.token_bytes[t]
    assert m.is_accepting()
    return bytes(out)


def texts(grammar, vocab, n: int, seed: int = 0) -> list[str]:
    compiled = compiled_grammar(grammar, vocab)
    rng = random.Random(seed)
    return [walk(compiled, vocab, rng).decode("utf-8") for _ in range(n)]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_regex_walks_fullmatch(smollm2_vocab, pattern):
    for text in texts(regex_grammar(pattern), smollm2_vocab, 12):
        assert re.fullmatch(pattern, text), (pattern, text)


def test_regex_anchors_are_the_whole_text_and_errors_name_the_pattern():
    assert regex_grammar("^ab$") == regex_grammar("ab")
    with pytest.raises(GrammarError, match=r"lookaround"):
        regex_grammar("(?=a)b")
    with pytest.raises(GrammarError, match="backreference|not supported|unknown"):
        regex_grammar(r"(a)\1")


@pytest.mark.parametrize("source", [CALC_LARK, SQL_LARK, SHELL_LARK], ids=["calc", "sql", "shell"])
def test_lark_walks_parse_with_lark(smollm2_vocab, source):
    parser = lark.Lark(source, parser="earley", lexer="dynamic_complete")
    for text in texts(lark_grammar(source), smollm2_vocab, 12):
        parser.parse(text)  # raises if lark's own parser rejects it


@pytest.mark.parametrize("name", sorted(GBNF_PAIRS))
def test_gbnf_walks_parse_as_the_same_language_in_lark(smollm2_vocab, name):
    gbnf, same = GBNF_PAIRS[name]
    parser = lark.Lark(same, parser="earley", lexer="dynamic_complete")
    for text in texts(gbnf_grammar(gbnf), smollm2_vocab, 12, seed=1):
        parser.parse(text)


def test_gbnf_and_lark_accept_and_refuse_the_same_texts(smollm2_vocab):
    """Byte by byte: the matcher accepts a text exactly when lark's parser does."""
    gbnf, same = GBNF_PAIRS["nested"]
    compiled = compiled_grammar(gbnf_grammar(gbnf), smollm2_vocab)
    parser = lark.Lark(same, parser="earley", lexer="dynamic_complete")
    for text in ["[]", "[1,[2],[ [3]]]", "-12", "[1,]", "[ ]", "[[[[", "1 ", "[-0, 7]", "[7 ,1]"]:
        m = Matcher(compiled)
        ours = m.consume_bytes(text.encode()) and m.is_accepting()
        try:
            parser.parse(text)
            theirs = True
        except lark.exceptions.LarkError:
            theirs = False
        assert ours == theirs, text


def test_lark_json_embeds_a_schema(smollm2_vocab):
    source = 'start: "Answer: " %json {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}},' \
             ' "required": ["n"], "additionalProperties": false}\n'
    for text in texts(lark_grammar(source), smollm2_vocab, 8):
        assert re.fullmatch(r'Answer: \{"n":(0|[1-9][0-9]*)\}', text), text


def test_recursion_nests_and_repetition_does_not(smollm2_vocab):
    """A rule entered inside itself and returned from nests (MAX_DEPTH levels); repetition and
    a rule that ends in a rule do not."""
    from railcall.grammar.instructions import MAX_DEPTH

    g = compiled_grammar(lark_grammar('start: item*\nitem: "(" item* ")" | "x"\n'), smollm2_vocab)
    assert Matcher(g).consume_bytes(b"x" * 500 + b"(((x)))" * 50)
    deep = Matcher(g)
    assert deep.consume_bytes(b"(" * MAX_DEPTH) and not deep.consume_bytes(b"(")
    whole = Matcher(g)
    assert whole.consume_bytes(b"(" * MAX_DEPTH + b")" * MAX_DEPTH) and whole.is_accepting()
    right = Matcher(compiled_grammar(lark_grammar('start: a\na: "-" a | "x"\n'), smollm2_vocab))
    assert right.consume_bytes(b"-" * 500 + b"x") and right.is_accepting()


def test_a_calculator_takes_forty_nested_parentheses(smollm2_vocab):
    """Each parenthesis of the calculator nests three rules (expr, term, factor): 40 of them are
    120 frames, within the limit, and the expression still closes; the Lark parser agrees."""
    text = b"(" * 40 + b"1+2" + b")" * 40 + b"*3"
    m = Matcher(compiled_grammar(lark_grammar(CALC_LARK), smollm2_vocab))
    assert m.consume_bytes(text) and m.is_accepting()
    lark.Lark(CALC_LARK, parser="earley").parse(text.decode())


def test_a_nested_state_walked_whole_is_the_union_of_its_threads(smollm2_vocab):
    """A state whose rule threads wait with a stack (calc's parentheses) is masked by one walk of
    the whole state (each such thread's mask is keyed by its whole stack, so it is shared with no
    other depth): at every such state random walks meet, that mask is exactly the union of its
    threads' own masks, as a state of unstacked threads is masked."""
    import numpy as np

    from railcall.bitmask import unpack_bitmask
    from railcall.matcher.automaton import _stacked
    from railcall.matcher.entries import entry_dense

    g = compiled_grammar(lark_grammar(CALC_LARK), smollm2_vocab)
    auto, width = g.auto, smollm2_vocab.logits_width
    legal = lambda entry: unpack_bitmask(entry_dense(entry, auto.words), width)  # noqa: E731
    rng, checked = random.Random(3), 0
    for _ in range(12):
        m = Matcher(g)
        for _ in range(30):
            s = m._states[-1]
            threads = auto.threads(s)
            if len(threads) > 1 and _stacked(threads):
                union = np.zeros(width, dtype=bool)
                for t in threads:
                    union |= legal(auto._thread_mask(t))
                if auto.is_accepting(s):
                    union[auto.stop_ids] = True
                assert np.array_equal(legal(auto.mask(s)), union)
                checked += 1
            ids = [t for t in m.legal_token_ids().tolist() if t not in smollm2_vocab.stop_ids]
            if not ids:
                break
            assert m.consume_token(rng.choice(ids))
    assert checked > 50


@pytest.mark.parametrize("source, where", [
    ('start: a\na: a "x" | "y"\n', r"line 2, column 1: rule 'a' is left-recursive \(a -> a"),
    ('start: b\nb: c "x"\nc: b | "y"\n', r"rule 'b' is left-recursive \(b -> c -> b"),
    ('start: foo\n', r"line 1, column 8: 'foo' is used in rule 'start' but never defined"),
    ('start: "a"\nstart: "b"\n', r"line 2, column 1: 'start' is defined twice"),
    ('start: /a/i\n', r"line 1, column 11: regex flags \(i\)"),
    ('start: x{1}\n', r"templates"),
    ('%import other.X\nstart: "a"\n', r"line 1, column 9: .*only Lark's common terminals"),
    ('%declare X\nstart: "a"\n', r"%declare is not supported"),
    ('start: "a\n', r"line 1, column 8: a literal without its closing"),
    ('start: ("a"\n', r"line 1, column 8: a `\(` without its `\)`"),
    ('start: (x?)*\nx: "(" x ")" | "y"\n', r"unbounded repetition of something that can be empty, in the part "
                                               r"using 'x'"),
    ('nostart: "a"\n', r"no 'start' rule"),
])
def test_lark_errors_name_the_place(source, where):
    with pytest.raises(GrammarError, match=where):
        lark_grammar(source)


@pytest.mark.parametrize("source, where", [
    ('root ::= x\nx ::= x "a" | "b"\n', r"GBNF grammar, line 2, column 1: rule 'x' is left-recursive"),
    ('root ::= [z-a]\n', r"line 1, column 10: a range from 'z' down to 'a'"),
    ('root ::= "a" <[123]>\n', r"line 1, column 14: token references"),
    ('root ::= "\\q"\n', r"line 1, column 11: unknown escape"),
    ('root ::= "a"{3,1}\n', r"at least 3 and at most 1"),
    ('root ::= item\n', r"'item' is used in rule 'root' but never defined"),
    ('item ::= "a"\n', r"no 'root' rule"),
    ('root ::= ("a"\n', r"line 1, column 10: a `\(` without its `\)`"),
    ('root = "a"\n', r"line 1, column 1: expected a rule"),
])
def test_gbnf_errors_name_the_place(source, where):
    with pytest.raises(GrammarError, match=where):
        gbnf_grammar(source)


def test_ir_text_and_repeat_directly(smollm2_vocab):
    g = ir.Grammar(ir.Seq(ir.Lit("ids:"), ir.Repeat(ir.Seq(ir.Lit(" "), ir.Text("[A-Z]{2}[0-9]{2,3}")), 1, 3),
                          ir.Lit(".")))
    for text in texts(g, smollm2_vocab, 10):
        assert re.fullmatch(r"ids:( [A-Z]{2}[0-9]{2,3}){1,3}\.", text), text
    with pytest.raises(GrammarError, match="empty"):
        compiled_grammar(ir.Grammar(ir.Repeat(ir.Text("a?"))), smollm2_vocab)


def test_text_is_not_capped_unless_asked(smollm2_vocab):
    """A regular stretch has no length cap (the reply's token budget bounds it); regex_grammar's
    max_len caps it, and the walk is then finished inside it."""
    m = Matcher(compiled_grammar(regex_grammar("a+b"), smollm2_vocab))
    assert m.consume_bytes(b"a" * 20_000 + b"b") and m.is_accepting()
    capped = compiled_grammar(regex_grammar("a+b", max_len=10), smollm2_vocab)
    m = Matcher(capped)
    assert m.consume_bytes(b"a" * 9) and not m.consume_bytes(b"a")
    m = Matcher(capped)
    assert m.consume_bytes(b"a" * 9 + b"b") and m.is_accepting()


def test_masks_agree_with_llguidance(smollm2_vocab):
    """Step by step on random walks, railcall's mask against llguidance's over grammars both
    read: where llguidance allows a token, so does railcall; where railcall alone allows one,
    the text it leads to (completed under railcall) parses with an independent parser.
    (railcall allows more at the very start of Lark grammars with %ignore, as Lark does, and
    inside a forced literal, where llguidance keeps one tokenization; `railcall bench grammars`
    counts them on llama.cpp's grammars.)"""
    from railcall.bench.grammars import Differential, Grammar, _LLGuidance, _Railcall, walks
    from railcall.models.store import tokenizer_folder

    tok_json = (tokenizer_folder("smollm2") / "tokenizer.json").read_text()
    stops = sorted(smollm2_vocab.stop_ids)
    ours = _Railcall(smollm2_vocab, tok_json, stops)
    peer = _LLGuidance(smollm2_vocab, tok_json, stops)
    grammars = [Grammar(k, "gbnf", g) for k, (g, _) in GBNF_PAIRS.items()]
    grammars += [Grammar(k, "regex", p) for k, p in REGEXES.items()]
    grammars += [Grammar("sql", "lark", SQL_LARK), Grammar("shell", "lark", SHELL_LARK)]
    total = Differential()
    for g in grammars:
        d = Differential()
        walks(g, ours, peer, smollm2_vocab, stops, 4, 30, random.Random(3), d)
        assert d.theirs_only_steps == 0, (g.name, d.examples)
        assert d.ours_only_valid == d.ours_only_checked, (g.name, d.examples)
        total.steps += d.steps
        total.same += d.same
    assert total.steps > 600 and total.same > 0.9 * total.steps


def test_text_grammars_are_not_prewarmed_by_default_and_tool_tables_are(smollm2_vocab):
    """A Lark, GBNF or regex grammar computes each mask on first use unless asked to prewarm;
    a tool table prewarms; the masks are the same either way."""
    from railcall.grammar.tools import Tool, tool_grammar
    from railcall.matcher import CompiledGrammar

    lark_text = 'start: "x" item+\nitem: "a" | "(" item ")"\n'
    assert not compiled_grammar(lark_grammar(lark_text), smollm2_vocab).prewarmed
    assert not compiled_grammar(gbnf_grammar('root ::= "y" [0-9]+\n'), smollm2_vocab).prewarmed
    assert not compiled_grammar(regex_grammar(r"z[a-c]{2,5}"), smollm2_vocab).prewarmed
    table = tool_grammar([Tool("f", "", {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]})])
    assert compiled_grammar(table, smollm2_vocab).prewarmed
    text = 'start: "w" item+\nitem: "a" | "(" item ")"\n'
    warm = compiled_grammar(lark_grammar(text), smollm2_vocab, prewarm=True)
    cold = CompiledGrammar(lark_grammar(text), smollm2_vocab)  # not from the cache: its own masks
    assert warm.prewarmed and not cold.prewarmed
    a, b = Matcher(warm), Matcher(cold)
    for text in (b"w", b"a", b"(", b"(a", b")"):
        assert a.legal_token_ids().tolist() == b.legal_token_ids().tolist()
        assert a.consume_bytes(text) and b.consume_bytes(text)
