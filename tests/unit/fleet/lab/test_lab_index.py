"""The lab's stdlib PEP 503 index and static file server, in-process on 127.0.0.1."""

from __future__ import annotations

import base64
import hashlib
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_host import serving

from servefleet.fleet.lab import httpbase
from servefleet.fleet.lab.index import Config, fetch as _get, make_server, normalize, project_of


def _serve(config: Config) -> Iterator[str]:
    with serving(make_server(config, "127.0.0.1", 0)) as base:
        yield base


@pytest.fixture
def dists(tmp_path: Path) -> Path:
    root = tmp_path / "dists"
    root.mkdir()
    (root / "Vllm_RBLN-0.12.1-py3-none-any.whl").write_bytes(b"wheel one")
    (root / "arctic_inference-0.1.1.tar.gz").write_bytes(b"sdist")
    (root / "torch-2.13.0+cpu-py3-none-any.whl").write_bytes(b"torch")
    (root / "notes.txt").write_text("not a distribution")
    (tmp_path / "secret.whl").write_bytes(b"outside the root")
    return root


@pytest.fixture
def index(dists: Path) -> Iterator[str]:
    yield from _serve(Config("simple", dists))


@pytest.fixture
def private(dists: Path) -> Iterator[str]:
    yield from _serve(Config("simple", dists, basic=("lab-user", "pa:ss")))


@pytest.mark.parametrize(
    ("filename", "project"),
    [
        ("vllm_rbln-0.12.1-py3-none-any.whl", "vllm-rbln"),
        ("torch-2.13.0+cpu-py3-none-any.whl", "torch"),
        ("arctic_inference-0.1.1.tar.gz", "arctic-inference"),
        ("Foo.Bar-1.0.zip", "foo-bar"),
        ("README.md", None),
        ("nodash.tar.gz", None),
    ],
)
def test_project_of_file_names(filename: str, project: str | None) -> None:
    assert project_of(filename) == project


def test_normalize_follows_pep503() -> None:
    assert normalize("Friendly-Bard") == normalize("FRIENDLY_BARD") == "friendly-bard"
    assert normalize("a._-b") == "a-b"


def test_root_lists_normalized_projects(index: str) -> None:
    code, headers, body = _get(index + "/simple/")
    assert code == 200 and headers["Content-Type"] == "text/html"
    text = body.decode()
    for name in ("arctic-inference", "torch", "vllm-rbln"):
        assert f'<a href="{name}/">{name}</a>' in text
    assert "notes" not in text


def test_project_page_links_files_with_sha256(index: str, dists: Path) -> None:
    code, _, body = _get(index + "/simple/vllm-rbln/")
    digest = hashlib.sha256(b"wheel one").hexdigest()
    assert code == 200
    assert f'href="../../files/Vllm_RBLN-0.12.1-py3-none-any.whl#sha256={digest}"' in body.decode()
    code, _, data = _get(index + "/files/Vllm_RBLN-0.12.1-py3-none-any.whl")
    assert code == 200 and data == b"wheel one"


def test_unnormalized_names_redirect_and_unknown_projects_404(index: str) -> None:
    code, _, body = _get(index + "/simple/Vllm_Rbln/")
    assert code == 200 and b"Links for vllm-rbln" in body  # after the 301
    assert _get(index + "/simple/nope/")[0] == 404


def test_files_outside_the_root_are_not_served(index: str) -> None:
    assert _get(index + "/files/../secret.whl")[0] == 404
    assert _get(index + "/files/%2e%2e%2fsecret.whl")[0] == 404


