"""The sandbox folder: every path confined to it, every write atomic.

The grammar keeps the model to paths that exist, but the tools do not rely on it: a caller that
bypasses the grammar (a skill file edited by hand, a library user, a bug) meets the same checks
here. A path is refused when it is absolute, has a `..` component, names railcall's own state
folder (`.railcall`, where skills and memory live), contains a NUL, or leads -- through any
symlink -- to somewhere outside the workspace or into `.railcall`.

Checking a path and then opening it by name are two lookups, and a folder swapped for a symlink
to outside between them redirects the second (a race another process in the workspace can win:
reads returned outside content and writes landed outside). So the check *is* the lookup: every
operation walks the path from an open descriptor of the root, one component at a time, with
`O_NOFOLLOW | O_DIRECTORY` relative to the folder before it (`_walk`). The kernel never follows
a link; a link met on the way is read (`readlink`) and its target walked the same way, from the
root when absolute, so it can lead anywhere inside and nowhere outside. A component swapped for
a link after it was read fails its `O_NOFOLLOW` open instead of being followed. The file is then
opened, or written and renamed (`atomic.write_at`), relative to the folder's descriptor.

A regular file with more than one name (`st_nlink > 1`) is refused for reading unless the
policy says `"hard_links": true`: a hard link to an outside file (or to `.railcall/memory.jsonl`)
looks like an ordinary file inside, and no path check can tell. Writing replaces the name with a
new file, so a write never reaches a hard link's other names.

Writes and appends are whole-or-nothing: the temporary file is made in railcall's own folder
`.railcall/tmp/` and renamed into place (beside the target if that folder is on another file
system). `sweep_temp` of the state folder removes a killed writer's leftovers and never touches
a user's file, whatever its name.

railcall's own folder is walked the same way, more strictly (`StateFolder`): no link in it is
followed at all. Walks of the tree (`files`, `dirs`) are iterative and stop MAX_DEPTH folders
deep, saying so in `notice`.

Known limit: a folder moved out of the workspace (by a process that can write outside it) while
a walk holds its descriptor is still walked; the result stays under that folder.

Lifecycle: a Workspace is made once per agent session; it holds nothing but its root.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from pathlib import Path, PurePosixPath
from typing import Callable

from railcall.atomic import TMP_PREFIX, atomic_write, write_at  # noqa: F401 (atomic_write: the agent's writer)

STATE_DIR = ".railcall"
TMP_DIR = "tmp"  # under STATE_DIR: where workspace writes make their temporary files
MAX_LINKS = 40  # symlinks followed in one path, as the kernel's own limit: more is a loop (ELOOP)
MAX_TRIES = 100  # walks of one append whose file another writer replaced meanwhile (each wait is one write)
MAX_DEPTH = 64  # folders deep: a path, a walk of the workspace or of the state folder goes no further
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class PathRefused(ValueError):
    """A path argument that would leave the workspace (or touch railcall's state folder)."""


class StateRefused(PathRefused):
    """A symlink (or anything but a regular file or folder) where railcall keeps its own files."""


def sweep_temp(folder: Path, older_than: float = 0.0) -> int:
    """Remove temporary files a killed writer left under `folder`, last modified more than
    `older_than` seconds ago; returns how many. The agent sweeps its state folder only
    (`Agent.for_workspace`), a minute's worth of files spared: a user's file in the workspace that
    happens to start with `.railcall-tmp-` is theirs, and a fresh one in `.railcall/tmp/` may be
    another agent's write in progress on the same workspace. No link is followed."""
    n, now = 0, time.time()
    for dfd, name, st, _ in StateFolder(folder).entries():
        if name.startswith(TMP_PREFIX) and stat.S_ISREG(st.st_mode) and now - st.st_mtime >= older_than:
            try:
                os.unlink(name, dir_fd=dfd)
            except FileNotFoundError:
                continue
            n += 1
    return n


class StateFolder:
    """A folder of railcall's own files -- a workspace's `.railcall/`, or a part of it such as
    `.railcall/skills/` -- in which no link is ever followed.

    A workspace can arrive with links planted in its state folder (`.railcall/trace.jsonl ->
    ../../victim`), and opening such a file by name writes the trace, a note or a skill wherever
    the link points, under --read-only too. So every file here is opened the way the workspace's
    own files are (`Workspace._walk`): from a descriptor of the folder that holds `.railcall`
    (the *anchor*, the user's workspace, opened by its name), one component at a time with
    `O_NOFOLLOW` relative to the one before, new files created with `O_EXCL` or renamed into
    place (`atomic.write_at`). A link met at any component is a `StateRefused` naming it and
    saying what to do; it is never read through either (a planted memory.jsonl would otherwise
    feed an outside file to the prompt as notes). A file appended to in place (the trace, the
    memory store) must also have one name only: a hard link's other name may be outside.

    A folder whose path holds no `.railcall` (a store a library caller put elsewhere) is its own
    anchor: the files in it are still never links.

    Lifecycle: plain data, made per store; every call opens and closes its own descriptors."""

    def __init__(self, folder: str | os.PathLike):
        self.path = Path(os.path.abspath(os.path.expanduser(folder)))
        parts = self.path.parts
        if STATE_DIR in parts:
            i = len(parts) - 1 - parts[::-1].index(STATE_DIR)
            self.anchor, self.parts = Path(*parts[:i]), parts[i:]
        else:
            self.anchor, self.parts = self.path, ()

    def shown(self, rel: str = "") -> str:
        """The path of `rel` beneath this folder, as an error names it."""
        return str(self.path / rel) if rel else str(self.path)

    def _refused(self, dir_fd: int, name: str, shown: str, wanted: str) -> StateRefused:
        target = _readlink(name, dir_fd)
        what = f"a symlink (to {target})" if target is not None else f"not a {wanted}"
        return StateRefused(f"{shown} is {what}; railcall never follows a link in its state folder "
                            f"{STATE_DIR}/ (a planted one would send its writes outside the workspace): remove "
                            f"it (rm {shown}), or use another --workspace")

    def dir(self, sub: str = "", *, create: bool = False) -> int:
        """A descriptor of this folder (or `sub` beneath it), every component opened without
        following a link; `create`: make the missing ones. The caller closes it."""
        if create:
            self.anchor.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.anchor, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        todo, done = [*self.parts, *[p for p in sub.split("/") if p]], []
        try:
            while todo:
                part = todo[0]
                shown = str(self.anchor.joinpath(*done, part))
                try:
                    nxt = os.open(part, _DIR, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise FileNotFoundError(errno.ENOENT, "no such folder", shown) from None
                    try:
                        os.mkdir(part, 0o755, dir_fd=fd)
                    except FileExistsError:
                        pass
                    continue  # and open it on the next turn, the same careful way
                except OSError as e:
                    if e.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise self._refused(fd, part, shown, "folder") from None
                    raise
                os.close(fd)
                fd = nxt
                done.append(todo.pop(0))
            return fd
        except BaseException:
            os.close(fd)
            raise

    def _split(self, rel: str) -> tuple[str, str]:
        sub, _, name = rel.rpartition("/")
        if not name or name in (".", ".."):
            raise StateRefused(f"{rel!r} is not a file name in {self.shown()}")
        return sub, name

    def open(self, rel: str, flags: int, *, one_name: bool = False) -> int:
        """A descriptor of the regular file `rel`, opened with `flags` (`O_CREAT`: folders made
        on the way) without following a link; `one_name`: a file with other names (hard links)
        is refused too, for a file appended to in place."""
        sub, name = self._split(rel)
        dfd = self.dir(sub, create=bool(flags & os.O_CREAT))
        try:
            try:
                fd = os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644, dir_fd=dfd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                    raise self._refused(dfd, name, self.shown(rel), "regular file") from None
                raise
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or (one_name and st.st_nlink > 1):
                os.close(fd)
                if stat.S_ISREG(st.st_mode):
                    raise StateRefused(f"{self.shown(rel)} has {st.st_nlink} names (a hard link, whose other "
                                       "names may be outside the workspace); railcall appends only to a file of "
                                       f"its own: remove it (rm {self.shown(rel)})")
                raise self._refused(dfd, name, self.shown(rel), "regular file")
            return fd
        finally:
            os.close(dfd)

    def read(self, rel: str) -> bytes | None:
        """The bytes of the regular file `rel`; None when it is missing."""
        try:
            fd = self.open(rel, os.O_RDONLY)
        except FileNotFoundError:
            return None
        with os.fdopen(fd, "rb") as f:
            return f.read()

    def write(self, rel: str, data: bytes) -> None:
        """Replace `rel` whole with `data` (`atomic.write_at`, the temporary file beside it); a
        link there is refused, never replaced or followed."""
        sub, name = self._split(rel)
        dfd = self.dir(sub, create=True)
        try:
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            if st is not None and not stat.S_ISREG(st.st_mode):
                raise self._refused(dfd, name, self.shown(rel), "regular file")
            write_at(dfd, name, data, mode=stat.S_IMODE(st.st_mode) if st is not None else None)
        finally:
            os.close(dfd)

    def unlink(self, rel: str) -> None:
        sub, name = self._split(rel)
        dfd = self.dir(sub)
        try:
            os.unlink(name, dir_fd=dfd)
        finally:
            os.close(dfd)

    def names(self, sub: str = "") -> list[str]:
        """The names in this folder (or `sub`), sorted; [] when it is missing."""
        try:
            dfd = self.dir(sub)
        except FileNotFoundError:
            return []
        try:
            return sorted(os.listdir(dfd))
        finally:
            os.close(dfd)

    def entries(self, max_depth: int = MAX_DEPTH):
        """(folder descriptor, name, lstat, path relative to this folder) of everything beneath
        it, walked without following a link and without recursion, `max_depth` folders deep at
        most; the descriptor is open only until the next item. Nothing when it is missing."""
        try:
            top = self.dir()
        except FileNotFoundError:
            return
        try:
            names = iter(sorted(os.listdir(top)))
        except BaseException:
            os.close(top)
            raise
        stack = [(top, names, "", 0)]  # one open folder per level, no more
        try:
            while stack:
                dfd, names, prefix, depth = stack[-1]
                name = next(names, None)
                if name is None:
                    os.close(stack.pop()[0])
                    continue
                try:
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                yield dfd, name, st, prefix + name
                if stat.S_ISDIR(st.st_mode) and depth < max_depth:
                    try:
                        fd = os.open(name, _DIR, dir_fd=dfd)
                    except OSError:
                        continue  # swapped for a link or removed meanwhile: not walked
                    try:
                        stack.append((fd, iter(sorted(os.listdir(fd))), prefix + name + "/", depth + 1))
                    except OSError:
                        os.close(fd)
        finally:
            for dfd, *_ in stack:  # the consumer stopped early
                os.close(dfd)

    def links(self) -> list[str]:
        """The path of every symlink beneath this folder (the agent refuses them at start)."""
        return [self.shown(rel) for _, _, st, rel in self.entries() if stat.S_ISLNK(st.st_mode)]


def _readlink(name: str, dir_fd: int) -> str | None:
    """The target of `name` in `dir_fd` when it is a symlink; None when it is not one or is absent."""
    try:
        return os.readlink(name, dir_fd=dir_fd)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        if e.errno == errno.EINVAL:  # not a link
            return None
        raise


Admit = Callable[[str], bool]  # a path -> whether the policy lets a tool use it


def _admitted(rel: str, parts: tuple[str, ...], admit: Admit | None) -> None:
    """Refuse, unless `admit` passes both the path as given and the one the walk resolved it to
    (`parts`). The view matched the policy's narrowing when it was built; a file re-linked
    since (docs/a.md -> ../private/secret.txt) is caught here, on the very walk that opens it."""
    if admit is None:
        return
    real = "/".join(parts) or "."
    if not admit(rel):
        raise PathRefused(f"{rel!r} is not admitted by the policy's narrowing of this tool's path")
    if not admit(real):
        # (the real path is not named: the model would learn a name the policy keeps from it)
        raise PathRefused(f"{rel!r} now leads to a file the policy's narrowing of this tool's path does not "
                          "admit (re-linked since the view was built); nothing was read or written")


class Workspace:
    """A folder the agent's tools may read and write, and nothing outside it."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root).expanduser().resolve()
        if not self.root.is_dir():
            raise FileNotFoundError(f"workspace {self.root} is not a folder; create it or pass another --workspace")
        self.state = self.root / STATE_DIR
        self.notice = ""  # what the last walk of the tree left out (too deep, too many), or ""

    # -- resolving -------------------------------------------------------------------------------

    def _parts(self, rel: str) -> list[str]:
        """The components of `rel`, or PathRefused when it is not a workspace path at all."""
        if not isinstance(rel, str) or not rel.strip():
            raise PathRefused("an empty path; give a path relative to the workspace")
        if "\x00" in rel:
            raise PathRefused(f"{rel!r} contains a NUL character")
        posix = PurePosixPath(rel.replace("\\", "/"))
        if posix.is_absolute() or (len(rel) > 1 and rel[1] == ":"):
            raise PathRefused(f"{rel!r} is absolute; paths are relative to the workspace")
        if ".." in posix.parts:
            raise PathRefused(f"{rel!r} climbs out with '..'; paths stay inside the workspace")
        if len(posix.parts) > MAX_DEPTH:
            raise PathRefused(f"{rel[:60]!r}... is deeper than {MAX_DEPTH} folders; railcall's tools go no deeper")
        if posix.parts and posix.parts[0] == STATE_DIR:
            raise PathRefused(f"{rel!r} is railcall's state folder; skills and memory have their own tools")
        return list(posix.parts)

    def _walk(self, rel: str, *, last: str, make_dirs: bool = False) -> tuple[int, str, tuple[str, ...]]:
        """Resolve `rel` beneath the root without the kernel following any link (module docstring).

        last="entry": returns (a descriptor of the folder holding the final entry, the entry's
        name, the real path's components); links in the final component are followed too, so
        the name is never a link when this returns (a new name is absent). last="dir": every
        component is a folder; returns (a descriptor of it, "", components). The caller closes
        the descriptor. make_dirs: create missing folders on the way."""
        todo = self._parts(rel)
        fds = [os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)]
        names: list[str] = []
        links = 0
        try:
            while todo:
                part = todo.pop(0)
                if part in ("", "."):
                    continue
                if part == "..":  # only from a link's target: the path itself was checked
                    if not names:
                        raise PathRefused(f"{rel!r} leads outside the workspace (through a symlink)")
                    os.close(fds.pop())
                    names.pop()
                    continue
                if not names and part == STATE_DIR:
                    raise PathRefused(f"{rel!r} leads into railcall's state folder")
                if last == "entry" and not todo:
                    target = _readlink(part, fds[-1])
                    if target is None:
                        return os.dup(fds[-1]), part, (*names, part)
                else:
                    try:
                        fd = os.open(part, _DIR, dir_fd=fds[-1])
                    except FileNotFoundError:
                        if not make_dirs:
                            raise FileNotFoundError(errno.ENOENT, "no such folder in the workspace",
                                                    "/".join((*names, part))) from None
                        try:
                            os.mkdir(part, dir_fd=fds[-1])
                        except FileExistsError:
                            pass
                        todo.insert(0, part)  # and open it on the next turn, the same careful way
                        continue
                    except OSError as e:
                        if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                            raise
                        target = _readlink(part, fds[-1])
                        if target is None:
                            raise NotADirectoryError(errno.ENOTDIR, "a file where a folder was expected",
                                                     "/".join((*names, part))) from None
                    else:
                        fds.append(fd)
                        names.append(part)
                        if len(names) > MAX_DEPTH:  # through links: the path itself was counted
                            raise PathRefused(f"{rel!r} leads deeper than {MAX_DEPTH} folders (through a "
                                              "symlink); railcall's tools go no deeper")
                        continue
                links += 1
                if links > MAX_LINKS:
                    raise PathRefused(f"{rel!r} goes through more than {MAX_LINKS} symlinks (a loop); "
                                      "remove the loop or use another path")
                target_path = PurePosixPath(target)
                if target_path.is_absolute():
                    try:
                        inside = target_path.relative_to(self.root)
                    except ValueError:
                        raise PathRefused(f"{rel!r} leads outside the workspace (through a symlink)") from None
                    for fd in fds[1:]:
                        os.close(fd)
                    del fds[1:]
                    names.clear()
                    todo = list(inside.parts) + todo
                else:
                    todo = list(target_path.parts) + todo
            return os.dup(fds[-1]), ("." if last == "entry" else ""), tuple(names)
        finally:
            for fd in fds:
                os.close(fd)

    def resolve(self, rel: str) -> Path:
        """The real path of `rel` inside the workspace, or PathRefused saying why not. (For
        showing and matching only: the tools never open a path by name, see `_walk`.)"""
        fd, _, parts = self._walk(rel, last="entry")
        os.close(fd)
        return self.root.joinpath(*parts)

    def real(self, rel: str) -> str | None:
        """`rel` with every link resolved, relative to the root ("." for the root itself); None
        when it is refused. What a policy's glob or list is matched against, besides `rel`."""
        try:
            fd, _, parts = self._walk(rel, last="entry")
        except (PathRefused, OSError):
            return None
        os.close(fd)
        return "/".join(parts) or "."

    def kind(self, rel: str, *, hard_links: bool = False) -> str | None:
        """"file" (a regular file a tool may read), "dir", or None (refused, missing, other)."""
        try:
            fd, name, _ = self._walk(rel, last="entry")
        except (PathRefused, OSError):
            return None
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            return None
        finally:
            os.close(fd)
        if stat.S_ISDIR(st.st_mode):
            return "dir"
        if stat.S_ISREG(st.st_mode) and (st.st_nlink == 1 or hard_links):
            return "file"
        return None

    # -- the operations the tools use --------------------------------------------------------------

    def read(self, rel: str, limit: int, *, hard_links: bool = False, admit: Admit | None = None) -> bytes:
        """Up to `limit` bytes of the regular file `rel` (`admit`: see `_admitted`)."""
        ffd = self._open_file(rel, os.O_RDONLY, hard_links=hard_links, admit=admit,
                              folder=f"{rel!r} is a folder; list it with list_dir")
        with os.fdopen(ffd, "rb") as f:
            return f.read(limit)

    def _open_file(self, rel: str, flags: int, *, hard_links: bool, folder: str, make_dirs: bool = False,
                   admit: Admit | None = None) -> int:
        """A descriptor of the regular file `rel`, opened with `flags` relative to its folder's
        handle, the last component not followed (a link made there since the walk looked: walk
        again, three times at most). A folder is an IsADirectoryError saying `folder`; anything
        but a regular file, or a hard link unless `hard_links`, is refused; so is a file the
        walk resolved to that `admit` does not admit."""
        for _ in range(3):
            fd, name, parts = self._walk(rel, last="entry", make_dirs=make_dirs)
            try:
                _admitted(rel, parts, admit)
                if name == ".":
                    raise IsADirectoryError(folder)
                ffd = os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644, dir_fd=fd)
            except OSError as e:
                if e.errno == errno.ELOOP:
                    continue
                if e.errno == errno.EISDIR:
                    raise IsADirectoryError(folder) from None
                raise
            finally:
                os.close(fd)
            try:
                st = os.fstat(ffd)
                if stat.S_ISDIR(st.st_mode):
                    raise IsADirectoryError(folder)
                if not stat.S_ISREG(st.st_mode):
                    raise PathRefused(f"{rel!r} is not a regular file")
                if st.st_nlink > 1 and not hard_links:
                    raise PathRefused(f"{rel!r} is a hard link (one of {st.st_nlink} names of one file, others "
                                      "may be outside the workspace); a policy with \"hard_links\": true allows it")
            except BaseException:
                os.close(ffd)
                raise
            return ffd
        raise PathRefused(f"{rel!r} kept turning into a symlink while it was opened; try again")

    def write(self, rel: str, data: bytes, *, admit: Admit | None = None) -> None:
        """Replace `rel` whole with `data`, creating folders on the way; a link is written
        through to its target inside the workspace (`admit`: see `_admitted`)."""
        fd, name, parts = self._walk(rel, last="entry", make_dirs=True)
        try:
            _admitted(rel, parts, admit)
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            if name == "." or (st is not None and stat.S_ISDIR(st.st_mode)):
                raise IsADirectoryError(f"{rel!r} is a folder; give a file's path")
            mode = stat.S_IMODE(st.st_mode) if st is not None and stat.S_ISREG(st.st_mode) else None
            tmp = self._tmp_dir()
            try:
                write_at(fd, name, data, mode=mode, tmp_dir_fd=tmp)
            finally:
                if tmp is not None:
                    os.close(tmp)
        finally:
            os.close(fd)

    def append(self, rel: str, data: bytes, *, hard_links: bool = False, admit: Admit | None = None) -> int:
        """Add `data` at the end of the regular file `rel` (made if missing), on a line of its
        own: after a newline where the file does not end with one, and ending with one. Returns
        the bytes added.

        Whole-or-nothing, like `write`: the file's content and the line go to a temporary file
        that is renamed over it (`atomic.write_at`, the copy read from the descriptor the walk
        opened), so an append cut short (a full disk, a kill) leaves the file as it was, never
        a partial last line -- written with O_APPEND in place, a kill mid-write left one. Two
        writers appending at once both land: each holds an exclusive `flock` on the file it
        copies, and one that finds the name renamed to a newer file while it waited starts
        again from that one. The rename replaces the name, so an append, like a write, never
        reaches a hard link's other names."""
        if data and not data.endswith(b"\n"):
            data += b"\n"
        for _ in range(MAX_TRIES):
            ffd = self._open_file(rel, os.O_RDONLY | os.O_CREAT, hard_links=hard_links, make_dirs=True,
                                  admit=admit, folder=f"{rel!r} is a folder; give a file's path")
            try:
                fd, name, parts = self._walk(rel, last="entry")
                try:
                    # Appends to files of one folder take turns on the folder's lock (released when
                    # fd is closed, after the rename): the file itself is replaced by every append,
                    # so a lock on it let a waiting append find it gone again and again (150
                    # appends from each of two processes ran out of tries).
                    fcntl.flock(fd, fcntl.LOCK_EX)
                    # the file as it is now that no other append can replace it (the first open made
                    # it, and its folders, where missing)
                    os.close(ffd)
                    ffd = -1
                    ffd = self._open_file(rel, os.O_RDONLY, hard_links=hard_links, admit=admit,
                                          folder=f"{rel!r} is a folder; give a file's path")
                    _admitted(rel, parts, admit)
                    try:
                        now = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    mine = os.fstat(ffd)
                    if (now.st_dev, now.st_ino) != (mine.st_dev, mine.st_ino):
                        continue  # another append (or a write) replaced it while this one waited
                    if mine.st_size and os.pread(ffd, 1, mine.st_size - 1) != b"\n":
                        data = b"\n" + data
                    tmp = self._tmp_dir()
                    try:
                        write_at(fd, name, data, mode=stat.S_IMODE(mine.st_mode), tmp_dir_fd=tmp, copy_from=ffd)
                    finally:
                        if tmp is not None:
                            os.close(tmp)
                    return len(data)
                finally:
                    os.close(fd)
            finally:
                if ffd >= 0:
                    os.close(ffd)
        raise PathRefused(f"{rel!r} kept being replaced while it was appended to; try again")

    def list(self, rel: str, *, admit: Admit | None = None) -> list[str]:
        """The visible entries of the folder `rel`, a folder's name ending in "/" (`admit`: see
        `_admitted`)."""
        fd, _, parts = self._walk(rel, last="dir")
        try:
            _admitted(rel, parts, admit)
            with os.scandir(fd) as it:
                entries = [(e.name, e.is_symlink(), e.is_dir(follow_symlinks=False)) for e in it]
        finally:
            os.close(fd)
        out = []
        for name, is_link, is_dir in sorted(entries):
            if name.startswith("."):
                continue
            if is_link:  # a link is a folder when it leads to one inside the workspace
                is_dir = self.kind("/".join((*parts, name))) == "dir"
            out.append(name + ("/" if is_dir else ""))
        return out

    def _tmp_dir(self) -> int | None:
        """A descriptor of `.railcall/tmp/` (made if missing, walked without following links);
        None when it cannot be had (no permission), and the temporary file goes beside the
        target. A link there is a StateRefused naming it, not a reason to look elsewhere."""
        try:
            return StateFolder(self.state).dir(TMP_DIR, create=True)
        except StateRefused:
            raise
        except OSError:
            return None

    # -- the live domains ---------------------------------------------------------------------------

    def files(self, *, hard_links: bool = False) -> list[str]:
        """Every regular file a tool may read, relative and sorted (the live domain of
        read_file's path). Hidden entries, links that leave the workspace or loop, and hard
        links (unless `hard_links`) are left out."""
        return self._scan(want="file", hard_links=hard_links)

    def dirs(self) -> list[str]:
        """"." and every folder under the workspace (the live domain of list_dir's path)."""
        return ["."] + self._scan(want="dir")

    def _scan(self, want: str, hard_links: bool = False, limit: int = 2000) -> list[str]:
        """The walk behind `files` and `dirs`: folder by folder from the root's descriptor (each
        folder opened with O_NOFOLLOW relative to the one before, so it never descends through a
        link), a folder's entries before its subfolders', without recursion: os.walk recursed
        once per level, and a workspace 1,000 folders deep raised RecursionError in every view.
        Entries deeper than MAX_DEPTH components, and those past `limit`, are left out and
        `notice` says so."""
        out: list[str] = []
        self.notice = ""
        top = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        stack: list[tuple[int, object, str, int]] = []  # (folder fd, its subfolders to visit, path, depth)

        def visit(fd: int, rel: str, depth: int) -> bool:
            """Push the folder `fd` (its path `rel`; the stack owns it from here) with its
            subfolders and add what is wanted of its entries; False when `limit` is reached."""
            stack.append((fd, iter(()), rel, depth))
            with os.scandir(fd) as it:
                entries = sorted((e.name, e.is_dir(follow_symlinks=False)) for e in it if not e.name.startswith("."))
            subdirs = [name for name, is_dir in entries if is_dir]
            stack[-1] = (fd, iter(subdirs if depth < MAX_DEPTH else ()), rel, depth)
            if subdirs and depth >= MAX_DEPTH and not self.notice:
                self.notice = (f"folders deeper than {MAX_DEPTH} levels are left out of the file lists "
                               f"(the first: {rel}/{subdirs[0]}/)")
            for name, is_dir in entries:
                if (want == "dir") != is_dir:
                    continue
                path = f"{rel}/{name}" if rel else name
                if self.kind(path, hard_links=hard_links) == want:
                    out.append(path)
                if len(out) >= limit:  # a domain of thousands still compiles; this bounds a runaway tree
                    self.notice = self.notice or f"the file lists stop at {limit} entries"
                    return False
            return True

        try:
            if not visit(top, "", 0):
                return out
            while stack:
                fd, subdirs, rel, depth = stack[-1]
                name = next(subdirs, None)
                if name is None:
                    os.close(stack.pop()[0])
                    continue
                try:
                    sub = os.open(name, _DIR, dir_fd=fd)
                except OSError:
                    continue  # swapped for a link or removed meanwhile: not walked
                try:
                    more = visit(sub, f"{rel}/{name}" if rel else name, depth + 1)
                except OSError:
                    continue  # unreadable: left out (its descriptor is closed when it is popped)
                if not more:
                    return out
            return out
        finally:
            for fd, *_ in stack:
                os.close(fd)
