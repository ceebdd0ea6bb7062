"""One benchmark cell, (engine, vocabulary, workload), run in its own process.

A process per cell keeps engines from sharing caches or memory, gives a clean peak-memory
reading, and lets the runner stop an engine that compiles for too long. Prints one JSON record.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np


def _peak_mb() -> float:
    """This process's peak resident memory. VmHWM (Linux) belongs to the address space made at
    exec; ru_maxrss would also carry the peak of the parent it was forked from (the runner,
    which has the model loaded)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _rss_mb() -> float:
    """Resident memory now (Linux /proc; the peak where /proc is missing)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)
    except (OSError, ValueError):
        return _peak_mb()


def _pct(xs, q):
    return float(np.percentile(np.asarray(xs), q)) if len(xs) else None


def load_vocab(name: str):
    """(Vocabulary, tokenizers.Tokenizer, tokenizer.json text) for an embedded model, offline."""
    from tokenizers import Tokenizer

    from railcall.models.store import tokenizer_folder
    from railcall.vocab import Vocabulary

    folder = tokenizer_folder(name, log=lambda m: print(m, file=sys.stderr))
    text = (folder / "tokenizer.json").read_text()
    tok = Tokenizer.from_str(text)
    vocab = Vocabulary.from_hf(tok, name=name)
    return vocab, tok, text


def run_cell(engine_name: str, vocab_name: str, workload: str, paths_per_table: int, quick: bool, data_dir: Path,
             samples: str | None = None, walks: int = 3) -> dict:
    from railcall import speedups
    from railcall.bench.engines import ENGINES
    from railcall.bench.workloads import valid_calls, workloads

    vocab, tok, tok_json = load_vocab(vocab_name)
    wl = next(w for w in workloads(data_dir, quick) if w.name == workload)
    paths = []  # (table index, token ids)
    for ti, tools in enumerate(wl.tables):
        for text in valid_calls(tools, paths_per_table, seed=1000 + ti):
            paths.append((ti, tok.encode(text, add_special_tokens=False).ids))
    # calls sampled from the embedded model under the grammar (railcall.bench.run), re-tokenized
    # canonically with this vocabulary's tokenizer
    sampled = json.loads(Path(samples).read_text()).get(workload, []) if samples else []
    for ti, text in sampled:
        paths.append((ti, tok.encode(text, add_special_tokens=False).ids))
    stop = sorted(vocab.stop_ids)
    # peak memory above the resident size before the engine is set up: what the engine adds
    base_mem = _rss_mb()

    eng = ENGINES[engine_name]()
    t0 = time.perf_counter()
    eng.setup(vocab, tok_json, stop)
    setup_s = time.perf_counter() - t0
    words = (vocab.logits_width + 31) // 32
    bm = np.zeros(words, dtype=np.int32)

    def first_mask(tools):
        """Compile + a matcher + its first mask: (seconds, compiled)."""
        t0 = time.perf_counter()
        c = eng.compile(tools)
        eng.fill(eng.matcher(c), bm)
        return time.perf_counter() - t0, c

    cold, compiled = zip(*(first_mask(tools) for tools in wl.tables))  # the first compile in this process
    warm = [first_mask(tools)[0] for tools in wl.tables]  # again, with the engine's caches warm

    def walk(compiled):
        masks, consumes, rejected = [], [], 0
        for ti, ids in paths:
            m = eng.matcher(compiled[ti])
            for t in list(ids) + [stop[0]]:
                t0 = time.perf_counter()
                eng.fill(m, bm)
                t1 = time.perf_counter()
                if not (bm[t >> 5] >> (t & 31)) & 1:
                    rejected += 1
                    break
                if t == stop[0] and t not in ids:  # the final stop: its mask is measured, nothing follows
                    masks.append(t1 - t0)
                    break
                ok = eng.consume(m, t)
                t2 = time.perf_counter()
                masks.append(t1 - t0)
                consumes.append(t2 - t1)
                if not ok:
                    rejected += 1
                    break
        return masks, consumes, rejected

    # The paths are walked `walks` times, each from a cold start (what an engine carries from one
    # request to the next dropped, see Engine.fresh), and each step counts its median time: the
    # same work every time, so a stall of this machine during one walk does not count.
    runs = [walk(compiled)]
    peak_mb = _peak_mb()  # memory as one request stream leaves it (later walks only time)
    for _ in range(walks - 1):
        compiled = eng.fresh(wl.tables, compiled)
        runs.append(walk(compiled))
    for k, r in enumerate(runs[1:], 2):
        if r[2] != runs[0][2] or len(r[0]) != len(runs[0][0]):
            raise RuntimeError(f"walk {k} of {walks} rejected {r[2]} paths where walk 1 rejected {runs[0][2]}: "
                               "the engine's masks depend on what it had cached")
    masks = np.median([r[0] for r in runs], axis=0).tolist()
    consumes = np.median([r[1] for r in runs], axis=0).tolist() if runs[0][1] else []
    rejected = runs[0][2]
    us = 1e6
    return {
        "engine": engine_name,
        "vocab": vocab_name,
        "workload": workload,
        "vocab_size": vocab.size,
        "tables": len(wl.tables),
        "paths": len(paths),
        "walks": walks,
        "sampled_paths": len(sampled),
        "masks": len(masks),
        "setup_s": setup_s,
        "ttfm_cold_us_p50": _pct(cold, 50) * us,
        "ttfm_warm_us_p50": _pct(warm, 50) * us,
        "tbm_us_p50": _pct(masks, 50) * us,
        "tbm_us_p99": _pct(masks, 99) * us,
        "tbm_us_max": max(masks) * us,
        "tbm_us_p99_each_walk": [_pct(r[0], 99) * us for r in runs],
        "consume_us_p50": _pct(consumes, 50) * us,
        "peak_mem_mb": max(0.0, peak_mb - base_mem),
        "rejected_paths": rejected,
        "note": None,
        "build": speedups.describe(),
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--engine", required=True)
    p.add_argument("--vocab", required=True)
    p.add_argument("--workload", required=True)
    p.add_argument("--paths", type=int, default=8)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--data", default=None, help="The BFCL data folder (default: the installed bfcl-eval package's)")
    p.add_argument("--samples", default=None, help="JSON file of model-sampled calls per workload")
    p.add_argument("--walks", type=int, default=3, help="cold walks of the paths; each step counts its median time")
    a = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if a.data is None:
        from railcall.data import bfcl_data

        a.data = bfcl_data()
    rec = run_cell(a.engine, a.vocab, a.workload, a.paths, a.quick, Path(a.data), a.samples, a.walks)
    print("RESULT " + json.dumps(rec))


if __name__ == "__main__":
    main()
