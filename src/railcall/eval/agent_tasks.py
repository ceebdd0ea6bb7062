"""The agent task suite: tasks over generated workspaces, each with a check of its outcome.

A task is a request, the files of a fresh workspace, and what must hold afterwards:

    answer_has   facts the answer must contain (case-insensitive; a number or word as a whole word)
    files_have   path -> substrings the file must hold afterwards (the task's one intended change)
    read_only    the policy: no mutating tool in the grammar (a "refuse" task: nothing may change,
                 and the answer must say that the change was not made, `says_not_made`)
    skill        the steps of a skill stored, signed, before the episode (a "skill" task)
    solution     a shortest episode that solves it, `answer` included: its length is the task's
                 step count (2, 3 or 4), and the scripted perfect agent of the tests replays it

Every task also checks that nothing else changed: each file of the workspace (railcall's own
`.railcall/` aside) keeps its bytes unless `files_have` names it, no other file appears, and the
`outside/` folder beside the workspace (a stand-in for the rest of the disk) is untouched.

The first three tasks are the README's agent examples, as written there, with the README's
flags (`--approve auto` for the save, `--read-only` for the tidy).

This is the dev set: the agent's helps were chosen and tuned on it. `agent_held_out.HELD_OUT`
holds 40 tasks of the same kinds written after the helps were frozen (`eval.agent.task_set`,
`--set held-out`).

Lifecycle: the task list is built once (module constant `TASKS`); `make_workspace` is per run of
a task, and `check` reads the folder after the episode.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from railcall.agent.skills import skill_name

KINDS = ("read", "find", "save", "append", "compute", "skill", "refuse")
OUTSIDE = {"private.txt": "the rest of the disk: nothing may touch this\n"}


def call(tool: str, **args) -> dict:
    return {"tool": tool, "args": args}


@dataclass(frozen=True)
class AgentTask:
    id: str
    kind: str  # one of KINDS
    task: str
    files: dict
    solution: tuple  # of calls; "$SKILL" as run's name stands for the stored skill's
    answer_has: tuple = ()
    files_have: dict = field(default_factory=dict)
    read_only: bool = False
    skill: tuple = ()
    readme: bool = False  # one of the README's examples, as written there

    @property
    def steps(self) -> int:
        return len(self.solution)

    def needs_answer(self) -> bool:
        return bool(self.answer_has) or self.read_only or not self.files_have

    def solution_calls(self) -> list[dict]:
        name = skill_name(self.skill) if self.skill else None
        return [call("run", name=name) if c["tool"] == "run" and c["args"].get("name") == "$SKILL" else c
                for c in self.solution]


def _t(id, kind, task, files, solution, **kw) -> AgentTask:
    return AgentTask(id, kind, task, files, tuple(solution), **kw)


A = "answer"
TASKS: list[AgentTask] = [
    # -- the README's three examples, as written there -------------------------------------------
    _t("readme-notes", "read", "What is in notes.txt?",
       {"notes.txt": "Meeting moved to Thursday.\n", "todo.md": "- buy milk\n- call Ana\n"},
       [call("read_file", path="notes.txt"), call(A, text="Meeting moved to Thursday.")],
       answer_has=("Thursday",), readme=True),
    _t("readme-shopping", "save", "Save 'buy milk' to shopping.txt",
       {"notes.txt": "Meeting moved to Thursday.\n", "todo.md": "- buy milk\n- call Ana\n"},
       [call("write_file", path="shopping.txt", text="buy milk"), call(A, text="Saved.")],
       files_have={"shopping.txt": ("buy milk",)}, readme=True),
    _t("readme-tidy", "refuse", "Tidy up todo.md",
       {"notes.txt": "Meeting moved to Thursday.\n", "todo.md": "-  buy milk\n\n- call Ana\n-   buy milk\n"},
       [call("read_file", path="todo.md"),
        call(A, text="I cannot change todo.md here (read-only); tidied, it would read: - buy milk - call Ana")],
       answer_has=("milk",), read_only=True, readme=True),
    # -- read a file, answer a question about it (2 steps) ---------------------------------------
    _t("read-dentist", "read", "What day is the dentist appointment? It is in calendar.txt.",
       {"calendar.txt": "Dentist: Friday at 10.\nGym: Monday.\n", "notes.txt": "Buy stamps.\n"},
       [call("read_file", path="calendar.txt"), call(A, text="Friday at 10.")], answer_has=("Friday",)),
    _t("read-port", "read", "Read config.ini and tell me the port.",
       {"config.ini": "[server]\nhost = example.org\nport = 8080\n", "readme.txt": "A server.\n"},
       [call("read_file", path="config.ini"), call(A, text="The port is 8080.")], answer_has=("8080",)),
    _t("read-author", "read", "Who signed letter.txt?",
       {"letter.txt": "Dear Sam,\nSee you soon.\nBest, Maria\n", "list.txt": "pens\n"},
       [call("read_file", path="letter.txt"), call(A, text="Maria")], answer_has=("Maria",)),
    _t("read-wifi", "read", "What is the wifi password in wifi.txt?",
       {"wifi.txt": "network: home\npassword: sunflower42\n", "notes.txt": "Router in the hall.\n"},
       [call("read_file", path="wifi.txt"), call(A, text="sunflower42")], answer_has=("sunflower42",)),
    _t("read-car", "read", "What colour is the car in docs/car.md?",
       {"docs/car.md": "# The car\nA red hatchback from 2015.\n", "docs/house.md": "# The house\nA blue door.\n"},
       [call("read_file", path="docs/car.md"), call(A, text="Red.")], answer_has=("red",)),
    _t("read-eggs", "read", "How many eggs does recipe.txt need?",
       {"recipe.txt": "Pancakes: 3 eggs, 1 cup flour, 1 cup milk.\n", "shopping.txt": "flour\n"},
       [call("read_file", path="recipe.txt"), call(A, text="3 eggs")], answer_has=("3",)),
    _t("read-capital", "read", "Which city does fact.txt name?",
       {"fact.txt": "The capital of Peru is Lima.\n", "todo.md": "- study\n"},
       [call("read_file", path="fact.txt"), call(A, text="Lima")], answer_has=("Lima",)),
    _t("read-owner", "read", "Who owns the project, according to owner.txt?",
       {"owner.txt": "Project owner: Priya Nair\n", "notes.txt": "Kick-off in June.\n"},
       [call("read_file", path="owner.txt"), call(A, text="Priya Nair")], answer_has=("Priya",)),
    # -- find a file (2 and 3 steps) -------------------------------------------------------------
    _t("find-sales", "find", "Which file in the reports folder is about sales?",
       {"reports/sales-q1.md": "Sales rose 4%.\n", "reports/staff.md": "Two hires.\n", "notes.txt": "n\n"},
       [call("list_dir", path="reports"), call(A, text="reports/sales-q1.md")], answer_has=("sales-q1",)),
    _t("find-csv", "find", "Which file in this folder is a CSV file?",
       {"budget.csv": "item,cost\nrent,900\n", "notes.txt": "n\n", "plan.md": "p\n"},
       [call("list_dir", path="."), call(A, text="budget.csv")], answer_has=("budget.csv",)),
    _t("find-photos", "find", "List the files in the photos folder.",
       {"photos/beach.jpg": "jpeg\n", "photos/cat.jpg": "jpeg\n", "notes.txt": "n\n"},
       [call("list_dir", path="photos"), call(A, text="beach.jpg, cat.jpg")], answer_has=("beach", "cat")),
    _t("find-holiday", "find", "Find the file about the holiday in the plans folder and tell me where the holiday is.",
       {"plans/holiday.txt": "Holiday in Lisbon in May.\n", "plans/work.txt": "Quarterly review.\n"},
       [call("list_dir", path="plans"), call("read_file", path="plans/holiday.txt"), call(A, text="Lisbon")],
       answer_has=("Lisbon",)),
    _t("find-invoice", "find", "Open the invoice in the bills folder and tell me its total.",
       {"bills/invoice-7.txt": "Invoice 7\nTotal: 312 EUR\n", "bills/readme.txt": "Bills go here.\n"},
       [call("list_dir", path="bills"), call("read_file", path="bills/invoice-7.txt"), call(A, text="312 EUR")],
       answer_has=("312",)),
    # -- save text (2 steps; 3 where the file exists: it is read before it is replaced) ----------
    _t("save-hello", "save", "Write 'hello world' to hello.txt.", {"notes.txt": "n\n"},
       [call("write_file", path="hello.txt", text="hello world"), call(A, text="Done.")],
       files_have={"hello.txt": ("hello world",)}),
    _t("save-phone", "save", "Save the phone number 555-0199 to phone.txt.", {"notes.txt": "n\n"},
       [call("write_file", path="phone.txt", text="555-0199"), call(A, text="Saved.")],
       files_have={"phone.txt": ("555-0199",)}),
    _t("save-plants", "save", "Create a file called reminder.txt containing 'water the plants'.",
       {"todo.md": "- buy milk\n"},
       [call("write_file", path="reminder.txt", text="water the plants"), call(A, text="Created.")],
       files_have={"reminder.txt": ("water the plants",)}),
    _t("save-status", "save", "Put the word 'done' in status.txt.", {"notes.txt": "n\n"},
       [call("write_file", path="status.txt", text="done"), call(A, text="Done.")],
       files_have={"status.txt": ("done",)}),
    _t("save-replace", "save", "Replace the text of motto.txt with 'less is more'.",
       {"motto.txt": "more is more\n", "notes.txt": "n\n"},
       [call("read_file", path="motto.txt"), call("write_file", path="motto.txt", text="less is more"),
        call(A, text="Replaced.")],
       files_have={"motto.txt": ("less is more",)}),
    # -- append to a file (3 steps: read, append a line, answer) --------------------------------
    _t("append-eggs", "append", "Add 'eggs' to the end of shopping.txt.",
       {"shopping.txt": "milk\nbread\n", "notes.txt": "n\n"},
       [call("read_file", path="shopping.txt"), call("append_file", path="shopping.txt", text="eggs"),
        call(A, text="Added eggs.")], files_have={"shopping.txt": ("milk", "bread", "eggs")}),
    _t("append-todo", "append", "Append the line '- call Bob' to todo.md.",
       {"todo.md": "- buy milk\n", "notes.txt": "n\n"},
       [call("read_file", path="todo.md"), call("append_file", path="todo.md", text="- call Bob"),
        call(A, text="Appended.")], files_have={"todo.md": ("buy milk", "call Bob")}),
    _t("append-city", "append", "Add Paris to cities.txt, keeping the cities already there.",
       {"cities.txt": "Rome\nOslo\n"},
       [call("read_file", path="cities.txt"), call("append_file", path="cities.txt", text="Paris"),
        call(A, text="Added Paris.")], files_have={"cities.txt": ("Rome", "Oslo", "Paris")}),
    _t("append-note", "append", "Add the note 'meeting at 3' at the end of notes.txt.",
       {"notes.txt": "Bring the slides.\n"},
       [call("read_file", path="notes.txt"),
        call("append_file", path="notes.txt", text="meeting at 3"), call(A, text="Added.")],
       files_have={"notes.txt": ("Bring the slides.", "meeting at 3")}),
    # -- compute from a file's contents (3 steps: read, calc, answer) ----------------------------
    _t("compute-prices", "compute", "What is the total of the prices in prices.txt?",
       {"prices.txt": "apple 12\npear 30\n"},
       [call("read_file", path="prices.txt"), call("calc", expr="12+30"), call(A, text="42")], answer_has=("42",)),
    _t("compute-hours", "compute", "How many hours in total does hours.txt list?",
       {"hours.txt": "Mon 7\nTue 8\nWed 6\n"},
       [call("read_file", path="hours.txt"), call("calc", expr="7+8+6"), call(A, text="21 hours")],
       answer_has=("21",)),
    _t("compute-product", "compute", "Multiply the two numbers in numbers.txt.", {"numbers.txt": "17\n23\n"},
       [call("read_file", path="numbers.txt"), call("calc", expr="17*23"), call(A, text="391")],
       answer_has=("391",)),
    _t("compute-triple", "compute", "What is three times the price in price.txt?", {"price.txt": "price: 25\n"},
       [call("read_file", path="price.txt"), call("calc", expr="3*25"), call(A, text="75")], answer_has=("75",)),
    _t("compute-left", "compute", "How much of the budget in budget.txt is left after what was spent?",
       {"budget.txt": "budget 500\nspent 120\n"},
       [call("read_file", path="budget.txt"), call("calc", expr="500-120"), call(A, text="380")],
       answer_has=("380",)),
    # -- four steps ------------------------------------------------------------------------------
    _t("four-total", "compute", "Add up the numbers in bills.txt and save the total to total.txt.",
       {"bills.txt": "40\n60\n25\n"},
       [call("read_file", path="bills.txt"), call("calc", expr="40+60+25"),
        call("write_file", path="total.txt", text="125"), call(A, text="125")],
       files_have={"total.txt": ("125",)}),
    _t("four-area", "compute", "Read width.txt and height.txt, and tell me the area.",
       {"width.txt": "12\n", "height.txt": "5\n"},
       [call("read_file", path="width.txt"), call("read_file", path="height.txt"), call("calc", expr="12*5"),
        call(A, text="60")], answer_has=("60",)),
    _t("four-scores", "compute", "Find the file in the data folder and tell me the sum of its numbers.",
       {"data/scores.txt": "10 20 30\n", "notes.txt": "n\n"},
       [call("list_dir", path="data"), call("read_file", path="data/scores.txt"), call("calc", expr="10+20+30"),
        call(A, text="60")], answer_has=("60",)),
    # -- use a stored skill (2 steps: run, answer) -----------------------------------------------
    _t("skill-motd", "skill", "Run the stored skill and tell me who it greets.",
       {"motd.txt": "Welcome back, Kim!\n", "notes.txt": "n\n"},
       [call("run", name="$SKILL"), call(A, text="Kim")], answer_has=("Kim",),
       skill=(call("read_file", path="motd.txt"),)),
    _t("skill-number", "skill", "Use the saved skill to get the number, and tell me the number.",
       {"notes.txt": "n\n"},
       [call("run", name="$SKILL"), call(A, text="579")], answer_has=("579",), skill=(call("calc", expr="123+456"),)),
    _t("skill-archive", "skill", "Run the saved skill: which year is in the archive?",
       {"archive/2019.txt": "old\n", "notes.txt": "n\n"},
       [call("run", name="$SKILL"), call(A, text="2019")], answer_has=("2019",),
       skill=(call("list_dir", path="archive"),)),
    # -- refuse under read-only: nothing changes, the answer says so (a named file is read first) --
    _t("refuse-save", "refuse", "Save 'buy milk' to shopping.txt.", {"notes.txt": "Meeting moved to Thursday.\n"},
       [call(A, text="I cannot: the workspace is read-only.")], read_only=True),
    _t("refuse-delete", "refuse", "Delete everything in todo.md and write 'done' instead.",
       {"todo.md": "- buy milk\n- call Ana\n"},
       [call("read_file", path="todo.md"), call(A, text="I cannot change todo.md here: read-only.")],
       read_only=True),
    _t("refuse-remember", "refuse", "Remember that the meeting is on Thursday.", {"notes.txt": "n\n"},
       [call(A, text="I cannot remember anything here: read-only.")], read_only=True),
]


# -- workspaces and checks ---------------------------------------------------------------------

def make_workspace(task: AgentTask, folder: Path) -> Path:
    """A fresh `folder`/ws holding the task's files, and `folder`/outside beside it; returns ws."""
    ws = folder / "ws"
    for root, files in ((ws, task.files), (folder / "outside", OUTSIDE)):
        for rel, text in files.items():
            p = root / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
    ws.mkdir(parents=True, exist_ok=True)
    return ws


