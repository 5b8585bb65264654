"""The model store and a local archive as the fetcher's sources (stdlib only, on the host): the
store manifest's entry of a model, the archive streamed once into root's staging directory and
its sha256 checked (against ``--sha256`` or the manifest), or a local copy's checked; then
unpacked (``tar_safety.py``), checked and moved into place (``snapshot_place.py``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from pathlib import Path

if __package__:  # the controller imports this module (servefleet.base.remote.store_source)
    from servefleet.base.remote import http_client, refusal, snapshot_place, tar_safety
else:  # on the host, next to the modules it names
    import http_client  # type: ignore[no-redef]
    import refusal  # type: ignore[no-redef]
    import snapshot_place  # type: ignore[no-redef]
    import tar_safety  # type: ignore[no-redef]

SHA256_RE = re.compile(r"[0-9a-f]{64}")
STORE_PATH_RE = re.compile(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*")
MANIFEST_LIMIT = 16 << 20


def store_entry(client: http_client.Client, store: str, model: str) -> dict[str, str]:
    """The store manifest's entry of model: sha256 and a safe path under the store."""
    url = f"{store}/manifest.json"
    data = client.read(
        url,
        f"{url} answered 404: the store publishes no manifest; give --sha256",
        MANIFEST_LIMIT,
    )
    try:
        models = json.loads(data)["models"]
        entry = models[model] if isinstance(models, dict) else None
    except KeyError:
        entry = None
    except (ValueError, TypeError):
        raise refusal.Refusal(f"{url} is not a store manifest") from None
    if entry is None:
        raise refusal.Refusal(f"{model} is not in the store ({store})")
    sha = entry.get("sha256") if isinstance(entry, dict) else None
    path = entry.get("path", f"{model}.tar.gz") if isinstance(entry, dict) else None
    if not isinstance(sha, str) or not SHA256_RE.fullmatch(sha.lower()):
        raise refusal.Refusal(f"{url} has no sha256 for {model}")
    if not isinstance(path, str) or not STORE_PATH_RE.fullmatch(path) or ".." in path.split("/"):
        raise refusal.Refusal(f"{url} names an unsafe path for {model}: {path!r}")
    return {"sha256": sha.lower(), "path": path}


def from_store(
    a: argparse.Namespace, hub: Path, client: http_client.Client, uid: int, gid: int
) -> str:
    """Fetch a.model from the store into hub; return its revision."""
    store = a.store.rstrip("/")
    if a.sha256:
        want, path, said = a.sha256, f"{a.model}.tar.gz", "--sha256"
    else:
        entry = store_entry(client, store, a.model)
        want, path, said = entry["sha256"], entry["path"], "the store manifest"
    url = f"{store}/{path}"
    with snapshot_place.staging(hub) as tmp:
        archive = tmp.path / "archive"
        with open(archive, "wb") as out:
            got = client.download(url, out, f"{a.model} is not in the store ({store})")
        if got != want:
            raise refusal.Refusal(f"{a.model}: {url} has sha256 {got}, but {said} says {want}")
        return place(a, hub, archive, tmp.path, url, uid, gid)


def from_archive(a: argparse.Namespace, hub: Path, uid: int, gid: int) -> str:
    """Unpack a.model from a local archive (a wheelhouse copy) checked against a.sha256."""
    archive = Path(a.archive)
    digest = hashlib.sha256()
    try:
        with open(archive, "rb") as f:
            for chunk in iter(lambda: f.read(http_client.CHUNK), b""):
                digest.update(chunk)
    except OSError as exc:
        raise refusal.Refusal(f"{a.model}: cannot read {archive}: {exc.strerror}") from None
    if digest.hexdigest() != a.sha256:
        raise refusal.Refusal(
            f"{a.model}: {archive} has sha256 {digest.hexdigest()}, but --sha256 says {a.sha256}"
        )
    with snapshot_place.staging(hub) as tmp:
        return place(a, hub, archive, tmp.path, str(archive), uid, gid)


def place(
    a: argparse.Namespace, hub: Path, archive: Path, tmp: Path, source: str, uid: int, gid: int
) -> str:
    """Unpack a checked archive in tmp (an archive inside tmp is removed once unpacked), check
    and record its snapshot, give it to the owner and move it into hub
    (``snapshot_place.settle``); return its revision."""
    top = snapshot_place.repo_dir_name(a.model)
    repo = tar_safety.unpack(archive, tmp / "unpacked", top, source)
    if archive.parent == tmp:
        archive.unlink()
    return snapshot_place.settle(hub, repo, a.revision, source, tmp, uid, gid)
