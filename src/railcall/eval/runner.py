"""`railcall eval bfcl`: every task on the model, with and without the grammar, batched, resumable.

Each task is decoded greedily twice: once free (`without_grammar`, the baseline) and once under
the grammar of the task's tool table (`with_grammar`), from the same chat prompt
(`bfcl.prompt_ids`, the same for every category) but for its in-context examples. The grammar
allows one call or several in every category (the model decides how many; only the checker
knows the category).

The baseline gets its best fair chance (`baseline="tolerant"`, the default): `baseline_shots`
in-context examples (2: what measured best for the free model, docs/evaluation.md), the reply
runs to its own end or the ceiling, and its calls are found anywhere in it, in the wire format or
OpenAI's shapes (`checker.find_calls`). `baseline="whole"` is the strict reading of earlier runs:
the whole reply must be the wire format, and it is ended once it no longer can be. A second
baseline (`bfcl_prompt`, on by default) is BFCL's own prompt mode, as its leaderboard runs a
model without native tool calls: BFCL's system prompt and function docs (built by the bfcl-eval
wheel's own code, `bfcl.bfcl_prompt_ids`), the reply asked for as a Python list of calls and
read by BFCL's own decoder (`checker.bfcl_calls`), run to its own end or the ceiling.

The call format (`call_format`: json, the default, openai, hermes or pythonic) is the grammar's,
the output parser's and the prompt's: without the grammar the prompt still asks for it, and a
reply is read in it. Routing (`routing`): "greedy" (the default) lets the model spell the tool
name token by token under the mask; "scored" chooses it by the likelihood of each whole name
(`railcall.heuristics.routing`, one extra forward pass per call over the names' trie); "matched"
scores only the tools whose words the request shares most (`matching_tools`). They are
settings of the run and fields of every record, so a report tells the variants apart. In a
category whose tasks all have gold calls the grammar is required from the first token; where
some gold answers are no call, the reply may be free text or a call (tool_choice "auto").

Settings are the same for every category: temperature 0, `max_tokens` (default 192: the
longest gold answer of the four shared categories in the wire format is 282 SmolLM2 tokens,
the 99th percentile under 170). Under the grammar a call closes inside the ceiling by the model's
own tokens (`SamplingParams.cut` "fit") and repeats no earlier call of its reply
(`distinct_calls`); a reply the ceiling still cuts, either condition, is a failure on every
verdict and counted in the cut column (`cut_rate`): it is no call anyone could run.
Under `baseline="whole"` a free reply is ended early once it can no longer be a call
(`checker.decided`: it does not start with { or [, or a complete JSON value is followed by more
text); this changes no verdict under that reading, only the time spent.

With `shots` k > 0 each prompt holds k in-context examples between the system message and the
question (`examples`: made-up requests for the task's own tools and their calls in the run's call
format, built from the tool table alone, railcall.prompts.shots); k is one of the run's settings.
A model without a chat template gets plain-text turns whose replies end at stop strings
(railcall.prompts.plain); the early end of a free reply waits while its text may be one on its way.

Tasks are decoded `batch` at a time (both conditions: twice as many rows), new ones joining as
others end (`railcall.runtime.batch.decode_stream`), in file order, a window of `batch` tasks from each
category in turn: an interrupted run holds the first N tasks of every category. Results: one JSON line per (task, condition) in
`results.jsonl`, a task's lines appended and flushed once both are in, so an interrupted run
loses only the tasks in flight; `resume=True` skips what is there (a torn last line is mended
or cut off, `read_results`) and refuses to mix settings (`run.json` holds them). A fresh run
in a folder that holds results keeps them as results.jsonl.old.N (`set_aside`), never replacing
an earlier one.
"""

from __future__ import annotations

import codecs
import importlib.util
import json
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from railcall.atomic import atomic_write
from railcall.eval import bfcl, checker
from railcall.eval.results import CONDITIONS, append_records, read_results, read_run, set_aside

