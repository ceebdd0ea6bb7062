"""Grounded arguments (railcall.heuristics.grounding): the numbers a request states, the numeric
arguments narrowed to them, the call count they fill, and each call's own part of them; and the
grammars that hold a reply to a count (min_calls/max_calls, a sequence of per-call tables)."""

from __future__ import annotations

import pytest

from railcall.errors import GrammarError
from railcall.grammar.tools import FORMATS, Tool, call_sequence_grammar, tool_grammar
from railcall.matcher import CompiledGrammar, Matcher
from railcall.heuristics.grounding import (calls_needed, ground, ground_tools, listed_numbers, request_numbers,
                                        stated_numbers)
from railcall.vocab import Vocabulary

BYTES = Vocabulary.from_pieces([bytes([b]) for b in range(256)], name="bytes-256")


def accepts(grammar, text: str) -> bool:
    m = Matcher(CompiledGrammar(grammar, BYTES))
    return m.consume_bytes(text.encode()) and m.is_accepting()


def tool(name="f", required=("a",), **props) -> Tool:
    return Tool(name, "", {"type": "object", "properties": props, "required": list(required)})


INT, NUM, STR = {"type": "integer"}, {"type": "number"}, {"type": "string"}


@pytest.mark.parametrize("text, stated", [
    ("the factorial of 5, 7 and 9", [(5,), (7,), (9,)]),
    ("invest $5,000,000 at 12% for 3.5 years", [(5000000,), (12, 0.12), (3.5,)]),
    ("[1,2,3] and 5,000", [(1,), (2,), (3,), (5000,)]),
    ("-4 degrees, then 0.5", [(-4,), (0.5,)]),
    ("5 and 5 again", [(5,), (5,)]),  # stated twice: there twice
    # not numbers: dates, times, versions, phone numbers, ranges, digits inside words, leading zeros
    ("on 2021-01-01 at 10:30, v3.2.1, call 555-0134, pages 10-20, x2 3rd 007", []),
])
def test_the_numbers_a_request_states(text, stated):
    assert stated_numbers(text) == stated


def test_request_numbers_are_distinct_and_keep_a_percentages_fraction():
    assert request_numbers("12% of 12, then 5 and 5") == [12, 0.12, 5]
    # an int and the float of the same value are two spellings the model may be asked for
    assert request_numbers("5 or 5.0") == [5, 5.0]


def test_required_numbers_are_narrowed_and_optional_ones_stay_free():
    t = tool(required=("a", "b", "s"), a=INT, b=NUM, s=STR, opt=INT)
    [g] = ground_tools([t], [3, 2.5, 12, 0.12])
    props = g.parameters["properties"]
    assert props["a"]["enum"] == [3, 12]  # 2.5 and 0.12 are no integers
    assert props["b"]["enum"] == [3, 2.5, 12, 0.12]
    assert "enum" not in props["s"] and "enum" not in props["opt"]
    assert "enum" not in t.parameters["properties"]["a"]  # the table itself is not changed


def test_bounds_narrow_further_and_no_fitting_number_leaves_the_argument_free():
    t = tool(required=("a", "b"), a={"type": "integer", "minimum": 10}, b={"type": "number", "maximum": 1})
    [g] = ground_tools([t], [5, 50])
    assert g.parameters["properties"]["a"]["enum"] == [50]
    assert "enum" not in g.parameters["properties"]["b"]  # an empty choice would be no grammar
    assert ground_tools([t], []) == [t]


def test_the_call_count_is_what_the_numbers_fill():
    one = tool(a=INT)
    two = tool("g", required=("a", "b"), a=INT, b=NUM)
    listed = tool("h", required=("xs",), xs={"type": "array", "items": NUM})
    words = tool("w", required=("s",), s=STR)
    assert calls_needed([one], 3) == 3  # the factorial of 5, 7 and 9
    assert calls_needed([two], 5) == 2  # a remainder does not make a call
    assert calls_needed([two], 1) == 1
    assert calls_needed([one, two], 4) == 2  # the table's fewest: a call that holds more asks for fewer
    assert calls_needed([one, listed], 9) == 1  # an array of numbers holds any count
    assert calls_needed([words], 7) == 1  # no required number: nothing to count by
    assert calls_needed([one], 100) == 8  # capped


