"""The engine's modules compiled to C extensions by Cython, from their unchanged Python source.

The modules in MODULES (the grammar compiler, the vocabulary and the matcher: everything a
compile, a mask or a step of consume_token runs through) are plain Python. `make setup` compiles
them, as they are, with Cython (`railcall speedups build`): the same code with the
interpreter's dispatch taken out. On SmolLM2's vocabulary with 128 tools that cut the mask p99 by
about a quarter, consume_token's p50 by a quarter and the cold compile by a quarter (`make bench`
runs both, as `railcall` and `railcall-py`). Nothing here changes what the code does, and the
Python source stays the reference: without a C compiler, or with RAILCALL_PURE=1, railcall runs
it directly.

A compiled module is used only while the source it was compiled from is the source on disk: the
build records each module's source hash in MANIFEST, and `guard()` (run when railcall is
imported, before any of these modules is) loads the Python source of any module whose source has
changed since, with a warning to rebuild. Python would otherwise import the stale extension,
which sits beside the .py and takes precedence over it.

Built once per checkout; the extensions are ignored by git.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import shutil
import sys
import warnings
from pathlib import Path

# The compiled modules. Package __init__ files are not compiled (nothing runs in them per step).
MODULES = (
    "railcall.vocab",
    "railcall.regions",
    "railcall.grammar.ir",
    "railcall.grammar.program",
    "railcall.grammar.regex",
    "railcall.grammar.schema",
    "railcall.grammar.tools",
    "railcall.matcher.automaton",
    "railcall.matcher.completion",
    "railcall.matcher.entries",
    "railcall.matcher.indexes",
    "railcall.matcher.keys",
    "railcall.matcher.matcher",
)
SRC = Path(__file__).resolve().parent.parent  # the folder holding the railcall package
MANIFEST = SRC / "railcall" / "_speedups.json"
# Cython compiles with these. annotation_typing off: a type annotation is documentation here, as
# in Python, never a C type or a runtime check, so the compiled code behaves as the source does.
DIRECTIVES = {"language_level": 3, "annotation_typing": False}


class SpeedupsWarning(UserWarning):
    """A compiled module is older than its source; its Python source runs instead."""


def source_path(module: str, root: Path = SRC) -> Path:
    return root.joinpath(*module.split(".")).with_suffix(".py")


def source_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_manifest(path: Path = MANIFEST) -> dict:
    """The build's record ({"cython": version, "modules": {module: source hash}}), or {} when
    there is none or it cannot be read (then nothing compiled is trusted)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) and isinstance(data.get("modules"), dict) else {}


def extension_path(module: str, root: Path = SRC) -> Path | None:
    """The compiled module this interpreter would import for `module`, if there is one."""
    p = source_path(module, root)
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        f = p.with_name(p.stem + suffix)
        if f.exists():
            return f
    return None


def plan(manifest: dict, root: Path = SRC, pure: bool = False) -> tuple[list[str], list[str]]:
    """(compiled, stale): the modules whose compiled build matches their source now, and those
    built from a source that has changed since. A module the manifest does not name, or whose
    extension this interpreter cannot find (removed, or built for another Python), is neither:
    it runs from source."""
    if pure:
        return [], []
    built = manifest.get("modules", {})
    compiled, stale = [], []
    for m in MODULES:
        h = built.get(m)
        if h is None or extension_path(m, root) is None:
            continue
        try:
            same = source_hash(source_path(m, root)) == h
        except OSError:
            same = False
        (compiled if same else stale).append(m)
    return compiled, stale


class _SourceFinder:
    """Finds the listed modules as their .py source, ahead of an extension module beside it."""

    def __init__(self, modules: dict[str, Path]):
        self.modules = modules

    def find_spec(self, name, path=None, target=None):
        p = self.modules.get(name)
        if p is None or not p.exists():
            return None
        return importlib.util.spec_from_file_location(name, p, loader=importlib.machinery.SourceFileLoader(name, str(p)))


_status: dict = {"compiled": [], "stale": [], "pure": False}


def guard() -> None:
    """Make every module in MODULES load from its Python source unless its compiled build is
    current. Idempotent; called by `railcall/__init__` before it imports any of them."""
    if any(isinstance(f, _SourceFinder) for f in sys.meta_path):
        return
    pure = os.environ.get("RAILCALL_PURE", "") not in ("", "0")
    compiled, stale = plan(read_manifest(), pure=pure) if pure or MANIFEST.exists() else ([], [])
    _status.update(compiled=compiled, stale=stale, pure=pure)
    forced = {m: source_path(m) for m in MODULES if m not in compiled}
    sys.meta_path.insert(0, _SourceFinder(forced))
    if stale:
        warnings.warn(f"railcall: {len(stale)} compiled module(s) are older than their source ({', '.join(stale)}); "
                      "running the Python source for those. Rebuild with `make setup` "
                      "(or `railcall speedups build`).", SpeedupsWarning, stacklevel=3)


