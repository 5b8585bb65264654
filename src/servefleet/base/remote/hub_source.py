"""The Hugging Face hub as the fetcher's source (on the host): ``snapshot_download`` run in the
release venv's python by ``hub_client.py`` in a mount namespace of its own, into the client's own
directory in root's staging directory, tried again when it fails transiently; then made root's,
checked and moved into place (``snapshot_place.py``) as an archive is.

The client is index code (the release's huggingface_hub and all it imports), so it runs as
``unprivileged.USER``, never root (#46 item 4): in a PID namespace its processes die with, with
no groups, capabilities or new privileges, a clean environment and the token only on its stdin
(read by :data:`HUB_CODE` and handed to ``snapshot_download``; never a path it could open, never
its environment): it reads neither the token file, the netrc nor ``/etc/servefleet/secrets``.
It writes only its own directory (:data:`WORK`); root takes the model out of it only after the
client and everything it started are dead, through descriptors, and makes it root's before it
reads a byte of it (:func:`take_over`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

if __package__:  # the controller imports this module (servefleet.base.remote.hub_source)
    from servefleet.base.remote import (
        content_check,
        refusal,
        retry,
        snapshot_place,
        trusted,
        unprivileged,
    )
else:  # on the host, next to refusal.py, retry.py, snapshot_place.py and unprivileged.py
    import content_check  # type: ignore[no-redef]
    import refusal  # type: ignore[no-redef]
    import retry  # type: ignore[no-redef]
    import snapshot_place  # type: ignore[no-redef]
    import trusted  # type: ignore[no-redef]
    import unprivileged  # type: ignore[no-redef]

# run as unprivileged.USER: the token (if any) comes on its stdin, and goes to the index's code
# only as snapshot_download's argument (no HF_TOKEN, no HF_TOKEN_PATH: nothing it could open)
HUB_CODE = r"""
import json, sys
token = sys.stdin.read().strip() or None
try:
    from huggingface_hub import snapshot_download
    path = snapshot_download(sys.argv[1], revision=sys.argv[2] or None, token=token)
except Exception as exc:  # one JSON line, never a traceback
    status = getattr(getattr(exc, "response", None), "status_code", None)
    lines = str(exc).strip().splitlines() or [""]
    chain, e = [], exc  # the error's causes: a connection error under the hub's own
    while e is not None and len(chain) < 8:
        chain.append(type(e).__name__)
        e = e.__cause__ or e.__context__
    print(json.dumps({"error": type(exc).__name__, "status": status, "message": lines[0],
                      "chain": chain}))
    sys.exit(1)