@dataclass
class Settings:
    """What a run's figures depend on; a resumed run must match them."""

    model: str
    max_tokens: int = 192
    shots: int = 0  # in-context examples from the task's tool table (railcall.prompts.shots)
    shot_pair: bool = False  # the last example asks for two things and makes two calls
    temperature: float = 0.0
    prompt: str = bfcl.PROMPT_VERSION
    grammar: str = "one call or a JSON array of calls, JsonCall wire format"
    conditions: list = field(default_factory=lambda: list(CONDITIONS))
    call_format: str = "json"  # railcall.grammar.tools.FORMATS: the grammar's, the parser's and the prompt's
    routing: str = "greedy"  # "greedy": the tool name token by token; "scored": by whole-name likelihood;
    # "matched": scored among the tools whose words the request shares most (railcall.heuristics.routing)
    values: str = "free"  # "grounded": numbers and call count from the request (railcall.heuristics.grounding)
    ceiling: str = "fit"  # SamplingParams.cut under the grammar ("complete": the forced finish, with its "?" tell)
    distinct_calls: bool = True  # under the grammar, no call repeated within a reply
    baseline: str = "tolerant"  # the free reply: "tolerant" (runs to its end, calls found anywhere in
    # it, OpenAI's shapes too: checker.find_calls) or "whole" (ended once it cannot be a call; the
    # whole reply must be the wire format)
    baseline_shots: int = 2  # in-context examples in the free rows' prompt (the run's `shots` in the grammar's)
    bfcl_prompt: bool = True  # the second baseline: BFCL's own prompt mode, read by BFCL's decoder


# What a run.json written before a setting existed ran with (its resume compares like with like).
SETTINGS_BEFORE = {"shots": 0, "shot_pair": False, "call_format": "json", "routing": "greedy", "values": "free",
                   "ceiling": "complete", "distinct_calls": False, "baseline": "whole", "baseline_shots": 0,
                   "bfcl_prompt": False}
BASELINES = ("tolerant", "whole")
ROUTINGS = ("greedy", "scored", "matched")
VALUES = ("free", "grounded")
# The grammar's description per format (the run's settings say which grammar its figures are of).
GRAMMARS = {"json": "one call or a JSON array of calls, JsonCall wire format",
            "openai": "one call or a JSON array of calls, OpenAICall format",
            "hermes": "one or more <tool_call> blocks, one per line, HermesCall format",
            "pythonic": "a Python list of one or more calls, PythonicCall format"}


def call_grammar(tools, fmt: str = "json", per_call=None):
    """The calls a reply may make over `tools`, the same in every category: one call or a JSON
    array of calls (json, openai), one or more <tool_call> blocks (hermes), a Python list of one
    or more calls (pythonic). `per_call` (a grounded request's tables, one per call): exactly
    that many calls, call i over per_call[i]."""
    from railcall.grammar import ir
    from railcall.grammar.tools import call_sequence_grammar, tool_grammar

    if per_call:
        return call_sequence_grammar(per_call, fmt)
    many = tool_grammar(tools, fmt, parallel=True)
    if fmt not in ("json", "openai"):
        return many  # a single call is already one of the many
    one = tool_grammar(tools, fmt)
    rules = dict(one.rules)
    rules.update(dict(many.rules))
    return ir.Grammar(ir.Alt(one.start, many.start), tuple(rules.items()), name=f"one-or-many:{one.name}",
                      key=f"one-or-many:{one.key}:{many.key}")


def delimiters(vocab, fmt: str = "json"):
    """The output parser's delimiters: no reasoning; the <tool_call> tags for hermes alone (by id
    where the vocabulary has them as one token, else by text, as the grammar writes them)."""
    from railcall.output import Delimiters

    return Delimiters.from_vocab(vocab, reasoning=None,
                                 tool_call=("<tool_call>", "</tool_call>") if fmt == "hermes" else None)


