"""src/servefleet/base/remote/fetch_model.py, run as the hosts run it (a python3 subprocess), against
stub HTTP servers on 127.0.0.1 and 127.0.0.2 serving crafted archives: what lands (owned, marked),
what is refused whole (unsafe members, wrong sha256, missing models, bad tokens, slow servers), and
that a refusal is one line and leaves neither a partial model nor a marker behind; what is
retried (503, 429, a cut connection, a refused one, a timeout: exit 3 when it persists) and what
is not (401, 403, 404: one request, one line)."""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from fetch_stubs import (
    CONFIG,
    MODEL,
    OWNER,
    REV,
    SCRIPT,
    TOKEN,
    TOP,
    Member,
    Route,
    Stub,
    fake_hub_python,
    fake_hub_settings,
    fetch,
    hf_layout,
    in_turn,
    respond,
    tgz,
    write_token,
)

REV2 = hashlib.sha1(b"rev-2").hexdigest()
RECORDS = "servefleet-models"  # root's own directory in the hub: what each fetch brought (#36)


def _pythons() -> list[str]:
    """This interpreter, and the system python3 when it differs in having the tar data filter
    (hosts run /usr/bin/python3: Debian's 3.11.2 has no filter, so the fetcher's own checks are
    all that stands between an archive and the host)."""
    found = {sys.executable: hasattr(tarfile, "data_filter")}
    system = Path("/usr/bin/python3")
    if system.exists():
        code = "import tarfile; print(hasattr(tarfile, 'data_filter'))"
        proc = subprocess.run([str(system), "-c", code], capture_output=True, text=True)
        has = proc.stdout.strip() == "True"
        if proc.returncode == 0 and has not in found.values():
            found[str(system)] = has
    return list(found)


PYTHONS = _pythons()


