"""The Cython-compiled engine modules: used only while built from the source on disk, and
indistinguishable from that source in what they compute."""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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


def _fake_build(root: Path, mods, text: bytes = b"built") -> dict:
    """Sources for `mods` under `root`, a stand-in extension for each in the build folder, and
    the manifest a build of them would write."""
    out = speedups.out_dir(root)
    out.mkdir(parents=True, exist_ok=True)
    record = {}
    for m in mods:
        p = speedups.source_path(m, root)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"# {m}\n")
        f = out / (m + speedups.EXT_SUFFIX)
        f.write_bytes(text + m.encode())
        record[m] = {"source": speedups.file_hash(p), "fingerprint": "-", "file": f.name, "sha256": speedups.file_hash(f)}
    manifest = {"cython": "3.3.1", "abi": speedups.EXT_SUFFIX, "modules": record}
    speedups.manifest_path(root).write_text(json.dumps(manifest))
    return manifest


def test_plan_tells_current_stale_and_unbuilt_modules(tmp_path):
    mods = speedups.MODULES[:5]
    manifest = _fake_build(tmp_path, mods)
    assert speedups.read_manifest(speedups.manifest_path(tmp_path)) == manifest
    assert speedups.plan(manifest, tmp_path) == (list(mods), [])
    del manifest["modules"][mods[4]]  # built, but not recorded by this build: not trusted
    (speedups.out_dir(tmp_path) / (mods[3] + speedups.EXT_SUFFIX)).unlink()  # its extension gone
    assert speedups.plan(manifest, tmp_path) == (list(mods[:3]), [])
    speedups.source_path(mods[1], tmp_path).write_text("# edited\n")
    (speedups.out_dir(tmp_path) / (mods[2] + speedups.EXT_SUFFIX)).write_bytes(b"replaced")
    assert speedups.plan(manifest, tmp_path) == ([mods[0]], [mods[1], mods[2]])
    speedups.source_path(mods[0], tmp_path).unlink()  # a source gone: not trusted either
    assert speedups.plan(manifest, tmp_path) == ([], [mods[0], mods[1], mods[2]])
    assert speedups.plan(manifest, tmp_path, pure=True) == ([], [])
    assert speedups.plan({}, tmp_path) == ([], [])


def test_a_module_built_against_declarations_follows_them(tmp_path):
    """A module whose .pxd cimports another's (its extension type extends theirs) is compiled
    from its .py, its .pxd and what it cimports: an edit of any of them makes it stale, and it
    runs compiled only where they do."""
    base, mid, top = "railcall.matcher.content_keys", "railcall.matcher.completion", "railcall.matcher.automaton"
    plain = "railcall.vocab"
    manifest = _fake_build(tmp_path, [plain, base, mid, top])
    declare = {base: "cdef class ContentKeyBuilder:\n    pass\n",
               mid: f"from {base} cimport ContentKeyBuilder\n\n"
                    "cdef class ForcedCompletions(ContentKeyBuilder):\n    pass\n",
               top: f"from {mid} cimport ForcedCompletions\n\ncdef class Automaton(ForcedCompletions):\n    pass\n"}
    for m, text in declare.items():
        speedups.declarations_path(m, tmp_path).write_text(text)
    assert speedups.cimports(top, tmp_path) == [mid] and speedups.cimports(plain, tmp_path) == []
    # without declarations a module's source hash is its file's (builds before them stay valid)
    assert speedups.source_hash(plain, tmp_path) == speedups.file_hash(speedups.source_path(plain, tmp_path))
    assert speedups.source_hash(base, tmp_path) != speedups.file_hash(speedups.source_path(base, tmp_path))
    for m in (base, mid, top):
        manifest["modules"][m]["source"] = speedups.source_hash(m, tmp_path)
    mods = [m for m in speedups.MODULES if m in manifest["modules"]]
    assert speedups.plan(manifest, tmp_path) == (mods, [])

    before = {m: speedups.source_hash(m, tmp_path) for m in mods}
    speedups.source_path(base, tmp_path).write_text("# the base, edited\n")
    after = {m: speedups.source_hash(m, tmp_path) for m in mods}
    assert [m for m in mods if before[m] != after[m]] == [top, mid, base]  # MODULES order
    assert speedups.plan(manifest, tmp_path) == ([plain], [top, mid, base])

    speedups.source_path(base, tmp_path).write_text(f"# {base}\n")  # as built again
    speedups.declarations_path(mid, tmp_path).write_text(declare[mid] + "    # edited\n")
    assert speedups.plan(manifest, tmp_path) == ([plain, base], [top, mid])

    speedups.declarations_path(mid, tmp_path).write_text(declare[mid])
    (speedups.out_dir(tmp_path) / (base + speedups.EXT_SUFFIX)).unlink()  # the base's extension gone
    assert speedups.plan(manifest, tmp_path) == ([plain], [top, mid])


