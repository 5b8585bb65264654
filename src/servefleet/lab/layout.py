"""Fixed addresses, ports and paths of the lab fleet, shared by the lab code, its package sources
and ``group_data/lab.py``. Everything lives on a bridge of the root namespace; hosts have no
default route and no DNS, so these servers are all they can reach."""

from __future__ import annotations

from pathlib import Path

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
PORT_INDEX_PUBLIC = 8104  # the hosts' public index: everything else, squatters included


def url(port: int, path: str = "/") -> str:
    return f"http://{BRIDGE_IP}:{port}{path}"


# On the machine running the lab
STATE_DIR = Path("/var/lib/servefleet-lab")  # state.json, ssh key, secrets, host overlays
CACHE_DIR = Path("/var/cache/servefleet-lab")  # base image tarball, built artifacts
STATE_FILE = STATE_DIR / "state.json"

# On every lab host (the simulation's own files; a deploy never writes them)
SIM_ETC = "/etc/rbln-sim"  # hardware.json (sku, pci id, devices), fail-health, fail-start, compile-seconds
SIM_RUN = "/run/rbln-sim"  # device locks, vllm-<port>.json records of argv and env
SIM_LOG = "/var/log/rbln-sim"  # compile.log: one line per simulated compile
