"""Bench (not a test): the SDK upgrade 0.12.0 -> 0.12.1 (every 0.12.0 pin moves) on 1 and 8 lab
hosts, with the pip installer (before) and uv (after): wall time of the whole ``pyinfra -y
inventories/lab.py deploys/serve.py`` run and its ratios (uv vs pip, 8 hosts vs 1 host), and
where the time goes, read from the hosts (the installer: the new release's venv to its completion
marker; the restarts: four units one at a time through the health gate). Each trial starts from
a fresh lab served on 0.12.0 by the same installer (not timed: a host that served before, with
that installer's caches). A run counts only when every host reads back afterwards a new serving
release whose 0.12.x packages are all 0.12.1, every server restarted on it and answering a chat,
and no compile. A trial in which pyinfra loses a host's SSH connection runs again on a fresh lab
(it happens now and then on 8 hosts; the output counts them). Needs root; leaves the lab down.

    .venv/bin/python bench/bench_upgrade.py [--hosts 1,8] [--runs 1] [--compile-seconds 0.5]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from labbench import BIN, REPO, lab, lab_env

OLD, NEW = "0.12.0", "0.12.1"
INSTALLERS = ("pip", "uv")  # before, after

# Runs on a lab host (python3 -): the serving release, its installed versions and install
# times, each server unit's main process and start, and the compiles so far. Hosts and
# controller share this machine's clock.
READBACK = r"""
import glob, json, os, re, subprocess, time
cur = os.path.realpath("/opt/servefleet/current")
out = {"release": cur, "units": []}
code = "import importlib.metadata as m, json; print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"
out["versions"] = json.loads(subprocess.run([cur + "/bin/python", "-c", code], capture_output=True, text=True, check=True).stdout)
marker = cur + "/.servefleet-release.json"
out["pins"] = json.load(open(marker))["pins"]
out["install"] = [os.stat(cur + "/pyvenv.cfg").st_mtime, os.stat(marker).st_mtime]
offset = time.time() - time.monotonic()
for path in sorted(glob.glob("/etc/systemd/system/servefleet-vllm-*.service"), key=lambda p: int(re.findall(r"\d+", p)[-1])):
    unit = os.path.basename(path)
    show = subprocess.run(["systemctl", "show", "-p", "ActiveState", "-p", "MainPID", "-p", "ExecMainStartTimestampMonotonic", "-p", "InvocationID", unit], capture_output=True, text=True).stdout
    props = dict(line.split("=", 1) for line in show.splitlines() if "=" in line)
    pid = props.get("MainPID", "0")
    try:
        cmdline = open(f"/proc/{pid}/cmdline").read().split("\0") if pid != "0" else []
    except OSError:
        cmdline = []
    port = cmdline[cmdline.index("--port") + 1] if "--port" in cmdline else None
    started = offset + int(props.get("ExecMainStartTimestampMonotonic") or 0) / 1e6
    journal = subprocess.run(["journalctl", "-o", "short-unix", "--no-pager", "_SYSTEMD_INVOCATION_ID=" + props.get("InvocationID", "")], capture_output=True, text=True).stdout
    listening = [float(line.split()[0]) for line in journal.splitlines() if "Starting vLLM API server" in line]
    out["units"].append({"unit": unit, "active": props.get("ActiveState"), "port": port, "started": started,
                         "listening": listening[0] if listening else None,
                         "in_release": any(w.startswith(cur + "/") for w in cmdline)})
try:
    out["compiles"] = len(open("/var/log/rbln-sim/compile.log").read().splitlines())
except OSError:
    out["compiles"] = 0
