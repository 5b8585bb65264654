"""``remote/restart_gate.py`` in-process (issue #37's mutation campaign): what ``make_room``
stops (our other servers that hold the instance's port or one of its devices, active, activating
or reloading) and its line; what ``start_through_gate`` asks of systemd, the health gate and the
warm markers (the gate's timeout for a warm, a cold and a compile-free instance, the restart's
enable and restart, the line of each way in, the fault point, the gate's failure with the
journal tail, the warm marker of a cold start with the bundles since one second before it); and
what ``recheck_peers`` passes each prefill/decode request (the model, the health timeout, the API
key of the host's first unit) and says. systemd, the gate and the markers are the test's."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from repo_paths import REMOTE

sys.path.insert(0, str(REMOTE))
import fault_point  # noqa: E402  (host programs: imported as the host imports them)
import health  # noqa: E402
import restart_gate  # noqa: E402
import systemd_units  # noqa: E402
import warm_state  # noqa: E402

UNIT = "servefleet-vllm-1.service"
NOW = 1000.0  # the test's time.time()


class Clock:
    """``time`` as restart_gate reads it: a fixed wall clock."""

    @staticmethod
    def time() -> float:
        return NOW


def instance(**over: Any) -> dict[str, Any]:
    inst: dict[str, Any] = {"unit": UNIT, "port": 8001, "devices": "2,3", "fingerprint": "fp1"}
    return inst | over


def host_state(**over: Any) -> dict[str, Any]:
    state: dict[str, Any] = {
        "devices_env": "RBLN_VISIBLE_DEVICES",
        "model": "acme/m",
        "host": "10.1.2.3",
        "cache_root": "/nonexistent/cache",
        "health_timeout": 7,
        "prewarm_timeout": 900,
        "instances": [instance()],
    }
    return state | over


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The host as restart_gate sees it: ``live`` (unit -> active, port, devices), ``cold``
    (fingerprints not warm), ``why`` (the gate's answer); every call recorded in ``calls``."""
    w: dict[str, Any] = {"live": {}, "cold": set(), "why": None, "calls": [], "lines": []}
    calls: list[tuple[Any, ...]] = w["calls"]

    def live(devices_env: str) -> dict[str, dict[str, Any]]:
        calls.append(("live", devices_env))
        return {u: dict(now) for u, now in w["live"].items()}

    def systemctl(*args: str, check: bool = True) -> str:
        calls.append(("systemctl", *args))
        return ""

    def is_cold(state: dict[str, Any], inst: dict[str, Any]) -> bool:
        calls.append(("is_cold", state["cache_root"], inst["unit"]))
        return inst["fingerprint"] in w["cold"]

    def check(unit: str, port: int, model: str, timeout: float, host: str = "127.0.0.1",
              answered_timeout: float | None = None) -> str | None:  # fmt: skip
        calls.append(("check", unit, port, model, timeout, host, answered_timeout))
        return w["why"]

    def bundle_dirs(state: dict[str, Any], unit: str, since: float) -> list[str]:
        calls.append(("bundle_dirs", state["cache_root"], unit, since))
        return ["rbln/m/sig"]

    def mark_warm(state: dict[str, Any], fingerprint: str, dirs: list[str]) -> None:
        calls.append(("mark_warm", state["cache_root"], fingerprint, dirs))

    monkeypatch.setattr(systemd_units, "live", live)
    monkeypatch.setattr(systemd_units, "systemctl", systemctl)
    monkeypatch.setattr(systemd_units, "log", w["lines"].append)
    monkeypatch.setattr(warm_state, "is_cold", is_cold)
    monkeypatch.setattr(warm_state, "bundle_dirs", bundle_dirs)
    monkeypatch.setattr(warm_state, "mark_warm", mark_warm)
    monkeypatch.setattr(health, "check", check)
    monkeypatch.setattr(health, "journal_tail", lambda unit: f"journal of {unit}\n")
    monkeypatch.setattr(fault_point, "barrier", lambda point: calls.append(("barrier", point)))
    monkeypatch.setattr(restart_gate, "time", Clock)
    return w


def stops(world: dict[str, Any]) -> list[str]:
    return [c[2] for c in world["calls"] if c[:2] == ("systemctl", "stop")]


# -- make_room ---------------------------------------------------------------------------------


