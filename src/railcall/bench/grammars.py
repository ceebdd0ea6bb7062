"""General grammars (GBNF, Lark, regex): railcall beside llguidance and XGrammar, and their masks
compared token for token.

The corpus: llama.cpp's own `grammars/*.gbnf` (from the llama-cpp-python sdist, fetched from
PyPI once and kept in the build folder), a SQL subset, a shell pipeline and an arithmetic
grammar in Lark, and a set of regexes (dates, emails, IPv4, semver, phone numbers).

Per grammar and engine, in one process, engines interleaved grammar by grammar:
- *TTFM*: compile plus the first mask, the first time the engine sees that grammar;
- *mask* p50/p99/max and *consume* p50 over the same token paths: random walks written under
  railcall's grammar, each step chosen among the tokens that railcall and llguidance both allow
  (so llguidance replays every path); a token another peer refuses ends its path and counts;
- *differential*: at every step of those walks railcall's mask is compared with llguidance's.
  A step where they differ is classified: tokens only railcall allows are checked by completing
  the text under railcall and parsing it with a parser railcall does not share (Python's `re`
  for regexes, the `lark` package for Lark, llama.cpp's own grammar engine for GBNF);
  tokens only llguidance allows are counted and shown.
"""

from __future__ import annotations

import gc
import json
import os
import random
import re
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from railcall.bench import engines

LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"

CALC_LARK = r"""
start: expr
expr: term (("+" | "-") term)*
term: factor (("*" | "/") factor)*
factor: NUMBER | "(" expr ")" | "-" factor
%import common.NUMBER
%import common.WS
%ignore WS
"""

SQL_LARK = r"""
start: select
select: "SELECT"i columns "FROM"i NAME [where] [";"]
columns: "*" | NAME ("," NAME)*
where: "WHERE"i cond (("AND"i | "OR"i) cond)*
cond: NAME OP value
OP: "=" | "<" | ">" | "<=" | ">=" | "!="
value: NUMBER | ESCAPED_STRING
NAME: /[a-z_][a-z0-9_]*/
%import common.NUMBER
%import common.ESCAPED_STRING
%import common.WS
%ignore WS
"""

SHELL_LARK = r"""
start: command ("|" command)*
command: PROG (ARG)* (REDIRECT FILE)?
PROG: "ls" | "grep" | "wc" | "sort" | "head"
ARG: /-[a-z]/ | /[A-Za-z0-9_.\/]+/ | /'[^']*'/
REDIRECT: ">" | ">>"
FILE: /[a-z0-9_.]+/
%ignore " "
"""

LARK = {"calc": CALC_LARK, "sql": SQL_LARK, "shell": SHELL_LARK}

# ASCII classes throughout: `\d` is ASCII in railcall's dialect (ECMA-262, as JSON Schema reads
# it) and every Unicode digit in llguidance's (Rust's regex crate), so a pattern with it would
# measure that difference, not the engines.
REGEXES = {
    "date": r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])",
    "email": r"[a-z0-9._%+-]{1,20}@[a-z0-9-]{1,12}\.(com|org|net)",
    "ipv4": r"((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])",
    "semver": r"(0|[1-9][0-9]{0,3})\.(0|[1-9][0-9]{0,3})\.(0|[1-9][0-9]{0,3})(-[a-z]{1,8}(\.[0-9]{1,3})?)?",
    "phone": r"\+?1? ?\(?[0-9]{3}\)?[ -]?[0-9]{3}-[0-9]{4}",
}


# A structural tag (vLLM's response_format shape; railcall.grammar.turn): free text with tagged
# parts, railcall beside XGrammar's structural tags (llguidance has no such input).
TAG = {"structures": [
    {"begin": "<function=get_weather>", "end": "</function>", "schema": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["c", "f"]}},
        "required": ["city"], "additionalProperties": False}},
    {"begin": "<function=get_time>", "end": "</function>", "schema": {
        "type": "object", "properties": {"zone": {"enum": ["UTC", "CET", "PST"]}}, "required": ["zone"],
        "additionalProperties": False}},
    {"begin": "<note>", "end": "</note>", "schema": {"type": "string", "maxLength": 40}}],
    "triggers": ["<function=", "<note>"]}


