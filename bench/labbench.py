"""What the benchmarks share: run ``servefleet lab`` and give pyinfra the lab's credentials."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def lab(*args: str) -> str:
    """``servefleet lab ARGS``'s output; exits the bench with its error when it fails."""
    proc = subprocess.run([sys.executable, "-m", "servefleet", "lab", *args],
                          capture_output=True, text=True)  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"servefleet lab {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def lab_env() -> dict[str, str]:
    """This environment plus the lab's credentials (as `servefleet lab env` exports them)."""
    from servefleet.fleet.lab.state import load_state

    secrets = {k: Path(p).read_text().strip() for k, p in load_state()["secrets"].items()}
    return {**os.environ, **secrets, "PYINFRA_PROGRESS": "off"}


def timed(cmd: list[str]) -> float:
    """Run ``cmd`` in the repository with the lab's credentials; its wall time. Exits the bench
    with the tail of its output when it fails."""
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, env=lab_env(), capture_output=True, text=True)
    elapsed = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return elapsed
