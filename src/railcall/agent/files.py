"""The sandbox folder: every path confined to it, every write atomic.

The grammar keeps the model to paths that exist, but the tools do not rely on it: a caller that
bypasses the grammar (a skill file edited by hand, a library user, a bug) meets the same checks
here. A path is refused when it is absolute, has a `..` component, names railcall's own state
folder (`.railcall`, where skills and memory live), contains a NUL, or resolves -- after every
symlink is followed -- to somewhere outside the workspace.

Every write goes through `railcall.atomic.atomic_write` (the old file or the new one, never
half of one). Its temporary names start with `.railcall-tmp-`, so the file listing never offers
them and a leftover from a killed writer can be swept (`sweep_temp`).

Lifecycle: a Workspace is made once per agent session; it holds nothing but its root.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from railcall.atomic import TMP_PREFIX, atomic_write  # noqa: F401 (atomic_write: the agent's writer)

STATE_DIR = ".railcall"


class PathRefused(ValueError):
    """A path argument that would leave the workspace (or touch railcall's state folder)."""


def sweep_temp(folder: Path) -> int:
    """Remove temporary files a killed writer left under `folder`; returns how many."""
    n = 0
    for p in Path(folder).rglob(TMP_PREFIX + "*"):
        if p.is_file() and not p.is_symlink():
            p.unlink(missing_ok=True)
            n += 1
    return n


class Workspace:
    """A folder the agent's tools may read and write, and nothing outside it."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root).expanduser().resolve()
        if not self.root.is_dir():
            raise FileNotFoundError(f"workspace {self.root} is not a folder; create it or pass another --workspace")
        self.state = self.root / STATE_DIR

    def resolve(self, rel: str) -> Path:
        """The real path of `rel` inside the workspace, or PathRefused saying why not."""
        if not isinstance(rel, str) or not rel.strip():
            raise PathRefused("an empty path; give a path relative to the workspace")
        if "\x00" in rel:
            raise PathRefused(f"{rel!r} contains a NUL character")
        posix = PurePosixPath(rel.replace("\\", "/"))
        if posix.is_absolute() or (len(rel) > 1 and rel[1] == ":"):
            raise PathRefused(f"{rel!r} is absolute; paths are relative to the workspace")
        if ".." in posix.parts:
            raise PathRefused(f"{rel!r} climbs out with '..'; paths stay inside the workspace")
        if posix.parts and posix.parts[0] == STATE_DIR:
            raise PathRefused(f"{rel!r} is railcall's state folder; skills and memory have their own tools")
        real = (self.root / posix).resolve()  # follows every symlink, existing or not
        if real != self.root and self.root not in real.parents:
            raise PathRefused(f"{rel!r} leads outside the workspace (through a symlink)")
        if real != self.root and real.relative_to(self.root).parts[0] == STATE_DIR:
            raise PathRefused(f"{rel!r} leads into railcall's state folder")
        return real

    def files(self) -> list[str]:
        """Every regular file a tool may read, relative and sorted (the live domain of
        read_file's path). Hidden entries and links that leave the workspace are left out."""
        return self._walk(want_dirs=False)

    def dirs(self) -> list[str]:
        """"." and every folder under the workspace (the live domain of list_dir's path)."""
        return ["."] + self._walk(want_dirs=True)

    def _walk(self, want_dirs: bool, limit: int = 2000) -> list[str]:
        out: list[str] = []
        for top, dirnames, filenames in os.walk(self.root):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            names = dirnames if want_dirs else sorted(f for f in filenames if not f.startswith("."))
            for name in names:
                rel = Path(top, name).relative_to(self.root).as_posix()
                try:
                    real = self.resolve(rel)
                except PathRefused:
                    continue
                if (real.is_dir() if want_dirs else real.is_file()):
                    out.append(rel)
                if len(out) >= limit:  # a domain of thousands still compiles; this bounds a runaway tree
                    return out
        return out