print(json.dumps({"path": path}))
"""
# the hub client's errors (requests', httpx's, the stdlib's, by name) that a retry may get past
HUB_TRANSIENT = frozenset({
    "ConnectionError", "ConnectError", "ConnectTimeout", "ReadTimeout", "WriteTimeout",
    "PoolTimeout", "Timeout", "TimeoutException", "ReadError", "WriteError", "RemoteProtocolError",
    "ChunkedEncodingError", "TimeoutError", "ConnectionRefusedError", "ConnectionResetError",
    "IncompleteRead", "RemoteDisconnected",
})  # fmt: skip
# The hub client's HF_HOME: an empty root-only directory under /run, on which hub_client.py
# bind-mounts the client's WORK in root's staging directory, in the client's own mount namespace
# (see there why)
HUB_MOUNT = "/run/servefleet-fetch-{}"
HUB_CLIENT = Path(__file__).resolve().parent / "hub_client.py"
# the hub client's own directory in root's staging directory (its HF_HOME: all it may write)
WORK = "work"
# what of root's environment the client gets besides unprivileged.environment's: CA bundles
HUB_ENV_KEPT = ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")
MAX_DEPTH = 64  # directories deep a fetched model may be (a deeper tree is refused)


@contextlib.contextmanager
def hub_mount() -> Iterator[str]:
    """A new empty root-only directory under /run (the hub client's mount point), removed at the
    end; /run is root's, so no other user can have put anything in its place."""
    path = HUB_MOUNT.format(secrets.token_hex(8))
    try:
        os.mkdir(path, 0o700)
    except OSError as exc:
        raise refusal.Refusal(f"cannot make {path}: {exc.strerror}") from None
    try:
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(path)


def hub_transient(result: dict[str, Any]) -> bool:
    """Whether the hub client's failure is worth another try: an HTTP status of
    ``retry.TRANSIENT_HTTP``, or (without a status) a connection error or timeout among its
    causes.

    + result: the client's JSON line
    """
    status = result.get("status")
    if isinstance(status, int):
        return status in retry.TRANSIENT_HTTP
    chain = result.get("chain")
    return isinstance(chain, list) and any(name in HUB_TRANSIENT for name in chain)


def _hub_problem(a: argparse.Namespace, result: dict[str, Any]) -> str:
    error, status, message = result.get("error"), result.get("status"), result.get("message")
    if status in (401, 403) or error in ("GatedRepoError", "RepositoryNotFoundError"):
        hint = (
            f"check the {a.token_env} environment variable on the controller"
            if a.token_env
            else "a token may be needed (--token-file)"
        )
        return f"the Hugging Face hub refused {a.model} ({message}); {hint}"
    if error == "RevisionNotFoundError":
        return f"the Hugging Face hub has no revision {a.revision} of {a.model}"
    return f"downloading {a.model} from the Hugging Face hub failed: {error}: {message}"


def from_hub(a: argparse.Namespace, hub: Path, uid: int, gid: int, token: str | None = None) -> str:
    """Download a.model with snapshot_download in the release venv, run as
    ``unprivileged.USER`` (#46 item 4), into its own directory in root's staging directory (its
    HF_HOME: a descriptor the launcher inherits, so nothing the serve user plants in its hub
    redirects a write), then make it root's (:func:`take_over`), check and record it, give it to
    the owner and move it into hub (``snapshot_place.settle``); return its revision.

    + token: the hub token (read by root from a.token_file), given on the client's stdin
    """
    who = unprivileged.ids()
    with snapshot_place.staging(hub) as tmp, hub_mount() as mount, \
            unprivileged.workspace(who, "servefleet-hub-") as home:  # fmt: skip
        env = unprivileged.environment(home)
        env.update({k: v for k, v in os.environ.items() if k in HUB_ENV_KEPT})
        env.update(
            HF_HUB_DISABLE_TELEMETRY="1",
            HF_HUB_DISABLE_PROGRESS_BARS="1",
            HF_HUB_ETAG_TIMEOUT=f"{a.timeout:g}",
            HF_HUB_DOWNLOAD_TIMEOUT=f"{a.timeout:g}",
            HF_HOME=mount,  # the client's WORK in the staging directory, bind-mounted there
        )
        if a.endpoint:
            env["HF_ENDPOINT"] = a.endpoint.rstrip("/")
        os.mkdir(WORK, 0o700, dir_fd=tmp.fd)  # in root's own 0700 directory: only root renames it
        os.chown(WORK, *who, dir_fd=tmp.fd, follow_symlinks=False)
        client = [a.hub, "-I", "-c", HUB_CODE, a.model, a.revision or ""]
        staged_at = str(a.hf_home / "hub" / tmp.name)  # opened again there, from / (no link)
        # the mount first (root, in the launcher's mount namespace), then the client's own PID
        # namespace and setpriv: hub_client.py execs unprivileged.argv(client)
        launcher = ["unshare", "--mount", "--propagation", "private", "--", sys.executable,
                    str(HUB_CLIENT), str(tmp.fd), staged_at, mount, WORK, "--",
                    *unprivileged.argv(client, who)]  # fmt: skip

        def once() -> dict[str, Any]:
            try:
                proc = subprocess.run(
                    launcher,
                    env=env,
                    cwd=home,
                    input=token or "",  # the client's stdin: the token's only way to it
                    capture_output=True,
                    text=True,
                    pass_fds=(tmp.fd,),
                )
            except OSError as exc:
                raise refusal.Refusal(f"cannot run unshare: {exc.strerror}") from None
            lines = proc.stdout.strip().splitlines()
            try:
                result = json.loads(lines[-1]) if lines else {}
            except ValueError:
                result = {}
            if not isinstance(result, dict):
                result = {}
            if proc.returncode != 0 or not isinstance(result.get("path"), str):
                if result.get("error") and hub_transient(result):
                    status, error = result.get("status"), result.get("error")
                    raise retry.Again(
                        f"it answered {status}" if status else f"{error}: {result.get('message')}"
                    )
                if result.get("error"):
                    raise refusal.Refusal(_hub_problem(a, result))
                tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
                raise refusal.Refusal(
                    f"downloading {a.model} from the Hugging Face hub failed: {tail}"
                )
            return dict(result)

        try:
            result = retry.attempts(once, a.tries, a.retry_wait)
        except retry.GaveUp as gave_up:
            where = f"the Hugging Face hub for {a.model}"
            raise refusal.could_not_reach(where, str(gave_up.last), gave_up) from None
        top = snapshot_place.repo_dir_name(a.model)
        snapshot = Path(result["path"])
        wanted = a.revision or snapshot.name
        if (
            snapshot.parent != Path(mount, "hub", top, "snapshots")
            or snapshot.name != wanted
            or not snapshot_place.REVISION_RE.fullmatch(wanted)
        ):
            raise refusal.Refusal(
                f"snapshot_download gave {snapshot}, not "
                f"{a.hf_home}/hub/{top}/snapshots/{a.revision or '<commit>'}"
            )
        # the client and all it started are gone (its PID namespace died with it): only now
        take_over(tmp.fd, top, who[0])
        staged = tmp.path / top
        return snapshot_place.settle(hub, staged, snapshot.name, "the hub", tmp.path, uid, gid)


def take_over(staging: int, top: str, writer: int) -> None:
    """Move ``WORK/hub/<top>``, the model the hub client (uid ``writer``) wrote, into root's
    staging directory ``staging`` as ``top`` and make it root's, before root reads any of it.

    Everything is reached through descriptors, no link followed. Each directory is made root's
    (0755) before it is listed, so nothing can be added to it any more; each entry in it must be
    the writer's: a directory (walked the same way), a regular file with no other name (a hard
    link to a file elsewhere would be chowned and read as the model's: refused), made root's
    (0644, 0755 when executable: no mode of the writer's stays), or, inside
    ``snapshots/<rev>/`` only (where the hub links its files to their blobs), a link, made
    root's, never followed. Anything else refuses the fetch.

    + staging: root's own staging directory (the client's WORK is in it)
    + top: ``models--ORG--NAME``
    + writer: the client's uid
    """
    try:
        hubfd = content_check.open_dirs(staging, [WORK, "hub"])
    except OSError as exc:
        raise refusal.Refusal(f"the hub client left no directory {WORK}/hub ({exc})") from None
    try:
        os.rename(top, top, src_dir_fd=hubfd, dst_dir_fd=staging)
    except OSError as exc:
        raise refusal.Refusal(f"the hub client left no {top} ({exc.strerror})") from None
    finally:
        os.close(hubfd)
    try:
        fd = os.open(top, trusted.DIR_FLAGS, dir_fd=staging)
    except OSError as exc:
        raise refusal.Refusal(
            f"the hub client's {top} is not a directory ({exc.strerror})"
        ) from None
    try:
        _adopt(fd, [top], writer)
    finally:
        os.close(fd)


def _adopt(fd: int, here: list[str], writer: int) -> None:
    """:func:`take_over` of the directory ``fd`` (``here``: its path from ``top`` on)."""
    shown = "/".join(here)

    def refuse(what: str, why: str) -> refusal.Refusal:
        return refusal.Refusal(f"the hub client's {what} {why}; nothing fetched")

    if len(here) > MAX_DEPTH:
        raise refuse(shown, f"is more than {MAX_DEPTH} directories deep")
    if os.fstat(fd).st_uid != writer:
        raise refuse(shown, "is not its own")
    os.fchown(fd, 0, 0)  # from here on, only root adds or renames anything in it
    os.fchmod(fd, 0o755)
    links = len(here) >= 3 and here[1] == "snapshots"  # in snapshots/<rev>/ and below
    for name in sorted(os.listdir(fd)):
        rel = f"{shown}/{name}"
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if st.st_uid != writer:
            raise refuse(rel, "is not its own")
        if stat.S_ISDIR(st.st_mode):
            sub = os.open(name, trusted.DIR_FLAGS, dir_fd=fd)
            try:
                if not os.path.samestat(os.fstat(sub), st):
                    raise refuse(rel, "changed while root took it over")
                _adopt(sub, [*here, name], writer)
            finally:
                os.close(sub)
        elif stat.S_ISLNK(st.st_mode) and links:
            os.chown(name, 0, 0, dir_fd=fd, follow_symlinks=False)
        elif stat.S_ISREG(st.st_mode):
            f = os.open(name, content_check.FILE_FLAGS, dir_fd=fd)
            try:
                got = os.fstat(f)
                if not os.path.samestat(got, st) or not stat.S_ISREG(got.st_mode):
                    raise refuse(rel, "changed while root took it over")
                if got.st_nlink != 1:
                    raise refuse(rel, "has another name (a hard link)")
                os.fchown(f, 0, 0)
                os.fchmod(f, 0o755 if got.st_mode & 0o111 else 0o644)
            finally:
                os.close(f)
        elif stat.S_ISLNK(st.st_mode):
            raise refuse(rel, "is a link outside snapshots/<rev>/")
        else:
            raise refuse(rel, "is neither a file, a directory nor a link")