# --- stub servers --------------------------------------------------------------------------------
def cut_short(body: bytes) -> Route:
    """200 with a Content-Length of body, but only half of it sent, then the connection closed."""

    def route(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body[: len(body) // 2])
        handler.wfile.flush()
        handler.close_connection = True

    return route


FAST = ["--retry-wait", "0.01"]  # retries without the real waits


@pytest.fixture
def stub() -> Iterator[Stub]:
    server = Stub("127.0.0.1")
    yield server
    server.close()


@pytest.fixture
def other() -> Iterator[Stub]:
    """A second server: 127.0.0.2 is another host than 127.0.0.1 (same loopback)."""
    server = Stub("127.0.0.2")
    yield server
    server.close()


# --- archives ------------------------------------------------------------------------------------
def publish(stub: Stub, data: bytes, sha256: str | None = None, manifest: bool = True) -> str:
    """Serve data as MODEL's archive under <stub>/store (with a manifest); return the store URL."""
    sha = sha256 or hashlib.sha256(data).hexdigest()
    stub.routes[f"/store/{MODEL}.tar.gz"] = respond(200, data)
    if manifest:
        entry = {"sha256": sha, "revision": REV, "path": f"{MODEL}.tar.gz"}
        body = json.dumps({"models": {MODEL: entry}}).encode()
        stub.routes["/store/manifest.json"] = respond(200, body)
    return f"{stub.url}/store"


# --- running the fetcher -------------------------------------------------------------------------
@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "hf"


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    return write_token(tmp_path / "hf-token")


def refused(proc: subprocess.CompletedProcess[str], code: int = 1) -> str:
    """The one stderr line of a refusal (no traceback, nothing on stdout)."""
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("servefleet: "), proc.stderr
    return lines[0]


def assert_nothing_left(home: Path) -> None:
    """No model directory, no marker, no temporary directory under $HF_HOME/hub."""
    assert sorted(p.name for p in (home / "hub").iterdir()) == []


def marker(home: Path) -> str:
    return (home / "hub" / TOP / ".servefleet-complete").read_text()


# --- what lands ----------------------------------------------------------------------------------
@pytest.mark.parametrize("python", PYTHONS)
def test_good_archive_lands_owned_and_marked_last(
    python: str, stub: Stub, home: Path, token_file: Path
) -> None:
    stub.token = TOKEN
    store = publish(stub, tgz(hf_layout()))
    (home / "hub" / ".fetch-killed-run").mkdir(parents=True)  # left by a killed fetch
    proc = fetch(home, "--store", store, "--token-file", str(token_file), python=python)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{MODEL} {REV} is in {home / 'hub'}\n" and proc.stderr == ""
    repo = home / "hub" / TOP
    assert sorted(p.name for p in (home / "hub").iterdir()) == [TOP, RECORDS]
    assert marker(home) == REV
    snap = repo / "snapshots" / REV
    # root's record of what it fetched (#36), in root's own directory of the hub
    records = home / "hub" / RECORDS
    assert (records.lstat().st_uid, records.lstat().st_mode & 0o022) == (os.geteuid(), 0)
    assert json.loads((records / TOP).read_text()) == {"revision": REV, "files": {
        "config.json": [len(CONFIG), hashlib.sha256(CONFIG).hexdigest()],
        "model.safetensors": [13, hashlib.sha256(b"stub weights\n").hexdigest()]}}  # fmt: skip
    assert (snap / "config.json").read_bytes() == CONFIG
    assert (snap / "model.safetensors").stat().st_mode & 0o7777 == 0o755  # setuid dropped
    owner = pwd.getpwnam(OWNER)
    for path in [repo, *repo.rglob("*")]:
        st = path.lstat()
        assert (st.st_uid, st.st_gid) == (owner.pw_uid, owner.pw_gid), path
    assert stub.paths() == ["/store/manifest.json", f"/store/{MODEL}.tar.gz"]
    assert {h.get("authorization") for _, h in stub.seen} == {f"Bearer {TOKEN}"}


def test_refetch_replaces_the_copy_and_sha256_flag_needs_no_manifest(
    stub: Stub, home: Path
) -> None:
    assert fetch(home, "--store", publish(stub, tgz(hf_layout()))).returncode == 0
    data = tgz(hf_layout(REV2, REV2))
    stub.routes.clear()
    stub.seen.clear()
    store = publish(stub, data, manifest=False)
    proc = fetch(home, "--store", store, "--sha256", hashlib.sha256(data).hexdigest().upper())
    assert proc.returncode == 0, proc.stderr
    assert marker(home) == REV2
    assert sorted(p.name for p in (home / "hub" / TOP / "snapshots").iterdir()) == [REV2]
    assert "/store/manifest.json" not in stub.paths()


def test_a_pinned_revision_must_be_in_the_archive(stub: Stub, home: Path) -> None:
    store = publish(stub, tgz(hf_layout(snapshot=REV2, main=REV)))  # refs/main names another
    proc = fetch(home, "--store", store, "--revision", REV2)
    assert proc.returncode == 0, proc.stderr
    assert marker(home) == REV2
    # offline servers load what refs/main names: the pinned snapshot
    assert (home / "hub" / TOP / "refs" / "main").read_text() == REV2
    shutil.rmtree(home / "hub" / TOP)
    shutil.rmtree(home / "hub" / RECORDS)  # a hub as before the first fetch
    line = refused(fetch(home, "--store", store, "--revision", REV))
    assert line == (
        f"servefleet: {store}/{MODEL}.tar.gz does not hold the files of {TOP}/snapshots/{REV}"
    )
    assert_nothing_left(home)


def test_a_local_archive_lands_when_its_sha256_matches_and_is_refused_whole_otherwise(
    tmp_path: Path, home: Path
) -> None:
    """``--archive`` (a host's wheelhouse copy): checked, unpacked and marked as a store
    archive is, with no network; it needs --sha256, and a copy that differs is refused."""
    archive = tmp_path / "tiny-1.tar.gz"
    archive.write_bytes(tgz(hf_layout()))
    sha = hashlib.sha256(archive.read_bytes()).hexdigest()
    line = refused(fetch(home, "--archive", str(archive), "--sha256", "0" * 64))
    assert line == (
        f"servefleet: {MODEL}: {archive} has sha256 {sha}, but --sha256 says {'0' * 64}"
    )
    assert_nothing_left(home)
    no_sha = refused(fetch(home, "--archive", str(archive)), code=2)
    assert no_sha == "servefleet: fetch_model.py: --archive needs --sha256"
    proc = fetch(home, "--archive", str(archive), "--sha256", sha, "--revision", REV)
    assert proc.returncode == 0, proc.stderr
    assert marker(home) == REV and archive.is_file()  # the copy stays for the next host step
    assert sorted(p.name for p in (home / "hub").iterdir()) == [TOP, RECORDS]


# --- what is refused whole -----------------------------------------------------------------------
def unsafe_cases(out: str) -> dict[str, tuple[list[Member], str, str]]:
    """case -> (members added to a good archive, the member named, why); out: a directory
    outside $HF_HOME that nothing may touch."""
    snap = f"{TOP}/snapshots/{REV}"
    return {
        "dotdot": ([("file", f"{TOP}/../escape", b"x")], f"{TOP}/../escape", "'..' in its path"),
        "absolute": ([("file", f"{out}/abs", b"x")], f"{out}/abs", "absolute path"),
        "outside the repo dir": ([("file", "elsewhere/x", b"x")], "elsewhere/x", f"outside {TOP}/"),
        "symlink out": (
            [("sym", f"{snap}/evil", "../" * 20 + f"{out.lstrip('/')}/target")],
            f"{snap}/evil",
            "resolves outside",
        ),
        "absolute symlink": (
            [("sym", f"{TOP}/evil", f"{out}/target")],
            f"{TOP}/evil",
            f"symlink to the absolute path {out}/target",
        ),
        # each link stays inside when read alone; followed as the kernel does, x leaves the repo
        "symlink chain out": (
            [("sym", f"{TOP}/snapshots/back", ".."), ("sym", f"{TOP}/snapshots/x", "back/../..")],
            f"{TOP}/snapshots/x",
            f"symlink to back/../..: resolves outside {TOP}/",
        ),
        "symlink loop": (
            [("sym", f"{TOP}/a", "b"), ("sym", f"{TOP}/b", "a")],
            f"{TOP}/a",
            "symlink to b: a symlink loop",
        ),
        "write through a symlinked dir": (
            [("sym", f"{TOP}/d", "snapshots"), ("file", f"{TOP}/d/f", b"x")],
            f"{TOP}/d/f",
            "inside a symlinked directory",
        ),
        "a file over a symlink": (
            [("sym", f"{TOP}/f", "refs/main"), ("file", f"{TOP}/f", b"x")],
            f"{TOP}/f",
            "appears twice",
        ),
        "hard link": ([("hard", f"{TOP}/h", f"{TOP}/refs/main")], f"{TOP}/h", "hard link"),
        "a marker of its own": (
            [("file", f"{TOP}/.servefleet-complete", REV.encode())],
            f"{TOP}/.servefleet-complete",
            "only the fetcher writes the completeness marker",
        ),
        "device": ([("chr", f"{TOP}/null")], f"{TOP}/null", "device or fifo"),
        "fifo": ([("fifo", f"{TOP}/pipe")], f"{TOP}/pipe", "device or fifo"),
    }


@pytest.mark.parametrize("python", PYTHONS)
@pytest.mark.parametrize("case", sorted(unsafe_cases("/out")))
def test_unsafe_archives_are_refused_whole(
    case: str, python: str, stub: Stub, home: Path, tmp_path: Path
) -> None:
    out = tmp_path / "outside"
    out.mkdir()
    (out / "target").write_text("untouched\n")
    members, name, why = unsafe_cases(str(out))[case]
    store = publish(stub, tgz(hf_layout() + members))
    line = refused(fetch(home, "--store", store, python=python))
    assert line.startswith(f"servefleet: {store}/{MODEL}.tar.gz: unsafe member {name!r} ("), line
    assert line.endswith(")") and why in line
    assert_nothing_left(home)
    assert sorted(p.name for p in out.iterdir()) == ["target"]
    assert (out / "target").read_text() == "untouched\n"


def test_sha256_mismatch_with_the_manifest(stub: Stub, home: Path) -> None:
    data = tgz(hf_layout())
    store = publish(stub, data, sha256="0" * 64)
    line = refused(fetch(home, "--store", store))
    assert line == (
        f"servefleet: {MODEL}: {store}/{MODEL}.tar.gz has sha256 "
        f"{hashlib.sha256(data).hexdigest()}, but the store manifest says {'0' * 64}"
    )
    assert_nothing_left(home)


def test_sha256_mismatch_with_the_flag(stub: Stub, home: Path) -> None:
    data = tgz(hf_layout())
    store = publish(stub, data)
    line = refused(fetch(home, "--store", store, "--sha256", "f" * 64))
    assert line == (
        f"servefleet: {MODEL}: {store}/{MODEL}.tar.gz has sha256 "
        f"{hashlib.sha256(data).hexdigest()}, but --sha256 says {'f' * 64}"
    )
    assert_nothing_left(home)


def test_an_earlier_copy_survives_a_failed_refetch(stub: Stub, home: Path) -> None:
    assert fetch(home, "--store", publish(stub, tgz(hf_layout()))).returncode == 0
    stub.routes.clear()
    store = publish(stub, tgz(hf_layout(REV2, REV2) + [("hard", f"{TOP}/h", f"{TOP}/refs/main")]))
    refused(fetch(home, "--store", store))
    assert marker(home) == REV and (home / "hub" / TOP / "snapshots" / REV).is_dir()
    assert sorted(p.name for p in (home / "hub").iterdir()) == [TOP, RECORDS]


@pytest.mark.parametrize("listed", [False, True], ids=["not in the manifest", "archive 404"])
def test_a_model_missing_from_the_store_is_one_line(stub: Stub, home: Path, listed: bool) -> None:
    store = publish(stub, b"")
    del stub.routes[f"/store/{MODEL}.tar.gz"]
    if not listed:
        stub.routes["/store/manifest.json"] = respond(200, b'{"models": {}}')
    assert refused(fetch(home, "--store", store)) == (
        f"servefleet: {MODEL} is not in the store ({store})"
    )
    assert_nothing_left(home)


def test_a_store_without_manifest_wants_the_sha256_flag(stub: Stub, home: Path) -> None:
    store = publish(stub, tgz(hf_layout()), manifest=False)
    line = refused(fetch(home, "--store", store))
    assert line == (
        f"servefleet: {store}/manifest.json answered 404: the store publishes no manifest; "
        "give --sha256"
    )


def test_401_names_the_token_variable_and_never_the_token(
    stub: Stub, home: Path, tmp_path: Path
) -> None:
    stub.token = "hf_the-right-one"
    store = publish(stub, tgz(hf_layout()))
    wrong = write_token(tmp_path / "wrong")
    proc = fetch(home, "--store", store, "--token-file", str(wrong), "--token-env", "HF_TOKEN")
    assert refused(proc) == (
        f"servefleet: {store}/manifest.json answered 401; check the HF_TOKEN environment "
        "variable on the controller"
    )
    assert TOKEN not in proc.stderr
    assert stub.paths() == ["/store/manifest.json"]  # a refusal is never tried again
    assert_nothing_left(home)


@pytest.mark.parametrize("where", ["same host", "other host"])
def test_a_redirect_carries_the_token_only_within_the_origin(
    where: str, stub: Stub, other: Stub, home: Path, token_file: Path
) -> None:
    stub.token = TOKEN
    data = tgz(hf_layout())
    store = publish(stub, data)
    target = stub if where == "same host" else other
    target.routes["/blobs/tiny.tar.gz"] = respond(200, data)
    stub.routes[f"/store/{MODEL}.tar.gz"] = respond(
        302, headers={"Location": f"{target.url}/blobs/tiny.tar.gz"}
    )
    proc = fetch(home, "--store", store, "--token-file", str(token_file))
    assert proc.returncode == 0, proc.stderr
    assert marker(home) == REV
    sent = {path: h.get("authorization") for path, h in target.seen}
    assert "/blobs/tiny.tar.gz" in sent
    if where == "other host":
        assert sent == {"/blobs/tiny.tar.gz": None}
    else:
        assert sent["/blobs/tiny.tar.gz"] == f"Bearer {TOKEN}"


def _slow_headers(handler: BaseHTTPRequestHandler) -> None:
    time.sleep(3)  # then hang up without an answer


def _slow_body(handler: BaseHTTPRequestHandler) -> None:
    handler.send_response(200)
    handler.send_header("Content-Length", "1000")
    handler.end_headers()
    handler.wfile.write(b"x" * 10)
    handler.wfile.flush()
    time.sleep(3)


UNREACHED = r"tried (\d+) times over [0-9.]+ s\); worth a re-run later"


@pytest.mark.parametrize("route", [_slow_headers, _slow_body], ids=["headers", "body"])
def test_a_slow_server_times_out_naming_the_url(route: Route, stub: Stub, home: Path) -> None:
    """A timeout is transient: tried again (--tries), then exit 3 naming the URL."""
    store = publish(stub, b"")
    stub.routes[f"/store/{MODEL}.tar.gz"] = route
    start = time.monotonic()
    args = ["--sha256", "a" * 64, "--timeout", "0.5", "--tries", "2", *FAST]
    line = refused(fetch(home, "--store", store, *args), code=3)
    assert time.monotonic() - start < 5  # each try waits 0.5 s, not the server's 3 s
    url = f"{store}/{MODEL}.tar.gz"
    assert re.fullmatch(
        rf"servefleet: could not reach {url}: no answer within 0\.5 s \(" + UNREACHED, line
    )
    assert stub.paths().count(f"/store/{MODEL}.tar.gz") == 2
    assert_nothing_left(home)


def test_a_closed_port_is_tried_again_then_could_not_reach(home: Path) -> None:
    server = Stub("127.0.0.1")
    server.close()  # nothing listens there now
    line = refused(fetch(home, "--store", f"{server.url}/store", "--tries", "3", *FAST), code=3)
    url = f"{server.url}/store/manifest.json"
    got = re.fullmatch(
        rf"servefleet: could not reach {url}: Connection refused \(" + UNREACHED, line
    )
    assert got and got.group(1) == "3", line


@pytest.mark.parametrize(
    "first",
    [respond(503, b"busy\n"), respond(429, headers={"Retry-After": "0"}), respond(502)],
    ids=["503", "429", "502"],
)
def test_a_transient_answer_is_tried_again_and_the_fetch_lands(
    first: Route, stub: Stub, home: Path
) -> None:
    data = tgz(hf_layout())
    store = publish(stub, data)
    stub.routes["/store/manifest.json"] = in_turn(first, stub.routes["/store/manifest.json"])
    archive = stub.routes[f"/store/{MODEL}.tar.gz"]
    stub.routes[f"/store/{MODEL}.tar.gz"] = in_turn(first, first, archive)
    proc = fetch(home, "--store", store, *FAST)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert marker(home) == REV
    assert stub.paths() == ["/store/manifest.json"] * 2 + [f"/store/{MODEL}.tar.gz"] * 3


def test_a_download_cut_short_starts_over(stub: Stub, home: Path) -> None:
    """The second try writes the archive from its start (the first half is not kept twice)."""
    data = tgz(hf_layout())
    store = publish(stub, data)
    stub.routes[f"/store/{MODEL}.tar.gz"] = in_turn(cut_short(data), respond(200, data))
    proc = fetch(home, "--store", store, *FAST)
    assert proc.returncode == 0, proc.stderr
    assert marker(home) == REV and stub.paths().count(f"/store/{MODEL}.tar.gz") == 2


@pytest.mark.parametrize("status", [401, 403, 404])
def test_a_refusal_is_asked_once(status: int, stub: Stub, home: Path) -> None:
    store = publish(stub, tgz(hf_layout()))
    stub.routes[f"/store/{MODEL}.tar.gz"] = respond(status, b"no\n")
    line = refused(fetch(home, "--store", store, "--token-env", "HF_TOKEN", *FAST))
    assert stub.paths() == ["/store/manifest.json", f"/store/{MODEL}.tar.gz"], stub.paths()
    assert f"{store}/{MODEL}.tar.gz" in line or MODEL in line
    assert_nothing_left(home)


def test_a_persisting_503_could_not_be_reached(stub: Stub, home: Path) -> None:
    store = publish(stub, tgz(hf_layout()))
    stub.routes["/store/manifest.json"] = respond(503, b"busy\n")
    line = refused(fetch(home, "--store", store, *FAST), code=3)
    got = re.fullmatch(
        rf"servefleet: could not reach {store}/manifest.json: answered 503 Service Unavailable \("
        + UNREACHED,
        line,
    )
    assert got and got.group(1) == "5" and stub.paths() == ["/store/manifest.json"] * 5, line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["../x", "/hf"], "'../x' is not a model id ORG/NAME"),
        (["acme/..", "/hf"], "'acme/..' is not a model id"),
        (["acme", "/hf"], "'acme' is not a model id"),
        (["acme/a b", "/hf"], "'acme/a b' is not a model id"),
        ([MODEL, "hf"], "HF_HOME must be an absolute path, not hf"),
        ([MODEL, "/hf", "--revision", "main"], "--revision 'main' is not a commit hash"),
        ([MODEL, "/hf", "--sha256", "abc"], "--sha256 'abc' is not 64 hex digits"),
        ([MODEL, "/hf", "--timeout", "0"], "--timeout must be above 0, not 0"),
        ([MODEL, "/hf", "--token-env", "HF TOKEN"], "--token-env 'HF TOKEN' is not a variable"),
        ([MODEL, "/hf", "--tries", "0"], "--tries must be 1 to 20, not 0"),
        ([MODEL, "/hf", "--retry-wait", "-1"], "--retry-wait must be 0 to 60 seconds, not -1"),
    ],
)
def test_bad_arguments_are_one_line(args: list[str], message: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), args[0], args[1], OWNER, "--store", "http://s", *args[2:]],
        capture_output=True,
        text=True,
    )
    assert refused(proc, code=2).startswith(f"servefleet: fetch_model.py: {message}")


