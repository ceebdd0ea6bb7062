"""The engine's modules compiled to C extensions by Cython, from their unchanged Python source.

The modules in MODULES (the grammar compiler, the vocabulary and the matcher: everything a
compile, a mask or a step of consume_token runs through) are plain Python. `make setup` compiles
them, as they are, with Cython (`railcall speedups build`): the same code with the
interpreter's dispatch taken out. On SmolLM2's vocabulary with 128 tools that cut the mask p99 by
about a quarter, consume_token's p50 by a quarter and the cold compile by a quarter (`make bench`
runs both, as `railcall` and `railcall-py`). Nothing here changes what the code does, and the
Python source stays the reference: without a C compiler, or with RAILCALL_PURE=1, railcall runs
it directly.

Where the extensions live, and why. A build writes them outside the package, into
`build/speedups/<abi>/` beside `src/` (one folder per interpreter ABI, ignored by git), with a
manifest that records, per module, the source hash it was compiled from and the extension's
file name and sha256. Python never finds them there by itself: `guard()` (run when railcall is
imported, before any of these modules is) puts a finder first on sys.meta_path that loads a
module's extension only when the manifest says it was built from the source on disk and the
file is the one the build wrote; every other module loads from its .py, with a warning to
rebuild where a build exists but no longer matches. An extension beside its .py would instead be
imported by Python ahead of the source, by any checkout of any commit, whatever its source says.

An installed railcall keeps its build inside the package instead (`railcall/_speedups/<abi>/`,
same manifest, same finder): a wheel built by `pip wheel .` or `pip install` from the sdist
compiles the modules as part of its build (setup.py; a checkout's current build is copied, not
compiled again), so nothing is written outside site-packages and `pip uninstall` removes it all.
Where the wheel's build finds no C compiler it says so once and the wheel runs the source.

Rebuilds go by content, not by file times: each module's fingerprint is the hash of its source,
the Cython version, the compiler's settings and the ABI; a build recompiles the modules whose
fingerprint changed, and certifies nothing it has not loaded once in a fresh interpreter.

Declarations. The matcher's hot classes have a .pxd beside their .py (matcher/content_keys,
completion, transitions, legal, automaton, entries, matcher): read by the compiler only, it says
nothing about what the code does, only how it is laid out. The automaton and its four bases become
one extension type whose fields are C fields, and its hot methods (and the mask entries' helpers,
and a Matcher's per-token verbs) call each other directly (cpdef) rather than by name: on SmolLM2's
vocabulary with 128 tools that took a fifth of the instructions off the slowest first masks, a
third off the median one and an eighth off compile + prewarm. The .py stays the one place behaviour
is written, and RAILCALL_PURE=1 runs it as it is. One module asks which way it runs:
`matcher.transitions` walks the token trie node by node where it is compiled and by level in
numpy where it is not (`COMPILED`); the two walks give the same tokens (tests/test_token_trie.py
runs both). A module built against another's declarations
(the automaton extends its bases' types) has a source hash that covers theirs (`source_hash`), so
an edit of either rebuilds both, and it runs compiled only where they do (an extension type cannot
extend a class loaded from source).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.machinery
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
import warnings
from pathlib import Path
from typing import Callable

# The compiled modules. Package __init__ files are not compiled (nothing runs in them per step).
MODULES = (
    "railcall.vocab",
    "railcall.grammar.instructions",
    "railcall.grammar.ir",
    "railcall.grammar.numbers",
    "railcall.grammar.program",
    "railcall.grammar.regex",
    "railcall.grammar.schema",
    "railcall.grammar.strings",
    "railcall.grammar.tools",
    "railcall.matcher.automaton",
    "railcall.matcher.completion",
    "railcall.matcher.content_keys",
    "railcall.matcher.entries",
    "railcall.matcher.indexes",
    "railcall.matcher.turn",
    "railcall.matcher.legal",
    "railcall.matcher.matcher",
    "railcall.matcher.transitions",
)
SRC = Path(__file__).resolve().parent.parent  # the folder holding the railcall package
# What this interpreter's extensions end in (".cpython-312-x86_64-linux-gnu.so"): names the build
# folder, so interpreters of different ABIs sharing a checkout never load each other's builds.
EXT_SUFFIX = sysconfig.get_config_var("EXT_SUFFIX") or importlib.machinery.EXTENSION_SUFFIXES[0]
# Cython compiles with these. annotation_typing off: a type annotation is documentation here, as
# in Python, never a C type or a runtime check, so the compiled code behaves as the source does.
DIRECTIVES = {"language_level": 3, "annotation_typing": False}
# Without debug information the extensions are a sixth of the size (5.2 MB against 31 MB for the
# 13), and `guard()` reads every one of them to check its hash when railcall is imported.
COMPILE_ARGS = ["-g0"] if os.name == "posix" else []


class SpeedupsWarning(UserWarning):
    """A compiled module no longer matches its build record; its Python source runs instead."""


def build_root(root: Path = SRC) -> Path:
    """The folder every ABI's build lives under: in a checkout (the source folder beside
    pyproject.toml), `build/speedups` beside the source folder; in an installed package (a wheel,
    site-packages), `railcall/_speedups` inside the package, so a build stays in site-packages
    and `pip uninstall` takes it away."""
    if (root.parent / "pyproject.toml").is_file():
        return root.parent / "build" / "speedups"
    return root / "railcall" / "_speedups"


def out_dir(root: Path = SRC) -> Path:
    """This interpreter's build: its extensions and manifest."""
    return build_root(root) / EXT_SUFFIX.strip(".").rsplit(".", 1)[0]