def test_a_manifest_for_another_interpreter_is_not_read(tmp_path):
    manifest = _fake_build(tmp_path, speedups.MODULES[:2])
    manifest["abi"] = ".cpython-39-x86_64-linux-gnu.so"
    speedups.manifest_path(tmp_path).write_text(json.dumps(manifest))
    assert speedups.read_manifest(speedups.manifest_path(tmp_path)) == {}
    speedups.manifest_path(tmp_path).write_text("{not json")
    assert speedups.read_manifest(speedups.manifest_path(tmp_path)) == {}


def _copy_checkout(tmp_path: Path, with_build: bool) -> Path:
    """This checkout's railcall package (and its build, if asked) under tmp_path; returns the
    source folder to put on PYTHONPATH."""
    src = tmp_path / "src"
    shutil.copytree(SRC / "railcall", src / "railcall", ignore=shutil.ignore_patterns("__pycache__", "*.so", "_speedups.json"))
    if with_build and speedups.out_dir().is_dir():
        shutil.copytree(speedups.out_dir(), speedups.out_dir(src))
    return src


_IMPORT_KEYS = (
    "import importlib, json, warnings\n"
    "with warnings.catch_warnings(record=True) as w:\n"
    "    warnings.simplefilter('always')\n"
    "    import railcall\n"
    "from railcall import speedups\n"
    "mod = importlib.import_module('railcall.matcher.content_keys')\n"
    "print(json.dumps({'stale': speedups.status()['stale'], 'file': mod.__file__,\n"
    "                  'edited': getattr(mod, 'EDITED_AFTER_THE_BUILD', False),\n"
    "                  'loaded': speedups.status()['loaded'],\n"
    "                  'warnings': [str(x.message) for x in w if x.category is speedups.SpeedupsWarning]}))\n"
)


def test_an_edited_module_runs_from_its_source_with_a_warning(tmp_path):
    """A checkout whose source changed after the build: the guard loads the edit, not the
    extension built from the source before it, and says to rebuild; the rest stays compiled."""
    root = _copy_checkout(tmp_path, with_build=True)
    edited = "railcall.matcher.content_keys"
    if speedups.extension_path(edited, root) is None:  # no build here: a stand-in, never to be imported
        _fake_build(root, [edited])
        speedups.source_path(edited, root).write_bytes(speedups.source_path(edited).read_bytes())
        man = json.loads(speedups.manifest_path(root).read_text())
        man["modules"][edited]["source"] = speedups.source_hash(edited, root)
        speedups.manifest_path(root).write_text(json.dumps(man))
    with speedups.source_path(edited, root).open("a") as f:
        f.write("\nEDITED_AFTER_THE_BUILD = True\n")
    r = _run(_IMPORT_KEYS, pure=False, pythonpath=root)
    # the modules compiled against its declarations (their classes extend its ContentKeyBuilder, or
    # read the automaton's fields) go back to their source with it: an extension type cannot extend
    # a Python class
    built_on_it = {"railcall.matcher.automaton", "railcall.matcher.completion", "railcall.matcher.legal",
                   "railcall.matcher.matcher", "railcall.matcher.transitions"}
    assert r["stale"] == [m for m in speedups.MODULES if m == edited or (m in built_on_it and speedups.status()["compiled"])]
    assert r["edited"] is True and r["file"].endswith(".py")
    assert len(r["warnings"]) == 1 and all(m in r["warnings"][0] for m in r["stale"]) and "make setup" in r["warnings"][0]
    assert {r["loaded"][m] for m in r["stale"] if m in r["loaded"]} == {"source"}
    others = {m: how for m, how in r["loaded"].items() if m not in r["stale"]}
    assert set(others.values()) == ({"compiled"} if speedups.status()["compiled"] else {"source"})


