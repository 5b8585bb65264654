"""Bring the lab fleet up and report on it: check the options, clear whatever an earlier run
left (servefleet.fleet.lab.teardown), build the artifacts, start the servers on the bridge
(servefleet.fleet.lab.servers), boot the hosts (servefleet.fleet.lab.hosts) and write the state that
``inventories/lab.py`` reads. ``lab down`` is servefleet.fleet.lab.teardown's ``down``.
"""

from __future__ import annotations

import datetime
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from servefleet.base.remote.fetch_model import bad_model_id
from servefleet.fleet.lab import layout
from servefleet.fleet.lab.artifacts import (
    ensure_artifacts,
    make_apt_repo,
    serving_copy,
    simulator_sources,
)
from servefleet.fleet.lab.base import DEFAULT_SUITE, base_note, ensure_base
from servefleet.fleet.lab.hosts import boot_hosts, keygen, prepare_host, ssh_command, wait_booted
from servefleet.fleet.lab.index import fetch
from servefleet.fleet.lab.machine import check_can_run, raise_sysctls, run
from servefleet.fleet.lab.offline import check_hosts, is_offline, set_offline
from servefleet.fleet.lab.servers import new_secret_files, start_servers
from servefleet.fleet.lab.state import LabError, load_state, write_state
from servefleet.fleet.lab.teardown import clear, server_pids
from servefleet.fleet.lab.topology import host_groups, plan_hosts

__all__ = ["check_models", "status", "up"]


def check_models(models: Sequence[str]) -> list[str]:
    """The models ``lab up --models`` adds to the store, checked as the fetcher checks a model
    id; sorted, each once.

    + models: ORG/NAME ids
    """
    for model in models:
        problem = bad_model_id(model)
        if problem:
            raise LabError(f"--models: {problem}")
    return sorted(set(models))


def up(
    hosts: int = layout.DEFAULT_HOSTS,
    devices: int = layout.DEFAULT_DEVICES,
    odd_skus: dict[str, str] | None = None,
    compile_seconds: float = layout.DEFAULT_COMPILE_SECONDS,
    log: Any = print,
    models: Sequence[str] = (),
    hardware: str = layout.DEFAULT_HARDWARE,
    odd_hardware: dict[str, str] | None = None,
    offline: Sequence[str] = (),
    base: str = DEFAULT_SUITE,
    odd_base: dict[str, str] | None = None,
    groups: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, Any]:
    """Clear any earlier lab, then build and start a new one; return its state. The indexes
    serve this lab's own hard-link copy of the build (``servefleet lab republish`` changes it,
    never the cache).

    + hosts: number of hosts lab1..labN
    + devices: simulated NPUs per RBLN host
    + odd_skus: host name -> SKU for RBLN hosts that are not RBLN-CR13
    + compile_seconds: how long the simulated vllm "compiles"
    + log: progress callback taking one line
    + models: ORG/NAME ids whose simulated snapshots the store holds besides the recipes' models
    + hardware: the hardware of every host (``cr13`` or ``h200``)
    + odd_hardware: host name -> hardware for hosts that differ (``cr13``, ``h100``, ``h200``)
    + offline: hosts whose new connections to the lab's servers are rejected (servefleet.fleet.lab.offline)
    + base: the Debian suite of every host (``bookworm`` or ``trixie``)
    + odd_base: host name -> suite for hosts that differ
    """
    plan = plan_hosts(hosts, devices, odd_skus or {}, hardware, odd_hardware, base, odd_base)
    offline_hosts = check_hosts(offline, [h["name"] for h in plan], "--offline")
    extra = {
        g: check_hosts(hs, [h["name"] for h in plan], "--group") for g, hs in (groups or {}).items()
    }
    clash = sorted(set(extra) & {"lab", *layout.HARDWARE})
    if clash:
        raise LabError(
            f"--group {clash[0]}: the lab makes that group itself; allowed: another name"
        )
    added = check_models(models)
    if compile_seconds < 0:
        raise LabError(f"--compile-seconds must be >= 0, not {compile_seconds:g}")
    check_can_run()
    if offline_hosts and shutil.which("nft") is None:
        raise LabError("--offline needs nft (apt-get install nftables; ./setup.sh does)")
    sim = simulator_sources() / "sim"
    gpu_hosts = any(h["hardware"] != layout.RBLN_HARDWARE for h in plan)
    for tool in ("lspci", "nvidia-smi") if gpu_hosts else ("lspci",):
        if not (sim / tool).is_file():
            raise LabError(f"the simulator sources have no {sim / tool}")
    t0 = time.monotonic()
    clear()
    for d in (
        layout.STATE_DIR,
        layout.STATE_RUN,
        layout.STATE_LOGS,
        layout.STATE_HOSTS,
        layout.CACHE_DIR,
    ):
        d.mkdir(parents=True, exist_ok=True)
    layout.STATE_SSH.mkdir(mode=0o700, parents=True, exist_ok=True)
    raise_sysctls(len(plan))
    log(f"cleared the earlier lab ({time.monotonic() - t0:.1f} s)")

    artifacts, manifest = ensure_artifacts(layout.CACHE_DIR, added)
    make_apt_repo(artifacts / "apt", layout.STATE_APT, layout.APT_KEY_FILE)
    log(f"lab artifacts and signed apt repository ready ({time.monotonic() - t0:.1f} s)")
    bases = {
        suite: ensure_base(layout.CACHE_DIR, suite) for suite in sorted({h["base"] for h in plan})
    }
    log(f"base image{'s' if len(bases) > 1 else ''} ready ({time.monotonic() - t0:.1f} s)")

    run(["ip", "link", "add", layout.BRIDGE, "type", "bridge"], "creating the bridge")
    run(
        ["ip", "addr", "add", f"{layout.BRIDGE_IP}/{layout.PREFIX}", "dev", layout.BRIDGE],
        "addressing the bridge",
    )
    run(["ip", "link", "set", layout.BRIDGE, "up"], "bringing the bridge up")

    secret_files = new_secret_files()
    serving_copy(artifacts / "index", layout.STATE_INDEX)
    servers = start_servers(artifacts, secret_files, layout.STATE_INDEX)
    log(f"servers up on {layout.BRIDGE_IP} ({time.monotonic() - t0:.1f} s)")

    ssh = {
        "user": "root",
        "key": str(layout.STATE_SSH / "id_ed25519"),
        "known_hosts": str(layout.STATE_SSH / "known_hosts"),
    }
    pubkey = keygen("ed25519", Path(ssh["key"]), "servefleet-lab")
    known = [prepare_host(h, pubkey, sim, compile_seconds) for h in plan]
    Path(ssh["known_hosts"]).write_text("\n".join(known) + "\n")
    boot_hosts(plan, bases)
    wait_booted(ssh, plan)
    log(f"{len(plan)} hosts running ({time.monotonic() - t0:.1f} s)")
    by_name = {h["name"]: h for h in plan}
    for name in offline_hosts:
        set_offline(by_name[name]["netns"], True)
    if offline_hosts:
        log(f"offline (no lab server answers them): {', '.join(offline_hosts)}")

    files_url = layout.url(layout.PORT_FILES)
    state: dict[str, Any] = {
        "version": 1,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "bridge": {"name": layout.BRIDGE, "address": layout.BRIDGE_IP, "prefix": layout.PREFIX},
        "hosts": plan,
        "groups": {**host_groups(plan), **extra},
        "ssh": ssh,
        "servers": servers,
        "indexes": {k: servers[f"index_{k}"]["url"] for k in layout.INDEXES},
        "index_roots": {k: str(layout.STATE_INDEX / k) for k in layout.INDEXES},
        "republished": [],
        "offline": offline_hosts,
        "secrets": secret_files,
        "apt": {
            "url": servers["apt"]["url"],
            "suite": "./",
            "key": str(layout.APT_KEY_FILE),
            "key_url": layout.url(layout.PORT_APT, "/lab-archive-keyring.gpg"),
        },
        "driver": {
            version: {
                "url": files_url + entry["path"],
                "sha256": entry["sha256"],
                "file": Path(entry["path"]).name,
            }
            for version, entry in sorted(manifest.get("driver", {}).items())
        },
        "model_store": {
            "url": layout.url(layout.PORT_FILES, "/models/"),
            "auth": "Authorization: Bearer $HF_TOKEN",
            "models": manifest.get("models", {}),
        },
        "sim": {"compile_seconds": compile_seconds, "devices": devices},
        "artifacts": str(artifacts),
        "manifest": manifest,
    }
    write_state(state)
    return state