def make_matcher(tools, vocab, mode: str, fmt: str = "json", per_call=None):
    """A fresh matcher for one request: the call grammar (`per_call`: see call_grammar),
    required or behind free text (auto)."""
    from railcall.matcher import Matcher, compiled_grammar

    compiled = compiled_grammar(call_grammar(tools, fmt, per_call), vocab)
    if mode == "required":
        return Matcher(compiled)
    from railcall.output import AUTO_TRIGGERS
    from railcall.runtime.regions import answer_matcher

    # "auto": free content until the format's trigger ({"tool":" for json), then a call under the
    # grammar, then content again (railcall.runtime.regions); no reasoning region.
    return answer_matcher(vocab, compiled, delimiters(vocab, fmt), mode=mode, trigger=AUTO_TRIGGERS[fmt])


def read_calls(vocab, tokens, fmt: str = "json", tool_choice: str = "auto") -> tuple[list[dict] | None, str]:
    """(the calls in a reply as {"tool", "args"} dicts, or None when it makes none; its content),
    as the runtime's output parser reads `fmt` under `tool_choice`."""
    from railcall.output import OutputParser

    d = delimiters(vocab, fmt)
    tags = {x.token_id: x.text for x in d.all() if x.token_id is not None}  # a tag that is one token
    parser = OutputParser(d, call_format=fmt, tool_choice=tool_choice, stop_ids=vocab.stop_ids)
    # incrementally: a character split across byte-level tokens is one character, not two U+FFFD
    text = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for t in tokens:
        parser.feed(t, tags[t] if t in tags else text.decode(vocab.decode([t])))
    parser.feed(-1, text.decode(b"", final=True))
    parser.finish()
    calls = []
    result = parser.result()
    for c in result.tool_calls:
        try:
            args = json.loads(c.arguments)
        except ValueError:
            return None, result.content or ""
        calls.append({"tool": c.name, "args": args})
    return calls or None, result.content or ""


def auto_calls(vocab, tokens, fmt: str = "json") -> list[dict] | None:
    """The calls a reply decoded under tool_choice "auto" makes, as the runtime's output parser
    reads them (text around them is content); None when it makes none."""
    return read_calls(vocab, tokens, fmt, "auto")[0]


def whole_calls(vocab, tokens, fmt: str) -> list[dict] | None:
    """The calls of a reply that is nothing but calls in `fmt` (the parser's "required" reading,
    with no content beside them); None otherwise. The JSON format's `checker.parse_calls`."""
    calls, content = read_calls(vocab, tokens, fmt, "required")
    return calls if calls and not content.strip() else None


def decided(text: str, fmt: str = "json", stop: Sequence[str] = ()) -> bool:
    """True once a free reply can no longer be a call in `fmt` (`checker.decided` for json, which
    waits while the text may still be one of the reply's `stop` strings on its way; for the other
    formats, once it does not start as a call of theirs would). Ends a reply early without
    changing its verdict: such a reply is not a reply of calls alone."""
    if fmt == "json":
        return checker.decided(text, stop)
    s = text.lstrip()
    opener = {"openai": "{[", "pythonic": "["}.get(fmt)
    if opener is not None:
        return bool(s) and s[0] not in opener
    tag = "<tool_call>"
    return bool(s) and not (s.startswith(tag) or tag.startswith(s))


def score(task: bfcl.Task, text: str, calls: list[dict] | None = None, *, auto: bool = False,
          parsed: bool = False) -> dict:
    """The verdicts on one reply. A reply is a call when the whole of it is the wire format
    (`checker.parse_calls`), or, for another call format, when `calls` were read from it
    (`parsed=True`, from `whole_calls`); under tool_choice "auto" (`auto=True`, `calls` from
    `auto_calls`) when the output parser finds calls in it (text around them is content)."""
    if not auto and not parsed:
        calls = checker.parse_calls(text)
    verdict = checker.check_calls(task.functions, calls, task.ground_truth, language=task.language, expects=task.expects)
    return {"parse": calls is not None, "valid": checker.valid_calls(calls, task.tools),
            "ast": verdict.ok, "reason": verdict.reason, "calls": len(calls) if calls else 0}