def status() -> dict:
    """Which modules run compiled: {"compiled": [...], "stale": [...], "pure": bool, "loaded": {module: "compiled"|"source"}}."""
    loaded = {}
    for m in MODULES:
        mod = sys.modules.get(m)
        if mod is not None:
            loaded[m] = "source" if str(getattr(mod, "__file__", "")).endswith(".py") else "compiled"
    return {**_status, "loaded": loaded}


def describe() -> str:
    """One line for reports: how railcall's engine runs in this process."""
    s = status()
    if s["pure"]:
        return "Python source (RAILCALL_PURE=1)"
    n = len(s["compiled"])
    if not n:
        return "Python source (no compiled build)"
    try:
        import Cython

        by = f"Cython {Cython.__version__}"
    except ImportError:
        by = "Cython"
    return f"{n} of {len(MODULES)} modules compiled by {by}" + (f", {len(s['stale'])} stale" if s["stale"] else "")


def build(jobs: int | None = None, root: Path = SRC) -> Path:
    """Compile MODULES in place (extensions beside their .py) and record their source hashes.
    Needs Cython, setuptools and a C compiler; raises with what is missing."""
    try:
        import Cython
        from Cython.Build import cythonize
        from setuptools import Distribution, Extension
    except ImportError as e:
        raise RuntimeError(f"building railcall's compiled modules needs Cython and setuptools ({e}); "
                           "install them with `pip install -e '.[speedups]'`, or run railcall from its Python source") from e
    from railcall.atomic import atomic_write

    jobs = jobs or os.cpu_count() or 1
    hashes = {m: source_hash(source_path(m, root)) for m in MODULES}  # before compiling: an edit during the build reads as stale
    build_dir = root.parent / "build"
    exts = [Extension(m, [str(source_path(m, root))]) for m in MODULES]
    exts = cythonize(exts, compiler_directives=DIRECTIVES, build_dir=str(build_dir / "cython"), nthreads=jobs, quiet=True)
    dist = Distribution({"ext_modules": exts, "script_name": "railcall-speedups"})
    cmd = dist.get_command_obj("build_ext")
    cmd.parallel = jobs
    cmd.build_temp = str(build_dir / "temp")
    cmd.build_lib = str(build_dir / "lib")
    cmd.ensure_finalized()
    cmd.run()
    for e in exts:
        # copied beside the target and renamed over it, never written into: a process that has
        # the old one loaded (this one, a running server) keeps a valid mapping of it. The copy
        # in build/ stays, so the next build recompiles only the modules whose source changed.
        built = Path(cmd.get_ext_fullpath(e.name))
        target = source_path(e.name, root).with_name(built.name)
        tmp = target.with_name(f"{target.name}.{os.getpid()}.new")
        shutil.copy2(built, tmp)
        os.replace(tmp, target)
    manifest = root / "railcall" / MANIFEST.name
    atomic_write(manifest, json.dumps({"cython": Cython.__version__, "modules": hashes}, indent=1) + "\n")
    return manifest


def clean(root: Path = SRC) -> list[Path]:
    """Remove the compiled modules and the manifest; railcall then runs from source."""
    gone = []
    for m in MODULES:
        f = extension_path(m, root)
        while f is not None:
            f.unlink()
            gone.append(f)
            f = extension_path(m, root)
    man = root / "railcall" / MANIFEST.name
    if man.exists():
        man.unlink()
        gone.append(man)
    return gone


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["build"]:
        try:
            path = build()
        except Exception as e:  # noqa: BLE001 - a failed build leaves railcall on its Python source
            print(f"railcall: the compiled build failed ({type(e).__name__}: {e}); railcall runs from its Python source, "
                  "which is correct but slower. A C compiler and the Python headers are needed.", file=sys.stderr)
            return 1
        print(f"railcall: compiled {len(MODULES)} modules; manifest {path}")
        return 0
    if args[:1] == ["clean"]:
        for p in clean():
            print(f"removed {p}")
        return 0
    if args[:1] == ["status"]:
        print(describe())
        return 0
    print("usage: railcall speedups build|clean|status", file=sys.stderr)
    return 2