@pytest.mark.parametrize(
    ("store", "message"),
    [
        ("file:///srv/models", "--store 'file:///srv/models' is not an http(s) URL"),
        ("http://u:p@store.invalid/m", "--store must not carry credentials; give --token-file"),
    ],
)
def test_bad_store_urls(store: str, message: str, home: Path) -> None:
    assert (
        refused(fetch(home, "--store", store), code=2) == f"servefleet: fetch_model.py: {message}"
    )


def test_unknown_owner_and_an_open_token_file(stub: Stub, home: Path, token_file: Path) -> None:
    store = publish(stub, tgz(hf_layout()))
    line = refused(fetch(home, "--store", store, owner="no-such-user-here"))
    assert line == "servefleet: no user no-such-user-here on this host"
    token_file.chmod(0o644)
    proc = fetch(home, "--store", store, "--token-file", str(token_file))
    assert refused(proc) == (
        f"servefleet: the token file {token_file} is open to others (mode 644); chmod 600"
    )
    assert stub.seen == [] and TOKEN not in proc.stderr


# --- the hub, through a stand-in huggingface_hub -------------------------------------------------
@pytest.fixture
def hub_python(reachable: Path) -> Path:
    """A release python whose huggingface_hub is fetch_stubs' stand-in (run as nobody)."""
    return fake_hub_python(reachable)


