"""`railcall bench`: every engine on the same workloads and vocabularies, side by side, in one run.

Each (engine, vocabulary, workload) cell runs in its own process (railcall.bench.cell) with a time
limit; the results are one JSON file (`results`: a record per cell), a terminal table with each
railcall figure as a ratio to the best peer, and a PNG chart.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from railcall.atomic import atomic_savefig, atomic_write
from railcall.bench.engines import ENGINES, NOTES, PURE, engine_version

FIGURES = ["ttfm_cold_us_p50", "ttfm_warm_us_p50", "tbm_us_p50", "tbm_us_p99", "tbm_us_max", "consume_us_p50", "peak_mem_mb"]
PEERS = ["llguidance", "xgrammar", "outlines-core"]
# The vocabularies: SmolLM2's 49k byte-level BPE, Gemma 3's 262k SentencePiece, and Qwen's 152k
# byte-level BPE (DeepSeek-R1-Distill-Qwen's tokenizer, from its GGUF's metadata).
VOCABS = ["smollm2", "gemma3", "qwen2"]
OURS = ["railcall", "railcall-py", "railcall-lazy", "railcall-eager"]


def run_cell(engine: str, vocab: str, workload: str, *, paths: int, quick: bool, data: Path, timeout: float,
             samples: Path | None = None) -> dict:
    cmd = [sys.executable, "-m", "railcall.bench.cell", "--engine", engine, "--vocab", vocab, "--workload", workload,
           "--paths", str(paths), "--data", str(data)] + (["--quick"] if quick else []) + \
          (["--samples", str(samples)] if samples else [])
    empty = {"engine": engine, "vocab": vocab, "workload": workload, **{f: None for f in FIGURES}}
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                             env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                                  "RAILCALL_PURE": "1" if engine in PURE else "0"})
    except subprocess.TimeoutExpired:
        return {**empty, "note": f"did not finish within {timeout:.0f} s (compile time)"}
    for line in out.stdout.splitlines()[::-1]:
        if line.startswith("RESULT "):
            rec = json.loads(line[7:])
            if rec.get("rejected_paths"):
                rec["note"] = f"rejects {rec['rejected_paths']}/{rec['paths']} valid paths"
            return rec
    err = (out.stderr.strip().splitlines() or ["no output"])[-1]
    return {**empty, "note": f"failed: {err[:200]}"}


def model_runs(data: Path, quick: bool, samples_file: Path, wls) -> dict:
    """On the embedded model: (1) sample calls under the grammar for every table of the
    workloads (temperature 0.8, fixed seeds) and write them to `samples_file`, so every engine
    also walks model-written calls; (2) end to end, the demo tasks without and with the grammar:
    time per generated token both ways and the share of tokens fed by fast-forward without a
    forward pass of their own."""
    from railcall.runtime.decode import SamplingParams, generate
    from railcall.demo import DEMO_TOOLS, TASKS
    from railcall.grammar.tools import tool_grammar
    from railcall.matcher import Matcher, compiled_grammar
    from railcall.models.store import load_model
    from railcall.prompts.chat import chat_prompt_ids

    lm = load_model()
    vocab = lm.vocabulary()
    backend = lm.backend()
    per_table = 1 if quick else 2
    samples: dict[str, list] = {}
    for wl in wls:
        rows = []
        for ti, (tools, request) in enumerate(zip(wl.tables, wl.requests)):
            compiled = compiled_grammar(tool_grammar(tools), vocab)
            prompt = chat_prompt_ids(lm.tokenizer, tools, request)
            for k in range(per_table):
                g = generate(backend, vocab, prompt, Matcher(compiled),
                             SamplingParams(max_tokens=64, temperature=0.8, seed=100 * ti + k))
                rows.append([ti, g.text])
        samples[wl.name] = rows
    atomic_write(samples_file, json.dumps(samples, ensure_ascii=False, indent=1))

    compiled = compiled_grammar(tool_grammar(DEMO_TOOLS), vocab)
    free_t = free_n = con_t = con_n = saved = 0.0
    for task in TASKS[: 2 if quick else len(TASKS)]:
        prompt = chat_prompt_ids(lm.tokenizer, DEMO_TOOLS, task)
        f = generate(backend, vocab, prompt, None, SamplingParams(max_tokens=48))
        c = generate(backend, vocab, prompt, Matcher(compiled), SamplingParams(max_tokens=48))
        free_t, free_n = free_t + f.seconds, free_n + len(f.tokens)
        con_t, con_n, saved = con_t + c.seconds, con_n + len(c.tokens), saved + c.passes_saved
    return {
        "model": lm.name,
        "tasks": 2 if quick else len(TASKS),
        "ms_per_token_without_grammar": 1000 * free_t / max(free_n, 1),
        "ms_per_token_with_grammar": 1000 * con_t / max(con_n, 1),
        "forward_passes_saved_share": saved / max(con_n, 1),
        "sampled_calls": {k: len(v) for k, v in samples.items()},
    }


def run_vocab_build(vocab: str, *, timeout: float) -> dict:
    """railcall's Vocabulary build: cold from tokenizer.json, from the disk cache, from GGUF
    metadata, and the engine's per-vocabulary indexes (railcall.bench.vocab_bench)."""
    cmd = [sys.executable, "-m", "railcall.bench.vocab_bench", vocab]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    except subprocess.TimeoutExpired:
        return {"vocab": vocab, "note": f"did not finish within {timeout:.0f} s"}
    for line in out.stdout.splitlines()[::-1]:
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"vocab": vocab, "note": "failed: " + ((out.stderr.strip().splitlines() or ["no output"])[-1])[:200]}


