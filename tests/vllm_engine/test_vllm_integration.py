"""railcall inside vLLM (CPU build) on the embedded SmolLM2: a batch of concurrent requests with
different tool tables, a read-only view, a schema answer and a request without railcall; every
output parses and validates; the same tokens as railcall's own loop at temperature 0; throughput
with and without the processor."""

from __future__ import annotations

import json
import time
from pathlib import Path

import jsonschema
import pytest

from scenario import MAX_TOKENS, SENTIMENT

REPORT = Path(__file__).resolve().parents[2] / "bench-out" / "vllm-cpu.json"


def _run(llm, reqs, railcall: bool = True, **params):
    from vllm import SamplingParams

    prompts = [{"prompt_token_ids": ids} for _, ids, _, _ in reqs]
    sps = [SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, **params,
                          extra_args={"railcall": spec} if railcall and spec is not None else None)
           for _, _, spec, _ in reqs]
    t0 = time.perf_counter()
    outs = llm.generate(prompts, sps, use_tqdm=False)
    return [o.outputs[0] for o in outs], time.perf_counter() - t0


@pytest.fixture(scope="module")
def outputs(llm, batch):
    outs, _ = _run(llm, batch)
    return {name: o for (name, *_), o in zip(batch, outs)}


def test_batch_is_concurrent_and_varied(batch):
    tables = [json.dumps(spec, sort_keys=True) for _, _, spec, _ in batch if spec and "tools" in spec]
    assert len(tables) >= 8 and len(set(tables)) == len(tables)
    assert sum(1 for _, _, spec, _ in batch if spec and spec.get("read_only")) == 1


def test_every_call_parses_and_validates(batch, outputs):
    for name, _, spec, allowed in batch:
        if spec is None or "tools" not in spec:
            continue
        out = outputs[name]
        assert out.finish_reason == "stop", (name, out.text)
        call = json.loads(out.text)
        by_name = {t.name: t for t in allowed}
        assert set(call) == {"tool", "args"} and call["tool"] in by_name, (name, out.text)
        jsonschema.validate(call["args"], by_name[call["tool"]].parameters)


def test_read_only_request_calls_no_mutating_tool(batch, outputs):
    (name, _, spec, allowed), = [r for r in batch if r[2] and r[2].get("read_only")]
    mutating = {t["function"]["name"] for t in spec["tools"] if t["function"]["x-mutates"]}
    assert mutating and not mutating & {t.name for t in allowed}
    call = json.loads(outputs[name].text)
    assert call["tool"] not in mutating


def test_schema_answer_validates(outputs):
    assert outputs["schema"].finish_reason == "stop"
    jsonschema.validate(json.loads(outputs["schema"].text), SENTIMENT)


def test_request_without_railcall_is_untouched(llm, batch, outputs):
    (plain,) = [r for r in batch if r[0] == "plain"]
    alone, _ = _run(llm, [plain])
    assert outputs["plain"].token_ids == alone[0].token_ids


def test_same_tokens_as_railcalls_own_loop(batch, outputs, reference):
    """Temperature 0, the same prompt ids: vLLM with the processor writes the tokens railcall's
    loop writes without fast-forward (one token per pass, as in vLLM). With fast-forward the loop
    writes forced text in its canonical tokenization where the model under vLLM may pick another
    legal one, and the model's later choices can follow that: those texts are reported."""
    stops = reference["_stops"]
    same_tokens, same_text = [], []
    for name, _, spec, _ in batch:
        if spec is None:
            continue
        step, fast = reference[name]
        theirs = [t for t in outputs[name].token_ids if t not in stops]
        assert theirs == step.tokens, (name, step.text, outputs[name].text)
        same_tokens.append(name)
        if fast.text == outputs[name].text:
            same_text.append(name)
        else:
            print(f"\n  with fast-forward, {name}: {fast.text}\n  vLLM: {outputs[name].text}")
    print(f"\nrailcall's loop vs vLLM: {len(same_tokens)}/{len(same_tokens)} identical tokens without fast-forward; "
          f"{len(same_text)}/{len(same_tokens)} identical texts with fast-forward")


def test_throughput_with_and_without_the_processor(llm, batch, outputs):
    """The same batch, greedy, with and without railcall's specs (in one engine, so the model
    and batch set-up are the same). Natural stops: railcall's requests end where the call does;
    fixed length (ignore_eos, every request writes MAX_TOKENS): the processor's cost per token."""
    runs = {}
    for label, railcall, params in [("plain", False, {}), ("railcall", True, {}),
                                    ("plain_fixed", False, {"ignore_eos": True}),
                                    ("railcall_fixed", True, {"ignore_eos": True})]:
        best = None
        for _ in range(2):
            outs, secs = _run(llm, batch, railcall, **params)
            toks = sum(len(o.token_ids) for o in outs)
            if best is None or secs < best[1]:
                best = (toks, secs)
        runs[label] = {"requests": len(batch), "output_tokens": best[0], "seconds": round(best[1], 3),
                       "tokens_per_s": round(best[0] / best[1], 1)}
    ratio = runs["railcall"]["tokens_per_s"] / runs["plain"]["tokens_per_s"]
    ratio_fixed = runs["railcall_fixed"]["tokens_per_s"] / runs["plain_fixed"]["tokens_per_s"]
    report = {"runs": runs, "ratio_tokens_per_s": round(ratio, 3), "ratio_tokens_per_s_fixed": round(ratio_fixed, 3)}
    REPORT.parent.mkdir(exist_ok=True)
    REPORT.write_text(json.dumps(report, indent=1))
    print("\n" + json.dumps(report, indent=1))
    assert runs["railcall_fixed"]["output_tokens"] == runs["plain_fixed"]["output_tokens"]


def test_a_bad_spec_is_rejected_before_it_runs(llm, batch):
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError

    bad = SamplingParams(max_tokens=4, extra_args={"railcall": {"tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {"x": {"not": {"type": "string"}}}}}}]}})
    with pytest.raises(VLLMValidationError, match="railcall.*keyword 'not'"):
        llm.generate([{"prompt_token_ids": batch[0][1]}], [bad], use_tqdm=False)


def test_a_call_cut_by_max_tokens_is_finished_within_it(llm, batch):
    """vLLM stops at max_tokens; the processor forces the shortest completion while it fits.
    (The shortest call of this table is 15 tokens on SmolLM2, so each budget here fits one.)"""
    from vllm import SamplingParams

    for name, ids, spec, allowed in batch:
        if name != "email":
            continue
        for budget in (24, 32):
            (o,) = llm.generate([{"prompt_token_ids": ids}], [SamplingParams(
                temperature=0.0, max_tokens=budget, extra_args={"railcall": spec})], use_tqdm=False)
            out = o.outputs[0]
            assert len(out.token_ids) <= budget
            call = json.loads(out.text)
            tool = {t.name: t for t in allowed}[call["tool"]]
            jsonschema.validate(call["args"], tool.parameters)
            print(f"\nmax_tokens={budget}: {out.text} ({out.finish_reason})")
