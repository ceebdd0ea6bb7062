"""The ground floor: where railcall keeps its caches, and the content key of a large file. Imported
by the vocabulary, the data fetcher and the model store alike, and importing nothing of railcall."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def railcall_home() -> Path:
    """The root of railcall's caches: `$RAILCALL_HOME`, else `~/.cache/railcall`."""
    env = os.environ.get("RAILCALL_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "railcall"


def file_digest(path: Path) -> str:
    """A content key for a large file that costs milliseconds: its size plus the hash of its
    first and last MiB. GGUF files carry their metadata and tensor index at the front, so two
    different models never share this key in practice; it names a cache, it does not guard one."""
    h = hashlib.sha256()
    size = path.stat().st_size
    h.update(str(size).encode())
    with path.open("rb") as f:
        h.update(f.read(1 << 20))
        if size > 2 << 20:
            f.seek(-(1 << 20), os.SEEK_END)
            h.update(f.read(1 << 20))
    return h.hexdigest()[:16]
