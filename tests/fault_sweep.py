#!/usr/bin/env python3
"""Sweep every fault point: for N = 1..(operations of the change), SIGKILL the controller right
after the N-th operation starts, run again, and check that the fleet converged (every instance
runs the change, one compile per host for it, a third run changes nothing). Run it before a
release, on a running lab (`servefleet lab up`), from the repository root:

    .venv/bin/python tests/fault_sweep.py [--from N] [--to N]

The default test suite covers one point in each phase (tests/hosts/test_faults.py); this covers
all of them (about a minute each).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "hosts"))

from faults import (  # noqa: E402
    CHANGE,
    check_converged,
    compile_log,
    make_change_cold,
    op_names,
    run,
    run_killed,
)

from servefleet.fleet.lab.state import load_state  # noqa: E402

HOSTS = ["lab1", "lab2"]
LIMIT = [a for h in HOSTS for a in ("--limit", h)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--from", dest="first", type=int, default=1)
    ap.add_argument("--to", dest="last", type=int, default=0)
    a = ap.parse_args()
    state = load_state()
    assert run(state, *LIMIT).returncode == 0, "the default data does not deploy"
    make_change_cold(state, HOSTS)
    names = op_names(state, *LIMIT, *CHANGE)
    last = a.last or len(names)
    failures = 0
    for n in range(a.first, last + 1):
        before = {h: len(compile_log(state, h)) for h in HOSTS}
        started, killed = run_killed(state, *LIMIT, *CHANGE, at=lambda i, _name, n=n: i == n)
        label = f"N={n:3d} {started[-1] if started else '-'}"
        try:
            assert run(state, *LIMIT, *CHANGE).returncode == 0, "the run after the fault failed"
            check_converged(state, HOSTS, before, LIMIT)
            print(f"ok    {label}{'' if killed else ' (ended before the fault)'}", flush=True)
        except AssertionError as e:
            failures += 1
            print(f"FAIL  {label}: {str(e).splitlines()[0]}", flush=True)
        assert run(state, *LIMIT).returncode == 0
        make_change_cold(state, HOSTS)
    print(f"{last - a.first + 1 - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
