#!/usr/bin/env python3
"""servefleet model fetch. Runs ON THE HOST, as root (stdlib only, python3 >= 3.10; hub downloads
run huggingface_hub inside the release venv's python).

usage: fetch_model.py MODEL HF_HOME OWNER (--store URL | --hub PYTHON [--endpoint URL] | --archive FILE)
                      [--token-file FILE] [--token-env NAME] [--revision REV] [--sha256 HEX] [--timeout SECONDS]
                      [--lock-timeout SECONDS] [--tries N] [--retry-wait SECONDS]

Lays MODEL (``ORG/NAME``) out as a Hugging Face download does, under
``$HF_HOME/hub/models--ORG--NAME``, so servers started with HF_HUB_OFFLINE=1 find it and never
download. Everything it writes there is owned by OWNER and OWNER's primary group.

Store (``--store URL``): ``<URL>/manifest.json`` is ``{"models": {"ORG/NAME": {"sha256": HEX,
"revision": REV, "path": "ORG/NAME.tar.gz"}}}`` and ``<URL>/<path>`` a tar.gz of
``models--ORG--NAME/{refs/main,snapshots/<rev>/...}``. The archive is streamed once into a
temporary file and its sha256, checked against ``--sha256`` or else the manifest, then unpacked
in a temporary directory under ``$HF_HOME/hub``, checked and moved into place. An archive with a
member outside ``models--ORG--NAME/``, a symlink resolving outside it, a hard link, a device or
fifo is refused whole. Requests time out after ``--timeout`` seconds, the wait for the hub's lock
(one fetch at a time; the serve user can hold it too) after ``--lock-timeout``; the token (read from the
0600 ``--token-file``) travels only in the Authorization header, which a redirect to another
origin (scheme, host, port) drops.

Archive (``--archive FILE``, with ``--sha256``): a local copy of a store archive (the host's
wheelhouse copy, ``sdk_source = "wheelhouse"``): its sha256 is checked, then it is unpacked and
checked as a store archive is. No network.

Hub (``--hub PYTHON``): ``snapshot_download(MODEL, revision=REV, token=...)`` in PYTHON, run as
``nobody`` (``unprivileged.py``: its own PID namespace, no groups, capabilities or new
privileges, a clean environment; it is index code, #46 item 4), the token read by root from the
token file and handed on the client's stdin (it can open neither that file nor the netrc nor
``/etc/servefleet/secrets``), HF_ENDPOINT at ``--endpoint URL`` when given (a mirror or a
private hub; else the client's default; the host's own HF_ENDPOINT is dropped) and HF_HOME at the
client's own directory in root's staging directory; then root takes the model over (made root's
through descriptors, a hard link, a link outside ``snapshots/<rev>/`` or a fifo refused), checks
it and moves it into place as an archive is: the serve user's hub is never the client's cache,
so nothing planted there redirects a write. The client resolves HF_HOME to a real path, so it
gets its directory bind-mounted on an empty root-only ``/run/servefleet-fetch-*`` in a mount
namespace of its own (``unshare``), never a path through the serve user's hub.

``--revision REV`` (40 hex digits) pins a commit: the archive must hold ``snapshots/REV``
(refs/main may name another; the fetcher then points refs/main at the pinned revision, since
servers run offline and load what refs/main names). Without it the revision is the one refs/main names (store) or the
one the hub resolves.

Completeness marker (the contract the host probe reads): the LAST step of a successful fetch,
after every file is in place, owned and synced, writes
``$HF_HOME/hub/models--ORG--NAME/.servefleet-complete`` atomically (a temporary file renamed
over it), holding exactly the revision, the 40-hex commit directory under ``snapshots/`` (no
newline, like refs/main). A model counts as present iff that marker exists, names an existing
``snapshots/<rev>`` directory and, when a revision is pinned, equals it. refs/main alone proves
nothing: a download cut short leaves it behind. A failed fetch leaves an earlier copy as it was
and never a partial one: leftovers of a killed run (``$HF_HOME/hub/.fetch-*``) are removed by
the next run; runs on one host take turns (a lock on ``$HF_HOME/hub``).

Record (#36): before the fetched tree is given to OWNER, root reads every file of its snapshot
in its own staging directory and keeps each one's size and sha256 in root's own directory of the
hub (``$HF_HOME/hub/servefleet-models/models--ORG--NAME``, ``content_check.py``), which
``servefleet status --verify`` holds the model to. A snapshot file that links out of the model's
directory, through a link or to no regular file is refused. A fetch of a model that is there
already (a drifted one: the deploy with ``serve_verify``) fetches it whole into staging and
renames it over the old copy, which goes aside and is removed: never patched in place.

Retries (``retry.py``, the controller's rule too): a request to the store, or a hub download,
that fails in a way that may pass (a connection refused or reset, a timeout, HTTP 408/425/429/5xx)
is tried again, up to ``--tries`` times in all (5), waiting ``--retry-wait`` seconds (1) and
twice as long before each next try; a refusal (401, 403, 404, a wrong sha256, an unsafe archive)
is never tried again, so its line shows once.

Every failure is one line on stderr, ``servefleet: ...``; exit 2 for bad arguments, 3 when the
store or the hub could not be reached (every try failed transiently: worth a re-run later), 1
for every other failure (refused).
"""