@dataclass
class Grammar:
    name: str
    syntax: str  # "gbnf" | "lark" | "regex" | "tag" (a structural tag as JSON)
    text: str


def llama_grammars(folder: Path, log=print) -> list[Grammar]:
    """llama.cpp's grammars/*.gbnf, from the llama-cpp-python sdist (downloaded from PyPI into
    `folder` once; the Makefile's llama-server target unpacks the same sdist there)."""
    found = sorted(folder.glob("llama_cpp_python-*/vendor/llama.cpp/grammars/*.gbnf"))
    if not found:
        folder.mkdir(parents=True, exist_ok=True)
        sdists = sorted(folder.glob("llama_cpp_python-*.tar.gz"))
        if not sdists:
            log(f"fetching the {LLAMA_CPP_PYTHON} sdist from PyPI for llama.cpp's grammars/*.gbnf")
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                            LLAMA_CPP_PYTHON, "-d", str(folder)], check=True)
            sdists = sorted(folder.glob("llama_cpp_python-*.tar.gz"))
        with tarfile.open(sdists[-1]) as tar:
            members = [m for m in tar.getmembers() if re.search(r"/vendor/llama\.cpp/grammars/[^/]+\.gbnf$", m.name)]
            tar.extractall(folder, members=members, filter="data")
        found = sorted(folder.glob("llama_cpp_python-*/vendor/llama.cpp/grammars/*.gbnf"))
    return [Grammar(p.stem, "gbnf", p.read_text()) for p in found]


def corpus(folder: Path, log=print) -> list[Grammar]:
    return (llama_grammars(folder, log) + [Grammar(k, "lark", v) for k, v in LARK.items()]
            + [Grammar(k, "regex", v) for k, v in REGEXES.items()] + [Grammar("tools+note", "tag", json.dumps(TAG))])


# -- engines ------------------------------------------------------------------------------------


class _Railcall(engines.Railcall):
    def __init__(self, vocab, tokenizer_json, stops):
        from railcall.grammar.cfg import regex_grammar
        from railcall.grammar.gbnf import gbnf_grammar
        from railcall.grammar.lark import lark_grammar

        self.setup(vocab, tokenizer_json, stops)
        self.front = {"gbnf": gbnf_grammar, "lark": lark_grammar, "regex": regex_grammar}

    def compile(self, g: Grammar):
        if g.syntax == "tag":
            from railcall.grammar.turn import Turn, structural_tag_json
            from railcall.matcher.turn import compiled_turn

            return compiled_turn(Turn(structural_tag_json(json.loads(g.text))), self.vocab)
        return self._compiled(self.front[g.syntax](g.text), self.vocab)

    def matcher(self, compiled):
        from railcall.matcher.turn import CompiledTurn, TurnMatcher

        return TurnMatcher(compiled) if isinstance(compiled, CompiledTurn) else self._Matcher(compiled)

    def cold(self):
        """The masks and states the walks cached dropped (the vocabulary's indexes stay, as a
        peer's tokenizer tables do)."""
        from railcall.matcher import clear_caches

        clear_caches(self.vocab)  # a compiled turn over the dropped store is compiled again too


class _LLGuidance(engines.LLGuidance):
    def __init__(self, vocab, tokenizer_json, stops):
        self.setup(vocab, tokenizer_json, stops)

    def compile(self, g: Grammar):
        if g.syntax == "tag":
            raise NotImplementedError("no structural-tag input")
        return self.ll.grammar_from(g.syntax, g.text)  # compiled by the matcher (each LLMatcher compiles)

    def cold(self):
        pass  # a matcher is built from the grammar's text: nothing carries over

    def consume(self, m, t):  # engines.LLGuidance's matcher() raises on a grammar it refuses
        return bool(m.consume_token(t)) and not m.is_error()


