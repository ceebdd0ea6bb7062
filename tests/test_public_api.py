"""The public surface is small and deliberate; the core imports no framework."""

import subprocess
import sys

import railcall


def test_all_is_pinned():
    assert railcall.__all__ == [
        "CompiledGrammar", "Delimiters", "GrammarError", "Matcher", "MatcherError", "ModelError",
        "OutputParser", "RailcallError", "SchemaError", "SchemaOptions", "Tool", "Turn", "Vocabulary",
        "VocabularyError", "__version__", "allocate_bitmask", "answer_matcher", "apply_bitmask", "compiled_grammar", "gbnf_grammar", "lark_grammar",
        "read_only_view", "regex_grammar", "schema_grammar", "structural_tag", "tool_grammar", "turn_matcher",
    ]
    for name in railcall.__all__:
        assert hasattr(railcall, name)


def test_core_import_needs_no_framework():
    code = "import sys, railcall; print(sorted(m for m in ('torch', 'transformers', 'fastapi', 'vllm') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
