"""Bring the lab fleet up and down: hosts (netns + overlay root + systemd as PID 1 + sshd), the
lab's servers on the bridge, the credentials, and the state that ``inventories/lab.py`` reads.

``up`` first clears whatever an earlier run left (processes found by pidfile and by scanning,
mounts, namespaces, links, cgroups, state), so a crashed run never blocks the next one.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from servefleet.lab import layout
from servefleet.lab.artifacts import (
    ensure_artifacts,
    make_apt_repo,
    serving_copy,
    simulator_sources,
)
from servefleet.lab.base import DEFAULT_SUITE, SUITES, base_note, ensure_base, script
from servefleet.lab.index import fetch
from servefleet.lab.offline import check_hosts, is_offline, set_offline
from servefleet.lab.state import LabError, load_state, write_state
from servefleet.remote.fetch_model import bad_model_id

TOOLS = (
    "ip",
    "unshare",
    "nsenter",
    "mount",
    "umount",
    "mmdebstrap",
    "zstd",
    "tar",
    "ssh",
    "ssh-keygen",
    "gpg",
    "gpgconf",
    "dpkg-deb",
    "dpkg-scanpackages",
    "apt-ftparchive",
)
HOST_CGROUP = re.compile(
    rf"/{re.escape(layout.CGROUP_PREFIX + layout.HOST_PREFIX)}\d+(/|$)", re.MULTILINE
)
CGROUP_ROOTS = (Path("/sys/fs/cgroup/systemd"), Path("/sys/fs/cgroup/unified"))
BOOT_TIMEOUT = 120.0
# Extra arguments of a host's systemd (PID 1), by base. In a container systemd reads PID 1's
# arguments as its kernel command line; systemd 257 (trixie) refuses the hybrid cgroup layout
# the hosts get on this machine unless told to keep it.
INIT_ARGS: dict[str, tuple[str, ...]] = {"trixie": ("SYSTEMD_CGROUP_ENABLE_LEGACY_FORCE=1",)}
# Units masked on a host of that base (in its own files, so the shared base image stays as
# cached): what fails in a container there, and a stock server would not miss
MASKED: dict[str, tuple[str, ...]] = {"trixie": ("systemd-modules-load.service",)}


# --- checks -------------------------------------------------------------------------------------
def check_can_run() -> None:
    """Raise LabError (one line) unless this process can run the lab: root, tools, namespaces."""
    if os.geteuid() != 0:
        raise LabError("the lab fleet needs root (network namespaces, overlay mounts); run as root")
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        raise LabError(
            f"the lab fleet needs {', '.join(missing)} (apt-get install mmdebstrap zstd "
            "openssh-client dpkg-dev apt-utils gnupg iproute2 util-linux)"
        )
    probe = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount", "--net", "--time", "true"], capture_output=True
    )
    if probe.returncode != 0:
        why = probe.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["unknown error"]
        raise LabError(f"namespaces are unavailable here ({why[0]}); the lab fleet needs them")


def _run(cmd: list[str], what: str, **kwargs: Any) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise LabError(f"{what} failed: {tail[0]}")
    return proc.stdout


# --- finding what is ours -----------------------------------------------------------------------
def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _is_server(pid: int) -> bool:
    argv = _cmdline(pid)
    return any(
        argv[i] == "-m" and argv[i + 1] == layout.SERVER_MODULE for i in range(len(argv) - 1)
    )


def _pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def host_pids() -> list[int]:
    """Every process in a lab host's cgroup (launchers, their inits and all inside)."""
    found = []
    for pid in _pids():
        try:
            text = Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            continue
        if HOST_CGROUP.search(text):
            found.append(pid)
    return found


def server_pids() -> list[int]:
    """Every lab server process (by pidfile or by its command line)."""
    found = {pid for pid in _pids() if _is_server(pid)}
    for pidfile in layout.STATE_RUN.glob("*.pid") if layout.STATE_RUN.is_dir() else []:
        try:
            pid = int(pidfile.read_text().strip())
        except (OSError, ValueError):
            continue
        if _is_server(pid):
            found.add(pid)
    return sorted(found)


def _launcher_pids() -> list[int]:
    found = []
    for pidfile in layout.STATE_HOSTS.glob("*/pid") if layout.STATE_HOSTS.is_dir() else []:
        try:
            found.append(int(pidfile.read_text().strip()))
        except (OSError, ValueError):
            continue
    return found


