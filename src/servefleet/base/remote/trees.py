#!/usr/bin/env python3
"""servefleet serve trees. Runs ON THE HOST, as root (stdlib only, python3 >= 3.10).

usage: trees.py USER MODE PATH [PATH...]

Makes each PATH (serve_home, serve_cache_root, models_hf_home) a directory of USER and its
primary group with MODE (octal), checked again here against what the host has (#31 finding 3),
before anything is chowned:

- PATH is strictly below one of :data:`layout.SERVE_TREE_ROOTS` (``/var/lib/x``, never
  ``/var/lib``); the way to that root may pass root's own links only (``trusted.open_path``);
- below the root, no component is a link (each is opened with ``O_NOFOLLOW`` through its
  parent's descriptor) nor a mount point of part of another file system or of one mounted
  elsewhere too (a bind mount: ``/proc/self/mountinfo``); a disk of its own mounted there is
  fine;
- missing components are made (root's, 0755); PATH itself, when missing, is made and given to
  USER by its descriptor; when it is there already it must be USER's (the mode is then set):
  a directory anyone else owns (``/var/lib/dpkg``, another user's home) is never given away.

The first refusal is one line on stderr (``servefleet: PATH: ...``), exit 1; the paths before it
are done, nothing of it or after it is changed.
"""

from __future__ import annotations

import os
import pwd
import stat
import sys

if __package__:  # the controller imports this module (servefleet.base.remote.trees)
    from servefleet.base.remote import layout, trusted
else:  # on the host, next to layout.py and trusted.py
    import layout  # type: ignore[no-redef]
    import trusted  # type: ignore[no-redef]

ROOTS = layout.SERVE_TREE_ROOTS
MOUNTINFO = "/proc/self/mountinfo"


class Refusal(Exception):
    """A tree servefleet does not make: one line, naming it."""


def root_of(path: str) -> str | None:
    """The root of :data:`ROOTS` that ``path`` is strictly below, if any."""
    return next((r for r in ROOTS if path.startswith(r + "/") and len(path) > len(r) + 1), None)


def mount_id(fd: int) -> int:
    """The id of the mount the directory ``fd`` is on (its ``/proc/self/fdinfo`` entry)."""
    with open(f"/proc/self/fdinfo/{fd}") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name == "mnt_id":
                return int(value)
    raise OSError(f"no mnt_id for descriptor {fd}")


def mounts(text: str) -> dict[int, tuple[str, str]]:
    """``/proc/self/mountinfo``: mount id -> (major:minor, the root of the mount in its file
    system)."""
    out = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 5:
            out[int(fields[0])] = (fields[2], fields[3])
    return out


def bind_problem(mid: int, table: dict[int, tuple[str, str]]) -> str | None:
    """Why the mount ``mid`` is not a file system of its own mounted only there, if it is not."""
    dev, root = table.get(mid, ("?", "?"))
    if root != "/":
        return f"a bind mount of {root} of another file system"
    if any(other_dev == dev for other, (other_dev, _) in table.items() if other != mid):
        return f"a file system ({dev}) that is mounted elsewhere too"
    return None


def _open(parent: int, part: str, shown: str, root: str) -> int:
    try:
        return os.open(part, trusted.DIR_FLAGS, dir_fd=parent)
    except OSError as exc:
        kind = "a link" if _is_link(parent, part) else "not a directory"
        raise Refusal(
            f"{shown} is {kind} ({exc.strerror}); allowed: real directories below {root}"
        ) from None


def _is_link(parent: int, part: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(part, dir_fd=parent, follow_symlinks=False).st_mode)
    except OSError:
        return False


def make_tree(path: str, uid: int, gid: int, mode: int, user: str) -> None:
    """``path`` as USER's directory, by the rules of this module (Refusal otherwise)."""
    root = root_of(path)
    if root is None or os.path.normpath(path) != path:
        raise Refusal(
            f"{path}: not a directory of its own below {', '.join(ROOTS)}; nothing changed"
        )
    try:
        fd = trusted.open_path(root)
    except OSError as exc:
        raise Refusal(f"{path}: {exc}; nothing changed") from None
    table = mounts(open(MOUNTINFO).read())
    try:
        parts = path[len(root) + 1 :].split("/")
        shown = root
        for i, part in enumerate(parts):
            shown = f"{shown}/{part}"
            last = i == len(parts) - 1
            made = False
            try:
                os.mkdir(part, 0o700 if last else 0o755, dir_fd=fd)
                made = True
            except FileExistsError:
                pass
            nxt = _open(fd, part, shown, root)
            above, fd = fd, nxt
            try:
                if mount_id(fd) != mount_id(above):
                    problem = bind_problem(mount_id(fd), table)
                    if problem:
                        raise Refusal(
                            f"{shown} is {problem}; allowed: real directories below {root}"
                        )
            finally:
                os.close(above)
            st = os.fstat(fd)
            if made and st.st_uid != 0:
                raise Refusal(f"{shown} was replaced while it was made; nothing changed")
            if last:
                give(fd, st, shown, made, (uid, gid, mode), user)
    finally:
        os.close(fd)


def give(fd: int, st: os.stat_result, shown: str, made: bool, want: tuple[int, int, int],
         user: str) -> None:  # fmt: skip
    """The tree ``fd``: made now (root's) or the serve user's already, then USER's with MODE."""
    uid, gid, mode = want
    if not made and st.st_uid != uid:
        try:
            owner = pwd.getpwuid(st.st_uid).pw_name
        except KeyError:
            owner = str(st.st_uid)
        raise Refusal(
            f"{shown} is there, owned by {owner}, not {user}: servefleet gives {user} only a "
            f"directory it makes or one that is {user}'s already; allowed: a path that does not "
            f"exist yet, or {user}'s own directory"
        )
    if (st.st_uid, st.st_gid) != (uid, gid):
        os.fchown(fd, uid, gid)
    if stat.S_IMODE(st.st_mode) != mode:
        os.fchmod(fd, mode)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 3:
        print("servefleet: usage: trees.py USER MODE PATH [PATH...]", file=sys.stderr)
        return 2
    user, mode_text, paths = args[0], args[1], args[2:]
    try:
        pw = pwd.getpwnam(user)
        mode = int(mode_text, 8)
    except (KeyError, ValueError):
        print(
            f"servefleet: trees.py: no user {user!r} or no octal mode {mode_text!r}",
            file=sys.stderr,
        )
        return 2
    try:
        for path in paths:
            make_tree(path, pw.pw_uid, pw.pw_gid, mode, user)
    except Refusal as exc:
        print(f"servefleet: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"servefleet: making the serve user's directories failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
