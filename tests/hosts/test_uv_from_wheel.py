"""#32 item 8 on the lab: a host takes its uv from uv's wheel on the lab's public index, by the
sha256 the lock pins, and the controller sends it no uv binary. lab1's uv is removed, then a
locked release (a new one: its id is the locked set's) is installed on it."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path
from typing import Any

from faults import REPO, run, secrets
from labhelpers import on_host

from servefleet.release.uvbin import uv_version

SERVEFLEET = str(Path(sys.executable).parent / "servefleet")
UV = f"/opt/servefleet/lib/uv-{uv_version()}"


def serving_release(state: dict[str, Any], host: str) -> str:
    return on_host(state, host, "readlink /opt/servefleet/current").stdout.strip()


def test_a_host_takes_uv_from_the_locked_wheel_and_the_controller_sends_none(
    lab: dict[str, Any], tmp_path: Path
) -> None:
    env = {**os.environ, **secrets(lab)}
    made = subprocess.run([SERVEFLEET, "lock", "inventories/lab.py", "--lock-dir", str(tmp_path)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert made.returncode == 0, made.stdout + made.stderr
    doc = json.loads((tmp_path / "servefleet.lock.json").read_text())
    wheel = doc["uv"]
    assert wheel["version"] == uv_version()
    assert wheel["file"].endswith("manylinux_2_17_x86_64.manylinux2014_x86_64.whl")
    assert wheel["url"].startswith(lab["indexes"]["public"].rstrip("/").removesuffix("/simple"))
    with urllib.request.urlopen(wheel["url"], timeout=60) as response:
        data = response.read()
    assert hashlib.sha256(data).hexdigest() == wheel["sha256"]
    member = zipfile.ZipFile(io.BytesIO(data)).read(f"uv-{uv_version()}.data/scripts/uv")

    first = run(lab, "--json", "--limit", "lab1", deploy_file="deploys/stack.py")  # unlocked
    assert first.returncode == 0, (first.stdout + first.stderr)[-6000:]
    ops = [o["name"] for o in json.loads(first.stdout)["results"]["operations"]]
    assert not [o for o in ops if "Upload uv" in o], ops  # unlocked: the index's wheel
    before = serving_release(lab, "lab1")
    # the locked set's release may be on lab1 from an earlier test: taken away, so the locked
    # deploy installs it and needs the uv it takes from the wheel
    ids = {entry["release"] for entry in doc["stacks"].values()} - {before.rsplit("/", 1)[-1]}
    on_host(lab, "lab1", " ".join(["rm -rf", *(f"/opt/servefleet/releases/{i}" for i in ids)]))
    on_host(lab, "lab1", f"rm -f {UV}")
    try:
        locked = run(lab, "--json", "--limit", "lab1", "--data", f"sdk_lock={tmp_path}",
                     deploy_file="deploys/stack.py")  # fmt: skip
        assert locked.returncode == 0, (locked.stdout + locked.stderr)[-6000:]
        ops = [o["name"] for o in json.loads(locked.stdout)["results"]["operations"]]
        assert any(o.startswith("Release | Install release") for o in ops), ops
        assert not [o for o in ops if "Upload uv" in o], ops  # the controller sent none
        got = on_host(lab, "lab1", f"stat -c '%a %U %G' {UV} && sha256sum {UV}").stdout.split()
        assert got[:3] == ["755", "root", "root"]
        assert got[3] == hashlib.sha256(member).hexdigest()
        assert serving_release(lab, "lab1") != before
        again = run(lab, "--json", "--limit", "lab1", "--data", f"sdk_lock={tmp_path}",
                    deploy_file="deploys/stack.py")  # fmt: skip
        assert again.returncode == 0
        assert json.loads(again.stdout)["results"]["totals"]["success"] == 0  # nothing to do
    finally:  # the other tests expect the unlocked release serving
        assert run(lab, "--limit", "lab1", deploy_file="deploys/stack.py").returncode == 0
        assert serving_release(lab, "lab1") == before
