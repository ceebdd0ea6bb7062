"""The sandbox: path escapes refused inside the tools themselves; writes that a SIGKILL at any
point leaves whole or absent, never half-written."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from railcall.agent.files import TMP_PREFIX, PathRefused, Workspace, atomic_write, sweep_temp
from railcall.agent.loop import Agent

SRC = str(Path(__file__).resolve().parents[1] / "src")


@pytest.fixture
def box(tmp_path):
    root = tmp_path / "ws"
    (root / "sub").mkdir(parents=True)
    (root / "notes.txt").write_text("inside")
    (root / "sub" / "a.md").write_text("A")
    (tmp_path / "secret.txt").write_text("outside")
    (tmp_path / "outdir").mkdir()
    (tmp_path / "outdir" / "x.txt").write_text("outside")
    (root / "link_out").symlink_to(tmp_path / "secret.txt")
    (root / "dir_out").symlink_to(tmp_path / "outdir")
    (root / "link_in").symlink_to(root / "notes.txt")
    return Agent.for_workspace(root, None)


ESCAPES = ["../secret.txt", "sub/../../secret.txt", "/etc/passwd", str(Path("/tmp").resolve()), "link_out",
           "dir_out/x.txt", "dir_out", "dir_out/new.txt", ".railcall/memory.jsonl", ".railcall", "a\x00b", "", " ",
           "C:\\Windows\\win.ini", "..\\secret.txt"]


@pytest.mark.parametrize("path", ESCAPES)
def test_resolve_refuses_every_escape(box, path):
    with pytest.raises(PathRefused):
        box.workspace.resolve(path)


@pytest.mark.parametrize("path", ESCAPES)
def test_tools_refuse_escapes_even_when_the_grammar_is_bypassed(box, path, tmp_path):
    """Straight to the handlers (no grammar, no view): every call is an error observation."""
    for tool, args in [("read_file", {"path": path}), ("list_dir", {"path": path}),
                       ("write_file", {"path": path, "text": "pwned"})]:
        with pytest.raises(PathRefused):
            box.table.entry(tool).call(args)
    assert (tmp_path / "secret.txt").read_text() == "outside"
    assert (tmp_path / "outdir" / "x.txt").read_text() == "outside"
    assert not (tmp_path / "outdir" / "new.txt").exists()


def test_dispatch_turns_a_refusal_into_an_observation(box):
    # dispatch checks the view first: the grammar could not have spelled a missing path
    decision, result, ok, _ = box.dispatch({"tool": "read_file", "args": {"path": "../secret.txt"}})
    assert not ok and "do not fit" in result
    # write_file's path is free text, so the refusal comes from the tool itself, as an observation
    box.policy = box.policy.with_(approve="auto")
    decision, result, ok, _ = box.dispatch({"tool": "write_file", "args": {"path": "../x.txt", "text": "t"}})
    assert not ok and result.startswith("error: PathRefused") and "climbs out" in result


def test_the_file_domain_is_what_exists_inside(box):
    assert box.workspace.files() == ["link_in", "notes.txt", "sub/a.md"]
    assert box.workspace.dirs() == [".", "sub"]
    assert box.table.entry("read_file").call({"path": "link_in"}) == "inside"


def test_write_creates_folders_inside_and_replaces_whole(box):
    out = box.table.entry("write_file").call({"path": "new/deep/f.txt", "text": "héllo"})
    assert "6 bytes" in out and (box.workspace.root / "new/deep/f.txt").read_text() == "héllo"
    assert not list(box.workspace.root.rglob(TMP_PREFIX + "*"))


def test_append_adds_a_line_and_keeps_what_the_file_held(box):
    root, append = box.workspace.root, box.table.entry("append_file")
    (root / "list.txt").write_text("milk\nbread")  # no newline at the end
    assert "6 bytes" in append.call({"path": "list.txt", "text": "eggs"})  # "\n" + "eggs" + "\n"
    append.call({"path": "list.txt", "text": "tea\n"})
    assert (root / "list.txt").read_text() == "milk\nbread\neggs\ntea\n"
    append.call({"path": "sub/a.md", "text": "B"})
    assert (root / "sub" / "a.md").read_text() == "A\nB\n"
    # through a link inside, to its target; never to a file outside or a folder
    append.call({"path": "link_in", "text": "more"})
    assert (root / "notes.txt").read_text() == "inside\nmore\n"
    for path in ("link_out", "dir_out/x.txt", "../secret.txt", ".railcall/memory.jsonl"):
        with pytest.raises((PathRefused, OSError)):
            append.call({"path": path, "text": "x"})
    assert (box.workspace.root.parent / "secret.txt").read_text() == "outside"
    assert (box.workspace.root.parent / "outdir" / "x.txt").read_text() == "outside"
    assert append.call({"path": "sub", "text": "x"}).startswith("error:")
    # its path is one of the files that exist: appending to a new file is write_file's job
    assert box.view().tool("append_file").parameters["properties"]["path"]["enum"] == box.workspace.files()


APPENDER = """
import sys
from railcall.agent.files import Workspace
ws = Workspace(sys.argv[1])
for i in range(int(sys.argv[3])):
    ws.append("log.txt", f"{sys.argv[2]} {i}".encode())
