"""Skills: a successful episode's calls, stored under a content-addressed name.

When an episode ends with an answer and every call in it succeeded, its call sequence (with any
skill it ran expanded in place, so a skill never calls a skill) is a *skill*: a small program
that can be replayed with one call, `{"tool":"run","args":{"name":"learned-3f2a91c4e07b"}}`.

The name is `learned-` + the first 12 hex digits of the SHA-256 of the canonical JSON of the
steps, so the same program is stored once, and a file whose content does not match its name
is refused as tampered or damaged.

Seed 003's lesson: a skill the model has to spell from memory is a skill it cannot use. So
`run`'s `name` argument is enumerated from this store at every step (`runnable`), and only a
skill that is checked, at load, to be a full runnable program is offered: the file parses, its
name matches its content, it has at least one step, every step names a tool of the table (other
than `run`), and every step's arguments are spellable by the grammar of the view it would run
under -- so a skill that reads a file that has since been deleted, or writes under a read-only
policy, is not offered at all.

Files are written atomically (`files.atomic_write`). Lifecycle: one store per state folder.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

from railcall.agent.files import atomic_write

PREFIX = "learned-"
RUN = "run"  # the tool that runs skills: skills never contain it (runs are expanded)


@dataclass(frozen=True)
class Skill:
    name: str
    task: str
    steps: tuple  # ({"tool": ..., "args": {...}}, ...)


def skill_name(steps) -> str:
    canon = json.dumps(list(steps), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return PREFIX + hashlib.sha256(canon.encode()).hexdigest()[:12]


class SkillError(ValueError):
    """A stored skill that is not a full, runnable program (says which and why)."""


class SkillStore:
    """Skills as JSON files in one folder."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)

    def save(self, task: str, calls) -> Skill | None:
        """Store `calls` as a skill; None when there is nothing to store."""
        steps = tuple({"tool": c["tool"], "args": c["args"]} for c in calls)
        if not steps:
            return None
        if any(s["tool"] == RUN for s in steps):
            raise SkillError("a skill cannot run a skill: expand the run into its steps first")
        skill = Skill(skill_name(steps), task, steps)
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"{skill.name}.json"
        if not path.exists():
            doc = {"name": skill.name, "task": task, "steps": list(steps), "created": time.time()}
            atomic_write(path, json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
        return skill

    def names(self) -> list[str]:
        """The stored skill names (not yet checked)."""
        if not self.folder.is_dir():
            return []
        return sorted(p.stem for p in self.folder.glob(PREFIX + "*.json") if p.is_file())

    def remove(self, name: str) -> None:
        (self.folder / f"{name}.json").unlink()

    def load(self, name: str) -> Skill:
        """Read one skill and check its shape and content address (not yet its tools)."""
        if not name.startswith(PREFIX) or "/" in name or "\\" in name:
            raise SkillError(f"{name!r} is not a skill name (learned-<hash>)")
        path = self.folder / f"{name}.json"
        try:
            doc = json.loads(path.read_text())
        except FileNotFoundError:
            raise SkillError(f"no stored skill {name!r}") from None
        except (OSError, ValueError) as e:
            raise SkillError(f"skill {name!r} cannot be read: {e}") from None
        steps = doc.get("steps") if isinstance(doc, dict) else None
        if not isinstance(steps, list) or not steps:
            raise SkillError(f"skill {name!r} has no steps")
        for i, s in enumerate(steps):
            if not (isinstance(s, dict) and set(s) == {"tool", "args"} and isinstance(s["tool"], str)
                    and isinstance(s["args"], dict)):
                raise SkillError(f"skill {name!r}, step {i + 1}: expected {{\"tool\": NAME, \"args\": {{...}}}}")
        if skill_name(steps) != name:
            raise SkillError(f"skill {name!r}: its steps do not hash to its name (edited or damaged)")
        return Skill(name, str(doc.get("task", "")), tuple(steps))

    def check(self, skill: Skill, view) -> str:
        """"" when every step of `skill` can run under `view` (a policy.View), else why not."""
        for i, step in enumerate(skill.steps):
            if step["tool"] == RUN:
                return f"step {i + 1} runs a skill; skills are flat"
            why = view.check(step)
            if why:
                return f"step {i + 1}: {why}"
        return ""

    def runnable(self, ctx) -> list[str]:
        """The domain of `run`'s name: stored skills that load and check under the view being
        built (its policy, without `run` itself)."""
        from railcall.agent.policy import view as make_view

        names = self.names()
        if not names:
            return []
        inner = make_view(ctx.table, ctx.policy.with_(deny=ctx.policy.deny | {RUN}))
        out = []
        for name in names:
            try:
                skill = self.load(name)
            except SkillError:
                continue
            if not self.check(skill, inner):
                out.append(name)
        return out
