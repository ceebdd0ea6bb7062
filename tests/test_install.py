"""railcall installed as a user installs it, outside the Makefile: the wheel that `pip install`
gets is built from a copy of the tree, holds its licence and type hints, and, installed into a
fresh virtual environment, runs `railcall --version` and a grammar on its own (no model, no
torch: the core needs numpy, typer and rich).

The fresh environment is offline: it reaches the test interpreter's installed packages (numpy,
typer, rich) through a .pth line, which adds them to sys.path without running their .pth files,
so the checkout's editable install of railcall stays out and only the wheel's railcall is found.
"""

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

import railcall

ROOT = Path(__file__).resolve().parents[1]

# A tool call decoded under the grammar, on a vocabulary of single bytes and a few pieces.
GRAMMAR_ONLY = r"""
import sys
from railcall import Matcher, Tool, Vocabulary, compiled_grammar, tool_grammar

vocab = Vocabulary.from_pieces([bytes([b]) for b in range(256)] + [b'{"tool":"', b'read_file'], name="bytes")
path = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
m = Matcher(compiled_grammar(tool_grammar([Tool("read_file", "Read a file", path)]), vocab))
assert m.consume_bytes(b'{"tool":"read_file","args":{"path":"notes.txt"}}') and m.is_accepting()
assert not m.copy().consume_bytes(b'x')  # nothing after a complete call
import railcall
print(railcall.__file__, sorted(k for k in ("torch", "transformers") if k in sys.modules))
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    tree = tmp / "tree"  # a copy, so the build's own build/ and egg-info stay out of the checkout
    shutil.copytree(ROOT / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.so"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, tree / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp / "dist"), str(tree)], check=True, capture_output=True)
    (built,) = (tmp / "dist").glob("railcall-*.whl")
    return built


def test_the_wheel_carries_its_licence_and_type_hints(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "railcall/py.typed" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), [n for n in names if "dist-info" in n]
    assert "Apache License" in (ROOT / "LICENSE").read_text()
    assert not any(n.endswith((".so", ".pyd")) for n in names)  # compiled modules are built per machine


def test_the_wheel_installs_and_runs_in_a_fresh_venv(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # numpy, typer, rich
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", "-q",
                    str(wheel)], check=True, capture_output=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["RAILCALL_HOME"] = str(tmp_path / "home")

    r = subprocess.run([str(venv / "bin" / "railcall"), "--version"], capture_output=True, text=True, env=env,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"railcall {railcall.__version__}"

    r = subprocess.run([str(py), "-c", GRAMMAR_ONLY], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    where, frameworks = r.stdout.split(" ", 1)
    assert Path(where).is_relative_to(site), where  # the wheel's railcall, not the checkout's
    assert frameworks.strip() == "[]"
