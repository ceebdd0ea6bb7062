"""The approval gate asks on the terminal only: an answer piped into stdin, a closed stdin or a
chat's next task line never approves. Every denial and its reason is a trace line, and the call
is shown with control sequences and bidirectional overrides made visible."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from railcall.agent import policy as policy_mod
from railcall.agent.policy import Approver, Policy, visible
from railcall.agent.table import ToolTable

HERE = Path(__file__).resolve().parent
SRC = str(HERE.parent / "src")


def write_tool():
    table = ToolTable()

    def write_file(path: str, text: str) -> str:
        """Write."""
        return "wrote"

    table.register(write_file, mutates=True)
    return table.entry("write_file").tool


def run_cli(tmp_path, command, stdin, replies):
    """`railcall <command>` in a new session (no controlling terminal, as under cron or a pipe),
    with a scripted model; returns (exit status, output)."""
    code = (f"import sys; sys.path[:0] = [{str(HERE)!r}]\n"
            "from agentkit import scripted_model\nimport railcall.cli as cli\n"
            f"cli._agent_model = lambda model: scripted_model({replies!r})\n"
            f"cli.app({command!r})\n")
    p = subprocess.run([sys.executable, "-c", code], stdin=stdin, capture_output=True, text=True, timeout=120,
                       start_new_session=True, env={**os.environ, "PYTHONPATH": SRC, "HF_HUB_OFFLINE": "1"})
    return p.returncode, p.stdout + p.stderr


def call(tool, **args) -> str:
    return json.dumps({"tool": tool, "args": args}, separators=(",", ":"))


def trace(root):
    return [json.loads(x) for x in (root / ".railcall" / "trace.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("stdin", ["file", "closed"])
def test_agent_never_takes_an_approval_from_stdin(tmp_path, stdin):
    root = tmp_path / "ws"
    root.mkdir()
    answer = tmp_path / "answer.txt"
    answer.write_text("y\n")
    replies = [call("write_file", path="x.txt", text="pwned"), call("answer", text="done")]
    with open(answer) as f:
        rc, out = run_cli(tmp_path, ["agent", "save", "-w", str(root), "--approve", "ask"],
                          f if stdin == "file" else None, replies) if stdin == "file" else \
            _closed_stdin(tmp_path, root, replies)
    assert rc == 0, out
    assert not (root / "x.txt").exists() and "[not approved]" in out
    step = trace(root)[0]
    assert step["approval"]["approved"] is False and step["approval"]["mode"] == "ask"
    assert "no terminal" in step["approval"]["reason"], step["approval"]


def _closed_stdin(tmp_path, root, replies):
    code = (f"import sys, os; os.close(0); sys.stdin = None; sys.path[:0] = [{str(HERE)!r}]\n"
            "from agentkit import scripted_model\nimport railcall.cli as cli\n"
            f"cli._agent_model = lambda model: scripted_model({replies!r})\n"
            f"cli.app(['agent', 'save', '-w', {str(root)!r}, '--approve', 'ask'])\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       start_new_session=True, env={**os.environ, "PYTHONPATH": SRC, "HF_HUB_OFFLINE": "1"})
    return p.returncode, p.stdout + p.stderr


def test_chat_does_not_take_the_next_task_line_as_an_approval(tmp_path):
    root = tmp_path / "ws"
    root.mkdir()
    replies = [call("write_file", path="a.txt", text="one"), call("answer", text="asked"),
               call("answer", text="second task")]
    r, w = os.pipe()
    os.write(w, b"save one\ny\n/quit\n")
    os.close(w)
    rc, out = run_cli(tmp_path, ["chat", "-w", str(root)], r, replies)
    os.close(r)
    assert rc == 0, out
    assert not (root / "a.txt").exists()
    tasks = [s["task"] for s in trace(root)]
    assert tasks == ["save one", "save one", "y"]  # "y" was the next task, not an answer to the gate
    assert "no terminal" in trace(root)[0]["approval"]["reason"]


def test_the_terminal_is_asked_and_shown_the_call_escaped(monkeypatch):
    """A real terminal (a pseudo-terminal standing in for /dev/tty): "y" typed there approves, and
    the question it shows carries no raw escape or bidirectional override."""
    master, slave = os.openpty()
    monkeypatch.setattr(policy_mod, "TTY", os.ttyname(slave))
    shown = b""

    def user():
        nonlocal shown
        while b"[y/N]" not in shown:
            shown += os.read(master, 1024)
        os.write(master, b"y\n")

    t = threading.Thread(target=user, daemon=True)
    t.start()
    d = Approver().decide(Policy(), write_tool(), {"path": "evil\u202etxt.sh", "text": "\x1b]0;title\x07\x1b[2J"})
    t.join(5)
    os.close(master)
    os.close(slave)
    assert d.approved and d.reason == "approved on the terminal"
    assert b"\x1b" not in shown and "\u202e".encode() not in shown and b"\x07" not in shown
    assert b"\\u202e" in shown and (b"\\u001b" in shown or b"\\x1b" in shown)


def test_no_terminal_is_a_denial_with_its_reason(monkeypatch, tmp_path):
    monkeypatch.setattr(policy_mod, "TTY", str(tmp_path / "no-tty"))
    d = Approver().decide(Policy(), write_tool(), {"path": "a", "text": "b"})
    assert not d.approved and d.mode == "ask" and "no terminal" in d.reason and "--approve" in d.reason
    (tmp_path / "plain").write_text("y\n")  # a file where the terminal should be is not one
    monkeypatch.setattr(policy_mod, "TTY", str(tmp_path / "plain"))
    d = Approver().decide(Policy(), write_tool(), {"path": "a", "text": "b"})
    assert not d.approved and "not a terminal" in d.reason


@pytest.mark.parametrize("raw, seen", [
    ("\x1b[2J\x1b]0;pwned\x07", "\\x1b[2J\\x1b]0;pwned\\x07"),
    ("abc\u202etxt.exe", "abc\\u202etxt.exe"),
    ("\x9b31m", "\\x9b31m"),
    ("zero\u200bwidth", "zero\\u200bwidth"),
    ("plain text, ünïcödé", "plain text, ünïcödé"),
])
def test_visible(raw, seen):
    assert visible(raw) == seen
    assert visible("a\nb", keep="\n") == "a\nb" and visible("a\nb") == "a\\nb"
