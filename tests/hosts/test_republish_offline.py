"""``servefleet lab offline`` and ``lab up --offline``: from an offline host no lab server answers
(refused at once) while another host's do, and SSH to it works. ``servefleet lab republish``:
the owner's index serves other bytes under the same name and version at once, the build cache
keeps its bytes, and the next ``lab up`` serves the pristine files again."""

from __future__ import annotations

import hashlib
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from labhelpers import lab_up, on_host, servefleet

from servefleet.fleet.lab import layout
from servefleet.fleet.lab.index import fetch
from servefleet.fleet.lab.republish import index_headers

# every lab server; any HTTP answer (401 and 404 included) means the host reached it
SERVERS = {
    "index_private": layout.url(layout.PORT_INDEX_PRIVATE, "/simple/"),
    "index_vllm": layout.url(layout.PORT_INDEX_VLLM, "/simple/"),
    "index_torch": layout.url(layout.PORT_INDEX_TORCH, "/simple/"),
    "index_public": layout.url(layout.PORT_INDEX_PUBLIC, "/simple/"),
    "index_assets": layout.url(layout.PORT_INDEX_ASSETS, "/simple/"),
    "apt": layout.url(layout.PORT_APT, "/InRelease"),
    "files": layout.url(layout.PORT_FILES, "/models/manifest.json"),
    "hub": layout.url(layout.PORT_HUB, "/api/models/openai/gpt-oss-120b"),
}
PROBE = """
import json, sys, time, urllib.error, urllib.request
out = {}
for name, url in json.loads(sys.stdin.read()).items():
    t0 = time.monotonic()
    try:
        code = urllib.request.urlopen(url, timeout=5).status
    except urllib.error.HTTPError as exc:
        code = exc.code
    except OSError as exc:
        code = repr(getattr(exc, "reason", exc))
    out[name] = [code, round(time.monotonic() - t0, 2)]
print(json.dumps(out))
"""


def _probe(state: dict[str, Any], host: str) -> dict[str, list[Any]]:
    """What each lab server answers lab host ``host``: [HTTP status or error, seconds]."""
    proc = on_host(state, host, f"python3 -c '{PROBE}'", stdin=json.dumps(SERVERS), timeout=60)
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def _assert_cut_off(answers: dict[str, list[Any]]) -> None:
    for name, (code, seconds) in answers.items():
        assert isinstance(code, str) and "refused" in code.lower(), (name, code)
        assert seconds < 1.0, (name, seconds)  # rejected, not dropped: no timeout


def _assert_reaches(answers: dict[str, list[Any]]) -> None:
    for name, (code, _) in answers.items():
        assert isinstance(code, int), (name, code)


def _get_soon(url: str) -> int:
    """The HTTP status of url once its server listens (within 10 s)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            return fetch(url, timeout=5)[0]
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_an_offline_host_reaches_no_lab_server_and_still_answers_ssh(lab: dict[str, Any]) -> None:
    try:
        out = servefleet("lab", "offline", "lab3").stdout
        assert out.strip() == "offline: lab3"
        _assert_cut_off(_probe(lab, "lab3"))  # over SSH to lab3: that works
        _assert_reaches(_probe(lab, "lab1"))
        status = servefleet("lab", "status").stdout
        assert re.search(r"^lab3\s.*\srunning  offline$", status, re.MULTILINE), status
        assert re.search(r"^lab1\s.*\srunning$", status, re.MULTILINE), status
        # the controller still reaches what the host serves (replies pass, not only sshd's)
        on_host(lab, "lab3", "systemd-run --unit sf-offline-test python3 -m http.server 9911")
        assert _get_soon(f"http://{lab['hosts'][2]['address']}:9911/") == 200
        bad = servefleet("lab", "offline", "lab9", check=False)
        assert bad.returncode == 2 and bad.stderr.strip() == (
            "servefleet lab: lab offline names host 'lab9'; the lab has lab1, lab2, lab3"
        )
    finally:
        on_host(lab, "lab3", "systemctl stop sf-offline-test", check=False)
        out = servefleet("lab", "offline", "lab3", "--undo").stdout
    assert out.strip() == "offline: none"
    _assert_reaches(_probe(lab, "lab3"))
    assert "offline" not in servefleet("lab", "status").stdout


def _served(state: dict[str, Any], index: str, project: str, filename: str) -> str:
    """The sha256 an index's page gives for a file, checked against the bytes it serves."""
    headers = index_headers(state, index)
    code, _, page = fetch(f"{state['indexes'][index]}{project}/", headers)
    assert code == 200
    found = re.search(rf"/files/{re.escape(filename)}#sha256=([0-9a-f]{{64}})", page.decode())
    assert found, page
    code, _, data = fetch(
        f"{state['indexes'][index].replace('/simple/', '/files/')}{filename}", headers
    )
    assert code == 200 and hashlib.sha256(data).hexdigest() == found.group(1)
    return found.group(1)


@pytest.mark.lab_destructive
def test_republish_serves_new_bytes_keeps_the_cache_and_a_new_lab_is_pristine(
    lab: dict[str, Any],
) -> None:
    wheel = "rebel_compiler-0.12.0-py3-none-any.whl"
    cached = Path(lab["artifacts"]) / "index" / "private" / wheel
    cache_bytes, cache_inode = cached.read_bytes(), cached.stat().st_ino
    pristine = hashlib.sha256(cache_bytes).hexdigest()
    squatter = _served(lab, "public", "rebel-compiler", wheel)
    assert _served(lab, "private", "rebel-compiler", wheel) == pristine != squatter

    first = servefleet("lab", "republish", "rebel-compiler==0.12.0").stdout.strip()
    new = _served(lab, "private", "rebel-compiler", wheel)
    assert (
        first == (f"republished {wheel} on the private index: sha256 {pristine} -> {new}")
        and new != pristine
    )
    second = servefleet("lab", "republish", "Rebel_Compiler==0.12.0").stdout.strip()
    newer = _served(lab, "private", "rebel-compiler", wheel)
    assert second.endswith(f"sha256 {new} -> {newer}") and newer not in (new, pristine)
    squatted = servefleet("lab", "republish", "rebel-compiler==0.12.0", "--index", "public")
    assert "on the public index" in squatted.stdout
    assert _served(lab, "public", "rebel-compiler", wheel) != squatter
    # the build cache, shared by every lab: same bytes, same inode, no other name for it
    assert cached.read_bytes() == cache_bytes and cached.stat().st_ino == cache_inode
    assert cached.stat().st_nlink == 1
    status = servefleet("lab", "status").stdout
    assert f"republished    private  {wheel}  {pristine} -> {new}" in status
    assert f"republished    private  {wheel}  {new} -> {newer}" in status

    bad = servefleet("lab", "republish", "rebel-compiler==9.9", check=False)
    assert bad.returncode == 2 and bad.stderr.strip() == (
        "servefleet lab: no lab index serves rebel-compiler==9.9; the indexes have "
        "rebel-compiler private: 0.12.0, 0.12.1; public: 0.12.0"
    )

    # a new lab serves the pristine file again, and --offline makes a host offline from the start
    try:
        state = lab_up("--offline", "lab2")
        assert state["republished"] == [] and state["offline"] == ["lab2"]
        assert _served(state, "private", "rebel-compiler", wheel) == pristine
        assert _served(state, "public", "rebel-compiler", wheel) == squatter
        _assert_cut_off(_probe(state, "lab2"))
        _assert_reaches(_probe(state, "lab1"))
    finally:
        lab.clear()
        lab.update(lab_up())
    assert lab["offline"] == []
    _assert_reaches(_probe(lab, "lab2"))
