"""JSON Schema coverage on the official JSON-Schema-Test-Suite, railcall and llguidance side by side.

For each schema of each keyword file: compile it (a clean error counts as "not compiled"; any
other exception is a crash and is reported as one). For each test instance, serialised compactly
in its own key order: a valid instance must be accepted (the matcher consumes its bytes and is
accepting) and an invalid one rejected. An instance of a schema that did not compile counts as
not passed. Both engines see the same bytes through the same 256-token byte vocabulary, so
tokenisation plays no part.

railcall runs with `SchemaOptions(standard=True)` (JSON Schema's own semantics: undeclared
properties allowed unless forbidden, untyped schemas admit every type); llguidance with its
defaults plus compact separators. Files: every <draft>/*.json (draft2020-12 unless `draft` says
otherwise), plus the optional format files for the formats railcall enforces.

Drafts: the suite's schemas for older drafts rarely say which draft they are written in (their
folder says it), so each schema without a `$schema` is given its draft's URI before either
engine sees it: both then apply that draft's rules where they know them.

`railcall coverage` prints the per-keyword table and writes it (with totals, the command and the
versions) to docs/schema-coverage.md.
"""

from __future__ import annotations

import json
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

# The `$schema` URI of each draft, by the names `--draft` takes (see railcall.data.DRAFTS).
DRAFT_URIS = {"3": "http://json-schema.org/draft-03/schema#", "4": "http://json-schema.org/draft-04/schema#",
              "6": "http://json-schema.org/draft-06/schema#", "7": "http://json-schema.org/draft-07/schema#",
              "2019-09": "https://json-schema.org/draft/2019-09/schema",
              "2020-12": "https://json-schema.org/draft/2020-12/schema",
              "next": "https://json-schema.org/draft/next/schema"}
FORMAT_FILES = ("date", "time", "date-time", "email", "uuid", "uri", "ipv4", "ipv6", "hostname")


@dataclass
class Tally:
    schemas: int = 0
    compiled: int = 0
    crashes: int = 0
    valid: int = 0
    valid_ok: int = 0  # valid instances accepted
    invalid: int = 0
    invalid_ok: int = 0  # invalid instances rejected
    seconds: float = 0.0
    errors: list = field(default_factory=list)

    @property
    def passed(self) -> int:
        return self.valid_ok + self.invalid_ok

    @property
    def tests(self) -> int:
        return self.valid + self.invalid

    def add(self, other: "Tally") -> None:
        for k in ("schemas", "compiled", "crashes", "valid", "valid_ok", "invalid", "invalid_ok", "seconds"):
            setattr(self, k, getattr(self, k) + getattr(other, k))


def byte_tokenizer_json() -> str:
    """A tokenizer.json whose vocabulary is the 256 bytes plus an end token (no merges)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from railcall.vocab import gpt2_unicode_to_byte

    to_byte = gpt2_unicode_to_byte()
    vocab = {ch: b for ch, b in to_byte.items()}
    vocab["<eos>"] = 256
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<eos>"])
    return tok.to_str()


class RailcallChecker:
    name = "railcall"

    def __init__(self):
        from railcall.vocab import Vocabulary

        self.vocab = Vocabulary.from_pieces([bytes([b]) for b in range(256)], specials=["<eos>"], stop=["<eos>"],
                                            name="bytes256")

    def compile(self, schema):
        from railcall.grammar.schema import SchemaOptions, schema_grammar
        from railcall.matcher import CompiledGrammar

        return CompiledGrammar(schema_grammar(schema, SchemaOptions(standard=True)), self.vocab)

    @staticmethod
    def clean_errors():
        from railcall.errors import RailcallError

        return (RailcallError,)

    def accepts(self, compiled, data: bytes) -> bool:
        from railcall.matcher import Matcher

        m = Matcher(compiled)
        return m.consume_bytes(data) and m.is_accepting()


class LLGuidanceChecker:
    name = "llguidance"

    def __init__(self):
        import llguidance

        self.ll = llguidance
        self.tok = llguidance.LLTokenizer(byte_tokenizer_json(), n_vocab=257, eos_token=256)

    def compile(self, schema):
        grammar = self.ll.LLMatcher.grammar_from_json_schema(
            schema, defaults={"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"})
        m = self.ll.LLMatcher(self.tok, grammar)
        if m.is_error():
            raise _PeerCompileError(m.get_error())
        return m

    @staticmethod
    def clean_errors():
        return (_PeerCompileError, ValueError, TypeError)

    def accepts(self, compiled, data: bytes) -> bool:
        m = compiled.deep_copy()
        toks = list(data)  # token id = byte value in this vocabulary
        return bool(m.consume_tokens(toks)) and not m.is_error() and m.is_accepting()


class _PeerCompileError(Exception):
    pass


def suite_files(data: Path, draft: str = "2020-12") -> list[tuple[str, Path]]:
    from railcall.data import DRAFTS

    base = data / DRAFTS[draft]
    files = [(p.stem, p) for p in sorted(base.glob("*.json"))]
    files += [(f"format:{name}", base / "optional" / "format" / f"{name}.json") for name in FORMAT_FILES
              if (base / "optional" / "format" / f"{name}.json").exists()]
    return files


def with_draft(schema, draft: str):
    """`schema` with its draft's `$schema` where it names none (a boolean schema stays as it is)."""
    if isinstance(schema, dict) and "$schema" not in schema:
        return {"$schema": DRAFT_URIS[draft], **schema}
    return schema


