"""Every fact's program runs under a deadline on the host (steps/facts.py, #46 item 5): a probe
that waited on a fifo the serve user planted hung ``plan``, ``status``, deploys and rollouts on
that host for ever. Past its deadline ``timeout`` ends the program's whole process group (a
child holding its output too), the command says so in one line and exits 0, and the fact turns
that into one line naming the deadline (a ProbeError, which fails that host alone, named; the
pre-flight's: a refusal). Each fact's command is run as pyinfra runs it (one ``sh -c``), with a
``python3`` first on PATH that never answers."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from pyinfra.api import FactBase

from servefleet.base.errors import ProbeError
from servefleet.entry.steps import facts
from servefleet.entry.steps.facts import (
    HostProbe,
    InstanceHealth,
    PreflightRefusal,
    WheelhouseFiles,
)

# each fact, its argument, and the name its one line starts with
FACTS: dict[str, tuple[type[FactBase], dict[str, str], str]] = {
    "probe": (HostProbe, {"args": json.dumps({"verify": False})}, "host probe"),
    "probe verify": (HostProbe, {"args": json.dumps({"verify": True})}, "host probe"),
    "health": (InstanceHealth, {"checks": "{}"}, "instance health"),
    "wheelhouse": (WheelhouseFiles, {"files": "{}"}, "wheelhouse files"),
    "pre-flight": (PreflightRefusal, {"run": "cd / && python3 preflight.py -"}, "pre-flight"),
}
HANG = 60  # seconds the stand-in program would run


def host(tmp_path: Path, script: str) -> dict[str, str]:
    """The environment of a host whose ``python3`` is the shell ``script``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python3").write_text(f"#!/bin/sh\n{script}\n")
    (bin_dir / "python3").chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin"}


def run(command: str, env: dict[str, str]) -> tuple[int, list[str]]:
    """The fact's command as pyinfra runs it: its exit status and stdout lines."""
    proc = subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=env,
                          timeout=HANG / 2)  # fmt: skip
    return proc.returncode, proc.stdout.splitlines()


def gone(pid: int) -> bool:
    """The process has ended (within a second: its output closes a moment before it is a
    zombie), reaped or not by whoever it was handed to."""
    for _ in range(100):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.01)
    return False


@pytest.mark.parametrize("name", FACTS)
def test_a_program_past_its_deadline_is_ended_and_the_fact_is_one_line(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(facts, "DEADLINE", 1, raising=False)  # (before the fix: none)
    monkeypatch.setattr(facts, "READ_DEADLINE", 1, raising=False)
    cls, kwargs, what = FACTS[name]
    fact = cls()
    # within its deadline the command is the program's: its output and exit status as they were
    # (pyinfra shows a failing one's output; the pre-flight's never fails the fact)
    fails = host(tmp_path / "fails", "echo partial; exit 3")
    assert run(fact.command(**kwargs), fails) == (0 if cls is PreflightRefusal else 3, ["partial"])
    pid_file = tmp_path / "child"
    hangs = host(tmp_path / "hangs", f"sleep {HANG} & echo $! > {pid_file}; wait")  # a child
    began = time.monotonic()  # holds its output too
    status, output = run(fact.command(**kwargs), hangs)  # before: ran HANG s (TimeoutExpired)
    assert time.monotonic() - began < 1 + facts.KILL_AFTER
    assert (status, output) == (0, ["servefleet-deadline 1"])
    assert gone(int(pid_file.read_text()))  # its whole process group was ended
    line = f"{what}: no answer within 1 s (its deadline; `timeout` ended it on the host)"
    if cls is PreflightRefusal:
        assert fact.process(output) == line  # the host is refused with it
    else:
        with pytest.raises(ProbeError) as err:
            fact.process(output)
        assert str(err.value) == line
