"""The BFCL AST checker on hand-made cases, one table per rule; parsing; validity; the early verdict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from railcall.eval.bfcl import SHARED_CATEGORIES, load_category
from railcall.eval.checker import check_call, check_calls, decided, normalise, parse_calls, valid_calls
from railcall.eval.bfcl_dialect import bfcl_tools
from railcall.data import bfcl_data

DATA = bfcl_data()  # the installed bfcl-eval package's data

# A BFCL-dialect function with every kind of parameter the rules talk about.
FN = {
    "name": "geo.area",
    "description": "Area of a shape.",
    "parameters": {
        "type": "dict",
        "properties": {
            "shape": {"type": "string"},
            "side": {"type": "float"},
            "count": {"type": "integer"},
            "exact": {"type": "boolean"},
            "units": {"type": "string"},
            "dims": {"type": "array", "items": {"type": "float"}},
            "opts": {"type": "dict", "properties": {"mode": {"type": "string"}, "scale": {"type": "integer"}}},
        },
        "required": ["shape", "side"],
    },
}
OTHER = {"name": "geo_area", "description": "", "parameters": {"type": "dict", "properties": {"shape": {"type": "string"}},
                                                                 "required": ["shape"]}}
GOLD = {"geo.area": {"shape": ["square", "Quadrat"], "side": [2.5], "count": [3, ""], "exact": [True, ""],
                     "units": ["square meters", ""], "dims": [[1.0, 2.0], ""],
                     "opts": [{"mode": ["fast"], "scale": [2, ""]}, ""]}}


def call(**args):
    return {"tool": "geo.area", "args": args}


def verdict(c, gold=GOLD):
    return check_call([FN, OTHER], c, gold)


@pytest.mark.parametrize("c, ok", [
    (call(shape="square", side=2.5, count=3), True),
    ({"tool": "geo_area", "args": {"shape": "square"}}, False),  # a different function (dot vs underscore)
    ({"tool": "area", "args": {"shape": "square", "side": 2.5}}, False),
])
def test_right_and_wrong_function(c, ok):
    v = verdict(c)
    assert v.ok is ok
    if not ok:
        assert "wrong function" in v.reason


@pytest.mark.parametrize("value, ok", [
    ("square", True),
    ("SQUARE", True),  # lowercase
    (" s-q_u.a,r/e* ^", True),  # spaces and , . / - _ * ^ dropped
    ("quadrat", True),  # any acceptable value
    ("squares", False),
    ("circle", False),
])
def test_string_normalisation(value, ok):
    assert verdict(call(shape=value, side=2.5)).ok is ok


def test_normalise_reads_single_quote_as_double():
    assert normalise("It's A-b") == 'it"sab'
    assert verdict(call(shape="square", side=2.5, units="Square_Meters")).ok
    q = {"name": "q", "parameters": {"type": "dict", "properties": {"s": {"type": "string"}}, "required": ["s"]}}
    assert check_call([q], {"tool": "q", "args": {"s": "say 'hi'"}}, {"q": {"s": ['say "hi"']}}).ok


def test_omitted_optional_parameter():
    # every gold parameter with "" among its values may be left out ...
    assert verdict(call(shape="square", side=2.5)).ok
    # ... one without "" may not, even when the function's spec calls it optional
    gold = {"geo.area": {**GOLD["geo.area"], "count": [3]}}
    v = verdict(call(shape="square", side=2.5), gold)
    assert not v.ok and "count" in v.reason
    # a parameter the function requires must be there even if the gold answer allowed ""
    gold = {"geo.area": {**GOLD["geo.area"], "side": [2.5, ""]}}
    v = verdict(call(shape="square"), gold)
    assert not v.ok and "missing required parameter 'side'" in v.reason


@pytest.mark.parametrize("args, ok", [
    ({"side": 2.5}, True),
    ({"side": 3, "count": 3}, False),  # 3 != 2.5
    ({"side": 2.5, "count": 3.0}, False),  # a float where an integer is expected
    ({"side": 2.5, "count": True}, False),  # a boolean is not an integer
    ({"side": 2.5, "exact": 1}, False),  # nor an integer a boolean
    ({"side": "2.5"}, False),  # a string is not a number
    ({"side": 2.5, "dims": [1, 2]}, True),  # integers for floats inside an array too
])
def test_types_and_int_for_float(args, ok):
    assert verdict(call(shape="square", **args)).ok is ok


def test_int_accepted_where_float_expected():
    gold = {"geo.area": {**GOLD["geo.area"], "side": [2.0]}}
    assert verdict(call(shape="square", side=2), gold).ok
    assert verdict(call(shape="square", side=2.0), gold).ok
    assert not verdict(call(shape="square", side=3), gold).ok


@pytest.mark.parametrize("args, ok", [
    ({"colour": "red"}, False),  # not in the spec, not in the gold answer
    ({"extra": None}, False),
])
def test_unexpected_parameter(args, ok):
    v = verdict(call(shape="square", side=2.5, **args))
    assert v.ok is ok and "unexpected parameter" in v.reason


def test_parameter_in_spec_but_not_in_gold_is_unexpected():
    gold = {"geo.area": {"shape": ["square"], "side": [2.5]}}
    assert verdict(call(shape="square", side=2.5), gold).ok
    assert not verdict(call(shape="square", side=2.5, units="m2"), gold).ok


@pytest.mark.parametrize("dims, ok", [([1.0, 2.0], True), ([2.0, 1.0], False), ([1.0], False), ([1.0, 2.0, 3.0], False)])
def test_lists_compare_in_order(dims, ok):
    assert verdict(call(shape="square", side=2.5, dims=dims)).ok is ok


@pytest.mark.parametrize("opts, ok", [
    ({"mode": "FAST"}, True),  # normalised inside objects; "scale" may be omitted
    ({"mode": "fast", "scale": 2}, True),
    ({"mode": "fast", "scale": 3}, False),
    ({"scale": 2}, False),  # "mode" is not optional
    ({"mode": "fast", "depth": 1}, False),  # an unexpected key inside the object
])
def test_object_arguments(opts, ok):
    assert verdict(call(shape="square", side=2.5, opts=opts)).ok is ok


SPOT = {"name": "spotify.play", "parameters": {"type": "dict", "properties": {"artist": {"type": "string"},
                                                                               "duration": {"type": "integer"}},
                                                "required": ["artist", "duration"]}}
PAR_GOLD = [{"spotify.play": {"artist": ["Taylor Swift"], "duration": [20]}},
            {"spotify.play": {"artist": ["Maroon 5"], "duration": [15]}}]


def play(artist, duration):
    return {"tool": "spotify.play", "args": {"artist": artist, "duration": duration}}


@pytest.mark.parametrize("calls, ok", [
    ([play("Taylor Swift", 20), play("Maroon 5", 15)], True),
    ([play("Maroon 5", 15), play("Taylor Swift", 20)], True),  # any order
    ([play("Maroon 5", 15), play("Maroon 5", 15)], False),  # one gold call unmatched
    ([play("Taylor Swift", 20)], False),  # too few
    ([play("Taylor Swift", 20), play("Maroon 5", 15), play("Maroon 5", 15)], False),  # too many
    ([play("Taylor Swift", 15), play("Maroon 5", 20)], False),  # values crossed between calls
])
def test_parallel_calls_match_in_any_order(calls, ok):
    assert check_calls([SPOT], calls, PAR_GOLD).ok is ok


def test_parallel_matching_is_bfcls_greedy_rule():
    # The first model call fits both gold calls, the second only the first gold call: BFCL takes,
    # for gold call 1, the first model call that fits, which leaves gold call 2 unmatched. A full
    # matching would exist; BFCL's rule is what its scores mean, so it is the rule here too.
    fn = {"name": "f", "parameters": {"type": "dict", "properties": {"x": {"type": "string"}}, "required": ["x"]}}
    gold = [{"f": {"x": ["a", "b"]}}, {"f": {"x": ["a"]}}]
    a, b = {"tool": "f", "args": {"x": "a"}}, {"tool": "f", "args": {"x": "b"}}
    assert not check_calls([fn], [a, b], gold).ok
    assert check_calls([fn], [b, a], gold).ok


def test_one_call_expected_many_given():
    gold = [{"spotify.play": {"artist": ["Taylor Swift"], "duration": [20]}}]
    assert check_calls([SPOT], [play("Taylor Swift", 20)], gold).ok
    assert not check_calls([SPOT], [play("Taylor Swift", 20)] * 2, gold).ok
    assert not check_calls([SPOT], None, gold).ok


def test_no_call_expected():
    assert check_calls([SPOT], None, []).ok
    v = check_calls([SPOT], [play("Taylor Swift", 20)], [])
    assert not v.ok and "no call" in v.reason


@pytest.mark.parametrize("text, n", [
    ('{"tool":"f","args":{"x":1}}', 1),
    ('  {"tool": "f", "args": {}}\n', 1),
    ('[{"tool":"f","args":{}},{"tool":"g","args":{"y":"z"}}]', 2),
    ('[]', None),
    ('{"tool":"f"}', None),
    ('{"tool":"f","args":{},"extra":1}', None),
    ('{"tool":1,"args":{}}', None),
    ('{"tool":"f","args":[]}', None),
    ('```json\n{"tool":"f","args":{}}\n```', None),
    ('Sure: {"tool":"f","args":{}}', None),
    ('{"tool":"f","args":{}} done', None),
    ("The answer is 4.", None),
    ("", None),
])
def test_parse_calls(text, n):
    calls = parse_calls(text)
    assert (None if calls is None else len(calls)) == n


@pytest.mark.parametrize("text, done", [
    ("", False), ("  ", False), ("The", True), ("```", True), ("{", False), ('{"tool":"f","ar', False),
    ('[{"tool":"f","args":{}}', False), ('{"tool":"f","args":{}}', False), ('{"tool":"f","args":{}}\n', False),
    ('{"tool":"f","args":{}} and', True), ('{"a":1}', True), ("[1,2]", True),
])
def test_decided(text, done):
    assert decided(text) is done
    # the verdict never changes once decided: no continuation makes it parse
    if done:
        assert all(parse_calls(text + tail) is None for tail in ("", "}", "]", " ", '"}}'))


def test_valid_calls_follow_the_schema():
    tools = bfcl_tools([FN])
    assert valid_calls([call(shape="square", side=2.5)], tools)
    assert valid_calls([call(shape="square", side=2)], tools)  # JSON Schema: an integer is a number
    assert not valid_calls([call(shape="square")], tools)  # required
    assert not valid_calls([call(shape="square", side="2")], tools)
    assert not valid_calls([{"tool": "nope", "args": {}}], tools)
    assert not valid_calls(None, tools) and not valid_calls([], tools)

# Gold answers of every BFCL category, and replies changed from them, against BFCL's own checker:
# tests/test_eval_bfcl_rules.py.


def test_the_tolerant_reading_finds_a_call_anywhere_in_a_free_reply():
    from railcall.eval.checker import find_calls

    want = [{"tool": "f", "args": {"a": 1}}]
    for text in ['{"tool":"f","args":{"a":1}}', 'Sure:\n```json\n{"name": "f", "arguments": {"a": 1}}\n```',
                 'Calling {"name":"f","parameters":{"a":1}} now.', '{"function":{"name":"f","arguments":"{\\"a\\":1}"}}',
                 'x {not json} [{"tool":"f","args":{"a":1}}] y']:
        assert find_calls(text) == want, text
    assert find_calls('[{"tool":"f","args":{}},{"name":"g","arguments":{"b":[1]}}]') == [
        {"tool": "f", "args": {}}, {"tool": "g", "args": {"b": [1]}}]
    for text in ["no call here", '{"tool":"f"}', '{"name":"f","arguments":"not json"}', "[]", '{"tool":1,"args":{}}']:
        assert find_calls(text) is None, text
