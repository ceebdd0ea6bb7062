"""Tables of (schema, input, accepted): what the byte machine accepts, exactly."""

from __future__ import annotations

import pytest

from railcall.grammar.schema import schema_grammar
from railcall.grammar.tools import Tool, tool_grammar
from railcall.matcher import CompiledGrammar, Matcher


def accepts(vocab, grammar, text: bytes, max_string: int = 256) -> bool:
    m = Matcher(CompiledGrammar(grammar, vocab, max_string=max_string))
    return m.consume_bytes(text) and m.is_accepting()


S = {"type": "string"}
CASES = [
    # strings: escapes, unicode, control characters, invalid UTF-8
    (S, b'"abc"', True),
    (S, b'""', True),
    (S, b'"a\\"b\\\\c\\/d\\n\\t\\r\\b\\f"', True),
    (S, b'"\\u00e9\\uD83D\\uDE00"', True),
    (S, b'"\\uZZZZ"', False),
    (S, b'"\\x"', False),
    (S, b'"\x01"', False),
    (S, b'"\x7f"', False),
    (S, '"é 🎉 中文"'.encode(), True),
    (S, b'"\xc3("', False),  # a lead byte without its continuation
    (S, b'"\xc0\xaf"', False),  # overlong
    (S, b'"\xed\xa0\x80"', False),  # a UTF-16 surrogate encoded in UTF-8
    (S, b'"\xf4\x90\x80\x80"', False),  # beyond U+10FFFF
    (S, b'"abc', False),
    (S, b'"a"b', False),
    ({"type": "string", "maxLength": 3}, b'"abc"', True),
    ({"type": "string", "maxLength": 3}, b'"abcd"', False),
    ({"type": "string", "maxLength": 3}, '"é🎉x"'.encode(), True),  # characters, not bytes
    ({"type": "string", "maxLength": 3}, b'"\\n\\t\\\\"', True),  # an escape is one character
    # an escaped surrogate pair is one character; a lone surrogate escape is no character at all
    ({"type": "string", "maxLength": 1}, b'"\\ud83d\\ude00"', True),
    ({"type": "string", "maxLength": 2}, b'"a\\uD83D\\uDE00"', True),
    ({"type": "string", "maxLength": 1}, b'"a\\ud83d\\ude00"', False),
    ({"type": "string", "minLength": 2}, b'"\\ud83d\\ude00"', False),
    ({"type": "string", "minLength": 2}, b'"\\ud83d\\ude00\\ud7ff"', True),
    (S, b'"\\ud83d"', False),
    (S, b'"\\ud83dx"', False),
    (S, b'"\\ud83d\\n"', False),
    (S, b'"\\ud83d\\ud83d"', False),
    (S, b'"\\ude00"', False),
    (S, b'"\\ud7ff\\ue000"', True),
    ({"type": "string", "minLength": 2}, b'"a"', False),
    ({"type": "string", "minLength": 2}, b'"ab"', True),
    # integers, with exact bounds
    ({"type": "integer"}, b"0", True),
    ({"type": "integer"}, b"-0", True),
    ({"type": "integer"}, b"01", False),
    ({"type": "integer"}, b"1.5", False),
    ({"type": "integer"}, b"-", False),
    ({"type": "integer", "minimum": 5, "maximum": 120}, b"5", True),
    ({"type": "integer", "minimum": 5, "maximum": 120}, b"120", True),
    ({"type": "integer", "minimum": 5, "maximum": 120}, b"121", False),
    ({"type": "integer", "minimum": 5, "maximum": 120}, b"4", False),
    ({"type": "integer", "minimum": 5, "maximum": 120}, b"-1", False),
    ({"type": "integer", "minimum": 5, "maximum": 120}, b"99", True),
    ({"type": "integer", "minimum": -20, "maximum": -3}, b"-3", True),
    ({"type": "integer", "minimum": -20, "maximum": -3}, b"-20", True),
    ({"type": "integer", "minimum": -20, "maximum": -3}, b"-21", False),
    ({"type": "integer", "minimum": -20, "maximum": -3}, b"0", False),
    ({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10}, b"0", False),
    ({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10}, b"9", True),
    ({"type": "integer", "minimum": 0}, b"123456789012345", True),
    # numbers
    ({"type": "number"}, b"1.5e-3", True),
    ({"type": "number"}, b"-0.0", True),
    ({"type": "number"}, b"1E+2", True),
    ({"type": "number"}, b"1.", False),
    ({"type": "number"}, b".5", False),
    ({"type": "number"}, b"1e", False),
    ({"type": "number"}, b"1" * 30, False),  # a number may not run forever
    # literals
    ({"type": "boolean"}, b"true", True),
    ({"type": "boolean"}, b"True", False),
    ({"type": "null"}, b"null", True),
    ({"enum": ["a", 1, None, [1, 2], {"k": "v"}]}, b'[1,2]', True),
    ({"enum": ["a", 1, None, [1, 2], {"k": "v"}]}, b'{"k":"v"}', True),
    ({"enum": ["a", 1, None, [1, 2], {"k": "v"}]}, b'"b"', False),
    ({"enum": [1, 12]}, b"1", True),
    ({"enum": [1, 12]}, b"12", True),
    ({"const": "x"}, b'"x"', True),
    # arrays: compact, bounded
    ({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 2}, b"[]", False),
    ({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 2}, b"[1]", True),
    ({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 2}, b"[1,2]", True),
    ({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 2}, b"[1,2,3]", False),
    ({"type": "array", "items": {"type": "integer"}}, b"[1, 2]", False),  # no free whitespace
    ({"type": "array", "items": {"type": "integer"}}, b"[]", True),
    # objects: declared order, optional skippable, nothing else
    (O := {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}},
           "required": ["a"]}, b'{"a":1}', True),
    (O, b'{"a":1,"c":3}', True),
    (O, b'{"a":1,"b":2,"c":3}', True),
    (O, b'{"a":1,"c":3,"b":2}', False),
    (O, b'{"b":2}', False),
    (O, b'{"a":1,"d":4}', False),
    (O, b"{}", False),
    (O2 := {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}, b"{}", True),
    (O2, b'{"b":2}', True),
    (O2, b'{,"b":2}', False),
    # anyOf, type lists
    ({"anyOf": [{"type": "string", "maxLength": 2}, {"type": "integer"}]}, b'"ab"', True),
    ({"anyOf": [{"type": "string", "maxLength": 2}, {"type": "integer"}]}, b"42", True),
    ({"anyOf": [{"type": "string", "maxLength": 2}, {"type": "integer"}]}, b'"abc"', False),
    ({"type": ["integer", "null"]}, b"null", True),
    # $ref, recursive
    (T := {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
                                                                  "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                              "required": ["v", "kids"]}}, "$ref": "#/$defs/node"},
     b'{"v":1,"kids":[{"v":2,"kids":[]},{"v":3,"kids":[{"v":4,"kids":[]}]}]}', True),
    (T, b'{"v":1,"kids":[{"v":2}]}', False),
    # untyped: any JSON value
    ({}, b'{"x":[1,"a",{"y":null}],"z":true}', True),
    ({}, b'{"x":}', False),
]