def manifest_path(root: Path = SRC) -> Path:
    return out_dir(root) / "manifest.json"


def source_path(module: str, root: Path = SRC) -> Path:
    return root.joinpath(*module.split(".")).with_suffix(".py")


def file_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def declarations_path(module: str, root: Path = SRC) -> Path:
    """A module's Cython declarations (`content_keys.pxd` beside `content_keys.py`), where it has
    them: C types for its classes' fields and direct calls for their methods, read only by the
    compiler."""
    return source_path(module, root).with_suffix(".pxd")


_CIMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+cimport|cimport\s+([\w.]+))", re.M)


def cimports(module: str, root: Path = SRC) -> list[str]:
    """The modules whose declarations `module`'s take (`from railcall.matcher.content_keys
    cimport ContentKeyBuilder`): their extension types are laid out inside its own, so its
    extension is built against theirs and loads only beside them."""
    p = declarations_path(module, root)
    if not p.exists():
        return []
    found = {a or b for a, b in _CIMPORT.findall(p.read_text())}
    return sorted(m for m in found if source_path(m, root).exists())  # not Cython's own (`cimport cython`)


def source_hash(module: str, root: Path = SRC, memo: dict | None = None) -> str:
    """What a module's extension is compiled from: its .py alone (its file hash) where it has no
    declarations; otherwise its .py, its .pxd and, by their source hash, the modules it
    cimports, so that an edit of any of them rebuilds it. `memo` (module -> hash) keeps a
    caller hashing every module from hashing the shared ones again for each."""
    if memo is not None and module in memo:
        return memo[module]
    py = source_path(module, root)
    pxd = declarations_path(module, root)
    if not pxd.exists():
        digest = file_hash(py)
    else:
        h = hashlib.sha256()
        deps = [source_hash(m, root, memo).encode() for m in cimports(module, root)]
        for part in (py.read_bytes(), pxd.read_bytes(), *deps):
            h.update(hashlib.sha256(part).digest())
        digest = h.hexdigest()
    if memo is not None:
        memo[module] = digest
    return digest


def fingerprint(source_sha: str, cython_version: str) -> str:
    """What a module's extension depends on: its source, the compiler and its settings, the ABI.
    Equal fingerprints, equal extensions; a build recompiles a module whose fingerprint changed."""
    what = {"source": source_sha, "cython": cython_version, "directives": DIRECTIVES, "args": COMPILE_ARGS,
            "abi": EXT_SUFFIX}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()


def read_manifest(path: Path | None = None) -> dict:
    """The build's record, or {} when there is none, it cannot be read, or it is for another
    ABI (then nothing compiled is trusted):
    {"cython": version, "abi": EXT_SUFFIX, "modules": {module: {"source", "fingerprint", "file", "sha256"}}}."""
    try:
        data = json.loads((path or manifest_path()).read_text())
    except (OSError, ValueError):
        return {}
    if not (isinstance(data, dict) and isinstance(data.get("modules"), dict) and data.get("abi") == EXT_SUFFIX):
        return {}
    return data


def _entry(manifest: dict, module: str) -> dict | None:
    e = manifest.get("modules", {}).get(module)
    return e if isinstance(e, dict) and all(isinstance(e.get(k), str) for k in ("source", "file", "sha256")) else None


