"""The Cython-compiled engine modules: used only while built from the source on disk, and
indistinguishable from that source in what they compute."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from railcall import speedups

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src"

# A walk through random tool tables on the byte-level vocabulary, printed as one digest of every
# mask, forced-token list and finish output, with the build it ran on.
WALK = r"""
import hashlib, json, random, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from conftest import byte_level_vocab
from toolgen import pick_token, random_tools
from railcall import speedups
from railcall.bitmask import allocate_bitmask, unpack_bitmask
from railcall.grammar.tools import tool_grammar
from railcall.matcher import Matcher, compiled_grammar

vocab = byte_level_vocab()
h = hashlib.sha256()
for seed in range(12):
    rng = random.Random(seed)
    g = compiled_grammar(tool_grammar(random_tools(rng)), vocab)
    for walk in range(3):
        m = Matcher(g)
        bm = allocate_bitmask(vocab.logits_width)
        for step in range(60):
            n = m.fill_bitmask(bm)
            h.update(bm.tobytes() + n.to_bytes(4, "little"))
            h.update(repr(m.forced_tokens()).encode())
            if m.is_done():
                break
            legal = np.flatnonzero(unpack_bitmask(bm, vocab.logits_width))
            assert m.consume_token(pick_token(rng, legal, vocab, vocab.stop_ids))
        if not m.is_done():
            h.update(repr(m.finish()).encode())
print(json.dumps({"digest": h.hexdigest(), "build": speedups.describe(),
                  "loaded": speedups.status()["loaded"]}))
"""


def _run(script: str, *args: str, pure: bool, pythonpath: Path = SRC) -> dict:
    env = {**os.environ, "RAILCALL_PURE": "1" if pure else "0", "PYTHONPATH": str(pythonpath)}
    out = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_modules_load_as_the_build_says():
    """Each engine module runs compiled exactly when its build matches its source (and
    RAILCALL_PURE is not set); otherwise from its .py."""
    st = speedups.status()
    for m in speedups.MODULES:
        mod = importlib.import_module(m)
        compiled = not mod.__file__.endswith(".py")
        assert compiled == (m in st["compiled"]), (m, mod.__file__, st)
    assert not st["stale"], "the compiled build is older than the source: run `make setup`"


def test_compiled_and_source_compute_the_same_masks():
    """The same random walks, masks, forced tokens and finishes, compiled and from source."""
    pure = _run(WALK, str(TESTS), pure=True)
    built = _run(WALK, str(TESTS), pure=False)
    assert set(pure["loaded"].values()) == {"source"} and pure["build"] == "Python source (RAILCALL_PURE=1)"
    assert set(built["loaded"].values()) == ({"compiled"} if speedups.status()["compiled"] else {"source"})
    assert pure["digest"] == built["digest"]


def test_plan_tells_current_stale_and_unbuilt_modules(tmp_path):
    import importlib.machinery

    mods = speedups.MODULES[:4]
    for m in mods:
        p = speedups.source_path(m, tmp_path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"# {m}\n")
        if m != mods[2]:  # an extension (a stand-in) beside every source but one
            p.with_name(p.stem + importlib.machinery.EXTENSION_SUFFIXES[0]).write_bytes(b"")
    manifest = {"modules": {m: speedups.source_hash(speedups.source_path(m, tmp_path)) for m in mods}}
    del manifest["modules"][mods[3]]  # built beside, but not by this build: not trusted
    assert speedups.plan(manifest, tmp_path) == (list(mods[:2]), [])  # mods[2]: its extension is gone
    speedups.source_path(mods[1], tmp_path).write_text("# edited\n")
    assert speedups.plan(manifest, tmp_path) == ([mods[0]], [mods[1]])
    speedups.source_path(mods[0], tmp_path).unlink()  # a source gone: not trusted either
    assert speedups.plan(manifest, tmp_path) == ([], [mods[0], mods[1]])
    assert speedups.plan(manifest, tmp_path, pure=True) == ([], [])
    assert speedups.plan({}, tmp_path) == ([], [])


def test_an_edited_module_runs_from_its_source_with_a_warning(tmp_path):
    """A checkout whose source changed after the build: Python would import the extension left
    beside the edited .py; the guard loads the edit instead and says to rebuild."""
    shutil.copytree(SRC / "railcall", tmp_path / "railcall", ignore=shutil.ignore_patterns("__pycache__"))
    root = tmp_path
    edited = "railcall.matcher.keys"
    if speedups.extension_path(edited, root) is None:  # no build here: an empty stand-in, never to be imported
        import importlib.machinery

        p = speedups.source_path(edited, root)
        p.with_name(p.stem + importlib.machinery.EXTENSION_SUFFIXES[0]).write_bytes(b"")
    # the manifest as a build of this source would leave it, for the modules built here
    hashes = {m: speedups.source_hash(speedups.source_path(m, root)) for m in speedups.MODULES
              if speedups.extension_path(m, root) is not None}
    (root / "railcall" / "_speedups.json").write_text(json.dumps({"cython": "test", "modules": hashes}))
    with speedups.source_path(edited, root).open("a") as f:
        f.write("\nEDITED_AFTER_THE_BUILD = True\n")
    script = (
        "import importlib, json, warnings\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    import railcall\n"
        "from railcall import speedups\n"
        f"mod = importlib.import_module({edited!r})\n"
        "print(json.dumps({'stale': speedups.status()['stale'], 'file': mod.__file__,\n"
        "                  'edited': getattr(mod, 'EDITED_AFTER_THE_BUILD', False),\n"
        "                  'warnings': [str(x.message) for x in w if x.category is speedups.SpeedupsWarning]}))\n"
    )
    r = _run(script, pure=False, pythonpath=root)
    assert r["stale"] == [edited]
    assert r["edited"] is True and r["file"].endswith(".py")
    assert len(r["warnings"]) == 1 and edited in r["warnings"][0] and "make setup" in r["warnings"][0]


def test_cli_status_and_a_bad_action():
    from typer.testing import CliRunner

    from railcall.cli import app

    r = CliRunner().invoke(app, ["speedups", "status"])
    assert r.exit_code == 0 and speedups.describe() in r.output
    r = CliRunner().invoke(app, ["speedups", "rebuild"])
    assert r.exit_code == 2 and "unknown action 'rebuild'" in r.output and "build, clean or status" in r.output


def test_a_build_without_cython_says_what_is_missing(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "Cython", None)  # import Cython now raises ImportError
    monkeypatch.setitem(sys.modules, "Cython.Build", None)
    assert speedups.main(["build"]) == 1
    err = capsys.readouterr().err
    assert "needs Cython and setuptools" in err and "pip install -e '.[speedups]'" in err and "Python source" in err
