"""The fleet commands run without pyinfra: :class:`FakePyinfra` stands in for a pyinfra run of
deploys/report.py (summaries written where the CLI asked, recorded pyinfra output), over
``INVENTORY``'s three hosts; the ``fleet`` fixture (registered by conftest.py) is its working
directory; ``whole_reads`` polls a file the commands rewrite."""

from __future__ import annotations

import fnmatch
import json
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from host_inputs import CREDS, converged_probe, settings

from servefleet.fleet.fleetview import ReportRequest
from servefleet.fleet.statusview import status_summary
from servefleet.hostplan.plan import plan_host

INVENTORY = """
cr13 = [
    ("h1", {"ssh_hostname": "10.0.0.1"}),
    ("h2", {"ssh_hostname": "10.0.0.2"}),
    ("h3", {"ssh_hostname": "10.0.0.3", "serve_instances": 2}),
]
canary = ["h1"]
"""
# what pyinfra printed: h2 could not be connected, h3's report failed
OUTPUT = (
    "--> Loading config...\n--> Loading inventory...\n--> Connecting to hosts...\n"
    "    [h1] Connected\n"
    "    [h2] Could not connect ([Errno None] Unable to connect to port 22 on 10.0.0.2)\n"
    "    [h3] Connected\n"
    "--> Preparing operations...\n"
    "    [h3] servefleet: h3: probe: rbln-smi -j printed no JSON\n"
    "--> Disconnecting from hosts...\n"
)


def healthy() -> dict[str, Any]:
    plan = plan_host(settings(), converged_probe())
    return status_summary(plan, {str(8000 + i): "ok" for i in range(4)}, "10.0.0.1")


class FakePyinfra:
    """A pyinfra run of deploys/report.py: each host of the run (its --limit patterns) that has
    a summary here writes it where the CLI asked; prints ``output``."""

    def __init__(self, summaries: dict[str, dict[str, Any]], output: str, code: int = 1) -> None:
        self.summaries, self.output, self.code = summaries, output, code
        self.runs: list[list[str]] = []

    def __call__(self, cmd: list[str], env: dict[str, str]) -> tuple[int, str]:
        self.runs.append(cmd)
        limits = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--limit"]
        request = ReportRequest.from_env(env)
        for host, summary in self.summaries.items():
            if not limits or any(fnmatch.fnmatch(host, p) or p == "cr13" for p in limits):
                request.write(host, summary)
        return self.code, self.output


# every fleet command, with what it needs to run over an inventory ("{}")
FLEET_COMMANDS = {
    "plan": ["plan", "{}"],
    "status": ["status", "{}"],
    "rollout": ["rollout", "{}", "--yes"],
    "rollback": ["rollback", "{}"],
    "lock": ["lock", "{}"],
    "monitoring": ["monitoring", "{}"],
    "wheelhouse": ["wheelhouse", "wh", "--inventory", "{}"],
}


class Batches:
    """Stands in for subprocess.run: pyinfra's deploy and rollback runs, every host ok but the
    hosts of ``fail`` (each with one servefleet line on stderr)."""

    def __init__(self, fail: set[str] | None = None) -> None:
        self.fail = fail or set()
        self.runs: list[list[str]] = []

    def __call__(self, cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        self.runs.append(list(cmd))
        hosts = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--limit"]
        failed = sorted(h for h in hosts if h in self.fail)
        out = json.dumps({"results": {"failed_hosts": failed}})
        err = "".join(f"    [{h}] servefleet: {h}: the gate failed: instance 0 answered 500\n"
                      for h in failed)  # fmt: skip
        return subprocess.CompletedProcess(cmd, 1 if failed else 0, out, err)


@pytest.fixture
def fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """inv.py in an empty working directory, the index credentials set."""
    monkeypatch.chdir(tmp_path)
    for k, v in CREDS.items():
        monkeypatch.setenv(k, v)
    (tmp_path / "inv.py").write_text(INVENTORY)
    return tmp_path


def whole_reads(path: Path, rewrite: Callable[[], None]) -> list[bool]:
    """Run ``rewrite()`` while another thread reads ``path`` as fast as it can: for each read,
    whether it was whole JSON."""
    done = threading.Event()
    reads: list[bool] = []

    def read() -> None:
        while not done.is_set():
            try:
                json.loads(path.read_text())
                reads.append(True)
            except ValueError:
                reads.append(False)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        rewrite()
    finally:
        done.set()
        reader.join()
    return reads
