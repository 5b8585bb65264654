"""An operator's fleet repository (issues #19, #32): the wheel built from this tree, then the
README's "Install a controller" commands to the letter (wheel_venv's readme_install and
quick_start): `uv tool install --with-executables-from pyinfra servefleet-….whl` with the real uv,
outside the repository, then the `servefleet` and `pyinfra` it put on PATH: `servefleet init` in
an empty directory, `lab up`, the pyinfra deploy; from there only the scaffolded files and the
installed tool: `plan` (no change), `status` (exit 0), a `rollout` of a recompiling change and
`rollback` on lab1. A pyinfra installed without servefleet stops with one line on each fleet
file that needs servefleet. Brings up its own lab (the default 3 hosts, as the session's); the
session's lab state is refreshed after."""

from __future__ import annotations

import json
import shutil
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from faults import resolved, runs_argv
from wheel_venv import build_wheel, quick_start, readme_install, tool_env

from servefleet.fleet.lab.state import load_state
from servefleet.fleet.scaffold import INSTALL_BOTH

pytestmark = pytest.mark.lab_destructive
LIMIT = ["--limit", "lab1"]
CHANGE = ["--data", "serve_target=Throughput"]  # compile-affecting (--max-num-seqs)


def test_a_scaffolded_fleet_repository_runs_from_the_installed_wheel(
    lab: dict[str, Any], tmp_path: Path
) -> None:
    wheel = build_wheel(tmp_path / "build")
    shutil.copy(wheel, tmp_path / wheel.name)  # where the operator runs the install
    env = {**tool_env(tmp_path), "PYINFRA_PROGRESS": "off"}
    bin_ = tmp_path / "bin"

    def run(cwd: Path, argv: list[str], code: int = 0) -> subprocess.CompletedProcess[str]:
        creds = {n: Path(p).read_text().strip() for n, p in load_state()["secrets"].items()}
        proc = subprocess.run(argv, cwd=cwd, env={**env, **creds}, capture_output=True,
                              text=True, timeout=1200)  # fmt: skip
        assert proc.returncode == code, f"{argv}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        return proc

    def sh(*cmd: str) -> subprocess.CompletedProcess[str]:
        return run(fleet, list(cmd))  # by name, from PATH: the install's bin/ comes first

    try:  # the README's commands: the install, init, cd, lab up, the deploy
        fleet = quick_start(readme_install(), wheel, tmp_path, run)
        assert fleet.parent == tmp_path and (fleet / "inventories" / "lab.py").is_file()
        tool = tmp_path / "tools" / "servefleet"
        for name in ("servefleet", "pyinfra"):  # both on PATH, from the one tool environment
            assert (bin_ / name).resolve() == (tool / "bin" / name).resolve(), name
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
        bare_pyinfra_stops_in_one_line(tmp_path, fleet, env, run)
    finally:  # the lab this test brought up is the session's from now on
        lab.clear()
        lab.update(load_state())


def bare_pyinfra_stops_in_one_line(tmp: Path, fleet: Path, env: dict[str, str], run: Any) -> None:
    """#32: a pyinfra from an environment without servefleet (`uv tool install pyinfra`, the
    version servefleet's tool has) stops at the first fleet file that imports servefleet with
    one line naming it and how to install both; no traceback."""
    bare = tmp / "bare-bin"
    version = metadata.version("pyinfra")
    subprocess.run(
        ["uv", "tool", "install", f"pyinfra=={version}"],
        cwd=tmp,
        env={**env, "UV_TOOL_DIR": str(tmp / "bare-tools"), "UV_TOOL_BIN_DIR": str(bare)},
        check=True,
        capture_output=True,
    )
    for inventory, first in (("inventories/lab.py", "inventories/lab.py"),
                             ("inventories/prod.py", f"{fleet}/group_data/lab.py")):  # fmt: skip
        proc = run(fleet, [str(bare / "pyinfra"), "-y", inventory, "deploys/serve.py"], 1)
        assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
        assert proc.stderr.splitlines()[-1] == (
            f"{first}: No module named 'servefleet'; run the pyinfra installed with servefleet "
            f"({INSTALL_BOTH})"
        ), proc.stderr
