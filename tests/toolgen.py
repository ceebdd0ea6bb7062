"""Random tool tables and random walks through their grammars, for property and oracle tests."""

from __future__ import annotations

import random

import numpy as np

from railcall.grammar.tools import Tool

NAME_PARTS = ["read", "read_file", "write", "write_file", "list", "list_dir", "calc", "search", "get", "get_weather",
              "run", "remember", "move", "é_tool", "q"]
KEYS = ["path", "text", "n", "count", "flag", "mode", "tags", "opts", "unit", "city", "x", "é", "deep"]


def random_schema(rng: random.Random, depth: int = 0) -> dict:
    kinds = ["string", "string", "integer", "int_range", "number", "boolean", "enum", "array"]
    if depth < 2:
        kinds += ["object", "anyof"]
    k = rng.choice(kinds)
    if k == "string":
        s = {"type": "string"}
        if rng.random() < 0.3:
            s["maxLength"] = rng.randint(1, 12)
        if rng.random() < 0.2:
            s["minLength"] = rng.randint(0, 3)
            s["maxLength"] = max(s.get("maxLength", 0), s["minLength"] + 2)
        return s
    if k == "integer":
        return {"type": "integer"}
    if k == "int_range":
        lo = rng.randint(-50, 50)
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.choice([0, 5, 99, 1000])}
    if k == "number":
        return {"type": "number"}
    if k == "boolean":
        return {"type": "boolean"}
    if k == "enum":
        pool = ["a", "b", "c d", "é", "north", "north-east", 1, 12, 2.5, True, None]
        return {"enum": rng.sample(pool, rng.randint(1, 4))}
    if k == "array":
        s = {"type": "array", "items": random_schema(rng, depth + 1)}
        if rng.random() < 0.5:
            s["maxItems"] = rng.randint(1, 3)
        if rng.random() < 0.3:
            s["minItems"] = min(1, s.get("maxItems", 1))
        return s
    if k == "anyof":
        return {"anyOf": [{"type": "string", "maxLength": 5}, {"type": "integer"}]}
    return random_object(rng, depth + 1)


def random_object(rng: random.Random, depth: int = 0) -> dict:
    keys = rng.sample(KEYS, rng.randint(0 if depth else 1, 4))
    props = {key: random_schema(rng, depth) for key in keys}
    required = [key for key in keys if rng.random() < 0.75]
    return {"type": "object", "properties": props, "required": required}


def random_tools(rng: random.Random, n: int | None = None) -> list[Tool]:
    n = n or rng.randint(1, 5)
    names = rng.sample(NAME_PARTS, n)
    return [Tool(name, "", random_object(rng), mutates=rng.random() < 0.3) for name in names]


def _classes(vocab):
    """Per vocabulary: (closing, short) bool arrays over token ids, computed once."""
    hit = vocab._extra.get("toolgen_classes")
    if hit is None:
        closing = np.array([any(c in b for c in (b'"', b"}", b"]", b",")) for b in vocab.token_bytes])
        short = (vocab.lengths > 0) & (vocab.lengths <= 2)
        hit = vocab._extra["toolgen_classes"] = (closing, short)
    return hit


def pick_token(rng: random.Random, legal, vocab, stop_ids) -> int:
    """A random legal token, biased so that walks end: stop when possible, often close things."""
    legal = np.asarray(legal, dtype=np.int64)
    legal = np.sort(legal)
    where = np.searchsorted(legal, sorted(stop_ids))
    stops = [t for t, i in zip(sorted(stop_ids), where.tolist()) if i < legal.size and legal[i] == t]
    if stops and rng.random() < 0.7:
        return int(rng.choice(sorted(stops)))
    closing, short = _classes(vocab)
    r = rng.random()
    if r < 0.2:
        pool = legal[closing[legal]]
        if pool.size:
            return int(pool[rng.randrange(pool.size)])
    if r < 0.5:
        pool = legal[short[legal]]
        if pool.size:
            return int(pool[rng.randrange(pool.size)])
    return int(legal[rng.randrange(legal.size)])
