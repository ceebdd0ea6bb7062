"""The public surface is small and deliberate; the core imports no framework."""

import subprocess
import sys

import railcall


def test_all_is_pinned():
    assert railcall.__all__ == [
        "CompiledGrammar", "Delimiters", "GrammarError", "Matcher", "MatcherError", "ModelError",
        "OutputParser", "RailcallError", "SchemaError", "SchemaOptions", "Tool", "Vocabulary",
        "VocabularyError", "__version__", "allocate_bitmask", "answer_matcher", "apply_bitmask", "compiled_grammar", "read_only_view", "schema_grammar",
        "tool_grammar",
    ]
    for name in railcall.__all__:
        assert hasattr(railcall, name)


def test_core_import_needs_no_framework():
    code = "import sys, railcall; print(sorted(m for m in ('torch', 'transformers', 'fastapi', 'vllm') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_wheel_carries_its_licence_and_type_hints(tmp_path):
    """The built wheel (what `pip install railcall` gets) holds LICENSE in its metadata and the
    PEP 561 marker beside the package."""
    import shutil
    import zipfile
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    tree = tmp_path / "tree"  # a copy, so the build's own build/ and egg-info stay out of the checkout
    shutil.copytree(root / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.so"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(root / name, tree / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path / "dist"), str(tree)], check=True, capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("railcall-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "railcall/py.typed" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), [n for n in names if "dist-info" in n]
    assert "Apache License" in (root / "LICENSE").read_text()