class _XGrammar(engines.XGrammar):
    def __init__(self, vocab, tokenizer_json, stops):
        self.setup(vocab, tokenizer_json, stops)

    def compile(self, g: Grammar):
        c = self.compiler
        if g.syntax == "tag":
            tag = json.loads(g.text)
            items = [self.xgr.StructuralTagItem(begin=st["begin"], schema=json.dumps(st["schema"]), end=st["end"])
                     for st in tag["structures"]]
            return c.compile_structural_tag(items, tag["triggers"])
        return {"gbnf": c.compile_grammar, "lark": c.compile_lark, "regex": c.compile_regex}[g.syntax](g.text)

    def cold(self):
        self.compiler.clear_cache()  # each grammar compiled afresh


ENGINES = {"railcall": _Railcall, "llguidance": _LLGuidance, "xgrammar": _XGrammar}


# -- walks and the differential check ---------------------------------------------------------


def _legal(bm: np.ndarray, width: int) -> np.ndarray:
    bits = np.unpackbits(bm.view(np.uint8), bitorder="little")[:width]
    return np.flatnonzero(bits)


@dataclass
class Differential:
    steps: int = 0
    same: int = 0
    ours_only_steps: int = 0  # railcall allows tokens llguidance refuses
    ours_only_checked: int = 0  # of those, one token per step completed and parsed independently
    ours_only_valid: int = 0
    theirs_only_steps: int = 0  # llguidance allows tokens railcall refuses
    examples: list = field(default_factory=list)


class _Oracle:
    """A parser railcall does not share, for a whole text of grammar `g`."""

    def __init__(self, g: Grammar):
        self.g = g
        self.parse = None
        if g.syntax == "regex":
            rx = re.compile(g.text)
            self.parse = lambda s: rx.fullmatch(s) is not None
        elif g.syntax == "lark":
            import lark

            p = lark.Lark(g.text, parser="earley", lexer="dynamic_complete")

            def parse(s):
                try:
                    p.parse(s)
                    return True
                except lark.exceptions.LarkError:
                    return False

            self.parse = parse
        else:  # llama.cpp's own GBNF engine, the format's reference (through llama-cpp-python)
            self.parse = _LlamaGBNF.get().checker(g.text)


class _LlamaGBNF:
    """llama.cpp's grammar sampler on the embedded model's vocabulary (loaded vocab-only): a text
    is accepted if each of its tokens keeps a finite logit under the grammar and the end token
    does at the end."""

    _one = None

    @classmethod
    def get(cls) -> "_LlamaGBNF":
        if cls._one is None:
            cls._one = cls()
        return cls._one

    def __init__(self):
        import llama_cpp as L

        from railcall.models.llama import _quiet_logs
        from railcall.models.store import embedded_gguf_path

        self.L = L
        _quiet_logs()  # and the backend initialised once, as railcall's own llama.cpp models do
        mp = L.llama_model_default_params()
        mp.vocab_only = True
        self.model = L.llama_model_load_from_file(str(embedded_gguf_path("smollm2")).encode(), mp)
        self.vocab = L.llama_model_get_vocab(self.model)
        self.eos = L.llama_vocab_eos(self.vocab)

    def tokens(self, text: str) -> list[int]:
        L, b = self.L, text.encode()
        buf = (L.llama_token * (len(b) + 8))()
        n = L.llama_tokenize(self.vocab, b, len(b), buf, len(buf), False, False)
        return list(buf[:n])

    def checker(self, gbnf: str):
        import ctypes

        L = self.L

        def parse(text: str) -> bool:
            smpl = L.llama_sampler_init_grammar(self.vocab, gbnf.encode(), b"root")
            if not smpl:
                return False
            try:
                def allowed(tok: int) -> bool:
                    data = (L.llama_token_data * 1)(L.llama_token_data(tok, 0.0, 0.0))
                    arr = L.llama_token_data_array(data, 1, -1, False)
                    L.llama_sampler_apply(smpl, ctypes.byref(arr))
                    return data[0].logit != float("-inf")

                for t in self.tokens(text):
                    if not allowed(t):
                        return False
                    L.llama_sampler_accept(smpl, t)
                return allowed(self.eos)
            finally:
                L.llama_sampler_free(smpl)

        return parse


