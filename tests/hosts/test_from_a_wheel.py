"""An operator's fleet repository (issue #19): the wheel built from this tree, installed into a
fresh venv outside the repository, then the README's "Install a controller" commands as it shows
them (`servefleet init` in an empty directory, `lab up`, the pyinfra deploy: wheel_venv's
readme_install and quick_start), and from there only the scaffolded files and the installed
package: `plan` (no change), `status` (exit 0), a `rollout` of a recompiling change and
`rollback` on lab1. Brings up its own lab (the default 3 hosts, as the session's); the session's
lab state is refreshed after."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from faults import resolved, runs_argv
from wheel_venv import built_wheel, clean_env, quick_start, readme_install, wheel_venv

from servefleet.lab.state import load_state

pytestmark = pytest.mark.lab_destructive
LIMIT = ["--limit", "lab1"]
CHANGE = ["--data", "serve_target=Throughput"]  # compile-affecting (--max-num-seqs)


def test_a_scaffolded_fleet_repository_runs_from_the_installed_wheel(
    lab: dict[str, Any], tmp_path: Path
) -> None:
    venv = wheel_venv(tmp_path)
    bin_ = venv / "bin"
    env = {**clean_env(), "PATH": f"{bin_}:{os.environ['PATH']}", "PYINFRA_PROGRESS": "off"}

    def run(cwd: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
        creds = {n: Path(p).read_text().strip() for n, p in load_state()["secrets"].items()}
        proc = subprocess.run(argv, cwd=cwd, env={**env, **creds}, capture_output=True,
                              text=True, timeout=1200)  # fmt: skip
        assert proc.returncode == 0, f"{argv}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        return proc

    def sh(*cmd: str) -> subprocess.CompletedProcess[str]:
        return run(fleet, [str(bin_ / cmd[0]), *cmd[1:]])

    try:  # the README's commands: init, cd, lab up, the deploy
        fleet = quick_start(readme_install(), built_wheel(tmp_path), venv, tmp_path, run)
        assert fleet.parent == tmp_path and (fleet / "inventories" / "lab.py").is_file()
        plan = json.loads(sh("servefleet", "plan", "inventories/lab.py", *LIMIT, "--json").stdout)
        assert list(plan) == ["lab1"] and not plan["lab1"]["changes"], plan
        sh("servefleet", "status", "inventories/lab.py", *LIMIT)
        out = sh("servefleet", "rollout", "inventories/lab.py", *LIMIT, "--yes", "--json", "--",
                 *CHANGE).stdout  # fmt: skip
        assert json.loads(out)["lab1"]["result"] == "ok", out
        state = load_state()
        assert runs_argv(
            state, "lab1", 8000, resolved("--target", "throughput")["servers"][0]["argv"]
        )
        sh("servefleet", "rollback", "inventories/lab.py", *LIMIT)
        assert runs_argv(state, "lab1", 8000, resolved()["servers"][0]["argv"])  # Latency again
        assert not list(fleet.rglob("*.egg-info")) and (fleet / "deploys" / "serve.py").is_file()
    finally:  # the lab this test brought up is the session's from now on
        lab.clear()
        lab.update(load_state())
