"""The lab's Hugging Face hub (stdlib only): the part of the hub's HTTP API that
``huggingface_hub.snapshot_download`` calls, over the model store's archives, so a host's real
``huggingface_hub`` downloads a model from it as from the real hub (``HF_ENDPOINT``).

Served by ``python -m servefleet.fleet.lab.index hub STORE --bind IP --port N [--token-file FILE]``
(every lab server runs that module, see lab/layout.py). STORE is
the model store's directory (``manifest.json`` and ``<org>/<name>.tar.gz``, see
lab/simulator/store.py); each model's files are its archive's ``snapshots/<rev>/`` files, its
``main`` the manifest's revision. With ``--token-file`` every repository is gated: a request
without ``Authorization: Bearer <token>`` gets 401 and ``X-Error-Code: GatedRepo``, as the hub
answers for a gated model.

Served (what huggingface_hub 2.x asks, the shapes the real hub answers with):

    GET  /api/models/ORG/NAME[/revision/REV]     {"id", "sha", "siblings": [{"rfilename"}], ...}
    GET  /api/models/ORG/NAME/tree/REV[/PATH]    [{"type": "file", "path", "oid", "size"[, "lfs"]}]
    HEAD|GET /ORG/NAME/resolve/REV/PATH          the file; X-Repo-Commit, ETag (git blob sha1),
                                                 X-Linked-Etag/-Size (sha256) for *.safetensors

REV is ``main`` or the 40-hex commit. An unknown model is 404 ``RepoNotFound``, an unknown
revision 404 ``RevisionNotFound``, an unknown file 404 ``EntryNotFound``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import tarfile
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from servefleet.fleet.lab import httpbase

LFS_SUFFIXES = (".safetensors", ".bin", ".gguf")  # stored as LFS objects on the real hub


class Repo:
    """One model's commit and files (path in the snapshot -> bytes)."""

    def __init__(self, revision: str, files: dict[str, bytes]) -> None:
        self.revision = revision
        self.files = files

    def entry(self, path: str) -> dict[str, Any]:
        """The tree entry of one file, as the hub lists it."""
        data = self.files[path]
        blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        out: dict[str, Any] = {"type": "file", "path": path, "oid": blob, "size": len(data)}
        if path.endswith(LFS_SUFFIXES):
            sha = hashlib.sha256(data).hexdigest()
            out["lfs"] = {"oid": sha, "size": len(data), "pointerSize": 134}
        return out


def load_store(store: Path) -> dict[str, Repo]:
    """Every model of the store's manifest, read from its archive.

    + store: the model store's directory
    """
    manifest = json.loads((store / "manifest.json").read_text())
    repos = {}
    for model, entry in manifest["models"].items():
        rev = entry["revision"]
        prefix = f"models--{model.replace('/', '--')}/snapshots/{rev}/"
        files = {}
        with tarfile.open(store / entry["path"]) as tar:
            for member in tar.getmembers():
                if member.isfile() and member.name.startswith(prefix):
                    handle = tar.extractfile(member)
                    assert handle is not None
                    files[member.name[len(prefix) :]] = handle.read()
        repos[model] = Repo(rev, files)
    return repos


class Handler(httpbase.Handler):
    """The hub's API over repos, with or without a token."""

    server_version = "servefleet-lab-hub"
    repos: dict[str, Repo]  # set on the subclass made by make_server
    token: str | None

    def _error(self, code: int, error: str, message: str, head: bool) -> None:
        body = json.dumps({"error": message}).encode()
        headers = {"X-Error-Code": error} if error else {}
        headers["X-Error-Message"] = message
        self._send(code, body, "application/json", headers, head)

    def _json(self, value: Any, head: bool) -> None:
        self._send(200, json.dumps(value).encode(), "application/json", head=head)

    def _authorized(self, head: bool) -> bool:
        if self.token is None:
            return True
        got = self.headers.get("Authorization", "")
        if hmac.compare_digest(got.encode(), f"Bearer {self.token}".encode()):
            return True
        if got:
            self._error(401, "", "Invalid credentials in Authorization header", head)
        else:
            self._error(401, "GatedRepo", "Access to this model is restricted", head)
        return False

    def _repo(self, model: str, rev: str, head: bool) -> Repo | None:
        repo = self.repos.get(model)
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found", head)
            return None
        if rev not in ("main", repo.revision):
            self._error(404, "RevisionNotFound", "Invalid rev id: " + rev, head)
            return None
        return repo

    def _serve(self, head: bool) -> None:
        parts = [unquote(p) for p in urlsplit(self.path).path.split("/")[1:]]
        if not self._authorized(head):
            return
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            model, rest = "/".join(parts[2:4]), parts[4:]
            if not rest or (rest[0] == "revision" and len(rest) == 2):
                repo = self._repo(model, rest[1] if rest else "main", head)
                if repo:
                    siblings = [{"rfilename": p} for p in sorted(repo.files)]
                    info = {"_id": repo.revision[:24], "id": model, "modelId": model,
                            "sha": repo.revision, "private": False, "gated": "auto",
                            "disabled": False, "siblings": siblings}  # fmt: skip
                    self._json(info, head)
                return
            if rest[0] == "tree" and len(rest) >= 2:
                repo = self._repo(model, rest[1], head)
                if repo:
                    under = "/".join(x for x in rest[2:] if x)
                    paths = [
                        p for p in sorted(repo.files) if not under or p.startswith(under + "/")
                    ]
                    self._json([repo.entry(p) for p in paths], head)
                return
        elif len(parts) >= 5 and parts[2] == "resolve":
            repo = self._repo("/".join(parts[:2]), parts[3], head)
            if repo is None:
                return
            path = "/".join(parts[4:])
            if path not in repo.files:
                self._error(404, "EntryNotFound", f"{path} does not exist", head)
                return
            entry = repo.entry(path)
            headers = {"X-Repo-Commit": repo.revision, "ETag": f'"{entry["oid"]}"'}
            if "lfs" in entry:
                headers["X-Linked-Etag"] = f'"{entry["lfs"]["oid"]}"'
                headers["X-Linked-Size"] = str(entry["size"])
            self._send(200, repo.files[path], "application/octet-stream", headers, head)
            return
        self._error(404, "", "not found", head)


def make_server(
    repos: dict[str, Repo], bind: str, port: int, token: str | None = None
) -> httpbase.Server:
    """A threading HTTP server of the hub API over repos on bind:port (not started).

    + repos: the models served (see load_store)
    + bind: the address to listen on
    + port: the TCP port
    + token: the one token accepted (every repository gated), or None (open)
    """
    handler = type("LabHubHandler", (Handler,), {"repos": repos, "token": token})
    return httpbase.Server((bind, port), handler)
