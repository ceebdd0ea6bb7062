"""Real-world schema corpora, railcall and llguidance side by side: compile, then random walks.

A corpus is a folder of JSON schemas from a pinned PyPI wheel (railcall.data.CORPORA):
CloudFormation resource providers (cfn-lint), Kubernetes objects (kubernetes-validate), and
SchemaStore's CI and config schemas (check-jsonschema). For each schema and each engine:

- **compile**: the schema to the first mask, timed (railcall builds its automaton lazily and
  llguidance its lexer, so the first mask is where either has paid what a request pays before
  its first token). A clean error is "not compiled"; any other exception is a crash.
- **walks**: from the start, a random legal token at each step (the structural bytes `"`, `}`,
  `]`, `,` and the end token weighted up, so values close instead of growing), until the engine
  is done or the step budget runs out. An empty mask before the grammar can end is a *dead end*;
  a finished output is parsed with `json.loads` and validated by `jsonschema` (the schema's own
  draft, formats asserted): one that fails is an *invalid output*. A walk past its budget is
  *unfinished* (neither: railcall could close it with `Matcher.finish()`, llguidance cannot, so
  neither does).

Both engines see the same schemas through the same 256-byte vocabulary (coverage.py). railcall
runs in its default mode (`SchemaOptions()`, what a tool's parameters get) unless `standard`.

Kubernetes' schemas refer to their release's `_definitions.json` by an absolute path; each is
given the definitions it reaches (transitively) under its own `$defs`, its references rewritten
to point there, so that neither engine nor `jsonschema` needs a resolver.

Lifecycle: one run builds each checker once (its vocabulary); compiled grammars live for one schema.
"""

from __future__ import annotations

import json
import random
import re
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from railcall.bench.coverage import LLGuidanceChecker, RailcallChecker, _PeerCompileError

# an object's reference into `_definitions.json`, and the definitions' references among themselves
_K8S_REF = re.compile(r"^(?:/api/_definitions\.json)?#/\$defs/(.+)$")
# bytes that close or separate: weighted up so a walk's strings and containers end (a uniform
# pick over 200-odd legal string bytes would make every string hundreds of bytes long)
_CLOSERS = frozenset(b'"}],')
EOS = 256  # the byte vocabulary's end token


# -- the corpora -----------------------------------------------------------------------------------


def load(name: str, folder: Path | None = None, limit: int | None = None, seed: int = 0) -> list[tuple[str, object]]:
    """[(file name, schema)] of corpus `name`, sorted by name; `limit` takes a random sample
    of that many (the same for a given seed)."""
    from railcall.data import corpus_folder

    folder = folder or corpus_folder(name)
    paths = sorted(p for p in folder.glob("*.json"))
    if name == "kubernetes":
        defs = json.loads((folder / "_definitions.json").read_text())["$defs"]
        # all.json is the union of every object (an anyOf of 800-odd references), not an object's schema
        paths = [p for p in paths if p.name not in ("_definitions.json", "all.json")]
    if limit is not None and limit < len(paths):
        paths = sorted(random.Random(seed).sample(paths, limit))
    out = []
    for p in paths:
        schema = json.loads(p.read_text())
        if name == "kubernetes":
            schema = _with_local_defs(schema, defs)
        out.append((p.name, schema))
    return out


def _with_local_defs(schema: dict, defs: dict) -> dict:
    """`schema` with the Kubernetes definitions it reaches under `$defs`, its references local."""
    seen: set[str] = set()
    todo = []

    def rewrite(node):
        if isinstance(node, dict):
            out = {}
            for k, v in node.items():
                m = _K8S_REF.match(v) if k == "$ref" and isinstance(v, str) else None
                if m:
                    out[k] = f"#/$defs/{m.group(1)}"
                    if m.group(1) not in seen:
                        seen.add(m.group(1))
                        todo.append(m.group(1))
                else:
                    out[k] = rewrite(v)
            return out
        if isinstance(node, list):
            return [rewrite(v) for v in node]
        return node

    root = rewrite(schema)
    local = {}
    while todo:
        name = todo.pop()
        local[name] = rewrite(defs[name])
    if local:
        root["$defs"] = {**root.get("$defs", {}), **local}
    return root


# -- one engine on one schema ----------------------------------------------------------------------


@dataclass
class Result:
    """One engine on one schema."""

    compiled: bool = False
    crash: str = ""
    error: str = ""
    compile_ms: float = 0.0
    walks: int = 0
    finished: int = 0
    dead_ends: int = 0
    invalid: int = 0
    unchecked: int = 0  # finished outputs jsonschema raised on (a pattern Python's re cannot compile)
    examples: list = field(default_factory=list)  # a few failing walks: (kind, output text)