def walks(g: Grammar, ours: _Railcall, peer: _LLGuidance | None, vocab, stops, n: int, max_steps: int,
          rng: random.Random, diff: Differential | None) -> list[list[int]]:
    """`n` token paths under railcall's grammar (each step among the tokens llguidance also
    allows, when it runs), compared mask for mask with llguidance's as they go."""
    width = vocab.logits_width
    words = (width + 31) // 32
    bm_ours, bm_peer = np.zeros(words, np.int32), np.zeros(words, np.int32)
    oracle = _Oracle(g) if diff is not None else None
    stop_set = set(stops)
    compiled = ours.compile(g)
    peer_c = peer.compile(g) if peer is not None else None
    # a structural tag's walks write a structure's begin now and then (free text alone would
    # almost never spell one), then go on at random under the mask
    begins = [vocab.encode(st["begin"]) or vocab.greedy_tokenize(st["begin"].encode())
              for st in json.loads(g.text)["structures"]] if g.syntax == "tag" else []
    paths = []
    for _ in range(n):
        m = ours.matcher(compiled)
        pm = peer.matcher(peer_c) if peer is not None else None
        path, text, plan = [], bytearray(), []
        for _ in range(max_steps):
            if begins and not plan and m.in_free_text() and rng.random() < 0.2:
                plan = list(rng.choice(begins))
            if plan:
                t = plan.pop(0)
                if not m.consume_token(t):
                    raise RuntimeError(f"{g.name}: a structure's begin was refused ({m.error_message})")
                path.append(t)
                text += vocab.token_bytes[t]
                continue
            ours.fill(m, bm_ours)
            a = _legal(bm_ours, width)
            if pm is not None:
                peer.fill(pm, bm_peer)
                b = _legal(bm_peer, width)
                a_set, b_set = set(a.tolist()), set(b.tolist())
                a_stop, b_stop = bool(a_set & stop_set), bool(b_set & stop_set)
                a_set -= stop_set
                b_set -= stop_set
                if diff is not None:
                    diff.steps += 1
                    if a_set == b_set and a_stop == b_stop:
                        diff.same += 1
                    else:
                        _classify(diff, oracle, m, vocab, bytes(text), a_set - b_set, b_set - a_set,
                                  a_stop and not b_stop, b_stop and not a_stop, rng)
                choices = sorted(a_set & b_set)
                can_stop = a_stop and b_stop
            else:
                choices = [t for t in a.tolist() if t not in stop_set]
                can_stop = len(choices) < len(a)
            if can_stop and (not choices or rng.random() < 0.15):
                path.append(stops[0])
                break
            if not choices:
                break
            t = rng.choice(choices)
            m.consume_token(t)
            if pm is not None:
                peer.consume(pm, t)
            path.append(t)
            text += vocab.token_bytes[t]
        paths.append(path)
    return paths


def _classify(diff: Differential, oracle: _Oracle, m, vocab, text: bytes, ours_only, theirs_only, ours_stop,
              theirs_stop, rng) -> None:
    if ours_only or ours_stop:
        diff.ours_only_steps += 1
        if ours_stop:  # railcall says the text may end here: is it a whole text?
            candidate = text
        else:
            t = rng.choice(sorted(ours_only))
            probe = m.copy()
            probe.consume_token(t)
            candidate = text + vocab.token_bytes[t] + b"".join(vocab.token_bytes[x] for x in probe.finish())
        try:
            ok = oracle.parse(candidate.decode("utf-8"))
        except UnicodeDecodeError:
            ok = False
        diff.ours_only_checked += 1
        diff.ours_only_valid += bool(ok)
        if not ok or len(diff.examples) < 3:
            shown = candidate if not ok else candidate[-60:]  # an invalid one whole: it is a finding
            diff.examples.append({"kind": "railcall only", "after": text[-30:].decode("utf-8", "replace"),
                                  "completed": shown.decode("utf-8", "replace"), "valid": bool(ok)})
    if theirs_only or theirs_stop:
        diff.theirs_only_steps += 1
        if len(diff.examples) < 6:
            shown = [vocab.token_bytes[t].decode("utf-8", "replace") for t in sorted(theirs_only)[:4]]
            diff.examples.append({"kind": "llguidance only", "after": text[-30:].decode("utf-8", "replace"),
                                  "tokens": shown + (["<stop>"] if theirs_stop else [])})


# -- timing ---------------------------------------------------------------------------------------


