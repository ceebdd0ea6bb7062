"""Skills: a successful episode's calls, stored under a content-addressed name.

When an episode ends with an answer and every call in it succeeded, its call sequence (with any
skill it ran expanded in place, so a skill never calls a skill) is a *skill*: a small program
that can be replayed with one call, `{"tool":"run","args":{"name":"learned-3f2a91c4e07b"}}`.

The name is `learned-` + the first 12 hex digits of the SHA-256 of the canonical JSON of the
steps, so the same program is stored once, and a file whose content does not match its name
is refused as tampered or damaged.

A skill the model has to spell from memory is a skill it cannot use. So
`run`'s `name` argument is enumerated from this store at every step (`runnable`), and only a
skill that is checked, at load, to be a full runnable program is offered: the file parses, its
name matches its content, it has at least one step, every step names a tool of the table (other
than `run`), and every step's arguments are spellable by the grammar of the view it would run
under -- so a skill that reads a file that has since been deleted, or writes under a read-only
policy, is not offered at all.

A correct hash proves only that a file is intact, not who wrote it: anyone who can write to the
workspace could plant `learned-<hash>.json` with a write in it. So every skill carries where it
came from (`origin`: `episode`, an episode this runtime completed, or `approved`, a skill the
user approved once with `railcall skills approve`) and an HMAC-SHA256 `signature` over every
other field of the file -- its name, steps, origin, the task it was learned from (the text the
user reads before approving it) and when it was made -- made with a key of this workspace's
own. A field edited, or one added that railcall never writes, breaks it. The key is 32 random bytes in
`$RAILCALL_KEYS` (default `$RAILCALL_HOME/keys/`, outside every workspace), one file per
workspace folder, readable by its owner only. A skill without a valid signature -- made by hand,
copied from another workspace, its origin edited -- is refused at load, so never offered and
never run. Losing the key (a wiped cache) makes the stored skills unsigned: they are refused
until approved again, or re-learned.

Files are written atomically and read without following a link at any component
(`files.StateFolder`): a planted `skills -> /elsewhere` or `learned-<hash>.json -> /elsewhere`
is refused, never written through. Lifecycle: one store per state folder.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from railcall.agent.files import StateFolder

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


def key_folder() -> Path:
    """Where workspace keys live: `$RAILCALL_KEYS`, else `$RAILCALL_HOME/keys`."""
    env = os.environ.get("RAILCALL_KEYS")
    if env:
        return Path(env).expanduser()
    from railcall.home import railcall_home

    return railcall_home() / "keys"


class SkillStore:
    """Skills as JSON files in one folder, signed with the key of the folder's workspace."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self._state = StateFolder(self.folder)
        where = str(self.folder.expanduser().resolve())
        self.key_path = key_folder() / (hashlib.sha256(where.encode()).hexdigest()[:32] + ".key")
        self._key: bytes | None = None

    def _signing_key(self) -> bytes:
        """This workspace's key, made (0600, in a 0700 folder) on first use."""
        if self._key is None:
            self.key_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            try:
                fd = os.open(self.key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            except FileExistsError:
                pass
            else:
                with os.fdopen(fd, "w") as f:
                    f.write(secrets.token_hex(32) + "\n")
            self._key = bytes.fromhex(self.key_path.read_text().strip())
        return self._key

    def _signature(self, doc: dict) -> str:
        """The HMAC of every field of a skill's file but `signature` itself: whatever changes what
        the skill does, how it is offered or what the user is shown is covered."""
        canon = json.dumps({k: v for k, v in doc.items() if k != "signature"}, sort_keys=True,
                           separators=(",", ":"), ensure_ascii=False)
        return hmac.new(self._signing_key(), canon.encode(), hashlib.sha256).hexdigest()

    def _write(self, skill: "Skill", origin: dict) -> None:
        doc = {"name": skill.name, "task": skill.task, "steps": list(skill.steps), "created": time.time(),
               "origin": origin}
        doc["signature"] = self._signature(doc)
        self._state.write(f"{skill.name}.json", (json.dumps(doc, indent=1, ensure_ascii=False) + "\n").encode())

    def save(self, task: str, calls) -> Skill | None:
        """Store `calls` as a skill; None when there is nothing to store."""
        steps = tuple({"tool": c["tool"], "args": c["args"]} for c in calls)
        if not steps:
            return None
        if any(s["tool"] == RUN for s in steps):
            raise SkillError("a skill cannot run a skill: expand the run into its steps first")
        skill = Skill(skill_name(steps), task, steps)
        try:
            self.load(skill.name)  # stored and signed already: the same program is kept once
        except SkillError:
            self._write(skill, {"kind": "episode", "task": task})
        return skill

    def approve(self, name: str) -> Skill:
        """Sign a stored skill the user has read and approved (`railcall skills approve`): from
        then on it loads like a learned one. Its shape and hash are still checked."""
        skill = self.load(name, signed=False)
        self._write(skill, {"kind": "approved", "at": time.time()})
        return skill

    def names(self) -> list[str]:
        """The stored skill names (not yet checked)."""
        return [n[:-len(".json")] for n in self._state.names() if n.startswith(PREFIX) and n.endswith(".json")]

    def remove(self, name: str) -> None:
        self._state.unlink(f"{name}.json")

    def load(self, name: str, *, signed: bool = True) -> Skill:
        """Read one skill and check its shape, content address and (`signed`) its signature --
        not yet its tools."""
        if not name.startswith(PREFIX) or "/" in name or "\\" in name:
            raise SkillError(f"{name!r} is not a skill name (learned-<hash>)")
        try:
            data = self._state.read(f"{name}.json")
            if data is None:
                raise SkillError(f"no stored skill {name!r}")
            doc = json.loads(data)
        except (OSError, ValueError) as e:  # a StateRefused (a link there) among them
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
        if signed:
            origin, sig = doc.get("origin"), doc.get("signature")
            if not (isinstance(origin, dict) and isinstance(sig, str) and doc.get("name") == name
                    and hmac.compare_digest(sig, self._signature(doc))):
                raise SkillError(f"skill {name!r} is not signed by this workspace's key (made by hand, copied "
                                 f"from elsewhere, or the key in {self.key_path.parent} was lost); read its steps "
                                 f"in {self.folder / (name + '.json')} and run `railcall skills approve {name} "
                                 "-w WORKSPACE` to allow it, or delete the file")
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