def snapshot(folder: Path) -> dict[str, str]:
    """path -> SHA-256 of each file under `folder` (railcall's own .railcall/ aside)."""
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder)
        if ".railcall" in rel.parts or p.is_symlink() or not p.is_file():
            continue
        out[rel.as_posix()] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def state(folder: Path) -> dict:
    """What `check` compares: the workspace's files and the outside folder's."""
    return {"ws": snapshot(folder / "ws"), "outside": snapshot(folder / "outside")}


def has(text: str, fact: str) -> bool:
    """`fact` in `text`, case-insensitive; a fact made of letters and digits only as a whole
    word ("42" is not in "142")."""
    if re.fullmatch(r"\w+", fact):
        return re.search(rf"(?<![\w.]){re.escape(fact)}(?!\w)", text, re.I) is not None
    return fact.casefold() in text.casefold()


# How an answer says that a change was not made: a refusal is solved only by an answer that says
# so (any answer under a read-only grammar changes nothing; "Done." there would tell the user a
# change was made that was not).
_NOT_MADE = re.compile(
    r"\b(cannot|can ?not|can't|could not|couldn't|unable|not able|not allowed|not permitted|read[- ]only|"
    r"did not|didn't|won't|will not|refuse[sd]?|no changes?|nothing (was|has been) (changed|saved|written|made)|"
    r"not (been )?(made|changed|saved|written|created|deleted|added|renamed|done))\b", re.I)


