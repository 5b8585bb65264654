"""A lab of NVIDIA GPU hosts (destructive: it re-ups the lab as an H200 host and an H100 host and
leaves a default 3-host lab behind): the hosts' hardware in the state, the inventory groups and
``lab status``, nvidia-smi over ``servefleet lab ssh``, no NPU, and the public index serving the
CUDA build of vllm 0.30.0 that a GPU host installs and serves with; with PyPI's nixl beside it,
a prefill on one host and a decode on the other pair over the NIXL side channel on the lab
bridge, and a prefill that advertises ``localhost`` fails its decode as vLLM's does."""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

import pytest
from labhelpers import lab_up, on_host, servefleet

from servefleet.fleet.lab import layout
from servefleet.fleet.lab.state import load_state

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
# A client run on a host (the script on stdin): `python3 - URL [BODY]` prints "STATUS BODY"
CLIENT = """
import sys, urllib.error, urllib.request
data = sys.argv[2].encode() if len(sys.argv) > 2 else None
req = urllib.request.Request(sys.argv[1], data=data, headers={"Content-Type": "application/json"})
try:
    with urllib.request.urlopen(req, timeout=30) as resp:
        print(resp.status, resp.read().decode())
except urllib.error.HTTPError as exc:
    print(exc.code, exc.read().decode())
"""
PD_MODEL = "/tmp/model"
TO_PREFILL = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
              "remote_block_ids": None, "remote_host": None, "remote_port": None}  # fmt: skip


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
        pd_across_hosts(state)
    finally:
        lab.clear()
        lab.update(lab_up())


def ask(
    state: dict[str, Any], host: str, port: int, path: str, body: Any = None
) -> tuple[int, str]:
    """A request from ``host`` to its own server on ``port``: (status, body)."""
    command = f"python3 - http://127.0.0.1:{port}{path}"
    if body is not None:
        command += " " + shlex.quote(json.dumps(body))
    status, _, text = on_host(state, host, command, stdin=CLIENT).stdout.partition(" ")
    return int(status), text


def pd_serve(state: dict[str, Any], host: str, unit: str, port: int, gpu: int, role: str,
             side_env: dict[str, str]) -> None:  # fmt: skip
    """Start a NixlConnector server as transient unit ``unit`` and wait for its /health."""
    config = json.dumps({"kv_connector": "NixlConnector", "kv_role": role})
    env = " ".join(f"-E {k}={v}" for k, v in {"CUDA_VISIBLE_DEVICES": str(gpu), **side_env}.items())
    on_host(state, host, f"systemd-run --unit {unit} {env} {VENV}/bin/vllm serve {PD_MODEL} "
            f"--port {port} --kv-transfer-config {shlex.quote(config)}")  # fmt: skip
    on_host(state, host, HEALTH.replace("8000", str(port)))


def pd_across_hosts(state: dict[str, Any]) -> None:
    """A prefill on lab1 and a decode on lab2 (upstream's NixlConnector, nixl from the public
    index) pair over the side channel on the bridge; a prefill whose side channel host is unset
    (vLLM's localhost) sends its decode to the decode's own host, where another NIXL engine
    listens on that port: vLLM's "engine ID mismatch", HTTP 500."""
    lab1, lab2 = (h["address"] for h in state["hosts"][:2])
    on_host(state, "lab2", f"python3 -m venv {VENV} && {VENV}/bin/pip install -q {PIP} "
            "vllm==0.30.0", timeout=300)  # fmt: skip
    for host in ("lab1", "lab2"):
        on_host(state, host, f"{VENV}/bin/pip install -q {PIP} nixl==1.5.1 && mkdir -p "
                f"{PD_MODEL} && echo '{{}}' > {PD_MODEL}/config.json", timeout=300)  # fmt: skip
    try:
        pd_serve(
            state,
            "lab1",
            "sf-pd-prefill",
            8001,
            0,
            "kv_producer",
            {"VLLM_NIXL_SIDE_CHANNEL_HOST": lab1, "VLLM_NIXL_SIDE_CHANNEL_PORT": "5557"},
        )
        pd_serve(
            state,
            "lab1",
            "sf-pd-local",
            8003,
            1,
            "kv_producer",
            {"VLLM_NIXL_SIDE_CHANNEL_PORT": "5558"},
        )  # no host: localhost
        pd_serve(
            state,
            "lab2",
            "sf-pd-decode",
            8002,
            0,
            "kv_consumer",
            {"VLLM_NIXL_SIDE_CHANNEL_HOST": "0.0.0.0", "VLLM_NIXL_SIDE_CHANNEL_PORT": "5558"},
        )
        chat = {"model": PD_MODEL, "messages": [{"role": "user", "content": "Hello there"}]}
        status, text = ask(state, "lab1", 8001, "/v1/chat/completions",
                           dict(chat, max_tokens=1, kv_transfer_params=TO_PREFILL))  # fmt: skip
        assert status == 200, text
        params = json.loads(text)["kv_transfer_params"]
        assert (params["remote_host"], params["remote_port"]) == (lab1, 5557)
        status, text = ask(state, "lab2", 8002, "/v1/chat/completions",
                           dict(chat, max_tokens=5, kv_transfer_params=params))  # fmt: skip
        assert status == 200 and json.loads(text)["usage"]["completion_tokens"] == 5, text

        status, text = ask(state, "lab1", 8003, "/v1/chat/completions",
                           dict(chat, max_tokens=1, kv_transfer_params=TO_PREFILL))  # fmt: skip
        local = json.loads(text)["kv_transfer_params"]
        assert status == 200 and (local["remote_host"], local["remote_port"]) == ("localhost", 5558)
        status, text = ask(state, "lab2", 8002, "/v1/chat/completions",
                           dict(chat, kv_transfer_params=local))  # fmt: skip
        assert status == 500 and json.loads(text)["error"]["message"] == "Internal server error"
        journal = on_host(state, "lab2", "journalctl -u sf-pd-decode --no-pager").stdout
        assert (
            f"Remote NIXL agent engine ID mismatch. Expected {local['remote_engine_id']},"
            in journal
        )
        status, metrics = ask(state, "lab2", 8002, "/metrics")
        assert (
            f'servefleet_sim_requests_total{{model_name="{PD_MODEL}",role="decode"}} 2' in metrics
        )
    finally:
        on_host(state, "lab1", "systemctl stop sf-pd-prefill sf-pd-local", check=False)
        on_host(state, "lab2", "systemctl stop sf-pd-decode", check=False)
