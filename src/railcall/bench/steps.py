"""`railcall bench steps`: one decode step of the embedded model, at 1, 4, 8 and 16 rows per step,
on each way railcall can run it, beside llama.cpp alone, in one run on one machine.

    llama.cpp alone         llama-cpp-python's low-level API: one llama_decode per step, one token
                            per sequence, the logits read and argmax'd; no mask, no sampler: the floor
    railcall on llama.cpp   railcall's batch loop (railcall.runtime.batch.BatchLoop) over the same
                            GGUF: rows, masks-free greedy sampling, bookkeeping; the same model calls
    ... under the grammar   the same, every row under a tool-call grammar (mask, consume,
                            fast-forward of forced tokens: a "step" then feeds several tokens)
    railcall on transformers  the loop over the GGUF converted to float32 (the earlier default)

Every variant decodes the same prompt (the demo's tool prompt, ~150 tokens) greedily for a fixed
number of steps after the prefill; the figure is milliseconds per step (the best of `rounds`
interleaved rounds, so a burst of load elsewhere hurts one round, not the figure), and tokens/s
(rows x tokens fed per step / step time). Ratios are to llama.cpp alone at the same rows.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

ROWS = (1, 4, 8, 16)


def _raw_llama(path: Path, prompt: list[int], rows: int, steps: int, threads: int) -> tuple[float, int]:
    """llama.cpp alone: (seconds per step, tokens per step)."""
    import llama_cpp
    import numpy as np

    from railcall.models.llama import DEFAULT_CELLS, DEFAULT_SEQUENCES, EXTRA_BUFFERS, FLASH_ATTENTION, _quiet_logs

    _quiet_logs()
    mp = llama_cpp.llama_model_default_params()
    mp.use_extra_bufts = EXTRA_BUFFERS
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), mp)
    cp = llama_cpp.llama_context_default_params()
    # the context railcall makes (railcall.models.llama): its settings measured best here
    cp.n_ctx, cp.n_batch, cp.n_seq_max, cp.kv_unified = DEFAULT_CELLS, 4096, DEFAULT_SEQUENCES, True
    cp.flash_attn_type = FLASH_ATTENTION
    cp.n_threads = cp.n_threads_batch = threads
    ctx = llama_cpp.llama_init_from_model(model, cp)
    width = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    batch = llama_cpp.llama_batch_init(4096, 0, 1)

    def decode(items):
        for i, (s, t, p, out) in enumerate(items):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = t, p, 1, out
            batch.seq_id[i][0] = s
        batch.n_tokens = len(items)
        assert llama_cpp.llama_decode(ctx, batch) == 0
        n = sum(o for *_, o in items)
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits(ctx), shape=(n, width))

    logits = decode([(s, t, i, i == len(prompt) - 1) for s in range(rows) for i, t in enumerate(prompt)])
    nxt = [int(np.argmax(x)) for x in logits]
    pos = len(prompt)
    t0 = time.perf_counter()
    for k in range(steps):
        logits = decode([(s, nxt[s], pos + k, True) for s in range(rows)])
        nxt = [int(np.argmax(x)) for x in logits]
    dt = (time.perf_counter() - t0) / steps
    llama_cpp.llama_batch_free(batch)
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
    return dt, rows


def _loop(model, vocab, prompt: list[int], rows: int, steps: int, grammar) -> tuple[float, float]:
    """railcall's batch loop: (seconds per step, tokens fed per step) over `steps` steps after
    the prefill, every row greedy (under `grammar` where given)."""
    from railcall.matcher import Matcher
    from railcall.runtime.batch import BatchLoop
    from railcall.runtime.decode import Row, SamplingParams

    loop = BatchLoop(model, vocab, max_rows=rows)
    params = SamplingParams(max_tokens=10_000, cut="leave")
    live = [Row(vocab, Matcher(grammar) if grammar is not None else None, params) for _ in range(rows)]
    for r in live:
        r.stops = set()  # a free row runs on past its end of turn: the figure is the step, not the reply
        loop.add(prompt, r)
    loop.step()  # admission: the prefill, and the first advance
    fed0 = sum(len(r.out) for r in live)
    t0 = time.perf_counter()
    done = 0
    while done < steps and loop.live:
        loop.step()
        done += 1
    dt = (time.perf_counter() - t0) / max(done, 1)
    fed = (sum(len(r.out) for r in live) - fed0) / max(done, 1)
    loop.cancel_all()
    return dt, fed


def run(out: Path, *, rows=ROWS, steps: int = 24, rounds: int = 2, threads: int | None = None,
        transformers: bool = True, progress=print) -> dict:
    """Every variant at every row count, `rounds` interleaved rounds; writes steps.json and steps.md."""
    from railcall.demo import DEMO_TOOLS, TASKS
    from railcall.grammar.tools import tool_grammar
    from railcall.matcher import compiled_grammar
    from railcall.models.llama import default_threads
    from railcall.models.store import load_model
    from railcall.prompts.chat import chat_prompt_ids

    threads = threads or default_threads()
    out.mkdir(parents=True, exist_ok=True)
    llm = load_model(backend="llama", threads=threads)
    vocab = llm.vocabulary()
    prompt = chat_prompt_ids(llm.tokenizer, DEMO_TOOLS, TASKS[0])
    grammar = compiled_grammar(tool_grammar(DEMO_TOOLS), vocab)
    variants = {
        "llama.cpp alone": lambda n: _raw_llama(llm.model.path, prompt, n, steps, threads),  # the same weights
        "railcall on llama.cpp": lambda n: _loop(llm.model, vocab, prompt, n, steps, None),
        "railcall on llama.cpp, grammar": lambda n: _loop(llm.model, vocab, prompt, n, steps, grammar),
    }
    if transformers:
        import torch

        torch.set_num_threads(threads)
        hf = load_model(backend="transformers")
        variants["railcall on transformers"] = lambda n: _loop(hf.model, vocab, prompt, n, steps, None)
    best: dict[str, dict[int, tuple[float, float]]] = {v: {} for v in variants}
    for k in range(rounds):
        for n in rows:
            for name, fn in variants.items():
                progress(f"round {k + 1}/{rounds}: {name}, {n} rows")
                dt, fed = fn(n)
                if n not in best[name] or dt < best[name][n][0]:
                    best[name][n] = (dt, fed)
    load = os.getloadavg()
    result = {"model": f"SmolLM2-135M-Instruct ({llm.model.path.name}; transformers: float32)", "prompt_tokens": len(prompt),
              "steps": steps,
              "rounds": rounds, "threads": threads, "cpus": os.cpu_count(), "machine": platform.processor() or platform.machine(),
              "load_average_after": [round(x, 2) for x in load],
              "variants": {name: {str(n): {"ms_per_step": round(1000 * dt, 2), "tokens_per_step": round(fed, 2),
                                           "tokens_per_s": round(fed / dt, 1)}
                                  for n, (dt, fed) in per.items()} for name, per in best.items()}}
    (out / "steps.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "steps.md").write_text(markdown(result))
    return result


def markdown(r: dict) -> str:
    names = list(r["variants"])
    base = r["variants"]["llama.cpp alone"]
    lines = [f"# `railcall bench steps`: {r['model']}, {r['prompt_tokens']}-token prompt, {r['threads']} threads "
             f"of {r['cpus']} cores, best of {r['rounds']} rounds (load average after: "
             f"{', '.join(str(x) for x in r['load_average_after'])})", "",
             "ms per step (tokens per second; ratio of step time to llama.cpp alone)", "",
             "| rows | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for n in base:
        cells = []
        for name in names:
            v = r["variants"][name].get(n)
            if v is None:
                cells.append("—")
                continue
            ratio = v["ms_per_step"] / base[n]["ms_per_step"]
            cells.append(f"{v['ms_per_step']} ({v['tokens_per_s']} tok/s; {ratio:.2f}x)")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
