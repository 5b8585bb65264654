"""A hub fetch runs the release's own huggingface_hub (index code, and all it imports): it runs
as ``nobody``, never root, and gets the token on its stdin only (#46 item 4).

A stand-in release (a venv of a python ``nobody`` can run, in the ``reachable`` directory)
carries a ``huggingface_hub`` spy: its ``snapshot_download`` reports its uid, what it got when it
read a 0600 root file beside the release (as the netrc and ``/etc/servefleet/secrets`` are on
hosts) and the 0600 token file itself, the token it was handed, its environment and the
processes it sees, in a file of the model it lays out. Before the fix it ran as root: it read
both files, and its token came from the file (``HF_TOKEN_PATH``), not as an argument.

What it writes root takes over before reading (``hub_source.take_over``): the modes it chose do
not stay, and a hard link or a link outside ``snapshots/<rev>/`` refuses the fetch with nothing
of it in the hub and nothing behind a link touched."""

from __future__ import annotations

import json
import os
import pwd
from pathlib import Path

import pytest
from fetch_stubs import (
    OWNER,
    REV,
    TOKEN,
    TOP,
    fake_hub_python,
    fake_hub_settings,
    fetch,
    write_token,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the fetcher runs as root on hosts")

SECRET = "netrc-password-46-4-hub"
REPORT = "spy-report.json"

SPY = r"""
import json, os, pathlib

def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError as e:
        return type(e).__name__

def snapshot_download(repo_id, revision=None, token=None):
    settings = json.loads(pathlib.Path(@SETTINGS@).read_text())
    report = {"uid": os.getuid(), "euid": os.geteuid(), "groups": os.getgroups(),
              "env": dict(os.environ), "token": token,
              "secret": _read(settings["secret"]), "token_file": _read(settings["token_file"]),
              "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit())}
    repo = pathlib.Path(os.environ["HF_HOME"], "hub", "models--" + repo_id.replace("/", "--"))
    rev = revision or settings["rev"]
    snap = repo / "snapshots" / rev
    for d in (repo / "refs", repo / "blobs", snap / "sub"):
        d.mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(rev)
    (repo / "blobs" / "b1").write_text("{}")
    (snap / "config.json").symlink_to("../../blobs/b1")  # as the hub lays its cache out
    (snap / REPORT).write_text(json.dumps(report))
    (snap / "sub" / "weights").write_text("w")
    os.chmod(snap / "sub" / "weights", 0o4777)  # modes root must not keep
    os.chmod(snap / "sub", 0o777)
    plant = settings.get("plant")
    if plant == "hard link":  # a name of a file outside the model (from outside its mount,
        outside = pathlib.Path(os.environ["HF_HOME"], "outside")  # link() gives EXDEV)
        outside.write_text("elsewhere")
        os.link(outside, repo / "blobs" / "b0")
    elif plant == "link out":  # refs/main read by root through a link to its own directory
        (repo / "refs" / "main").unlink()
        (repo / "refs").rmdir()
        (repo / "refs").symlink_to(settings["sentinel"])
    elif plant == "fifo":
        os.mkfifo(repo / "blobs" / "b3")
    return str(snap)
""".replace("REPORT", repr(REPORT))


def spy_release(reachable: Path, **settings: str) -> Path:
    """The stand-in release's python, and a 0600 root secret beside it."""
    python = fake_hub_python(reachable, SPY)
    secret = reachable / "netrc"
    secret.write_text(f"machine i.example login u password {SECRET}\n")
    secret.chmod(0o600)
    fake_hub_settings(python, secret=str(secret), rev=REV, **settings)
    return python


def test_the_hub_client_runs_as_nobody_and_gets_the_token_on_its_stdin(
    reachable: Path, tmp_path: Path
) -> None:
    token_file = write_token(reachable / "hf-token")  # 0600, where nobody reaches its directory
    python = spy_release(reachable, token_file=str(token_file))
    home = tmp_path / "hf"
    proc = fetch(home, "--hub", str(python), "--token-file", str(token_file))
    assert proc.returncode == 0, proc.stderr
    snap = home / "hub" / TOP / "snapshots" / REV
    report = json.loads((snap / REPORT).read_text())
    nobody = pwd.getpwnam("nobody")
    assert (report["uid"], report["euid"], report["groups"]) == (nobody.pw_uid,) * 2 + ([],)
    assert report["secret"] == "PermissionError" and report["token_file"] == "PermissionError"
    assert report["token"] == TOKEN  # what it needs, handed on its stdin
    env = report["env"]
    assert TOKEN not in json.dumps(env) and SECRET not in json.dumps(env)
    assert not set(env) & {"HF_TOKEN", "HF_TOKEN_PATH", "NETRC", "HUGGING_FACE_HUB_TOKEN"}
    assert len(report["pids"]) <= 3  # its own PID namespace: no process of the host's in sight
    # root took it over before reading it, then gave it to the owner: no mode of the writer's
    owner = pwd.getpwnam(OWNER)
    for path, mode in [(snap / "sub", 0o755), (snap / "sub" / "weights", 0o755),
                       (home / "hub" / TOP / "blobs" / "b1", 0o644)]:  # fmt: skip
        st = path.lstat()
        assert (st.st_uid, st.st_mode & 0o7777) == (owner.pw_uid, mode), path
    assert (snap / "config.json").is_symlink() and (snap / "config.json").read_text() == "{}"


@pytest.mark.parametrize(
    ("plant", "said"),
    [
        ("hard link", "blobs/b0 has another name (a hard link)"),
        ("link out", "refs is a link outside snapshots/<rev>/"),
        ("fifo", "blobs/b3 is neither a file, a directory nor a link"),
    ],
)
def test_what_the_hub_client_planted_refuses_the_fetch(
    plant: str, said: str, reachable: Path, tmp_path: Path
) -> None:
    sentinel = tmp_path / "root-only"
    sentinel.mkdir(mode=0o700)
    (sentinel / "main").write_text(REV)  # what a link out would have root read as refs/main
    python = spy_release(reachable, token_file="/nonexistent", plant=plant, sentinel=str(sentinel))
    home = tmp_path / "hf"
    proc = fetch(home, "--hub", str(python))
    assert (proc.returncode, proc.stdout) == (1, ""), proc.stderr
    assert proc.stderr == f"servefleet: the hub client's {TOP}/{said}; nothing fetched\n"
    assert sorted(p.name for p in (home / "hub").iterdir()) == []  # nothing landed, no staging
    st = sentinel.lstat()
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o700)
    assert [(p.name, p.lstat().st_uid) for p in sentinel.iterdir()] == [("main", 0)]
