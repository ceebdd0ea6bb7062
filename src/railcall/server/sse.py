"""Server-sent events in OpenAI's chat completion stream format.

Each event is one `data: <json>` line and a blank line; the stream ends with `data: [DONE]`.
A comment line (`: ping`) keeps a queued request's connection alive, and lets the server notice
a client that went away before its first token.
"""

from __future__ import annotations

import json

DONE = b"data: [DONE]\n\n"
PING = b": ping\n\n"


def event(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n\n"


def chunk(cid: str, created: int, model: str, delta: dict, *, finish_reason: str | None = None,
          logprobs: list | None = None, token_ids: list[int] | None = None, index: int = 0) -> dict:
    """One `chat.completion.chunk` with one choice (`index`: which of the request's n)."""
    choice = {"index": index, "delta": delta, "finish_reason": finish_reason,
              "logprobs": {"content": logprobs} if logprobs is not None else None}
    if token_ids is not None:
        choice["token_ids"] = token_ids
    return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [choice]}
