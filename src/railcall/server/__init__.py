"""railcall's OpenAI-compatible server (`railcall serve`): FastAPI and uvicorn are imported here
and nowhere else, so `import railcall` never needs them.

    schemas.py   request bodies (pydantic) and OpenAI's error object
    plan.py      a request -> prompt ids, answer grammar, sampling (every 400 is raised here)
    engine.py    the served model, the bounded queue and the generation worker thread
    assemble.py  generated steps -> content, tool calls, logprobs and stream deltas
    sse.py       server-sent events in OpenAI's chunk format
    responses.py the Responses API: its request -> a chat request, the output as items and events
    metrics.py   /metrics through prometheus_client
    app.py       the FastAPI app: routes, auth, body limit, errors
    protocol.py  the HTTP connection: deadlines on reading a request

See docs/server.md.
"""
