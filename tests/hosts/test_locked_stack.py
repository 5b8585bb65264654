"""Hash-locked stacks on the lab fleet: `servefleet lock` resolves the lab's indexes once, a locked
release installs identically on two hosts (read back from each host's venv), squatters are never
locked or installed, and `servefleet lock --check` follows the data."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import labhelpers
import pytest
from faults import REPO, run, secrets
from labhelpers import on_host
from packaging.markers import Marker

from servefleet.fleet.lab.chat import chat_once
from servefleet.fleet.lab.index import normalize
from servefleet.release.pylock import packages
from servefleet.settings.table import load_defaults

SERVEFLEET = str(Path(sys.executable).parent / "servefleet")
TWO = ["--limit", "lab1", "--limit", "lab2"]
PORTS = [8000 + i for i in range(4)]
# lab index of each, for the lab's bookworm hosts: glibc 2.36 takes vLLM's workaround source
OWNED = {"rebel-compiler": "private", "vllm": "assets", "torch": "torch"}
BOOKWORM, TRIXIE = "rbln-glibc2_35", "rbln-glibc2_39"  # the stacks of the default selection
# Every installed distribution of the serving release: name, version, sha256 of its RECORD
# (which lists the sha256 of every file the wheel installed).
INSTALLED = (
    "import hashlib, importlib.metadata as md, json; print(json.dumps(sorted("
    "[d.metadata['Name'], d.version, hashlib.sha256(d.read_text('RECORD').encode()).hexdigest()]"
    " for d in md.distributions())))"
)
# what a pylock package's marker is evaluated against, from the release's python
MARKER_ENV = (
    "import json, platform, sys; print(json.dumps({'python_full_version': platform.python_version(),"
    " 'python_version': '%d.%d' % sys.version_info[:2], 'platform_machine': platform.machine(),"
    " 'sys_platform': sys.platform}))"
)


def for_host(pylock: str, env: dict[str, str]) -> set[tuple[str, str]]:
    """(normalized name, version) of each package of pylock whose marker holds for env (a
    universal lock has entries for other Pythons too)."""
    return {
        (normalize(p["name"]), p["version"])
        for p in packages(pylock)
        if "marker" not in p or Marker(p["marker"]).evaluate(env)
    }


def lock(state: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **secrets(state)}
    return subprocess.run([SERVEFLEET, "lock", "inventories/lab.py", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def bumped_pins() -> str:
    return json.dumps([p.replace("==0.12.0", "==0.12.1") for p in load_defaults()["sdk_pins"]])


def serving_release(state: dict[str, Any], host: str) -> str:
    return on_host(state, host, "readlink /opt/servefleet/current").stdout.strip()


def test_a_lock_installs_the_same_bytes_on_two_hosts_and_never_a_squatter(
    lab: dict[str, Any], tmp_path: Path
) -> None:
    made = lock(lab, "--lock-dir", str(tmp_path))
    assert made.returncode == 0, made.stdout + made.stderr
    doc = json.loads((tmp_path / "servefleet.lock.json").read_text())
    assert set(doc["stacks"]) == {BOOKWORM, TRIXIE}  # no host is asked: every choice is locked
    stack = doc["stacks"][BOOKWORM]
    pylock = (tmp_path / stack["pylock"]).read_text()
    indexes = {p["name"]: p["index"].rstrip("/") for p in packages(pylock)}
    for name, owner in OWNED.items():
        assert indexes[name] == lab["indexes"][owner].rstrip("/"), (name, indexes[name])
    assert "lmcache-rbln" not in indexes  # the default selection has no KV offload
    assert set(doc["driver"]) == {"3.5.1"} and len(doc["driver"]["3.5.1"]["sha256"]) == 64
    assert all(len(m["sha256"]) == 64 and len(m["revision"]) == 40 for m in doc["models"].values())

    unlocked = run(lab, *TWO, deploy_file="deploys/stack.py")
    assert unlocked.returncode == 0, unlocked.stdout + unlocked.stderr
    assert "is unlocked (sdk_lock not set)" in unlocked.stdout + unlocked.stderr
    before = {h: serving_release(lab, h) for h in ("lab1", "lab2")}
    locked = run(lab, *TWO, "--data", f"sdk_lock={tmp_path}", deploy_file="deploys/stack.py")
    try:
        assert locked.returncode == 0, locked.stdout + locked.stderr
        assert "unlocked" not in locked.stdout + locked.stderr
        got = {}
        for host in ("lab1", "lab2"):
            assert serving_release(lab, host) == f"releases/{stack['release']}"
            python = f"/opt/servefleet/releases/{stack['release']}/bin/python"
            got[host] = json.loads(
                on_host(lab, host, f"{python} -c {json.dumps(INSTALLED)}").stdout
            )
            squat = on_host(
                lab, host, f"{python} -c 'import rebel; print(rebel.__servefleet_squatter__)'"
            )
            assert squat.stdout == "False\n"
        assert got["lab1"] == got["lab2"]
        env = json.loads(on_host(lab, "lab1", f"{python} -c {json.dumps(MARKER_ENV)}").stdout)
        installed = {(normalize(n), v) for n, v, _ in got["lab1"]}
        assert installed == for_host(pylock, env)
    finally:  # the other tests expect the unlocked release serving
        assert run(lab, *TWO, deploy_file="deploys/stack.py").returncode == 0
        assert {h: serving_release(lab, h) for h in ("lab1", "lab2")} == before


def test_lock_check_fails_when_the_data_moves_and_passes_after_locking(
    lab: dict[str, Any], tmp_path: Path
) -> None:
    assert lock(lab, "--lock-dir", str(tmp_path)).returncode == 0
    current = lock(lab, "--lock-dir", str(tmp_path), "--check")
    assert current.returncode == 0, current.stderr
    bump = ("--data", f"sdk_pins={bumped_pins()}")
    stale = lock(lab, "--lock-dir", str(tmp_path), "--check", *bump)
    assert stale.returncode == 1
    assert f"servefleet: lock: stack {BOOKWORM}: requirements: " in stale.stderr
    assert "-vllm-rbln==0.12.0" in stale.stderr and "+vllm-rbln==0.12.1" in stale.stderr
    assert lock(lab, "--lock-dir", str(tmp_path), *bump).returncode == 0
    assert lock(lab, "--lock-dir", str(tmp_path), "--check", *bump).returncode == 0
    assert lock(lab, "--lock-dir", str(tmp_path), "--check").returncode == 1


def plan_of(state: dict[str, Any], *args: str) -> dict[str, Any]:
    env = {**os.environ, **secrets(state)}
    proc = subprocess.run([SERVEFLEET, "plan", "inventories/lab.py", "--json", "--", "--limit",
                           "lab1", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return dict(json.loads(proc.stdout)["lab1"])


def republish(name: str) -> str:
    """``servefleet lab republish``: the new sha256 the index serves."""
    proc = labhelpers.servefleet("lab", "republish", name)
    return proc.stdout.strip().rsplit(" -> ", 1)[1]


@pytest.mark.lab_destructive
def test_a_file_republished_after_locking_fails_the_deploy_and_the_host_keeps_serving(
    lab: dict[str, Any], tmp_path: Path
) -> None:
    """lab1 serves 0.12.0 (unlocked); 0.12.1 is locked; then the index re-uploads vllm-rbln
    0.12.0 and 0.12.1 with other bytes. The unlocked plan shows the re-upload; the locked
    upgrade fails in one line naming the package and both hashes, and lab1 keeps serving."""
    assert run(lab, "--limit", "lab1").returncode == 0
    bump = ("--data", f"sdk_pins={bumped_pins()}")
    assert lock(lab, "--lock-dir", str(tmp_path), *bump).returncode == 0
    stack = json.loads((tmp_path / "servefleet.lock.json").read_text())["stacks"][BOOKWORM]
    locked = next(p for p in packages((tmp_path / stack["pylock"]).read_text())
                  if p["name"] == "vllm-rbln")  # fmt: skip
    assert plan_of(lab)["changed_on_index"] == {}
    try:
        republish("vllm-rbln==0.12.0")
        served = republish("vllm-rbln==0.12.1")
        changed = plan_of(lab)["changed_on_index"]
        assert list(changed) == ["vllm-rbln"] and changed["vllm-rbln"]["version"] == "0.12.0"
        assert not set(changed["vllm-rbln"]["installed"]) & set(changed["vllm-rbln"]["served"])

        serving = serving_release(lab, "lab1")
        on_host(lab, "lab1", "rm -rf /root/.cache/uv")  # no copy of the old bytes on the host
        failed = run(lab, "--limit", "lab1", "--data", f"sdk_lock={tmp_path}", *bump)
        assert failed.returncode != 0
        line = (f"servefleet: hash mismatch: vllm-rbln==0.12.1: the lock has sha256:"
                f"{locked['wheels'][0]['hashes']['sha256']}, the index served sha256:{served}; "
                f"release {stack['release']} not installed")  # fmt: skip
        assert line in failed.stdout + failed.stderr
        assert serving_release(lab, "lab1") == serving
        marker = f"/opt/servefleet/releases/{stack['release']}/.servefleet-release.json"
        assert on_host(lab, "lab1", f"test -e {marker}", check=False).returncode == 1
        address = next(h["address"] for h in lab["hosts"] if h["name"] == "lab1")
        for port in PORTS:
            assert chat_once(address, port, "openai/gpt-oss-120b", "hi", max_tokens=1)
    finally:  # a new lab serves the pristine files again
        lab.clear()
        lab.update(labhelpers.lab_up())


def test_the_committed_lab_lock_is_current_and_reproducible(
    lab: dict[str, Any], tmp_path: Path
) -> None:
    """locks/lab is what `servefleet lock` makes from the lab's default data today: --check
    passes (CI catches a default bumped without re-locking), and locking it again gives the same
    bytes (the lab's artifacts and the lock are reproducible), whichever uv the controller has:
    the lock keeps the uv it pins when the controller's resolves it the same (#53)."""
    check = lock(lab, "--lock-dir", "locks/lab", "--check")
    assert check.returncode == 0, check.stderr
    committed = REPO / "locks" / "lab"
    shutil.copytree(committed, tmp_path, dirs_exist_ok=True)
    again = lock(lab, "--lock-dir", str(tmp_path))
    assert again.returncode == 0, again.stdout + again.stderr
    assert sorted(p.name for p in committed.iterdir()) == sorted(p.name for p in tmp_path.iterdir())
    for made in tmp_path.iterdir():
        assert made.read_text() == (committed / made.name).read_text(), made.name
