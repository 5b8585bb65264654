"""A lab of NVIDIA GPU hosts (destructive: it re-ups the lab as an H200 host and an H100 host and
leaves a default 3-host lab behind): the hosts' hardware in the state, the inventory groups and
``lab status``, nvidia-smi over ``servefleet lab ssh``, no NPU, and the public index serving the
CUDA build of vllm 0.30.0 that a GPU host installs and serves with."""

from __future__ import annotations

import re
from typing import Any

import pytest
from labhelpers import lab_up, on_host, servefleet

from servefleet.lab import layout
from servefleet.lab.state import load_state

pytestmark = pytest.mark.lab_destructive

PUBLIC = layout.url(layout.PORT_INDEX_PUBLIC, "/simple/")
PIP = f"--index-url {PUBLIC} --trusted-host {layout.BRIDGE_IP} --no-input --retries 0"
VENV = "/opt/sf-gpu-test"
HEALTH = (
    "python3 -c 'import sys, time, urllib.request\n"
    "for _ in range(200):\n"
    "    try:\n"
    '        sys.exit(urllib.request.urlopen("http://127.0.0.1:8000/health").status != 200)\n'
    "    except OSError:\n"
    "        time.sleep(0.1)\n"
    "sys.exit(1)'"
)


def query(host: str, fields: str) -> str:
    return servefleet(
        "lab", "ssh", host, "nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"
    ).stdout


def test_an_h200_and_an_h100_host(lab: dict[str, Any]) -> None:
    try:
        up = servefleet("lab", "up", "--hosts", "2", "--hardware", "h200",
                        "--odd-hardware", "lab2=h100")  # fmt: skip
        state = load_state()
        assert up.stdout.splitlines()[:2] == [
            "lab1 10.213.0.11 NVIDIA H200 running",
            "lab2 10.213.0.12 NVIDIA H100 80GB HBM3 running",
        ]
        assert [(h["hardware"], h["devices"]) for h in state["hosts"]] == [("h200", 8), ("h100", 8)]
        assert state["groups"] == {"lab": ["lab1", "lab2"], "h100": ["lab2"], "h200": ["lab1"]}
        status = servefleet("lab", "status").stdout
        assert re.search(r"^lab1\s+10\.213\.0\.11\s+NVIDIA H200 8 GPUs  running$", status, re.M)
        assert re.search(r"^lab2\s.*NVIDIA H100 80GB HBM3 8 GPUs  running$", status, re.M)

        # the driver comes installed: nvidia-smi over `servefleet lab ssh`; no NPU, no rbln-smi
        assert query("lab1", "name,memory.total,driver_version") == (
            "NVIDIA H200, 143771 MiB, 570.133.20\n" * 8
        )
        assert query("lab2", "name,memory.total") == "NVIDIA H100 80GB HBM3, 81559 MiB\n" * 8
        assert servefleet("lab", "ssh", "lab1", "nvidia-smi", "-L").stdout.startswith(
            "GPU 0: NVIDIA H200 (UUID: GPU-"
        )
        out = on_host(state, "lab1", "lspci -n -d 10de: | wc -l; lspci -n -d 1eff: | wc -l; "
                      "command -v rbln-smi || echo none; cat /etc/rbln-sim/platform; "
                      "stat -c %a /run/rbln-sim").stdout.split()  # fmt: skip
        assert out == ["8", "0", "none", "upstream", "1777"]

        # the public index serves the CUDA builds; a GPU host installs and serves with them
        on_host(state, "lab1", f"python3 -m venv {VENV} && {VENV}/bin/pip install -q {PIP} "
                "vllm==0.30.0", timeout=300)  # fmt: skip
        versions = on_host(state, "lab1", f"{VENV}/bin/pip list --format=freeze").stdout
        assert "vllm==0.30.0\n" in versions and "torch==2.13.0\n" in versions
        on_host(state, "lab1", "mkdir -p /tmp/model && echo '{}' > /tmp/model/config.json && "
                f"systemd-run --unit sf-gpu-test {VENV}/bin/vllm serve /tmp/model --port 8000")  # fmt: skip
        on_host(state, "lab1", HEALTH)
        used = query("lab1", "memory.used").split("\n")
        assert used[:2] == ["132269 MiB", "0 MiB"]  # 0.92 of GPU 0
        refused = on_host(state, "lab1", f"{VENV}/bin/vllm serve /tmp/model --port 8001 2>&1",
                          check=False)  # fmt: skip
        assert refused.returncode == 1 and "Free memory on device cuda:0" in refused.stdout
        refused = on_host(state, "lab1", f"CUDA_VISIBLE_DEVICES=0,1 {VENV}/bin/vllm serve "
                          "/tmp/model --port 8001 -tp 4 2>&1", check=False)  # fmt: skip
        assert "World size (4) is larger than the number of available GPUs (2)" in refused.stdout
        on_host(state, "lab1", "test -s /run/rbln-sim/vllm-8000.json; systemctl stop sf-gpu-test")
    finally:
        lab.clear()
        lab.update(lab_up())