def test_each_call_takes_its_own_part_of_the_numbers():
    t = tool(required=("a", "b"), a=INT, b=NUM, s=STR)
    g = ground([t], "first a=5 and b=2.5, then a=7 and b=3 at 12%")
    assert g.calls == 2
    first, second = (c[0].parameters["properties"] for c in g.per_call)
    assert first["a"]["enum"] == [5] and first["b"]["enum"] == [5, 2.5]
    assert second["a"]["enum"] == [7, 3, 12] and second["b"]["enum"] == [7, 3, 12, 0.12]
    assert g.tools[0].parameters["properties"]["a"]["enum"] == [5, 7, 3, 12]
    assert ground([t], "just a=5 and b=2").per_call is None


def test_numbers_seen_earlier_may_be_written_but_do_not_count_calls():
    """A tool result's order id, or a number said in an earlier turn, is writable; the call
    count is still the request's own ("cancel it" asks for one call, not one per number)."""
    t = tool(a=INT)
    g = ground([t], "cancel that order", seen="Orders: 4471 (2 items), 4480 (5 items)")
    assert g.calls == 1 and g.per_call is None
    assert g.tools[0].parameters["properties"]["a"]["enum"] == [4471, 2, 4480, 5]
    g = ground([t], "the factorial of 5 and 7", seen="earlier: 9")
    assert g.calls == 2
    assert [c[0].parameters["properties"]["a"]["enum"] for c in g.per_call] == [[5, 9], [7, 9]]
    many = " ".join(str(n) for n in range(100, 150))  # more than are kept: the latest stay
    kept = ground([t], "cancel it", seen=many).tools[0].parameters["properties"]["a"]["enum"]
    assert 149 in kept and 100 not in kept
    assert ground([t], "cancel it").tools == [t]  # nothing stated anywhere: left free


def test_a_sequence_grammar_holds_the_count_and_each_calls_numbers():
    t = tool(a=INT)
    g = ground([t], "the factorial of 5, 7 and 9")
    grammar = call_sequence_grammar(g.per_call, "json")
    call = '{"tool":"f","args":{"a":%d}}'
    assert accepts(grammar, "[" + ",".join(call % n for n in (5, 7, 9)) + "]")
    assert not accepts(grammar, "[" + ",".join(call % n for n in (5, 5, 9)) + "]")  # 5 is the first call's
    assert not accepts(grammar, "[" + ",".join(call % n for n in (5, 7)) + "]")
    assert not accepts(grammar, "[" + ",".join(call % n for n in (5, 7, 9, 9)) + "]")
    assert not accepts(grammar, call % 5)


@pytest.mark.parametrize("fmt", ["json", "openai", "hermes", "pythonic"])
def test_every_format_writes_a_sequence_and_a_bounded_count(fmt):
    t = tool(a=INT)
    spell = FORMATS[fmt]()
    calls = lambda *ns: spell.write([("f", {"a": n}) for n in ns])  # noqa: E731
    seq = call_sequence_grammar([ground_tools([t], [n]) for n in (1, 2)], fmt)
    assert accepts(seq, calls(1, 2))
    assert not accepts(seq, calls(2, 1)) and not accepts(seq, calls(1, 2, 2))
    exact = tool_grammar([t], fmt, parallel=True, min_calls=2, max_calls=3)
    assert accepts(exact, calls(1, 2)) and accepts(exact, calls(1, 2, 3))
    assert not accepts(exact, calls(4, 5, 6, 7))
    assert not accepts(exact, calls(1))


def test_bad_call_counts_are_refused():
    t = tool(a=INT)
    with pytest.raises(GrammarError, match="min_calls"):
        tool_grammar([t], parallel=True, min_calls=3, max_calls=2)
    with pytest.raises(GrammarError, match="parallel=True"):
        tool_grammar([t], min_calls=2)
    with pytest.raises(GrammarError, match="empty"):
        call_sequence_grammar([[t], []])


def test_a_list_that_varies_one_argument_makes_a_call_per_item():
    t = tool(required=("amount", "rate", "years"), amount=NUM, rate=NUM, years=INT)
    text = "the future value of $1000 at 5% for 1, 5 and 10 years"
    assert listed_numbers(text) == (2, 3)
    g = ground([t], text)
    assert g.calls == 3
    years = [c[0].parameters["properties"]["years"]["enum"] for c in g.per_call]
    assert years == [[1000, 5, 1], [1000, 5], [1000, 5, 10]]
    rates = [c[0].parameters["properties"]["rate"]["enum"] for c in g.per_call]
    assert all(0.05 in r and 1000 in r for r in rates)
    # three numbers for three arguments are one call, listed or not
    triangle = tool(required=("a", "b", "c"), a=NUM, b=NUM, c=NUM)
    assert ground([triangle], "sides 3, 4 and 5").calls == 1
    assert listed_numbers("no list: 3 apples, then 4 pears") == (0, 1)
