"""Results -> summary.json, a terminal table and a PNG chart (with vs without the grammar, and
BFCL's own prompt-mode format where the run has it).

summary.json: {"categories": {cat: {condition: {n, parse_rate, valid_rate, ast_accuracy,
tokens_mean, seconds_mean, cut_rate}}}, "throughput": {...}, "variant": {call_format, routing, values},
"settings", "machine", "machines", "limit"}.
A condition's `seconds_mean` is each task's latency inside its batch (rows decode together);
`throughput` is the run's generated tokens over its decoding wall time (prefills included; their
prompt tokens, a prompt per task and condition, are counted apart).
"""

from __future__ import annotations

import json
from pathlib import Path

from railcall.atomic import atomic_savefig, atomic_write
from railcall.eval.results import CONDITIONS, read_results, read_run


def summarise(records: list[dict], *, settings: dict, categories: list[str], limit=None, machine=None,
              machines=None) -> dict:
    cats: dict = {}
    for cat in categories:
        per = {}
        for cond in CONDITIONS:
            rs = [r for r in records if r["category"] == cat and r["condition"] == cond]
            if not rs:
                continue
            n = len(rs)
            # a reply the token ceiling cut is a failure on every verdict, whatever closed it
            # (records written before runs scored it so carry parse/valid true beside cut)
            whole = [r for r in rs if not r["cut"]]
            per[cond] = {
                "n": n,
                "parse_rate": sum(r["parse"] for r in whole) / n,
                "valid_rate": sum(r["valid"] for r in whole) / n,
                "ast_accuracy": sum(r["ast"] for r in whole) / n,
                "tokens_mean": sum(r["tokens"] for r in rs) / n,
                "seconds_mean": sum(r["seconds"] for r in rs) / n,
                "cut_rate": sum(r["cut"] for r in rs) / n,
            }
        cats[cat] = per
    wall = sum(r["wall_share"] if "wall_share" in r else r.get("batch_seconds", 0.0) / max(r.get("batch_rows", 1), 1)
               for r in records)
    tokens = sum(r["tokens"] for r in records)
    tasks = len({(r["category"], r["id"]) for r in records})
    return {
        "categories": cats,
        "throughput": {"tasks": tasks, "rows": len(records),
                       "generated_tokens": tokens, "decode_seconds": round(wall, 1),
                       # a prompt per task and condition; one where both conditions had the same
                       "prompt_tokens": sum(n for _, _, n in {(r["category"], r["id"], r.get("prompt_tokens", 0))
                                                               for r in records}),
                       "tokens_per_s": round(tokens / wall, 1) if wall else None,
                       "seconds_per_task": round(wall / tasks, 3) if tasks else None},
        # the variant the figures are of (runs written before these settings: json, greedy)
        "variant": {"call_format": settings.get("call_format", "json"), "routing": settings.get("routing", "greedy"),
                    "values": settings.get("values", "free")},
        "settings": settings,
        "machine": machine or {},
        # every machine whose records are in (a run resumed elsewhere, or merged from parts)
        "machines": machines or ([machine] if machine else []),
        "limit": limit,
    }


def from_folder(out: Path, warn=None) -> dict:
    """The summary of whatever a run folder holds (a finished or an interrupted run). A line of
    results.jsonl that is not a usable record is skipped, and `warn` told which and why."""

    out = Path(out)
    run = read_run(out / "run.json") if (out / "run.json").is_file() else {}
    records = read_results(out / "results.jsonl", warn=warn)
    if not records:
        raise FileNotFoundError(f"no results in {out / 'results.jsonl'}")
    cats = list(dict.fromkeys(r["category"] for r in records))
    return summarise(records, settings=run.get("settings", {}), categories=cats, machine=run.get("machine"),
                     machines=run.get("machines"))


def write(summary: dict, out: Path) -> None:
    out = Path(out)
    atomic_write(out / "summary.json", json.dumps(summary, indent=1))
    chart(summary, out / "eval.png")
    atomic_write(out / "table.md", markdown(summary))


def _pct(x) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


def rows(summary: dict, keys=("parse_rate", "valid_rate", "ast_accuracy")):
    """(category, n, [parse, valid, ast] without, [parse, valid, ast] with) per category."""
    for cat, per in summary["categories"].items():
        w, g = per.get("without_grammar"), per.get("with_grammar")
        n = (g or w or {}).get("n", 0)
        get = lambda d: [d.get(k) if d else None for k in keys]  # noqa: E731
        yield cat, n, get(w), get(g)


def has_bfcl_prompt(summary: dict) -> bool:
    """Whether the run decoded BFCL's own prompt-mode condition (the second baseline)."""
    return any("bfcl_prompt" in per for per in summary["categories"].values())