def test_hub_download_is_marked_owned_and_gets_the_token_on_its_stdin_only(
    hub_python: Path, home: Path, token_file: Path, monkeypatch: Any
) -> None:
    log = fake_hub_settings(hub_python)
    monkeypatch.setenv("HF_TOKEN", "hf_from_the_environment")
    args = ["--hub", str(hub_python), "--token-file", str(token_file), "--timeout", "7"]
    proc = fetch(home, *args, "--revision", REV2)
    assert proc.returncode == 0, proc.stderr
    assert marker(home) == REV2
    assert (home / "hub" / TOP / "refs" / "main").read_text() == REV2
    seen = json.loads(log.read_text())
    # the client's HF_HOME is root's staging directory, bind-mounted on an empty root-only
    # directory under /run in the client's own mount namespace: resolving it follows nothing of
    # the serve user's (#18); the mount point goes with the client
    home_dir = seen.pop("home_dir")
    assert re.fullmatch(r"/run/servefleet-fetch-[0-9a-f]{16}", home_dir)
    assert seen.pop("resolved") == home_dir and not Path(home_dir).exists()
    nobody = pwd.getpwnam("nobody")  # the client's own directory: it runs as nobody (#46 item 4)
    assert seen.pop("home_owner") == [nobody.pw_uid, 0o700]
    assert seen.pop("uid") == nobody.pw_uid
    assert seen == {
        "token": TOKEN,  # read from its stdin, never the 0600 file (no HF_TOKEN_PATH)
        "HF_TOKEN_PATH": None,
        "HF_TOKEN": None,
        "HF_HUB_DOWNLOAD_TIMEOUT": "7",
        "HF_ENDPOINT": None,
        "revision": REV2,
    }
    owner = pwd.getpwnam(OWNER)
    assert all(p.lstat().st_uid == owner.pw_uid for p in (home / "hub" / TOP).rglob("*"))