"""


def test_two_processes_appending_at_once_lose_nothing(tmp_path):
    root = tmp_path / "ws"
    root.mkdir()
    (root / "log.txt").write_text("first\n")
    n = 150
    procs = [subprocess.Popen([sys.executable, "-c", APPENDER, str(root), who, str(n)], stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": SRC}) for who in ("a", "b")]
    for p in procs:
        assert p.wait(60) == 0, p.stderr.read()
    lines = (root / "log.txt").read_text().splitlines()
    assert lines[0] == "first" and len(lines) == 1 + 2 * n
    assert sorted(lines[1:]) == sorted(f"{w} {i}" for w in ("a", "b") for i in range(n))


def _writer(target: Path, size: int, hook: str) -> subprocess.Popen:
    code = ("import os, sys, time\nfrom pathlib import Path\nfrom railcall.agent import files\n" + hook
            + f"\nfiles.atomic_write(Path({str(target)!r}), b'N' * {size})\nprint('finished', flush=True)\n")
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": SRC}, text=True)


def _kill_when(proc, word: str) -> None:
    line = proc.stdout.readline()
    assert word in line, (line, proc.stderr.read())
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert proc.returncode == -signal.SIGKILL


HALF_WRITE = """
real_write = os.write
def slow_write(fd, data):
    n = real_write(fd, data)
    print("mid-write", flush=True)
    time.sleep(60)
    return n
files.os.write = slow_write
"""

AT_RENAME = """
def stuck_replace(a, b):
    print("at-rename", os.path.getsize(a), flush=True)
    time.sleep(60)
files.os.replace = stuck_replace
"""


@pytest.mark.parametrize("hook, word", [(HALF_WRITE, "mid-write"), (AT_RENAME, "at-rename")])
def test_sigkill_during_a_write_never_leaves_a_half_written_file(tmp_path, hook, word):
    target = tmp_path / "big.txt"
    target.write_bytes(b"OLD" * 1000)
    proc = _writer(target, 8 << 20, hook)  # 8 MiB: eight chunks, killed after the first
    _kill_when(proc, word)
    assert target.read_bytes() == b"OLD" * 1000
    leftovers = list(tmp_path.glob(TMP_PREFIX + "*"))
    assert len(leftovers) == 1  # the partial data sits in the temporary file, never in the target
    assert leftovers[0].stat().st_size == (1 << 20 if word == "mid-write" else 8 << 20)
    assert sweep_temp(tmp_path) == 1 and target.read_bytes() == b"OLD" * 1000


def test_sigkill_at_random_moments_of_a_large_write(tmp_path):
    """No hook: a 48 MiB write killed after 0-150 ms, five times; the file is old or new, whole."""
    target = tmp_path / "big.bin"
    size = 48 << 20
    outcomes = set()
    for delay in (0.0, 0.03, 0.06, 0.1, 0.15):
        target.write_bytes(b"OLD")
        proc = _writer(target, size, "")
        time.sleep(0.3 + delay)  # the interpreter starts in about 0.3 s
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        data = target.read_bytes()
        assert data == b"OLD" or (len(data) == size and data.count(b"N") == size)
        outcomes.add("old" if data == b"OLD" else "new")
        sweep_temp(tmp_path)
    assert outcomes  # which of the two depends on the machine's speed; both are whole


def test_atomic_write_cleans_up_after_an_error(tmp_path, monkeypatch):
    from railcall.agent import files

    def broken(fd):
        raise OSError("disk full")

    monkeypatch.setattr(files.os, "fsync", broken)
    (tmp_path / "f").write_text("old")
    with pytest.raises(OSError, match="disk full"):
        atomic_write(tmp_path / "f", "new")
    assert (tmp_path / "f").read_text() == "old" and not list(tmp_path.glob(TMP_PREFIX + "*"))


def test_workspace_must_exist(tmp_path):
    with pytest.raises(FileNotFoundError, match="--workspace"):
        Workspace(tmp_path / "nope")


def test_atomic_write_keeps_the_mode_and_writes_through_a_symlink(tmp_path):
    import stat

    secret, script, real = tmp_path / "secret.txt", tmp_path / "run.sh", tmp_path / "sub" / "real.txt"
    secret.write_text("token")
    secret.chmod(0o600)
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    real.parent.mkdir()
    real.write_text("old")
    link = tmp_path / "link.txt"
    link.symlink_to(real)
    for p, mode in ((secret, 0o600), (script, 0o755)):
        atomic_write(p, "new")
        assert p.read_text() == "new" and stat.S_IMODE(p.stat().st_mode) == mode
    atomic_write(link, "through")
    assert link.is_symlink() and real.read_text() == "through"
    assert not list(tmp_path.rglob(TMP_PREFIX + "*"))
    # a dangling link is written through too: its target is created
    dangling = tmp_path / "later.txt"
    dangling.symlink_to(tmp_path / "sub" / "made.txt")
    atomic_write(dangling, "x")
    assert dangling.is_symlink() and (tmp_path / "sub" / "made.txt").read_text() == "x"


def _deep_tree(root: Path, depth: int) -> str:
    """`depth` nested folders d/d/.../d under `root`, a file at the bottom, made through folder
    descriptors (the path is longer than a path may be); returns the bottom folder's path."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = nxt
    os.close(os.open("bottom.txt", os.O_WRONLY | os.O_CREAT, dir_fd=fd))
    os.close(fd)
    return "/".join(["d"] * depth)