def our_mounts() -> list[str]:
    """Mount points under the state directory, deepest first."""
    prefix = str(layout.STATE_DIR) + "/"
    points = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        point = line.split()[1].replace("\\040", " ")
        if point.startswith(prefix):
            points.append(point)
    return sorted(points, key=len, reverse=True)


def our_netns() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return [name for name in names if name.startswith(layout.NETNS_PREFIX)]


def our_links() -> list[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    names = [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]
    return [n for n in names if n == layout.BRIDGE or n.startswith(layout.VETH_PREFIX)]


def our_cgroups() -> list[Path]:
    """Host cgroups left in the name=systemd and unified hierarchies, deepest first."""
    found: list[Path] = []
    tag = layout.CGROUP_PREFIX + layout.HOST_PREFIX
    for root in CGROUP_ROOTS:
        if not root.is_dir():
            continue
        for dirpath, dirnames, _ in os.walk(root):
            for name in dirnames:
                if name.startswith(tag):
                    top = Path(dirpath) / name
                    found.extend(Path(d) for d, _, _ in os.walk(top, topdown=False))
            dirnames[:] = [d for d in dirnames if not d.startswith(tag)]
    return found


def _kill_all(pids_of: Any, deadline: float) -> list[int]:
    """SIGKILL what pids_of() returns until nothing is left or the deadline passes."""
    left: list[int] = pids_of()
    while left and time.monotonic() < deadline:
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
        left = pids_of()
    return left


# --- clear / down -------------------------------------------------------------------------------
# Each host's systemd (PID 1, journald, logind, the .path units) holds inotify instances, all
# counted against root's fs.inotify.max_user_instances (128 on Debian): past about 20 hosts,
# systemd's path units fail and sshd never starts. ``lab up`` raises the limit for its hosts and
# keeps the machine's value, which ``clear()`` (so ``lab down``) puts back.
INOTIFY_INSTANCES = Path("/proc/sys/fs/inotify/max_user_instances")
INOTIFY_PER_HOST = 8  # about 6 seen per host


def raise_sysctls(hosts: int) -> None:
    """Raise the machine limits ``hosts`` lab hosts need; their old values go to SYSCTL_SAVED."""
    try:
        current = int(INOTIFY_INSTANCES.read_text())
    except (OSError, ValueError):
        return
    want = 64 + INOTIFY_PER_HOST * hosts  # and what the machine's own processes hold
    if current >= want:
        return
    layout.SYSCTL_SAVED.write_text(json.dumps({str(INOTIFY_INSTANCES): current}) + "\n")
    INOTIFY_INSTANCES.write_text(f"{want}\n")


def restore_sysctls() -> None:
    """Put back what :func:`raise_sysctls` raised."""
    try:
        saved = json.loads(layout.SYSCTL_SAVED.read_text())
    except (OSError, ValueError):
        return
    for path, value in saved.items():
        if path == str(INOTIFY_INSTANCES):
            INOTIFY_INSTANCES.write_text(f"{int(value)}\n")
    layout.SYSCTL_SAVED.unlink()


def clear() -> None:
    """Remove everything of an earlier lab (running or crashed): processes, mounts, namespaces,
    links, cgroups and the state directory. Raises LabError when something cannot be removed."""
    deadline = time.monotonic() + 20
    for pid in _launcher_pids():  # stop the boot loops first, so no host comes back
        if HOST_CGROUP.search(_read(f"/proc/{pid}/cgroup")):
            _signal(pid, signal.SIGKILL)
    left = _kill_all(lambda: sorted(set(host_pids()) | set(server_pids())), deadline)
    if left:
        raise LabError(f"lab processes do not die: {' '.join(map(str, left))}")
    for point in our_mounts():
        if subprocess.run(["umount", point], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", point], capture_output=True)
    for name in our_netns():
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
    for link in our_links():
        subprocess.run(["ip", "link", "del", link], capture_output=True)
    for cgroup in our_cgroups():
        try:
            cgroup.rmdir()
        except OSError:
            pass
    problems = []
    if our_mounts():
        problems.append("mounts " + " ".join(our_mounts()))
    if our_netns():
        problems.append("namespaces " + " ".join(our_netns()))
    if our_links():
        problems.append("links " + " ".join(our_links()))
    if our_cgroups():
        problems.append("cgroups " + " ".join(map(str, our_cgroups())))
    if problems:
        raise LabError("cannot clear the earlier lab: " + "; ".join(problems))
    restore_sysctls()  # the hosts that needed them are gone
    if layout.STATE_DIR.exists():
        shutil.rmtree(layout.STATE_DIR)


def down() -> None:
    """Stop and remove the whole lab (the caches stay)."""
    check_can_run()
    clear()


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


# --- servers ------------------------------------------------------------------------------------
def _start_server(name: str, args: list[str], port: int) -> dict[str, Any]:
    log = layout.STATE_LOGS / f"{name}.log"
    pidfile = layout.STATE_RUN / f"{name}.pid"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                layout.SERVER_MODULE,
                *args,
                "--name",
                name,
                "--bind",
                layout.BRIDGE_IP,
                "--port",
                str(port),
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    pidfile.write_text(f"{proc.pid}\n")
    return {"pid_file": str(pidfile), "log": str(log), "port": port, "_proc": proc}


def _wait_port(port: int, proc: subprocess.Popen[bytes], name: str, log: str) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise LabError(f"lab server {name} exited with {proc.returncode}; see {log}")
        try:
            socket.create_connection((layout.BRIDGE_IP, port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise LabError(f"lab server {name} does not listen on {layout.BRIDGE_IP}:{port}; see {log}")


def start_servers(
    artifacts: Path, secret_files: dict[str, str], indexes: Path | None = None
) -> dict[str, dict[str, Any]]:
    """Start every lab server on the bridge address; return their state entries.

    + artifacts: the built lab artifacts (index/, files/)
    + secret_files: the credential files by variable name
    + indexes: the directory of the index directories served (default: artifacts/index)
    """
    indexes = indexes or artifacts / "index"
    basic = [
        "--user-file",
        secret_files["RBLN_INDEX_USER"],
        "--password-file",
        secret_files["RBLN_INDEX_PASSWORD"],
    ]
    specs: dict[str, tuple[list[str], int, str, str]] = {
        "index_private": (
            ["simple", str(indexes / "private"), *basic],
            layout.PORT_INDEX_PRIVATE,
            "/simple/",
            "basic RBLN_INDEX_USER:RBLN_INDEX_PASSWORD",
        ),
        "index_vllm": (
            ["simple", str(indexes / "vllm")],
            layout.PORT_INDEX_VLLM,
            "/simple/",
            "none",
        ),
        "index_torch": (
            ["simple", str(indexes / "torch")],
            layout.PORT_INDEX_TORCH,
            "/simple/",
            "none",
        ),
        "index_public": (
            ["simple", str(indexes / "public")],
            layout.PORT_INDEX_PUBLIC,
            "/simple/",
            "none",
        ),
        "index_assets": (
            ["simple", str(indexes / "assets")],
            layout.PORT_INDEX_ASSETS,
            "/simple/",
            "none",
        ),
        "apt": (["static", str(layout.STATE_APT)], layout.PORT_APT, "/", "none"),
        "files": (
            [
                "static",
                str(artifacts / "files"),
                "--token-file",
                secret_files["HF_TOKEN"],
                "--token-path",
                "/models/",
            ],
            layout.PORT_FILES,
            "/",
            "bearer HF_TOKEN on /models/",
        ),
        "hub": (
            ["hub", str(artifacts / "files" / "models"), "--token-file", secret_files["HF_TOKEN"]],
            layout.PORT_HUB,
            "",
            "bearer HF_TOKEN (every model gated)",
        ),
    }
    servers = {}
    for name, (args, port, path, auth) in specs.items():
        entry = _start_server(name, args, port)
        entry.update(url=layout.url(port, path), auth=auth)
        servers[name] = entry
    for name, entry in servers.items():
        _wait_port(entry["port"], entry.pop("_proc"), name, entry["log"])
    return servers


# --- hosts --------------------------------------------------------------------------------------
def _keygen(kind: str, path: Path, comment: str) -> str:
    _run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", comment, "-f", str(path)], "ssh-keygen")
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


def _prepare_host(host: dict[str, Any], pubkey: str, sim: Path, compile_seconds: float) -> str:
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
        _keygen(kind, extra / "etc/ssh" / f"ssh_host_{kind}_key", f"root@{host['name']}")
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


def _wait_running(ssh: dict[str, str], host: dict[str, Any], deadline: float) -> str:
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


def _new_secret_files() -> dict[str, str]:
    layout.STATE_SECRETS.mkdir(mode=0o700, parents=True)
    layout.STATE_SECRETS.chmod(0o700)
    values = {
        "RBLN_INDEX_USER": f"lab-{secrets.token_hex(3)}",
        # shell metacharacters and '#': every deploy test proves they survive (whitespace,
        # quotes and backslashes no netrc reads alike: settings refuses them, #18 finding 10)
        "RBLN_INDEX_PASSWORD": secrets.token_urlsafe(18) + "#h$!;&|<>(*)`",
        "HF_TOKEN": "hf_lab" + secrets.token_hex(16),
        # serve_router fleet: the key the serving hosts drain the routers with
        "SERVEFLEET_ROUTER_ADMIN_KEY": "lab-admin-" + secrets.token_hex(16),
    }
    files = {}
    for name, value in values.items():
        path = layout.STATE_SECRETS / name.lower().replace("_", "-")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(value + "\n")
        files[name] = str(path)
    return files


def _check_odd(
    option: str, odd: dict[str, str], names: list[str], what: str, allowed: list[str]
) -> None:
    """``--odd-*`` HOST=VALUE pairs name hosts of the lab and known values (one-line errors)."""
    for name, value in odd.items():
        if name not in names:
            raise LabError(f"{option} names host {name!r}; the lab has {', '.join(names)}")
        if value not in allowed:
            raise LabError(
                f"{option} {name}={value}: unknown {what}; allowed: {', '.join(allowed)}"
            )


def plan_hosts(
    count: int,
    devices: int,
    odd_skus: dict[str, str],
    hardware: str = layout.DEFAULT_HARDWARE,
    odd_hardware: dict[str, str] | None = None,
    base: str = DEFAULT_SUITE,
    odd_base: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """The hosts of a lab: names, addresses, hardware, SKU, device count and Debian base
    (checked lab settings). An RBLN host (``cr13``) has ``devices`` NPUs of its SKU; a GPU host
    has its profile's GPUs (``sku``: their name, ``devices``: their count). ``base`` is the
    host's Debian suite, ``glibc`` and ``python`` its versions.

    + count: number of hosts (1..40)
    + devices: simulated NPUs per RBLN host
    + odd_skus: host name -> SKU for RBLN hosts that are not RBLN-CR13
    + hardware: the hardware of every host (``cr13`` or ``h200``)
    + odd_hardware: host name -> hardware (``cr13``, ``h100``, ``h200``) for hosts that differ
    + base: the Debian suite of every host (``bookworm``: glibc 2.36, ``trixie``: glibc 2.41)
    + odd_base: host name -> suite for hosts that differ
    + groups: more inventory groups -> their hosts (``router``: ``serve_router = "fleet"``;
      a role's group: ``serve_roles``)
    """
    if not 1 <= count <= 40:
        raise LabError(f"--hosts must be between 1 and 40, not {count}")
    if not 1 <= devices <= 16:
        raise LabError(f"--devices must be between 1 and 16, not {devices}")
    if hardware not in layout.LAB_HARDWARE:
        raise LabError(
            f"--hardware {hardware}: unknown hardware; allowed: {', '.join(layout.LAB_HARDWARE)}"
        )
    names = [f"{layout.HOST_PREFIX}{i}" for i in range(1, count + 1)]
    odd_hardware = odd_hardware or {}
    _check_odd("--odd-hardware", odd_hardware, names, "hardware", list(layout.HARDWARE))
    kinds = {name: odd_hardware.get(name, hardware) for name in names}
    if base not in SUITES:
        raise LabError(f"--base {base}: unknown base; allowed: {', '.join(SUITES)}")
    odd_base = odd_base or {}
    _check_odd("--odd-base", odd_base, names, "base", list(SUITES))
    suites = {name: odd_base.get(name, base) for name in names}
    _check_odd("--odd-sku", odd_skus, names, "SKU", sorted(layout.SKU_PCI_DEVICE))
    for name, sku in odd_skus.items():
        if kinds[name] != layout.RBLN_HARDWARE:
            raise LabError(
                f"--odd-sku {name}={sku}: {name} is a GPU host ({kinds[name]}), not an RBLN one"
            )
    hosts = []
    for i, name in enumerate(names, start=1):
        kind = kinds[name]
        if kind == layout.RBLN_HARDWARE:
            sku = odd_skus.get(name, layout.DEFAULT_SKU)
            card = {"sku": sku, "pci_device": layout.SKU_PCI_DEVICE[sku], "devices": devices}
        else:
            profile = layout.GPU_PROFILES[kind]
            card = {
                "sku": profile["name"],
                "pci_device": profile["pci_device"],
                "devices": profile["gpus"],
            }
        hosts.append(
            {
                "name": name,
                "address": layout.host_ip(i),
                "hardware": kind,
                **card,
                "netns": layout.NETNS_PREFIX + name,
                "base": suites[name],
                "glibc": SUITES[suites[name]][0],
                "python": SUITES[suites[name]][1],
            }
        )
    return hosts


def host_groups(hosts: Sequence[dict[str, Any]]) -> dict[str, list[str]]:
    """The lab's inventory groups: ``lab`` (every host), then one per hardware present.

    + hosts: the planned hosts
    """
    groups = {"lab": [h["name"] for h in hosts]}
    for kind in layout.HARDWARE:
        members = [h["name"] for h in hosts if h["hardware"] == kind]
        if members:
            groups[kind] = members
    return groups


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


def store_models(state: dict[str, Any]) -> dict[str, dict[str, str]]:
    """What the running lab's model store serves: its manifest's entries (model -> sha256,
    revision, path), fetched as a host fetches them (with the HF token).

    + state: the lab state
    """
    url = state["model_store"]["url"] + "manifest.json"
    token_file = state["secrets"]["HF_TOKEN"]
    try:
        token = Path(token_file).read_text().strip()
        code, _, body = fetch(url, {"Authorization": f"Bearer {token}"}, timeout=10)
    except OSError as exc:
        raise LabError(f"cannot read the model store's manifest {url}: {exc}") from None
    if code in (401, 403):
        raise LabError(f"the model store refused the token in {token_file} ({code})")
    if code != 200:
        raise LabError(f"the model store answered {code} for {url}")
    try:
        models = json.loads(body)["models"]
    except (ValueError, KeyError, TypeError):
        raise LabError(f"{url} is not a model store manifest") from None
    return dict(models)


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
    + offline: hosts whose new connections to the lab's servers are rejected (servefleet.lab.offline)
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

    _run(["ip", "link", "add", layout.BRIDGE, "type", "bridge"], "creating the bridge")
    _run(
        ["ip", "addr", "add", f"{layout.BRIDGE_IP}/{layout.PREFIX}", "dev", layout.BRIDGE],
        "addressing the bridge",
    )
    _run(["ip", "link", "set", layout.BRIDGE, "up"], "bringing the bridge up")

    secret_files = _new_secret_files()
    serving_copy(artifacts / "index", layout.STATE_INDEX)
    servers = start_servers(artifacts, secret_files, layout.STATE_INDEX)
    log(f"servers up on {layout.BRIDGE_IP} ({time.monotonic() - t0:.1f} s)")

    ssh = {
        "user": "root",
        "key": str(layout.STATE_SSH / "id_ed25519"),
        "known_hosts": str(layout.STATE_SSH / "known_hosts"),
    }
    pubkey = _keygen("ed25519", Path(ssh["key"]), "servefleet-lab")
    known = [_prepare_host(h, pubkey, sim, compile_seconds) for h in plan]
    Path(ssh["known_hosts"]).write_text("\n".join(known) + "\n")
    for h in plan:
        hostdir = layout.STATE_HOSTS / h["name"]
        _run(
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
    deadline = time.monotonic() + BOOT_TIMEOUT
    with ThreadPoolExecutor(max_workers=min(8, len(plan))) as pool:
        states = list(pool.map(lambda h: _wait_running(ssh, h, deadline), plan))
    bad = [f"{h['name']}: {s}" for h, s in zip(plan, states, strict=True) if s != "running"]
    if bad:
        raise LabError(
            f"lab hosts did not boot ({'; '.join(bad)}); see the console logs under "
            f"{layout.STATE_HOSTS}; `servefleet lab down` removes the lab"
        )
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
