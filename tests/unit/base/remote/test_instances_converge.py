"""``instances.converge``: a failed gate rolls the host back to ``good.json``, through the gate
(its systemd and gates the test's). Issue #37's hole 5: the other tests call ``bring_to()``,
never ``converge()`` (shown failing with ``converge`` never rolling back)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from repo_paths import REMOTE

sys.path.insert(0, str(REMOTE))
import instances  # noqa: E402  (a host program: imported as the host imports it)
import layout  # noqa: E402
import restart_gate  # noqa: E402
import systemd_units  # noqa: E402


def _unit(sha: str) -> str:
    return f'[Service]\nEnvironment="{layout.UNIT_SHA_VAR}={sha}"\nExecStart=/bin/true {sha}\n'


def _state(release: str, sha: str, text: bool) -> dict[str, Any]:
    inst: dict[str, Any] = {"unit": "servefleet-vllm-0.service", "sha": sha, "port": 8000,
                            "devices": "0", "fingerprint": "-"}  # fmt: skip
    if text:
        inst["text"] = _unit(sha)
    return {"root": "/opt/servefleet", "release": release, "model": "acme/m", "host": None,
            "cache_root": "/nonexistent", "devices_env": "RBLN_VISIBLE_DEVICES",
            "health_timeout": 5, "prewarm_timeout": 5, "instances": [inst], "stale": []}  # fmt: skip


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, Any]:
    """A host serving release r1 (sha a1, good.json and its kept unit), its systemd and gates
    the test's: a unit restarted to sha b2 fails its gate."""
    root = tmp_path / "opt"
    state_dir = root / layout.STATE
    (state_dir / layout.KEPT_UNITS).mkdir(parents=True)
    units = tmp_path / "units"
    units.mkdir()
    unit = "servefleet-vllm-0.service"
    (units / unit).write_text(_unit("a1"))
    (state_dir / layout.KEPT_UNITS / "a1.service").write_text(_unit("a1"))
    good = _state("r1", "a1", text=False)
    (state_dir / layout.GOOD).write_text(json.dumps(good))
    os.symlink(f"{layout.RELEASES}/r1", root / layout.CURRENT)
    running = {unit: "a1"}
    gates: list[str] = []

    def live(devices_env: str) -> dict[str, dict[str, Any]]:
        return {u: {"active": "active", "pid": 1, "sha": s, "port": 8000, "devices": {"0"}}
                for u, s in running.items()}  # fmt: skip

    def start_through_gate(state: dict[str, Any], inst: dict[str, Any], restart: bool) -> None:
        running[inst["unit"]] = inst["sha"]  # restarted on the text bring_to wrote
        gates.append(inst["sha"])
        if inst["sha"] == "b2":
            raise systemd_units.Failed(f"health gate: {inst['unit']}: answered 500 to the chat")

    monkeypatch.setattr(systemd_units, "UNIT_DIR", units)
    monkeypatch.setattr(systemd_units, "systemctl", lambda *a, check=True: "")
    monkeypatch.setattr(systemd_units, "live", live)
    monkeypatch.setattr(restart_gate, "start_through_gate", start_through_gate)
    desired = state_dir / layout.DESIRED
    desired.write_text(json.dumps(_state("r2", "b2", text=True)))
    return {"root": root, "state_dir": state_dir, "units": units, "unit": unit,
            "running": running, "gates": gates, "desired": desired, "good": good}  # fmt: skip


def test_converge_rolls_back_to_the_good_state_when_a_gate_fails(
    host: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    assert instances.converge(host["desired"]) == 1
    err = capsys.readouterr().err
    assert "servefleet: health gate: servefleet-vllm-0.service: answered 500" in err
    assert "servefleet: rolled back to r1" in err
    assert host["gates"] == ["b2", "a1"]  # the new unit's gate, then the good one's
    assert host["running"] == {host["unit"]: "a1"}
    assert (host["units"] / host["unit"]).read_text() == _unit("a1")
    assert os.readlink(host["root"] / layout.CURRENT) == f"{layout.RELEASES}/r1"
    assert json.loads((host["state_dir"] / layout.GOOD).read_text()) == host["good"]
    assert not (host["state_dir"] / layout.KEPT_UNITS / "b2.service").exists()


def test_converge_without_a_good_state_says_so(
    host: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    (host["state_dir"] / layout.GOOD).unlink()
    assert instances.converge(host["desired"]) == 1
    assert "no earlier good state on this host to roll back to" in capsys.readouterr().err
    assert host["gates"] == ["b2"]
