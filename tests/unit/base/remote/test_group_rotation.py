"""A serving group leaves the fleet routers' rotation as one worker (#34): ``group.py stop``
takes rank 0's worker out before any server stops; ``group.py gate`` puts it back only once the
group passed its gate (a failed gate leaves it out: the roll-back's gate puts it back)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from repo_paths import REMOTE

sys.path.insert(0, str(REMOTE))
import group  # noqa: E402
import health  # noqa: E402
import rotation  # noqa: E402
import systemd_units  # noqa: E402

ADMIN = "http://10.0.0.9:9000"
WORKER = "http://10.0.0.1:8000"


def state(worker: str | None) -> dict[str, Any]:
    inst = {"unit": "servefleet-vllm-0.service", "port": 8000, "sha": "s"}
    return {
        "group": {"name": "g1", "rank": 0 if worker else 1},
        "instances": [inst | ({"worker": worker} if worker else {"serves": False})],
        "routers": [ADMIN],
        "model": "m",
        "prewarm_timeout": 5,
        "health_timeout": 5,
    }


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    seen: list[str] = []
    monkeypatch.setattr(group, "UNIT_DIR", tmp_path)
    monkeypatch.setattr(systemd_units, "systemctl",
                        lambda *a, check=True: seen.append(" ".join(a)) or "")  # fmt: skip
    monkeypatch.setattr(systemd_units, "log", lambda line: None)
    monkeypatch.setattr(rotation, "router_call",
                        lambda admin, verb, w: seen.append(f"{verb} {w} at {admin}"))  # fmt: skip
    return seen


def test_rank_0_leaves_the_rotation_before_it_stops(events: list[str]) -> None:
    group.stop(state(WORKER))
    assert events == [f"remove {WORKER} at {ADMIN}", "stop servefleet-vllm-0.service"]


def test_a_headless_rank_touches_no_router(events: list[str]) -> None:
    group.stop(state(None))
    assert events == ["stop servefleet-vllm-0.service"]


def test_rank_0_comes_back_only_once_the_group_passed_its_gate(
    events: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(health, "check", lambda *a, **k: events.append("gate") and None)
    group.gate(state(WORKER))
    assert events == ["gate", f"add {WORKER} at {ADMIN}"]
    events.clear()
    monkeypatch.setattr(health, "check", lambda *a, **k: "not healthy within 5s")
    monkeypatch.setattr(health, "journal_tail", lambda unit: "")
    with pytest.raises(systemd_units.Failed):
        group.gate(state(WORKER))
    assert events == []  # out of rotation until a gate passes