# The most seconds one engine's walks of one grammar take: an engine at hundreds of ms a mask
# (XGrammar on the shell grammar) is timed on the paths that fit, and says how many steps it ran.
BUDGET_S = 30.0


def time_engine(eng, g: Grammar, paths: list[list[int]], width: int) -> dict:
    words = (width + 31) // 32
    bm = np.zeros(words, np.int32)
    eng.cold()
    t0 = time.perf_counter()
    try:
        c = eng.compile(g)
        m = eng.matcher(c)
        eng.fill(m, bm)
    except Exception as e:  # a peer's refusal of a grammar is a result, not a crash
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"}
    ttfm = time.perf_counter() - t0
    masks, consumes, refused, steps = [], [], 0, 0
    deadline = time.perf_counter() + BUDGET_S
    for path in paths:
        if time.perf_counter() > deadline:
            break
        m = eng.matcher(c)
        for t in path:
            t0 = time.perf_counter()
            eng.fill(m, bm)
            t1 = time.perf_counter()
            masks.append(t1 - t0)
            steps += 1
            if not (bm[t >> 5] >> (t & 31)) & 1:
                refused += 1
                break
            t2 = time.perf_counter()
            ok = eng.consume(m, t)
            consumes.append(time.perf_counter() - t2)
            if not ok:
                refused += 1
                break
    pct = lambda xs, q: float(np.percentile(xs, q)) * 1e6 if xs else None  # noqa: E731
    return {"ttfm_ms": ttfm * 1e3, "mask_p50_us": pct(masks, 50), "mask_p99_us": pct(masks, 99),
            "mask_max_us": max(masks) * 1e6 if masks else None, "consume_p50_us": pct(consumes, 50),
            "steps": steps, "refused_paths": refused}


def run(out: Path, vocab_name: str = "smollm2", n_walks: int = 20, max_steps: int = 60,
        engines: list[str] | None = None, folder: Path = Path("build/llama.cpp"), log=print,
        only: list[str] | None = None) -> dict:
    from railcall.bench.cell import load_vocab

    t_start = time.time()
    load_before = os.getloadavg()[0]
    vocab, _tok, tok_json = load_vocab(vocab_name)
    stops = sorted(vocab.stop_ids)
    names = engines or list(ENGINES)
    live = {}
    for name in names:
        try:
            live[name] = ENGINES[name](vocab, tok_json, stops)
        except ImportError as e:
            log(f"{name}: not installed ({e}); left out")
    ours = live.get("railcall") or _Railcall(vocab, tok_json, stops)
    peer = live.get("llguidance")
    grammars = corpus(folder, log)
    if only:
        unknown = sorted(set(only) - {g.name for g in grammars})
        if unknown:
            raise ValueError(f"no grammar named {', '.join(unknown)} in the corpus; known: "
                             f"{', '.join(g.name for g in grammars)}")
        grammars = [g for g in grammars if g.name in only]
    rows, diffs = [], {}
    rng = random.Random(0)
    # Everything loaded so far (the vocabulary, each engine and what its import brought: XGrammar's
    # adds ~190k Python objects) is set aside from the garbage collector: else a full collection,
    # which any engine's allocations may trigger, walks it all (~100 ms here) inside whichever
    # mask happens to be timed then.
    gc.collect()
    gc.freeze()
    try:
        for g in grammars:
            diff = Differential() if peer is not None and g.syntax != "tag" else None
            try:
                paths = walks(g, ours, peer if diff is not None else None, vocab, stops, n_walks, max_steps, rng, diff)
            except Exception as e:
                log(f"{g.name}: railcall or llguidance refused it for the walks ({e}); timing railcall alone")
                diff = None
                paths = walks(g, ours, None, vocab, stops, n_walks, max_steps, rng, None)
            if diff is not None:
                diffs[g.name] = diff.__dict__
            row = {"grammar": g.name, "syntax": g.syntax, "engines": {}}
            for name in names:  # interleaved: each engine on this grammar, then the next grammar
                if name in live:
                    row["engines"][name] = time_engine(live[name], g, paths, vocab.logits_width)
            rows.append(row)
            log(f"{g.syntax} {g.name}: " + ", ".join(
                f"{k} {v.get('mask_p50_us') or 0:.1f}/{v.get('mask_p99_us') or 0:.1f} µs" if "error" not in v
                else f"{k} refused" for k, v in row["engines"].items()))
    finally:
        gc.unfreeze()
    from railcall.bench.run import machine

    report = {"vocab": vocab_name, "walks": n_walks, "max_steps": max_steps, "rows": rows, "differential": diffs,
              "machine": machine(), "load": [load_before, os.getloadavg()[0]], "seconds": time.time() - t_start,
              "versions": {k: _version(k) for k in live}}
    out.mkdir(parents=True, exist_ok=True)
    (out / "grammars.json").write_text(json.dumps(report, indent=1))
    (out / "grammars.md").write_text(markdown(report))
    return report


