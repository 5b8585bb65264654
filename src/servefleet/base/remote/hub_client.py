#!/usr/bin/env python3
"""servefleet's Hugging Face hub client launcher. Runs ON THE HOST, as root, in a mount namespace
of its own: the fetcher (``remote/hub_source.py``) starts it under ``unshare --mount
--propagation private`` (stdlib only, python3 >= 3.10).

usage: hub_client.py FD STAGING MOUNT WITHIN -- COMMAND ARG...

huggingface_hub resolves HF_HOME to a real path (``Path.resolve()``), so a client given
``/proc/self/fd/N`` works by the path of root's staging directory inside the serve user's hub: a
name the serve user can move away and replace by a link while root's client writes through it.
So the client's HF_HOME is MOUNT, an empty root-only directory under /run, and this program first
bind-mounts the client's own directory WITHIN root's staging directory there, in the namespace
only the client lives in (the mount goes with the client, whatever stops it).

A descriptor opened in another mount namespace cannot be bind-mounted, so STAGING (the staging
directory's path) is opened again here, from / with no link followed but root's own, and must be
the very directory of the inherited descriptor FD (device and inode), root's and 0700; WITHIN is
opened in it with no link followed (only root writes there). Then COMMAND ARG... is exec'd: the
client's own PID namespace and ``setpriv`` to the unprivileged user (``unprivileged.argv``: the
client is index code, #46 item 4), which get no descriptor of root's but their stdin. A failure is
one line on stderr and exit 1, nothing mounted or run.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import trusted  # noqa: E402 (next to this file on the host)


class Refusal(Exception):
    """One line for stderr."""


def mount_staging(fd: int, staging: str, mount: str, within: str = "") -> None:
    """Bind-mount the directory of fd, reached again as staging (its directory ``within``, when
    given), on mount.

    + fd: root's staging directory, inherited from the fetcher (hub_source.py)
    + staging: its absolute path
    + mount: the empty root-only mount point
    + within: the client's own directory in it
    """
    want = os.fstat(fd)
    try:
        again = trusted.open_path(staging)
    except OSError as exc:
        raise Refusal(f"{staging}: {exc}; nothing fetched") from None
    try:
        got = os.fstat(again)
        same = (got.st_dev, got.st_ino) == (want.st_dev, want.st_ino)
        if not same or got.st_uid != 0 or stat.S_IMODE(got.st_mode) & 0o077:
            raise Refusal(f"{staging}: replaced while the hub client started; nothing fetched")
        if within:
            try:
                inner = os.open(within, trusted.DIR_FLAGS, dir_fd=again)
            except OSError as exc:
                raise Refusal(f"{staging}/{within}: {exc.strerror}; nothing fetched") from None
            os.close(again)
            again = inner
        proc = subprocess.run(
            ["mount", "--no-canonicalize", "--bind", trusted.at(again), mount],
            pass_fds=(again,),
            stdin=subprocess.DEVNULL,  # the client's token, never mount's
            capture_output=True,
            text=True,
        )
    finally:
        os.close(again)
    if proc.returncode != 0:
        said = (proc.stderr.strip().splitlines() or ["no output"])[0]
        raise Refusal(f"cannot bind-mount the staging directory on {mount}: {said}")


def main(argv: list[str]) -> int:
    if len(argv) < 6 or argv[4] != "--" or not argv[0].isdigit():
        print("usage: hub_client.py FD STAGING MOUNT WITHIN -- COMMAND ARG...", file=sys.stderr)
        return 2
    fd, staging, mount, within, client = int(argv[0]), argv[1], argv[2], argv[3], argv[5:]
    try:
        mount_staging(fd, staging, mount, within)
    except (Refusal, OSError) as exc:
        print(exc, file=sys.stderr)
        return 1
    os.close(fd)  # the client gets none of root's descriptors
    try:
        os.execvp(client[0], client)
    except OSError as exc:
        print(f"cannot run {client[0]}: {exc.strerror}", file=sys.stderr)
        return 1
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