def test_make_room_stops_our_running_servers_on_the_port_or_a_device(
    world: dict[str, Any],
) -> None:
    world["live"] = {
        UNIT: {"active": "active", "port": 8001, "devices": {"2"}},  # itself: never stopped
        "a.service": {"active": "active", "port": 8001, "devices": set()},  # the port
        "b.service": {"active": "activating", "port": 8009, "devices": {"3", "0"}},  # a device
        "c.service": {"active": "reloading", "port": None, "devices": {"2"}},
        "d.service": {"active": "active", "port": 8002, "devices": {"0", "1"}},  # neither
        "e.service": {"active": "inactive", "port": 8001, "devices": {"2"}},  # not running
        "f.service": {"active": "failed", "port": 8001, "devices": {"3"}},
        "g.service": {"active": "deactivating", "port": 8001, "devices": {"3"}},
    }
    restart_gate.make_room(host_state(), instance())
    assert world["calls"][0] == ("live", "RBLN_VISIBLE_DEVICES")
    assert stops(world) == ["a.service", "b.service", "c.service"]
    assert world["lines"] == [
        f"stopping a.service: it holds port 8001 / devices - that {UNIT} needs",
        f"stopping b.service: it holds port 8009 / devices 0,3 that {UNIT} needs",
        f"stopping c.service: it holds port None / devices 2 that {UNIT} needs",
    ]


def test_make_room_reads_the_devices_as_a_comma_list(world: dict[str, Any]) -> None:
    """``"2,3"`` is the devices 2 and 3 (not its characters), an empty item none: a server
    whose devices are unknown (empty) or another's stays."""
    world["live"] = {
        "comma.service": {"active": "active", "port": 1, "devices": {","}},
        "twothree.service": {"active": "active", "port": 2, "devices": {"2,3"}},
        "empty.service": {"active": "active", "port": 3, "devices": {""}},
        "three.service": {"active": "active", "port": 4, "devices": {"3"}},
    }
    restart_gate.make_room(host_state(), instance(devices="2,3,"))
    assert stops(world) == ["three.service"]
    world["calls"].clear()
    restart_gate.make_room(host_state(), instance(devices=""))  # no devices: the port alone
    assert stops(world) == []


def test_make_room_with_a_numeric_devices_field(world: dict[str, Any]) -> None:
    """A state written with one device as a number (``"devices": 5``) still names it."""
    world["live"] = {"five.service": {"active": "active", "port": 1, "devices": {"5"}}}
    restart_gate.make_room(host_state(), instance(devices=5))
    assert stops(world) == ["five.service"]


# -- start_through_gate ----------------------------------------------------------------------


def test_a_warm_restart_makes_room_restarts_and_passes_the_gate(world: dict[str, Any]) -> None:
    world["live"] = {"old.service": {"active": "active", "port": 8001, "devices": set()}}
    restart_gate.start_through_gate(host_state(), instance(), True)
    assert world["calls"] == [
        ("is_cold", "/nonexistent/cache", UNIT),
        ("live", "RBLN_VISIBLE_DEVICES"),
        ("systemctl", "stop", "old.service"),
        ("systemctl", "enable", "--quiet", "--no-reload", UNIT),
        ("systemctl", "restart", UNIT),
        ("barrier", f"restarted-{UNIT}-fp1"),
        ("check", UNIT, 8001, "acme/m", 7, "10.1.2.3", 7),
    ]
    assert world["lines"][1:] == [
        f"{UNIT}: restarted (gate 7s)",
        f"{UNIT}: healthy on port 8001",
    ]


def test_a_cold_restart_gets_the_prewarm_timeout_and_is_marked_warm(
    world: dict[str, Any],
) -> None:
    world["cold"].add("fp1")
    restart_gate.start_through_gate(host_state(), instance(), True)
    assert ("check", UNIT, 8001, "acme/m", 900, "10.1.2.3", 7) in world["calls"]
    assert world["calls"][-2:] == [
        ("bundle_dirs", "/nonexistent/cache", UNIT, NOW - 1),  # a second before the restart
        ("mark_warm", "/nonexistent/cache", "fp1", ["rbln/m/sig"]),
    ]
    assert world["lines"] == [
        f"{UNIT}: restarted (cold: compiling, gate 900s)",
        f"{UNIT}: healthy on port 8001",
    ]


def test_a_server_that_compiles_nothing_gets_the_prewarm_timeout_and_no_marker(
    world: dict[str, Any],
) -> None:
    """A GPU server (fingerprint ``-``) loads from scratch at each start: the long gate, but
    nothing is marked warm."""
    restart_gate.start_through_gate(host_state(host=None), instance(fingerprint="-"), True)
    assert ("check", UNIT, 8001, "acme/m", 900, "127.0.0.1", 7) in world["calls"]  # host None
    assert not [c for c in world["calls"] if c[0] in ("bundle_dirs", "mark_warm")]
    assert world["lines"] == [f"{UNIT}: restarted (gate 900s)", f"{UNIT}: healthy on port 8001"]


