"""The gate's loop and its commands, ``remote/health.py`` in-process (issue #37's mutation
campaign; the gate run as a program is test_health_gate.py's): ``check`` on a clock that only
its sleeps move, with systemd's answers, the probe's and the port owner's the test's (the URL for
each host form, each request's limit, the key of the unit or of ``key_unit``, a fatal state or
listener at once, restarts counted from the first look, a 401, a keyless router, the
``answered_timeout`` cut taken once, the router's port held by its proxy, the pauses); ``status``
(each instance's gate, a router's readiness and key, a headless rank by its unit); ``main`` (its
status command, the gate's lines, the warm marker) and ``journal_tail``'s command."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from repo_paths import REMOTE

sys.path.insert(0, str(REMOTE))
import health  # noqa: E402  (a host program: imported as the host imports it)
import layout  # noqa: E402

UNIT = "servefleet-vllm-0.service"


def st(unit: str = UNIT, **over: Any) -> health.UnitState:
    base: dict[str, Any] = dict(load="loaded", active="active", sub="running", result="success",
                                restarts=0, main_code=0, main_status=0, main_pid=9,
                                cgroup=f"/{unit}")  # fmt: skip
    return health.UnitState(**(base | over))


class World:
    """``states[unit]``: the answers of unit_state in turn (the last repeats); ``probes``: the
    probe's answers in turn (the last repeats); ``owners[answered]``: owner_problem's answer.
    Every call is kept in ``calls``; the clock starts at 100 and moves only by sleeps."""

    def __init__(self) -> None:
        self.states: dict[str, list[health.UnitState]] = {}
        self.probes: list[str | None] = [None]
        self.owners: dict[bool, str | None] = {False: None, True: None}
        self.calls: list[tuple[Any, ...]] = []
        self.now = 100.0
        self.pauses: list[float] = []

    def unit_state(self, unit: str) -> health.UnitState:
        self.calls.append(("state", unit))
        answers = self.states.setdefault(unit, [st(unit)])
        return answers.pop(0) if len(answers) > 1 else answers[0]

    def probe(self, base: str, model: str, limit: float, key: str | None, path: str) -> str | None:
        self.calls.append(("probe", base, model, round(limit, 6), key, path))
        return self.probes.pop(0) if len(self.probes) > 1 else self.probes[0]

    def owner_problem(
        self, unit: str, port: int, host: str, state: health.UnitState, answered: bool
    ) -> str | None:
        self.calls.append(("owner", unit, port, host, state.cgroup, answered))
        return self.owners[answered]

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.pauses.append(round(seconds, 6))
        self.now += seconds
        if len(self.pauses) > 10_000:  # a gate that never ends fails here, not at a time-out
            raise AssertionError("the gate is still waiting after 10000 pauses")


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> World:
    w = World()
    monkeypatch.setattr(health, "unit_state", w.unit_state)
    monkeypatch.setattr(health, "probe", w.probe)
    monkeypatch.setattr(health, "owner_problem", w.owner_problem)
    monkeypatch.setattr(health, "api_key", lambda s: f"key of {s.cgroup}")
    monkeypatch.setattr(health, "time", w)
    return w


def kinds(world: World) -> list[str]:
    return [c[0] for c in world.calls]


@pytest.mark.parametrize(
    ("host", "base"),
    [("127.0.0.1", "http://127.0.0.1:8000"), ("0.0.0.0", "http://127.0.0.1:8000"),
     ("::", "http://127.0.0.1:8000"), ("", "http://127.0.0.1:8000"),
     ("::1", "http://[::1]:8000"), ("10.0.0.5", "http://10.0.0.5:8000")],
)  # fmt: skip
def test_a_healthy_server_passes_at_once(world: World, host: str, base: str) -> None:
    assert health.check(UNIT, 8000, "acme/m", 60.0, host) is None
    local = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    assert world.calls == [
        ("state", UNIT),
        ("owner", UNIT, 8000, local, f"/{UNIT}", False),
        ("probe", base, "acme/m", 60.0, f"key of /{UNIT}", "/health"),
        ("state", UNIT),  # read again once it answered
        ("owner", UNIT, 8000, local, f"/{UNIT}", True),
    ]
    assert world.pauses == []


def test_the_defaults_and_a_short_limit(world: World) -> None:
    assert health.check(UNIT, 8000, "m", 0.25) is None
    assert world.calls[2] == (
        "probe",
        "http://127.0.0.1:8000",
        "m",
        1.0,
        f"key of /{UNIT}",
        "/health",
    )


def test_the_key_of_another_unit_and_another_path(world: World) -> None:
    assert health.check(UNIT, 8000, "m", 9.0, key_unit="servefleet-vllm-3.service",
                        path="/readiness") is None  # fmt: skip
    assert world.calls[2:4] == [
        ("state", "servefleet-vllm-3.service"),
        ("probe", "http://127.0.0.1:8000", "m", 9.0, "key of /servefleet-vllm-3.service", "/readiness"),
    ]  # fmt: skip


def test_a_failed_unit_or_a_foreign_listener_fails_at_once(world: World) -> None:
    world.states[UNIT] = [st(active="failed", result="exit-code", main_status=1)]
    assert health.check(UNIT, 8000, "m", 60.0) == (
        f"{UNIT} is failed (exit-code, status 1) after 0 automatic restart(s)"
    )
    assert kinds(world) == ["state"]
    world.states[UNIT], world.calls = [st()], []
    world.owners[False] = "port 8000 is held by pid 7 (python3), not by x"
    assert health.check(UNIT, 8000, "m", 60.0) == "port 8000 is held by pid 7 (python3), not by x"
    assert kinds(world) == ["state", "owner"]


def test_after_an_answer_the_unit_and_the_listener_are_checked_again(world: World) -> None:
    world.states[UNIT] = [st(restarts=3), st(restarts=4)]  # a restart since the gate began
    assert health.check(UNIT, 8000, "m", 60.0) == (
        f"{UNIT} is active (running) after 1 automatic restart(s)"
    )
    world.states[UNIT] = [st()]
    world.owners[True] = "port 8000 answered, but no socket listens on it"
    assert health.check(UNIT, 8000, "m", 60.0) == "port 8000 answered, but no socket listens on it"


def test_restarts_while_waiting_fail_the_gate(world: World) -> None:
    world.states[UNIT] = [st(restarts=2), st(restarts=2), st(restarts=3)]
    world.probes = ["not answering: refused"]
    assert health.check(UNIT, 8000, "m", 60.0) == (
        f"{UNIT} is active (running) after 1 automatic restart(s)"
    )
    assert world.pauses == [0.1, 0.1]


def test_a_401_ends_the_wait_and_a_keyless_router_passes_it(world: World) -> None:
    unauthorized = f"http://x/v1/chat/completions {health.UNAUTHORIZED} with the unit's API key"
    world.probes = [unauthorized]
    assert health.check(UNIT, 8000, "m", 60.0) == unauthorized
    assert kinds(world)[-2:] == ["state", "owner"] and world.pauses == []
    world.calls = []
    assert health.check(UNIT, 8000, "m", 60.0, keyless=True) is None
    world.owners[True] = "held by another"
    assert health.check(UNIT, 8000, "m", 60.0, keyless=True) == "held by another"
    world.probes, world.owners[True] = ["http://x/health answered 503"], None
    assert health.check(UNIT, 8000, "m", 1.0, keyless=True) == (
        "not healthy within 1s: http://x/health answered 503"
    )


def test_the_timeout_and_each_probes_limit(world: World) -> None:
    world.probes = ["not answering: refused"]
    assert health.check(UNIT, 8000, "m", 0.35) == "not healthy within 0.35s: not answering: refused"
    assert world.pauses == [0.1, 0.1, 0.1, 0.05]
    limits = [c[3] for c in world.calls if c[0] == "probe"]
    assert limits == [1.0, 1.0, 1.0, 1.0, 1.0]
    world.calls, world.pauses = [], []
    health.check(UNIT, 8000, "m", 3.0)
    limits = [c[3] for c in world.calls if c[0] == "probe"]
    assert limits[:3] == [3.0, 2.9, 2.8] and limits[-1] == 1.0


def test_the_pause_doubles_after_five_seconds_up_to_one(world: World) -> None:
    world.probes = ["http://x/health answered 503"]
    health.check(UNIT, 8000, "m", 9.0)
    quick = next(i for i, p in enumerate(world.pauses) if p != 0.1)
    assert quick in (50, 51)  # 0.1 s apart for five seconds (the float sum may take one more)
    assert world.pauses[quick : quick + 5] == [0.2, 0.4, 0.8, 1.0, 1.0]
    assert len(world.pauses) == quick + 6 and sum(world.pauses) == pytest.approx(9.0)
    assert (health.QUICK_START, health.QUICK_POLL, health.SLOW_POLL) == (5.0, 0.1, 1.0)
    assert world.calls.count(("state", UNIT)) == len(world.pauses) + 1  # read again each round


def test_an_answer_cuts_a_prewarms_wait_once(world: World) -> None:
    """While not answering, the pre-warm's whole timeout; the first answer cuts what is left to
    ``answered_timeout`` (a later one does not move it again)."""
    world.probes = [*["not answering: refused"] * 3, "http://x/health answered 503"]
    why = health.check(UNIT, 8000, "m", 3600.0, answered_timeout=2.0)
    assert why == "not healthy within 2s: http://x/health answered 503"
    assert world.now == pytest.approx(100.3 + 2.0)  # answered at 100.3, two seconds then
    assert [c[3] for c in world.calls if c[0] == "probe"][2:5] == [3599.8, 3599.7, 2.0 - 0.1]


def test_on_exact_times(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pauses of a quarter second (exact in binary): the pause doubles once five seconds have
    passed, not a pause later; an answer that leaves exactly ``answered_timeout`` keeps the
    gate's own timeout."""
    monkeypatch.setattr(health, "QUICK_POLL", 0.25)
    world.probes = ["http://x/health answered 503"]
    health.check(UNIT, 8000, "m", 8.0)
    assert world.pauses == [0.25] * 20 + [0.5, 1.0, 1.0, 0.5]
    world.pauses, world.now = [], 100.0
    world.probes = [*["not answering: refused"] * 4, "http://x/health answered 503"]
    assert health.check(UNIT, 8000, "m", 3.0, answered_timeout=2.0) == (
        "not healthy within 3s: http://x/health answered 503"  # answered at 1 s: 2 s left anyway
    )
    assert world.now == 103.0


