"""The built-in workspace tools, registered the way any other tool is.

    list_dir(path)          path enumerated from the folders that exist
    read_file(path)         path enumerated from the files that exist
    write_file(path, text)  mutates; any path, confined to the workspace, written atomically
    calc(expr)              safe arithmetic: parsed with `ast`, never evaluated
    remember(text)          mutates; appends a line to the memory store (under a lock)
    run(name)               name enumerated from the stored skills this view could run
    answer(text)            ends the episode with a reply to the user

Every path is confined by the `Workspace` inside the tool itself (resolved and opened in one
walk from the root's descriptor), so the checks hold even for a call that never went through
the grammar.
"""

from __future__ import annotations

import ast
import json
import operator as op
import os
import time
from pathlib import Path
from typing import Annotated, Callable

from railcall.agent.files import StateFolder, Workspace
from railcall.agent.policy import Policy
from railcall.atomic import append_line
from railcall.agent.skills import SkillStore
from railcall.agent.table import ToolTable

ANSWER = "answer"
READ_LIMIT = 4000  # characters of a file shown to the model: a 135M model's context is 8k tokens


# What calc's grammar lets the model write: numbers (at most 9 digits, 6 after the point) joined
# by + - * / // % **, in parentheses or not, in at most 48 characters: a call of well under the
# agent's 64-token ceiling. "buy milk", or a number that grows to the ceiling (SmolLM2 wrote
# "100000000000000.0000000000" and was cut), is unspellable; the handler still parses what it gets.
def arithmetic_over(numbers=None) -> str:
    """calc's pattern; with `numbers`, each operand is one of them (Helps.copied_numbers)."""
    body = "|".join(n.replace(".", "\\.") for n in numbers) if numbers else r"[0-9]{1,9}(\.[0-9]{1,6})?"
    operand = rf"\(*-?(?:{body})\)*"
    return rf"^{operand}( ?(\*\*|//|[-+*/%]) ?{operand})*$"


ARITHMETIC = {"pattern": arithmetic_over(), "maxLength": 48}


def calc(expr: Annotated[str, ARITHMETIC]) -> str:
    """Evaluate an arithmetic expression (numbers, + - * / // % ** and parentheses)."""
    ops = {ast.Add: op.add, ast.Sub: op.sub, ast.Mult: op.mul, ast.Div: op.truediv, ast.FloorDiv: op.floordiv,
           ast.Mod: op.mod, ast.Pow: op.pow, ast.USub: op.neg, ast.UAdd: op.pos}
    big = 10 ** 300  # beyond this a result is refused: 9**9**9 must not hang the process

    def ev(n):
        if isinstance(n, ast.Expression):
            return ev(n.body)
        if isinstance(n, ast.Constant) and isinstance(n.value, (int, float)) and not isinstance(n.value, bool):
            return n.value
        if isinstance(n, ast.BinOp) and type(n.op) in ops:
            left, right = ev(n.left), ev(n.right)
            if isinstance(n.op, ast.Pow) and (abs(right) > 1000 or abs(left) > big or
                                              (abs(left) > 1 and abs(right) * len(str(int(abs(left)))) > 300)):
                raise ValueError("the power is too large")
            out = ops[type(n.op)](left, right)
        elif isinstance(n, ast.UnaryOp) and type(n.op) in ops:
            out = ops[type(n.op)](ev(n.operand))
        else:
            raise ValueError("only numbers and + - * / // % ** ( ) are allowed")
        if isinstance(out, complex) or abs(out) > big:
            raise ValueError("the result is too large")
        return out

    if len(expr) > 200:
        return "error: the expression is longer than 200 characters"
    try:
        value = ev(ast.parse(expr.replace("×", "*").replace("x", "*"), mode="eval"))
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError, TypeError) as e:
        return f"error: {e}"
    return str(int(value)) if isinstance(value, float) and value.is_integer() and abs(value) < 1e15 else str(value)