def test_resuming_a_prewarm_restarts_nothing(world: dict[str, Any]) -> None:
    world["cold"].add("fp1")
    restart_gate.start_through_gate(host_state(host=""), instance(), False)
    assert [c[0] for c in world["calls"]] == ["is_cold", "check", "bundle_dirs", "mark_warm"]
    assert world["calls"][1] == ("check", UNIT, 8001, "acme/m", 900, "127.0.0.1", 7)
    assert world["lines"] == [
        f"{UNIT}: runs its unit; resuming the pre-warm (gate 900s)",
        f"{UNIT}: healthy on port 8001",
    ]


def test_a_failed_gate_raises_with_the_journal_and_marks_nothing(world: dict[str, Any]) -> None:
    world["cold"].add("fp1")
    world["why"] = "answered 500"
    with pytest.raises(systemd_units.Failed) as failed:
        restart_gate.start_through_gate(host_state(), instance(), True)
    assert str(failed.value) == f"health gate: {UNIT}: answered 500"
    assert failed.value.journal == f"journal of {UNIT}\n"
    assert not [c for c in world["calls"] if c[0] in ("bundle_dirs", "mark_warm")]
    assert f"{UNIT}: healthy on port 8001" not in world["lines"]


# -- recheck_peers ---------------------------------------------------------------------------


@pytest.fixture
def peers(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """pd_probe, unit_state, api_key and the gate recorded; ``broken``: decodes failing until
    restarted."""
    w: dict[str, Any] = {"broken": set(), "probes": [], "states": [], "gates": [], "lines": []}

    def pd_probe(prefill: str, decode: str, model: str, limit: float, key: Any = None) -> Any:
        w["probes"].append((prefill, decode, model, limit, key))
        return "answered 500" if decode in w["broken"] else None

    def unit_state(unit: str) -> str:
        w["states"].append(unit)
        return f"state of {unit}"

    def gate(state: dict[str, Any], inst: dict[str, Any], restart: bool) -> None:
        w["gates"].append((state["model"], inst["unit"], restart))
        w["broken"].discard(inst["worker"])

    monkeypatch.setattr(health, "pd_probe", pd_probe)
    monkeypatch.setattr(health, "unit_state", unit_state)
    monkeypatch.setattr(health, "api_key", lambda st: f"key from {st}")
    monkeypatch.setattr(restart_gate, "start_through_gate", gate)
    monkeypatch.setattr(systemd_units, "log", w["lines"].append)
    return w


def pd_state(*roles: str) -> dict[str, Any]:
    return {
        "model": "acme/m",
        "health_timeout": 7,
        "instances": [
            {"unit": f"u{i}.service", "role": r, "worker": f"http://h:{8000 + i}"}
            for i, r in enumerate(roles)
        ],
    }


def test_each_probe_carries_the_model_the_health_timeout_and_the_first_units_key(
    peers: dict[str, Any],
) -> None:
    restart_gate.recheck_peers(pd_state("prefill", "decode", "decode"), ["http://p:1"])
    assert peers["states"] == ["u0.service"]  # the host's first unit gives the key
    assert peers["probes"] == [
        ("http://p:1", "http://h:8001", "acme/m", 7, "key from state of u0.service"),
        ("http://p:1", "http://h:8002", "acme/m", 7, "key from state of u0.service"),
    ]
    assert peers["lines"] == [
        "u1.service: a request from each of 1 prefill(s) passed",
        "u2.service: a request from each of 1 prefill(s) passed",
    ]


def test_a_failing_decode_is_restarted_through_its_gate_and_says_so(
    peers: dict[str, Any],
) -> None:
    peers["broken"].add("http://h:8000")
    restart_gate.recheck_peers(pd_state("decode"), ["http://p:1", "http://p:2"])
    assert peers["gates"] == [("acme/m", "u0.service", True)]
    assert peers["lines"] == [
        "u0.service: a request through prefill and decode failed (answered 500): restarting it",
        "u0.service: a request from each of 2 prefill(s) passed",
    ]


def test_without_instances_or_prefills_nothing_is_asked(peers: dict[str, Any]) -> None:
    restart_gate.recheck_peers({"model": "m", "health_timeout": 7, "instances": []}, ["http://p"])
    restart_gate.recheck_peers(pd_state("decode", "decode"), [])
    no_worker = pd_state("decode")
    no_worker["instances"][0]["worker"] = ""
    restart_gate.recheck_peers(no_worker, ["http://p:1"])
    assert peers["states"] == ["u0.service", "u0.service"]  # none asked for no instance
    assert peers["probes"] == [] and peers["gates"] == [] and peers["lines"] == []