print(json.dumps(out))
"""


class SshDropped(Exception):
    """pyinfra lost a host's SSH connection mid-run ("Command socket/SSH error"): the trial is
    void and runs again on a fresh lab."""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(version: str) -> list[str]:
    """The default pins with every 0.12.x SDK package at ``version`` (the rest unchanged)."""
    from servefleet.settings.table import load_defaults

    return [p.replace(f"=={OLD}", f"=={version}") for p in load_defaults()["sdk_pins"]]


def deploy(installer: str, version: str) -> float:
    data = [
        "--data",
        f"sdk_installer={installer}",
        "--data",
        f"sdk_pins={json.dumps(pins(version))}",
    ]
    start = time.monotonic()
    proc = subprocess.run([str(BIN / "pyinfra"), "-y", *data, "inventories/lab.py", "deploys/serve.py"],
                          cwd=REPO, env=lab_env(), capture_output=True, text=True)  # fmt: skip
    elapsed = time.monotonic() - start
    if proc.returncode != 0:
        log = Path(tempfile.mkdtemp(prefix="bench-upgrade-")) / "deploy.log"
        log.write_text(proc.stdout + proc.stderr)
        errors = [
            line for line in log.read_text().splitlines() if "rror" in line or "ailed" in line
        ]
        if any("socket/SSH error" in line for line in errors):
            raise SshDropped(f"deploy ({installer}, {version}): {errors[0].strip()} ({log})")
        raise SystemExit(f"deploy ({installer}, {version}) failed (whole output: {log}):\n"
                         + "\n".join(errors[-40:]))  # fmt: skip
    return elapsed


def readback(state: dict[str, Any], host: dict[str, Any]) -> dict[str, Any]:
    from servefleet.fleet.lab.hosts import ssh_command

    proc = subprocess.run(ssh_command(state, host["name"], ["python3", "-"]), input=READBACK,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"{host['name']}: read-back failed:\n{proc.stdout}\n{proc.stderr}")
    got: dict[str, Any] = json.loads(proc.stdout)
    return got


def check_serving(state: dict[str, Any], host: dict[str, Any], version: str,
                  since: float | None = None) -> dict[str, Any]:  # fmt: skip
    """The host's read-back, after checking that it serves ``version``: every 0.12.x pin of its
    serving release is ``version``, installed, and every server runs from that release, (when
    ``since`` is given) started after ``since``, and answers a chat."""
    from servefleet.fleet.lab.chat import chat_once

    got = readback(state, host)
    name = host["name"]
    sdk = {canonical(p.split("==")[0]) for p in pins(OLD) if p.endswith(f"=={OLD}")}
    pinned = {canonical(k): v for k, v in got["pins"].items() if canonical(k) in sdk}
    installed = {canonical(k): v for k, v in got["versions"].items() if canonical(k) in sdk}
    if pinned.keys() != sdk or not {"rebel-compiler", "vllm-rbln"} <= installed.keys():
        raise SystemExit(f"{name}: the serving release lacks SDK packages: {got['pins']}")
    for pkg, want in pinned.items():  # the extras' packages are pinned, installed only if needed
        if want != version or installed.get(pkg, version) != version:
            raise SystemExit(f"{name}: {pkg} pinned {want}, installed {installed.get(pkg)}, "
                             f"not {version} ({got['release']})")  # fmt: skip
    if not got["units"]:
        raise SystemExit(f"{name}: no server units")
    for u in got["units"]:
        if u["active"] != "active" or not u["in_release"] or u["port"] is None:
            raise SystemExit(f"{name}: {u['unit']} does not serve from {got['release']}: {u}")
        if since is not None and u["started"] < since:
            raise SystemExit(f"{name}: {u['unit']} was not restarted by the upgrade")
        if not chat_once(
            host["address"], int(u["port"]), "openai/gpt-oss-120b", "hi", max_tokens=1
        ):
            raise SystemExit(f"{name}: {u['unit']} does not answer a chat")
    got["sdk"] = sorted(installed)
    return got


def trial(n: int, installer: str, compile_seconds: str) -> dict[str, Any]:
    """A fresh ``n``-host lab served on 0.12.0 with ``installer``, then the timed upgrade."""
    from servefleet.fleet.lab.state import load_state

    lab("up", "--hosts", str(n), "--compile-seconds", compile_seconds)
    state = load_state()
    deploy(installer, OLD)
    before = {h["name"]: check_serving(state, h, OLD) for h in state["hosts"]}
    t0 = time.time()
    elapsed = deploy(installer, NEW)
    t1 = time.time()
    after = {h["name"]: check_serving(state, h, NEW, since=t0) for h in state["hosts"]}
    hosts = []
    for name, got in after.items():
        if got["release"] == before[name]["release"]:
            raise SystemExit(f"{name}: still serves {got['release']}")
        i0, i1 = got["install"]
        starts = sorted(u["started"] for u in got["units"])
        hosts.append({
            "to_install": i0 - t0,  # pyinfra start, connect, probe, plan, uploads
            "install": i1 - i0,  # the installer, the release checks included
            "after_install": t1 - i1,  # models, units, restarts one at a time, state
            "restarts": len(starts),
            "restart_interval": (starts[-1] - starts[0]) / (len(starts) - 1) if len(starts) > 1 else 0.0,
            "server_start": statistics.mean(  # the unit's start to its server listening
                u["listening"] - u["started"] for u in got["units"]
            ) if all(u["listening"] for u in got["units"]) else float("nan"),
            "compiles": got["compiles"] - before[name]["compiles"],
            "sdk": got["sdk"],
        })  # fmt: skip
    return {"elapsed": elapsed, "hosts": hosts}


def mean(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.mean(r[key] for r in rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="1,8", help="comma-separated host counts")
    parser.add_argument(
        "--runs", type=int, default=1, help="trials per count and installer (median)"
    )
    parser.add_argument("--compile-seconds", default="0.5",
                        help="the simulator's compile time (only the untimed 0.12.0 deploy compiles)")  # fmt: skip
    args = parser.parse_args()
    counts = [int(x) for x in args.hosts.split(",")]
    results: dict[tuple[int, str], list[dict[str, Any]]] = {}
    dropped = 0
    try:
        for n in counts:
            for installer in INSTALLERS:
                for _ in range(args.runs):
                    for _attempt in range(3):
                        try:
                            r = trial(n, installer, args.compile_seconds)
                            break
                        except SshDropped as e:
                            dropped += 1
                            print(f"  {n} hosts, {installer}: {e}; again", file=sys.stderr)
                    else:
                        raise SystemExit("a host's SSH connection dropped in 3 trials in a row")
                    results.setdefault((n, installer), []).append(r)
                    h = r["hosts"]
                    print(f"  {n} hosts, {installer}: {r['elapsed']:.1f} s (to install "
                          f"{mean(h, 'to_install'):.1f}, install {mean(h, 'install'):.1f}, after "
                          f"{mean(h, 'after_install'):.1f}: {h[0]['restarts']} restarts, one every "
                          f"{mean(h, 'restart_interval'):.2f} s, listening after "
                          f"{mean(h, 'server_start'):.2f} s; compiles "
                          f"{sum(x['compiles'] for x in h)})", file=sys.stderr, flush=True)  # fmt: skip
    finally:
        lab("down")
    if any(x["compiles"] for rs in results.values() for r in rs for x in r["hosts"]):
        print("note: the upgrade compiled on some host (a patch upgrade should not)")
    if dropped:
        print(f"note: {dropped} trial(s) lost a host's SSH connection and ran again")
    sdk = next(iter(results.values()))[0]["hosts"][0]["sdk"]
    print(f"SDK upgrade {OLD} -> {NEW} ({', '.join(sdk)}), whole deploy run, "
          f"median of {args.runs}; phases are the mean of the hosts:\n")  # fmt: skip
    print("| hosts | installer | upgrade run (s) | vs pip | vs 1 host | to install (s) "
          "| install (s) | after install (s) | a restart + gate (s) | server start (s) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    wall = {k: statistics.median(r["elapsed"] for r in rs) for k, rs in results.items()}
    for (n, installer), rs in results.items():
        h = [x for r in rs for x in r["hosts"]]
        t = wall[(n, installer)]
        print(f"| {n} | {installer} | {t:.1f} | {t / wall[(n, 'pip')]:.2f}x "
              f"| {t / wall[(counts[0], installer)]:.2f}x | {mean(h, 'to_install'):.1f} "
              f"| {mean(h, 'install'):.1f} | {mean(h, 'after_install'):.1f} "
              f"| {mean(h, 'restart_interval'):.2f} | {mean(h, 'server_start'):.2f} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