def examples(task: bfcl.Task, shots: int, call_format: str = "json", pair: bool = False) -> list[dict]:
    """`shots` in-context examples for `task` as chat turns: made-up requests for its tools and
    their calls in `call_format`, built from the tool table alone (never its question or answer);
    `pair`: the last one asks for one tool twice and makes both calls."""
    from railcall.prompts.shots import shot_messages, shots as make_shots

    return shot_messages(make_shots(task.tools, shots, call_format, pair=pair))


def run_bfcl(categories: list[str], out: Path, *, data: Path | None = None, limit: int | None = None,
             grammar: bool = True, model: str | None = None, max_tokens: int = 192, shots: int = 0, shot_pair: bool = False,
             batch: int = 16,
             resume: bool = False, tool_choice: str | None = None, threads: int | None = None,
             call_format: str = "json", routing: str = "greedy", prompt_example: bool = False,
             values: str = "free", without_grammar: bool = True, device: str | None = None,
             baseline: str = "tolerant", baseline_shots: int = 2, ceiling: str = "fit", distinct_calls: bool = True,
             bfcl_prompt: bool = True, shard: tuple[int, int] | None = None,
             progress: Callable[[str, int, int], None] | None = None, log: Callable[[str], None] | None = None) -> dict:
    """Run the categories; returns the summary (also written to `out`/summary.json). `call_format`:
    the grammar's, the parser's and the prompt's format; `routing="scored"`: the tool name chosen
    by whole-name likelihood (`railcall.heuristics.routing`) under the grammar; `prompt_example`:
    the prompt shows one call built from the table (`railcall.prompts.chat.call_example`);
    `values="grounded"`: under the grammar, numeric arguments take the request's numbers and the
    reply makes as many calls as they fill (`railcall.heuristics.grounding`).
    `shots` in-context examples before each question, the last a request for two calls where
    `shot_pair` (`railcall.prompts.shots`).
    `grammar` / `without_grammar`: whether the run decodes each task under the grammar / free
    (both by default; `railcall.eval.variants` runs a scored variant under the grammar alone).
    `baseline` / `baseline_shots`: how the free condition is prompted and read (`Settings`): by
    default at its best -- two in-context examples, run to its own end, calls found anywhere in
    the reply. `bfcl_prompt`: also decode each task in BFCL's own prompt mode, read by BFCL's
    own decoder (the second baseline). `ceiling` / `distinct_calls`: the grammar rows' token ceiling and repeat ban
    (`SamplingParams.cut`, `.distinct_calls`).
    `device`: where the model runs (`load_model`; default the CPU). `shard=(k, n)`: only every
    n-th task of each category from the k-th (k counts from 1), so n processes, each with its own
    `out`, share a run; `merge_runs` joins their folders."""
    from railcall.runtime.batch import decode_stream
    from railcall.runtime.decode import SamplingParams
    from railcall.eval import report
    from railcall.models.store import load_model
    from railcall.prompts.plain import stop_strings

    from railcall.grammar.tools import FORMATS
    from railcall.heuristics.grounding import ground
    from railcall.heuristics.routing import NameRouter, matching_tools

    if call_format not in FORMATS:
        raise ValueError(f"unknown call format {call_format!r}; use {', '.join(FORMATS)}")
    if routing not in ROUTINGS:
        raise ValueError(f"unknown routing {routing!r}; use {' or '.join(ROUTINGS)}")
    if values not in VALUES:
        raise ValueError(f"unknown values {values!r}; use {' or '.join(VALUES)}")
    log = log or (lambda m: None)
    if shots < 0 or baseline_shots < 0:
        raise ValueError(f"shots must be 0 or more, not {min(shots, baseline_shots)}")
    if baseline not in BASELINES:
        raise ValueError(f"unknown baseline {baseline!r}; use {' or '.join(BASELINES)}")
    if not (grammar or without_grammar or bfcl_prompt):
        raise ValueError("nothing to run: the grammar and both free conditions are off")
    if threads and importlib.util.find_spec("torch") is not None:  # llama.cpp's threads: load_model's
        import torch

        # On a machine other processes keep busy, fewer threads than cores avoids OpenMP's
        # spin-waits fighting them: measured on 2 shared cores at load 7, one decode step of 8
        # rows took 1.8 s with 2 threads and 0.33 s with 1.
        torch.set_num_threads(threads)
    if data is None:
        from railcall.data import bfcl_data

        data = bfcl_data()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if shard is not None:
        k, n = shard
        if not 1 <= k <= n:
            raise ValueError(f"shard {k}/{n}: k must be 1 to n")
    all_tasks = {c: bfcl.load_category(data, c, limit) for c in categories}  # fails early on a bad name
    if shard is not None:
        all_tasks = {c: tasks[shard[0] - 1::shard[1]] for c, tasks in all_tasks.items()}
    lm = load_model(model, device=device, threads=threads)
    vocab = lm.vocabulary()
    on = {"with_grammar": grammar, "without_grammar": without_grammar, "bfcl_prompt": bfcl_prompt}
    conditions = [c for c in CONDITIONS if on[c]]
    settings = Settings(model=lm.name, max_tokens=max_tokens, shots=shots, shot_pair=shot_pair and shots > 0,
                        conditions=list(CONDITIONS),
                        grammar=GRAMMARS[call_format], call_format=call_format, routing=routing, values=values,
                        prompt=bfcl.PROMPT_VERSION + ("+example" if prompt_example else ""),
                        ceiling=ceiling, distinct_calls=distinct_calls, baseline=baseline,
                        baseline_shots=baseline_shots, bfcl_prompt=bfcl_prompt)
    results_path, run_path = out / "results.jsonl", out / "run.json"
    here = machine(device, lm)
    machines = [here]
    if resume and run_path.is_file():
        run_before = read_run(run_path)
        before = {**SETTINGS_BEFORE, **run_before["settings"]}
        # every machine that wrote records here (a run resumed elsewhere, merged parts)
        machines = [m for m in run_before.get("machines") or [run_before.get("machine") or {}] if m and m != here] + [here]
        if before != asdict(settings):
            diff = {k: (before.get(k), v) for k, v in asdict(settings).items() if before.get(k) != v}
            raise ValueError(f"--resume: {out} was run with other settings {diff}; use another --out")
    elif results_path.exists():
        kept = set_aside(out)
        log(f"started afresh; the previous results are in {kept}" if kept else
            "started afresh (the previous results file was empty)")
    atomic_write(run_path, json.dumps({"settings": asdict(settings), "machine": here, "machines": machines}, indent=1))
    done = {(r["category"], r["id"], r["condition"]) for r in read_results(results_path, repair=True, warn=log)}
    # a base model's plain-text turns end at stop strings (railcall.prompts.plain); others: none
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, stop=stop_strings(lm.tokenizer), cut=ceiling,
                            distinct_calls=distinct_calls)
    t_start = time.perf_counter()
    # The order of work: tasks in file order, `batch` at a time from each category in turn, so
    # an interrupted run holds the first N tasks of every category -- what `--limit N` runs.
    # Within a window prompts of similar length sit together (less padding in each prefill).
    modes = {cat: tool_choice or bfcl.tool_choice(tasks) for cat, tasks in all_tasks.items()}
    finished = {cat: sum(all((cat, t.id, c) in done for c in conditions) for t in tasks) for cat, tasks in all_tasks.items()}
    windows: dict[str, list] = {}
    for cat, tasks in all_tasks.items():
        todo = [(cat, t) for t in tasks if not all((cat, t.id, c) in done for c in conditions)]
        windows[cat] = [todo[i: i + batch] for i in range(0, len(todo), batch)]
        if progress:
            progress(cat, finished[cat], len(tasks))
    # the grammar's rows take the run's `shots`; the free rows the baseline's (its best prompt)
    k_of = {"with_grammar": shots, "without_grammar": baseline_shots}

    def prompt(t, c):
        if c == "bfcl_prompt":  # BFCL's own prompt, as its leaderboard gives it
            return bfcl.bfcl_prompt_ids(lm.tokenizer, t)
        return bfcl.prompt_ids(lm.tokenizer, t, call_format, prompt_example,
                               examples=examples(t, k_of[c], call_format, shot_pair and k_of[c] > 0))

    prompts = {(cat, t.id, c): prompt(t, c) for ws in windows.values() for w in ws for cat, t in w for c in conditions}
    order = []
    for k in range(max((len(ws) for ws in windows.values()), default=0)):
        for ws in windows.values():
            if k < len(ws):
                order += sorted(ws[k], key=lambda x: len(prompts[(x[0], x[1].id, conditions[0])]))
    rows = [(cat, t, c) for cat, t in order for c in conditions if (cat, t.id, c) not in done]

    def requests():  # matchers made as rows are admitted (a compiled grammar per table, cached)
        for cat, t, c in rows:
            if c != "with_grammar" or not t.tools:  # no tool: no call to constrain (tool_choice "none")
                yield prompts[(cat, t.id, c)], None
                continue
            tools, per_call, asked = t.tools, None, bfcl.request_text(t)
            if values == "grounded":
                g = ground(tools, asked)
                # a call count holds where a call must be made; under "auto" the reply may be
                # text, and each call starts at the format's trigger (one call at a time)
                tools, per_call = g.tools, g.per_call if modes[cat] == "required" else None
            m = make_matcher(tools, vocab, modes[cat], call_format, per_call)
            # scored: the router's scorer is bound to the row's batch when the row is added
            router = None
            if routing != "greedy":
                prefer = matching_tools(tools, asked) if routing == "matched" else ()
                router = NameRouter.for_tools(vocab, tools, call_format, prefer=prefer)
            yield prompts[(cat, t.id, c)], m, router

    waiting: dict[tuple, int] = {}
    for cat, t, _ in rows:
        waiting[(cat, t.id)] = waiting.get((cat, t.id), 0) + 1
    held: dict[tuple, list] = {}

    def is_decided(i, tokens):  # the whole-reply reading of railcall's prompt alone
        return rows[i][2] == "without_grammar" and decided(vocab.decode(tokens).decode("utf-8", errors="replace"),
                                                           call_format, params.stop)

    def verdicts(t, g, c, mode):
        if g.cut or g.truncated:  # the ceiling cut the reply (and the grammar may have closed it): a failure
            return {"parse": False, "valid": False, "ast": False, "reason": "cut at the token ceiling", "calls": 0}
        if c == "bfcl_prompt":
            return score(t, g.text, checker.bfcl_calls(g.text, t.language), parsed=True)
        if c == "with_grammar" and not t.tools:
            return score(t, g.text, None, auto=True)  # as a server without tools: text, no call
        if c == "with_grammar" and mode == "auto":
            return score(t, g.text, auto_calls(vocab, g.tokens, call_format), auto=True)
        if c == "without_grammar" and baseline == "tolerant" and call_format == "json":
            return score(t, g.text, checker.find_calls(g.text), parsed=True)
        if call_format == "json":
            return score(t, g.text)
        return score(t, g.text, whole_calls(vocab, g.tokens, call_format), parsed=True)

    last = time.perf_counter()
    with open(results_path, "a") as f:
        for i, g in decode_stream(lm.model, vocab, requests(), params, max_rows=batch * len(conditions),
                                  decided=is_decided if baseline == "whole" else None):
            now = time.perf_counter()
            cat, t, c = rows[i]
            mode = modes[cat]
            held.setdefault((cat, t.id), []).append({
                "category": cat, "id": t.id, "condition": c,
                "tool_choice": ("none" if not t.tools else mode) if c == "with_grammar" else "free",
                "call_format": call_format, "routing": routing if c == "with_grammar" else "free",
                "output": g.text, **verdicts(t, g, c, mode),
                "tokens": len(g.tokens), "seconds": round(g.seconds, 3),
                "forward_passes": g.forward_passes, "passes_saved": g.passes_saved,
                "finish_reason": g.finish_reason, "cut": bool(g.cut or g.truncated), "fitted": g.fitted,
                "prompt_tokens": len(prompts[(cat, t.id, c)]),
                # this row's share of the wall time (the time since the previous row ended):
                # summed over rows, the run's decoding wall time
                "wall_share": round(now - last, 4),
            })
            last = now
            waiting[(cat, t.id)] -= 1
            if not waiting[(cat, t.id)]:  # a task's records are written together, once all are in
                append_records(f, held.pop((cat, t.id)))
                finished[cat] += 1
                if progress:
                    progress(cat, finished[cat], len(all_tasks[cat]))
    log(f"decoded in {time.perf_counter() - t_start:.0f} s")
    wanted = {(c, t.id) for c, tasks in all_tasks.items() for t in tasks}
    records = [r for r in read_results(results_path) if (r["category"], r["id"]) in wanted]
    summary = report.summarise(records, settings=asdict(settings), categories=categories, limit=limit,
                               machine=here, machines=machines)
    report.write(summary, out)
    return summary


