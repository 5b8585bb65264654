"""The model fetcher the deploy uploads, on a lab host, against a hostile store served on that
host's own loopback: archives whose members or links escape, and a store that redirects to
another host. Each is refused with one line; nothing outside the target is touched; the token
never reaches the other host."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
from faults import run
from labhelpers import on_host

FETCHER = (
    Path(__file__).resolve().parents[2]
    / "src"
    / "servefleet"
    / "base"
    / "remote"
    / "fetch_model.py"
)
MODEL = "evil/model"
REPO_DIR = "models--evil--model"
REV = "a" * 40
WORK = "/tmp/sf-hostile"

# a store on 127.0.0.1:PORT serving WORK/store; a second "host" on 127.0.0.2 logs the headers it
# gets; /redirect/* on the first answers 302 to the second
SERVER = r"""
import http.server, json, os, sys, threading
root, log = sys.argv[1], sys.argv[2]
class Store(http.server.SimpleHTTPRequestHandler):
    def __init__(self, *a, **k):
        super().__init__(*a, directory=root, **k)
    def do_GET(self):
        if self.path.startswith("/redirect/"):
            self.send_response(302)
            self.send_header("Location", "http://127.0.0.2:18081/" + self.path.split("/", 2)[2])
            self.end_headers()
            return
        super().do_GET()
class Other(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        with open(log, "a") as fh:
            fh.write(json.dumps({"path": self.path, "auth": self.headers.get("Authorization")}) + "\n")
        self.send_response(404)
        self.end_headers()
a = http.server.ThreadingHTTPServer(("127.0.0.1", 18080), Store)
b = http.server.ThreadingHTTPServer(("127.0.0.2", 18081), Other)
threading.Thread(target=b.serve_forever, daemon=True).start()
a.serve_forever()
"""


def archive(extra: list[tarfile.TarInfo]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in [(f"{REPO_DIR}/refs/main", REV.encode()),
                           (f"{REPO_DIR}/snapshots/{REV}/config.json", b"{}")]:  # fmt: skip
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info in extra:
            tar.addfile(info)
    return buf.getvalue()


def link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(f"{REPO_DIR}/{name}")
    info.type, info.linkname = kind, target
    return info


CASES = {
    "symlink out": [link("snapshots/x", "/tmp/sf-outside")],
    "dotdot": [link("../../../../../tmp/sf-outside/y", "", tarfile.DIRTYPE)],
    "hard link out": [link("snapshots/h", "/etc/passwd", tarfile.LNKTYPE)],
}


@pytest.fixture
def store(lab: dict[str, Any]) -> Any:
    assert run(lab, "--limit", "lab1").returncode == 0  # the fetcher is on the host
    on_host(lab, "lab1", f"rm -rf {WORK} /tmp/sf-outside && mkdir -p {WORK}/store/evil {WORK}/hf "
            f"&& umask 077 && echo hf_secret_token > {WORK}/token")  # fmt: skip
    on_host(lab, "lab1", f"cat > {WORK}/server.py", stdin=SERVER)
    on_host(lab, "lab1", f"nohup python3 {WORK}/server.py {WORK}/store {WORK}/other.log "
            f">/dev/null 2>&1 &")  # fmt: skip
    # both of its servers listen (within 10 s)
    on_host(lab, "lab1", "for i in $(seq 100); do ss -Hltn 'sport = :18080' | grep -q . && "
            "ss -Hltn 'sport = :18081' | grep -q . && exit 0; sleep 0.1; done; exit 1")  # fmt: skip
    yield lab
    on_host(lab, "lab1", f"pkill -f {WORK}/server.py; rm -rf {WORK} /tmp/sf-outside", check=False)


def publish(lab: dict[str, Any], data: bytes) -> None:
    manifest = {"models": {MODEL: {"sha256": hashlib.sha256(data).hexdigest(), "revision": REV,
                                   "path": f"{MODEL}.tar.gz"}}}  # fmt: skip
    on_host(
        lab,
        "lab1",
        f"base64 -d > {WORK}/store/{MODEL}.tar.gz",
        stdin=base64.b64encode(data).decode(),
    )
    on_host(lab, "lab1", f"cat > {WORK}/store/manifest.json", stdin=json.dumps(manifest))


def fetch(lab: dict[str, Any], store_url: str) -> Any:
    return on_host(lab, "lab1", f"python3 /opt/servefleet/lib/fetch_model.py {MODEL} {WORK}/hf "
                   f"root --store {store_url} --token-file {WORK}/token --token-env HF_TOKEN",
                   check=False)  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_archive_is_refused_whole(store: dict[str, Any], case: str) -> None:
    publish(store, archive(CASES[case]))
    proc = fetch(store, "http://127.0.0.1:18080")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "unsafe member" in lines[0] and "Traceback" not in proc.stderr
    on_host(store, "lab1", f"test ! -e /tmp/sf-outside && test ! -e {WORK}/hf/hub/{REPO_DIR}")
    assert "root:x:0:0" in on_host(store, "lab1", "head -1 /etc/passwd").stdout


def test_a_redirect_to_another_host_carries_no_token(store: dict[str, Any]) -> None:
    publish(store, archive([]))
    proc = fetch(store, "http://127.0.0.1:18080/redirect")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    seen = [json.loads(x) for x in on_host(store, "lab1", f"cat {WORK}/other.log 2>/dev/null || "
                                           "true").stdout.splitlines()]  # fmt: skip
    assert seen, "the redirect was not followed"
    assert all(entry["auth"] is None for entry in seen), seen
    # the same store without the redirect: fetched, complete
    ok = fetch(store, "http://127.0.0.1:18080")
    assert ok.returncode == 0, ok.stderr
    marker = f"{WORK}/hf/hub/{REPO_DIR}/.servefleet-complete"
    assert on_host(store, "lab1", f"cat {marker}").stdout == REV
