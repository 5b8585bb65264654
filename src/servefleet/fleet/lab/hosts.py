"""The lab's hosts: each host's own files (ssh keys, the simulation's hardware description and
tools), booting them (netns + overlay root + systemd as PID 1 + sshd, by ``host-up.sh``),
waiting for their systemd, and the ssh command that reaches them."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from servefleet.fleet.lab import layout
from servefleet.fleet.lab.base import DEFAULT_SUITE, script
from servefleet.fleet.lab.machine import run
from servefleet.fleet.lab.state import LabError

BOOT_TIMEOUT = 120.0
# Extra arguments of a host's systemd (PID 1), by base. In a container systemd reads PID 1's
# arguments as its kernel command line; systemd 257 (trixie) refuses the hybrid cgroup layout
# the hosts get on this machine unless told to keep it.
INIT_ARGS: dict[str, tuple[str, ...]] = {"trixie": ("SYSTEMD_CGROUP_ENABLE_LEGACY_FORCE=1",)}
# Units masked on a host of that base (in its own files, so the shared base image stays as
# cached): what fails in a container there, and a stock server would not miss
MASKED: dict[str, tuple[str, ...]] = {"trixie": ("systemd-modules-load.service",)}


def keygen(kind: str, path: Path, comment: str) -> str:
    """Make an ssh key pair without a passphrase; return its public line.

    + kind: the key type (``ed25519``, ``ecdsa``)
    + path: the private key's file (the public one gets ``.pub``)
    + comment: the key's comment
    """
    run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", comment, "-f", str(path)], "ssh-keygen")
    return Path(str(path) + ".pub").read_text().strip()


def hardware_json(host: dict[str, Any]) -> dict[str, Any]:
    """What /etc/rbln-sim/hardware.json says of a planned host. An RBLN host:
    ``{"sku", "pci_device", "devices"}`` (read by rbln-smi and lspci). A GPU host:
    ``{"hardware", "driver_version", "cuda_version", "gpus": [{"index", "name", "uuid",
    "pci_vendor", "pci_device", "pci_bus_id", "pci_name", "memory_total_mib",
    "power_limit_w"}]}`` (read by nvidia-smi and lspci); no ``devices``, so rbln-smi lists no
    NPU there. UUIDs are derived from the host name, so they are stable across labs.

    + host: an entry of :func:`plan_hosts`
    """
    if host["hardware"] == layout.RBLN_HARDWARE:
        return {"sku": host["sku"], "pci_device": host["pci_device"], "devices": host["devices"]}
    profile = layout.GPU_PROFILES[host["hardware"]]
    gpus = []
    for index in range(profile["gpus"]):
        ident = uuid.uuid5(uuid.NAMESPACE_DNS, f"{host['name']}.gpu{index}.servefleet-lab")
        gpus.append(
            {
                "index": index,
                "name": profile["name"],
                "uuid": f"GPU-{ident}",
                "pci_vendor": layout.NVIDIA_PCI_VENDOR,
                "pci_device": profile["pci_device"],
                "pci_bus_id": f"00000000:{layout.GPU_PCI_BUSES[index]}:00.0",
                "pci_name": profile["pci_name"],
                "memory_total_mib": profile["memory_total_mib"],
                "power_limit_w": profile["power_limit_w"],
            }
        )
    return {
        "hardware": host["hardware"],
        "driver_version": profile["driver_version"],
        "cuda_version": profile["cuda_version"],
        "gpus": gpus,
    }


# GPU hosts: their driver made /run/rbln-sim at boot (the simulated vllm's GPU claims, records)
GPU_TMPFILES = (
    "# servefleet lab simulation: runtime dir of the simulated GPU vllm (GPU claims, records)\n"
    "d /run/rbln-sim 1777 root root -\n"
)


def prepare_host(host: dict[str, Any], pubkey: str, sim: Path, compile_seconds: float) -> str:
    """Lay out HOSTDIR/extra (host keys, authorized_keys, simulation files); return the host's
    known_hosts line. A GPU host also gets its installed driver: /usr/bin/nvidia-smi, the
    tmpfiles.d entry of /run/rbln-sim, and ``upstream`` in /etc/rbln-sim/platform."""
    hostdir = layout.STATE_HOSTS / host["name"]
    extra = hostdir / "extra"
    for sub, mode in (
        ("etc", 0o755),
        ("etc/ssh", 0o755),
        ("root", 0o700),
        ("root/.ssh", 0o700),
        ("usr", 0o755),
        ("usr/bin", 0o755),
        (layout.SIM_ETC.lstrip("/"), 0o755),
    ):
        (extra / sub).mkdir(parents=True, exist_ok=True)
        (extra / sub).chmod(mode)
    keys = [
        keygen(kind, extra / "etc/ssh" / f"ssh_host_{kind}_key", f"root@{host['name']}")
        for kind in ("ed25519", "ecdsa")
    ]
    auth = extra / "root/.ssh/authorized_keys"
    auth.write_text(pubkey + "\n")
    auth.chmod(0o600)
    sim_etc = extra / layout.SIM_ETC.lstrip("/")
    (sim_etc / "hardware.json").write_text(json.dumps(hardware_json(host), indent=2) + "\n")
    tools = ["lspci"]
    if host["hardware"] == layout.RBLN_HARDWARE:
        (sim_etc / "compile-seconds").write_text(f"{compile_seconds:g}\n")
    else:
        (sim_etc / "platform").write_text("upstream\n")
        (sim_etc / "load-seconds").write_text(f"{layout.DEFAULT_LOAD_SECONDS:g}\n")
        (extra / "etc/tmpfiles.d").mkdir(mode=0o755, exist_ok=True)
        (extra / "etc/tmpfiles.d/rbln-sim.conf").write_text(GPU_TMPFILES)
        tools.append("nvidia-smi")
    for tool in tools:
        shutil.copyfile(sim / tool, extra / "usr/bin" / tool)
        (extra / "usr/bin" / tool).chmod(0o755)
    masked = MASKED.get(host.get("base", DEFAULT_SUITE), ())
    if masked:
        (extra / "etc/systemd/system").mkdir(mode=0o755, parents=True, exist_ok=True)
    for unit in masked:
        (extra / "etc/systemd/system" / unit).symlink_to("/dev/null")
    known = []
    for key in keys:
        kind, blob = key.split()[:2]
        known.append(f"{host['name']},{host['address']} {kind} {blob}")
    return "\n".join(known)


def _ssh_base(state_ssh: dict[str, str]) -> list[str]:
    # KexAlgorithms: a lab host is a namespace of this machine, and OpenSSH 9's default key
    # exchange (sntrup761x25519) costs each side about 0.12 CPU-s a connection, half of a call
    return [
        "ssh",
        "-F",
        "/dev/null",
        "-i",
        state_ssh["key"],
        "-o",
        "KexAlgorithms=curve25519-sha256",
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        f"UserKnownHostsFile={state_ssh['known_hosts']}",
        "-o",
        "ConnectTimeout=3",
        "-o",
        "LogLevel=ERROR",
    ]


def ssh_command(state: dict[str, Any], host: str, command: list[str]) -> list[str]:
    """The ssh argv that runs command on a lab host as root.

    + state: the lab state
    + host: a lab host name (lab1...)
    + command: the remote command words
    """
    by_name = {h["name"]: h for h in state["hosts"]}
    if host not in by_name:
        raise LabError(f"no lab host {host!r}; the lab has {', '.join(sorted(by_name))}")
    return [*_ssh_base(state["ssh"]), f"root@{by_name[host]['address']}", *command]


def wait_running(ssh: dict[str, str], host: dict[str, Any], deadline: float) -> str:
    base = [*_ssh_base(ssh), f"root@{host['address']}"]
    last = "unreachable"
    while time.monotonic() < deadline:
        try:
            proc = subprocess.run(
                [*base, "systemctl", "is-system-running", "--wait"],
                capture_output=True,
                text=True,
                timeout=max(5.0, deadline - time.monotonic()),
            )
        except subprocess.TimeoutExpired:
            last = "systemctl is-system-running --wait timed out"
            continue
        out = proc.stdout.strip()
        if out in ("running", "degraded", "maintenance", "stopping"):
            if out != "running":
                failed = subprocess.run(
                    [*base, "systemctl", "--failed", "--plain", "--no-legend"],
                    capture_output=True,
                    text=True,
                ).stdout.split()
                return f"{out} (failed: {' '.join(failed[::5][:5]) or '?'})"
            return out
        last = out or (proc.stderr.strip().splitlines() or ["unreachable"])[-1]
        time.sleep(0.2)
    return f"not up after {BOOT_TIMEOUT:.0f} s ({last})"


def boot_hosts(plan: Sequence[dict[str, Any]], bases: dict[str, Path]) -> None:
    """Boot each planned host with ``host-up.sh`` (its netns, overlay root and systemd as PID 1
    in its own cgroup); its entry gets ``root`` and ``console_log``.

    + plan: the planned hosts, their files laid out (:func:`prepare_host`)
    + bases: the base image of each Debian suite the hosts use
    """
    for h in plan:
        hostdir = layout.STATE_HOSTS / h["name"]
        run(
            [
                "bash",
                str(script("host-up.sh")),
                h["name"],
                h["address"],
                str(bases[h["base"]]),
                str(hostdir),
                h["netns"],
                layout.VETH_PREFIX + h["name"],
                layout.CGROUP_PREFIX + h["name"],
                layout.BRIDGE,
                str(layout.PREFIX),
                " ".join(INIT_ARGS.get(h["base"], ())),
            ],
            f"booting {h['name']}",
        )
        h["root"] = str(hostdir / "merged")
        h["console_log"] = str(hostdir / "console.log")


def wait_booted(ssh: dict[str, str], plan: Sequence[dict[str, Any]]) -> None:
    """Wait until every host's systemd is running (BOOT_TIMEOUT in all); raise LabError naming
    the hosts that are not.

    + ssh: the lab's ssh entry (``key``, ``known_hosts``)
    + plan: the booted hosts
    """
    deadline = time.monotonic() + BOOT_TIMEOUT
    with ThreadPoolExecutor(max_workers=min(8, len(plan))) as pool:
        states = list(pool.map(lambda h: wait_running(ssh, h, deadline), plan))
    bad = [f"{h['name']}: {s}" for h, s in zip(plan, states, strict=True) if s != "running"]
    if bad:
        raise LabError(
            f"lab hosts did not boot ({'; '.join(bad)}); see the console logs under "
            f"{layout.STATE_HOSTS}; `servefleet lab down` removes the lab"
        )
