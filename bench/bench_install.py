"""Bench (not a test): the release install step on a lab host, with uv vs pip, same plan and
pins, both with cold caches: wall time of ``install_release.py`` and the ratio. Needs root;
brings a 1-host lab up, deploys once (for the host's lib and plan), and leaves the lab down.

    .venv/bin/python bench/bench_install.py [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from labbench import REPO, lab, lab_env

PYINFRA = str(Path(sys.executable).parent / "pyinfra")


def install(plan: dict, installer: str, n: int) -> float:
    """One cold install of ``plan`` with ``installer`` into a scratch release; its seconds."""
    trial = {**plan, "installer": installer, "path": f"/opt/servefleet/bench/{installer}-{n}"}
    text = json.dumps(trial).replace("'", "'\"'\"'")
    script = (
        "rm -rf /root/.cache/uv /root/.cache/pip /opt/servefleet/bench && mkdir -p /opt/servefleet/bench && "
        f"printf '%s' '{text}' > /tmp/bench-plan.json && "
        "s=$(date +%s%N) && python3 /opt/servefleet/lib/install_release.py /tmp/bench-plan.json "
        ">/tmp/bench-install.log 2>&1 && e=$(date +%s%N) && echo $(( (e - s) / 1000000 ))"
    )
    out = lab("ssh", "lab1", script).strip().splitlines()[-1]
    return int(out) / 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="installs per installer (median)")
    args = parser.parse_args()
    try:
        lab("up", "--hosts", "1")
        proc = subprocess.run([PYINFRA, "-y", "inventories/lab.py", "deploys/serve.py"], cwd=REPO,
                              env=lab_env(), capture_output=True, text=True)  # fmt: skip
        if proc.returncode != 0:
            raise SystemExit(f"deploy failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        current = lab("ssh", "lab1", "readlink /opt/servefleet/current").strip().split("/")[-1]
        plan = json.loads(lab("ssh", "lab1", f"cat /opt/servefleet/plans/{current}.json"))
        times = {inst: [install(plan, inst, n) for n in range(args.runs)] for inst in ("pip", "uv")}
        lab("ssh", "lab1", "rm -rf /opt/servefleet/bench")
    finally:
        lab("down")
    pip, uv = statistics.median(times["pip"]), statistics.median(times["uv"])
    print("Release install on a fresh lab host (cold caches, same plan and pins):\n")
    print("| installer | install (s) | vs pip |")
    print("|---|---|---|")
    print(f"| pip | {pip:.2f} | 1.00x |")
    print(f"| uv | {uv:.2f} | {uv / pip:.2f}x ({pip / uv:.1f}x faster) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
