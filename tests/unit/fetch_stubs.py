"""Stub HTTP servers on 127.0.0.x (:class:`Stub`, its routes ``respond`` and ``in_turn``), model
archives in the Hugging Face cache layout, and the host's model fetcher
(src/servefleet/base/remote/fetch_model.py) run as the hosts run it: test_fetch_model.py's, and
the downloads of test_retry.py, test_wheelhouse.py and test_lab_models.py."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import pwd
import subprocess
import sys
import tarfile
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from local_release import PYTHON as RELEASE_PYTHON
from repo_paths import REMOTE

SCRIPT = REMOTE / "fetch_model.py"
MODEL = "acme/tiny-1"
TOP = "models--acme--tiny-1"
REV = hashlib.sha1(b"rev-1").hexdigest()
TOKEN = "hf_stub" + "0123456789abcdef"
CONFIG = b'{"model_type": "tiny"}\n'
CONFIG_BLOB = hashlib.sha256(CONFIG).hexdigest()
# as root, give the files to another user, so the test sees the chown happen
OWNER = "nobody" if os.geteuid() == 0 else pwd.getpwuid(os.getuid()).pw_name


Route = Callable[[BaseHTTPRequestHandler], None]


def respond(status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> Route:
    def route(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(status)
        handler.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            handler.send_header(key, value)
        handler.end_headers()
        handler.wfile.write(body)

    return route


def in_turn(*routes: Route) -> Route:
    """The routes, one a request, the last one for every request after."""
    left = list(routes)

    def route(handler: BaseHTTPRequestHandler) -> None:
        (left.pop(0) if len(left) > 1 else left[0])(handler)

    return route


class Stub:
    """An HTTP server on host (random port) answering GETs from routes; with token set, paths
    under /store/ want ``Authorization: Bearer <token>``. Records every request's headers."""

    def __init__(self, host: str) -> None:
        self.routes: dict[str, Route] = {}
        self.seen: list[tuple[str, dict[str, str]]] = []
        self.token: str | None = None
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

            def do_GET(self) -> None:  # noqa: N802
                headers = {k.lower(): v for k, v in self.headers.items()}
                stub.seen.append((self.path, headers))
                wanted = f"Bearer {stub.token}"
                if (
                    stub.token
                    and self.path.startswith("/store/")
                    and (headers.get("authorization") != wanted)
                ):
                    respond(401, b"token required\n")(self)
                else:
                    stub.routes.get(self.path, respond(404, b"not found\n"))(self)

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://{host}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def paths(self) -> list[str]:
        return [path for path, _ in self.seen]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


Member = tuple[Any, ...]  # (kind, name, payload or link target, [mode])


def tgz(members: list[Member]) -> bytes:
    """The archive of ``members``, the same bytes each call (gzip's header time is 0: with the
    current time, two calls a second apart differed, and a test comparing their sha256s was
    flaky)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for kind, name, *rest in members:
            info = tarfile.TarInfo(name)
            info.mode = rest[1] if len(rest) > 1 else 0o644
            data = None
            if kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
            elif kind == "file":
                data = rest[0]
                info.size = len(data)
            elif kind in ("sym", "hard"):
                info.type = tarfile.SYMTYPE if kind == "sym" else tarfile.LNKTYPE
                info.linkname = rest[0]
            elif kind == "chr":
                info.type, info.devmajor, info.devminor = tarfile.CHRTYPE, 1, 3
            elif kind == "fifo":
                info.type = tarfile.FIFOTYPE
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return gzip.compress(buf.getvalue(), mtime=0)


def hf_layout(snapshot: str = REV, main: str = REV) -> list[Member]:
    """A Hugging Face cache repo: refs/main, a blob, a snapshot linking to it, a setuid file."""
    snap = f"{TOP}/snapshots/{snapshot}"
    return [
        ("dir", TOP),
        ("dir", f"{TOP}/refs"),
        ("file", f"{TOP}/refs/main", main.encode()),
        ("dir", f"{TOP}/blobs"),
        ("file", f"{TOP}/blobs/{CONFIG_BLOB}", CONFIG),
        ("dir", f"{TOP}/snapshots"),
        ("dir", snap),
        ("sym", f"{snap}/config.json", f"../../blobs/{CONFIG_BLOB}"),
        ("file", f"{snap}/model.safetensors", b"stub weights\n", 0o4777),
    ]


def write_token(path: Path, token: str = TOKEN) -> Path:
    """A token file as the deploy writes it (0600)."""
    path.write_text(token + "\n")
    path.chmod(0o600)
    return path


def fetch(
    home: Path, *args: str, python: str = sys.executable, model: str = MODEL, owner: str = OWNER
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [python, str(SCRIPT), model, str(home), owner, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


# a stand-in huggingface_hub: snapshot_download logs what it was given to FAKE_HUB_LOG (and
# counts its calls), fails as FAKE_HUB_FAIL / FAKE_HUB_FLAKY say, swaps root's staging for a link
# with FAKE_HUB_SWAP, and lays the model out under HF_HOME as the real client does. It runs as
# nobody with a clean environment (#46 item 4), so its settings are a file beside it
# (:func:`fake_hub_settings`), @SETTINGS@ here
FAKE_HUB = """
import json, os, pathlib