def test_an_extension_beside_the_source_is_never_imported(tmp_path):
    """An older layout put extensions beside their .py, where Python imports them ahead of the
    source whatever the source says. railcall loads only what its manifest vouches for: a
    corrupt extension left there does not stop the import."""
    root = _copy_checkout(tmp_path, with_build=False)
    p = speedups.source_path("railcall.matcher.content_keys", root)
    p.with_name(p.stem + speedups.EXT_SUFFIX).write_bytes(b"not an extension")
    r = _run(_IMPORT_KEYS, pure=False, pythonpath=root)
    assert r["file"] == str(p) and r["stale"] == [] and r["warnings"] == []


def test_clean_removes_every_build_and_older_layouts(tmp_path):
    _fake_build(tmp_path, speedups.MODULES[:2])
    other = speedups.build_root(tmp_path) / "cpython-39-x86_64-linux-gnu"
    other.mkdir()
    (other / "manifest.json").write_text("{}")
    keys = speedups.source_path("railcall.matcher.content_keys", tmp_path)
    keys.parent.mkdir(parents=True, exist_ok=True)
    keys.write_text("")
    legacy = [keys.with_name("content_keys.cpython-311-x86_64-linux-gnu.so"),
              keys.with_name("content_keys.cpython-39-darwin.so"),
              tmp_path / "railcall" / "_speedups.json"]
    for f in legacy:
        f.write_bytes(b"")
    gone = speedups.clean(tmp_path)
    assert set(gone) == set(legacy) | {speedups.out_dir(tmp_path), other}
    assert not any(f.exists() for f in gone) and keys.exists()
    assert [f.name for f in speedups.build_root(tmp_path).iterdir()] == [".lock"]


def test_builds_and_cleans_take_turns(tmp_path):
    """A build holds an exclusive lock on build/speedups/.lock: another process waits for it."""
    probe = ("import fcntl, sys\n"
             "f = open(sys.argv[1], 'a+')\n"
             "try:\n    fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)\n    print('free')\n"
             "except BlockingIOError:\n    print('held')\n")
    lock = str(speedups.build_root(tmp_path) / ".lock")

    def other() -> str:
        return subprocess.run([sys.executable, "-c", probe, lock], capture_output=True, text=True).stdout.strip()

    with speedups._locked(speedups.build_root(tmp_path)):
        assert other() == "held"
    assert other() == "free"


def test_a_module_without_its_source_is_a_clear_import_error(tmp_path):
    finder = speedups._Finder({}, {"railcall.gone": tmp_path / "gone.py"})
    with pytest.raises(ModuleNotFoundError, match="has no source at .*gone.py.*restore it"):
        finder.find_spec("railcall.gone")
    assert finder.find_spec("json") is None


def test_describe_names_the_cython_that_built_the_modules(monkeypatch):
    monkeypatch.setitem(speedups._status, "pure", False)
    monkeypatch.setitem(speedups._status, "compiled", list(speedups.MODULES[:3]))
    monkeypatch.setitem(speedups._status, "stale", [speedups.MODULES[4]])
    monkeypatch.setitem(speedups._status, "cython", "9.8.7")
    assert speedups.describe() == f"3 of {len(speedups.MODULES)} modules compiled by Cython 9.8.7, 1 stale"


TINY = "def answer():\n    return 41 + 1\n"