def status() -> list[str]:
    """Lines describing the lab: each host with its address and systemd state, each server."""
    state = load_state()
    lines = []
    for host in state["hosts"]:
        try:
            proc = subprocess.run(
                ssh_command(state, host["name"], ["systemctl", "is-system-running"]),
                capture_output=True,
                text=True,
                timeout=10,
            )
            hstate = proc.stdout.strip() or "unreachable"
        except subprocess.TimeoutExpired:
            hstate = "unreachable (timeout)"
        gpus = host.get("hardware", layout.RBLN_HARDWARE) != layout.RBLN_HARDWARE
        lines.append(
            f"{host['name']:<8} {host['address']:<13} {host['sku']:<10} "
            f"{host['devices']} {'GPUs' if gpus else 'devices'}  {hstate}{base_note(host)}"
            + _offline_note(host, host["name"] in state.get("offline", []))
        )
    running = set(server_pids())
    for name, server in sorted(state["servers"].items()):
        try:
            pid = int(Path(server["pid_file"]).read_text().strip())
        except (OSError, ValueError):
            pid = -1
        try:
            answers = fetch(server["url"], timeout=3)[0] < 500  # static roots answer 404
        except OSError:
            answers = False
        up_ = pid in running and answers
        lines.append(f"{name:<14} {server['url']:<34} {'up' if up_ else 'down'}")
    for entry in state.get("republished", []):
        lines.append(
            f"republished    {entry['index']:<8} {entry['file']}  "
            f"{entry['old_sha256']} -> {entry['new_sha256']}"
        )
    return lines


def _offline_note(host: dict[str, Any], recorded: bool) -> str:
    """`` offline`` for a host the state and its namespace agree is offline; a warning when they
    disagree; nothing for an online host."""
    try:
        actual = is_offline(host["netns"])
    except (LabError, OSError, subprocess.TimeoutExpired):
        actual = False
        if not recorded:
            return ""
    if recorded and actual:
        return "  offline"
    if recorded:
        return f"  offline in the state, but its rules are gone (servefleet lab offline {host['name']})"
    if actual:
        return f"  offline rules present, not in the state (servefleet lab offline {host['name']} --undo)"
    return ""
