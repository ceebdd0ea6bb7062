"""The FastAPI application: OpenAI's chat completions API over one served model.

    GET  /health                 liveness and queue depth (no key needed)
    GET  /metrics                Prometheus text (metrics.py): requests, tokens, errors, TTFT, queue (no key)
    GET  /v1/models              the one model this process serves, under each of its names
    GET  /v1/models/{model}      one of those names
    POST /v1/chat/completions    tools, tool_choice, response_format, streaming, logprobs, ...
    POST /v1/completions         a prompt in, text out; response_format / guided_* constrain it
    POST /v1/responses           OpenAI's Responses API on the same pipeline (responses.py)
    GET  /v1/responses/{id}      a response kept for previous_response_id (DELETE drops it)

Every error is OpenAI's error object, `{"error": {"message", "type", "param", "code"}}`: 400 for
a request that cannot be served as written (the message names the field, and for a schema the
keyword and JSON pointer), 401 without the API key, 404/405 for a wrong path or method (404
`model_not_found` for a model name this server does not answer to), 413 for
a body over the limit, 429 when the queue is full, 503 when the engine is not running. A request
is read, validated and planned (prompt, grammar) before it is queued, so every 4xx is answered
without waiting for the model.
"""

from __future__ import annotations

import asyncio
import gc
import hmac
import json
import logging
import re
import secrets
import threading
import time

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from railcall.version import __version__
from railcall.errors import RequestError
from railcall.matcher import MAX_STRING
from railcall.server import responses, sse
from railcall.server.engine import Engine
from railcall.server.model import ENGINE_BYTES, ServedModel
from railcall.server.assemble import Assembler, finish_reason, generation_failed, grammar_failure
from railcall.server.plan import Plan, build_completion_plan, build_plan
from railcall.server.schemas import IGNORED, ChatCompletionRequest, CompletionRequest, error_body

log = logging.getLogger("railcall.server")

DEFAULT_MAX_BODY = 4 << 20  # 4 MiB: a long conversation with a large tool table fits many times over
PING_SECONDS = 1.0  # a streamed request waiting in the queue sends a comment this often


# The cache's name for a model ends in its file's 16-hex-digit digest and the format
# (smollm2-747cb1f0195582d0-gguf, smollm2-747cb1f0195582d0-v1): what is before is the name a user
# typed (--model smollm2), which requests may use as well.
_DIGEST_SUFFIX = re.compile(r"^(?P<alias>.+)-[0-9a-f]{16}-(gguf|v\d+)$")