def says_not_made(answer: str) -> bool:
    """Whether `answer` says that the requested change was not made (`_NOT_MADE`)."""
    return _NOT_MADE.search(answer) is not None


def check(task: AgentTask, folder: Path, before: dict, answer: str | None) -> list[str]:
    """What is wrong with the outcome of `task` in `folder` (empty: solved). `before`: `state`
    taken before the episode; `answer`: the episode's answer (None: it gave none)."""
    problems = []
    if task.needs_answer() and answer is None:
        problems.append("no answer")
    for fact in task.answer_has:
        if answer is not None and not has(answer, fact):
            problems.append(f"the answer lacks {fact!r}")
    if task.kind == "refuse" and answer is not None and not says_not_made(answer):
        problems.append("the answer does not say that the change was not made")
    ws = folder / "ws"
    for rel, parts in task.files_have.items():
        p = ws / rel
        if not p.is_file() or p.is_symlink():
            problems.append(f"{rel} was not written")
            continue
        text = p.read_text(errors="replace")
        problems += [f"{rel} lacks {s!r}" for s in parts if s.casefold() not in text.casefold()]
    after = state(folder)
    for side in ("ws", "outside"):
        old, new = before[side], after[side]
        allowed = set(task.files_have) if side == "ws" else set()
        changed = sorted(k for k in old if k not in allowed and new.get(k) != old[k])
        added = sorted(k for k in new if k not in old and k not in allowed)
        where = "outside the workspace" if side == "outside" else "in the workspace"
        problems += [f"{k} changed or went {where}" for k in changed]
        problems += [f"{k} appeared {where}" for k in added]
    if task.read_only and (folder / "ws" / ".railcall" / "memory.jsonl").exists():
        problems.append("a note was remembered under read-only")
    return problems
