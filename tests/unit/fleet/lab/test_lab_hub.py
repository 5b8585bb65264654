"""The lab's Hugging Face hub (servefleet.fleet.lab.hub) over a model store built as the lab builds it:
the answers huggingface_hub's snapshot_download asks for, in the real hub's shapes, and its
refusals by the headers huggingface_hub maps to its errors (the real client against it on the lab
is tests/hosts/test_lab_model_store.py)."""

from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from fake_host import serving

from servefleet.fleet.lab.hub import load_store, make_server
from servefleet.fleet.lab.simulator.store import build_store, model_revision

MODEL = "openai/gpt-oss-120b"
REV = model_revision(MODEL)
TOKEN = "hf_lab_unit"


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    store = tmp_path_factory.mktemp("store")
    build_store(store, [MODEL])
    with serving(make_server(load_store(store), "127.0.0.1", 0, TOKEN)) as url:
        yield url


def get(url: str, token: str | None = TOKEN, method: str = "GET") -> tuple[int, Any, bytes]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read()


def test_model_info_tree_and_files_are_the_stores_snapshot(hub: str) -> None:
    for rev in ("main", REV):
        code, _, body = get(f"{hub}/api/models/{MODEL}/revision/{rev}")
        info = json.loads(body)
        assert code == 200 and (info["id"], info["sha"]) == (MODEL, REV)
        assert info["siblings"] == [
            {"rfilename": "config.json"},
            {"rfilename": "model.safetensors"},
        ]
    code, _, body = get(f"{hub}/api/models/{MODEL}/tree/{REV}?recursive=true&expand=false")
    tree = {e["path"]: e for e in json.loads(body)}
    assert code == 200 and sorted(tree) == ["config.json", "model.safetensors"]
    code, headers, weights = get(f"{hub}/{MODEL}/resolve/{REV}/model.safetensors")
    assert code == 200 and weights.startswith(b"servefleet lab simulation: stand-in weights")
    sha = hashlib.sha256(weights).hexdigest()
    blob = hashlib.sha1(b"blob %d\0" % len(weights) + weights).hexdigest()
    assert tree["model.safetensors"] == {
        "type": "file",
        "path": "model.safetensors",
        "oid": blob,
        "size": len(weights),
        "lfs": {"oid": sha, "size": len(weights), "pointerSize": 134},
    }
    assert headers["X-Repo-Commit"] == REV and headers["X-Linked-Etag"] == f'"{sha}"'
    assert (headers["ETag"], headers["X-Linked-Size"]) == (f'"{blob}"', str(len(weights)))
    code, headers, body = get(f"{hub}/{MODEL}/resolve/main/config.json", method="HEAD")
    assert (code, body, headers["X-Repo-Commit"]) == (200, b"", REV)
    assert "X-Linked-Etag" not in headers  # a small file is in git, not LFS


@pytest.mark.parametrize(
    ("path", "token", "code", "error"),
    [
        (f"/api/models/{MODEL}", None, 401, "GatedRepo"),
        (f"/{MODEL}/resolve/main/config.json", None, 401, "GatedRepo"),
        (f"/api/models/{MODEL}", "hf_wrong", 401, None),
        ("/api/models/acme/none", TOKEN, 404, "RepoNotFound"),
        (f"/api/models/{MODEL}/revision/{'0' * 40}", TOKEN, 404, "RevisionNotFound"),
        (f"/{MODEL}/resolve/{REV}/tokenizer.json", TOKEN, 404, "EntryNotFound"),
        ("/api/spaces/x/y", TOKEN, 404, None),
    ],
)
def test_refusals_carry_the_error_code_the_client_maps(
    hub: str, path: str, token: str | None, code: int, error: str | None
) -> None:
    got, headers, _ = get(hub + path, token)
    assert (got, headers.get("X-Error-Code")) == (code, error)
    if token == "hf_wrong":  # what huggingface_hub tells apart from a missing repository
        assert headers["X-Error-Message"] == "Invalid credentials in Authorization header"