def test_the_hub_client_gets_the_endpoint_and_never_the_hosts_own(
    hub_python: Path, home: Path, monkeypatch: Any
) -> None:
    log = fake_hub_settings(hub_python)
    monkeypatch.setenv("HF_ENDPOINT", "http://mirror.invalid")  # the host's own: dropped
    assert fetch(home, "--hub", str(hub_python)).returncode == 0
    assert json.loads(log.read_text())["HF_ENDPOINT"] is None
    proc = fetch(home, "--hub", str(hub_python), "--endpoint", "http://10.213.0.1:8110/")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(log.read_text())["HF_ENDPOINT"] == "http://10.213.0.1:8110"
    for args, said in [
        (["--store", "http://s.invalid/", "--endpoint", "http://h.invalid"], "--endpoint goes with --hub"),
        (["--hub", str(hub_python), "--endpoint", "ftp://h.invalid"], "--endpoint 'ftp://h.invalid' is not an http(s) URL"),
        (["--hub", str(hub_python), "--endpoint", "http://u:p@h.invalid"], "--endpoint must not carry credentials; give --token-file"),
    ]:  # fmt: skip
        proc = fetch(home, *args)
        assert (proc.returncode, proc.stderr) == (2, f"servefleet: fetch_model.py: {said}\n")