@pytest.mark.parametrize("schema,text,accepted", CASES)
def test_schema_language(bytes_vocab, schema, text, accepted):
    assert accepts(bytes_vocab, schema_grammar(schema), text) is accepted


TOOLS = [
    Tool("read_file", "", {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}),
    Tool("read", "", {"type": "object", "properties": {"n": {"type": "integer"}}}),
    Tool("write_file", "", {"type": "object", "properties": {"path": {"type": "string"}, "text": {"type": "string"}},
                            "required": ["path", "text"]}, mutates=True),
]
CALLS = [
    (b'{"tool":"read_file","args":{"path":"a.txt"}}', True),
    (b'{"tool":"read","args":{}}', True),
    (b'{"tool":"read","args":{"n":3}}', True),
    (b'{"tool":"write_file","args":{"path":"a","text":"b"}}', True),
    (b'{"tool":"read_file","args":{"path":""}}', False),  # a required string may not be empty
    (b'{"tool":"read_file","args":{}}', False),
    (b'{"tool":"delete","args":{}}', False),
    (b'{"tool":"read_file","args":{"path":"a"},"extra":1}', False),
    (b'{"tool": "read","args":{}}', False),
    (b'{"args":{},"tool":"read"}', False),
]


@pytest.mark.parametrize("text,accepted", CALLS)
def test_tool_call_language(bytes_vocab, text, accepted):
    assert accepts(bytes_vocab, tool_grammar(TOOLS), text) is accepted


def test_string_cap(bytes_vocab):
    g = tool_grammar(TOOLS)
    assert accepts(bytes_vocab, g, b'{"tool":"read_file","args":{"path":"' + b"x" * 20 + b'"}}', max_string=20)
    assert not accepts(bytes_vocab, g, b'{"tool":"read_file","args":{"path":"' + b"x" * 21 + b'"}}', max_string=20)


def test_parallel_calls(bytes_vocab):
    g = tool_grammar(TOOLS, parallel=True)
    one = b'{"tool":"read","args":{}}'
    two = b'{"tool":"read_file","args":{"path":"p"}}'
    assert accepts(bytes_vocab, g, b"[" + one + b"]")
    assert accepts(bytes_vocab, g, b"[" + one + b"," + two + b"]")
    assert not accepts(bytes_vocab, g, b"[]")
    assert not accepts(bytes_vocab, g, one)
    g2 = tool_grammar(TOOLS, parallel=True, max_calls=2)
    assert not accepts(bytes_vocab, g2, b"[" + b",".join([one] * 3) + b"]")


def test_reordering_a_tools_properties_is_a_new_grammar(bytes_vocab):
    """Properties are written in declared order, so a table whose tool declares them in another
    order (a live change) must not be served the first order from a cache."""
    req = ["a", "b"]
    ab = Tool("f", "", {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": req})
    ba = Tool("f", "", {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "integer"}}, "required": req})
    assert accepts(bytes_vocab, tool_grammar([ab]), b'{"tool":"f","args":{"a":1,"b":2}}')
    assert tool_grammar([ab]).key != tool_grammar([ba]).key
    assert accepts(bytes_vocab, tool_grammar([ba]), b'{"tool":"f","args":{"b":2,"a":1}}')
    assert not accepts(bytes_vocab, tool_grammar([ba]), b'{"tool":"f","args":{"a":1,"b":2}}')


def test_a_trie_knows_how_many_nodes_lie_below_each_node():
    """`Select.size(node)`: the nodes below `node`, itself included (counted when the trie is
    built; the content key of a trie position asks for it)."""
    import random

    from railcall.grammar.instructions import Select

    rng = random.Random(4)
    keys = sorted({"".join(rng.choice("abc_") for _ in range(rng.randint(1, 7))).encode() for _ in range(300)})
    trie = Select([(k, None) for k in keys])

    def below(n):
        return 1 + sum(below(c) for c in trie.children[n].values())

    sizes = [trie.size(n) for n in range(len(trie.children))]
    assert sizes == [below(n) for n in range(len(trie.children))]
    assert sizes[0] == len(trie.children) and min(sizes) == 1
