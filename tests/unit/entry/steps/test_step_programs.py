"""The steps' host programs as the steps run them: the status check through the deploy's own
gate (sent inline), ``current`` pointed by ``instances.py`` alone, and the command a step runs."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from fake_host import FakeSystemd, Stub, running, stub_process
from lab_sim_support import REPO

from servefleet.base.remote import REMOTE, layout
from servefleet.entry.steps.facts import STATUS
from servefleet.entry.steps.lib import command
from servefleet.hostplan.probe_input import REMOTE_SCRIPTS

UNITS = [layout.unit_name(0), layout.unit_name(1)]
MODEL = "openai/gpt-oss-120b"


def status(systemd: FakeSystemd, instances: list[list[Any]]) -> dict[str, str]:
    checks = json.dumps({"model": MODEL, "host": None, "instances": instances})
    proc = subprocess.run([sys.executable, "-c", STATUS, "status", checks], env=systemd.env(),
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_status_is_the_deploys_gate(tmp_path: Path) -> None:
    systemd = FakeSystemd(tmp_path / "host")
    # the unit's main process is this one: the stub in a thread is its listener, not the other
    systemd.show(running(MainPID=os.getpid(), ControlGroup="/system.slice/other.service"))
    with Stub() as ours, stub_process() as (other, port):
        comm = Path(f"/proc/{other.pid}/comm").read_text().strip()
        found = status(systemd, [[UNITS[0], ours.port], [UNITS[1], port]])
    assert found[str(ours.port)] == "ok"
    assert found[str(port)] == f"port {port} is held by pid {other.pid} ({comm}), not by {UNITS[1]}"
    assert ours.requests[0] == ("/health", None)
    assert ours.requests[1][0] == "/v1/chat/completions"
    assert ours.requests[1][1]["model"] == MODEL and ours.requests[1][1]["max_tokens"] == 1


def test_status_of_a_unit_that_is_not_there(tmp_path: Path) -> None:
    systemd = FakeSystemd(tmp_path / "host")
    systemd.show(running(LoadState="not-found", ActiveState="inactive"))
    assert status(systemd, [[UNITS[0], 1]]) == {"1": f"{UNITS[0]} is not loaded (not-found)"}


def test_current_is_pointed_by_rename_by_instances_py(tmp_path: Path) -> None:
    root = tmp_path / "opt"
    root.mkdir()
    (root / layout.CURRENT_NEW).symlink_to("releases/left-by-a-killed-run")
    for release in ("abc", "abc", "def"):
        subprocess.run([sys.executable, str(REMOTE / "instances.py"), "current", str(root),
                        release], check=True)  # fmt: skip
        assert os.readlink(root / layout.CURRENT) == f"{layout.RELEASES}/{release}"
    assert sorted(p.name for p in root.iterdir()) == [layout.CURRENT]


def test_a_step_runs_a_host_program_from_lib() -> None:
    assert command("/opt/servefleet", "instances.py", "converge", "/a b/desired.json") == (
        "python3 /opt/servefleet/lib/instances.py converge '/a b/desired.json'"
    )
    steps = (REPO / "src" / "servefleet" / "entry" / "steps").glob("*.py")
    run = {m for p in steps for m in re.findall(r'command\([^)]*?"(\w+\.py)"', p.read_text())}
    assert {"instances.py", "fetch_model.py", "driver.py", "prewarm.py"} <= run
    assert run <= set(REMOTE_SCRIPTS) and "layout.py" in REMOTE_SCRIPTS
    assert all((REMOTE / script).is_file() for script in REMOTE_SCRIPTS)


def test_every_module_a_host_program_imports_is_shipped_with_it() -> None:
    """A host program imports its neighbours as top-level modules (``import layout``): each one
    must be among what the deploy uploads to lib, or the program fails on the host alone."""
    shipped = {script.removesuffix(".py") for script in REMOTE_SCRIPTS}
    missing = {}
    for script in REMOTE_SCRIPTS:
        tree = ast.parse((REMOTE / script).read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        neighbours = {name for name in names if (REMOTE / f"{name}.py").is_file()}
        if neighbours - shipped:
            missing[script] = sorted(neighbours - shipped)
    assert missing == {}
    # the fetcher's parts are among them (it imports them, not the other way round)
    fetcher = ast.parse((REMOTE / "fetch_model.py").read_text())
    imported = {a.name for n in ast.walk(fetcher) if isinstance(n, ast.Import) for a in n.names}
    assert {"http_client", "store_source", "hub_source", "snapshot_place"} <= imported


def test_status_sends_the_units_api_key(tmp_path: Path) -> None:
    key = "sk-" + "fedcba9876543210" * 2
    env_file = tmp_path / "vllm-api-key.env"
    env_file.write_text(f"VLLM_API_KEY={key}\n")
    systemd = FakeSystemd(tmp_path / "host")
    ours = running(MainPID=os.getpid(), ControlGroup="/system.slice/x.service")
    systemd.show({**ours, "EnvironmentFiles": f"{env_file} (ignore_errors=no)"})
    with Stub(api_key=key) as keyed:
        assert status(systemd, [[UNITS[0], keyed.port]]) == {str(keyed.port): "ok"}
    assert keyed.auth == [None, f"Bearer {key}"]
    systemd.show(ours)  # the same server, a unit that names no key: 401, unhealthy
    with Stub(api_key=key) as keyed:
        found = status(systemd, [[UNITS[0], keyed.port]])
    assert found == {
        str(keyed.port): f"http://127.0.0.1:{keyed.port}/v1/chat/completions answered 401 "
        "Unauthorized without an API key (the unit has none)"
    }