def settle_heap() -> int:
    """Set every object the process holds now aside from Python's garbage collector (gc.freeze)
    and return how many. What a server's startup loaded (the model, the vocabulary, torch's and
    the server's modules: ~430k objects on the transformers backend) lives as long as the
    process; left to the collector, every full collection walks it all, ~0.1-0.35 s in which no
    token is written (25 of them, ~6 s, over 24 requests from 8 clients on 2 cores; 9, ~1.2 s,
    with it). Process-wide: only for a process that is the server (`serve`), never undone."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def model_names(served: ServedModel, given: list[str] | None = None) -> list[str]:
    """The names a request's `model` may use for the served model; answers carry the first.
    `given` (`railcall serve --served-model-name`, as vLLM's option) replaces the defaults: the
    model's id and, where the id carries the cache's digest, the short name before it."""
    if given:
        return list(dict.fromkeys(given))
    short = _DIGEST_SUFFIX.match(served.name)
    return [served.name] + ([short["alias"]] if short else [])


def create_app(served: ServedModel, *, api_key: str | None = None, max_body: int = DEFAULT_MAX_BODY,
               max_pending: int = 32, engine: Engine | None = None, names: list[str] | None = None,
               freeze_gc: bool = False) -> FastAPI:
    """The app for `served`, answering to `names` (default: `model_names(served)`). Its engine
    starts and stops with the app (lifespan). `freeze_gc`: once warmed up, set what the process
    holds aside from Python's garbage collector (`settle_heap`), for a process that is this
    server and nothing else (`serve`)."""
    engine = engine or Engine(served, max_pending=max_pending)
    names = model_names(served, names)
    ignored_seen: set[str] = set()  # IGNORED fields already logged (once per name, per process)
    store = responses.ResponseStore()  # for previous_response_id: the last 256 responses, in memory
    from railcall.server.metrics import ServerMetrics

    metrics = ServerMetrics(engine)
    plan_lock = threading.Lock()  # one request planned at a time: compiling is CPU work

    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app):
        await run_in_threadpool(served.warm_up)
        if freeze_gc:
            settle_heap()
        engine.start()
        try:
            yield
        finally:
            await run_in_threadpool(engine.stop)

    app = FastAPI(title="railcall", version=__version__, lifespan=lifespan,
                  description="OpenAI-compatible chat completions; tool calls and JSON answers are enforced by a grammar.")
    app.state.served = served
    app.state.engine = engine
    app.state.api_key = api_key
    app.state.max_body = max_body
    app.state.names = names
    app.state.metrics = metrics

    # -- errors -----------------------------------------------------------------------------
    @app.exception_handler(RequestError)
    async def _request_error(request: Request, e: RequestError):
        metrics.error(e.status, e.code)
        return JSONResponse(error_body(str(e), e.type, e.param, e.code), status_code=e.status, headers=e.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException):
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        metrics.error(e.status_code, None)
        message = str(e.detail)
        if e.status_code in (404, 405):
            message = (f"{message}: {request.method} {request.url.path}; this server answers POST "
                       "/v1/chat/completions, POST /v1/completions, POST /v1/responses, GET /v1/responses/{id}, "
                       "GET /v1/models, GET /v1/models/{model}, GET /health and GET /metrics")
        return JSONResponse(error_body(message, kind), status_code=e.status_code, headers=getattr(e, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, e: RequestValidationError):
        metrics.error(400, None)
        return JSONResponse(_validation_body(e.errors()), status_code=400)

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception):  # a bug, never the client's input
        metrics.error(500, "server_error")
        return JSONResponse(error_body(f"internal error: {type(e).__name__}", "server_error"), status_code=500)

    def auth(request: Request) -> None:
        key = request.app.state.api_key
        if not key:
            return
        header = request.headers.get("authorization", "")
        given = header[7:].strip() if header[:7].lower() == "bearer " else ""
        if not given or not hmac.compare_digest(given.encode(), key.encode()):
            raise RequestError("a valid API key is required: send it as 'Authorization: Bearer <key>'",
                               status=401, param=None, code="invalid_api_key")

    # -- routes -----------------------------------------------------------------------------
    def model_object(name: str) -> dict:
        return {"id": name, "object": "model", "created": 0, "owned_by": "railcall", "root": served.name}

    def resolve(name: str | None) -> None:
        """A request's `model`: one of `names`, or none given (one model per process, as vLLM
        takes it); any other is OpenAI's 404 `model_not_found`."""
        if name and name not in names:
            known = " or ".join(repr(n) for n in names)
            raise RequestError(f"The model {name!r} does not exist: this server serves {known}; send one of those "
                               "names, or start it with --served-model-name NAME to answer to another",
                               status=404, param="model", code="model_not_found")

    def note_ignored(req) -> None:
        for field in sorted(req.model_fields_set & IGNORED.keys() - ignored_seen):
            ignored_seen.add(field)
            log.info("the request field %r is accepted and ignored (%s); logged once", field, IGNORED[field])

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": names[0], "pending": engine.pending}

    @app.get("/v1/models", dependencies=[Depends(auth)])
    async def models():
        return {"object": "list", "data": [model_object(n) for n in names]}

    @app.get("/v1/models/{model_id:path}", dependencies=[Depends(auth)])
    async def model(model_id: str):
        resolve(model_id or " ")  # an empty name names no model here
        return model_object(model_id)

    async def admit(request: Request, model):
        """Read the body (413 past the limit), validate it as `model`, check the model name."""
        body = await _read_body(request, request.app.state.max_body)
        req = _parse(body, model)
        resolve(req.model)
        note_ignored(req)
        return req

    async def queue(build, req, rid: str):
        """Plan `req` off the event loop (every 400 is raised there), queue it (429/503), and give
        each of its choices an Assembler."""

        def plan_it() -> Plan:
            with plan_lock:
                return build(served, req)

        plan = await run_in_threadpool(plan_it)
        job = engine.submit(plan, asyncio.get_running_loop())
        job.rid = rid
        metrics.track(job)
        return plan, job, [Assembler(served, plan) for _ in range(plan.n)]

    async def serve_request(request: Request, model, build, prefix: str, text: bool):
        """Both endpoints: read and validate the body, plan it off the event loop, queue it, and
        answer whole or as a stream (`text`: a text completion's shape)."""
        req = await admit(request, model)
        cid = prefix + secrets.token_hex(12)
        plan, job, asms = await queue(build, req, cid)
        created = int(time.time())
        if plan.stream:
            return StreamingResponse(_stream(job, asms, plan, cid, created, names[0], text=text, on_error=metrics.error),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return JSONResponse(await _complete(request, job, asms, plan, cid, created, names[0], text=text))

    @app.post("/v1/chat/completions", dependencies=[Depends(auth)],
              responses={400: {"description": "bad request"}, 413: {"description": "body too large"},
                         429: {"description": "queue full"}, 503: {"description": "engine not running"}})
    async def chat_completions(request: Request):
        return await serve_request(request, ChatCompletionRequest, build_plan, "chatcmpl-", text=False)

    @app.post("/v1/completions", dependencies=[Depends(auth)],
              responses={400: {"description": "bad request"}, 429: {"description": "queue full"}})
    async def completions(request: Request):
        """A prompt in, text out (no chat template): free, or under response_format / guided_*."""
        return await serve_request(request, CompletionRequest, build_completion_plan, "cmpl-", text=True)

    @app.post("/v1/responses", dependencies=[Depends(auth)],
              responses={400: {"description": "bad request"}, 404: {"description": "unknown model or previous response"},
                         429: {"description": "queue full"}})
    async def create_response(request: Request):
        """OpenAI's Responses API, translated to a chat completion and planned as one (responses.py)."""
        req = await admit(request, responses.ResponsesRequest)
        earlier = store.get(req.previous_response_id)[1] if req.previous_response_id else []
        chat, where = responses.to_chat(req, earlier)
        rid = responses.new_id("resp_")
        try:
            plan, job, asms = await queue(build_plan, chat, rid)
        except RequestError as e:
            raise responses.in_responses_terms(e, where) from None
        started = responses.skeleton(req, rid, names[0])
        conversation = earlier + [x.model_dump(by_alias=True, exclude_none=True) for x in req.input]

        def keep(done: dict) -> None:
            if req.store:
                store.put(done, conversation + responses.as_input(done["output"]))

        if plan.stream:
            return StreamingResponse(responses.stream(job, asms[0], plan, started, keep, on_error=metrics.error),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        chat_answer = await _complete(request, job, asms, plan, rid, started["created_at"], names[0])
        done = responses.from_chat(started, chat_answer)
        keep(done)
        return JSONResponse(done)

    @app.get("/v1/responses/{rid}", dependencies=[Depends(auth)])
    async def get_response(rid: str):
        return store.get(rid, param="response_id")[0]

    @app.delete("/v1/responses/{rid}", dependencies=[Depends(auth)])
    async def delete_response(rid: str):
        store.get(rid, param="response_id")  # 404 for an id it does not hold
        store.delete(rid)
        return {"id": rid, "object": "response", "deleted": True}

    @app.get("/metrics")
    async def prometheus():
        """Prometheus text format: requests, tokens, errors; TTFT, time per token, queue wait; rows, queue."""
        from fastapi.responses import Response
        from railcall.server.metrics import CONTENT_TYPE

        return Response(metrics.text(), media_type=CONTENT_TYPE)

    app.openapi = lambda: _openapi(app)
    return app


# -- request reading ------------------------------------------------------------------------------

async def _read_body(request: Request, limit: int) -> bytes:
    too_big = RequestError(f"the request body is larger than the server's limit of {limit} bytes", status=413,
                           code="request_too_large")
    length = request.headers.get("content-length")
    if length is not None:
        try:
            if int(length) > limit:
                raise too_big
        except ValueError:
            raise RequestError("the Content-Length header is not a number") from None
    from starlette.requests import ClientDisconnect

    data = bytearray()
    try:
        async for piece in request.stream():
            data.extend(piece)
            if len(data) > limit:
                raise too_big
    except ClientDisconnect:  # nobody is left to answer: one log line, no traceback
        log.info("a client went away while sending its request (%d bytes read)", len(data))
        raise RequestError("the client disconnected before its request body was complete", code="client_disconnected") from None
    return bytes(data)


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON value (JSON has no NaN or infinities)")


def _parse(body: bytes, model=ChatCompletionRequest):
    try:
        obj = json.loads(body, parse_constant=_no_constant)
    except RecursionError:
        raise RequestError("the request body nests arrays or objects too deeply to read (about a thousand "
                           "levels); flatten it", code="invalid_json") from None
    except ValueError as e:
        raise RequestError(f"the request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(obj, dict):
        raise RequestError(f"the request body must be a JSON object, not {type(obj).__name__}", code="invalid_json")
    where = _lone_surrogate(obj)
    if where is not None:
        raise RequestError(f"{where or 'a key'}: the text holds a lone surrogate (an unpaired \\ud800-\\udfff escape), "
                           "which is not Unicode text; send the character itself or a complete surrogate pair",
                           param=where or None)
    try:
        return model.model_validate(obj)
    except ValidationError as e:
        raise _validation_error_of(e.errors()) from None
    except RecursionError:
        raise RequestError("the request body is nested too deeply") from None


def _lone_surrogate(obj, path: str = "") -> str | None:
    """The dotted path (OpenAI's form) of the first string or key holding a lone surrogate, which
    json.loads lets through from a "\\ud800" escape but no tokenizer or UTF-8 encoder accepts."""
    if isinstance(obj, str):
        try:
            obj.encode("utf-8")
        except UnicodeEncodeError:
            return path
        return None
    if isinstance(obj, dict):
        for k, v in obj.items():
            sub = f"{path}.{k}" if path else str(k)
            try:
                k.encode("utf-8")
            except UnicodeEncodeError:
                return path + " (a key)" if path else "(a key)"
            hit = _lone_surrogate(v, sub)
            if hit is not None:
                return hit
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            hit = _lone_surrogate(v, f"{path}[{i}]")
            if hit is not None:
                return hit
    return None


def _param(loc) -> str | None:
    """pydantic's error location as OpenAI's dotted field path (messages[0].content); the tags
    pydantic adds for union branches (`str`, `list[TextPart]`, `user`) are left out."""
    out = ""
    prev = None
    loc = tuple(loc)
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and part.isidentifier() and part not in ("str", "int", "float", "bool", "dict", "list"):
            # a message's role is the union's tag right after its index (messages[0].user.content),
            # and a tool's or a call's type before its own field of that name (tools[0].function.function)
            tag = (isinstance(prev, int) and part in ("system", "developer", "user", "assistant", "tool", "message",
                                                      "function_call", "function_call_output", "custom_tool_call",
                                                      "custom_tool_call_output", "reasoning")) or \
                (part in ("function", "custom") and i + 1 < len(loc) and loc[i + 1] == part)
            if not (tag or part[:1].isupper()):
                out += ("." if out else "") + part
        prev = part
    return out or None


def _validation_error_of(errors: list) -> RequestError:
    # A union's branches each report an error; one of railcall's own messages (a value_error: an
    # image part, top_logprobs without logprobs) says more than "Input should be a valid string".
    first = next((e for e in errors if e.get("type") == "value_error"), errors[0] if errors else
                 {"loc": (), "msg": "invalid request"})
    param = _param(first.get("loc", ()))
    msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if first.get("type") == "extra_forbidden":
        return RequestError(f"{param}: this server does not support the field {param!r}; remove it (the fields it "
                            "honours are listed in docs/server.md)", param=param, code="unsupported_field")
    if param == "tool_choice" or (param or "").startswith("tool_choice."):
        # a union: pydantic's first error is the string branch's, which says nothing of the object form
        param = "tool_choice"
        msg = ("must be 'none', 'auto', 'required' or {\"type\": \"function\", \"function\": {\"name\": ...}} "
               "naming one of the tools")
    return RequestError(f"{param}: {msg}" if param else msg, param=param)


def _validation_body(errors: list) -> dict:
    e = _validation_error_of(list(errors))
    return error_body(str(e), e.type, e.param, e.code)


# -- responses ----------------------------------------------------------------------------------

def _usage(plan: Plan, gens) -> dict:
    done = sum(len(g.tokens) for g in gens)
    return {"prompt_tokens": len(plan.prompt), "completion_tokens": done, "total_tokens": len(plan.prompt) + done,
            "prompt_tokens_details": {"cached_tokens": max((g.prompt_cached for g in gens), default=0)}}


async def _watch_disconnect(request: Request, job) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            job.cancel()
            return


async def _complete(request: Request, job, asms: list[Assembler], plan: Plan, cid: str, created: int, model: str,
                    text: bool = False) -> dict:
    watcher = asyncio.create_task(_watch_disconnect(request, job))
    steps: list[list] = [[] for _ in asms]
    gens: list = [None] * len(asms)
    try:
        while any(g is None for g in gens):
            kind, value = await job.events.get()
            if kind == "step":
                k, step = value
                steps[k].append(step)
                asms[k].feed(step)
            elif kind == "error":
                raise generation_failed(value)
            else:
                k, gen = value
                gens[k] = gen
    finally:
        watcher.cancel()
        job.cancel()
    choices = []
    for k, (asm, gen) in enumerate(zip(asms, gens)):
        failed = grammar_failure(gen)
        if failed is not None:
            raise failed
        asm.finish(gen)
        if text:  # a text completion's choice
            choice = {"index": k, "text": asm.content, "finish_reason": finish_reason(gen, asm), "logprobs": None}
        else:
            choice = {"index": k, "message": asm.message(), "finish_reason": finish_reason(gen, asm),
                      "logprobs": {"content": [asm.logprob_entry(s) for s in steps[k]]} if plan.logprobs else None}
        if plan.return_token_ids:
            choice["token_ids"] = list(gen.tokens)
        choices.append(choice)
    out = {"id": cid, "object": "text_completion" if text else "chat.completion", "created": created, "model": model,
           "choices": choices, "usage": _usage(plan, gens)}
    if plan.return_token_ids:
        out["prompt_token_ids"] = list(plan.prompt)
    return out


async def _stream(job, asms: list[Assembler], plan: Plan, cid: str, created: int, model: str, text: bool = False,
                  on_error=None):
    """A chat (or text) completion's SSE chunks; `on_error(status, code)` hears of a failure sent
    as an error event."""
    n = len(asms)
    ids: list[list[int]] = [[] for _ in asms]  # per choice: token ids and logprobs not yet sent
    lps: list[list[dict]] = [[] for _ in asms]
    gens: list = [None] * n

    def make(k, delta, finish=None):
        if text:  # a text completion's chunk: the content delta as "text"
            c = {"id": cid, "object": "text_completion", "created": created, "model": model, "choices": [
                {"index": k, "text": delta.get("content", ""), "finish_reason": finish, "logprobs": None}]}
            if plan.return_token_ids:
                c["choices"][0]["token_ids"] = list(ids[k])
        else:
            c = sse.chunk(cid, created, model, delta, finish_reason=finish, index=k,
                          logprobs=list(lps[k]) if plan.logprobs else None,
                          token_ids=list(ids[k]) if plan.return_token_ids else None)
        ids[k].clear()
        lps[k].clear()
        return sse.event(c)

    def fail(e: RequestError):
        if on_error is not None:
            on_error(e.status, e.code)
        for a in asms:
            a.cancel()
        return sse.event(error_body(str(e), e.type, e.param, e.code)) + sse.DONE

    try:
        for k in range(n if not text else 0):
            yield make(k, {"role": "assistant", "content": ""})
        while any(g is None for g in gens):
            try:
                kind, value = await asyncio.wait_for(job.events.get(), PING_SECONDS)
            except asyncio.TimeoutError:
                yield sse.PING
                continue
            if kind == "step":
                k, step = value
                ids[k].append(step.token)
                if plan.logprobs:
                    lps[k].append(asms[k].logprob_entry(step))
                for delta in asms[k].feed(step):
                    if not text or "content" in delta:
                        yield make(k, delta)
            elif kind == "error":
                yield fail(generation_failed(value))
                return
            else:
                k, gen = value
                gens[k] = gen
                failed = grammar_failure(gen)
                if failed is not None:
                    yield fail(failed)
                    return
                for delta in asms[k].finish(gen):
                    if not text or "content" in delta:
                        yield make(k, delta)
                yield make(k, {}, finish_reason(gen, asms[k]))
        if plan.include_usage:
            yield sse.event({"id": cid, "object": "text_completion" if text else "chat.completion.chunk",
                             "created": created, "model": model, "choices": [], "usage": _usage(plan, gens)})
        yield sse.DONE
    finally:
        job.cancel()  # a client that went away stops its generation at the next token


def _openapi(app: FastAPI) -> dict:
    """The OpenAPI document, with the chat request's schema (the route reads its body itself, so
    that every validation error is a 400 in OpenAI's format rather than FastAPI's 422)."""
    if app.openapi_schema:
        return app.openapi_schema
    doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    schema = ChatCompletionRequest.model_json_schema(ref_template="#/components/schemas/{model}", by_alias=True)
    defs = schema.pop("$defs", {})
    doc.setdefault("components", {}).setdefault("schemas", {}).update(defs)
    doc["components"]["schemas"]["ChatCompletionRequest"] = schema
    post = doc["paths"]["/v1/chat/completions"]["post"]
    post["requestBody"] = {"required": True, "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/ChatCompletionRequest"}}}}
    app.openapi_schema = doc
    return doc




