"""The `railcall` command line."""

from __future__ import annotations

import os
import sys
import time
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from railcall import __version__
from railcall.errors import RailcallError

app = typer.Typer(
    name="railcall",
    help="Grammar-constrained tool calling: malformed or forbidden calls are unreachable, not rejected.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()


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
    console.print(f"[bold red]error:[/] {e}", soft_wrap=True)
    raise typer.Exit(2)


@app.command()
def demo(
    model: Optional[str] = typer.Option(None, "--model", help="A .gguf file or a local Hugging Face folder (default: the embedded SmolLM2)."),
    prompt: str = typer.Option("What is the capital of France?", "--prompt", help="The question for the greedy reply."),
    max_tokens: int = typer.Option(24, "--max-tokens", help="Tokens in the greedy reply."),
) -> None:
    """Load the model and show its facts and one greedy reply."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        from railcall.models.store import load_model
        from railcall.vocab import Vocabulary

        t0 = time.perf_counter()
        lm = load_model(model)
        total = time.perf_counter() - t0
        vocab = Vocabulary.from_hf(lm.tokenizer, logits_width=lm.model.config.vocab_size, name=lm.name)
    except RailcallError as e:
        _fail(e)
        return
    cfg = lm.model.config
    table = Table(title=f"model {lm.name}", show_header=False)
    table.add_row("folder", str(lm.folder))
    table.add_row("load time", f"{lm.load_seconds:.2f} s from the cache (+{lm.import_seconds:.1f} s importing torch and "
                  f"transformers; {total:.1f} s in all, including any first-run conversion)")
    table.add_row("vocabulary", f"{vocab.size} tokens, logits width {vocab.logits_width}, longest token {vocab.max_token_len} bytes")
    table.add_row("special tokens", f"{int(vocab.special.sum())}: " + ", ".join(sorted(vocab.special_text.values())[:8]) + " ...")
    table.add_row("stop tokens", ", ".join(f"{vocab.token_text(i)} ({i})" for i in vocab.stop_ids))
    table.add_row("context length", str(getattr(cfg, "max_position_embeddings", "?")))
    console.print(table)

    import torch

    msgs = [{"role": "user", "content": prompt}]
    enc = lm.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    ids = enc["input_ids"]
    t0 = time.perf_counter()
    with torch.no_grad():
        out = lm.model.generate(ids, attention_mask=enc["attention_mask"], max_new_tokens=max_tokens, do_sample=False,
                                eos_token_id=list(vocab.stop_ids), pad_token_id=vocab.eos_id)
    dt = time.perf_counter() - t0
    new = out[0][ids.shape[1]:].tolist()
    reply = lm.tokenizer.decode(new, skip_special_tokens=True)
    console.print(f"[bold]prompt:[/] {prompt}")
    console.print(f"[bold]greedy reply:[/] {reply}")
    console.print(f"({len(new)} tokens in {dt:.2f} s, {len(new) / max(dt, 1e-9):.1f} tokens/s)")


@app.command()
def bench(
    quick: bool = typer.Option(False, "--quick", help="A small run (SmolLM2 only, two workloads) in under a minute."),
    vocab: list[str] = typer.Option(None, "--vocab", help="smollm2 and/or gemma3 (default: both; --quick: smollm2)."),
    out: str = typer.Option("bench-out/bench.json", "--out", help="The JSON file to write (a PNG chart is written beside it)."),
    data: str = typer.Option("../shared/data/bfcl", "--data", help="The BFCL data folder (for the bfcl20 workload)."),
    engine: list[str] = typer.Option(None, "--engine", help="Only these engines (default: railcall and every peer)."),
) -> None:
    """Benchmark railcall against llguidance, xgrammar and outlines-core, side by side."""
    from pathlib import Path

    from railcall.bench.run import print_report, run

    vocabs = vocab or (["smollm2"] if quick else ["smollm2", "gemma3"])
    for v in vocabs:
        if v not in ("smollm2", "gemma3"):
            _fail(ValueError(f"unknown vocabulary {v!r}; use smollm2 or gemma3"))
    if not Path(data).is_dir():
        _fail(FileNotFoundError(f"BFCL data folder {data} not found; pass --data PATH"))
    console.print(f"railcall bench{' --quick' if quick else ''}: vocabularies {', '.join(vocabs)}")
    report = run(quick=quick, vocabs=vocabs, out=Path(out), data=Path(data), engines=engine or None,
                 log=lambda m: console.print(m, style="dim"))
    print_report(report, console)
    console.print(f"wrote {out}, {Path(out).with_suffix('.md')} and {Path(out).with_suffix('.png')} "
                  f"in {report['seconds']:.0f} s")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