def test_a_hub_client_working_by_its_resolved_path_writes_nothing_through_a_swap(
    hub_python: Path, reachable: Path, tmp_path: Path
) -> None:
    """#18, found with the real huggingface_hub on the lab: the client resolves HF_HOME to a real
    path before it writes. Given ``/proc/self/fd/N`` that was root's staging directory's path
    inside the serve user's hub, so the serve user could move the directory away and link its
    name to any root-owned directory, which root's client then wrote into. The stand-in does
    that swap between resolving and writing; the root-only directory stays as it was. (The
    client, nobody since #46 item 4, does the swap itself: the hub is where nobody reaches it.)"""
    home = reachable / "hf"
    sentinel, hub = root_only_and_serve_users_hub(tmp_path, home)
    fake_hub_settings(hub_python, FAKE_HUB_SWAP=str(sentinel), FAKE_HUB_HUB=str(hub))
    proc = fetch(home, "--hub", str(hub_python))
    assert sorted(p.name for p in sentinel.iterdir()) == ["keep"]
    assert proc.returncode == 0, proc.stderr
    assert marker(home) == REV and not (hub / TOP).is_symlink()


def test_the_hub_launcher_mounts_only_the_staging_directory_it_was_handed(tmp_path: Path) -> None:
    """hub_client.py opens the staging directory again from / (a descriptor of another mount
    namespace cannot be bind-mounted) and refuses anything but the directory of its descriptor:
    a link planted at the name, or another directory moved there."""
    from servefleet.base.remote import hub_client

    staging, other = tmp_path / ".fetch-a", tmp_path / "other"
    for d in (staging, other):
        d.mkdir(mode=0o700)
    fd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY)
    try:
        staging.rename(tmp_path / ".fetch-moved")
        for planted in ("link", "directory"):
            if planted == "link":
                staging.symlink_to(other)
            else:
                staging.unlink()
                other.rename(staging)
            with pytest.raises(hub_client.Refusal) as got:
                hub_client.mount_staging(fd, str(staging), str(tmp_path / "never"))
            assert str(got.value).startswith(f"{staging}: "), got.value
            assert str(got.value).endswith("nothing fetched"), got.value
    finally:
        os.close(fd)
    assert not (tmp_path / "never").exists()


