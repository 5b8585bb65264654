"""Root's files inside trees another user can write, never reached by path (#18).

The serve user owns ``serve_cache_root`` (its servers write the compile cache there), so it can
rename anything in it and plant links. Root's own directory in such a tree (the warm markers,
``servefleet-warm``, ``.servefleet-incoming``) is opened through the parent's file descriptor
with ``O_NOFOLLOW`` and trusted only when it is a real directory owned by root (the user running
the program) and writable by it alone: then nothing in it can be another user's. What a serving
process put in its place is moved aside, unread, and never counts. Files in it are read and
written relative to its descriptor, a write by a new temporary file renamed into place.

Stdlib only; the host programs import it (the probe carries it inline, as it carries layout).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import time
from collections.abc import Callable
from typing import Any, TypeVar

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_READ = 1 << 20  # a marker or manifest is small; a bigger file is not ours


def open_dir(path: str) -> int | None:
    """A descriptor of the absolute directory ``path`` (:func:`open_path`: no link followed but
    root's own); None when it is not such a directory."""
    try:
        return open_path(path)
    except OSError:
        return None


MAX_LINKS = 40  # links followed in one walk (the kernel's own limit)


def _root_link(parent: int, part: str) -> str | None:
    """The target of ``part`` in the directory ``parent`` when it is a link only root can have
    made or changed: owned by root in a directory root owns and no one else can write (a system's
    ``/lib -> usr/lib``, ``/var -> /private/var``); None otherwise."""
    try:
        st = os.stat(part, dir_fd=parent, follow_symlinks=False)
    except OSError:
        return None
    there = os.fstat(parent)
    if not stat.S_ISLNK(st.st_mode) or st.st_uid != 0 or there.st_uid != 0:
        return None
    if there.st_mode & 0o022:
        return None
    return os.readlink(part, dir_fd=parent)


def open_below(parent: int, rel: str, owner: tuple[int, int] | None = None) -> int:
    """A descriptor of the directory ``rel`` below the directory ``parent``, each component
    opened without following a link (OSError naming the component otherwise): a tree another
    user owns cannot redirect it by swapping a directory for a link anywhere along the way. The
    one link followed is root's own in a directory only root writes (:func:`_root_link`), its
    target walked by the same rule.

    + owner: make the missing components (0755), owned by (uid, gid)
    """
    return _walk(parent, rel, owner, [0])


def _walk(parent: int, rel: str, owner: tuple[int, int] | None, hops: list[int]) -> int:
    fd = os.dup(parent)
    try:
        for part in [p for p in rel.split("/") if p]:
            if owner is not None:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                    os.chown(part, *owner, dir_fd=fd, follow_symlinks=False)
                except FileExistsError:
                    pass
            try:
                nxt = os.open(part, DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                target = _root_link(fd, part)
                if target is None or hops[0] >= MAX_LINKS:
                    raise OSError(f"{rel}: {part} is not a directory ({exc.strerror})") from None
                hops[0] += 1
                start = os.open("/", DIR_FLAGS) if target.startswith("/") else os.dup(fd)
                try:
                    nxt = _walk(start, target, None, hops)
                finally:
                    os.close(start)
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_path(path: str, owner: tuple[int, int] | None = None) -> int:
    """:func:`open_below` from ``/``: the absolute directory ``path``, no link followed but
    root's own."""
    if not path.startswith("/"):
        raise OSError(f"{path} is not absolute")
    top = os.open("/", DIR_FLAGS)
    try:
        return open_below(top, path, owner)
    finally:
        os.close(top)


def at(fd: int) -> str:
    """A path to the directory ``fd`` that no rename or link elsewhere can redirect."""
    return f"/proc/self/fd/{fd}"


def root_dir(parent: int, name: str, create: bool = False) -> int | None:
    """A descriptor of root's own directory ``name`` in ``parent``, or None when there is none.

    + create: make it (0755) when it is missing; when something else is there (a link, a file,
      another user's directory, one writable by others), move that aside as
      ``<name>.untrusted-<ns>`` (a link or a file is then removed, a directory left) and make a
      new one
    """
    for _ in range(3):
        try:
            fd = os.open(name, DIR_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            if not create:
                return None
            try:
                os.mkdir(name, 0o755, dir_fd=parent)
            except FileExistsError:
                pass
            continue
        except OSError:  # a link (ELOOP) or not a directory
            fd = -1
        if fd >= 0:
            st = os.fstat(fd)
            if st.st_uid == os.geteuid() and not st.st_mode & 0o022:
                return fd
            os.close(fd)
        if not create:
            return None
        aside = f"{name}.untrusted-{time.time_ns()}"
        os.rename(name, aside, src_dir_fd=parent, dst_dir_fd=parent)
        with contextlib.suppress(OSError):  # a link or file goes (unlinkat follows no link);
            os.unlink(aside, dir_fd=parent)  # a directory stays, the serve user's to remove
    raise OSError(f"cannot make root's own directory {name}")


def root_dir_in(path: str, name: str) -> int | None:
    """:func:`root_dir` ``name`` in the directory ``path`` (None when either is not there)."""
    parent = open_dir(path)
    if parent is None:
        return None
    try:
        return root_dir(parent, name)
    finally:
        os.close(parent)


def remove_in(fd: int, name: str) -> None:
    """Remove ``name`` in the directory ``fd``: a tree, a file or a link (nothing followed)."""
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(f"{at(fd)}/{name}", ignore_errors=True)  # fd-based, links never followed
    else:
        os.unlink(name, dir_fd=fd)


def names(fd: int) -> list[str]:
    """The regular files in the directory ``fd`` (sorted; temporary files left out)."""
    out = []
    for name in os.listdir(fd):
        if name.startswith("."):
            continue
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            out.append(name)
    return sorted(out)


class NotRegular(OSError):
    """An entry of a walked tree that is neither a regular file nor a directory (a link, a fifo)."""


T = TypeVar("T")


def each_file(base: int, prefix: str, use: Callable[[str, int, os.stat_result], T]) -> dict[str, T]:
    """``use(rel, fd, stat)`` for every file under the directory ``base``, by ``rel`` =
    ``prefix/<path>``, walked in order through descriptors with no link followed (``fd`` is the
    file opened for reading, closed after); anything but a regular file or a directory (a link,
    a fifo) raises NotRegular naming it."""
    out: dict[str, T] = {}
    for dirpath, dirnames, filenames, dirfd in os.fwalk(".", dir_fd=base, follow_symlinks=False):
        dirnames.sort()
        for name in dirnames:  # fwalk lists a link to a directory here, then skips it unsaid
            if stat.S_ISLNK(os.stat(name, dir_fd=dirfd, follow_symlinks=False).st_mode):
                rel = os.path.normpath(f"{prefix}/{dirpath}/{name}")
                raise NotRegular(f"{rel}: not a regular file or directory")
        for name in sorted(filenames):  # links to files and other non-directories land here
            rel = os.path.normpath(f"{prefix}/{dirpath}/{name}")
            try:
                f = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                            dir_fd=dirfd)  # fmt: skip
            except OSError:
                if not is_file(dirfd, name):
                    raise NotRegular(f"{rel}: not a regular file or directory") from None
                raise
            try:
                st = os.fstat(f)
                if not stat.S_ISREG(st.st_mode):
                    raise NotRegular(f"{rel}: not a regular file or directory")
                out[rel] = use(rel, f, st)
            finally:
                os.close(f)
    return out


def digests(base: int, prefix: str) -> dict[str, list[Any]]:
    """Every file under the directory ``base`` as ``prefix/<path>`` -> [size, sha256]
    (:func:`each_file`: no link followed; a link or a fifo raises NotRegular, an OSError)."""
    return each_file(base, prefix, lambda rel, f, st: _digest(f))


def _digest(f: int) -> list[Any]:
    digest, size = hashlib.sha256(), 0
    for block in iter(lambda: os.read(f, 1 << 20), b""):
        digest.update(block)
        size += len(block)
    return [size, digest.hexdigest()]


def is_file(fd: int, name: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def read(fd: int, name: str) -> str:
    """The text of the regular file ``name`` in ``fd`` (OSError when it is anything else)."""
    f = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    try:
        if not stat.S_ISREG(os.fstat(f).st_mode):
            raise OSError(f"{name} is not a regular file")
        data = os.read(f, MAX_READ + 1)
    finally:
        os.close(f)
    if len(data) > MAX_READ:
        raise OSError(f"{name} is larger than {MAX_READ} bytes")
    return data.decode()


def write(
    fd: int, name: str, text: str, mode: int = 0o644, owner: tuple[int, int] | None = None
) -> None:
    """``name`` in ``fd`` holds ``text``: a new temporary file (``owner``: uid, gid), synced and
    renamed over it."""
    tmp = f".{name}.tmp-{os.getpid()}"
    try:
        os.unlink(tmp, dir_fd=fd)
    except FileNotFoundError:
        pass
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    f = os.open(tmp, flags, mode, dir_fd=fd)
    try:
        data = memoryview(text.encode())
        while data:
            data = data[os.write(f, data) :]
        os.fchmod(f, mode)
        if owner is not None:
            os.fchown(f, *owner)
        os.fsync(f)
    finally:
        os.close(f)
    os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
    os.fsync(fd)
