"""Fixed addresses, ports and paths of the lab fleet, shared by the lab code, its package sources
and ``group_data/lab.py``. Everything lives on a bridge of the root namespace; hosts have no
default route and no DNS, so these servers are all they can reach."""

from __future__ import annotations

from pathlib import Path
from typing import Any

BRIDGE = "sfbr0"
BRIDGE_IP = "10.213.0.1"
PREFIX = 24
HOST_PREFIX = "lab"  # hosts are lab1..labN
NETNS_PREFIX = "sf-"  # network namespace of host labN: sf-labN


def host_ip(index: int) -> str:
    """Address of host ``lab<index>`` (1-based): 10.213.0.11, .12, ..."""
    return f"10.213.0.{10 + index}"


# Servers started by `lab up` on BRIDGE_IP (one port each)
PORT_FILES = 8080  # driver runfiles (/driver/) and the model store (/models/)
PORT_APT = 8090  # signed apt repository (driver prerequisites stand-ins)
PORT_INDEX_PRIVATE = 8101  # private RBLN index, basic auth: rebel-compiler, lmcache-rbln, nixl-rbln
PORT_INDEX_VLLM = 8102  # vLLM CPU wheels: vllm
PORT_INDEX_TORCH = 8103  # torch CPU wheels: torch and companions
PORT_INDEX_PUBLIC = 8104  # the hosts' public index: the rest (squatters, CUDA vllm and torch)
PORT_INDEX_ASSETS = 8105  # vllm-rbln's release assets: vllm CPU wheel for glibc >= 2.35
PORT_HUB = 8110  # a Hugging Face hub API over the model store (HF_ENDPOINT), bearer HF_TOKEN
# The lab's package indexes, by their name in the state ("indexes", "index_roots")
INDEXES = ("private", "vllm", "torch", "public", "assets")


def url(port: int, path: str = "/") -> str:
    return f"http://{BRIDGE_IP}:{port}{path}"


# On the machine running the lab
STATE_DIR = Path("/var/lib/servefleet-lab")  # state.json, ssh key, secrets, host overlays
CACHE_DIR = Path("/var/cache/servefleet-lab")  # base image tarball, built artifacts
STATE_FILE = STATE_DIR / "state.json"

# On every lab host (the simulation's own files; a deploy never writes them)
SIM_ETC = "/etc/rbln-sim"  # hardware.json, platform, fail-*, compile-seconds, load-seconds
SIM_RUN = "/run/rbln-sim"  # device locks, vllm-<port>.json records of argv and env
SIM_LOG = "/var/log/rbln-sim"  # compile.log: one line per simulated compile
# An offline host (`lab up --offline HOST`, `lab offline HOST`): this nftables table in its netns
# rejects its new connections to BRIDGE_IP (every lab server); replies (its sshd's) pass
OFFLINE_TABLE = "servefleet_offline"  # family inet

# Lab fleet internals (servefleet.fleet.lab.teardown): names the clean-up recognises as ours
VETH_PREFIX = "sfv-"  # root-namespace end of host labN's veth: sfv-labN
CGROUP_PREFIX = "sf-"  # sub-cgroup of host labN (name=systemd v1 and cgroup2): sf-labN
SERVER_MODULE = "servefleet.fleet.lab.index"  # every lab server runs `python -m SERVER_MODULE ...`
SYSCTL_SAVED = STATE_DIR / "sysctl.json"  # the machine's values lab up raised; down puts them back
STATE_HOSTS = STATE_DIR / "hosts"  # labN/{upper,work,merged,extra,console.log,pid,cgroups}
STATE_RUN = STATE_DIR / "run"  # <server>.pid
STATE_LOGS = STATE_DIR / "logs"  # <server>.log
STATE_SECRETS = STATE_DIR / "secrets"  # 0700; index-user, index-password, hf-token (0600)
STATE_SSH = STATE_DIR / "ssh"  # id_ed25519(.pub), known_hosts
STATE_APT = STATE_DIR / "apt"  # the signed flat apt repository (served as is)
STATE_INDEX = STATE_DIR / "index"  # <index>/: this lab's hard-link copy of the built indexes
APT_KEY_FILE = STATE_DIR / "lab-archive-keyring.gpg"  # the apt repo's public key (binary)

# PCI device id (vendor 0x1eff) of each card SKU, as `lspci -n` shows it (rbln.md §1)
PCI_VENDOR = "1eff"
SKU_PCI_DEVICE = {
    "RBLN-CR13": "2130",
    "RBLN-CR03": "2030",
    "RBLN-CR23": "2230",
    "RBLN-CA25": "1250",
    "RBLN-CA22": "1220",
    "RBLN-CA12": "1120",
    "RBLN-CA02": "1020",
}
DEFAULT_SKU = "RBLN-CR13"

# The hardware of a lab host (`lab up --hardware HW`, `--odd-hardware HOST=HW`): ``cr13`` is an
# RBLN host (NPUs of DEFAULT_SKU, or of its --odd-sku; --devices of them); a GPU profile is an
# 8-GPU NVIDIA board whose driver comes installed (/usr/bin/nvidia-smi), described to the
# simulation by /etc/rbln-sim/hardware.json. h100 exists so a test can show a wrong GPU refused.
RBLN_HARDWARE = "cr13"
DEFAULT_HARDWARE = RBLN_HARDWARE
NVIDIA_PCI_VENDOR = "10de"
GPU_PROFILES: dict[str, dict[str, Any]] = {
    "h200": {
        "name": "NVIDIA H200",
        "gpus": 8,
        "memory_total_mib": 143771,
        "driver_version": "570.133.20",
        "cuda_version": "12.8",
        "pci_device": "2335",
        "pci_name": "GH100 [H200 SXM 141GB]",
        "power_limit_w": 700,
    },
    "h100": {
        "name": "NVIDIA H100 80GB HBM3",
        "gpus": 8,
        "memory_total_mib": 81559,
        "driver_version": "570.133.20",
        "cuda_version": "12.8",
        "pci_device": "2330",
        "pci_name": "GH100 [H100 SXM5 80GB]",
        "power_limit_w": 700,
    },
}
HARDWARE = (RBLN_HARDWARE, *sorted(GPU_PROFILES))  # every --odd-hardware value
LAB_HARDWARE = (RBLN_HARDWARE, "h200")  # every --hardware value (a whole lab)
# PCI buses of the 8 GPUs of an HGX board, as nvidia-smi and lspci show them
GPU_PCI_BUSES = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")
DEFAULT_LOAD_SECONDS = 0.5  # the simulated GPU vllm's weight loading (/etc/rbln-sim/load-seconds)
DEFAULT_DEVICES = 4
DEFAULT_COMPILE_SECONDS = 1.0  # the simulated RBLN vllm's compile (/etc/rbln-sim/compile-seconds)
DEFAULT_HOSTS = 3