def test_an_answer_never_lengthens_the_wait(world: World) -> None:
    world.probes = ["http://x/health answered 503"]
    assert health.check(UNIT, 8000, "m", 0.5, answered_timeout=5.0) == (
        "not healthy within 0.5s: http://x/health answered 503"
    )
    assert world.now == pytest.approx(100.5)
    world.probes, world.now = ["not answering: refused"], 100.0
    assert health.check(UNIT, 8000, "m", 1.0, answered_timeout=0.2) == (
        "not healthy within 1s: not answering: refused"
    )
    assert world.now == pytest.approx(101.0)


def test_the_routers_port_is_its_proxys(world: World) -> None:
    assert health.check(layout.ROUTER_UNIT, 8080, "m", 60.0) is None
    owners = [c for c in world.calls if c[0] == "owner"]
    assert owners == [("owner", layout.PROXY_UNIT, 8080, "127.0.0.1", f"/{layout.PROXY_UNIT}", a)
                      for a in (False, True)]  # fmt: skip
    assert ("state", layout.PROXY_UNIT) in world.calls
    assert health.PORT_HOLDERS == {layout.ROUTER_UNIT: layout.PROXY_UNIT}


# -- status ------------------------------------------------------------------------------------


def test_status_runs_each_gate_once(monkeypatch: pytest.MonkeyPatch) -> None:
    gates: list[tuple[Any, ...]] = []
    pools: list[int] = []

    def check(unit: str, port: int, model: str, timeout: float, host: str = "127.0.0.1",
              key_unit: str | None = None, path: str = "/health", keyless: bool = False) -> str | None:  # fmt: skip
        gates.append((unit, port, model, timeout, host, key_unit, path, keyless))
        return None if unit != "down" else "not answering"

    real = health.ThreadPoolExecutor

    def pool(max_workers: int) -> Any:
        pools.append(max_workers)
        return real(max_workers=max_workers)

    states = {"rank": st("rank"), "dead": st("dead", active="inactive", main_code=1, result="")}
    monkeypatch.setattr(health, "check", check)
    monkeypatch.setattr(health, "unit_state", states.__getitem__)
    monkeypatch.setattr(health, "ThreadPoolExecutor", pool)
    checks = {
        "model": "acme/m",
        "host": None,
        "instances": [[UNIT, 8000], ["down", "8001"], ["router", 8080, UNIT, True],
                      ["router2", 8081, "", True]],
        "headless": [["rank", 8002], ["dead", 8003]],
    }  # fmt: skip
    assert health.status(checks) == {
        "8000": "ok", "8001": "not answering", "8080": "ok", "8081": "ok", "8002": "ok",
        "8003": "dead exited cleanly (status 0); a server must keep running",
    }  # fmt: skip
    assert sorted(gates) == sorted([
        (UNIT, 8000, "acme/m", 30.0, "127.0.0.1", None, "/health", False),
        ("down", 8001, "acme/m", 30.0, "127.0.0.1", None, "/health", False),
        ("router", 8080, "acme/m", 30.0, "127.0.0.1", UNIT, "/readiness", False),
        ("router2", 8081, "acme/m", 30.0, "127.0.0.1", None, "/readiness", True),
    ])  # fmt: skip
    assert pools == [4]
    gates.clear()
    assert health.status({"model": "m", "host": "10.0.0.1", "instances": [[UNIT, 1]]}) == {
        "1": "ok"
    }
    assert gates == [(UNIT, 1, "m", 30.0, "10.0.0.1", None, "/health", False)]
    assert health.status({"model": "m", "instances": []}) == {}
    assert pools == [4, 1, 1]


