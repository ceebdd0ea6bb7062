"""The sandbox against a hostile workspace: folders swapped for symlinks while a tool runs, hard
links to outside files, links that make a policy's glob or list name another file, and a
user's own files that look like railcall's temporary ones."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from railcall.agent.files import TMP_PREFIX, PathRefused
from railcall.agent.loop import Agent
from railcall.agent.policy import Policy, view

SWAPPER = """
import os, shutil, sys, time
root, outside, until = sys.argv[1], sys.argv[2], float(sys.argv[3])
d, away = os.path.join(root, "d"), os.path.join(root, "d-away")
n = 0
while time.time() < until:
    try:
        os.rename(d, away)           # the real folder steps aside ...
        os.symlink(outside, d)       # ... and a link to outside takes its name
        os.unlink(d)
        n += 1
    except OSError:
        pass
    while os.path.lexists(away):
        try:
            os.rename(away, d)
        except OSError:  # a folder a writer made while the name was free
            shutil.rmtree(d, ignore_errors=True)
print(n)
"""


def swap_workspace(top):
    """`top`/ws with the folder d/ (f.txt: "inside") the swapper moves, and `top`/outside (f.txt:
    "SECRET") that its link points at; returns (ws, outside)."""
    root, outside = top / "ws", top / "outside"
    (root / "d").mkdir(parents=True)
    (root / "d" / "f.txt").write_text("inside")
    outside.mkdir()
    (outside / "f.txt").write_text("SECRET")
    return root, outside


def test_a_folder_swapped_for_a_symlink_mid_call_never_leaks_or_lands_outside(tmp_path):
    root, outside = swap_workspace(tmp_path)
    a = Agent.for_workspace(root, None)
    read, write, append = a.table.entry("read_file"), a.table.entry("write_file"), a.table.entry("append_file")
    swapper = subprocess.Popen([sys.executable, "-c", SWAPPER, str(root), str(outside), str(time.time() + 4)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen, reads, writes = set(), 0, 0
    while swapper.poll() is None:
        try:
            seen.add(read.call({"path": "d/f.txt"}))
            reads += 1
        except (PathRefused, OSError):
            pass
        try:
            write.call({"path": "d/new.txt", "text": "written"})
            writes += 1
        except (PathRefused, OSError):
            pass
        try:
            append.call({"path": "d/f.txt", "text": "appended"})
        except (PathRefused, OSError):
            pass
    out, err = swapper.communicate()
    assert swapper.returncode == 0, err
    swaps = int(out)
    # what was read is the folder's own file: "inside" and the lines appended to it (or to the
    # file an append made afresh in a new folder while the real one stood aside), up to the read
    # limit, where a line may be cut and "[...]" follows
    lines = {line for x in seen for line in x.splitlines()} - {"[...]"}
    assert all(any(whole.startswith(line) for whole in ("inside", "appended")) for line in lines), lines
    assert not any("SECRET" in x for x in seen)
    assert sorted(p.name for p in outside.iterdir()) == ["f.txt"]  # no new.txt, no temporary file
    assert (outside / "f.txt").read_text() == "SECRET"  # nothing appended there either
    assert swaps > 100 and reads > 0 and writes > 10, (swaps, reads, writes)  # the race was really run


@pytest.fixture
def linked(tmp_path):
    root = tmp_path / "ws"
    root.mkdir()
    (tmp_path / "secret.txt").write_text("outside secret")
    (root / "notes.txt").write_text("inside")
    a = Agent.for_workspace(root, None)
    a.memory.append("a private note")
    os.link(tmp_path / "secret.txt", root / "hard.txt")
    os.link(root / ".railcall" / "memory.jsonl", root / "mem.txt")
    return a


def test_a_hard_link_is_refused_unless_the_policy_allows_it(linked):
    read = linked.table.entry("read_file")
    for path in ("hard.txt", "mem.txt"):
        with pytest.raises(PathRefused, match="hard link"):
            read.call({"path": path})
        with pytest.raises(PathRefused, match="hard link"):
            linked.table.entry("append_file").call({"path": path, "text": "x"})
    assert (linked.workspace.root.parent / "secret.txt").read_text() == "outside secret"
    assert linked.workspace.files() == ["notes.txt"]
    assert read.call({"path": "notes.txt"}) == "inside"
    linked.policy = Policy(hard_links=True)
    assert read.call({"path": "hard.txt"}) == "outside secret"
    assert "hard.txt" in view(linked.table, linked.policy).tool("read_file").parameters["properties"]["path"]["enum"]


def test_a_policy_narrowing_is_matched_against_the_file_not_its_name(tmp_path):
    root = tmp_path / "ws"
    (root / "docs").mkdir(parents=True)
    (root / "private").mkdir()
    (root / "private" / "secret.txt").write_text("secret")
    (root / "docs" / "guide.md").write_text("guide")
    (root / "docs" / "readme.md").symlink_to("../private/secret.txt")
    (root / "notes.txt").write_text("notes")
    (root / "out.txt").symlink_to("notes.txt")
    a = Agent.for_workspace(root, None)
    a.policy = Policy(args={"read_file": {"path": {"glob": "docs/*"}}})
    v = a.view()
    assert v.tool("read_file").parameters["properties"]["path"]["enum"] == ["docs/guide.md"]
    assert "do not fit" in a.dispatch({"tool": "read_file", "args": {"path": "docs/readme.md"}})[1]
    a.policy = Policy(approve="auto", args={"write_file": {"path": ["out.txt", "log.txt"]}})
    assert a.view().tool("write_file").parameters["properties"]["path"]["enum"] == ["log.txt"]
    decision, result, ok, _ = a.dispatch({"tool": "write_file", "args": {"path": "out.txt", "text": "x"}})
    assert not ok and (root / "notes.txt").read_text() == "notes"
    # a link whose target also matches is kept: the rule holds for the file it reaches
    (root / "docs" / "alias.md").symlink_to("guide.md")
    a.policy = Policy(args={"read_file": {"path": {"glob": "docs/*"}}})
    assert a.view().tool("read_file").parameters["properties"]["path"]["enum"] == ["docs/alias.md", "docs/guide.md"]


def test_the_start_up_sweep_removes_only_what_railcall_left(tmp_path):
    root = tmp_path / "ws"
    (root / ".railcall" / "tmp").mkdir(parents=True)
    mine = root / f"{TMP_PREFIX}mine.txt"
    mine.write_text("the user's own file")
    (root / "sub").mkdir()
    (root / "sub" / f"{TMP_PREFIX}notes.txt-1a2b3c4d").write_text("also the user's")
    left = root / ".railcall" / "tmp" / f"{TMP_PREFIX}x.txt-00ff00ff"
    left.write_text("half a write")
    os.utime(left, (time.time() - 120, time.time() - 120))  # left two minutes ago by a killed writer
    busy = root / ".railcall" / "tmp" / f"{TMP_PREFIX}y.txt-11ee11ee"
    busy.write_text("another agent's write in progress")
    Agent.for_workspace(root, None)
    assert mine.read_text() == "the user's own file" and (root / "sub" / f"{TMP_PREFIX}notes.txt-1a2b3c4d").exists()
    assert not left.exists() and busy.exists()


def test_a_state_folder_that_is_a_symlink_is_refused(tmp_path):
    root, elsewhere = tmp_path / "ws", tmp_path / "elsewhere"
    root.mkdir()
    elsewhere.mkdir()
    (root / ".railcall").symlink_to(elsewhere)
    with pytest.raises(FileExistsError, match="not a folder"):
        Agent.for_workspace(root, None)
    assert list(elsewhere.iterdir()) == []