def _remove_deep_tree(root: Path, depth: int) -> None:
    """Undo `_deep_tree` bottom up (shutil.rmtree, and so pytest's clean-up, recurses per level)."""
    fds = [os.open(root, os.O_RDONLY | os.O_DIRECTORY)]
    for _ in range(depth):
        fds.append(os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fds[-1]))
    os.unlink("bottom.txt", dir_fd=fds[-1])
    while len(fds) > 1:
        os.close(fds.pop())
        os.rmdir("d", dir_fd=fds[-1])
    os.close(fds[0])


def test_a_folder_tree_a_thousand_levels_deep_is_cut_with_a_notice(tmp_path):
    """A hostile workspace 1,000 folders deep: the domains, the view and the tools stop at
    MAX_DEPTH with a notice (and a refusal that says why) instead of a RecursionError."""
    from railcall.agent.files import MAX_DEPTH

    (tmp_path / "top.txt").write_text("top")
    bottom = _deep_tree(tmp_path, 1000)
    try:
        agent = Agent.for_workspace(tmp_path, None)
        ws = agent.workspace
        files, dirs = ws.files(), ws.dirs()
        assert "top.txt" in files and not any(f.endswith("bottom.txt") for f in files)
        assert max(d.count("/") + 1 for d in dirs) == MAX_DEPTH
        assert f"deeper than {MAX_DEPTH}" in ws.notice
        assert "read_file" in agent.view().names
        with pytest.raises(PathRefused, match=f"deeper than {MAX_DEPTH}"):
            ws.list(bottom)
        with pytest.raises(PathRefused, match=f"deeper than {MAX_DEPTH}"):
            ws.read(bottom + "/bottom.txt", 10)
    finally:
        _remove_deep_tree(tmp_path, 1000)


@pytest.mark.parametrize("cut_after", [0, 1, 7])
def test_an_append_interrupted_mid_write_leaves_the_old_file_or_the_whole_line(tmp_path, monkeypatch, cut_after):
    """append_file is whole-or-nothing: a write cut short (a full disk, a kill) after `cut_after`
    bytes leaves what the file held, never a partial last line."""
    (tmp_path / "log.txt").write_text("one\ntwo\n")
    ws = Workspace(tmp_path)
    real_write = os.write

    def cut(fd, data):
        n = real_write(fd, bytes(data[:cut_after]))
        raise OSError(f"interrupted after {n} bytes")

    monkeypatch.setattr(os, "write", cut)
    with pytest.raises(OSError, match="interrupted"):
        ws.append("log.txt", b"three, a line longer than the cut")
    monkeypatch.undo()
    assert (tmp_path / "log.txt").read_text() in ("one\ntwo\n", "one\ntwo\nthree, a line longer than the cut\n")
    ws.append("log.txt", b"four")
    assert (tmp_path / "log.txt").read_text() == "one\ntwo\nfour\n"
    assert [p.name for p in tmp_path.rglob(TMP_PREFIX + "*")] == []