def test_build_goes_by_content_and_installs_only_what_loads(tmp_path):
    """A real build of a one-module package: recompiled when its source changes (even to an
    older file time), not when nothing changed, and not installed when it cannot load."""
    root = tmp_path / "src"
    src = root / "tinypkg" / "tiny.py"
    src.parent.mkdir(parents=True)
    (src.parent / "__init__.py").write_text("")
    src.write_text(TINY)
    mods = ("tinypkg.tiny",)
    said = []
    assert speedups.build(jobs=1, root=root, modules=mods, progress=said.append) == list(mods)
    # every stage and each module's compile is said as it ends: a build of 18 takes minutes
    assert said[0] == "compiling 1 of 1 modules (1 at a time): tinypkg.tiny", said
    assert said[1].startswith("Cython wrote the C source of 1 modules (")
    assert re.fullmatch(r"\[1/1\] tinypkg\.tiny compiled \(\d+\.\d s\)", said[2]), said
    assert said[3] == "loading each new module once in a fresh interpreter"
    man = json.loads(speedups.manifest_path(root).read_text())
    e = man["modules"]["tinypkg.tiny"]
    ext = speedups.out_dir(root) / e["file"]
    assert man["abi"] == speedups.EXT_SUFFIX and e["sha256"] == speedups.file_hash(ext)
    assert e["source"] == speedups.file_hash(src)
    first = ext.stat().st_mtime_ns

    said.clear()
    assert speedups.build(jobs=1, root=root, modules=mods, progress=said.append) == []  # current: nothing compiled
    assert said == []
    assert ext.stat().st_mtime_ns == first

    old = src.stat()
    src.write_text(TINY.replace("41", "40"))
    os.utime(src, ns=(old.st_atime_ns - 10**12, old.st_mtime_ns - 10**12))  # older than anything built
    assert speedups.build(jobs=1, root=root, modules=mods) == list(mods)
    good = json.loads(speedups.manifest_path(root).read_text())
    assert good["modules"]["tinypkg.tiny"]["source"] == speedups.file_hash(src)

    src.write_text("import cython\nif cython.compiled:\n    raise ImportError('refuses to run compiled')\n")
    with pytest.raises(RuntimeError, match="(?s)failed to load.*refuses to run compiled"):
        speedups.build(jobs=1, root=root, modules=mods)
    assert json.loads(speedups.manifest_path(root).read_text()) == good  # the last good build, untouched
    assert speedups.file_hash(ext) == good["modules"]["tinypkg.tiny"]["sha256"]


BASE = "class Base:\n    def __init__(self):\n        self.n = 40\n\n    def more(self, k):\n        return self.n + k\n"
BASE_PXD = "cdef class Base:\n    cdef public object n\n    cpdef object more(self, object k)\n"
TOP = "from tinypkg.base import Base\n\n\nclass Top(Base):\n    def answer(self):\n        return self.more(2)\n"
TOP_PXD = "from tinypkg.base cimport Base\n\ncdef class Top(Base):\n    pass\n"
LOAD_TOP = r"""
import importlib.util, json, sys
manifest, out = json.loads(open(sys.argv[1]).read()), sys.argv[2]

class Built:  # the build's extensions, as railcall's guard finds its own
    def find_spec(self, name, path=None, target=None):
        e = manifest["modules"].get(name)
        return importlib.util.spec_from_file_location(name, f"{out}/{e['file']}") if e else None

sys.meta_path.insert(0, Built())
from tinypkg.top import Top
print(json.dumps({"answer": Top().answer(), "extension type": not Top.__flags__ & (1 << 9)}))  # not a heap type
"""


def test_a_build_with_declarations_compiles_and_loads_each_module_against_the_other(tmp_path, monkeypatch):
    """A real build of two modules, one extending the other's extension type (top.pxd cimports
    base.pxd): both compile; an edit of the base rebuilds both; an edit of the top rebuilds it
    alone, and it loads against the base's current extension."""
    root = tmp_path / "src"
    pkg = root / "tinypkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    for name, text in (("base.py", BASE), ("base.pxd", BASE_PXD), ("top.py", TOP), ("top.pxd", TOP_PXD)):
        (pkg / name).write_text(text)
    mods = ("tinypkg.base", "tinypkg.top")
    assert speedups.build(jobs=1, root=root, modules=mods) == list(mods)
    (pkg / "base.py").write_text(BASE.replace("40", "39"))
    assert speedups.build(jobs=1, root=root, modules=mods) == list(mods)
    (pkg / "top.py").write_text(TOP.replace("more(2)", "more(3)"))
    assert speedups.build(jobs=1, root=root, modules=mods) == ["tinypkg.top"]
    assert speedups.build(jobs=1, root=root, modules=mods) == []

    monkeypatch.setattr(speedups, "MODULES", mods)
    assert speedups.plan(speedups.read_manifest(speedups.manifest_path(root)), root) == (list(mods), [])
    out = subprocess.run([sys.executable, "-c", LOAD_TOP, str(speedups.manifest_path(root)), str(speedups.out_dir(root))],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(root)}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"answer": 42, "extension type": True}  # 39 + 3: both edits compiled


