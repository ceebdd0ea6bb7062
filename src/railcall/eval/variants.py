"""Variants of one BFCL evaluation: every combination asked for of call format, routing,
in-context examples and model, run on the same tasks with the same settings, and one table.

    railcall eval bfcl --variants "format=json,pythonic routing=greedy,scored" --category multiple

A variant is one `run_bfcl` in its own folder under `out` (named by its label, e.g.
`pythonic-scored-0shot-smollm2`), so each is resumable on its own and readable with
`railcall eval report`. Routing and grounded values act only under the grammar (they choose
among what the grammar allows, or narrow it), so a scored or grounded variant runs the grammar
condition alone and takes its without-grammar figures from the greedy, free-valued run of the
same format, examples and model, which the variants then always include. The table (variants.md, variants.json, variants.png in `out`)
has one row per variant and category: AST accuracy, parse and valid rates, tokens per reply
and seconds per task, with and without the grammar.
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Callable

AXES = ("format", "routing", "shots", "values", "model")
DEFAULTS = {"format": "json", "routing": "greedy", "shots": 0, "values": "free", "model": "smollm2"}  # the embedded model


class VariantError(ValueError):
    """A --variants spec that names an unknown axis or value."""


def parse(spec: str) -> list[dict]:
    """`"format=json,pythonic routing=greedy,scored shots=0,2,2p values=free,grounded model=smollm2"` (axes separated by
    spaces or semicolons, values by commas; an axis not named keeps its default) -> every
    combination, as dicts over AXES, in the order written (shots `2p`: two examples, the last a
    request for two things answered with two calls). Groups separated by `|` add their
    combinations to the earlier ones (`"format=json,pythonic | model=gemma3"`: three variants),
    each variant once."""
    out: list[dict] = []
    for group in spec.split("|"):
        out += [v for v in _parse_group(group) if v not in out]
    return out


def _parse_group(spec: str) -> list[dict]:
    from railcall.output import CALL_FORMATS

    axes: dict[str, list] = {}
    for part in spec.replace(";", " ").split():
        name, eq, values = part.partition("=")
        if not eq or name not in AXES:
            raise VariantError(f"--variants: {part!r} is not AXIS=VALUE[,VALUE...] with AXIS one of {', '.join(AXES)}")
        if name in axes:
            raise VariantError(f"--variants: {name} is given twice; list its values once, comma-separated")
        vals = [v for v in values.split(",") if v]
        if not vals:
            raise VariantError(f"--variants: {name} has no values")
        if name == "format":
            bad = [v for v in vals if v not in CALL_FORMATS]
            if bad:
                raise VariantError(f"--variants: format {bad[0]!r} is not one of {', '.join(CALL_FORMATS)}")
        elif name == "routing":
            bad = [v for v in vals if v not in ("greedy", "scored", "matched")]
            if bad:
                raise VariantError(f"--variants: routing {bad[0]!r} is not greedy, scored or matched")
        elif name == "values":
            bad = [v for v in vals if v not in ("free", "grounded")]
            if bad:
                raise VariantError(f"--variants: values {bad[0]!r} is not free or grounded")
        elif name == "shots":
            if not all(re.fullmatch(r"\d+p?", v) and v != "0p" for v in vals):
                raise VariantError(f"--variants: shots are whole numbers, each with p for a last example "
                                   f"of two calls (2p), not {values!r}")
            vals = [int(v) if v.isdigit() else v for v in vals]
        if len(set(vals)) != len(vals):
            raise VariantError(f"--variants: {name} lists a value twice")
        axes[name] = vals
    if not axes:
        raise VariantError("--variants: name at least one axis, e.g. format=json,pythonic")
    lists = [axes.get(a, [DEFAULTS[a]]) for a in AXES]
    return [dict(zip(AXES, combo)) for combo in itertools.product(*lists)]


def shot_count(v: dict) -> tuple[int, bool]:
    """A variant's shots as (how many, whether the last is a pair of calls): 2 -> (2, False),
    "2p" -> (2, True)."""
    s = v["shots"]
    return (s, False) if isinstance(s, int) else (int(s[:-1]), True)


def label(v: dict) -> str:
    """A variant's folder name and table label: `json-greedy-0shot-smollm2` (with grounded
    values, `json-greedy-0shot-grounded-smollm2`)."""
    grounded = "-grounded" if v.get("values", "free") == "grounded" else ""
    return f"{v['format']}-{v['routing']}-{v['shots']}shot{grounded}-{_model_label(v['model'])}"


def _model_label(model) -> str:
    return Path(str(model)).name.replace(".gguf", "")


def _baseline(v: dict) -> dict:
    """The greedy free-valued variant whose without-grammar figures a scored or grounded one
    shares (both act only under the grammar)."""
    return {**v, "routing": "greedy", "values": "free"}


def _shares(v: dict) -> bool:
    return v != _baseline(v)


def plan(variants: list[dict]) -> list[tuple[dict, bool]]:
    """(variant, with the without-grammar condition) in run order: each greedy, free-valued
    baseline a scored or grounded variant needs is added where missing, and runs before it."""
    out: list[tuple[dict, bool]] = []
    seen: set[str] = set()
    for v in variants:
        need = [_baseline(v), v] if _shares(v) else [v]
        for w in need:
            if label(w) not in seen:
                seen.add(label(w))
                out.append((w, not _shares(w)))
    return out


def run(categories: list[str], out: Path, variants: list[dict], *, runner: Callable[..., dict] | None = None,
        log: Callable[[str], None] | None = None, **kw) -> dict:
    """Run each variant (`runner`: `railcall.eval.runner.run_bfcl`, or a stand-in with its
    signature) into `out`/<label>/, then write the table. `kw` goes to every run (limit, data,
    max_tokens, batch, resume, threads, progress...). Returns the table's data."""
    if runner is None:
        from railcall.eval.runner import run_bfcl as runner
    log = log or (lambda m: None)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    summaries: dict[str, dict] = {}
    steps = plan(variants)
    for i, (v, without) in enumerate(steps, 1):
        name = label(v)
        log(f"variant {i} of {len(steps)}: {name}")
        k, pair = shot_count(v)
        summaries[name] = runner(categories, out / name, model=v["model"], call_format=v["format"],
                                 routing=v["routing"], shots=k, shot_pair=pair, values=v["values"],
                                 without_grammar=without, bfcl_prompt=without, **kw)
    table = tabulate(categories, variants, summaries)
    write(table, out)
    return table


