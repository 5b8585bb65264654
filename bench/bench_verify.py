"""Bench (not a test): what the release check costs on the real vLLM wheels (#36). The venvs are
the real-wheel tier's (``tests/realvllm/build.py``: vLLM 0.30.0 with its CPU torch and every
dependency, and vllm-rbln beside it), built once and cached. For each: the install-time
manifest the marker records, the probe's cheap check (:func:`release_check.drift`, median of
``--runs``) on the untouched venv, and ``status --verify``'s full check (every listed file
read and hashed), as files and MB per second. The full check runs twice: cold (after dropping
the page cache, when run as root) and warm.

    .venv/bin/python bench/bench_verify.py [--runs 9]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [
    str(REPO / "src" / "servefleet" / "base" / "remote"),
    str(REPO / "tests" / "realvllm"),
]
import release_check  # noqa: E402
from build import build  # noqa: E402


def drop_caches() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=9, help="cheap checks timed (median)")
    args = parser.parse_args()
    root = build()
    print("| venv | distributions | files | directories | MB | marker (kB) | manifest (ms) "
          "| cheap check (ms) | --verify cold | --verify warm |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in ("upstream", "rbln"):
        venv = str(root / name)
        start = time.perf_counter()
        marker = release_check.manifest(venv)
        made = time.perf_counter() - start
        runs = []
        for _ in range(args.runs):
            start = time.perf_counter()
            lines = release_check.drift(venv, marker)
            runs.append(time.perf_counter() - start)
        assert lines == [], lines  # an untouched venv: no drift
        rates = []
        for cold in (True, False):
            dropped = drop_caches() if cold else False
            start = time.perf_counter()
            full = release_check.verify(venv, marker)
            took = time.perf_counter() - start
            assert full["differ"] == [], full["differ"]
            rate = f"{full['files'] / took:,.0f} files/s, {full['bytes'] / 1e6 / took:,.0f} MB/s"
            rates.append(rate if dropped or not cold else f"{rate} (cache not dropped)")
        dists = marker["dists"]
        files = sum(d.get("files", 0) for d in dists.values())
        size = sum(d.get("bytes", 0) for d in dists.values())
        print(f"| {name} | {len(dists)} | {files:,} | {len(marker['dirs']):,} | {size / 1e6:,.0f} "
              f"| {len(json.dumps(marker)) / 1e3:,.0f} | {made * 1e3:,.0f} "
              f"| {statistics.median(runs) * 1e3:.1f} | {rates[0]} | {rates[1]} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
