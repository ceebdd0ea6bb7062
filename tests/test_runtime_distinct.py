"""Distinct calls: within one reply a call identical to an earlier one is unspellable
(railcall.runtime.distinct), driven through the decode loop by a scripted model that wants to
repeat itself."""

from __future__ import annotations

import json

import pytest

from agentkit import ScriptedBackend
from railcall.grammar.tools import Tool, tool_grammar
from railcall.matcher import Matcher, compiled_grammar
from railcall.runtime.decode import SamplingParams, generate
from railcall.runtime.distinct import DistinctCalls

NOTE = Tool("save_note", "Save a note.", {"type": "object", "properties": {"text": {"type": "string"}},
                                         "required": ["text"]})
PING = Tool("ping", "Ping.", {"type": "object", "properties": {}})
CITY = Tool("weather", "Weather.", {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}},
                                    "required": ["city"]})


def run(vocab, tools, reply, fmt="json", distinct=True, max_tokens=200):
    g = compiled_grammar(tool_grammar(tools, fmt, parallel=True), vocab)
    params = SamplingParams(max_tokens=max_tokens, distinct_calls=distinct)
    return generate(ScriptedBackend(vocab, [reply]), vocab, [0], Matcher(g), params)


def calls(gen):
    data = json.loads(gen.text)
    return [json.dumps(c, sort_keys=True) for c in (data if isinstance(data, list) else [data])]


def test_a_repeated_call_is_written_without_the_ban_and_not_with_it(bytes_vocab):
    one = '{"tool":"save_note","args":{"text":"milk"}}'
    reply = "[" + ",".join([one] * 3) + "]"
    free = run(bytes_vocab, [NOTE], reply, distinct=False)
    assert free.text == reply  # the scripted model repeats itself when nothing stops it
    held = run(bytes_vocab, [NOTE], reply)
    got = calls(held)
    assert not held.truncated and len(got) == len(set(got)) >= 1
    assert json.loads(held.text)[0] == {"tool": "save_note", "args": {"text": "milk"}}


@pytest.mark.parametrize("tools", [[PING], [PING, NOTE]])
def test_a_call_decided_by_one_choice_is_banned_at_that_choice(bytes_vocab, tools):
    """A tool without arguments: once its name is chosen the rest is forced, so the second `ping`
    is refused at the name (or the `,` that would open a second call, where ping is all there is)."""
    one = '{"tool":"ping","args":{}}'
    reply = "[" + ",".join([one] * 3) + "]"
    held = run(bytes_vocab, tools, reply)
    got = calls(held)
    assert not held.truncated and not held.cut, held.text  # closed by the model's own tokens in budget
    assert len(got) == len(set(got)) and got.count(json.dumps({"args": {}, "tool": "ping"}, sort_keys=True)) == 1
    if tools == [PING]:
        assert held.text == "[" + one + "]"


def test_an_enum_value_used_up_is_refused_and_the_other_is_written(bytes_vocab):
    paris = '{"tool":"weather","args":{"city":"Paris"}}'
    held = run(bytes_vocab, [CITY], "[" + ",".join([paris] * 3) + "]")
    data = json.loads(held.text)
    assert [c["args"]["city"] for c in data] in (["Paris"], ["Paris", "Rome"]), held.text


def test_pythonic_calls_are_told_apart_by_name_and_arguments(bytes_vocab):
    one = 'save_note(text="milk")'
    reply = "[" + ", ".join([one] * 3) + "]"
    free = run(bytes_vocab, [NOTE], reply, fmt="pythonic", distinct=False)
    assert free.text == reply
    held = run(bytes_vocab, [NOTE], reply, fmt="pythonic")
    assert held.text.count('save_note(text="milk")') == 1 and not held.truncated, held.text


def test_scanner_finds_calls_in_each_format():
    d = DistinctCalls(vocab=None)
    d.feed(b'[{"tool":"a","args":{"s":"}{\\"x"}},{"tool":"b","args":{}}]')
    assert d.calls == {b'{"tool":"a","args":{"s":"}{\\"x"}}', b'{"tool":"b","args":{}}'}
    d = DistinctCalls(vocab=None)
    d.feed(b"<tool_call>\n" + b'{"name":"a","arguments":{}}' + b"\n</tool_call>\n<tool_call>\n" +
           b'{"name":"a","arguments":{}}')
    assert d.calls == {b'{"name":"a","arguments":{}}'}
    d = DistinctCalls(vocab=None)
    d.feed(b"[f(x='a)'), g(y=[1, 2])]")
    assert d.calls == {b"f(x='a)')", b"g(y=[1, 2])"}