def serve(model: str | None = None, *, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
          max_pending: int = 32, max_body: int = DEFAULT_MAX_BODY, max_string: int = MAX_STRING,
          max_rows: int = 16, prefix_cache_bytes: int = 256 << 20, log_level: str = "info",
          call_format: str | None = None, names: list[str] | None = None,
          engine_bytes: int | None = ENGINE_BYTES, draft: int | None = None) -> None:
    """Load `model` and serve it until interrupted (what `railcall serve` runs). `max_string`:
    the most characters a generated string whose schema gives no maxLength may have; `max_rows`:
    requests decoded together; `prefix_cache_bytes`: the prefix cache's budget (0: off);
    `engine_bytes`: the budget of the engine's state shared by every request's grammar
    (`matcher.set_memory_budget`; `ENGINE_BYTES`; None: the engine's own 512 MiB);
    `call_format`: the calls' format where a request names none (default: the model's own);
    `names`: the model names requests may use (default: `model_names`); `draft`: tokens a row
    drafts a step (`railcall.runtime.decode.Row.advance`; None: DRAFT_TOKENS)."""
    import uvicorn

    from railcall.runtime.batch import PrefixCache

    if not log.handlers:  # one line per request (and per client gone mid-upload) on stderr
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s railcall: %(message)s"))
        log.addHandler(handler)
        log.setLevel(getattr(logging, log_level.upper(), logging.INFO))
    served = ServedModel.load(model, engine_bytes=engine_bytes)
    if call_format is not None:
        served.use_format(call_format)
    served.max_string = max_string
    sequences = getattr(served.lm.model, "sequences", None)  # llama.cpp: sequence ids for rows, copies, kept prefixes
    if sequences is not None and max_rows > sequences // 2:
        from railcall.errors import ModelError

        raise ModelError(f"--max-rows {max_rows}: the llama.cpp context holds {sequences} sequences, for the rows, "
                         f"their copies (n > 1) and the prefix cache; use at most {sequences // 2} rows")
    served.max_rows = max_rows
    if draft is not None:
        served.draft = draft
    served.prefix_cache = PrefixCache(served.prefix_budget(prefix_cache_bytes)) if prefix_cache_bytes > 0 else None
    app = create_app(served, api_key=api_key, max_pending=max_pending, max_body=max_body, names=names,
                     freeze_gc=True)
    from railcall.server.protocol import uvicorn_config

    uvicorn.Server(uvicorn_config(app, host=host, port=port, log_level=log_level)).run()


