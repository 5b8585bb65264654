"""Bench (not a test): wall time of `servefleet lab up` cold (no cache: base image built with
mmdebstrap, the simulator's artifacts built) and warm (everything cached), for 1, 3 and 8
hosts, and of `servefleet lab down`. Needs root; removes the lab cache for the cold runs and
leaves the machine with the lab down.

    sudo .venv/bin/python bench/bench_lab.py [--hosts 1,3,8] [--warm-runs 2]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time

from servefleet.fleet.lab import layout


def _timed(*args: str) -> float:
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "servefleet", "lab", *args], capture_output=True, text=True
    )
    elapsed = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"servefleet lab {' '.join(args)} failed:\n{proc.stderr}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="1,3,8", help="comma-separated host counts")
    parser.add_argument("--warm-runs", type=int, default=2, help="warm runs per count (median)")
    args = parser.parse_args()
    counts = [int(n) for n in args.hosts.split(",")]
    rows = []
    try:
        for n in counts:
            _timed("down")
            shutil.rmtree(layout.CACHE_DIR, ignore_errors=True)
            cold = _timed("up", "--hosts", str(n))
            warm = statistics.median(_timed("up", "--hosts", str(n)) for _ in range(args.warm_runs))
            down = _timed("down")
            rows.append((n, cold, warm, down))
            print(
                f"  {n} hosts: cold {cold:.1f} s, warm {warm:.1f} s, down {down:.1f} s",
                file=sys.stderr,
                flush=True,
            )
    finally:
        _timed("down")
    base_warm = rows[0][2]
    print(
        f"{'hosts':>5} | {'up cold (s)':>11} | {'up warm (s)':>11} | {'cold/warm':>9} | "
        f"{'warm vs ' + str(rows[0][0]) + ' host':>15} | {'down (s)':>8}"
    )
    print(
        "-" * 5
        + "-+-"
        + "-" * 11
        + "-+-"
        + "-" * 11
        + "-+-"
        + "-" * 9
        + "-+-"
        + "-" * 15
        + "-+-"
        + "-" * 8
    )
    for n, cold, warm, down in rows:
        print(
            f"{n:>5} | {cold:>11.1f} | {warm:>11.1f} | {cold / warm:>8.1f}x | "
            f"{warm / base_warm:>14.2f}x | {down:>8.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