def tabulate(categories: list[str], variants: list[dict], summaries: dict[str, dict]) -> dict:
    """{"rows": [...]} with one row per (asked-for) variant and category; a scored or grounded
    variant's without-grammar figures are its baseline's."""
    rows = []
    for v in variants:
        name = label(v)
        s = summaries[name]["categories"]
        base = summaries[label(_baseline(v))]["categories"]
        for cat in categories:
            w = s.get(cat, {}).get("with_grammar")
            wo = (base if _shares(v) else s).get(cat, {}).get("without_grammar")
            rows.append({"variant": name, **{a: v[a] for a in AXES if a != "model"}, "model": _model_label(v["model"]),
                         "category": cat, "with_grammar": w, "without_grammar": wo})
    return {"rows": rows, "categories": categories, "variants": [label(v) for v in variants]}


def _pct(c: dict | None, key: str) -> str:
    return "-" if not c else f"{100 * c[key]:.1f}%"


def _num(c: dict | None, key: str, fmt: str = "{:.1f}") -> str:
    return "-" if not c else fmt.format(c[key])


def markdown(table: dict) -> str:
    lines = ["| variant | category | n | AST with / without | parse with / without | valid with / without "
             "| tokens per reply with / without | seconds per task with / without |",
             "|---|---|---|---|---|---|---|---|"]
    for r in table["rows"]:
        w, wo = r["with_grammar"], r["without_grammar"]
        n = (w or wo or {}).get("n", 0)
        lines.append(f"| {r['variant']} | {r['category']} | {n} | **{_pct(w, 'ast_accuracy')}** / {_pct(wo, 'ast_accuracy')} "
                     f"| {_pct(w, 'parse_rate')} / {_pct(wo, 'parse_rate')} | {_pct(w, 'valid_rate')} / {_pct(wo, 'valid_rate')} "
                     f"| {_num(w, 'tokens_mean')} / {_num(wo, 'tokens_mean')} "
                     f"| {_num(w, 'seconds_mean')} / {_num(wo, 'seconds_mean')} |")
    return "\n".join(lines) + "\n"


def write(table: dict, out: Path) -> None:
    from railcall.atomic import atomic_write

    atomic_write(out / "variants.json", json.dumps(table, indent=1))
    atomic_write(out / "variants.md", markdown(table))
    chart(table, out / "variants.png")


def chart(table: dict, path: Path) -> None:
    """AST accuracy under the grammar, one group of bars per category, one bar per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from railcall.atomic import atomic_savefig

    cats, names = table["categories"], table["variants"]
    acc = {(r["variant"], r["category"]): (r["with_grammar"] or {}).get("ast_accuracy", 0.0) for r in table["rows"]}
    width = 0.8 / max(len(names), 1)
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(cats) + 0.3 * len(names)), 4))
    for i, name in enumerate(names):
        xs = [c + (i - (len(names) - 1) / 2) * width for c in range(len(cats))]
        ax.bar(xs, [100 * acc[(name, c)] for c in cats], width, label=name)
    ax.set_xticks(range(len(cats)), cats)
    ax.set_ylabel("AST accuracy with the grammar (%)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=7, ncol=2)
    ax.set_title("BFCL: call format x routing x examples x values x model")
    fig.tight_layout()
    atomic_savefig(fig, path)
    plt.close(fig)
