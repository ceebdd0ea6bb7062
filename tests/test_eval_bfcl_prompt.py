"""The second baseline: BFCL's own prompt mode, its system prompt and its decoder taken from the
bfcl-eval wheel, beside railcall's tolerant baseline and the grammar in one table."""

from __future__ import annotations

from pathlib import Path

from railcall.eval import bfcl, checker, report
from railcall.eval.runner import score

TINY = Path(__file__).resolve().parent / "data" / "bfcl"


def test_bfcl_calls_reads_what_bfcls_decoder_reads():
    assert checker.bfcl_calls('[get_weather(city="Paris"), calc(a=1, b=2.5)]') == [
        {"tool": "get_weather", "args": {"city": "Paris"}}, {"tool": "calc", "args": {"a": 1, "b": 2.5}}]
    # one call without its brackets, in a Markdown fence, a dotted name: as BFCL reads them
    assert checker.bfcl_calls('```\nmath.hypot(x=3, y=4)\n```') == [{"tool": "math.hypot", "args": {"x": 3, "y": 4}}]
    for prose in ["The weather in Paris is sunny.", "[get_weather(city=", "", "[1, 2]"]:
        assert checker.bfcl_calls(prose) is None, prose
    # Java: every value a string, as BFCL's tree-sitter parser reads it (a literal unquoted)
    assert checker.bfcl_calls('[Store.put(key="a", count=3)]', "java") == [
        {"tool": "Store.put", "args": {"key": "a", "count": "3"}}]


class _Template:
    """A tokenizer whose chat template records the messages it was given."""

    def __init__(self):
        self.msgs = None

    def apply_chat_template(self, msgs, add_generation_prompt, tokenize):
        self.msgs = msgs
        return [1, 2, 3]


def test_the_prompt_is_bfcls_own():
    [task] = [t for t in bfcl.load_category(TINY, "tiny_irrelevance") if t.id == "tiny_irrelevance_0"]
    tok = _Template()
    assert bfcl.bfcl_prompt_ids(tok, task) == [1, 2, 3]
    system, user = tok.msgs
    assert system["role"] == "system" and system["content"].startswith("You are an expert in composing functions.")
    assert "[func_name1(params_name1=params_value1" in system["content"] and '"name": "get_weather"' in system["content"]
    assert user == {"role": "user", "content": "Write a two-line poem about the sea."}
    assert task.functions[0]["description"] == "Current weather for a city."  # the task's own specs untouched


def test_a_prompt_mode_reply_is_scored_as_bfcl_would():
    [task] = [t for t in bfcl.load_category(TINY, "tiny_irrelevance") if t.id == "tiny_irrelevance_0"]
    # the right answer is no call: prose is right, a call is wrong
    assert score(task, "The sea is wide.", checker.bfcl_calls("The sea is wide."), parsed=True)["ast"]
    wrong = score(task, '[get_weather(city="Nice")]', checker.bfcl_calls('[get_weather(city="Nice")]'), parsed=True)
    assert wrong["parse"] and wrong["valid"] and not wrong["ast"]


def test_the_table_gives_both_baselines_beside_the_grammar():
    per = {c: {"n": 10, "parse_rate": p, "valid_rate": p, "ast_accuracy": p / 2, "cut_rate": 0.0,
               "tokens_mean": 5.0, "seconds_mean": 0.1}
           for c, p in (("without_grammar", 0.5), ("bfcl_prompt", 0.7), ("with_grammar", 1.0))}
    md = report.markdown({"categories": {"multiple": per}})
    assert "parse: free / BFCL prompt / grammar" in md.splitlines()[0]
    assert "| multiple | 10 | 50.0% / 70.0% / 100.0% | 50.0% / 70.0% / 100.0% | 25.0% / 35.0% / 50.0% |" in md
    old = report.markdown({"categories": {"multiple": {k: v for k, v in per.items() if k != "bfcl_prompt"}}})
    assert "BFCL prompt" not in old  # a run from before the second baseline keeps its table
