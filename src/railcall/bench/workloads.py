"""Benchmark workloads: tool tables, the peers' equivalent JSON schemas, and token paths.

Everything here is deterministic (seeded), so every engine in a run sees the same tables and the
same token paths.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from railcall.eval.bfcl_dialect import bfcl_tools
from railcall.grammar.tools import Tool

STR = {"type": "string"}


def seed_tools() -> list[Tool]:
    """The smallest table: string arguments only, all required."""
    obj = lambda *names: {"type": "object", "properties": {n: STR for n in names}, "required": list(names)}  # noqa: E731
    return [Tool("calc", "Evaluate arithmetic", obj("expr")), Tool("read_file", "Read a file", obj("path")),
            Tool("write_file", "Write a file", obj("path", "text"), mutates=True)]


def bfcl_tables(n: int, data_dir: Path) -> tuple[list[list[Tool]], list[str]]:
    """The first `n` tables of BFCL's `multiple` category (2-4 functions each), and their
    questions (the first user message)."""
    tables, questions = [], []
    with open(data_dir / "BFCL_v4_multiple.json") as f:
        for line in f:
            entry = json.loads(line)
            tables.append(bfcl_tools(entry["function"]))
            questions.append(next((m["content"] for m in entry["question"][0] if m["role"] == "user"), "Call a tool."))
            if len(tables) == n:
                break
    return tables, questions


WORDS = ["alpha", "bravo", "city", "delta", "echo", "file", "golf", "hotel", "index", "json", "kilo", "lima"]


def synthetic_tools(n: int = 128, seed: int = 128) -> list[Tool]:
    """`n` tools with mixed argument types: strings, bounded integers, numbers, booleans, enums,
    arrays and nested objects with optional fields. Names share prefixes in groups."""
    rng = random.Random(seed)
    tools = []
    for i in range(n):
        props, req = {}, []
        for j in range(rng.randint(1, 5)):
            key = f"{rng.choice(WORDS)}_{j}"
            kind = rng.choice(["string", "string", "int", "number", "bool", "enum", "array", "object"])
            if kind == "string":
                s = dict(STR)
            elif kind == "int":
                lo = rng.randint(-100, 100)
                s = {"type": "integer", "minimum": lo, "maximum": lo + rng.choice([9, 99, 9999])}
            elif kind == "number":
                s = {"type": "number"}
            elif kind == "bool":
                s = {"type": "boolean"}
            elif kind == "enum":
                s = {"type": "string", "enum": rng.sample(WORDS, 4)}
            elif kind == "array":
                s = {"type": "array", "items": dict(STR), "maxItems": 4}
            else:
                s = {"type": "object", "properties": {"x": {"type": "integer"}, "note": dict(STR)}, "required": ["x"]}
            props[key] = s
            if rng.random() < 0.7:
                req.append(key)
        tools.append(Tool(f"{rng.choice(['get', 'set', 'list', 'find'])}_{rng.choice(WORDS)}_{i:03d}", "",
                          {"type": "object", "properties": props, "required": req}))
    return tools


@dataclass
class Workload:
    name: str
    tables: list  # list[list[Tool]]
    requests: list  # per table: the user request used to sample calls from the model


def workloads(data_dir: Path, quick: bool) -> list[Workload]:
    tables, questions = bfcl_tables(3 if quick else 20, data_dir)
    return [
        Workload("seed3", [seed_tools()], ["What is 12 times 7? Use a tool."]),
        Workload("bfcl20", tables, questions),
        Workload("tools128", [synthetic_tools(128)], ["Find the alpha records for the city of Lima."]),
    ]


def peer_schema(tools: list[Tool], max_string: int | None = 256) -> dict:
    """The JSON schema whose compact serialisation (separators "," and ":", declared property
    order, no other keys) is exactly the language railcall's tool grammar accepts: railcall's
    string rules are made explicit (`maxLength` of `max_string` where the schema gives none,
    `minLength >= 1` for required strings). `max_string=None` leaves free strings unbounded (for regex-based engines
    whose automaton would otherwise explode)."""

    def fix(s, required):
        if not isinstance(s, dict):
            return s
        s = dict(s)
        if "anyOf" in s:
            s["anyOf"] = [fix(b, required) for b in s["anyOf"]]
            return s
        t = s.get("type")
        if t == "string" and "enum" not in s and "const" not in s:
            if max_string is not None and "maxLength" not in s:
                s["maxLength"] = max(max_string, s.get("minLength", 0))
            if required and s.get("maxLength", 1) >= 1:
                s["minLength"] = max(s.get("minLength", 0), 1)
        elif t == "object":
            req = s.get("required", [])
            s["properties"] = {k: fix(p, k in req) for k, p in s.get("properties", {}).items()}
            s["additionalProperties"] = False
        elif t == "array":
            s["items"] = fix(s.get("items", {}), False)
        return s

    return {
        "anyOf": [
            {"type": "object", "properties": {"tool": {"const": t.name}, "args": fix(t.parameters, True)},
             "required": ["tool", "args"], "additionalProperties": False}
            for t in tools
        ]
    }


SAMPLE_STRINGS = ["notes/todo.txt", "2 + 2 * 3", "hello world", "Paris", "naïve café", "line one\nline two",
                  'say "hi"', "path/to/a file.md", "中文", "🎉 party", "x"]


def sample_value(schema: dict, rng: random.Random, required: bool = True):
    """A random value that satisfies `schema` (the subset the workloads use)."""
    if "enum" in schema:
        return rng.choice(schema["enum"])
    if "const" in schema:
        return schema["const"]
    if "anyOf" in schema:
        return sample_value(rng.choice(schema["anyOf"]), rng, required)
    t = schema.get("type", "string")
    if isinstance(t, list):
        t = rng.choice(t)
    if t == "string":
        s = rng.choice(SAMPLE_STRINGS)
        hi = schema.get("maxLength")
        return s[:hi] if hi else s
    if t == "integer":
        lo, hi = schema.get("minimum", -1000), schema.get("maximum", 100000)
        return rng.randint(int(lo), int(hi))
    if t == "number":
        return round(rng.uniform(-100, 1000), rng.randint(0, 3))
    if t == "boolean":
        return rng.random() < 0.5
    if t == "null":
        return None
    if t == "array":
        lo, hi = schema.get("minItems", 0), schema.get("maxItems", 3)
        return [sample_value(schema.get("items", {}), rng, False) for _ in range(rng.randint(lo, max(lo, min(hi, 3))))]
    if t == "object":
        req = schema.get("required", [])
        out = {}
        for k, p in schema.get("properties", {}).items():
            if k in req or rng.random() < 0.5:
                out[k] = sample_value(p, rng, k in req)
        return out
    return None


def call_text(tool: Tool, args) -> str:
    return json.dumps({"tool": tool.name, "args": args}, separators=(",", ":"), ensure_ascii=False)


def valid_calls(tools: list[Tool], n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [call_text(t, sample_value(t.parameters, rng)) for t in (rng.choice(tools) for _ in range(n))]
