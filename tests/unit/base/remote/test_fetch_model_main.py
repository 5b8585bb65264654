"""src/servefleet/base/remote/fetch_model.py's ``main()`` in-process (#37: a mutant of the host
program is active only in the test's own process), against a stub store on 127.0.0.1: what it
hands the HTTP client (the token, its variable, the timeout, the tries and their wait), the
lock's deadline and the hub named as the operator knows it, a pinned revision pointed at by
refs/main, a local archive, the owner's files and root's directory above HF_HOME, and each way
``main()`` ends (its lines and exit codes: 0, 1, 2, 3, 130)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import pwd
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fetch_stubs import (
    MODEL,
    OWNER,
    REV,
    TOKEN,
    TOP,
    Stub,
    fake_hub_python,
    hf_layout,
    respond,
    tgz,
    write_token,
)
from repo_paths import REMOTE

sys.path.insert(0, str(REMOTE))
import fetch_model  # noqa: E402
import http_client  # noqa: E402

REV2 = hashlib.sha1(b"rev-2").hexdigest()
FAST = ["--retry-wait", "0"]


@pytest.fixture
def stub() -> Iterator[Stub]:
    server = Stub("127.0.0.1")
    yield server
    server.close()


def publish(stub: Stub, data: bytes) -> str:
    """Serve data as MODEL's archive under <stub>/store, with its manifest; the store URL."""
    entry = {"sha256": hashlib.sha256(data).hexdigest(), "revision": REV, "path": f"{MODEL}.tar.gz"}
    stub.routes[f"/store/{MODEL}.tar.gz"] = respond(200, data)
    stub.routes["/store/manifest.json"] = respond(
        200, json.dumps({"models": {MODEL: entry}}).encode()
    )
    return f"{stub.url}/store"


def run(home: Path, *options: str, owner: str = OWNER) -> int:
    return fetch_model.main([*options, "--", MODEL, str(home), owner])


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The one stderr line of a refusal (nothing on stdout)."""
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, (out, err)
    return err.rstrip("\n")


class Recorded(http_client.Client):
    """The HTTP client, recording what it was made with."""

    made: list[tuple[Any, ...]] = []

    def __init__(self, *args: Any) -> None:
        Recorded.made.append(args)
        super().__init__(*args)


def test_a_store_fetch_lands_owned_and_says_where(
    stub: Stub, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client gets the token, its variable, the timeout, the tries and the wait as given;
    HF_HOME's missing parent is made root's (its group too, in a setgid directory), HF_HOME and
    its hub the owner's."""
    Recorded.made = []
    monkeypatch.setattr(http_client, "Client", Recorded)
    stub.token = TOKEN
    store = publish(stub, tgz(hf_layout()))
    token = write_token(tmp_path / "token")
    owner = pwd.getpwnam(OWNER)
    setgid = tmp_path / "sg"  # what is made in it takes its group (the owner's), unless chowned
    setgid.mkdir()
    os.chown(setgid, 0, owner.pw_gid)
    setgid.chmod(0o2755)
    home = setgid / "above" / "hf"
    code = run(home, "--store", store, "--token-file", str(token), "--token-env", "HF_TOKEN",
               "--timeout", "9.5", "--tries", "4", "--retry-wait", "0.25")  # fmt: skip
    out, err = capsys.readouterr()
    assert (code, out, err) == (0, f"{MODEL} {REV} is in {home / 'hub'}\n", "")
    assert Recorded.made == [(TOKEN, "HF_TOKEN", 9.5, 4, 0.25)]
    assert {h.get("authorization") for _, h in stub.seen} == {f"Bearer {TOKEN}"}
    above = (home.parent).lstat()
    assert (above.st_uid, above.st_gid) == (0, 0)
    for path in (home, home / "hub", home / "hub" / TOP, home / "hub" / TOP / "refs" / "main"):
        st = path.lstat()
        assert (st.st_uid, st.st_gid) == (owner.pw_uid, owner.pw_gid), path
    assert (home / "hub" / TOP / ".servefleet-complete").read_text() == REV
    assert (home / "hub" / TOP / "refs" / "main").read_text() == REV


