"""Bench (not a test): how the controller's cost grows with the fleet. Over 1, 8, 16 and 32 lab
hosts (light hosts: ``lab up --devices 1``, one simulated server each, same systemd and sshd):
the first deploy, a no-op, a rollout of a recompiling change (``--batch-size`` = all hosts,
fleet pre-warm: one compile), and ``servefleet status``. For each: wall time, the controller's
CPU time (user + system of the command and every process it waited for) and its peak memory,
and the per-host growth against 1 host. A first deploy that fails any host fails the bench.
Needs root; leaves the machine with the lab down.

    .venv/bin/python bench/bench_fleet.py [--hosts 1,8,16,32] [--devices 1] [--first-only]

``--first-only`` brings up a fresh lab per count and runs only the first deploy (issue #17's
"three fresh 16-host labs in a row": ``--hosts 16,16,16 --first-only``).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from typing import Any

from labbench import BIN, REPO, lab, lab_env

PYINFRA = [str(BIN / "pyinfra"), "-y", "inventories/lab.py", "deploys/serve.py"]
TARGETS = ("Throughput", "Latency")


def measure(cmd: list[str]) -> dict[str, Any]:
    """Run ``cmd`` from the repo root: wall s, CPU s (wait4's rusage: it and its waited-for
    children), peak RSS MiB, exit code and output."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO, env=lab_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {
        "wall": time.monotonic() - start,
        "cpu": usage.ru_utime + usage.ru_stime,
        "rss": usage.ru_maxrss / 1024,
        "rc": proc.returncode,
        "out": out,
    }


def checked(what: str, cmd: list[str]) -> dict[str, Any]:
    got = measure(cmd)
    if got["rc"] != 0:
        raise SystemExit(f"{what} exited {got['rc']}:\n{got['out'][-6000:]}")
    print(f"    {what}: {got['wall']:.1f} s, cpu {got['cpu']:.1f} s, {got['rss']:.0f} MiB",
          file=sys.stderr, flush=True)  # fmt: skip
    return got


def one_count(n: int, devices: int, first_only: bool, store: str) -> dict[str, dict[str, Any]]:
    print(f"  {n} hosts", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    lab("up", "--hosts", str(n), "--devices", str(devices))
    print(f"    lab up: {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)
    rows = {"first deploy": checked("first deploy", PYINFRA)}
    if first_only:
        return rows
    rows["no-op"] = checked("no-op", PYINFRA)
    rollout = [str(BIN / "servefleet"), "rollout", "inventories/lab.py", "--yes",
               "--batch-size", str(n), "--", "--data", f"serve_target={TARGETS[0]}",
               "--data", "serve_prewarm_scope=fleet", "--data", f"serve_prewarm_store={store}"]  # fmt: skip
    rows["recompiling rollout"] = checked("recompiling rollout", rollout)
    status = [str(BIN / "servefleet"), "status", "inventories/lab.py", "--", "--data",
              f"serve_target={TARGETS[0]}"]  # fmt: skip
    rows["status"] = checked("status", status)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="1,8,16,32", help="comma-separated host counts")
    parser.add_argument("--devices", type=int, default=1, help="simulated NPUs per host")
    parser.add_argument("--first-only", action="store_true", help="only the first deploy")
    args = parser.parse_args()
    counts = [int(x) for x in args.hosts.split(",")]
    results: list[tuple[int, dict[str, dict[str, Any]]]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-fleet-store-") as store:
            for n in counts:
                results.append((n, one_count(n, args.devices, args.first_only, store)))
    finally:
        lab("down")
    print(f"controller: {resource.getpagesize()} B pages; {os.cpu_count()} cores")
    print("| step | hosts | wall (s) | controller CPU (s) | peak RSS (MiB) | wall per host vs 1 |")
    print("|---|---|---|---|---|---|")
    first = dict(results[0][1]) if results and results[0][0] == 1 else {}
    for step in ("first deploy", "no-op", "recompiling rollout", "status"):
        for n, rows in results:
            if step not in rows:
                continue
            r = rows[step]
            base = first.get(step)
            growth = f"{(r['wall'] / base['wall']) / n:.2f}x" if base and n > 1 else "-"
            print(f"| {step} | {n} | {r['wall']:.1f} | {r['cpu']:.1f} | {r['rss']:.0f} | "
                  f"{growth} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