class RepositoryNotFoundError(Exception):
    def __init__(self, message, status):
        super().__init__(message)
        self.response = type("R", (), {"status_code": status})()

class ConnectError(Exception):
    pass

class LocalEntryNotFoundError(Exception):
    pass

def snapshot_download(repo_id, revision=None, token=None):
    settings = json.loads(pathlib.Path(@SETTINGS@).read_text())
    home = os.environ["HF_HOME"]
    st = os.stat(home)
    seen = {k: os.environ.get(k) for k in ("HF_TOKEN_PATH", "HF_TOKEN", "HF_HUB_DOWNLOAD_TIMEOUT",
                                           "HF_ENDPOINT")}
    # as the real client (cache_dir = Path(cache_dir).expanduser().resolve()), then works by it
    resolved = str(pathlib.Path(home).resolve())
    seen.update(home_dir=home, resolved=resolved, home_owner=[st.st_uid, st.st_mode & 0o777],
                token=token, uid=os.getuid())
    log = settings["FAKE_HUB_LOG"]
    pathlib.Path(log).write_text(json.dumps(dict(seen, revision=revision)))
    calls = pathlib.Path(log + ".calls")
    calls.write_text(str(int(calls.read_text() if calls.exists() else 0) + 1))
    if settings.get("FAKE_HUB_FAIL"):
        raise RepositoryNotFoundError("401 Client Error.\\nRepository Not Found", 401)
    if int(calls.read_text()) <= int(settings.get("FAKE_HUB_FLAKY", "0")):  # as the real one
        try:  # says it when its connection to the hub fails
            raise ConnectError("[Errno 111] Connection refused")
        except ConnectError as exc:
            raise LocalEntryNotFoundError("cannot reach the hub and nothing is cached") from exc
    swap = settings.get("FAKE_HUB_SWAP")  # the serve user, meanwhile: root's staging moved
    if swap:  # away and a link to a root-only directory in its place
        hub = pathlib.Path(settings["FAKE_HUB_HUB"])
        (staged,) = hub.glob(".fetch-*")
        staged.rename(hub / ".fetch-moved")
        staged.symlink_to(swap)
    repo = pathlib.Path(resolved, "hub", "models--" + repo_id.replace("/", "--"))
    rev = revision or "@REV@"
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(rev)
    (repo / "snapshots" / rev).mkdir(parents=True, exist_ok=True)
    (repo / "snapshots" / rev / "config.json").write_text("{}")
    return str(repo / "snapshots" / rev)
""".replace("@REV@", REV)


def fake_hub_python(where: Path, module: str = FAKE_HUB) -> Path:
    """The ``bin/python`` of a new venv (as a release is) whose huggingface_hub is ``module``
    (:data:`FAKE_HUB`), with its settings (:func:`fake_hub_settings`) and a log directory
    ``nobody`` may write, the hub client's user on hosts (#46 item 4).

    + where: a directory ``nobody`` can reach (``reachable``), where the venv goes
    + module: the package's ``__init__.py`` text (``@SETTINGS@``: the settings file's path)
    """
    venv = where / "hubvenv"
    subprocess.run([RELEASE_PYTHON, "-m", "venv", "--without-pip", str(venv)], check=True)
    (site,) = venv.glob("lib/python3*/site-packages")
    (site / "huggingface_hub").mkdir()
    settings = venv / "fake-hub.json"
    text = module.replace("@SETTINGS@", repr(str(settings)))
    (site / "huggingface_hub" / "__init__.py").write_text(text)
    log = venv / "log"
    log.mkdir()
    nobody = pwd.getpwnam("nobody")
    os.chown(log, nobody.pw_uid, nobody.pw_gid)
    fake_hub_settings(venv / "bin" / "python")
    return venv / "bin" / "python"


def fake_hub_settings(python: Path, **settings: str) -> Path:
    """Set the stand-in's settings (``FAKE_HUB_FAIL="1"``, ...); return its log's path.

    + python: what :func:`fake_hub_python` returned
    """
    venv = python.parent.parent
    log = venv / "log" / "hub-log.json"
    (venv / "fake-hub.json").write_text(json.dumps({"FAKE_HUB_LOG": str(log), **settings}))
    return log