# -- main and journal_tail -----------------------------------------------------------------------


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    w: dict[str, Any] = {"why": None, "calls": []}

    def check(unit: str, port: int, model: str, timeout: float, host: str) -> str | None:
        w["calls"].append((unit, port, model, timeout, host))
        return w["why"]  # type: ignore[no-any-return]

    monkeypatch.setattr(health, "check", check)
    monkeypatch.setattr(health, "journal_tail", lambda unit: f"journal of {unit}\n")
    return w


def test_main_passes_and_writes_the_warm_marker(
    gate: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = tmp_path / "a" / "b" / "warm"
    health.main([UNIT, "8000", "acme/m", "2.5", "--host", "10.0.0.1", "--warm-marker", str(marker)])
    assert gate["calls"] == [(UNIT, 8000, "acme/m", 2.5, "10.0.0.1")]
    assert capsys.readouterr() == (f"{UNIT}: healthy on port 8000\n", "")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\n", marker.read_text())
    marker.unlink()
    health.main([UNIT, "8001", "m", "3", "--warm-marker", str(marker)])  # its directory is there
    assert gate["calls"][1] == (UNIT, 8001, "m", 3.0, "127.0.0.1")
    assert marker.exists()


def test_main_fails_with_the_journal_and_no_marker(
    gate: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gate["why"] = "not healthy within 3s: x"
    marker = tmp_path / "warm"
    with pytest.raises(SystemExit) as exited:
        health.main([UNIT, "8000", "m", "3", "--warm-marker", str(marker)])
    assert exited.value.code == 1
    assert capsys.readouterr() == (
        "", f"servefleet: health gate: {UNIT}: not healthy within 3s: x\n"
        f"--- journal tail of {UNIT} ---\njournal of {UNIT}\n"
    )  # fmt: skip
    assert not marker.exists()


def test_main_status_and_the_command_line(
    monkeypatch: pytest.MonkeyPatch, gate: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        health.main(["status"])  # the gate's arguments then: too few
    assert capsys.readouterr().err.startswith("usage: health.py [-h] [--host HOST]")
    seen: list[dict[str, Any]] = []

    def status(checks: dict[str, Any]) -> dict[str, str]:
        seen.append(checks)
        return {"8000": "ok"}

    monkeypatch.setattr(health, "status", status)
    health.main(["status", '{"model": "m", "instances": []}'])
    assert seen == [{"model": "m", "instances": []}]
    assert capsys.readouterr().out == '{"8000": "ok"}\n'
    monkeypatch.setattr(sys, "argv", ["health.py", "status", "{}"])
    health.main()
    assert seen[-1] == {}
    assert gate["calls"] == []


def test_journal_tail_asks_journalctl(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []

    def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        assert kw == {"capture_output": True, "text": True}
        if cmd[4] == "1":
            raise FileNotFoundError(2, "No such file or directory", "journalctl")
        return subprocess.CompletedProcess(cmd, 0, "a\nb\n", "")

    monkeypatch.setattr(subprocess, "run", run)
    assert health.journal_tail(UNIT) == "a\nb\n"
    assert calls == [["journalctl", "-u", UNIT, "-n", "25", "--no-pager", "-o", "cat"]]
    assert health.journal_tail(UNIT, lines=1) == (
        "(no journal: [Errno 2] No such file or directory: 'journalctl')\n"
    )
    assert json.loads(json.dumps(health.STATUS_TIMEOUT)) == 30.0
