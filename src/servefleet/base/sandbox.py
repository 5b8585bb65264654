"""Where code from an index runs on the controller: a build backend (``uv build`` of an sdist),
in a process tree that holds no credential and sees no process that does (#31 finding 2).

An environment allow-list (``servefleet.base.subenv``) is not enough: any same-uid child can read its
ancestors' ``/proc/<pid>/environ`` (the controller's ``RBLN_INDEX_PASSWORD``, ``HF_TOKEN``,
``SERVEFLEET_API_KEY``) and, without Yama, their memory. So the build runs under ``unshare``
(util-linux) in a new PID namespace with its own ``/proc``: no process outside it has a pid it can
name. It also drops to ``nobody`` (``setpriv``), so it reads none of root's files (the lab's and
the fleet's SSH keys, root's home) and writes only its own work directory. Its environment is the
allow-list, never a credential.

Only root can drop to another user, so only a root controller builds (#46 item 6). A controller
that is not root ran the build as itself in a user namespace, which hides no file: the build
appended to that user's ``~/.bashrc`` (code for the next shell that holds the index password),
and could read its SSH keys and send them anywhere. A read-only view would stop the write but
not the read, and the build keeps the network (it fetches its build dependencies from the
stack's indexes). So a build on such a controller is refused in one line (:data:`NOT_ROOT`).

Controller-side; imports no pyinfra.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from servefleet.base.errors import ServefleetError
from servefleet.base.subenv import child_env

BUILD_USER = "nobody"  # who runs index code (the controller is root)
NOT_ROOT = (
    "building an sdist runs code from its index, and on a controller that is not root it would "
    "run as this user (it could change this user's files, such as ~/.bashrc, and read its keys): "
    f"run this command as root (sudo -E ...), which builds as {BUILD_USER}"
)


class SandboxError(ServefleetError):
    """The sandbox cannot be made on this controller (one line: what is missing)."""


def build_ids(what: str = "") -> tuple[int, int]:
    """The uid and gid index code runs as: ``nobody``'s. Refused (:class:`SandboxError`, one
    line: :data:`NOT_ROOT`) when the controller is not root: it cannot drop to another user.

    + what: what is to be built (the sdist's name; the message begins with it)
    """
    if os.geteuid() != 0:
        raise SandboxError(f"{what}: {NOT_ROOT}" if what else NOT_ROOT)
    try:
        entry = pwd.getpwnam(BUILD_USER)
    except KeyError:
        return (65534, 65534)
    return (entry.pw_uid, entry.pw_gid)


def _tool(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path="/usr/bin:/bin:/usr/sbin:/sbin")
    if not found:
        raise SandboxError(
            "index code (sdist builds) runs only in a sandbox: install util-linux (unshare, "
            "setpriv) on the controller"
        )
    return found


def argv(cmd: Sequence[str], ids: tuple[int, int]) -> list[str]:
    """``cmd`` in a new PID namespace with its own ``/proc``, killed with its parent; as ``ids``
    (no groups, no capabilities, no new privileges).

    + cmd: the command (its first word an absolute path the build user can run)
    + ids: uid and gid from :func:`build_ids`
    """
    ns = ["--pid", "--fork", "--kill-child", "--mount-proc"]
    uid, gid = ids
    drop = [f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--no-new-privs"]
    drop += ["--inh-caps=-all", "--bounding-set=-all"]
    return [_tool("unshare"), *ns, "--", _tool("setpriv"), *drop, "--", *cmd]


@dataclass(frozen=True)
class Workspace:
    """The build user's directory: its home, temp and uv cache, mode 0700 and its own.

    + path: the directory
    + ids: the build user
    """

    path: Path
    ids: tuple[int, int]

    def put(self, source: str | Path, mode: int = 0o400) -> Path:
        """A copy of ``source`` in the workspace, the build user's (a program or an sdist may
        sit where that user cannot reach, such as root's home).

        + source: the file
        + mode: the copy's mode
        """
        dest = self.path / Path(source).name
        shutil.copyfile(source, dest)
        os.chown(dest, *self.ids)
        dest.chmod(mode)
        return dest

    def run(
        self,
        cmd: Sequence[str],
        extra_env: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` in the sandbox, in the workspace, with the allow-listed environment plus
        ``extra_env``; HOME, TMPDIR and UV_CACHE_DIR point into the workspace.

        + cmd: the command
        + extra_env: variables the command needs (never a credential)
        + timeout: seconds before the whole namespace is killed
        """
        env = child_env(
            {
                "HOME": str(self.path),
                "TMPDIR": str(self.path / "tmp"),
                "UV_CACHE_DIR": str(self.path / "cache"),
                **(extra_env or {}),
            }
        )
        env.pop("UV_NO_CACHE", None)
        try:
            proc = subprocess.run(
                argv(cmd, self.ids),
                cwd=self.path,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            raise SandboxError(f"{Path(cmd[0]).name}: no answer in {timeout:.0f} s") from None
        if proc.returncode != 0 and "unshare failed" in proc.stderr:
            said = proc.stderr.strip().splitlines()[-1]
            raise SandboxError(
                f"index code (sdist builds) runs only in a sandbox, and unshare failed ({said})"
            )
        return proc


@contextlib.contextmanager
def workspace(what: str = "") -> Iterator[Workspace]:
    """A new :class:`Workspace`, removed afterwards, made in ``/tmp`` (never in a ``TMPDIR`` the
    build user may not reach). Refused when the controller is not root (:func:`build_ids`).

    + what: what is to be built (the sdist's name, for the refusal)
    """
    ids = build_ids(what)
    top = Path(tempfile.mkdtemp(prefix="servefleet-sandbox-", dir="/tmp"))
    try:
        top.chmod(0o711)
        path = top / "work"
        for made in (path, path / "tmp", path / "cache"):
            made.mkdir(mode=0o700)
            os.chown(made, *ids)
        yield Workspace(path, ids)
    finally:
        shutil.rmtree(top, ignore_errors=True)
