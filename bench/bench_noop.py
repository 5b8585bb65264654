"""Bench (not a test): the no-op run (a deploy after a converged one) on 1 and 8 lab hosts: wall
time, its ratio to 1 host, and remote commands per host (counted from `pyinfra -vvv`). Needs
root; brings labs up and leaves the machine with the lab down.

    .venv/bin/python bench/bench_noop.py [--hosts 1,8] [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from labbench import REPO, lab, lab_env

PYINFRA = str(Path(sys.executable).parent / "pyinfra")


def _deploy(*args: str) -> tuple[float, str]:
    start = time.monotonic()
    proc = subprocess.run([PYINFRA, "-y", *args, "inventories/lab.py", "deploys/serve.py"],
                          cwd=REPO, env=lab_env(), capture_output=True, text=True)  # fmt: skip
    elapsed = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"deploy failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return elapsed, proc.stdout + proc.stderr


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="1,8", help="comma-separated host counts")
    parser.add_argument("--runs", type=int, default=3, help="no-op runs per count (median)")
    args = parser.parse_args()
    rows = []
    try:
        for n in (int(x) for x in args.hosts.split(",")):
            lab("up", "--hosts", str(n))
            _deploy()
            noop = statistics.median(_deploy()[0] for _ in range(args.runs))
            _, verbose = _deploy("-vvv")
            commands = verbose.count(">>> ") / n
            rows.append((n, noop, commands))
            print(
                f"  {n} hosts: no-op {noop:.2f} s, {commands:.0f} remote commands a host",
                file=sys.stderr,
                flush=True,
            )
    finally:
        lab("down")
    base = rows[0][1]
    print("| hosts | no-op run (s) | vs 1 host | remote commands a host |")
    print("|---|---|---|---|")
    for n, noop, commands in rows:
        print(f"| {n} | {noop:.2f} | {noop / base:.2f}x | {commands:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