class Running:
    """A server started by `start_in_thread`: its base `url`, the `app`, and `stop()`."""

    def __init__(self, app, server, thread, url: str):
        self.app, self.server, self.thread, self.url = app, server, thread, url

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def start_in_thread(model: str | None = None, *, served: ServedModel | None = None, host: str = "127.0.0.1",
                    port: int = 0, api_key: str | None = None, max_pending: int = 32, max_body: int = DEFAULT_MAX_BODY,
                    log_level: str = "warning", names: list[str] | None = None,
                    engine_bytes: int | None = ENGINE_BYTES) -> Running:
    """Serve in a background thread of this process (tests, notebooks); returns once it listens.
    `port=0` picks a free port; `names` and `engine_bytes` as for `serve` (`engine_bytes` applies
    to a model loaded here, not to a `served` one given)."""
    import socket

    import uvicorn

    served = served or ServedModel.load(model, engine_bytes=engine_bytes)
    app = create_app(served, api_key=api_key, max_pending=max_pending, max_body=max_body, names=names)
    if port == 0:
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
    from railcall.server.protocol import uvicorn_config

    server = uvicorn.Server(uvicorn_config(app, host=host, port=port, log_level=log_level))
    thread = threading.Thread(target=server.run, name="railcall-server", daemon=True)
    thread.start()
    t0 = time.monotonic()
    while not server.started:
        if not thread.is_alive() or time.monotonic() - t0 > 300:
            raise RuntimeError(f"the server did not start on {host}:{port}")
        time.sleep(0.05)
    return Running(app, server, thread, f"http://{host}:{port}")