def test_staging_gives_its_descriptor_and_the_path_of_it(tmp_path: Path) -> None:
    """The hub client is handed the staging directory's descriptor itself (pass_fds), not a
    number parsed back out of its /proc/self/fd path; the directory is root's 0700 and goes."""
    from servefleet.base.remote.snapshot_place import staging

    with staging(tmp_path) as st:
        assert st.path == Path(f"/proc/self/fd/{st.fd}")
        made = os.fstat(st.fd)
        assert made.st_uid == os.geteuid() and made.st_mode & 0o777 == 0o700
        (st.path / "x").write_text("staged")
        (entry,) = tmp_path.iterdir()
        assert entry.name.startswith(".fetch-") and (entry / "x").read_text() == "staged"
        assert os.path.samestat(made, os.stat(entry))
    assert list(tmp_path.iterdir()) == []


def test_hub_refusal_names_the_token_variable(hub_python: Path, home: Path) -> None:
    log = fake_hub_settings(hub_python, FAKE_HUB_FAIL="1")
    proc = fetch(home, "--hub", str(hub_python), "--token-env", "HF_TOKEN")
    assert refused(proc) == (
        f"servefleet: the Hugging Face hub refused {MODEL} (401 Client Error.); check the "
        "HF_TOKEN environment variable on the controller"
    )
    assert not (home / "hub" / TOP).exists()
    assert Path(f"{log}.calls").read_text() == "1"  # asked once