def extension_path(module: str, root: Path = SRC, manifest: dict | None = None) -> Path | None:
    """The extension the manifest records for `module`, if that file exists."""
    e = _entry(read_manifest(manifest_path(root)) if manifest is None else manifest, module)
    if e is None:
        return None
    f = out_dir(root) / e["file"]
    return f if f.exists() else None


def plan(manifest: dict, root: Path = SRC, pure: bool = False) -> tuple[list[str], list[str]]:
    """(compiled, stale): the modules whose recorded extension is there, is the file the build
    wrote (same sha256), and was built from their source as it is now; and those whose build no
    longer matches (the source edited, the extension replaced or corrupted). A module the
    manifest does not name, or whose extension is gone, is neither: it runs from source."""
    if pure:
        return [], []
    compiled, stale = [], []
    hashes: dict = {}
    for m in MODULES:
        e = _entry(manifest, m)
        f = out_dir(root) / e["file"] if e else None
        if f is None or not f.exists():
            continue
        try:
            same = source_hash(m, root, hashes) == e["source"] and file_hash(f) == e["sha256"]
        except OSError:
            same = False
        (compiled if same else stale).append(m)
    # a module built against another's extension types runs compiled only beside that one
    # (its source hash already covers theirs; this covers their extension gone or replaced)
    for m in list(compiled):
        if any(d in MODULES and d not in compiled for d in _all_cimports(m, root)):
            compiled.remove(m)
            stale.append(m)
    return compiled, [m for m in MODULES if m in stale]


def _all_cimports(module: str, root: Path) -> set[str]:
    """The modules `module` cimports, directly or through them."""
    out: set[str] = set()
    todo = [module]
    while todo:
        for d in cimports(todo.pop(), root):
            if d not in out:
                out.add(d)
                todo.append(d)
    return out


class _Finder:
    """Finds every module in MODULES: as its extension when the build is current, otherwise as
    its .py source (ahead of any extension an older layout left beside it)."""

    def __init__(self, compiled: dict[str, Path], source: dict[str, Path]):
        self.compiled = compiled
        self.source = source

    def find_spec(self, name, path=None, target=None):
        ext = self.compiled.get(name)
        if ext is not None:
            return importlib.util.spec_from_file_location(name, ext, loader=importlib.machinery.ExtensionFileLoader(name, str(ext)))
        p = self.source.get(name)
        if p is None:
            return None
        if not p.exists():
            raise ModuleNotFoundError(f"railcall's module {name} has no source at {p}: the checkout is incomplete "
                                      "(restore it with git, or reinstall railcall)", name=name)
        return importlib.util.spec_from_file_location(name, p, loader=importlib.machinery.SourceFileLoader(name, str(p)))


_status: dict = {"compiled": [], "stale": [], "pure": False, "cython": None}


def guard(root: Path = SRC) -> None:
    """Make every module in MODULES load from its Python source unless its compiled build is
    current. Idempotent; called by `railcall/__init__` before it imports any of them."""
    if any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    pure = os.environ.get("RAILCALL_PURE", "") not in ("", "0")
    manifest = {} if pure else read_manifest(manifest_path(root))
    compiled, stale = plan(manifest, root, pure=pure)
    _status.update(compiled=compiled, stale=stale, pure=pure, cython=manifest.get("cython"))
    d = out_dir(root)
    sys.meta_path.insert(0, _Finder({m: d / manifest["modules"][m]["file"] for m in compiled},
                                    {m: source_path(m, root) for m in MODULES if m not in compiled}))
    if stale:
        warnings.warn(f"railcall: {len(stale)} compiled module(s) no longer match their build "
                      f"({', '.join(stale)}: the source was edited, or the extension replaced); running the Python "
                      "source for those. Rebuild with `make setup` (or `railcall speedups build`).",
                      SpeedupsWarning, stacklevel=3)


def status() -> dict:
    """Which modules run compiled: {"compiled": [...], "stale": [...], "pure": bool, "cython":
    the build's Cython version or None, "loaded": {module: "compiled"|"source"}}."""
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
        return "Python source (no compiled build)" + (f", {len(s['stale'])} stale" if s["stale"] else "")
    return (f"{n} of {len(MODULES)} modules compiled by Cython {s['cython'] or '?'}"
            + (f", {len(s['stale'])} stale" if s["stale"] else ""))


