"""An offline host serves from the wheelhouse. The controller locks the lab's stack, driver and
model (``servefleet lock``) and downloads every file of that lock (``servefleet wheelhouse``);
the host is cut off every lab server (``servefleet lab offline``: no index, apt repository or
file server answers it); a deploy with ``sdk_source=wheelhouse`` copies the files it needs,
installs the locked release with no index, the driver runfile and a model it lacks (the
EAGLE-3 draft) from that copy, and serves. A second run copies nothing and changes nothing.

The host is online for one plain deploy first: its driver's apt prerequisites (dkms, headers)
come from its own apt sources, as on a real offline fleet (an image or a local mirror); the
wheelhouse deploy then installs the other lab driver version, from the copy."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from faults import REPO, changed_ops, run, secrets, totals
from labhelpers import on_host, servefleet

from servefleet.fleet.lab.chat import chat_once
from servefleet.release.lock import load_lock

HOST = "lab3"
MODEL = "openai/gpt-oss-120b"
DRAFT = "nvidia/gpt-oss-120b-Eagle3-v3"
DRAFT_DIR = "/var/lib/servefleet/hf/hub/models--nvidia--gpt-oss-120b-Eagle3-v3"
COPY = "/opt/servefleet/wheelhouse"


def controller(state: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    """``servefleet ARGS`` from the repo root with the lab's credentials in the environment."""
    env = {**os.environ, **secrets(state)}
    proc = subprocess.run([sys.executable, "-m", "servefleet", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_an_offline_host_serves_from_the_wheelhouse_and_a_rerun_copies_nothing(
    lab: dict[str, Any], tmp_path: Path
) -> None:
    assert run(lab, "--limit", HOST).returncode == 0  # online: the host has its prerequisites
    driver = json.loads(on_host(lab, HOST, "rbln-smi -j").stdout)["KMD_version"]
    other = next(v for v in sorted(lab["driver"]) if v != driver)
    lock, wheelhouse = tmp_path / "lock", tmp_path / "wheelhouse"
    # the same data for the lock, the wheelhouse and the deploys
    data = ["--data", f"driver_version={other}", "--data", "serve_selection=spec_decode=eagle3",
            "--data", f"sdk_lock={lock}", "--data", "sdk_source=wheelhouse",
            "--data", f"sdk_wheelhouse={wheelhouse}"]  # fmt: skip
    controller(lab, "lock", "inventories/lab.py", *data)
    filled = controller(lab, "wheelhouse", str(wheelhouse), "--inventory", "inventories/lab.py",
                        *data).stdout  # fmt: skip
    assert " 0 failed" in filled and int(re.findall(r"(\d+) downloaded", filled)[0]) > 0, filled
    again = controller(lab, "wheelhouse", str(wheelhouse), "--lock-dir", str(lock)).stdout
    assert " 0 downloaded (0 bytes)" in again, again  # a re-run downloads nothing
    release = next(iter(load_lock(lock).stacks.values())).release
    on_host(lab, HOST, f"rm -rf {DRAFT_DIR} {COPY}")  # the draft model comes from the copy
    offline = [*data, "--limit", HOST]
    servefleet("lab", "offline", HOST)
    try:
        cut = on_host(lab, HOST, "python3 -c \"import urllib.request as u; "
                      "u.urlopen('http://10.213.0.1:8080/', timeout=5)\"", check=False)  # fmt: skip
        assert cut.returncode != 0 and "refused" in cut.stderr.lower(), cut.stderr
        first = run(lab, *offline)
        assert first.returncode == 0, first.stdout[-6000:] + first.stderr[-6000:]
        said = first.stdout + first.stderr  # pyinfra logs the operations on stderr
        assert "wheelhouse file(s)" in said and "runfile from the wheelhouse" in said, said
        assert f"Unpack {DRAFT} into" in said, said
        smi = json.loads(on_host(lab, HOST, "rbln-smi -j").stdout)
        assert smi["KMD_version"] == other
        current = on_host(lab, HOST, "readlink /opt/servefleet/current").stdout.strip()
        assert current == f"releases/{release}"
        installed = on_host(lab, HOST, f"cat /opt/servefleet/{current}/requirements.locked.txt")
        assert "--hash=sha256:" in installed.stdout
        assert on_host(lab, HOST, f"cat {DRAFT_DIR}/.servefleet-complete").stdout.strip()
        address = next(h["address"] for h in lab["hosts"] if h["name"] == HOST)
        assert chat_once(address, 8000, MODEL, "Hello", max_tokens=8)
        second = run(lab, "--json", *offline)
        assert totals(second)["success"] == 0, changed_ops(second)
        assert "wheelhouse file(s)" not in second.stdout + second.stderr
    finally:
        servefleet("lab", "offline", "--undo", HOST, check=False)
