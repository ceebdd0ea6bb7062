"""Several clients at once: all served, every response valid, none lost; a client that goes
away stops its generation."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import pytest

from server_harness import API_KEY, MODEL, TOOLS, wait_idle

pytestmark = pytest.mark.model

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["n"]}


def one(srv, i: int):
    """Client i: even ones call a named tool, odd ones ask for a JSON answer (a schema, or any
    object); every third streams."""
    client = srv.client()
    stream = i % 3 == 0
    # on_length "close": a call or answer the budget would cut is closed within it, so every
    # reply parses however the sampled values run
    kw = dict(model=MODEL, max_tokens=16, temperature=0.7, seed=i, extra_body={"on_length": "close"},
              messages=[{"role": "user", "content": f"Request {i}: weather in city number {i}?"}])
    if i % 2 == 0:
        kw.update(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    elif i % 4 == 3:
        kw.update(response_format={"type": "json_object"})
    else:
        kw.update(response_format={"type": "json_schema", "json_schema": {"name": "n", "strict": True, "schema": SCHEMA}})
    if not stream:
        msg = client.chat.completions.create(**kw).choices[0].message
        return i, msg.content, [(c.function.name, c.function.arguments) for c in msg.tool_calls or []]
    content, calls = "", {}
    for chunk in client.chat.completions.create(stream=True, **kw):
        for c in chunk.choices:
            content += c.delta.content or ""
            for tc in c.delta.tool_calls or []:
                name, args = calls.get(tc.index, ("", ""))
                calls[tc.index] = (name + (tc.function.name or ""), args + (tc.function.arguments or ""))
    return i, content or None, [calls[k] for k in sorted(calls)]


def test_eight_clients_at_once(srv):
    assert wait_idle(srv.engine)
    before = dict(srv.engine.stats)
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda i: one(srv, i), range(8)))
    assert sorted(r[0] for r in results) == list(range(8))  # none lost
    for i, content, calls in results:
        if i % 2 == 0:
            assert content is None and len(calls) == 1 and calls[0][0] == "get_weather", (i, content, calls)
            jsonschema.validate(json.loads(calls[0][1]), TOOLS[0]["function"]["parameters"])
        else:
            assert not calls
            if i % 4 == 3:
                assert isinstance(json.loads(content), dict)
            else:
                jsonschema.validate(json.loads(content), SCHEMA)
    assert srv.engine.stats["completed"] - before["completed"] == 8
    assert srv.engine.stats["failed"] == before["failed"]


def _cancelled_after(srv, before: int, timeout: float = 30) -> bool:
    t0 = time.monotonic()
    while srv.engine.stats["cancelled"] <= before:
        if time.monotonic() - t0 > timeout:
            return False
        time.sleep(0.05)
    return True


def test_disconnect_while_streaming_cancels(srv):
    assert wait_idle(srv.engine)
    before, tokens_before = srv.engine.stats["cancelled"], srv.engine.stats["generated_tokens"]
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Write a long story about a dragon."}],
            "max_tokens": 400, "temperature": 0, "stream": True}
    with httpx.stream("POST", srv.base_url + "/chat/completions", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {API_KEY}"}) as r:
        assert r.status_code == 200
        seen = 0
        for line in r.iter_lines():
            if line.startswith("data: ") and '"content"' in line:
                seen += 1
            if seen >= 3:
                break  # leaving the block closes the connection
    assert _cancelled_after(srv, before)
    assert wait_idle(srv.engine)
    assert srv.engine.stats["generated_tokens"] - tokens_before < 400  # stopped early


def test_disconnect_while_waiting_cancels(srv):
    """A non-streaming client that times out: its generation stops (it was running or queued)."""
    assert wait_idle(srv.engine)
    before = srv.engine.stats["cancelled"]
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Write a long story about a cat."}],
            "max_tokens": 400, "temperature": 0}

    def slow():  # occupies the worker so that the next request waits in the queue
        httpx.post(srv.base_url + "/chat/completions", json={**body, "max_tokens": 400}, timeout=1.5,
                   headers={"Authorization": f"Bearer {API_KEY}"})

    threads = [threading.Thread(target=lambda: pytest.raises(httpx.TimeoutException, slow)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    t0 = time.monotonic()
    while srv.engine.stats["cancelled"] < before + 2 and time.monotonic() - t0 < 30:
        time.sleep(0.05)
    assert srv.engine.stats["cancelled"] == before + 2  # the running one and the queued one
    assert wait_idle(srv.engine, timeout=10)
