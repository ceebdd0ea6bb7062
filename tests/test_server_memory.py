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


def test_what_startup_loaded_is_set_aside_from_the_garbage_collector(srv):
    """The model, the vocabulary and the modules loaded before the engine started are frozen
    out of the collector (app lifespan), so a full collection does not walk them on every
    request; what requests create is still collected."""
    import gc

    assert gc.get_freeze_count() >= 10_000
    before = gc.get_freeze_count()
    cycle = []
    cycle.append(cycle)
    gc.collect()
    assert gc.get_freeze_count() == before  # collecting neither frees nor freezes more
    assert any(o is cycle for o in gc.get_objects())  # a new object is still the collector's
