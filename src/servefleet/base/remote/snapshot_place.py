"""Where a fetched model lands (stdlib only, on the host): ``models--ORG--NAME`` under
``$HF_HOME/hub``, its snapshot checked, each of its files' size and sha256 recorded from root's
own staging copy (``content_check``: what ``status --verify`` holds it to), given to the serve
user, moved in by rename (whatever was there, a drifted copy too, goes aside and is removed:
never patched in place), refs/main pointed at a pinned revision and the completeness marker
written last; root's own staging directory for the work, and the hub's lock (one fetch at a
time).

The hub directory is the serve user's (its servers write there): root works in it through
directory descriptors and never follows a link, the top of a tree included (#18 finding 1).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

if __package__:  # the controller imports this module (servefleet.base.remote.snapshot_place)
    from servefleet.base.remote import content_check, fault_point, layout, refusal, trusted
else:  # on the host, next to layout.py, refusal.py and trusted.py
    import content_check  # type: ignore[no-redef]
    import fault_point  # type: ignore[no-redef]
    import layout  # type: ignore[no-redef]
    import refusal  # type: ignore[no-redef]
    import trusted  # type: ignore[no-redef]

MARKER = layout.MODEL_COMPLETE
REVISION_RE = re.compile(r"[0-9a-f]{40}")
LOCK_POLL = 0.2  # seconds between two tries of the hub's lock


def repo_dir_name(model: str) -> str:
    """``models--ORG--NAME``: the directory of model under ``$HF_HOME/hub``."""
    return content_check.repo_dir(model)


def check_snapshot(repo: Path, rev: str | None, source: str) -> str:
    """The revision whose snapshot repo holds: rev, else the one refs/main names.

    + repo: the ``models--ORG--NAME`` directory
    + rev: the wanted revision, or None
    + source: where repo came from (for messages)
    """
    if rev is None:
        refs = repo / "refs" / "main"
        if not refs.is_file():
            raise refusal.Refusal(f"{source} does not hold {repo.name}/refs/main")
        rev = refs.read_text().strip()
        if not REVISION_RE.fullmatch(rev):
            raise refusal.Refusal(f"{source}: {repo.name}/refs/main does not name a commit")
    snapshot = repo / "snapshots" / rev
    if not snapshot.is_dir() or not any(snapshot.iterdir()):
        raise refusal.Refusal(f"{source} does not hold the files of {repo.name}/snapshots/{rev}")
    return rev


def settle(
    hub: Path, repo: Path, rev: str | None, source: str, tmp: Path, uid: int, gid: int
) -> str:
    """The staged ``repo`` (in root's staging ``tmp``) into ``hub``: its snapshot checked
    (:func:`check_snapshot`), every file of it read and recorded (size, sha256) while it is
    still root's, given to the owner, moved in (:func:`move_in`) and the record kept in root's
    own directory of the hub; return its revision. A file of the snapshot that links out of the
    model's directory, through a link, or to no regular file refuses the fetch."""
    rev = check_snapshot(repo, rev, source)
    repofd = _open_dir(repo)
    try:
        found = content_check.snapshot_files(repofd, rev)
    except OSError as exc:
        raise refusal.Refusal(f"{source}: {repo.name}/snapshots/{rev}: {exc}") from None
    finally:
        os.close(repofd)
    if found.problems:
        rel, why = min(found.problems.items())
        raise refusal.Refusal(f"{source}: {repo.name}/snapshots/{rev}/{rel} {why}")
    give(repo, uid, gid)
    move_in(hub, repo, repo.name, tmp)
    hubfd = os.open(hub, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # root's descriptor
    try:
        content_check.write_record(hubfd, repo.name, rev, found.files)
    finally:
        os.close(hubfd)
    return rev


def _open_dir(path: Path) -> int:
    """A descriptor of the real directory ``path`` (a link in its place is refused)."""
    try:
        return os.open(path, trusted.DIR_FLAGS)
    except OSError as exc:
        raise refusal.Refusal(
            f"{path} is not a directory ({exc.strerror}): left as it is"
        ) from None


def give(top: Path, uid: int, gid: int) -> None:
    """chown top and everything under it, through directory descriptors (``os.fwalk``): never
    following a symlink, top included (links are chowned; a link planted as top is refused)."""
    topfd = _open_dir(top)
    try:
        os.chown(topfd, uid, gid)
    finally:
        os.close(topfd)
    for _, dirnames, filenames, dirfd in os.fwalk(top, follow_symlinks=False):
        for name in dirnames + filenames:
            os.chown(name, uid, gid, dir_fd=dirfd, follow_symlinks=False)


def point_main(repo: Path, rev: str, uid: int, gid: int) -> None:
    """refs/main names rev (atomically; the refs directory made if the hub client made none)."""
    repofd = _open_dir(repo)
    try:
        try:
            os.mkdir("refs", 0o755, dir_fd=repofd)
        except FileExistsError:
            pass
        refsfd = os.open("refs", trusted.DIR_FLAGS, dir_fd=repofd)
        try:
            os.chown(refsfd, uid, gid)
            trusted.write(refsfd, "main", rev, owner=(uid, gid))
        finally:
            os.close(refsfd)
    finally:
        os.close(repofd)


def mark_complete(repo: Path, rev: str, uid: int, gid: int) -> None:
    """Write repo/MARKER holding rev, atomically, after syncing everything written before."""
    os.sync()
    repofd = _open_dir(repo)
    try:
        trusted.write(repofd, MARKER, rev, owner=(uid, gid))
    finally:
        os.close(repofd)


def move_in(hub: Path, repo: Path, top: str, tmp: Path) -> None:
    """Rename the checked ``repo`` (in root's staging ``tmp``) to ``hub/top``; what was there
    goes aside into ``tmp`` (removed with it), and comes back if the rename fails."""
    target = hub / top
    old = tmp / "old"
    if target.exists() or target.is_symlink():
        os.rename(target, old)
        fault_point.barrier("model-moved-aside")  # tests' fault point: the model is away a moment
    try:
        os.rename(repo, target)
    except OSError:
        if old.exists() or old.is_symlink():
            os.rename(old, target)
        raise


@contextlib.contextmanager
def one_fetch_at_a_time(hub: Path, deadline: float) -> Iterator[None]:
    """Hold the lock on hub, then remove what a killed run left (``.fetch-*``). The hub is the
    serve user's, so it can hold the lock too: after ``deadline`` seconds of waiting the fetch
    fails in one line."""
    fd = os.open(hub, os.O_RDONLY | os.O_DIRECTORY)
    try:
        give_up = time.monotonic() + deadline
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= give_up:
                    raise refusal.Refusal(
                        f"{hub}: another process holds its lock (a fetch, or the serve "
                        f"user holding it); gave up after {deadline:g} s (--lock-timeout), "
                        "nothing fetched"
                    ) from None
                time.sleep(LOCK_POLL)
        for name in os.listdir(fd):
            if name.startswith(".fetch-"):
                _remove_left(fd, name)
        yield
    finally:
        os.close(fd)


def _remove_left(hubfd: int, name: str) -> None:
    """Remove ``name`` in the hub when it is root's own staging directory (a killed run's): its
    entries through its descriptor, then the name. Anything else there is the serve user's (a
    fifo, a link, a directory of its own) and is left unopened: a fifo opened by path is waited
    on for ever, and ``shutil.rmtree`` opens the path it is given so (Python 3.11; #46 item 5)."""
    fd = trusted.root_dir(hubfd, name)
    if fd is None:
        return
    try:
        _empty(fd)
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):  # a name the serve user took meanwhile: not a directory,
        os.rmdir(name, dir_fd=hubfd)  # or not empty; its own empty directory goes


def _empty(fd: int) -> None:
    """Remove everything in root's own directory ``fd`` (nothing else can write in it)."""
    for entry in os.listdir(fd):
        trusted.remove_in(fd, entry)


class Staging(NamedTuple):
    """Root's own staging directory: its descriptor, the /proc/self/fd path of it, its name."""

    fd: int  # what a child is given (pass_fds) to work in the same directory
    path: Path  # ``/proc/self/fd/<fd>``: no rename or link planted elsewhere redirects it
    name: str  # ``.fetch-<hex>`` in the hub


@contextlib.contextmanager
def staging(hub: Path) -> Iterator[Staging]:
    """Root's own 0700 ``.fetch-*`` directory in the hub, by its descriptor (a rename or a link
    planted in its place cannot redirect the work in it); removed at the end."""
    name = f".fetch-{secrets.token_hex(8)}"
    os.mkdir(hub / name, 0o700)
    try:
        fd = os.open(hub / name, trusted.DIR_FLAGS)
    except OSError:
        raise refusal.Refusal(f"{name}: replaced while it was made; nothing fetched") from None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise refusal.Refusal(f"{name}: replaced while it was made; nothing fetched")
        yield Staging(fd, Path(trusted.at(fd)), name)
    finally:
        _empty(fd)
        os.close(fd)
        with contextlib.suppress(OSError):
            os.rmdir(hub / name)
