"""The four call formats round-trip: random tool tables, random valid calls written in each format
-> the matcher accepts the text token by token (every token inside the mask) -> the output parser
reads back the same names and arguments. And random walks under each format's grammar always
parse into calls of the table whose arguments validate against the tool's schema."""

from __future__ import annotations

import codecs
import json
import random
import re

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from railcall.errors import GrammarError
from railcall.grammar.tools import FORMATS, Tool, tool_grammar, write_calls
from railcall.matcher import CompiledGrammar, Matcher
from railcall.output import Delimiters, OutputParser, parse_pythonic
from railcall.vocab import Vocabulary

from toolgen import pick_token, random_tools

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
FORMAT_NAMES = ["json", "openai", "hermes", "pythonic"]
TAGS = ("<tool_call>", "</tool_call>")
# quotes, backslashes, a slash (JSON may escape it, Python may not), controls, non-ASCII, emoji
ALPHABET = ['a', 'b', 'Z', ' ', '"', "'", '\\', '/', '\n', '\t', '\x01', 'é', '中', '🎉', '(', ')', ',', '=', ']']


# -- random valid values for toolgen's schemas --------------------------------------------------

def value_for(rng: random.Random, s: dict):
    if "enum" in s:
        return rng.choice(s["enum"])
    if "anyOf" in s:
        return value_for(rng, rng.choice(s["anyOf"]))
    t = s.get("type")
    if t == "string":
        lo = max(1, s.get("minLength", 0))  # required strings are non-empty (SchemaOptions.required_nonempty)
        hi = s.get("maxLength", 8)
        return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(lo, max(lo, hi))))
    if t == "integer":
        return rng.randint(s.get("minimum", -10**6), s.get("maximum", 10**6))
    if t == "number":
        return rng.choice([0, 3, -7, 2.5, -0.125, 1e-07, 12345.678, 1e+16])
    if t == "boolean":
        return rng.random() < 0.5
    if t == "array":
        lo, hi = s.get("minItems", 0), s.get("maxItems", 3)
        return [value_for(rng, s["items"]) for _ in range(rng.randint(lo, hi))]
    if t == "object":
        req = set(s.get("required", []))
        return {k: value_for(rng, v) for k, v in s["properties"].items() if k in req or rng.random() < 0.5}
    raise AssertionError(s)


def spell_str(s: str) -> str:
    # JSON's escapes, all of which Python reads alike; DEL written escaped (never raw)
    return json.dumps(s, ensure_ascii=False).replace("\x7f", "\\u007f")