def ratios(results: list[dict]) -> list[dict]:
    """Each railcall mode's figure / the best peer's figure, per (vocab, workload) and figure
    (lower is better for every figure, so a ratio below 1 means railcall is ahead)."""
    out = []
    cells = {(r["vocab"], r["workload"]) for r in results}
    for vocab, wl in sorted(cells):
        for engine in OURS:
            ours = next((r for r in results if r["engine"] == engine and r["vocab"] == vocab and r["workload"] == wl), None)
            if ours is None:
                continue
            row = {"vocab": vocab, "workload": wl, "engine": engine}
            for f in FIGURES:
                # every peer counts, also one that rejects some valid paths (its note says so): the
                # comparison is against the fastest figure any peer showed
                peers = [(r[f], r["engine"]) for r in results
                         if r["engine"] in PEERS and r["vocab"] == vocab and r["workload"] == wl and r.get(f) is not None]
                if ours.get(f) is None or not peers:
                    row[f] = None
                    continue
                best, who = min(peers)
                row[f] = {"ratio": (ours[f] / best) if best > 0 else None, "best_peer": who, "best": best}
            out.append(row)
    return out


def machine() -> dict:
    import numpy

    from railcall import speedups

    return {
        "python": platform.python_version(), "platform": platform.platform(), "cpu_count": os.cpu_count(),
        "processor": platform.processor() or platform.machine(), "numpy": numpy.__version__,
        "engines": {e: engine_version(e) for e in ENGINES},
        "railcall_build": speedups.describe(),
    }


def run(*, quick: bool, vocabs: list[str], out: Path, data: Path, engines: list[str] | None = None, log=print,
        progress=None) -> dict:
    """Every (engine, vocabulary, workload) cell, each in a process of its own, then the vocabulary
    builds. `log` is told each cell as it starts; `progress(label, done, total)` each time one ends
    (a full run is about 12 minutes on 2 cores, so the caller can show how far it is)."""
    engines = engines or list(ENGINES)
    progress = progress or (lambda label, done, total: None)
    from railcall.bench.workloads import workloads

    names = [w.name for w in workloads(data, quick)]
    if quick:
        names = ["seed3", "bfcl20"]
    paths = 4 if quick else 24
    timeout = 60 if quick else 240
    results = []
    t0 = time.time()
    log("  sampling calls from the embedded model, and end-to-end decoding ...")
    samples_file = out.with_name(out.stem + "-samples.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    e2e = model_runs(data, quick, samples_file, [w for w in workloads(data, quick) if w.name in names])
    total = len(vocabs) * len(names) * len(engines) + len(vocabs)
    done = 0
    progress("cells", done, total)
    for vocab in vocabs:
        for wl in names:
            for eng in engines:
                log(f"  {eng:14} {vocab:8} {wl:9} ...")
                results.append(run_cell(eng, vocab, wl, paths=paths, quick=quick, data=data, timeout=timeout,
                                        samples=samples_file))
                done += 1
                progress("cells", done, total)
    vocab_builds = []
    for vocab in vocabs:
        log(f"  vocabulary build times {vocab} ...")
        vocab_builds.append(run_vocab_build(vocab, timeout=timeout))
        done += 1
        progress("cells", done, total)
    report = {"machine": machine(), "quick": quick, "seconds": time.time() - t0, "notes": NOTES,
              "results": results, "ratios": ratios(results), "vocab_builds": vocab_builds, "end_to_end": e2e}
    write_report(report, out)
    return report


def write_report(report: dict, out: Path) -> None:
    """`out` (JSON), and beside it the Markdown tables and the PNG chart, each replaced whole."""
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, json.dumps(report, indent=1))
    atomic_write(out.with_suffix(".md"), markdown(report))
    chart(report, out.with_suffix(".png"))


