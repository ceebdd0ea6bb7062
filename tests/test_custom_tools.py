"""Custom tools (OpenAI's `{"type": "custom"}`): a call whose input is one text under a grammar,
written as the call's JSON string (railcall.grammar.tools.Tool.input_format,
railcall.grammar.cfg.inside_json_string, railcall.grammar.strings.JText).

Every call a random walk writes is read back as JSON, and its input text is checked by a
parser railcall does not share: `lark` (Earley) for Lark grammars, `re.fullmatch` for regexes."""

from __future__ import annotations

import json
import random
import re

import lark
import pytest

from railcall import GrammarError, Matcher, compiled_grammar
from railcall.grammar import ir
from railcall.grammar.cfg import inside_json_string, json_escaped
from railcall.grammar.lark import lark_grammar
from railcall.grammar.tools import Tool, tool_grammar, write_calls
from railcall.output import Delimiters, OutputParser, ToolCall
from railcall.server.assemble import InputText

# Quotes, backslashes and newlines in both literals and terminals: the parts JSON escapes.
QUERY_LARK = r'''
start: "SELECT " cols " FROM " NAME where? ";"
cols: NAME (", " NAME)*
where: " WHERE " NAME OP value
value: STRING | NUMBER
OP: "=" | "<" | ">"
NAME: /[a-z_][a-z0-9_]{0,11}/
STRING: /"([^"\\\n]|\\.){0,12}"/
NUMBER: /[0-9]{1,6}/
'''
NOTE_LARK = r'''
start: line+
line: "- " TEXT "\n"
TEXT: /[^\n"\\]{1,20}/ | /"[a-z ]{1,10}"/ | /[a-z]+\\[a-z]+/
'''
PATCH_REGEX = r'(\+|-) [a-z]{1,8}(\n(\+|-) [a-z]{1,8}){0,3}'
WEATHER = Tool("get_weather", "Current weather.", {"type": "object", "properties": {"city": {"type": "string"}},
                                                   "required": ["city"]})
TABLE = [
    Tool("run_query", "Run a SQL query.", input_format={"type": "grammar", "syntax": "lark", "definition": QUERY_LARK}),
    Tool("add_note", "Add notes.", input_format={"type": "grammar", "syntax": "lark", "definition": NOTE_LARK}),
    Tool("patch", "Apply a patch.", input_format={"type": "grammar", "syntax": "regex", "definition": PATCH_REGEX}),
    WEATHER,
]
CHECK = {"run_query": lark.Lark(QUERY_LARK, parser="earley", lexer="dynamic_complete").parse,
         "add_note": lark.Lark(NOTE_LARK, parser="earley", lexer="dynamic_complete").parse,
         "patch": lambda text: re.fullmatch(PATCH_REGEX, text) or pytest.fail(f"{text!r} is no patch")}
KEYS = {"json": ("tool", "args"), "openai": ("name", "arguments")}


def walk(compiled, vocab, rng, steps=120) -> bytes:
    m = Matcher(compiled)
    out = bytearray()
    stops = set(vocab.stop_ids)
    for _ in range(steps):
        legal = [t for t in m.legal_token_ids().tolist() if t not in stops]
        if not legal or (m.is_accepting() and rng.random() < 0.3):
            break
        t = rng.choice(legal)
        assert m.consume_token(t)
        out += vocab.token_bytes[t]
    for t in m.finish():
        out += vocab.token_bytes[t]
    assert m.is_accepting()
    return bytes(out)


@pytest.mark.parametrize("fmt", ["json", "openai"])
def test_walks_write_calls_whose_input_parses(vocab, fmt):
    """Random walks under a table of three custom tools and a function tool: every output is one
    JSON call; a custom call's arguments are a string whose decoded text the tool's grammar
    (read by an independent parser) accepts; a function call's are an object."""
    compiled = compiled_grammar(tool_grammar(TABLE, fmt), vocab)
    rng = random.Random(7)
    seen = set()
    name_key, args_key = KEYS[fmt]
    for _ in range(60):
        call = json.loads(walk(compiled, vocab, rng))
        name, args = call[name_key], call[args_key]
        seen.add(name)
        if name == "get_weather":
            assert isinstance(args, dict) and isinstance(args["city"], str)
        else:
            assert isinstance(args, str), call
            CHECK[name](args)
    assert seen == {"run_query", "add_note", "patch", "get_weather"}