def markdown(summary: dict) -> str:
    if has_bfcl_prompt(summary):
        return _markdown3(summary)
    lines = ["| category | n | parse rate without | with | schema-valid without | with | AST accuracy without | with "
             "| cut without | with |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for cat, n, w, g in rows(summary, ("parse_rate", "valid_rate", "ast_accuracy", "cut_rate")):
        lines.append(f"| {cat} | {n} | " + " | ".join(f"{_pct(a)} | {_pct(b)}" for a, b in zip(w, g)) + " |")
    return "\n".join(lines) + "\n"


_SHOWN = ("without_grammar", "bfcl_prompt", "with_grammar")


def _markdown3(summary: dict) -> str:
    """Each cell: the free reply in railcall's prompt (tolerant reading) / in BFCL's own
    prompt-mode format (BFCL's decoder) / under the grammar."""
    lines = ["| category | n | parse: free / BFCL prompt / grammar | schema-valid | AST accuracy | cut |",
             "|---|---|---|---|---|---|"]
    for cat, per in summary["categories"].items():
        n = next((per[c]["n"] for c in ("with_grammar", *_SHOWN) if c in per), 0)
        cells = [" / ".join(_pct(per.get(c, {}).get(k)) for c in _SHOWN)
                 for k in ("parse_rate", "valid_rate", "ast_accuracy", "cut_rate")]
        lines.append(f"| {cat} | {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def table(summary: dict):
    from rich.table import Table

    v = summary.get("variant") or {}
    t = Table(title=f"BFCL: without / with the grammar ({v.get('call_format', 'json')} format, "
                    f"{v.get('routing', 'greedy')} routing, {v.get('values', 'free')} values)")
    three = has_bfcl_prompt(summary)
    t.caption = ("each cell: free / BFCL's prompt mode / with the grammar" if three else
                 "each cell: without / with the grammar") + "; a cut reply fails parse, valid and AST"
    for col in ("category", "n", "parse", "valid", "AST", "cut", "tokens", "s/task"):
        t.add_column(col, justify="left" if col == "category" else "right", no_wrap=col == "category")
    for cat, per in summary["categories"].items():
        w, g = per.get("without_grammar", {}), per.get("with_grammar", {})
        shown = _SHOWN if three else ("without_grammar", "with_grammar")
        pair = lambda k, f=_pct: " / ".join(f(per[c].get(k)) if c in per else "—" for c in shown)  # noqa: E731
        num = lambda x: "—" if x is None else f"{x:.1f}"  # noqa: E731
        t.add_row(cat, str((g or w).get("n", 0)), pair("parse_rate"), pair("valid_rate"), pair("ast_accuracy"),
                  pair("cut_rate"), pair("tokens_mean", num), pair("seconds_mean", num))
    return t


def chart(summary: dict, path: Path) -> None:
    """Three panels (parse rate, schema-valid rate, AST accuracy), a bar per condition and
    category (without the grammar, BFCL's prompt mode where the run has it, with the grammar):
    the category names read across, however many."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    conds = [("without_grammar", "without grammar", "#9e9e9e")]
    if has_bfcl_prompt(summary):
        conds.append(("bfcl_prompt", "BFCL prompt mode", "#ffb74d"))
    conds.append(("with_grammar", "with grammar", "#1f77b4"))
    data = list(summary["categories"].items())
    cats = [f"{c} (n={next((per[k]['n'] for k in ('with_grammar', *_SHOWN) if k in per), 0)})" for c, per in data]
    titles = ["parse rate", "schema-valid rate", "AST accuracy"]
    keys = ("parse_rate", "valid_rate", "ast_accuracy")
    fig, axes = plt.subplots(1, 3, figsize=(13, 1.4 + (0.42 if len(conds) == 2 else 0.6) * max(len(data), 3)),
                             sharey=True)
    height = 0.76 / len(conds)
    ys = list(range(len(data)))[::-1]  # the first category on top
    for k, ax in enumerate(axes):
        bars = []
        for j, (cond, label, colour) in enumerate(conds):
            values = [100 * (per.get(cond, {}).get(keys[k]) or 0) for _, per in data]
            offset = (len(conds) - 1) / 2 - j  # the first condition on top within a category
            b = ax.barh([y + offset * height for y in ys], values, height, label=label, color=colour)
            bars.append(b)
            for bar in b:
                ax.annotate(f"{bar.get_width():.0f}", (bar.get_width() + 1, bar.get_y() + bar.get_height() / 2),
                            ha="left", va="center", fontsize=7)
        ax.set_yticks(ys)
        ax.set_yticklabels(cats, fontsize=8)
        ax.set_title(titles[k])
        ax.set_xlim(0, 112)
        ax.set_xlabel("% of tasks", fontsize=8)
        if k == 0:
            fig.legend(handles=bars, loc="upper right", ncol=len(conds), fontsize=8, frameon=False)
    model = summary.get("settings", {}).get("model", "")
    v = summary.get("variant") or {}
    fig.suptitle(f"BFCL on {model}, greedy, max {summary.get('settings', {}).get('max_tokens')} tokens, "
                 f"{v.get('call_format', 'json')} format, {v.get('routing', 'greedy')} routing, "
                 f"{v.get('values', 'free')} values", fontsize=10,
                 x=0.02, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    atomic_savefig(fig, path)
    plt.close(fig)