def test_a_pinned_revision_is_what_refs_main_names(
    stub: Stub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = publish(stub, tgz(hf_layout(snapshot=REV2, main=REV)))
    home = tmp_path / "hf"
    assert run(home, "--store", store, "--revision", REV2) == 0
    assert capsys.readouterr().out == f"{MODEL} {REV2} is in {home / 'hub'}\n"
    assert (home / "hub" / TOP / "refs" / "main").read_text() == REV2
    assert (home / "hub" / TOP / ".servefleet-complete").read_text() == REV2


def test_without_a_pin_refs_main_is_left_as_the_archive_has_it(
    stub: Stub, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import snapshot_place

    pointed: list[str] = []
    monkeypatch.setattr(snapshot_place, "point_main", lambda repo, rev, *ids: pointed.append(rev))
    store = publish(stub, tgz(hf_layout()))
    assert run(tmp_path / "hf", "--store", store) == 0
    assert pointed == []
    assert run(tmp_path / "hf", "--store", store, "--revision", REV) == 0
    assert pointed == [REV]


def test_a_local_archive_lands_with_no_network(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(http_client, "Client", None)  # no client is made for an archive
    archive = tmp_path / "tiny.tar.gz"
    archive.write_bytes(tgz(hf_layout()))
    sha = hashlib.sha256(archive.read_bytes()).hexdigest()
    home = tmp_path / "hf"
    assert run(home, "--archive", str(archive), "--sha256", sha.upper()) == 0
    assert capsys.readouterr().out == f"{MODEL} {REV} is in {home / 'hub'}\n"
    assert (home / "hub" / TOP / ".servefleet-complete").read_text() == REV


def test_a_store_that_cannot_be_reached_is_exit_3(
    stub: Stub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stub.routes["/store/manifest.json"] = respond(503, b"busy\n")
    assert run(tmp_path / "hf", "--store", f"{stub.url}/store", "--tries", "2", *FAST) == 3
    line = one_line(capsys)
    assert line.startswith(
        f"servefleet: could not reach {stub.url}/store/manifest.json: answered 503 Service "
        "Unavailable (tried 2 times over "
    ), line
    assert stub.paths() == ["/store/manifest.json"] * 2


def test_a_refused_token_names_its_variable(
    stub: Stub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stub.token = "hf_another"
    store = publish(stub, tgz(hf_layout()))
    token = write_token(tmp_path / "token")
    assert run(tmp_path / "hf", "--store", store, "--token-file", str(token),
               "--token-env", "HF_TOKEN") == 1  # fmt: skip
    assert one_line(capsys) == (
        f"servefleet: {store}/manifest.json answered 401; check the HF_TOKEN environment "
        "variable on the controller"
    )


def test_a_held_lock_gives_up_at_its_deadline_naming_the_hub(
    stub: Stub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The refusal names ``HF_HOME/hub``, not the /proc/self/fd path root worked by."""
    home = tmp_path / "hf"
    (home / "hub").mkdir(parents=True)
    held = os.open(home / "hub", os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        code = run(home, "--store", publish(stub, tgz(hf_layout())), "--lock-timeout", "0.2")
    finally:
        os.close(held)
    assert code == 1
    assert one_line(capsys) == (
        f"servefleet: {home / 'hub'}: another process holds its lock (a fetch, or the serve user "
        "holding it); gave up after 0.2 s (--lock-timeout), nothing fetched"
    )
    assert stub.paths() == []


def test_an_unknown_owner_and_bad_arguments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(tmp_path / "hf", "--store", "http://127.0.0.1:9/s", owner="no-such-user-here") == 1
    assert one_line(capsys) == "servefleet: no user no-such-user-here on this host"
    assert run(tmp_path / "hf", "--store", "ftp://s") == 2
    assert one_line(capsys) == "servefleet: fetch_model.py: --store 'ftp://s' is not an http(s) URL"
    assert not (tmp_path / "hf").exists()


def test_a_token_file_open_to_others_fetches_nothing(
    stub: Stub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    token = write_token(tmp_path / "token")
    token.chmod(0o640)
    assert run(tmp_path / "hf", "--store", f"{stub.url}/store", "--token-file", str(token)) == 1
    assert one_line(capsys) == (
        f"servefleet: the token file {token} is open to others (mode 640); chmod 600"
    )
    assert stub.seen == []


def test_hf_home_that_is_not_a_directory_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "hf"
    home.write_text("a file\n")
    assert run(home, "--store", "http://127.0.0.1:9/s") == 1
    line = one_line(capsys)
    assert line.startswith(f"servefleet: {home}/hub: ") and "Not a directory" in line, line


@pytest.mark.parametrize(
    ("raised", "code", "line"),
    [
        (OSError(28, "No space left on device"), 1,
         "servefleet: fetching the model failed: [Errno 28] No space left on device"),
        (KeyboardInterrupt(), 130, "servefleet: interrupted"),
    ],
)  # fmt: skip
def test_how_main_ends_on_an_error_of_the_fetch(
    raised: BaseException,
    code: int,
    line: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def fail(a: Any) -> str:
        raise raised

    monkeypatch.setattr(fetch_model, "fetch", fail)
    assert run(tmp_path / "hf", "--store", "http://127.0.0.1:9/s") == code
    assert one_line(capsys) == line


def test_a_hub_fetch_lands_owned(
    tmp_path: Path, reachable: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--hub PYTHON`` in-process: a stand-in huggingface_hub (its snapshot_download lays the
    model out under HF_HOME) in a release's venv, run as nobody; the files are the owner's."""
    python = fake_hub_python(reachable)
    home = tmp_path / "hf"
    assert run(home, "--hub", str(python), "--revision", REV2) == 0
    out, err = capsys.readouterr()
    assert (out, err) == (f"{MODEL} {REV2} is in {home / 'hub'}\n", "")
    repo = home / "hub" / TOP
    assert (repo / ".servefleet-complete").read_text() == REV2
    assert (repo / "snapshots" / REV2 / "config.json").read_text() == "{}"
    owner = pwd.getpwnam(OWNER)
    for path in (repo, *repo.rglob("*")):
        st = path.lstat()
        assert (st.st_uid, st.st_gid) == (owner.pw_uid, owner.pw_gid), path