def test_basic_auth_refuses_anonymous_and_wrong_credentials(private: str) -> None:
    code, headers, _ = _get(private + "/simple/")
    assert code == 401 and headers["WWW-Authenticate"] == 'Basic realm="servefleet-lab"'
    wrong = base64.b64encode(b"lab-user:nope").decode()
    assert _get(private + "/simple/", {"Authorization": f"Basic {wrong}"})[0] == 401
    good = base64.b64encode(b"lab-user:pa:ss").decode()
    assert _get(private + "/simple/torch/", {"Authorization": f"Basic {good}"})[0] == 200
    assert _get(private + "/files/torch-2.13.0+cpu-py3-none-any.whl")[0] == 401


def test_static_server_guards_only_the_token_path(tmp_path: Path) -> None:
    (tmp_path / "models" / "org").mkdir(parents=True)
    (tmp_path / "models" / "org" / "m.tar.gz").write_bytes(b"model")
    (tmp_path / "driver").mkdir()
    (tmp_path / "driver" / "d.run").write_bytes(b"runfile")
    for base in _serve(Config("static", tmp_path, token=("/models/", "hf_x"))):
        assert _get(base + "/driver/d.run")[2] == b"runfile"
        assert _get(base + "/models/org/m.tar.gz")[0] == 401
        assert _get(base + "/models/org/m.tar.gz", {"Authorization": "Bearer hf_y"})[0] == 401
        ok = _get(base + "/models/org/m.tar.gz", {"Authorization": "Bearer hf_x"})
        assert ok[0] == 200 and ok[2] == b"model"
        assert _get(base + "/driver/missing.run")[0] == 404


def test_a_revalidation_of_unchanged_bytes_is_304_and_of_new_bytes_200(
    index: str, dists: Path
) -> None:
    """An installer revalidates what it cached (uv sends If-None-Match): the same bytes answer
    304 without a body, as a real index does, so a host's uv cache is used; bytes served anew
    under the same name (``lab republish``) answer 200 with their own ETag."""
    url = f"{index}/files/torch-2.13.0+cpu-py3-none-any.whl"
    code, headers, body = _get(url)
    etag = headers["ETag"]
    assert (code, body, etag) == (200, b"torch", f'"{hashlib.sha256(b"torch").hexdigest()}"')
    code, headers, body = _get(url, {"If-None-Match": f'"other", {etag}'})
    assert (code, body, headers["ETag"]) == (304, b"", etag)
    page = _get(f"{index}/simple/torch/")
    assert _get(f"{index}/simple/torch/", {"If-None-Match": page[1]["ETag"]})[0] == 304
    (dists / "torch-2.13.0+cpu-py3-none-any.whl").write_bytes(b"republished")
    code, headers, body = _get(url, {"If-None-Match": etag})
    assert (code, body) == (200, b"republished") and headers["ETag"] != etag
    assert _get(f"{index}/simple/torch/", {"If-None-Match": page[1]["ETag"]})[0] == 200


def test_the_server_queues_an_installers_parallel_connections() -> None:
    """uv opens many connections at once. With the stdlib's listen backlog of 5, the kernel
    dropped the SYNs past it (TcpExtListenDrops) and each such connection waited for the 1 s SYN
    retransmission; the lab's servers queue 128. Nothing accepts here: every connect must still
    complete at once, from the backlog alone."""
    server = httpbase.Server(("127.0.0.1", 0), httpbase.Handler)
    clients = []
    try:
        for _ in range(64):
            clients.append(socket.create_connection(server.server_address, timeout=0.5))
    finally:
        for c in clients:
            c.close()
        server.server_close()
    assert len(clients) == 64


def test_every_response_leaves_without_waiting_for_a_delayed_ack() -> None:
    """Headers and body are two writes: each connection has TCP_NODELAY, or the body waits for
    the client's delayed ACK (40 ms on Linux)."""

    class Probe(httpbase.Handler):
        def _serve(self, head: bool) -> None:
            on = self.request.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            self._send(200, str(on).encode(), "text/plain", head=head)

    with serving(httpbase.Server(("127.0.0.1", 0), Probe)) as base:
        code, _, body = _get(base + "/")
    assert (code, body) == (200, b"1")
