"""The Hugging Face hub as the fetcher's source (on the host): ``snapshot_download`` run in the
release venv's python by ``hub_client.py`` in a mount namespace of its own, into root's staging
directory, tried again when it fails transiently; then checked and moved into place
(``snapshot_place.py``) as an archive is.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

if __package__:  # the controller imports this module (servefleet.base.remote.hub_source)
    from servefleet.base.remote import refusal, retry, snapshot_place
else:  # on the host, next to refusal.py, retry.py and snapshot_place.py
    import refusal  # type: ignore[no-redef]
    import retry  # type: ignore[no-redef]
    import snapshot_place  # type: ignore[no-redef]

HUB_CODE = r"""
import json, sys
try:
    from huggingface_hub import snapshot_download
    path = snapshot_download(sys.argv[1], revision=sys.argv[2] or None)
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
# bind-mounts root's staging directory in the client's own mount namespace (see there why)
HUB_MOUNT = "/run/servefleet-fetch-{}"
HUB_CLIENT = Path(__file__).resolve().parent / "hub_client.py"
HUB_ENV_DROPPED = (
    "HF_ENDPOINT",
    "HF_HUB_CACHE",
    "HUGGINGFACE_HUB_CACHE",
    "HF_HUB_OFFLINE",
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
)


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


def from_hub(a: argparse.Namespace, hub: Path, uid: int, gid: int) -> str:
    """Download a.model with snapshot_download in the release venv into root's own staging
    directory (its HF_HOME: a descriptor the client inherits, so nothing the serve user plants
    in its hub redirects a write), check and record it, give it to the owner and move it into
    hub (``snapshot_place.settle``); return its revision."""
    env = {k: v for k, v in os.environ.items() if k not in HUB_ENV_DROPPED}
    env.update(
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
        HF_HUB_ETAG_TIMEOUT=f"{a.timeout:g}",
        HF_HUB_DOWNLOAD_TIMEOUT=f"{a.timeout:g}",
    )
    if a.token_file:
        env["HF_TOKEN_PATH"] = a.token_file
    if a.endpoint:
        env["HF_ENDPOINT"] = a.endpoint.rstrip("/")
    with snapshot_place.staging(hub) as tmp, hub_mount() as mount:
        env["HF_HOME"] = (
            mount  # the snapshot_place.staging directory, bind-mounted there (its descriptor)
        )
        client = [a.hub, "-c", HUB_CODE, a.model, a.revision or ""]
        staged_at = str(a.hf_home / "hub" / tmp.name)  # opened again there, from / (no link)
        launcher = ["unshare", "--mount", "--propagation", "private", "--", sys.executable,
                    str(HUB_CLIENT), str(tmp.fd), staged_at, mount, "--", *client]  # fmt: skip

        def once() -> dict[str, Any]:
            try:
                proc = subprocess.run(
                    launcher,
                    env=env,
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
        staged = tmp.path / "hub" / top
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
        return snapshot_place.settle(hub, staged, snapshot.name, "the hub", tmp.path, uid, gid)