@pytest.mark.parametrize("flaky", [1, 9])
def test_hub_connection_errors_are_tried_again(flaky: int, hub_python: Path, home: Path) -> None:
    """A hub client that could not connect (its error caused by a ConnectError) is run again:
    it lands on the second try, or after --tries the line says it could not reach the hub."""
    log = fake_hub_settings(hub_python, FAKE_HUB_FLAKY=str(flaky))
    proc = fetch(home, "--hub", str(hub_python), "--tries", "3", *FAST)
    calls = Path(f"{log}.calls").read_text()
    if flaky == 1:
        assert proc.returncode == 0 and marker(home) == REV and calls == "2", proc.stderr
        return
    line = refused(proc, code=3)
    assert re.fullmatch(
        rf"servefleet: could not reach the Hugging Face hub for {MODEL}: LocalEntryNotFoundError: "
        r"cannot reach the hub and nothing is cached \(" + UNREACHED,
        line,
    ), line
    assert calls == "3" and not (home / "hub" / TOP).exists()


def test_positionals_after_a_double_dash_are_never_options(tmp_path: Path) -> None:
    """The deploy passes its options first and the model, HF_HOME and owner after ``--``; a
    model id that starts with a dash is then a refused id, never ``-h`` (which exited 0 having
    fetched nothing)."""
    proc = subprocess.run([sys.executable, str(SCRIPT), "--store", "http://127.0.0.1:9/", "--",
                           "-h", str(tmp_path / "hf"), "root"], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert proc.returncode != 0 and "usage" not in proc.stdout, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and "-h" in proc.stderr, proc.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="the serve user's links are planted as nobody")
def root_only_and_serve_users_hub(tmp_path: Path, home: Path, *more: str) -> tuple[Path, Path]:
    """A root-only directory holding ``keep``, and the serve user's HF_HOME/hub (with ``more``
    directories in it, its own too)."""
    owner = pwd.getpwnam(OWNER)
    sentinel = tmp_path / "root-only"
    sentinel.mkdir(mode=0o700)
    (sentinel / "keep").write_text("root's\n")
    hub = home / "hub"
    hub.mkdir(parents=True)
    for d in (home, hub, *(hub / m for m in more)):
        d.mkdir(exist_ok=True)
        os.chown(d, owner.pw_uid, owner.pw_gid)
    return sentinel, hub


def test_a_hub_fetch_writes_nothing_through_links_the_serve_user_planted(
    hub_python: Path, home: Path, tmp_path: Path
) -> None:
    """#18 finding 1 (hub): the serve user links its hub's model directory and ``.locks`` entry
    to a root-owned directory; the download lands in root's staging, replaces the link, and the
    root-owned directory keeps its owner and content."""
    owner = pwd.getpwnam(OWNER)
    sentinel, hub = root_only_and_serve_users_hub(tmp_path, home, ".locks")
    for link in (hub / TOP, hub / ".locks" / TOP):  # the serve user's links in its own tree
        link.symlink_to(sentinel)
        os.lchown(link, owner.pw_uid, owner.pw_gid)
    proc = fetch(home, "--hub", str(hub_python))
    assert proc.returncode == 0, proc.stderr
    assert not (hub / TOP).is_symlink() and marker(home) == REV
    assert sorted(p.name for p in sentinel.iterdir()) == ["keep"]
    st = sentinel.lstat()
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o700)
    assert (sentinel / "keep").lstat().st_uid == 0
    assert sorted(p.name for p in hub.iterdir()) == [".locks", TOP, RECORDS]  # no staging left


def test_a_lock_held_on_the_hub_fails_the_fetch_in_one_line_within_its_deadline(
    stub: Stub, home: Path
) -> None:
    """#31 (7): the serve user owns its hub and can hold ``flock`` on it; the fetch waits for the
    lock until its deadline (``--lock-timeout``), then fails in one line, fetching nothing."""
    import fcntl

    store = publish(stub, tgz(hf_layout()))
    (home / "hub").mkdir(parents=True)
    held = os.open(home / "hub", os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)  # as the serve user would, forever
        started = time.monotonic()
        line = refused(fetch(home, "--store", store, "--lock-timeout", "2"))
        took = time.monotonic() - started
    finally:
        os.close(held)
    assert line == (
        f"servefleet: {home / 'hub'}: another process holds its lock (a fetch, or the serve user "
        "holding it); gave up after 2 s (--lock-timeout), nothing fetched"
    )
    assert 2 <= took < 10, took
    assert stub.paths() == []
    assert fetch(home, "--store", store).returncode == 0  # released: the next fetch lands


def test_the_lock_timeout_must_be_positive() -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), MODEL, "/hf", OWNER, "--store", "http://s",
         "--lock-timeout", "0"],
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert (
        refused(proc, code=2) == "servefleet: fetch_model.py: --lock-timeout must be above 0, not 0"
    )