class MemoryStore:
    """Notes the agent keeps across episodes: JSON lines, one appended per note.

    An append takes an exclusive `flock` on the file, mends a torn last line (a writer killed
    mid-line) and writes the whole line with one write(2) on an O_APPEND descriptor: two
    processes remembering at once both keep their notes (a rewrite of the whole file, read
    before the other's append and renamed after it, lost one in four of them). The file is
    opened without following a link at any component (`files.StateFolder`): a planted
    `memory.jsonl -> /elsewhere` is refused, neither appended to nor read as notes."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._state = StateFolder(self.path.parent)

    def items(self) -> list[str]:
        data = self._state.read(self.path.name)
        if data is None:
            return []
        out = []
        for line in data.decode(errors="replace").splitlines():
            try:
                out.append(json.loads(line)["text"])
            except (ValueError, KeyError, TypeError):
                continue  # a torn or hand-edited line is not a note
        return out

    def append(self, text: str) -> int:
        line = json.dumps({"text": text, "at": time.time()}, ensure_ascii=False).encode() + b"\n"
        fd = self._state.open(self.path.name, os.O_RDWR | os.O_APPEND | os.O_CREAT, one_name=True)
        try:
            append_line(fd, line)
        finally:
            os.close(fd)
        return len(self.items())


# A request and the call that does it, for each built-in the model calls itself (Helps.examples
# shows them in the system prompt). Written for these tools, with files and values of their own:
# a request in a user's words, not the tool's name read aloud.
EXAMPLES = {
    "list_dir": ("Which files are in the folder reports?", {"path": "reports"}),
    "read_file": ("What does memo.txt say?", {"path": "memo.txt"}),
    "write_file": ("Save the text 'see you at 5' to memo.txt.", {"path": "memo.txt", "text": "see you at 5"}),
    "append_file": ("Add 'apples' at the end of groceries.txt.", {"path": "groceries.txt", "text": "apples"}),
    "calc": ("What is 14 plus 9, times 2?", {"expr": "(14+9)*2"}),
    "remember": ("Remember that the door code is 4411.", {"text": "the door code is 4411"}),
}


def workspace_tools(table: ToolTable, ws: Workspace, skills: SkillStore, memory: MemoryStore,
                    run_skill: Callable[[str], str], policy: Callable[[], Policy] = Policy) -> ToolTable:
    """Register the built-ins on `table` (run_skill: the runtime's way to replay a skill, so each
    of its steps passes the same policy view and approval gate as a call the model writes;
    policy: the policy now, for what the tools themselves enforce: hard links, and its narrowing
    of each path checked again against the file the tool's own walk reaches)."""

    def admits(tool: str):
        now = policy()
        return lambda path: now.admits(tool, "path", path)

    def list_dir(path: str) -> str:
        """List the files and folders in a folder of the workspace.

        Args:
            path: the folder, relative to the workspace ("." for the top).
        """
        try:
            entries = ws.list(path, admit=admits("list_dir"))
        except (FileNotFoundError, NotADirectoryError):
            return f"error: no folder {path!r}"
        return ", ".join(entries) or "(empty)"

    def read_file(path: str) -> str:
        """Read a text file of the workspace.

        Args:
            path: the file, relative to the workspace.
        """
        data = ws.read(path, READ_LIMIT * 4 + 4, hard_links=policy().hard_links, admit=admits("read_file"))
        text = data.decode("utf-8", errors="replace")
        return text[:READ_LIMIT] + ("\n[...]" if len(text) > READ_LIMIT else "")

    def write_file(path: str, text: str) -> str:
        """Write text to a file of the workspace (replacing it whole).

        Args:
            path: the file, relative to the workspace.
            text: the new content.
        """
        try:
            ws.write(path, text.encode(), admit=admits("write_file"))
        except IsADirectoryError:
            return f"error: {path!r} is a folder"
        return f"wrote {len(text.encode())} bytes to {path}"

    def append_file(path: str, text: str) -> str:
        """Add text at the end of a file of the workspace, on a line of its own, keeping what it holds.

        Args:
            path: the file, relative to the workspace.
            text: the line to add.
        """
        try:
            n = ws.append(path, text.encode(), hard_links=policy().hard_links, admit=admits("append_file"))
        except IsADirectoryError:
            return f"error: {path!r} is a folder"
        return f"added {n} bytes to the end of {path}"

    def remember(text: str) -> str:
        """Remember a fact for later tasks.

        Args:
            text: the fact.
        """
        n = memory.append(text)
        return f"remembered ({n} notes)"

    def run(name: str) -> str:
        """Run a stored skill: a sequence of calls that solved an earlier task.

        Args:
            name: the skill's name.
        """
        return run_skill(name)

    def answer(text: str) -> str:
        """Reply to the user and finish the task.

        Args:
            text: the reply.
        """
        return text

    # canonical: a policy's glob or list must hold for the file a path reaches, not only its name
    table.register(list_dir, domains={"path": lambda ctx: ws.dirs()}, canonical={"path": ws.real})
    table.register(read_file, domains={"path": lambda ctx: ws.files(hard_links=ctx.policy.hard_links)},
                   canonical={"path": ws.real})
    # append_file before write_file: the tool that keeps what a file holds is listed (and so
    # described to the model) before the one that replaces it, so a small model's bias for the
    # earlier of two tools errs on the side of keeping data. Its path: the files that exist
    # (appending to a new file is writing it).
    table.register(append_file, mutates=True, domains={"path": lambda ctx: ws.files(hard_links=ctx.policy.hard_links)},
                   canonical={"path": ws.real})
    table.register(write_file, mutates=True, canonical={"path": ws.real})
    table.register(calc)
    table.register(remember, mutates=True)
    table.register(run, domains={"name": skills.runnable})
    table.register(answer)
    return table
