"""Server memory under client-chosen schemas: 1,000 requests, each with a fresh JSON schema
(enums of new words, patterns, nesting; every 100th a 2.9 MB enum the server refuses), through
the live server on the embedded model (tests/hostile.py's soak): no 5xx, and the resident memory
at the end within 20% of where the first 100 requests left it, under the server's default engine
budget (`server.model.ENGINE_BYTES`). Under the engine's own 512 MiB the same soak grew it 35%."""

from __future__ import annotations

import pytest

import hostile

pytestmark = pytest.mark.model


def test_a_thousand_fresh_schemas_leave_the_server_where_a_hundred_did(srv):
    from railcall.matcher.entries import vocab_cache
    from railcall.server.model import ENGINE_BYTES

    vocab = srv.served.vocab
    assert vocab_cache(vocab).budget == ENGINE_BYTES
    r = hostile.schema_soak(srv.url, 1000, vocab)
    print(r.extra)
    assert r.attempts == 1000 and r.bad == [], (r.bad[:3], r.extra)
    assert "store 0" not in r.extra  # the budget was reached: older state was dropped, masks unchanged



def test_serve_sets_what_startup_loaded_aside_from_the_garbage_collector(srv, monkeypatch):
    """`railcall serve` (server.app.serve, a process that is the server) asks its app to settle
    the heap once warmed up; an app built otherwise (tests, an embedding) leaves the collector
    alone; settle_heap freezes what the process holds and a new object stays the collector's."""
    import gc
    import logging
    from types import SimpleNamespace

    import uvicorn
    from fastapi.testclient import TestClient

    import railcall.server.protocol as protocol
    from railcall.server import app as server_app
    from railcall.server.engine import Engine

    settled = []
    real_settle = server_app.settle_heap
    monkeypatch.setattr(server_app, "settle_heap", lambda: settled.append(True) or 0)
    for freeze in (False, True):  # an engine of its own over the session's model: nothing is queued on it
        with TestClient(server_app.create_app(srv.served, engine=Engine(srv.served), freeze_gc=freeze)):
            pass
    assert settled == [True]

    captured = {}
    quiet = logging.getLogger("railcall.test.quiet")
    quiet.addHandler(logging.NullHandler())
    stub = SimpleNamespace(lm=SimpleNamespace(model=SimpleNamespace()), prefix_budget=lambda b: b)
    monkeypatch.setattr(server_app, "log", quiet)
    monkeypatch.setattr(server_app.ServedModel, "load", staticmethod(lambda *a, **k: stub))
    monkeypatch.setattr(server_app, "create_app", lambda served, **kw: captured.update(kw) or "app")
    monkeypatch.setattr(protocol, "uvicorn_config", lambda app, **kw: app)
    monkeypatch.setattr(uvicorn, "Server", lambda config: SimpleNamespace(run=lambda: None))
    server_app.serve("a model")
    assert captured["freeze_gc"] is True

    try:
        assert real_settle() >= 10_000  # the modules and the model this test process holds
        fresh = [[]]
        assert any(o is fresh for o in gc.get_objects())  # created after: still the collector's
    finally:
        gc.unfreeze()