from __future__ import annotations

import argparse
import os
import pwd
import re
import sys
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit

if __package__:  # the controller imports this module (servefleet.base.remote.fetch_model)
    from servefleet.base.remote import (
        http_client,
        hub_source,
        layout,
        refusal,
        retry,
        snapshot_place,
        store_source,
        trusted,
    )
else:  # on the host, next to the modules it names (the deploy uploads them together)
    import http_client  # type: ignore[no-redef]
    import hub_source  # type: ignore[no-redef]
    import layout  # type: ignore[no-redef]
    import refusal  # type: ignore[no-redef]
    import retry  # type: ignore[no-redef]
    import snapshot_place  # type: ignore[no-redef]
    import store_source  # type: ignore[no-redef]
    import trusted  # type: ignore[no-redef]

MODEL_RE = layout.MODEL_ID  # the host contract's rule, the controller's too
TOKEN_RE = re.compile(r"[\x21-\x7e]+")  # what an HTTP header can carry, no spaces
ENV_NAME_RE = layout.ENV_NAME


def bad_model_id(model: str) -> str | None:
    """Why model is not a model id ``ORG/NAME`` of ``[A-Za-z0-9._-]`` without ``..``, or None.

    + model: the id to check
    """
    if not MODEL_RE.fullmatch(model):
        return f"{model!r} is not a model id ORG/NAME of [A-Za-z0-9._-] (no '..')"
    return None


# --- command line --------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise refusal.Refusal(f"fetch_model.py: {message}", code=2)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = _Parser(prog="fetch_model.py", description="Fetch a model into $HF_HOME/hub.")
    ap.add_argument("model", help="ORG/NAME")
    ap.add_argument("hf_home", type=Path, help="absolute path of HF_HOME")
    ap.add_argument("owner", help="the user (and its primary group) to own the files")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--store", metavar="URL", help="a model store (http or https)")
    src.add_argument("--hub", metavar="PYTHON", help="a python with huggingface_hub")
    src.add_argument("--archive", metavar="FILE", help="a local archive (needs --sha256)")
    ap.add_argument("--endpoint", metavar="URL", help="the hub's address (HF_ENDPOINT), with --hub")
    ap.add_argument("--token-file", metavar="FILE", help="the token (a 0600 file)")
    ap.add_argument("--token-env", metavar="NAME", help="the controller's variable of the token")
    ap.add_argument("--revision", metavar="REV", help="pin this commit (40 hex digits)")
    ap.add_argument("--sha256", metavar="HEX", help="the store archive's sha256")
    ap.add_argument("--timeout", metavar="SECONDS", type=float, default=60.0)
    ap.add_argument("--lock-timeout", metavar="SECONDS", type=float, default=600.0)
    ap.add_argument("--tries", metavar="N", type=int, default=retry.TRIES,
                    help="the most tries of a request that fails transiently")  # fmt: skip
    ap.add_argument("--retry-wait", metavar="SECONDS", type=float, default=retry.FIRST_WAIT,
                    help="seconds before the second try, doubled before each next one")  # fmt: skip
    a = ap.parse_args(argv)
    problem = bad_model_id(a.model)
    if a.sha256:
        a.sha256 = a.sha256.lower()
    if problem is None and not a.hf_home.is_absolute():
        problem = f"HF_HOME must be an absolute path, not {a.hf_home}"
    if (
        problem is None
        and a.revision is not None
        and not snapshot_place.REVISION_RE.fullmatch(a.revision)
    ):
        problem = f"--revision {a.revision!r} is not a commit hash (40 lowercase hex digits)"
    if problem is None and a.sha256 is not None and not store_source.SHA256_RE.fullmatch(a.sha256):
        problem = f"--sha256 {a.sha256!r} is not 64 hex digits"
    if problem is None and a.archive is not None and a.sha256 is None:
        problem = "--archive needs --sha256"
    if problem is None and not a.timeout > 0:
        problem = f"--timeout must be above 0, not {a.timeout:g}"
    if problem is None and not a.lock_timeout > 0:
        problem = f"--lock-timeout must be above 0, not {a.lock_timeout:g}"
    if problem is None and not 1 <= a.tries <= 20:
        problem = f"--tries must be 1 to 20, not {a.tries}"
    if problem is None and not 0 <= a.retry_wait <= 60:
        problem = f"--retry-wait must be 0 to 60 seconds, not {a.retry_wait:g}"
    if problem is None and a.token_env is not None and not ENV_NAME_RE.fullmatch(a.token_env):
        problem = f"--token-env {a.token_env!r} is not a variable name"
    if problem is None and a.endpoint is not None and a.hub is None:
        problem = "--endpoint goes with --hub"
    for option, url in (("--store", a.store), ("--endpoint", a.endpoint)):
        if problem is None and url is not None:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname or parts.query:
                problem = f"{option} {url!r} is not an http(s) URL"
            elif parts.username or parts.password:
                problem = f"{option} must not carry credentials; give --token-file"
    if problem:
        raise refusal.Refusal(f"fetch_model.py: {problem}", code=2)
    return a