def run_file(checker, path: Path, draft: str = "2020-12") -> Tally:
    tally = Tally()
    cases = json.loads(path.read_text())
    clean = checker.clean_errors()
    t0 = time.perf_counter()
    for case in cases:
        tally.schemas += 1
        tests = case["tests"]
        for t in tests:
            if t["valid"]:
                tally.valid += 1
            else:
                tally.invalid += 1
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                compiled = checker.compile(with_draft(case["schema"], draft))
        except clean as e:
            tally.errors.append(f"{case['description']}: {e}")
            continue
        except Exception as e:  # a crash, not a clean error: reported as such
            tally.crashes += 1
            tally.errors.append(f"CRASH {case['description']}: {type(e).__name__}: {e}")
            continue
        tally.compiled += 1
        for t in tests:
            data = json.dumps(t["data"], separators=(",", ":"), ensure_ascii=False).encode("utf-8")
            try:
                ok = checker.accepts(compiled, data)
            except Exception as e:
                tally.crashes += 1
                tally.errors.append(f"CRASH {case['description']} / {t['description']}: {type(e).__name__}: {e}")
                continue
            if t["valid"] and ok:
                tally.valid_ok += 1
            elif not t["valid"] and not ok:
                tally.invalid_ok += 1
    tally.seconds = time.perf_counter() - t0
    return tally


def run(data: Path, peers: bool = True, progress=None, draft: str = "2020-12") -> dict[str, dict[str, Tally]]:
    """{engine: {keyword file: Tally}} over one draft of the suite."""
    checkers = [RailcallChecker()]
    if peers:
        checkers.append(LLGuidanceChecker())
    out: dict[str, dict[str, Tally]] = {}
    files = suite_files(data, draft)
    for c in checkers:
        out[c.name] = {}
        for name, path in files:
            out[c.name][name] = run_file(c, path, draft)
            if progress:
                progress(c.name, name)
    return out


def totals(results: dict[str, dict[str, Tally]]) -> dict[str, Tally]:
    tot = {}
    for eng, per in results.items():
        t = Tally()
        for x in per.values():
            t.add(x)
        tot[eng] = t
    return tot


def markdown(results: dict[str, dict[str, Tally]], command: str, draft: str = "2020-12") -> str:
    import platform

    engines = list(results)
    versions = [f"railcall {_version('railcall')}"] + [f"{e} {_version(e)}" for e in engines if e != "railcall"]
    lines = [
        f"# JSON Schema coverage: the official test suite, draft {draft}",
        "",
        f"Reproduce with `{command}` ({', '.join(versions)}; Python {platform.python_version()}).",
        "",
        f"Data: JSON-Schema-Test-Suite as shipped in the jsonschema {_version('jsonschema')} source distribution",
        f"(draft {draft} and the optional format files for the formats railcall enforces; a schema without `$schema`",
        "is given its draft's). Each instance is serialised compactly in its own key order and fed byte by",
        "byte; *passed* = valid instances accepted + invalid instances rejected; instances of a schema that did",
        "not compile count as not passed. railcall runs with `SchemaOptions(standard=True)`; llguidance with",
        "compact separators. Schemas that don't compile are clean errors naming the keyword and JSON pointer.",
        "",
        "| keyword | tests | " + " | ".join(f"{e} compiled | {e} passed | {e} valid accepted | {e} invalid rejected" for e in engines) + " |",
        "|---|---|" + "---|---|---|---|" * len(engines),
    ]
    names = list(next(iter(results.values())))
    for name in names:
        row = [name, str(results[engines[0]][name].tests)]
        for e in engines:
            t = results[e][name]
            row += [f"{t.compiled}/{t.schemas}", f"{t.passed}/{t.tests}", f"{t.valid_ok}/{t.valid}",
                    f"{t.invalid_ok}/{t.invalid}"]
        lines.append("| " + " | ".join(row) + " |")
    tot = totals(results)
    row = ["**total**", str(tot[engines[0]].tests)]
    for e in engines:
        t = tot[e]
        row += [f"**{t.compiled}/{t.schemas}**", f"**{t.passed}/{t.tests}**", f"{t.valid_ok}/{t.valid}",
                f"{t.invalid_ok}/{t.invalid}"]
    lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    crashes = {e: tot[e].crashes for e in engines}
    lines.append("Crashes (exceptions other than a clean compile error): " +
                 ", ".join(f"{e} {n}" for e, n in crashes.items()) + ".")
    lines.append("")
    return "\n".join(lines)


def _version(pkg: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(pkg)
    except PackageNotFoundError:
        return "?"
