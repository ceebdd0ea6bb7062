"""The names the server answers to, and the OpenAI fields it accepts without acting on them.

`/v1/models` lists the model's id and its short name; both resolve in `GET /v1/models/{id}` and
in requests; any other name is OpenAI's 404 `model_not_found` (as vLLM answers), unless the
server was started with `--served-model-name` for it. Fields that would not change what the
served model writes (`reasoning_effort`, `verbosity`, `modalities: ["text"]`, `prediction`,
OpenAI's bookkeeping) are accepted and logged once per name; `modalities` asking for audio is a
400, since ignoring it would change the answer.
"""

from __future__ import annotations

import logging

import httpx
import openai
import pytest

from server_harness import API_KEY, MODEL

pytestmark = pytest.mark.model

HEADERS = {"Authorization": f"Bearer {API_KEY}"}
ASK = [{"role": "user", "content": "Say hello."}]


def post(srv, body, path="/chat/completions"):
    return httpx.post(srv.base_url + path, json=body, headers=HEADERS, timeout=60)


def test_models_lists_the_id_and_the_short_name_and_both_resolve(srv, client):
    listed = [m.id for m in client.models.list().data]
    assert listed == [srv.served.name, MODEL]
    for name in listed:
        assert client.models.retrieve(name).id == name
        r = client.chat.completions.create(model=name, messages=ASK, max_tokens=1, temperature=0)
        assert r.model == srv.served.name  # answers carry the first name, as OpenAI's carry the snapshot
    assert post(srv, {"messages": ASK, "max_tokens": 1}).status_code == 200  # no model: the one served


@pytest.mark.parametrize("path,body", [
    ("/chat/completions", {"messages": ASK}),
    ("/completions", {"prompt": "Hello"}),
])
def test_an_unknown_model_is_openais_404(srv, path, body):
    r = post(srv, {"model": "gpt-4o-mini", "max_tokens": 1, **body}, path)
    err = r.json()["error"]
    assert r.status_code == 404 and err["code"] == "model_not_found" and err["param"] == "model"
    assert "gpt-4o-mini" in err["message"] and MODEL in err["message"] and "--served-model-name" in err["message"]
    with pytest.raises(openai.NotFoundError):
        srv.client().models.retrieve("gpt-4o-mini")


def beside(srv, **kw):
    """Another app over the shared model and its running engine, in process (its lifespan does not
    run, so the shared engine is neither started again nor stopped)."""
    from fastapi.testclient import TestClient

    from railcall.server.app import create_app

    return TestClient(create_app(srv.served, engine=srv.engine, **kw), headers=HEADERS)


def test_served_model_name_replaces_the_names(srv):
    c = beside(srv, names=["gpt-4o-mini", "small"])
    assert [m["id"] for m in c.get("/v1/models").json()["data"]] == ["gpt-4o-mini", "small"]
    assert c.get("/v1/models/small").status_code == 200
    assert c.get(f"/v1/models/{MODEL}").json()["error"]["code"] == "model_not_found"
    r = c.post("/v1/chat/completions", json={"model": "small", "messages": ASK, "max_tokens": 1})
    assert r.status_code == 200 and r.json()["model"] == "gpt-4o-mini"


def test_served_model_name_on_the_command_line_is_repeatable_and_split_at_commas(monkeypatch):
    from typer.testing import CliRunner

    import railcall.server.app as server_app
    from railcall.cli import app

    seen = {}
    monkeypatch.setattr(server_app, "serve", lambda model, **kw: seen.update(kw))
    r = CliRunner().invoke(app, ["serve", "--served-model-name", "gpt-4o-mini,a", "--served-model-name", "b"])
    assert r.exit_code == 0, r.output
    assert seen["names"] == ["gpt-4o-mini", "a", "b"]


LENIENT = {"reasoning_effort": "low", "verbosity": "low", "modalities": ["text"], "service_tier": "auto",
           "prediction": {"type": "content", "content": "Hello"}, "store": True, "metadata": {"k": "v"},
           "user": "u1", "prompt_cache_key": "k", "safety_identifier": "s"}


def test_fields_that_change_nothing_are_accepted_and_logged_once(srv, caplog):
    c = beside(srv)  # a fresh app: nothing logged yet
    with caplog.at_level(logging.INFO, logger="railcall.server"):
        for _ in range(2):
            r = c.post("/v1/chat/completions", json={"model": MODEL, "messages": ASK, "max_tokens": 1, **LENIENT})
            assert r.status_code == 200, r.text
    logged = [m for m in caplog.messages if "accepted and ignored" in m]
    assert sorted(m.split("'")[1] for m in logged) == sorted(LENIENT)  # each name once


def test_through_the_openai_client(client):
    r = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=1, reasoning_effort="low",
                                       verbosity="low", modalities=["text"], service_tier="auto")
    assert r.choices[0].message.role == "assistant"


def test_what_cannot_be_ignored_is_still_refused(srv):
    r = post(srv, {"model": MODEL, "messages": ASK, "max_tokens": 1, "modalities": ["text", "audio"]})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "modalities" and "text only" in err["message"]
    r = post(srv, {"model": MODEL, "messages": ASK, "max_tokens": 1, "reasoning_effort": 3})
    assert r.status_code == 400 and r.json()["error"]["param"] == "reasoning_effort"  # types are still checked
    r = post(srv, {"model": MODEL, "messages": ASK, "max_tokens": 1, "web_search_options": {}})
    assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_field"