@contextlib.contextmanager
def _locked(folder: Path):
    """One build or clean at a time per checkout: an exclusive lock on `folder/.lock`, waited
    for (two `make` runs at once would otherwise write the same files)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "a+") as f:
        try:
            import fcntl
        except ImportError:  # not POSIX: no lock to take
            yield
            return
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


# Run in a fresh interpreter on a candidate build: import every new extension once (its module
# body runs: imports, constants); what it cimports from the build (new or current), everything
# else from source (RAILCALL_PURE=1). A build that cannot load is not installed.
_SMOKE = r"""
import importlib, importlib.util, json, sys
built, current = json.loads(sys.argv[1]), json.loads(sys.argv[2])
where = {**current, **built}

class Built:  # the build's extensions ahead of their sources: one built against another's types needs it
    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_file_location(name, where[name]) if name in where else None

sys.meta_path.insert(0, Built())
for name in built:
    importlib.import_module(name)
"""


class _LoadFailed(RuntimeError):
    """A freshly compiled module did not load in a fresh interpreter."""


def build(jobs: int | None = None, root: Path = SRC, modules: tuple[str, ...] = MODULES,
          progress: Callable[[str], None] | None = None, work: Path | None = None,
          reuse: Path | None = None) -> list[str]:
    """Compile the modules whose fingerprint changed since the last build into `out_dir(root)`,
    load each once in a fresh interpreter, and record the build in the manifest; returns the
    modules compiled now (none when the build is current). Needs Cython, setuptools and a C
    compiler; raises with what is missing or what failed, leaving the last good build in place.

    `work`: where Cython's C files and the compiler's objects go (default: beside the build).
    `reuse`: another build's folder (a checkout's, when its wheel is built): a module whose
    extension there has the fingerprint this build wants is copied, not compiled again.

    `progress` is told each stage as it ends, and each module as its C compile ends, with the
    seconds it took: the C compiler is most of a build (about 2.5 minutes for all 13 on 2 cores;
    Cython's translation to C takes about a second a module)."""
    say = progress or (lambda line: None)
    try:
        import Cython
        from Cython.Build import cythonize
        from setuptools import Distribution, Extension
        from setuptools.command.build_ext import build_ext
    except ImportError as e:
        raise RuntimeError(f"building railcall's compiled modules needs Cython and setuptools ({e}); "
                           "install them with `pip install -e '.[speedups]'`, or run railcall from its Python source") from e
    from railcall.atomic import atomic_write

    jobs = jobs or os.cpu_count() or 1
    out = out_dir(root)
    work = work or build_root(root) / "work"  # Cython's C files and the compiler's objects, kept between builds
    with _locked(build_root(root)):
        old = read_manifest(manifest_path(root))
        cache = read_manifest(reuse / "manifest.json") if reuse is not None else {}
        record: dict = {}
        todo = []
        hashes: dict = {}
        for m in modules:
            src_sha = source_hash(m, root, hashes)  # before compiling: an edit during the build reads as stale
            fp = fingerprint(src_sha, Cython.__version__)
            e = _entry(old, m)
            f = out / e["file"] if e else None
            if e and e.get("fingerprint") == fp and f.exists() and file_hash(f) == e["sha256"]:
                record[m] = e
                continue
            c = _entry(cache, m)
            g = reuse / c["file"] if c else None
            if c and c.get("fingerprint") == fp and g.exists() and file_hash(g) == c["sha256"]:
                out.mkdir(parents=True, exist_ok=True)
                shutil.copy2(g, out / c["file"])
                record[m] = dict(c)
                continue
            record[m] = {"source": src_sha, "fingerprint": fp}
            todo.append(m)
        if todo:
            started = time.monotonic()
            say(f"compiling {len(todo)} of {len(modules)} modules ({jobs} at a time): "
                + ", ".join(m.removeprefix("railcall.") for m in todo))
            exts = [Extension(m, [str(source_path(m, root))], extra_compile_args=COMPILE_ARGS) for m in todo]
            # force: what to rebuild was decided by content above, never by file times
            exts = cythonize(exts, compiler_directives=DIRECTIVES, build_dir=str(work / "cython"), include_path=[str(root)],
                             nthreads=jobs, quiet=True, force=True)
            say(f"Cython wrote the C source of {len(exts)} modules ({time.monotonic() - started:.1f} s); "
                "the C compiler runs next")
            dist = Distribution({"ext_modules": exts, "script_name": "railcall-speedups"})
            dist.cmdclass["build_ext"] = _reporting_build_ext(build_ext, len(exts), say)
            cmd = dist.get_command_obj("build_ext")
            cmd.parallel = jobs
            cmd.force = True
            cmd.build_temp = str(work / "temp")
            cmd.build_lib = str(work / "lib")
            cmd.ensure_finalized()
            cmd.run()
            built = {e.name: Path(cmd.get_ext_fullpath(e.name)) for e in exts}
            env = {**os.environ, "RAILCALL_PURE": "1",
                   "PYTHONPATH": os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)}
            # the new extensions, with the current ones they may be built against
            current = {m: str(out / e["file"]) for m, e in record.items() if m not in built and "file" in e}
            r = subprocess.run([sys.executable, "-c", _SMOKE, json.dumps({m: str(p) for m, p in built.items()}),
                                json.dumps(current)],
                               capture_output=True, text=True, env=env, timeout=300)
            say("loading each new module once in a fresh interpreter")
            if r.returncode != 0:
                raise _LoadFailed("a compiled module failed to load, so the build was not installed:\n"
                                   + r.stderr.strip()[-2000:])
            out.mkdir(parents=True, exist_ok=True)
            for m, path in built.items():
                # copied beside the target and renamed over it, never written into: a process that
                # has the old one loaded (a running server) keeps a valid mapping of it
                target = out / (m + EXT_SUFFIX)
                tmp = target.with_name(f"{target.name}.{os.getpid()}.new")
                try:
                    shutil.copy2(path, tmp)
                    os.replace(tmp, target)
                finally:
                    tmp.unlink(missing_ok=True)
                record[m].update(file=target.name, sha256=file_hash(target))
        if todo or old.get("modules") != record:
            manifest = {"cython": Cython.__version__, "abi": EXT_SUFFIX, "modules": record}
            atomic_write(manifest_path(root), json.dumps(manifest, indent=1) + "\n")
        kept = {e["file"] for e in record.values()}
        for f in out.glob("*" + EXT_SUFFIX):  # extensions of modules no longer built
            if f.name not in kept:
                f.unlink()
        for f in _legacy_extensions(root):  # one layout at a time
            f.unlink()
    return todo


