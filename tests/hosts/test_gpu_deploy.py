"""GPU hosts through the same deploys (destructive: re-ups the lab with GPU hosts and leaves a
default 3-host lab behind): a mixed lab served by one `pyinfra inventories/lab.py
deploys/serve.py`, H200 hosts fresh to serving with the argv `servefleet resolve` gives, EAGLE-3
on and off through a rollout, an upgrade of the vLLM pin, a host with other GPUs refused before
any change, and `plan`/`status` on GPU hosts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from faults import REPO, record, resolved, run, runs_argv, secrets, totals
from labhelpers import lab_up, on_host

from servefleet.fleet.lab.chat import chat_once

pytestmark = pytest.mark.lab_destructive

GPU_RECIPE = "vllm/openai/gpt-oss-120b"
SERVEFLEET = str(Path(sys.executable).parent / "servefleet")
DRAFT = "/var/lib/servefleet/hf/hub/models--nvidia--gpt-oss-120b-Eagle3-v3"


def gpu_argv(*extra: str) -> list[str]:
    spec = resolved_vllm("--hardware", "h200", *extra)
    return spec["servers"][0]["argv"]


def resolved_vllm(*extra: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "servefleet", "resolve", GPU_RECIPE, *extra],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(out.stdout)


def cli(state: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **secrets(state), "PYINFRA_PROGRESS": "off"}
    return subprocess.run([SERVEFLEET, *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=900)  # fmt: skip


def inventory(state: dict[str, Any], path: Path, h200: list[str], **host_data: Any) -> str:
    """An inventory of the lab with ``h200`` in group h200 and ``host_data`` on every host (host
    data outranks group_data files, as an operator's per-host pins would)."""
    text = f"""
from servefleet.fleet.lab.state import load_state
_s = load_state()
_ssh = dict(ssh_user=_s["ssh"]["user"], ssh_key=_s["ssh"]["key"],
            ssh_known_hosts_file=_s["ssh"]["known_hosts"], ssh_strict_host_key_checking="yes")
_extra = {host_data!r}
lab = [(h["name"], dict(_ssh, ssh_hostname=h["address"], **_extra)) for h in _s["hosts"]]
h200 = {h200!r}
"""
    path.write_text(text)
    return str(path)


def answers(state: dict[str, Any], host: str, port: int = 8000) -> bool:
    address = next(h["address"] for h in state["hosts"] if h["name"] == host)
    return bool(chat_once(address, port, "openai/gpt-oss-120b", "hi", max_tokens=1))


def test_gpu_hosts(lab: dict[str, Any], tmp_path: Path) -> None:
    try:
        # a mixed lab: 2 CR13 + 1 H200, one run serves both platforms
        state = lab_up("--odd-hardware", "lab3=h200")
        first = run(state)
        assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-4000:]
        latency = resolved()["servers"][0]["argv"]
        for host in ("lab1", "lab2"):
            assert all(runs_argv(state, host, p, latency) for p in range(8000, 8004)), host
        assert runs_argv(state, "lab3", 8000, gpu_argv())
        rec = record(state, "lab3", 8000)
        assert rec is not None and rec["env"]["CUDA_VISIBLE_DEVICES"] == "0"
        assert "RBLN_VISIBLE_DEVICES" not in rec["env"] and answers(state, "lab3")
        assert totals(run(state, "--json"))["success"] == 0
        status = cli(state, "status", "inventories/lab.py", "--json")
        assert status.returncode == 0, status.stdout + status.stderr
        assert json.loads(status.stdout)["lab3"]["sku"] == "NVIDIA H200"

        # H200 hosts fresh to serving; lab3 has H100s
        state = lab_up("--hardware", "h200", "--odd-hardware", "lab3=h100")
        gpus = ["--limit", "lab1", "--limit", "lab2"]
        fresh = run(state, *gpus)
        assert fresh.returncode == 0, fresh.stdout[-4000:] + fresh.stderr[-4000:]
        for host in ("lab1", "lab2"):
            assert runs_argv(state, host, 8000, gpu_argv()) and answers(state, host), host
            assert on_host(state, host, f"test -e {DRAFT}", check=False).returncode != 0
        assert totals(run(state, "--json", *gpus))["success"] == 0
        plan = cli(state, "plan", "inventories/lab.py", "--json", "--", *gpus)
        assert plan.returncode == 0 and not any(
            p["changes"] for p in json.loads(plan.stdout).values()
        )

        # EAGLE-3 on through a rollout (the draft model is fetched), then off again
        eagle = ["--data", "serve_features=spec_decoding=on"]
        done = cli(
            state, "rollout", "inventories/lab.py", "--yes", "--canary", "1", *gpus, "--", *eagle
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        for host in ("lab1", "lab2"):
            assert runs_argv(state, host, 8000, gpu_argv("--feature", "spec_decoding")), host
            assert on_host(state, host, f"test -d {DRAFT}/snapshots", check=False).returncode == 0
        off = run(state, *gpus)
        assert off.returncode == 0 and all(
            runs_argv(state, h, 8000, gpu_argv()) for h in ("lab1", "lab2")
        )

        # an upgrade of the vLLM pin: a new release, the server restarts on it
        before = on_host(state, "lab1", "readlink /opt/servefleet/current").stdout.strip()
        pinned = inventory(state, tmp_path / "pinned.py", ["lab1", "lab2"],
                           sdk_pins=["vllm==0.30.1", "torch==2.13.0"])  # fmt: skip
        env = {**os.environ, **secrets(state), "PYINFRA_PROGRESS": "off"}
        up = subprocess.run([str(Path(sys.executable).parent / "pyinfra"), "-y", "--limit", "lab1",
                             pinned, "deploys/serve.py"], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=900)  # fmt: skip
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        after = on_host(state, "lab1", "readlink /opt/servefleet/current").stdout.strip()
        assert after != before
        version = on_host(state, "lab1", "/opt/servefleet/current/bin/python -c "
                          "'import importlib.metadata as m; print(m.version(\"vllm\"))'")  # fmt: skip
        assert version.stdout.strip() == "0.30.1"
        rec = record(state, "lab1", 8000)
        assert rec is not None and rec["argv"][0].startswith(f"/opt/servefleet/{after}/")
        assert answers(state, "lab1")

        # lab3's GPUs are H100s: in the h200 group it is refused before any change
        wrong = inventory(state, tmp_path / "wrong.py", ["lab3"])
        refused = subprocess.run([str(Path(sys.executable).parent / "pyinfra"), "-y", "--limit",
                                  "lab3", wrong, "deploys/serve.py"], cwd=REPO, env=env,
                                 capture_output=True, text=True, timeout=600)  # fmt: skip
        assert refused.returncode != 0
        out = refused.stdout + refused.stderr
        assert "host GPUs NVIDIA H100 80GB HBM3 are not H200 (serve_hardware h200)" in out
        assert on_host(state, "lab3", "test -e /opt/servefleet || ls /etc/systemd/system/servefleet-*",
                       check=False).returncode != 0  # fmt: skip

        # status names a GPU host whose server was killed
        on_host(state, "lab2", "systemctl kill -s KILL servefleet-vllm-0.service")
        bad = cli(state, "status", "inventories/lab.py", "--", "--limit", "lab2")
        assert bad.returncode != 0 and "lab2: servefleet-vllm-0.service" in bad.stdout + bad.stderr
    finally:
        lab.clear()
        lab.update(lab_up())
