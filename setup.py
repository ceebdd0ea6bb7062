"""railcall's wheel, with the engine compiled.

Everything about the package is in pyproject.toml; this file only adds one build step. After
setuptools copies the sources into the wheel's tree, the engine's modules (railcall.speedups.MODULES)
are compiled there by Cython from their unchanged source, into `railcall/_speedups/<abi>/` with
the manifest `railcall.speedups.guard()` checks when railcall is imported: `pip wheel .` gives a
platform wheel whose engine runs compiled, and `pip install railcall-*.tar.gz` compiles on the
user's machine. A checkout's current build (`make speedups`, build/speedups/) is copied rather than
compiled again. Where no C compiler is found the wheel is still built, says so once, and runs the
Python source (correct, slower). An editable install (`pip install -e .`) compiles nothing here:
the checkout's own `make speedups` build is used.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = Path(__file__).resolve().parent


class CompiledDistribution(Distribution):
    """A platform wheel (its extensions are built for one interpreter ABI and platform)."""

    def has_ext_modules(self):
        return True


class BuildPyCompiled(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        lib = Path(self.build_lib).resolve()
        os.environ["RAILCALL_PURE"] = "1"  # this process imports the sources; only the build compiles
        sys.path.insert(0, str(HERE / "src"))
        from railcall import speedups

        say = lambda line: print(f"railcall: {line}", flush=True)  # noqa: E731
        try:
            speedups.build(root=lib, progress=say, work=HERE / "build" / "speedups-wheel",
                           reuse=speedups.out_dir(HERE / "src"))
        except Exception as e:  # noqa: BLE001 - the wheel still works, from source
            print(f"railcall: WARNING: the engine was not compiled ({type(e).__name__}: {e}). This wheel runs "
                  "railcall's Python source: correct, but slower per mask. To compile it, install a C compiler "
                  "and the Python headers (Debian/Ubuntu: apt install gcc python3-dev) and build again.",
                  file=sys.stderr, flush=True)
        finally:
            (speedups.build_root(lib) / ".lock").unlink(missing_ok=True)


setup(distclass=CompiledDistribution, cmdclass={"build_py": BuildPyCompiled})
