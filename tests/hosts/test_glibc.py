"""The glibc trap (issue #10) on a mixed lab: lab1 runs Debian 12 (glibc 2.36), lab2 Debian 13
(glibc 2.41, Python 3.13). Upstream's vLLM CPU wheel is manylinux_2_39 only; the lab's data adds
RBLN's workaround source (a manylinux_2_35 wheel). Without that source lab1 is refused before
any change, in one line naming both versions; with it both hosts serve, each with the wheel its
glibc takes (read back from the installed vllm's WHEEL), and a lock made without asking any
host holds both hosts' stacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from faults import REPO, changed_ops, run, secrets
from labhelpers import lab_up, on_host, servefleet

from servefleet.fleet.lab.chat import chat_once
from servefleet.fleet.lab.groupdata import lab_group_data

SERVEFLEET = str(Path(sys.executable).parent / "servefleet")
WHEEL = (
    "import importlib.metadata as md, platform; d = md.distribution('vllm'); "
    "print(platform.python_version(), d.version, *[line.split(': ', 1)[1] for line in "
    "d.read_text('WHEEL').splitlines() if line.startswith('Tag: ')])"
)
STACKS = {"lab1": "rbln-glibc2_35", "lab2": "rbln-glibc2_39"}


def _installed(state: dict[str, Any], host: str) -> list[str]:
    """Python version, vllm version and the WHEEL tags of the serving release's vllm."""
    cmd = f"/opt/servefleet/current/bin/python -c {json.dumps(WHEEL)}"
    return on_host(state, host, cmd).stdout.split()


def _serving_release(state: dict[str, Any], host: str) -> str:
    return on_host(state, host, "readlink /opt/servefleet/current").stdout.strip()


@pytest.mark.lab_destructive
def test_a_bookworm_and_a_trixie_host_each_serve_the_vllm_wheel_their_glibc_takes(
    lab: dict[str, Any], tmp_path: Path
) -> None:
    try:
        state = lab_up("--hosts", "2", "--devices", "1", "--odd-base", "lab2=trixie")
        assert [h.get("base") for h in state["hosts"]] == ["bookworm", "trixie"]
        assert on_host(state, "lab2", "ldd --version").stdout.splitlines()[0].endswith(" 2.41")

        # without the workaround source: lab1 (glibc 2.36) fails before any change, one line
        upstream = {k: v for k, v in lab_group_data()["pip_indexes"].items()
                    if k != "vllm-rbln-assets"}  # fmt: skip
        refused = run(state, "--limit", "lab1", "--data", f"pip_indexes={json.dumps(upstream)}")
        out = refused.stdout + refused.stderr
        assert refused.returncode != 0
        line = ("servefleet: lab1: glibc 2.36 here; vllm==0.30.0+cpu needs glibc >= 2.39 "
                "(sources: vllm 2.39)")  # fmt: skip
        assert [x.split("] ", 1)[-1].strip() for x in out.splitlines() if "servefleet: lab1:" in x] == [line], out  # fmt: skip
        assert "Traceback" not in out
        untouched = "test ! -e /opt/servefleet && test ! -e /etc/servefleet && ! id servefleet"
        on_host(state, "lab1", untouched)

        # with it (the lab's data): one run, both serve
        served = run(state)
        assert served.returncode == 0, served.stdout[-3000:] + served.stderr[-3000:]
        for host, (python, tag) in {"lab1": ("3.11.", "2_35"), "lab2": ("3.13.", "2_39")}.items():
            version, vllm, *tags = _installed(state, host)
            assert version.startswith(python) and vllm == "0.30.0+cpu"
            assert tags == [f"cp38-abi3-manylinux_{tag}_x86_64"], (host, tags)
        for host in state["hosts"]:
            assert chat_once(host["address"], 8000, "openai/gpt-oss-120b", "hi", max_tokens=1)
        again = run(state, "--json")  # the probe watched the plan of each host's own release
        assert again.returncode == 0 and changed_ops(again) == [], again.stderr[-3000:]

        # the lock asks no host: it holds both stacks, and each host installs its own from it
        env = {**os.environ, **secrets(state)}
        made = subprocess.run([SERVEFLEET, "lock", "inventories/lab.py", "--lock-dir",
                               str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=300)  # fmt: skip
        assert made.returncode == 0, made.stdout + made.stderr
        stacks = json.loads((tmp_path / "servefleet.lock.json").read_text())["stacks"]
        assert set(stacks) == set(STACKS.values())
        locked = run(state, "--data", f"sdk_lock={tmp_path}", deploy_file="deploys/stack.py")
        assert locked.returncode == 0, locked.stdout[-3000:] + locked.stderr[-3000:]
        for host, name in STACKS.items():
            assert _serving_release(state, host) == f"releases/{stacks[name]['release']}"
        assert _installed(state, "lab1")[2] == "cp38-abi3-manylinux_2_35_x86_64"
        assert _installed(state, "lab2")[2] == "cp38-abi3-manylinux_2_39_x86_64"
    finally:  # the next tests get a fresh default lab
        lab.clear()
        lab.update(lab_up())
        servefleet("lab", "status")