def spell_json(v) -> str:
    if isinstance(v, str):
        return spell_str(v)
    if isinstance(v, list):
        return "[" + ",".join(spell_json(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ",".join(spell_str(k) + ":" + spell_json(x) for k, x in v.items()) + "}"
    return json.dumps(v)


def spell_py(v) -> str:
    if v is None or isinstance(v, bool):
        return repr(v)
    if isinstance(v, str):
        return spell_str(v)
    if isinstance(v, list):
        return "[" + ",".join(spell_py(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ",".join(spell_str(k) + ":" + spell_py(x) for k, x in v.items()) + "}"
    return repr(v)


def write(fmt: str, calls: list, parallel: bool) -> str:
    if fmt in ("json", "openai"):
        n, a = ("tool", "args") if fmt == "json" else ("name", "arguments")
        objs = ['{"%s":%s,"%s":%s}' % (n, spell_str(name), a, spell_json(args)) for name, args in calls]
        return "[" + ",".join(objs) + "]" if parallel else objs[0]
    if fmt == "hermes":
        return "\n".join('<tool_call>{"name":%s,"arguments":%s}</tool_call>' % (spell_str(name), spell_json(args))
                         for name, args in calls)
    items = [name + "(" + ", ".join(f"{k}={spell_py(v)}" for k, v in args.items()) + ")" for name, args in calls]
    return "[" + ", ".join(items) + "]"


def tokenize(vocab, text: str) -> list[int]:
    ids = []
    for piece in re.split("(<tool_call>|</tool_call>)", text):
        if piece in TAGS:
            ids.append(vocab.special_id(piece))
        elif piece:
            enc = vocab.encoder
            toks = list(enc(piece)) if enc else vocab.greedy_tokenize(piece.encode())
            assert vocab.decode(toks) == piece.encode()
            ids += toks
    return ids


def parse(vocab, fmt: str, ids: list[int]):
    """The parser fed as a server feeds it: each token's id, then its text from an incremental
    UTF-8 decoder (special tokens as their text)."""
    p = OutputParser(Delimiters.from_vocab(vocab, reasoning=None), call_format=fmt, tool_choice="required")
    dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for t in ids:
        p.feed(t, vocab.special_text[t] if vocab.is_special(t) else dec.decode(vocab.token_bytes[t]))
    p.feed(-1, dec.decode(b"", final=True))
    p.finish()
    return p.result()


def matcher_for(vocab, tools, fmt, parallel):
    return Matcher(CompiledGrammar(tool_grammar(tools, fmt, parallel=parallel), vocab))


# -- round trip ---------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", FORMAT_NAMES)
@pytest.mark.parametrize("vocab_name", ["bytes_vocab", "bpe_vocab"])
@SETTINGS
@given(rnd=st.randoms(use_true_random=False), parallel=st.booleans())
def test_valid_calls_round_trip(request, fmt, vocab_name, rnd, parallel):
    vocab = request.getfixturevalue(vocab_name)
    tools = random_tools(rnd, rnd.randint(1, 3))
    by_name = {t.name: t for t in tools}
    calls = []
    for _ in range(rnd.randint(1, 3) if parallel else 1):
        t = rnd.choice(tools)
        calls.append((t.name, value_for(rnd, t.parameters)))
    text = write(fmt, calls, parallel)
    ids = tokenize(vocab, text)
    m = matcher_for(vocab, tools, fmt, parallel)
    for i, t in enumerate(ids):
        assert t in set(m.legal_token_ids().tolist()), f"{fmt}: token {i} of {text!r} is outside the mask"
        assert m.consume_token(t), m.error_message
    assert m.is_accepting(), text
    got = parse(vocab, fmt, ids).tool_calls
    assert [(c.name, json.loads(c.arguments)) for c in got] == calls, text
    for c in got:
        jsonschema.validate(json.loads(c.arguments), by_name[c.name].parameters)


# -- random walks -------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", FORMAT_NAMES)
@SETTINGS
@given(rnd=st.randoms(use_true_random=False), parallel=st.booleans())
def test_random_walks_parse(bpe_vocab, fmt, rnd, parallel):
    vocab = bpe_vocab
    tools = random_tools(rnd, rnd.randint(1, 3))
    by_name = {t.name: t for t in tools}
    m = matcher_for(vocab, tools, fmt, parallel)
    stops, out = set(vocab.stop_ids), []
    for _ in range(150):
        if m.is_done():
            break
        legal = m.legal_token_ids().tolist()
        assert legal, f"dead end after {vocab.decode(out)!r}"
        t = pick_token(rnd, legal, vocab, stops)
        assert m.consume_token(t), m.error_message
        if t not in stops:
            out.append(t)
    if not m.is_accepting():
        out += m.finish()
    got = parse(vocab, fmt, out)
    assert got.tool_calls and not got.content.strip(), vocab.decode(out)
    for c in got.tool_calls:
        jsonschema.validate(json.loads(c.arguments), by_name[c.name].parameters)


# -- the pythonic grammar's edges ---------------------------------------------------------------

WEATHER = Tool("get_weather", "", {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 3}, "days": {"type": "integer", "minimum": 1, "maximum": 7},
    "metric": {"type": "boolean"}, "note": {"type": ["string", "null"]}}, "required": ["city"]})


@pytest.mark.parametrize("text, ok", [
    ('[get_weather(city="abc")]', True),
    ('[get_weather(city="a\\"b", days=7, metric=False, note=None)]', True),
    ('[get_weather(city="ab", note="x")]', True),  # optional ones skipped
    ('[get_weather(city="a\\/b")]', False),  # \/ is no Python escape
    ('[get_weather(city="abcd")]', False),  # maxLength
    ('[get_weather(days=3, city="ab")]', False),  # declared order
    ('[get_weather(days=3)]', False),  # city is required
    ('[get_weather(city="ab", days=8)]', False),  # maximum
    ('[get_weather(city="ab", metric=true)]', False),  # Python's True, not JSON's
    ("[get_weather(city='ab')]", False),  # double quotes only
    ('[get_weather(city="ab")', False),
])
def test_pythonic_grammar_table(bytes_vocab, text, ok):
    m = matcher_for(bytes_vocab, [WEATHER], "pythonic", False)
    assert (m.consume_bytes(text.encode()) and m.is_accepting()) == ok


@pytest.mark.parametrize("params, word", [
    ({"type": "object"}, "additionalProperties"),
    ({"type": "object", "properties": {"a": {}}, "additionalProperties": True}, "additionalProperties"),
    ({"type": "object", "properties": {"class": {"type": "string"}}}, "identifier"),
    ({"type": "object", "properties": {"my-key": {"type": "string"}}}, "identifier"),
])
def test_pythonic_refuses_what_keywords_cannot_spell(params, word):
    with pytest.raises(GrammarError, match=word):
        tool_grammar([Tool("f", "", params)], "pythonic")


def test_pythonic_needs_identifier_names():
    with pytest.raises(GrammarError, match="identifier"):
        tool_grammar([Tool("get-weather")], "pythonic")
    tool_grammar([Tool("math.factorial")], "pythonic")  # dotted, as BFCL writes them


def test_pythonic_parser_reads_literals_safely():
    calls = parse_pythonic('[a.b(x=1e999, y=-2, z=[True, None], w={"k": "v\\n"}), c()]')
    assert [(c.name, c.arguments) for c in calls] == [
        ("a.b", '{"x":1e999,"y":-2,"z":[true,null],"w":{"k":"v\\n"}}'), ("c", "{}")]
    for bad in ['[f(1)]', '[f(**{"a": 1})]', '[f(a=g())]', '[f(a=(1, 2))]', '[f(a={1: 2})]', 'f(a=1)',
                '[__import__("os").system("x")]', '[f(a=1, a=2)]', '[f(a=b)]']:
        assert parse_pythonic(bad) is None, bad


def test_default_format_is_unchanged():
    assert tool_grammar([WEATHER]) == tool_grammar([WEATHER], "json")
    assert set(FORMATS) == {"json", "openai", "hermes", "pythonic"}


# -- writing calls ------------------------------------------------------------------------------

CITY_UNIT = Tool("get_weather", "", {"type": "object", "properties": {"city": {"type": "string"},
                                                                       "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                                      "required": ["city", "unit"]})
BYTES = Vocabulary.from_pieces([bytes([b]) for b in range(256)], name="bytes-256")  # hermes' tags as text


def _accepts(tools, fmt, text):
    m = Matcher(CompiledGrammar(tool_grammar(tools, fmt), BYTES))
    return m.consume_bytes(text.encode()) and m.is_accepting()


def test_the_four_formats_write_a_call_as_their_grammars_do():
    """`write_calls` spells calls as each format's grammar does (the text the grammar accepts),
    arguments in the schema's order."""
    args = {"unit": "celsius", "city": "Paris"}  # out of order: written in the schema's order
    want = {
        "json": '{"tool":"get_weather","args":{"city":"Paris","unit":"celsius"}}',
        "openai": '{"name":"get_weather","arguments":{"city":"Paris","unit":"celsius"}}',
        "hermes": '<tool_call>{"name":"get_weather","arguments":{"city":"Paris","unit":"celsius"}}</tool_call>',
        "pythonic": '[get_weather(city="Paris", unit="celsius")]',
    }
    assert set(want) == set(FORMATS)
    for fmt, text in want.items():
        assert write_calls([CITY_UNIT], [("get_weather", args)], fmt) == text
        assert _accepts([CITY_UNIT], fmt, text), fmt
    two = [("get_weather", {"city": "Paris", "unit": "celsius"}), ("get_weather", {"city": "Oslo", "unit": "celsius"})]
    for fmt in FORMATS:
        text = write_calls([CITY_UNIT], two, fmt)
        m = Matcher(CompiledGrammar(tool_grammar([CITY_UNIT], fmt, parallel=True), BYTES))
        assert m.consume_bytes(text.encode()) and m.is_accepting(), (fmt, text)
    with pytest.raises(GrammarError, match="no tool 'nope'"):
        write_calls([CITY_UNIT], [("nope", {})], "json")