def _reporting_build_ext(base: type, total: int, say: Callable[[str], None]) -> type:
    """setuptools' build_ext that says each module as its C compile ends ("[3/13] ..., 41.2 s").
    build_ext compiles `parallel` modules at once, each in a thread of its own."""
    lock = threading.Lock()
    done = [0]

    class ReportingBuildExt(base):
        def build_extension(self, ext):
            t = time.monotonic()
            super().build_extension(ext)
            with lock:
                done[0] += 1
                say(f"[{done[0]}/{total}] {ext.name} compiled ({time.monotonic() - t:.1f} s)")

    return ReportingBuildExt


def _legacy_extensions(root: Path) -> list[Path]:
    """Extensions an older layout built beside the source (`content_keys.cpython-312-....so`), of
    any ABI, and its manifest: Python would import such an extension ahead of its .py."""
    found = []
    for m in MODULES:
        p = source_path(m, root)
        for suffix in (".so", ".pyd"):
            found += [f for f in p.parent.glob(f"{p.stem}.*{suffix}") if f.is_file()]
    man = root / "railcall" / "_speedups.json"
    return found + ([man] if man.exists() else [])


def clean(root: Path = SRC) -> list[Path]:
    """Remove every build (each ABI's) and any extension an older layout left beside the source;
    railcall then runs from source."""
    gone = []
    base = build_root(root)
    with _locked(base):
        for f in _legacy_extensions(root):
            f.unlink()
            gone.append(f)
        if base.is_dir():
            for d in sorted(base.iterdir()):
                if d.is_dir():
                    shutil.rmtree(d)
                    gone.append(d)
    return gone


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["build"]:
        try:
            done = build(progress=lambda line: print(f"railcall: {line}", flush=True))
        except Exception as e:  # noqa: BLE001 - a failed build leaves railcall on its Python source
            hint = "" if isinstance(e, _LoadFailed) else " A C compiler and the Python headers are needed."
            print(f"railcall: the compiled build failed ({type(e).__name__}: {e}); railcall runs from its Python source, "
                  f"which is correct but slower.{hint}", file=sys.stderr)
            return 1
        said = f"compiled {len(done)} of {len(MODULES)} modules" if done else f"all {len(MODULES)} modules were current"
        print(f"railcall: {said}; manifest {manifest_path()}")
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
