"""Bench (not a test): the release install step on a lab host, with uv vs pip, same plan and
pins, both with cold caches: wall time of ``install_release.py`` and the ratio. Needs root;
brings a 1-host lab up, deploys once (for the host's lib and plan), and leaves the lab down.

    .venv/bin/python bench/bench_install.py [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYINFRA = str(Path(sys.executable).parent / "pyinfra")


def _lab(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "servefleet", "lab", *args],
                          capture_output=True, text=True)  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"servefleet lab {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def _env() -> dict[str, str]:
    from servefleet.lab.state import load_state

    secrets = {k: Path(p).read_text().strip() for k, p in load_state()["secrets"].items()}
    return {**os.environ, **secrets, "PYINFRA_PROGRESS": "off"}


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
    out = _lab("ssh", "lab1", script).strip().splitlines()[-1]
    return int(out) / 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="installs per installer (median)")
    args = parser.parse_args()
    try:
        _lab("up", "--hosts", "1")
        proc = subprocess.run([PYINFRA, "-y", "inventories/lab.py", "deploys/serve.py"], cwd=REPO,
                              env=_env(), capture_output=True, text=True)  # fmt: skip
        if proc.returncode != 0:
            raise SystemExit(f"deploy failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        current = _lab("ssh", "lab1", "readlink /opt/servefleet/current").strip().split("/")[-1]
        plan = json.loads(_lab("ssh", "lab1", f"cat /opt/servefleet/plans/{current}.json"))
        times = {inst: [install(plan, inst, n) for n in range(args.runs)] for inst in ("pip", "uv")}
        _lab("ssh", "lab1", "rm -rf /opt/servefleet/bench")
    finally:
        _lab("down")
    pip, uv = statistics.median(times["pip"]), statistics.median(times["uv"])
    print("Release install on a fresh lab host (cold caches, same plan and pins):\n")
    print("| installer | install (s) | vs pip |")
    print("|---|---|---|")
    print(f"| pip | {pip:.2f} | 1.00x |")
    print(f"| uv | {uv:.2f} | {uv / pip:.2f}x ({pip / uv:.1f}x faster) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