def _version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version({"railcall": "railcall", "llguidance": "llguidance", "xgrammar": "xgrammar"}[name])
    except PackageNotFoundError:
        return "?"


def _f(x, digits=1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def markdown(r: dict) -> str:
    names = [n for n in ENGINES if any(n in row["engines"] for row in r["rows"])]
    lines = [f"# General grammars: railcall beside {', '.join(n for n in names if n != 'railcall')}", "",
             f"Vocabulary {r['vocab']}; {r['walks']} walks of up to {r['max_steps']} tokens per grammar; "
             f"{r['machine']['processor']}, {r['machine']['cpu_count']} cores, load average {r['load'][0]:.2f} before "
             f"and {r['load'][1]:.2f} after; {r['seconds']:.0f} s. Versions: "
             + ", ".join(f"{k} {v}" for k, v in r["versions"].items()) + ".", "",
             "TTFM (compile + first mask) in ms; mask p50 / p99 / max and consume p50 in µs, over the steps "
             f"shown (an engine stops after {BUDGET_S:.0f} s a grammar); `refused` counts paths (written under "
             "railcall and llguidance) the engine refused a token of.", "",
             "| grammar | " + " | ".join(f"{n} TTFM | {n} mask p50/p99/max | {n} consume" for n in names) + " |",
             "|---|" + "---|---|---|" * len(names)]
    for row in r["rows"]:
        cells = []
        for n in names:
            e = row["engines"].get(n)
            if e is None:
                cells += ["-", "-", "-"]
            elif "error" in e:
                cells += ["refused", e["error"][:60].replace("|", "/"), "-"]
            else:
                ref = f" (refused {e['refused_paths']})" if e["refused_paths"] else ""
                cells += [_f(e["ttfm_ms"]), f"{_f(e['mask_p50_us'])} / {_f(e['mask_p99_us'])} / "
                          f"{_f(e['mask_max_us'], 0)} ({e['steps']} steps){ref}", _f(e["consume_p50_us"])]
        lines.append(f"| {row['syntax']} {row['grammar']} | " + " | ".join(cells) + " |")
    if r["differential"]:
        lines += ["", "## Masks beside llguidance's", "",
                  "Per walk step: the same mask; railcall allowing tokens llguidance refuses (one per step "
                  "completed under railcall and parsed independently: valid/checked); llguidance allowing "
                  "tokens railcall refuses.", "",
                  "| grammar | steps | same | railcall only (valid/checked) | llguidance only |", "|---|---|---|---|---|"]
        tot = Differential()
        for name, d in r["differential"].items():
            lines.append(f"| {name} | {d['steps']} | {d['same']} | {d['ours_only_steps']} ({d['ours_only_valid']}/"
                         f"{d['ours_only_checked']}) | {d['theirs_only_steps']} |")
            for k in ("steps", "same", "ours_only_steps", "ours_only_checked", "ours_only_valid", "theirs_only_steps"):
                setattr(tot, k, getattr(tot, k) + d[k])
        lines.append(f"| **all** | {tot.steps} | {tot.same} | {tot.ours_only_steps} ({tot.ours_only_valid}/"
                     f"{tot.ours_only_checked}) | {tot.theirs_only_steps} |")
        lines += ["", "Examples:", ""]
        for name, d in r["differential"].items():
            for ex in d["examples"][:4]:
                lines.append(f"- {name}: {json.dumps(ex, ensure_ascii=False)}")
    return "\n".join(lines) + "\n"
