"""A pip user's railcall: `pip wheel .` gives a platform wheel whose engine runs compiled once it
is installed into a bare venv, that writes nothing outside site-packages, runs its Python source
under RAILCALL_PURE=1, and leaves nothing behind when uninstalled."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from railcall import speedups

ROOT = Path(__file__).resolve().parent.parent

# Run in the bare venv: a tool grammar compiled and walked on a small vocabulary, then which of
# the engine's modules ran compiled and from where.
USE = r"""
import json, sys
import railcall
from railcall import Matcher, Tool, Vocabulary, allocate_bitmask, compiled_grammar, speedups, tool_grammar
v = Vocabulary.from_pieces([bytes([b]) for b in range(256)], specials=["<|end|>"], stop=["<|end|>"], name="bytes")
g = compiled_grammar(tool_grammar([Tool("f", "", {"type": "object", "properties": {"a": {"type": "string"}}})]), v)
m = Matcher(g)
bm = allocate_bitmask(v.logits_width)
for ch in b'{"tool":"f","args":{"a":"x"}}':
    m.fill_bitmask(bm)
    assert m.consume_token(ch), ch
s = speedups.status()
print(json.dumps({"done": m.is_done(), "package": railcall.__file__, "loaded": s["loaded"],
                  "files": {k: sys.modules[k].__file__ for k in speedups.MODULES}, "describe": speedups.describe()}))
"""


def _env(home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RAILCALL_PURE", "VIRTUAL_ENV")}
    return {**env, "HOME": str(home), "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def _files(root: Path, skip: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file() and skip not in p.parents and "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
                        "-q", "-w", str(out)], capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    (whl,) = out.glob("railcall-*.whl")
    return whl


@pytest.fixture(scope="module")
def bare(built, tmp_path_factory):
    """A venv with nothing in it but the wheel; the wheel's dependencies (numpy, typer, rich) are
    read from this interpreter's site-packages through a .pth line, railcall itself never."""
    base = tmp_path_factory.mktemp("bare")
    venv, home = base / "venv", base / "home"
    home.mkdir()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", str(built)], capture_output=True,
                       text=True, env=_env(home), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "deps-from-test.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv, site, home


def test_pip_wheel_is_a_platform_wheel_with_the_engine_compiled(built):
    assert not built.name.endswith("-none-any.whl"), built.name  # not pure Python: built for this ABI
    names = zipfile.ZipFile(built).namelist()
    abi = speedups.out_dir(Path("x")).name
    for m in speedups.MODULES:
        assert f"railcall/_speedups/{abi}/{m}{speedups.EXT_SUFFIX}" in names, m
    assert f"railcall/_speedups/{abi}/manifest.json" in names
    pxd = {p.relative_to(ROOT / "src").as_posix() for p in (ROOT / "src" / "railcall").rglob("*.pxd")}
    assert pxd and pxd <= set(names)  # the declarations ship: a rebuild from the installed package reads them
    assert not [n for n in names if n.endswith(".lock") or "/work/" in n]


def test_the_installed_wheel_runs_compiled_and_writes_nothing_outside_site_packages(bare, tmp_path):
    import json

    venv, site, home = bare
    before = _files(venv, site)
    r = subprocess.run([str(venv / "bin" / "python"), "-c", USE], capture_output=True, text=True, cwd=tmp_path,
                       env=_env(home), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["done"]
    assert Path(got["package"]).parent == site / "railcall"  # the wheel, not this checkout
    assert got["loaded"] == {m: "compiled" for m in speedups.MODULES}
    for m, f in got["files"].items():
        assert Path(f).parent.parent == site / "railcall" / "_speedups", (m, f)
    assert got["describe"].startswith(f"{len(speedups.MODULES)} of {len(speedups.MODULES)} modules compiled")
    cli = subprocess.run([str(venv / "bin" / "railcall"), "speedups", "status"], capture_output=True, text=True,
                         cwd=tmp_path, env=_env(home), timeout=300)
    assert cli.returncode == 0 and "modules compiled" in cli.stdout, cli.stdout + cli.stderr
    assert _files(venv, site) == before


def test_the_installed_wheel_runs_its_source_under_railcall_pure(bare, tmp_path):
    import json

    venv, site, home = bare
    r = subprocess.run([str(venv / "bin" / "python"), "-c", USE], capture_output=True, text=True, cwd=tmp_path,
                       env={**_env(home), "RAILCALL_PURE": "1"}, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["done"] and set(got["loaded"].values()) == {"source"}
    assert all(Path(f).suffix == ".py" and site in Path(f).parents for f in got["files"].values())


def test_uninstall_leaves_nothing_behind(bare):
    venv, site, home = bare
    r = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "uninstall", "-y", "-q", "railcall"],
                       capture_output=True, text=True, env=_env(home), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert not [p for p in site.iterdir() if p.name.lower().startswith("railcall")]
