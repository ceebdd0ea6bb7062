"""Whole-or-nothing file writes, for every file railcall writes that someone will read back.

`atomic_write` writes to a temporary file in the target's own folder (same file system), flushes
and fsyncs it, then renames it over the target with `os.replace`, which is atomic on POSIX: a
reader, or a process killed at any instant, sees the old file or the new one, never half of one.
The temporary names start with `.railcall-tmp-` (`TMP_PREFIX`), so a leftover from a killed
writer is recognisable and can be swept (`railcall.agent.files.sweep_temp`).

The new file takes the old one's permission bits, and a symlink is written through (its target
is replaced, the link kept): a rename alone would make a 0600 file 0644, drop a script's +x, and
turn a link into a copy.

`write_at` is the same write relative to an open folder descriptor, for a caller that has
resolved the path itself and must not have it looked up again (the agent's workspace, where
another process may swap a folder for a symlink between a check and a use).

`mend_last_line` is the other half for append-only JSON-lines files (a trace, the memory store,
an eval's results): a writer killed mid-line leaves a last line without its newline, and the next
append would join it, losing both records. Called before appending, it ends the file on a
newline again.

Users: the agent's tools, skills and memory (`railcall.agent`), the eval's run files and reports
(`railcall.eval`), the benchmark's reports (`railcall.bench`) and `railcall coverage`.
"""

from __future__ import annotations

import errno
import fcntl
import io
import json
import os
import secrets
import stat
from pathlib import Path

TMP_PREFIX = ".railcall-tmp-"
CHUNK = 1 << 20  # bytes per write(2): a large file is written in pieces, none of them visible


def atomic_write(path: Path, data: bytes | str) -> None:
    """Write `data` to `path` so that it is replaced whole or not at all.

    A symlink is written through: its final target is the file replaced (the link stays a link).
    An existing file keeps its permission bits (a private 0600 file stays private, a script keeps
    +x); a new one is created 0644, less the umask. The owner is not carried over: the new file
    belongs to whoever writes it."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    path = Path(os.path.realpath(path))  # follows every link, existing or dangling
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        mode = None
    tmp = path.parent / _tmp_name(path.name)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        _fill(fd, data, mode)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    # the rename itself is durable once the folder's entry is on disk
    try:
        dfd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    _fsync_dir(dfd)
    os.close(dfd)


def write_at(dir_fd: int, name: str, data: bytes, *, mode: int | None = None, tmp_dir_fd: int | None = None,
             copy_from: int | None = None) -> None:
    """`atomic_write` relative to an open folder: `name` (one component) in `dir_fd` is replaced
    whole, and no path is looked up again, so a folder renamed or swapped for a symlink meanwhile
    cannot redirect the write. `name` itself is replaced, never followed (the caller resolves
    links). The temporary file is made in `tmp_dir_fd` (default: `dir_fd`) and renamed across;
    on another file system (EXDEV) it is made beside the target instead. `mode`: the permission
    bits to give the file (None: 0644 less the umask). `copy_from`: a descriptor whose content
    goes first, `data` after it (an append made whole-or-nothing: the old file plus the line,
    renamed over it)."""
    tmp_dir = dir_fd if tmp_dir_fd is None else tmp_dir_fd
    tmp = _tmp_name(name)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=tmp_dir)
    try:
        if copy_from is not None:
            offset = 0
            while chunk := os.pread(copy_from, CHUNK, offset):
                _write_all(fd, chunk)
                offset += len(chunk)
        _fill(fd, data, mode)
    except BaseException:
        os.close(fd)
        os.unlink(tmp, dir_fd=tmp_dir)
        raise
    os.close(fd)
    try:
        os.rename(tmp, name, src_dir_fd=tmp_dir, dst_dir_fd=dir_fd)
    except BaseException as e:
        os.unlink(tmp, dir_fd=tmp_dir)
        if isinstance(e, OSError) and e.errno == errno.EXDEV and tmp_dir != dir_fd:
            return write_at(dir_fd, name, data, mode=mode, copy_from=copy_from)
        raise
    _fsync_dir(dir_fd)


def _tmp_name(name: str) -> str:
    # a long name is cut so the temporary one stays within NAME_MAX (255 bytes)
    return f"{TMP_PREFIX}{name.encode()[:200].decode(errors='ignore')}-{secrets.token_hex(4)}"


def _fill(fd: int, data: bytes, mode: int | None) -> None:
    if mode is not None:
        os.fchmod(fd, mode)  # after the open, so the umask does not narrow it
    _write_all(fd, data)
    os.fsync(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view[:CHUNK])
        view = view[n:]


def _fsync_dir(dfd: int) -> None:
    try:
        os.fsync(dfd)
    except OSError:
        pass


def mend_last_line(path: Path | int) -> str:
    """Make a JSON-lines file end on a newline before the next append: a last line that parses
    only lacks its newline ("newline": it is written), one that does not is a torn record ("cut":
    it is cut off). "" when the file is missing, empty or already ends on a newline. `path` may
    be a descriptor open for reading and writing (the caller's, left open), for a file that
    must not be looked up by name again."""
    try:
        f = os.fdopen(os.dup(path), "r+b") if isinstance(path, int) else open(path, "r+b")
    except FileNotFoundError:
        return ""
    with f:
        end = f.seek(0, os.SEEK_END)
        if end == 0:
            return ""
        f.seek(end - 1)
        if f.read(1) == b"\n":
            return ""
        start = end  # find the last newline, reading backwards a chunk at a time
        while start > 0:
            size = min(CHUNK, start)
            f.seek(start - size)
            i = f.read(size).rfind(b"\n")
            if i >= 0:
                start = start - size + i + 1
                break
            start -= size
        f.seek(start)
        tail = f.read(end - start)
        try:
            json.loads(tail)
        except ValueError:
            f.truncate(start)
            return "cut"
        f.seek(end)
        f.write(b"\n")
        return "newline"


def append_line(fd: int, line: bytes, *, mend: bool = True) -> None:
    """Append `line` (one JSON record and its newline) whole to the file open at `fd` (O_APPEND,
    the caller's, left open): under an exclusive `flock` (released when the caller closes fd),
    after mending a torn last line where `mend` (`mend_last_line`), in as few write(2) calls as
    the kernel allows (one, for a record of a few KB). Two processes appending at once both keep
    their records; a record is never joined to a torn one."""
    fcntl.flock(fd, fcntl.LOCK_EX)
    if mend:
        mend_last_line(fd)
    view = memoryview(line)
    while view:
        view = view[os.write(fd, view):]


def atomic_savefig(fig, path: Path, dpi: int = 110) -> None:
    """A matplotlib figure saved as a PNG at `path`, replaced whole or not at all."""
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=dpi)
    atomic_write(path, png.getvalue())