class _RailcallWalker(RailcallChecker):
    def __init__(self, standard: bool = False, lenient: bool = False):
        super().__init__()
        self.options = dict(standard=standard, lenient=lenient)

    def compile(self, schema):
        from railcall.grammar.schema import SchemaOptions, schema_grammar
        from railcall.matcher import CompiledGrammar, Matcher

        g = CompiledGrammar(schema_grammar(schema, SchemaOptions(**self.options)), self.vocab)
        Matcher(g).legal_token_ids()  # the first mask
        return g

    def start(self, compiled):
        from railcall.matcher import Matcher

        return Matcher(compiled)

    @staticmethod
    def legal(m) -> list[int]:
        return m.legal_token_ids().tolist()

    @staticmethod
    def consume(m, t: int) -> bool:
        return m.consume_token(t)

    @staticmethod
    def done(m) -> bool:
        return m.is_done()


class _LLGuidanceWalker(LLGuidanceChecker):
    def __init__(self, lenient: bool = False):
        super().__init__()
        self.lenient = lenient

    def compile(self, schema):
        grammar = self.ll.LLMatcher.grammar_from_json_schema(
            schema, defaults={"whitespace_flexible": False, "item_separator": ",", "key_separator": ":",
                              "lenient": self.lenient})
        m = self.ll.LLMatcher(self.tok, grammar)
        if m.is_error():
            raise _PeerCompileError(m.get_error())
        m.compute_bitmask()  # the first mask
        return m

    def start(self, compiled):
        return compiled.deep_copy()

    @staticmethod
    def legal(m) -> list[int]:
        import numpy as np

        bits = np.unpackbits(np.frombuffer(m.compute_bitmask(), dtype=np.uint8), bitorder="little")
        return np.flatnonzero(bits[:EOS + 1]).tolist()

    @staticmethod
    def consume(m, t: int) -> bool:
        return bool(m.consume_token(t)) and not m.is_error()

    @staticmethod
    def done(m) -> bool:
        return m.is_stopped()


def walk(engine, compiled, rng: random.Random, max_steps: int) -> tuple[str, bytes]:
    """One random walk: ("done", output) | ("dead end", prefix) | ("unfinished", prefix)."""
    m = engine.start(compiled)
    out = bytearray()
    for _ in range(max_steps):
        if engine.done(m):
            return "done", bytes(out)
        legal = engine.legal(m)
        if not legal:
            return "dead end", bytes(out)
        weights = [40 if t == EOS or t in _CLOSERS else 1 for t in legal]
        t = rng.choices(legal, weights)[0]
        if not engine.consume(m, t):
            return "dead end", bytes(out) + (b"" if t == EOS else bytes([t]))  # a legal token refused
        if t == EOS:
            return "done", bytes(out)
        out.append(t)
    return ("done", bytes(out)) if engine.done(m) else ("unfinished", bytes(out))


def _validator(schema):
    import jsonschema

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def check(engine, schema, walks: int, max_steps: int, seed: int, validator=None) -> Result:
    r = Result()
    clean = engine.clean_errors()
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compiled = engine.compile(schema)
    except clean as e:
        r.error = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        return r
    except Exception as e:  # a crash, not a clean error
        r.crash = f"{type(e).__name__}: {e}"[:200]
        return r
    r.compile_ms = (time.perf_counter() - t0) * 1000
    r.compiled = True
    rng = random.Random(seed)
    for _ in range(walks):
        r.walks += 1
        try:
            kind, text = walk(engine, compiled, rng, max_steps)
        except Exception as e:
            r.crash = f"walk: {type(e).__name__}: {e}"[:200]
            break
        if kind == "dead end":
            r.dead_ends += 1
            r.examples.append(("dead end", text.decode("utf-8", "replace")[:200]))
        elif kind == "done":
            r.finished += 1
            try:
                value = json.loads(text.decode("utf-8"))
            except ValueError as e:
                value, why = None, f"not JSON: {e}"
            else:
                try:
                    errors = list((validator or _validator(schema)).iter_errors(value))
                except Exception:  # jsonschema cannot check it (Python's re has no \p{...}): not counted
                    r.unchecked += 1
                    continue
                why = errors[0].message[:120] if errors else ""
            if why:
                r.invalid += 1
                r.examples.append((f"invalid ({why})", text.decode("utf-8", "replace")[:200]))
    return r


# -- a corpus, both engines ------------------------------------------------------------------------


def engines(peers: bool = True, standard: bool = False, lenient: bool = False) -> list:
    """railcall (default mode, or `standard`) and llguidance; `lenient`: both ignore the
    assertion keywords they cannot enforce (their walks may then fail validation)."""
    out = [_RailcallWalker(standard, lenient)]
    if peers:
        out.append(_LLGuidanceWalker(lenient))
    return out


