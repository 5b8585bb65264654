"""Bench (not a test): the canary analysis of ``servefleet rollout --analysis`` on a 3-host lab.
Every trial rolls the same warm change out from a default deploy (``serve_target=Throughput``,
``--canary 1``: lab1, then lab2 and lab3), the lab's token rate lowered to 100 tokens/s and the
probe at one request in flight (as tests/hosts/test_canary_analysis.py: the change is then
equal in the simulator's timing model), and the fleet is deployed back to its default after a
trial that promoted. It measures:

- the analysis' added time per rollout: the median wall time of the equal rollouts with
  ``--analysis`` less that of as many without (and the probe's own time, from the JSON);
- false alarms over ``--runs`` equal rollouts: those the analysis halted;
- detection over ``--runs`` rollouts at 10 %, 20 % and 30 % slower: lab1's new servers made
  that much slower by ``/etc/rbln-sim/slowdown`` (``1.1 --max-num-seqs 8``, ...): those halted.

Needs root; leaves the lab down. Prints a Markdown table (docs/benchmarks.md).

``--synthetic`` needs no lab: the rule alone on ``--trials`` seeded synthetic probes
(:func:`servefleet.fleet.analysis.stats.alarm_rate`: lognormal TTFTs and gaps, 40 requests a
side, 64 tokens, the default thresholds), equal and 10/20/30 % slower.

    .venv/bin/python bench/bench_analysis.py [--runs 20] [--slow-runs N] [--requests 24]
    .venv/bin/python bench/bench_analysis.py --synthetic [--trials 1000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from typing import Any

from labbench import BIN, REPO, lab, lab_env, timed

HOSTS = ("lab1", "lab2", "lab3")
SLOWER = "--max-num-seqs 8"  # in the Throughput command line only (Latency's: --max-num-seqs 1)
SLOWDOWN, RATE = "/etc/rbln-sim/slowdown", "/etc/rbln-sim/tokens-per-second"
DEPLOY = [str(BIN / "pyinfra"), "-y", "inventories/lab.py", "deploys/serve.py"]


def on(host: str, command: str) -> None:
    lab("ssh", host, command)


def rollout(requests: int, analysis: bool) -> tuple[float, dict[str, Any]]:
    """One rollout of the change (with --analysis or not): its wall time and --json result."""
    load = {"requests": requests, "concurrency": 1, "prompt_tokens": 64, "output_tokens": 24,
            "timeout": 120, "request_timeout": 20}  # fmt: skip
    cmd = [str(BIN / "servefleet"), "rollout", "inventories/lab.py", "--yes", "--canary", "1",
           "--json", *(["--analysis"] if analysis else []), "--",
           "--data", "serve_target=Throughput", "--data", f"rollout_analysis={json.dumps(load)}"]  # fmt: skip
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, env=lab_env(), capture_output=True, text=True)
    took = time.monotonic() - start
    try:
        result = json.loads(proc.stdout)
    except ValueError:
        raise SystemExit(f"rollout printed no JSON (exit {proc.returncode}):\n"
                         f"{proc.stderr[-3000:]}") from None  # fmt: skip
    if proc.returncode not in (0, 1) or (proc.returncode == 1 and not analysis):
        raise SystemExit(f"rollout failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return took, result


def trial(requests: int, factor: float | None) -> tuple[bool, float, float]:
    """One analysed rollout, lab1's change ``factor`` times slower (None: equal): whether it
    halted, the rollout's wall time and the probe's time. The lab is back on its default after."""
    if factor:
        on("lab1", f"echo '{factor} {SLOWER}' > {SLOWDOWN}")
    try:
        took, result = rollout(requests, analysis=True)
    finally:
        on("lab1", f"rm -f {SLOWDOWN}")
    report = result["lab1"].get("analysis") or {}
    halted = result["lab1"]["result"] == "failed"
    if not halted:
        timed(DEPLOY)  # the default again, for the next trial
    return halted, took, float(report.get("took_s") or 0.0)


def synthetic(trials: int) -> int:
    """The rule's false alarms and detection on synthetic probes: a Markdown table."""
    from servefleet.fleet.analysis.stats import alarm_rate
    from servefleet.settings.check_analysis import ANALYSIS

    print(f"| the canary | halted of {trials} | failed measures (count) |")
    print("|---|---|---|")
    for slower in (0.0, 0.1, 0.2, 0.3):
        rate, each = alarm_rate(trials, slower, ANALYSIS)
        what = f"{slower:.0%} slower" if slower else "equal"
        print(f"| {what} | {rate:.1%} | {', '.join(f'{k} {v}' for k, v in sorted(each.items()))} |")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="trials of each condition")
    parser.add_argument(
        "--slow-runs", type=int, default=None, help="trials of each slower one (default: --runs)"
    )
    parser.add_argument("--requests", type=int, default=24, help="the probe's requests a side")
    parser.add_argument("--synthetic", action="store_true", help="the rule alone, no lab")
    parser.add_argument("--trials", type=int, default=1000, help="--synthetic: trials of each")
    args = parser.parse_args()
    if args.synthetic:
        return synthetic(args.trials)
    rows = []
    try:
        lab("up", "--hosts", "3")
        timed(DEPLOY)
        for host in HOSTS:
            on(host, f"echo 100 > {RATE}")
        rollout(args.requests, analysis=False)  # the change's compile, warm before the clock
        timed(DEPLOY)
        plain = []
        for _ in range(min(5, args.runs)):
            plain.append(rollout(args.requests, analysis=False)[0])
            timed(DEPLOY)
        equal = [trial(args.requests, None) for _ in range(args.runs)]
        with_analysis = [t for halted, t, _ in equal if not halted]
        probe = [p for _, _, p in equal if p]
        added = statistics.median(with_analysis) - statistics.median(plain) if with_analysis else 0
        rows.append(("equal (false alarms)", sum(h for h, _, _ in equal), len(equal)))
        for factor in (1.1, 1.2, 1.3):
            slow = [trial(args.requests, factor) for _ in range(args.slow_runs or args.runs)]
            rows.append(
                (f"{factor - 1:.0%} slower (detected)", sum(h for h, _, _ in slow), len(slow))
            )
    finally:
        lab("down")
    print("| the canary's change | halted | of |")
    print("|---|---|---|")
    for what, n, of in rows:
        print(f"| {what} | {n} | {of} |")
    print()
    print(f"rollout without --analysis: median {statistics.median(plain):.1f} s of {len(plain)}; "
          f"with: {statistics.median(with_analysis) if with_analysis else 0:.1f} s "
          f"(added {added:.1f} s; the probe itself {statistics.median(probe or [0]):.1f} s, "
          f"{args.requests} requests a side, one at a time)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