def read_token(path: str) -> str:
    """The token in path, a file only its owner may read."""
    try:
        mode = os.stat(path).st_mode
        token = Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise refusal.Refusal(f"cannot read the token file {path}: {exc}") from None
    if mode & 0o077:
        raise refusal.Refusal(
            f"the token file {path} is open to others (mode {mode & 0o777:o}); chmod 600"
        )
    if not TOKEN_RE.fullmatch(token):
        raise refusal.Refusal(f"the token file {path} does not hold one token")
    return token


def fetch(a: argparse.Namespace) -> str:
    """Fetch a.model as a says; return its revision."""
    try:
        user = pwd.getpwnam(a.owner)
    except KeyError:
        raise refusal.Refusal(f"no user {a.owner} on this host") from None
    token = read_token(a.token_file) if a.token_file else None
    # HF_HOME is the serve user's: root reaches its hub through one descriptor, opened from / with
    # no link followed, and works below it by /proc/self/fd paths nothing can redirect (#18)
    try:
        above = trusted.open_path(str(a.hf_home.parent), owner=(0, 0))  # made root's if missing
        try:  # HF_HOME and its hub are the serve user's
            hubfd = trusted.open_below(above, f"{a.hf_home.name}/hub", (user.pw_uid, user.pw_gid))
        finally:
            os.close(above)
    except OSError as exc:
        raise refusal.Refusal(f"{a.hf_home}/hub: {exc}") from None
    try:
        return _fetch_into(a, Path(trusted.at(hubfd)), user, token)
    finally:
        os.close(hubfd)


def _fetch_into(a: argparse.Namespace, hub: Path, user: Any, token: str | None) -> str:
    try:
        return _fetch_locked(a, hub, user, token)
    except refusal.Refusal as e:  # name the hub as the operator knows it, not by its descriptor
        raise refusal.Refusal(str(e).replace(str(hub), str(a.hf_home / "hub")), e.code) from None


def _fetch_locked(a: argparse.Namespace, hub: Path, user: Any, token: str | None) -> str:
    with snapshot_place.one_fetch_at_a_time(hub, a.lock_timeout):
        if a.store:
            client = http_client.Client(token, a.token_env, a.timeout, a.tries, a.retry_wait)
            rev = store_source.from_store(a, hub, client, user.pw_uid, user.pw_gid)
        elif a.archive:
            rev = store_source.from_archive(a, hub, user.pw_uid, user.pw_gid)
        else:
            rev = hub_source.from_hub(a, hub, user.pw_uid, user.pw_gid, token)
        repo = hub / snapshot_place.repo_dir_name(a.model)
        if a.revision:  # servers run offline and load refs/main: make it the pinned snapshot
            snapshot_place.point_main(repo, rev, user.pw_uid, user.pw_gid)
        snapshot_place.mark_complete(repo, rev, user.pw_uid, user.pw_gid)
    return rev


def main(argv: list[str] | None = None) -> int:
    try:
        a = parse_args(argv)
        rev = fetch(a)
    except refusal.Refusal as exc:
        print(f"servefleet: {exc}", file=sys.stderr)
        return exc.code
    except OSError as exc:
        print(f"servefleet: fetching the model failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("servefleet: interrupted", file=sys.stderr)
        return 130
    print(f"{a.model} {rev} is in {a.hf_home / 'hub'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