def test_escapes_are_the_only_spelling_of_quotes_backslashes_and_newlines(bytes_vocab):
    """Byte by byte: a quote, a backslash or a newline of the input must be escaped (raw, it
    would end or break the call's string); any other character may be any JSON escape, and is
    matched decoded."""
    compiled = compiled_grammar(tool_grammar(TABLE, "json"), bytes_vocab)

    def ok(text: bytes) -> bool:
        m = Matcher(compiled)
        return m.consume_bytes(text) and m.is_accepting()

    head = b'{"tool":"run_query","args":"'
    assert ok(head + b'SELECT a, b FROM t WHERE x=\\"it\\\\s\\";"}')
    assert ok(head + b'SELECT \\u0061 FROM t;"}')  # \u0061 is `a`, a NAME character
    assert not ok(head + b'SELECT a FROM t WHERE x="it";"}')  # raw quotes end the string
    assert not ok(head + b'SELECT \\u0041 FROM t;"}')  # `A` is no NAME character
    notes = b'{"tool":"add_note","args":"'
    assert ok(notes + b'- milk\\n- \\"tea time\\"\\n- a\\\\b\\n"}')
    assert not ok(notes + b'- milk\n"}')  # a raw newline is no JSON string character
    assert json.loads(b'{"v":"' + json_escaped('say "hi"\\\n\x7f'.encode()) + b'"}')["v"] == 'say "hi"\\\n\x7f'


def test_a_call_of_a_custom_tool_alone_and_in_hermes(bytes_vocab):
    one = compiled_grammar(tool_grammar([TABLE[2]], "hermes"), bytes_vocab)
    ids = {text: i for i, text in bytes_vocab.special_text.items()}
    m = Matcher(one)
    assert m.consume_token(ids["<tool_call>"]) and m.consume_bytes(b'{"name":"patch","arguments":"+ one\\n- two"}')
    assert m.consume_token(ids["</tool_call>"]) and m.is_accepting()
    assert write_calls(TABLE, [("patch", "+ one\n- two")], "openai") == '{"name":"patch","arguments":"+ one\\n- two"}'


def test_text_format_is_any_nonempty_text(bytes_vocab):
    g = compiled_grammar(tool_grammar([Tool("shell", input_format={"type": "text"})], "json"), bytes_vocab)
    m = Matcher(g)
    assert m.consume_bytes('{"tool":"shell","args":"ls -l | grep \\"x\\" \\u00e9 é\\n"}'.encode()) and m.is_accepting()
    empty = Matcher(g)
    assert not empty.consume_bytes(b'{"tool":"shell","args":""')


def test_recursion_inside_a_custom_input(bytes_vocab):
    """Rules stay rules inside the string: nesting up to the grammar's depth, right recursion
    and repetition without a limit."""
    t = Tool("calc", input_format={"type": "grammar", "syntax": "lark",
                                   "definition": 'start: e\ne: t ("+" t)*\nt: "(" e ")" | /[0-9]/\n'})
    m = Matcher(compiled_grammar(tool_grammar([t], "json"), bytes_vocab))
    assert m.consume_bytes(b'{"tool":"calc","args":"((1+2)+3)+' + b"+".join([b"4"] * 300) + b'"}') and m.is_accepting()


def test_what_cannot_be_written_inside_a_string_is_refused():
    with pytest.raises(GrammarError, match=r"embedded JSON value \(%json\).*cannot be written inside"):
        inside_json_string(lark_grammar('start: "n=" %json {"type": "integer"}\n'))
    with pytest.raises(GrammarError, match="pythonic format has no spelling"):
        tool_grammar([TABLE[0]], "pythonic")
    with pytest.raises(GrammarError, match=r"line 2, column \d+"):
        tool_grammar([Tool("bad", input_format={"type": "grammar", "syntax": "lark", "definition": 'start: x\nx: x "a"\n'})])
    with pytest.raises(GrammarError, match="input_format must be"):
        Tool("bad", input_format={"type": "json"})
    with pytest.raises(GrammarError, match="needs syntax"):
        Tool("bad", input_format={"type": "grammar", "syntax": "ebnf", "definition": "x"})


def test_from_openai_reads_both_shapes():
    chat = Tool.from_openai({"type": "custom", "custom": {"name": "q", "description": "d", "format": {
        "type": "grammar", "grammar": {"syntax": "regex", "definition": "[0-9]+"}}}})
    flat = Tool.from_openai({"type": "custom", "name": "q", "description": "d",
                             "format": {"type": "grammar", "syntax": "regex", "definition": "[0-9]+"}})
    assert chat == flat and chat.custom and chat.input_format == {"type": "grammar", "syntax": "regex", "definition": "[0-9]+"}
    assert Tool.from_openai({"type": "custom", "custom": {"name": "free"}}).input_format == {"type": "text"}
    assert chat.schema_key() != Tool("q", "d").schema_key()


