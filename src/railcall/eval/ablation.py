"""`railcall eval ablation`: the grammar ablation -- parse rate with and without the grammar.

N tasks are drawn (with replacement, seeded) from the demo's six tasks over the demo tool table
(`railcall.demo`); each is sampled at a temperature once prompt-only and once under the grammar,
from the same prompt, each row with its own seed. Reported: the share of replies that are one
wire-format call (parse rate), the share that are a call to a table tool with schema-valid
arguments (the demo's `parse_call`), and tokens per reply. Sampling rather than greedy decoding
gives N different replies per task, so N counts replies, not six repeats.
"""

from __future__ import annotations

import random


def run(*, n: int = 30, seed: int = 0, temperature: float = 0.8, max_tokens: int = 48, model: str | None = None,
        batch: int = 32) -> dict:
    from railcall.runtime.batch import generate_batch
    from railcall.runtime.decode import SamplingParams
    from railcall.demo import DEMO_TOOLS, TASKS, parse_call
    from railcall.eval.checker import parse_calls
    from railcall.grammar.tools import tool_grammar
    from railcall.matcher import Matcher, compiled_grammar
    from railcall.models.store import load_model
    from railcall.prompts.plain import stop_strings
    from railcall.prompts.chat import chat_prompt_ids

    if n < 1:
        raise ValueError("--n must be at least 1")
    lm = load_model(model)
    vocab = lm.vocabulary()
    compiled = compiled_grammar(tool_grammar(DEMO_TOOLS), vocab)
    rng = random.Random(seed)
    drawn = [rng.randrange(len(TASKS)) for _ in range(n)]
    prompts = {k: chat_prompt_ids(lm.tokenizer, DEMO_TOOLS, TASKS[k]) for k in set(drawn)}
    rows = [(i, k, cond) for i, k in enumerate(drawn) for cond in ("without", "with")]
    out = []
    for start in range(0, len(rows), batch):
        chunk = rows[start: start + batch]
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed * 100_003 + start,
                                stop=stop_strings(lm.tokenizer))  # a base model's turn end (railcall.prompts.plain)
        gens = generate_batch(lm.model, vocab, [prompts[k] for _, k, _ in chunk],
                              [Matcher(compiled) if c == "with" else None for _, _, c in chunk], params)
        for (i, k, c), g in zip(chunk, gens):
            calls = parse_calls(g.text)
            out.append({"sample": i, "task": TASKS[k], "condition": c, "output": g.text,
                        "parses": calls is not None and len(calls) == 1,
                        "valid": parse_call(g.text, DEMO_TOOLS) is not None, "tokens": len(g.tokens), "cut": g.cut})

    def rate(cond, key):
        rs = [r for r in out if r["condition"] == cond]
        return sum(r[key] for r in rs) / len(rs)

    summary = {"n": n, "temperature": temperature, "seed": seed, "max_tokens": max_tokens, "model": lm.name,
               "parse_rate_without": rate("without", "parses"), "parse_rate_with": rate("with", "parses"),
               "valid_rate_without": rate("without", "valid"), "valid_rate_with": rate("with", "valid"),
               "tokens_without": rate("without", "tokens"), "tokens_with": rate("with", "tokens")}
    return {"replies": out, "summary": summary}