# Inputs nested far deeper than any limit: the compiled build does not count recursion, so each
# must meet an explicit limit (or a loop) and fail the same way from source and compiled.
HOSTILE = r"""
import json, sys
from railcall import speedups
from railcall.grammar import ir
from railcall.grammar.regex import parse
from railcall.grammar.program import compile_grammar
from railcall.grammar.schema import schema_grammar, schema_to_ir

def deep(n, wrap, x):
    for _ in range(n):
        x = wrap(x)
    return x

N = 20_000
cases = {
    "properties": lambda: schema_to_ir(deep(N, lambda s: {"type": "object", "properties": {"a": s}}, {"type": "string"})),
    "unused $defs": lambda: schema_to_ir({"type": "string", "$defs": {"x": deep(N, lambda s: {"not": s}, {})}}),
    "allOf": lambda: schema_to_ir(deep(N, lambda s: {"allOf": [s]}, {"type": "string"})),
    "const": lambda: schema_to_ir({"const": deep(N, lambda s: [s], 1)}),
    "groups": lambda: parse("(" * 400 + "a" + ")" * 400),
    "quantifiers": lambda: parse("a" + "{1}" * 400),
    # each group's quantifiers within the limit where it stands, ~2,000 levels along one path
    "groups and quantifiers": lambda: parse("(" * 63 + "a" + "".join(")" + "{1}" * (2 + j) for j in range(63))),
    "pattern": lambda: schema_to_ir({"type": "string", "pattern": "(" * 400 + "a" + ")" * 400}),
    "IR": lambda: ir.Grammar(deep(N, lambda n: ir.Seq((ir.Lit(b"a"), n)), ir.Lit(b"b"))),
    # a Grammar given its own key skips the content hash (and its recursion): compiling must bound it
    "IR with a key": lambda: compile_grammar(
        ir.Grammar(deep(N, lambda n: ir.JsonArray(n, 0, 2), ir.JsonString(0, 3)), key="k"), {}, max_string=256),
    "rules with a key": lambda: compile_grammar(ir.Grammar(ir.Ref("r"), rules=(
        ("r", deep(N, lambda n: ir.Alt(ir.Lit(b"a"), n), ir.Lit(b"b"))),), key="k"), {}, max_string=256),
    # wide, not deep: 5,000 properties are a loop
    "wide object": lambda: compile_grammar(schema_grammar(
        {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(5000)}}), {}, max_string=256),
}
out = {}
for name, f in cases.items():
    try:
        f()
        out[name] = "ok"
    except Exception as e:
        out[name] = f"{type(e).__name__}: {str(e)[:60]} ... {str(e)[-160:]}"  # the pointer can be long
print(json.dumps({"outcomes": out, "build": speedups.describe()}))
"""


def test_hostile_nesting_fails_the_same_compiled_and_from_source():
    pure = _run(HOSTILE, pure=True)
    built = _run(HOSTILE, pure=False)
    assert pure["outcomes"] == built["outcomes"]
    got = pure["outcomes"]
    assert got["unused $defs"] == "ok"  # never compiled, so never too deep
    for name in ("properties", "allOf", "const", "pattern"):
        assert got[name].startswith("SchemaError"), (name, got[name])
    assert "max_depth" in got["properties"] or "deeper than" in got["properties"]
    assert got["IR"].startswith("GrammarError") and "nests too deeply" in got["IR"]
    for name in ("IR with a key", "rules with a key"):
        assert got[name].startswith("GrammarError") and "more than 400 levels" in got[name], (name, got[name])
    assert got["wide object"] == "ok"
    for name in ("groups", "quantifiers", "groups and quantifiers"):
        assert got[name].startswith("RegexError") and "nested more than 64 deep" in got[name]


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
