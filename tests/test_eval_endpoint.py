"""railcall.eval.endpoint: BFCL tasks as OpenAI requests, and replies read as a tolerant client
reads them (tool_calls first, else a call written anywhere in the content)."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from railcall.eval import bfcl, endpoint

DATA = Path(__file__).resolve().parent / "data" / "bfcl"


def message(content=None, calls=()):
    tcs = [types.SimpleNamespace(function=types.SimpleNamespace(name=n, arguments=a)) for n, a in calls]
    return types.SimpleNamespace(content=content, tool_calls=tcs or None)


def test_a_request_is_what_a_client_sends_with_dotted_names_made_legal():
    task = bfcl.load_category(DATA, "tiny_parallel_multiple", 1)[0]
    task.functions = [{**task.functions[0], "name": "math.factorial"}]
    kw, names = endpoint.request(task, "m", 64)
    assert kw["tools"][0]["function"]["name"] == "math_factorial" and names == {"math_factorial": "math.factorial"}
    assert kw["tool_choice"] == "required" and kw["temperature"] == 0 and kw["max_tokens"] == 64
    assert all(set(m) == {"role", "content"} for m in kw["messages"])


@pytest.mark.parametrize("msg, want, source", [
    (message(calls=[("math_factorial", '{"n": 5}')]), [{"tool": "math.factorial", "args": {"n": 5}}], "tool_calls"),
    (message(calls=[("f", '{"n": 5')]), None, ""),  # cut by max_tokens: not a parsed call
    (message('Sure! {"name": "f", "arguments": {"n": 1}} is it.'), [{"tool": "f", "args": {"n": 1}}], "content"),
    (message('[{"tool": "f", "args": {}}, {"name": "g", "parameters": {"x": "y"}}]'),
     [{"tool": "f", "args": {}}, {"tool": "g", "args": {"x": "y"}}], "content"),
    (message("The answer is {not json} and [1, 2]."), None, ""),
    (message("no call at all"), None, ""),
])
def test_a_reply_is_read_as_a_tolerant_client_reads_it(msg, want, source):
    assert endpoint.read_reply(msg, "stop", {"math_factorial": "math.factorial"}) == (want, source)


def test_the_summary_counts_every_failure():
    recs = [{"category": "c", "parse": True, "valid": True, "ast": True, "cut": False, "source": "tool_calls",
             "error": "", "seconds": 1.0},
            {"category": "c", "parse": False, "valid": False, "ast": False, "cut": True, "source": "", "error": "",
             "seconds": 2.0},
            {"category": "c", "parse": False, "valid": False, "ast": False, "cut": False, "source": "",
             "error": "APIConnectionError: refused", "seconds": 0.1}]
    s = endpoint.summarise(recs, url="u")["categories"]["c"]
    assert s["tasks"] == 3 and s["parse"] == round(1 / 3, 4) and s["cut"] == round(1 / 3, 4) and s["errors"] == 1
    json.dumps(s)