def run(schemas: list[tuple[str, object]], engine_list: list, walks: int = 10, max_steps: int = 400,
        seed: int = 0, progress=None) -> dict[str, dict[str, Result]]:
    """{engine name: {schema name: Result}}."""
    out: dict[str, dict[str, Result]] = {e.name: {} for e in engine_list}
    for i, (name, schema) in enumerate(schemas):
        try:
            validator = _validator(schema)
        except Exception:  # a schema jsonschema itself cannot read: validated per walk, failing there
            validator = None
        for e in engine_list:
            out[e.name][name] = check(e, schema, walks, max_steps, seed + i, validator)
        if progress:
            progress(i + 1, len(schemas), name)
    return out


@dataclass
class Summary:
    schemas: int
    compiled: int
    crashes: int
    p50_ms: float
    p95_ms: float
    walks: int
    finished: int
    dead_ends: int
    invalid: int
    unchecked: int


def _quantile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def summary(per: dict[str, Result]) -> Summary:
    rs = list(per.values())
    times = [r.compile_ms for r in rs if r.compiled]
    return Summary(len(rs), sum(r.compiled for r in rs), sum(bool(r.crash) for r in rs), _quantile(times, 0.5),
                   _quantile(times, 0.95), sum(r.walks for r in rs), sum(r.finished for r in rs),
                   sum(r.dead_ends for r in rs), sum(r.invalid for r in rs), sum(r.unchecked for r in rs))


def markdown(corpus: str, results: dict[str, dict[str, Result]], command: str, seconds: float) -> str:
    import platform

    from railcall.bench.coverage import _version
    from railcall.data import CORPORA

    c = CORPORA[corpus]
    engs = list(results)
    versions = [f"railcall {_version('railcall')}"] + [f"{e} {_version(e)}" for e in engs if e != "railcall"]
    lines = [
        f"# JSON Schema coverage: the {corpus} corpus",
        "",
        f"Reproduce with `{command}` ({', '.join(versions)}, jsonschema {_version('jsonschema')}; "
        f"Python {platform.python_version()}; {seconds:.0f} s).",
        "",
        f"Data: the `*.json` files of `{c.prefix}` in the {c.dist} {c.version} wheel (`railcall data fetch`).",
        "Compile time is from the schema to the first mask over a 256-byte vocabulary; each compiled",
        "schema gets the same number of random walks per engine, each finished output validated by",
        "`jsonschema` (the schema's draft, formats asserted). See `railcall/bench/corpus.py`.",
        "",
        "| engine | schemas compiled | crashes | compile p50 | compile p95 | walks | finished | dead ends | invalid outputs |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for e in engs:
        s = summary(results[e])
        lines.append(f"| {e} | {s.compiled}/{s.schemas} ({100 * s.compiled / max(1, s.schemas):.0f}%) | {s.crashes} | "
                     f"{s.p50_ms:.1f} ms | {s.p95_ms:.1f} ms | {s.walks} | {s.finished} | {s.dead_ends} | {s.invalid} |")
    unchecked = {e: summary(results[e]).unchecked for e in engs}
    if any(unchecked.values()):
        lines += ["", "Finished outputs `jsonschema` could not check (it raised, e.g. on a `\\p{...}` pattern "
                  "Python's `re` cannot compile), counted neither valid nor invalid: " +
                  ", ".join(f"{e} {n}" for e, n in unchecked.items()) + "."]
    names = list(next(iter(results.values())))
    both = [n for n in names if all(results[e][n].compiled for e in engs)]
    if len(engs) > 1 and both:
        lines += ["", f"On the {len(both)} schemas every engine compiled, compile p50 / p95: " + ", ".join(
            f"{e} {_quantile([results[e][n].compile_ms for n in both], 0.5):.1f} / "
            f"{_quantile([results[e][n].compile_ms for n in both], 0.95):.1f} ms" for e in engs) + "."]
    for e in engs:
        errs: dict[str, int] = {}
        for r in results[e].values():
            if not r.compiled:
                key = _error_kind(r.crash or r.error)
                errs[key] = errs.get(key, 0) + 1
        if errs:
            lines += ["", f"## {e}: why schemas were not compiled", "", "| schemas | error |", "|---|---|"]
            for k, n in sorted(errs.items(), key=lambda kv: -kv[1])[:15]:
                lines.append(f"| {n} | {_cell(k)} |")
        bad = [(n, r) for n, r in results[e].items() if r.examples]
        if bad:
            lines += ["", f"## {e}: walks that failed", ""]
            for n, r in bad[:10]:
                kind, text = r.examples[0]
                lines.append(f"- `{n}`: {_cell(kind)}: `{_cell(text[:120])}`")
    lines.append("")
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("`", "'").replace("\n", " ")


def _error_kind(msg: str) -> str:
    """An error message without the parts that differ per schema (pointers, property names,
    numbers); keyword names stay."""
    msg = re.sub(r" at /[^ ,:]*", "", msg)
    msg = re.sub(r"(property|required|key) '[^']*'", r"\1 '…'", msg)
    msg = re.sub(r"(offset|than|at most|at least) \d+", r"\1 N", msg)
    return msg.replace("; pass lenient=True to ignore it", "")[:140]