def machine(device: str | None = None, lm=None) -> dict:
    """What ran a run: the machine, the library versions and the model's backend."""
    import numpy

    from railcall.version import __version__

    m = {"platform": platform.machine(), "cores": os.cpu_count(), "python": platform.python_version(),
         "numpy": numpy.__version__, "railcall": __version__}
    if getattr(lm, "backend_name", None) == "llama.cpp":
        import llama_cpp

        m.update(backend="llama.cpp", llama_cpp=llama_cpp.__version__, threads=lm.model.threads)
        return m
    import torch

    m.update(backend="transformers", torch=torch.__version__, torch_threads=torch.get_num_threads())
    if device is not None and torch.device(device).type == "cuda":
        m["device"] = torch.cuda.get_device_name(torch.device(device))
    return m


def merge_runs(dest: Path, sources: Sequence[Path], *, log: Callable[[str], None] | None = None) -> dict:
    """Join the run folders `sources` (the shards of one run, `run_bfcl(shard=...)`, or parts run
    on different machines) into `dest`, which may hold records already: the settings must be the
    same everywhere; a task and condition found twice keeps its first record (dest's, then the
    sources' in order). Writes dest's results.jsonl (replaced whole, atomically), run.json (its
    "machines": those of all parts) and the report; returns the summary."""
    from railcall.eval import report

    log = log or (lambda m: None)
    dest = Path(dest)
    folders = ([dest] if (dest / "run.json").is_file() else []) + [Path(s) for s in sources]
    if not sources:
        raise ValueError("nothing to merge: name at least one run folder")
    settings, machines, records, seen = None, [], [], set()
    for folder in folders:
        if not (folder / "run.json").is_file():
            raise FileNotFoundError(f"{folder} holds no run.json: not a run folder of `railcall eval bfcl`")
        run = read_run(folder / "run.json")
        mine = {**SETTINGS_BEFORE, **run["settings"]}
        if settings is None:
            settings = mine
        elif mine != settings:
            diff = {k: (settings.get(k), mine.get(k)) for k in settings.keys() | mine.keys() if settings.get(k) != mine.get(k)}
            raise ValueError(f"{folder} was run with other settings than {folders[0]}: {diff}; "
                             "only parts of one run merge")
        for m in run.get("machines") or [run.get("machine") or {}]:
            if m and m not in machines:
                machines.append(m)
        new = 0
        for r in read_results(folder / "results.jsonl", warn=log):
            key = (r["category"], r["id"], r["condition"])
            if key not in seen:
                seen.add(key)
                records.append(r)
                new += 1
        log(f"{folder}: {new} records")
    dest.mkdir(parents=True, exist_ok=True)
    atomic_write(dest / "results.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    run = {"settings": settings, "machine": machines[-1] if machines else {}, "machines": machines}
    atomic_write(dest / "run.json", json.dumps(run, indent=1))
    summary = report.from_folder(dest, warn=log)
    report.write(summary, dest)
    return summary
