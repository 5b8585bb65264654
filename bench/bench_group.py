"""Bench (not a test): how long a rollout takes until a 2-host serving group serves again,
against a single-host instance of the same model. On a 2-host H200 lab, DeepSeek-V3.2 runs as
group g1 (``multi_node_tp_pp``: rank 0 on lab1, rank 1 headless on lab2), then alone on lab1
(``single_node_tp``); each is rolled out ``--runs`` times on a warm change (``--max-num-seqs``
flipped between two values), timed from the rollout's start until it exits, which is once the
gate (rank 0's ``/health`` and a chat) passed. The simulated load time is the same for both
(the simulator's fixed weight load). The ratio is the group's median over the single host's.
Needs root; leaves the lab down.

    .venv/bin/python bench/bench_group.py [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys

from labbench import BIN, lab, timed

RECIPE = "vllm/deepseek-ai/DeepSeek-V3.2"
BASE = ["--data", f"serve_recipe={RECIPE}", "--data", "serve_hardware=h200"]
GROUP = [*BASE, "--data", "serve_strategy=multi_node_tp_pp", "--data", "serve_group=g1"]
SINGLE = [*BASE, "--data", "serve_strategy=single_node_tp", "--limit", "lab1"]


def rollout(data: list[str], seqs: int) -> float:
    """One rollout of the change ``--max-num-seqs seqs``: its wall time."""
    change = ["--data", f'serve_extra_args=["--max-num-seqs", "{seqs}"]']
    return timed([str(BIN / "servefleet"), "rollout", "inventories/lab.py", "--yes", "--",
                  *data, *change])  # fmt: skip


def trials(data: list[str], runs: int) -> list[float]:
    rollout(data, 32)  # to the selection, warm, before the clock runs
    return [rollout(data, 64 if i % 2 == 0 else 32) for i in range(runs)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="timed rollouts of each (median)")
    args = parser.parse_args()
    try:
        lab("up", "--hosts", "2", "--hardware", "h200")
        group = trials(GROUP, args.runs)
        lab("up", "--hosts", "2", "--hardware", "h200")  # a fresh lab: lab2 holds no rank
        single = trials(SINGLE, args.runs)
    finally:
        lab("down")
    g, s = statistics.median(group), statistics.median(single)
    print("| what | rollout until serving again, median of", args.runs, "(s) | runs (s) |")
    print("|---|---|---|")
    print(f"| 2-host group (multi_node_tp_pp) | {g:.1f} | {', '.join(f'{t:.1f}' for t in group)} |")
    print(f"| 1 host (single_node_tp) | {s:.1f} | {', '.join(f'{t:.1f}' for t in single)} |")
    print(f"| ratio group / single host | {g / s:.2f} | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