def test_the_parser_keeps_and_streams_a_custom_input():
    """The call's string is kept as written (ToolCall.input decodes it) and, streamed, handed
    out in pieces that add up to it; a function call beside it is read as before."""
    text = '[{"tool":"patch","args":"+ a\\n- \\"b\\""},{"tool":"get_weather","args":{"city":"Oslo"}}]'
    p = OutputParser(Delimiters(), call_format="json", tool_choice="required", stream_calls=True,
                     text_tools={"patch"})
    deltas = []
    for c in text:
        deltas += p.feed(0, c)
    deltas += p.finish()
    calls = p.result().tool_calls
    assert calls[0] == ToolCall("patch", '"+ a\\n- \\"b\\""') and calls[0].input == '+ a\n- "b"'
    assert json.loads(calls[1].arguments) == {"city": "Oslo"}
    pieces = "".join(d.text for d in deltas if d.kind == "call_args" and d.index == 0)
    assert pieces == calls[0].arguments and sum(d.kind == "call_args" and d.index == 0 for d in deltas) > 3
    # without text_tools, a string where arguments go is read as JSON arguments, and fails
    plain = OutputParser(Delimiters(), call_format="json", tool_choice="required")
    plain.feed(0, '{"tool":"patch","args":"+ a"}')
    plain.finish()
    assert plain.result().tool_calls == []


def test_a_cut_custom_call_keeps_its_input_as_far_as_written():
    p = OutputParser(Delimiters(), call_format="json", tool_choice="required", stream_calls=True, text_tools={"patch"})
    p.feed(0, '{"tool":"patch","args":"+ a\\n- b\\')
    p.finish()
    (call,) = p.result().tool_calls
    assert not call.complete and call.arguments == '"+ a\\n- b\\'


@pytest.mark.parametrize("seed", range(5))
def test_input_text_pieces_never_split_an_escape(seed):
    """However the raw string is cut into pieces, the decoded pieces add up to the input, and
    none ends inside an escape or between the halves of a surrogate pair."""
    rng = random.Random(seed)
    value = "".join(rng.choice(['a', '"', '\\', '\n', 'é', '😀', '\u2028', '\x01', ' ']) for _ in range(40))
    raw = json.dumps(value)  # escapes: \", \\, \n, \ud83d\ude00 (ensure_ascii), \u0001
    cuts = sorted(rng.sample(range(1, len(raw)), 12))
    pieces = [raw[a:b] for a, b in zip([0] + cuts, cuts + [len(raw)])]
    it = InputText()
    got = [it.feed(p) for p in pieces]
    got.append(it.feed(None, ToolCall("x", raw)))
    assert "".join(got) == value
    assert all(not g or not "\ud800" <= g[-1] <= "\udbff" for g in got)


def test_pythonic_keyword_lists_count_too(bytes_vocab):
    """minProperties/maxProperties over optional arguments hold in the pythonic format's keyword
    list as in a JSON object."""
    t = Tool("f", parameters={"type": "object", "properties": {k: {"type": "integer"} for k in "abc"},
                              "additionalProperties": False, "minProperties": 1, "maxProperties": 2})
    g = compiled_grammar(tool_grammar([t], "pythonic"), bytes_vocab)

    def ok(text: str) -> bool:
        m = Matcher(g)
        return m.consume_bytes(text.encode()) and m.is_accepting()

    assert ok("[f(a=1)]") and ok("[f(b=1, c=2)]") and ok("[f(c=3)]")
    assert not ok("[f()]") and not ok("[f(a=1, b=2, c=3)]")


def test_a_right_recursive_input_is_not_capped_beside_a_response_format(bytes_vocab):
    """tool_choice auto with a response_format joins the two grammars: a custom tool's
    right-recursive input still continues without nesting (tail_calls kept)."""
    from railcall.grammar.schema import schema_grammar
    from railcall.server.plan import _tool_grammar, call_or_answer

    t = Tool("items", input_format={"type": "grammar", "syntax": "lark", "definition": 'start: item\nitem: "a" | "a;" item\n'})
    both = call_or_answer(_tool_grammar([t], "json", parallel=False), schema_grammar({"type": "object"}))
    m = Matcher(compiled_grammar(both, bytes_vocab))
    assert m.consume_bytes(b'{"tool":"items","args":"' + b"a;" * 60 + b'a"}') and m.is_accepting()
