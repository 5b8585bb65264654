"""The release check runs the release's own code (``import vllm, torch, rebel``): it runs as
``nobody``, never root, so that code reads none of root's secrets (#46 item 4).

A stand-in release (a venv of a python ``nobody`` can run, in the ``reachable`` directory)
carries ``spy``: imported by the check, it reports its uid, what it got when it read a 0600 root
file beside the release (as the netrc and the hub token are on hosts), its environment, its HOME
and cwd, and the processes it sees. Before the fix the check ran as root:
the spy reported uid 0 and the secret, and an import that fails only for ``nobody`` passed."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from lab_sim_support import load
from local_release import INSTALLER, PYTHON

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the installer runs as root on hosts")

installer = load(INSTALLER, "servefleet_remote_install_release_unprivileged")
SECRET = "netrc-password-46-4"

SPY = r"""
import json, os, sys
report = {"uid": os.getuid(), "euid": os.geteuid(), "groups": os.getgroups(),
          "home": os.environ.get("HOME"), "cwd": os.getcwd(), "env": dict(os.environ),
          "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit())}
try:
    with open(SECRET_FILE) as f:
        report["secret"] = f.read()
except OSError as e:
    report["secret"] = type(e).__name__
print("SPY " + json.dumps(report), file=sys.stderr)
if NEEDS_SECRET:
    open(SECRET_FILE).close()  # an import that works only where the secret can be read
"""


def stand_in(release: Path, secret: Path, needs_secret: bool) -> None:
    """A venv of the system python at ``release`` with the module ``spy`` in it."""
    subprocess.run([PYTHON, "-m", "venv", "--without-pip", str(release)], check=True)
    (site,) = release.glob("lib/python3*/site-packages")
    code = f"SECRET_FILE = {str(secret)!r}\nNEEDS_SECRET = {needs_secret}\n{SPY}"
    (site / "spy.py").write_text(code)


def run_install(
    reachable: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    needs_secret: bool = False,
) -> tuple[int | str | None, dict, Path]:
    """Run the installer's main on a plan whose install makes the stand-in release: its exit
    (None when it installed), the spy's report and the release."""
    secret = reachable / "netrc"
    secret.write_text(f"machine i.example login u password {SECRET}\n")
    secret.chmod(0o600)
    release = reachable / "release"
    plan = {
        "id": "rel-spy", "path": str(release), "marker": ".servefleet-complete",
        "installer": "uv", "expect": {}, "must_have": [], "downloads": [], "imports": ["spy"],
        "netrc": str(secret),
    }  # fmt: skip
    plan_file = reachable / "plan.json"  # root's, 0600: the check is given what it needs
    plan_file.write_text(json.dumps(plan))
    plan_file.chmod(0o600)
    monkeypatch.setattr(
        installer, "install_with_uv", lambda p, r: stand_in(r, secret, needs_secret)
    )
    monkeypatch.setenv("HF_TOKEN", SECRET)
    monkeypatch.setenv("RBLN_INDEX_PASSWORD", SECRET)
    monkeypatch.chdir(reachable)
    try:
        installer.main(str(plan_file), "9.8.7")
        code = None
    except SystemExit as exited:
        code = exited.code
    err = capfd.readouterr().err
    spied = [line[4:] for line in err.splitlines() if line.startswith("SPY ")]
    assert len(spied) == 1, err
    return code, json.loads(spied[0]), release


def test_the_check_runs_as_nobody_and_reads_no_root_secret(
    reachable: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    code, report, release = run_install(reachable, monkeypatch, capfd)
    assert code is None and (release / ".servefleet-complete").exists()
    assert report["uid"] != 0 and report["euid"] != 0 and report["groups"] == []
    assert report["secret"] == "PermissionError"
    assert SECRET not in json.dumps(report["env"])
    assert not set(report["env"]) & {"HF_TOKEN", "RBLN_INDEX_PASSWORD", "NETRC"}
    home = Path(report["home"])
    assert report["cwd"] == str(home) and home.name == "work" and not home.exists()  # removed
    assert home.parent.parent == Path("/tmp") and str(reachable) not in str(home)
    assert len(report["pids"]) <= 3  # its own PID namespace: no process of the host's in sight


def test_an_import_that_fails_as_nobody_fails_the_install(
    reachable: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """spy imports only where the 0600 root file can be read: as root (before) it passed."""
    code, report, release = run_install(reachable, monkeypatch, capfd, needs_secret=True)
    assert report["secret"] == "PermissionError"
    assert code == "servefleet: release rel-spy failed its checks; it is not marked complete"
    assert not (release / ".servefleet-complete").exists()