def chart(report: dict, path: Path) -> None:
    """Per vocabulary and workload: time per mask (p50, p99) and time to first mask, log scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = [r for r in report["results"] if r.get("tbm_us_p50") is not None]
    cells = sorted({(r["vocab"], r["workload"]) for r in res})
    engines = [e for e in ENGINES if any(r["engine"] == e for r in res)]
    figs = [("tbm_us_p50", "time per mask p50 (µs)"), ("tbm_us_p99", "time per mask p99 (µs)"),
            ("ttfm_cold_us_p50", "time to first mask, cold (µs)")]
    fig, axes = plt.subplots(1, len(figs), figsize=(5 * len(figs), 4.5))
    width = 0.8 / max(len(engines), 1)
    for ax, (f, title) in zip(axes, figs):
        for i, e in enumerate(engines):
            vals = [next((r[f] for r in res if r["engine"] == e and (r["vocab"], r["workload"]) == c), 0) or 0 for c in cells]
            ax.bar([k + i * width for k in range(len(cells))], vals, width, label=e)
        ax.set_yscale("log")
        ax.set_title(title)
        ax.set_xticks([k + width * (len(engines) - 1) / 2 for k in range(len(cells))])
        ax.set_xticklabels([f"{v}\n{w}" for v, w in cells], fontsize=8)
    axes[0].legend(fontsize=8)
    fig.suptitle("railcall vs peers (lower is better)")
    fig.tight_layout()
    atomic_savefig(fig, path)
    plt.close(fig)


def fmt(x, f):
    if x is None:
        return "—"
    if f == "peak_mem_mb":
        return f"{x:.0f}"
    return f"{x:,.1f}" if x < 100 else f"{x:,.0f}"


def print_report(report: dict, console) -> None:
    from rich.table import Table

    m = report["machine"]
    console.print(f"machine: {m['processor']}, {m['cpu_count']} cores, Python {m['python']}, numpy {m['numpy']}")
    console.print("engines: " + ", ".join(f"{k} {v}" for k, v in m["engines"].items()))
    if m.get("railcall_build"):
        console.print(f"railcall (default, lazy and eager): {m['railcall_build']}")
    sizes = {r["vocab"]: r.get("vocab_size") for r in report["results"] if r.get("vocab_size")}
    console.print("vocabularies: " + ", ".join(f"{k} ({v} tokens)" for k, v in sizes.items()))
    heads = ["TTFM cold", "TTFM warm", "mask p50", "mask p99", "mask max", "consume p50", "peak MB"]
    for vocab, wl in sorted({(r["vocab"], r["workload"]) for r in report["results"]}):
        t = Table(title=f"{vocab} / {wl} (µs; lower is better)")
        t.add_column("engine")
        for h in heads:
            t.add_column(h, justify="right")
        t.add_column("note")
        for r in report["results"]:
            if (r["vocab"], r["workload"]) == (vocab, wl):
                t.add_row(r["engine"], *[fmt(r.get(f), f) for f in FIGURES], r.get("note") or "")
        for rat in (x for x in report["ratios"] if (x["vocab"], x["workload"]) == (vocab, wl)):
            t.add_row(f"{rat.get('engine', 'railcall')} / best peer",
                      *[("—" if rat[f] is None or rat[f]["ratio"] is None else f"{rat[f]['ratio']:.2f}×") for f in FIGURES], "")
        console.print(t)
    e = report.get("end_to_end")
    if e:
        console.print(f"end to end ({e['model']}, {e['tasks']} demo tasks): {e['ms_per_token_without_grammar']:.1f} ms per "
                      f"token without the grammar, {e['ms_per_token_with_grammar']:.1f} ms with it; "
                      f"{100 * e['forward_passes_saved_share']:.0f}% of constrained tokens fed by fast-forward; "
                      f"model-sampled calls per workload: {e['sampled_calls']}")
    for b in report.get("vocab_builds") or []:
        if "note" in b:
            console.print(f"vocabulary {b['vocab']}: {b['note']}")
        else:
            console.print(f"vocabulary {b['vocab']} ({b['tokens']} tokens): built cold in {b['build_cold_s']:.2f} s, "
                          f"from the disk cache in {b['build_cached_s']:.2f} s, from GGUF metadata in "
                          f"{b['build_from_gguf_s']:.2f} s; engine indexes {b['engine_indexes_s']:.2f} s")
    for k, v in report["notes"].items():
        console.print(f"[dim]{k}: {v}[/]")


def markdown(report: dict) -> str:
    """The results as Markdown tables (for the README), with ratios to the best peer."""
    lines = []
    m = report["machine"]
    lines.append(f"Machine: {m['processor']}, {m['cpu_count']} cores, Python {m['python']}, numpy {m['numpy']}; "
                 + ", ".join(f"{k} {v}" for k, v in m["engines"].items()) + "."
                 + (f" railcall (default, lazy and eager): {m['railcall_build']}." if m.get("railcall_build") else ""))
    heads = ["engine", "TTFM cold", "TTFM warm", "mask p50", "mask p99", "mask max", "consume p50", "peak MB", "note"]
    for vocab, wl in sorted({(r["vocab"], r["workload"]) for r in report["results"]}, key=lambda c: (VOCABS.index(c[0]) if c[0] in VOCABS else len(VOCABS), c)):
        size = next((r.get("vocab_size") for r in report["results"] if r["vocab"] == vocab and r.get("vocab_size")), "?")
        lines += ["", f"**{vocab} ({size} tokens) / {wl}** — µs, lower is better", "",
                  "| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
        for r in report["results"]:
            if (r["vocab"], r["workload"]) == (vocab, wl):
                lines.append("| " + " | ".join([r["engine"]] + [fmt(r.get(f), f) for f in FIGURES] + [r.get("note") or ""]) + " |")
        for rat in (x for x in report["ratios"] if (x["vocab"], x["workload"]) == (vocab, wl)):
            cells = [("—" if rat[f] is None or rat[f]["ratio"] is None else f"**{rat[f]['ratio']:.2f}×** ({rat[f]['best_peer']})")
                     for f in FIGURES]
            lines.append(f"| {rat.get('engine', 'railcall')} / best peer | " + " | ".join(cells) + " | |")
    e = report.get("end_to_end")
    if e:
        lines += ["", f"**End to end on the embedded model** ({e['model']}, the demo's {e['tasks']} tasks, greedy)", "",
                  "| ms per generated token, without grammar | with grammar | tokens fed by fast-forward without a pass of their own |",
                  "|---|---|---|",
                  f"| {e['ms_per_token_without_grammar']:.1f} | {e['ms_per_token_with_grammar']:.1f} | "
                  f"{100 * e['forward_passes_saved_share']:.0f}% |"]
    builds = report.get("vocab_builds") or []
    if builds:
        lines += ["", "**Vocabulary build** (railcall; seconds)", "",
                  "| vocabulary | tokens | cold, from tokenizer.json | from the disk cache | from GGUF metadata | engine indexes |",
                  "|---|---|---|---|---|---|"]
        for b in builds:
            if "note" in b:
                lines.append(f"| {b['vocab']} | — | {b['note']} | | | |")
            else:
                lines.append(f"| {b['vocab']} | {b['tokens']} | {b['build_cold_s']:.2f} | {b['build_cached_s']:.2f} | "
                             f"{b['build_from_gguf_s']:.2f} | {b['engine_indexes_s']:.2f} |")
    return "\n".join(lines) + "\n"
