"""``instances.bring_to`` in-process (issue #37's mutation campaign): which instances restart
(another sha, another API key for a unit that reads the key file and none for one that does not,
a process older than its release, a unit not running), which only resume a cold pre-warm (no
restart, no router call), what the gate is given, the host read again after each gate, the stale
units disabled and removed with one daemon-reload, the router brought last, and the
prefill/decode re-check after a prefill or decode restarted. systemd, the gate, the router and
the warm markers are the test's; every call is recorded in order."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from repo_paths import REMOTE

sys.path.insert(0, str(REMOTE))
import instances  # noqa: E402  (host programs: imported as the host imports them)
import layout  # noqa: E402
import restart_gate  # noqa: E402
import rotation  # noqa: E402
import systemd_units  # noqa: E402
import warm_state  # noqa: E402

KEYED = f"EnvironmentFile={layout.API_KEY_FILE}"
ADMIN = "http://10.0.0.9:8081"


def unit(i: int) -> str:
    return f"servefleet-vllm-{i}.service"


def inst(i: int, sha: str = "new", text: str = "", **over: Any) -> dict[str, Any]:
    return {"unit": unit(i), "sha": sha, "fingerprint": f"fp{i}", "text": f"[Service]\n{text}",
            "worker": f"http://h:{8000 + i}"} | over  # fmt: skip


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, Any]:
    """``running``: unit -> what ``live`` says of it (a missing unit is not running); ``cold``:
    fingerprints not warm; ``after_gate``: a function run after each gate; ``key``: the key
    file's key. Each call lands in ``calls``."""
    w: dict[str, Any] = {"running": {}, "cold": set(), "after_gate": None, "key": None,
                         "calls": [], "lines": [], "units": tmp_path}  # fmt: skip
    calls: list[tuple[Any, ...]] = w["calls"]

    def live(devices_env: str) -> dict[str, dict[str, Any]]:
        calls.append(("live", devices_env))
        return {u: {"active": "active", "key": None} | now for u, now in w["running"].items()}

    def gate(state: dict[str, Any], inst: dict[str, Any], restart: bool) -> None:
        calls.append(("gate", inst["unit"], restart))
        assert state is w["state"]
        w["running"][inst["unit"]] = {"sha": inst["sha"], "key": w["key"]}
        if w["after_gate"]:
            w["after_gate"](inst)

    def is_cold(state: dict[str, Any], inst: dict[str, Any]) -> bool:
        assert state is w["state"]
        return inst["fingerprint"] in w["cold"]

    def systemctl(*args: str, check: bool = True) -> str:
        calls.append(("systemctl", *args, check))
        return ""

    monkeypatch.setattr(systemd_units, "UNIT_DIR", tmp_path)
    monkeypatch.setattr(systemd_units, "write_units", lambda state: calls.append(("write",)))
    monkeypatch.setattr(systemd_units, "daemon_reload_if_needed",
                        lambda units: calls.append(("reload if needed", *units)))  # fmt: skip
    monkeypatch.setattr(systemd_units, "live", live)
    monkeypatch.setattr(systemd_units, "file_key", lambda: w["key"])
    monkeypatch.setattr(systemd_units, "systemctl", systemctl)
    monkeypatch.setattr(systemd_units, "log", w["lines"].append)
    monkeypatch.setattr(warm_state, "is_cold", is_cold)
    monkeypatch.setattr(restart_gate, "start_through_gate", gate)
    monkeypatch.setattr(restart_gate, "recheck_peers",
                        lambda state, own: calls.append(("recheck", state is w["state"], *own)))  # fmt: skip
    monkeypatch.setattr(rotation, "router_call",
                        lambda admin, verb, worker: calls.append((verb, admin, worker)))  # fmt: skip
    monkeypatch.setattr(rotation, "bring_router",
                        lambda state: calls.append(("router", state is w["state"])))  # fmt: skip
    return w


def bring(host: dict[str, Any], *insts: dict[str, Any], **over: Any) -> list[tuple[Any, ...]]:
    state: dict[str, Any] = {"devices_env": "RBLN_VISIBLE_DEVICES", "instances": list(insts)}
    host["state"] = state | over
    instances.bring_to(host["state"])
    return [c for c in host["calls"] if c[0] in ("gate", "add", "remove", "recheck")]


def test_what_restarts_and_what_does_not(host: dict[str, Any]) -> None:
    host["key"] = "k-new"
    host["running"] = {
        unit(0): {"sha": "new", "key": "k-new"},  # keyed, the file's key: converged
        unit(1): {"sha": "new", "key": "k-old"},  # keyed, another key: restarts
        unit(2): {"sha": "new"},  # not keyed, no key: converged
        unit(3): {"sha": "new", "key": "k-new"},  # not keyed but a key: restarts
        unit(4): {"sha": "old"},  # another sha
        unit(5): {"sha": "new", "older_than_release": True},  # its release was installed since
        unit(6): {"sha": "new", "older_than_release": False},
        unit(8): {"sha": "new", "active": "activating"},
    }
    gated = bring(host, inst(0, text=KEYED), inst(1, text=KEYED), inst(2), inst(3), inst(4),
                  inst(5), inst(6), inst(7), inst(8))  # fmt: skip
    assert gated == [("gate", unit(i), True) for i in (1, 3, 4, 5, 7, 8)]


def test_each_step_in_order_with_the_router(host: dict[str, Any]) -> None:
    host["running"] = {unit(0): {"sha": "old"}, unit(1): {"sha": "new"}}
    bring(host, inst(0), inst(1), routers=[ADMIN, "http://r2"])
    assert host["calls"] == [
        ("write",),
        ("reload if needed", unit(0), unit(1)),
        ("live", "RBLN_VISIBLE_DEVICES"),
        ("remove", ADMIN, "http://h:8000"),
        ("remove", "http://r2", "http://h:8000"),
        ("gate", unit(0), True),
        ("add", ADMIN, "http://h:8000"),
        ("add", "http://r2", "http://h:8000"),
        ("live", "RBLN_VISIBLE_DEVICES"),
        ("reload if needed", unit(0), unit(1)),  # after the --no-reload enables
        ("router", True),
    ]


def test_a_cold_instance_resumes_its_prewarm_out_of_no_rotation(host: dict[str, Any]) -> None:
    host["running"] = {unit(0): {"sha": "new"}, unit(1): {"sha": "old"}}
    host["cold"] |= {"fp0", "fp1"}
    gated = bring(host, inst(0), inst(1, worker=None), inst(2, worker=""), routers=[ADMIN])
    assert gated == [("gate", unit(0), False), ("gate", unit(1), True), ("gate", unit(2), True)]
    assert host["calls"].count(("live", "RBLN_VISIBLE_DEVICES")) == 4  # again after each gate


def test_the_host_is_read_again_after_each_gate(host: dict[str, Any]) -> None:
    """A gate's room-making can leave the next instance running what it should (here: the
    test's gate says so): it is not restarted a second time."""
    host["running"] = {unit(0): {"sha": "old"}, unit(1): {"sha": "old"}}

    def also_one(gated: dict[str, Any]) -> None:
        host["running"][unit(1)] = {"sha": "new"}

    host["after_gate"] = also_one
    assert bring(host, inst(0), inst(1)) == [("gate", unit(0), True)]


def test_stale_units_are_disabled_and_removed_with_one_reload(host: dict[str, Any]) -> None:
    (host["units"] / unit(7)).write_text("[Service]\n")
    host["running"] = {unit(0): {"sha": "new"}}
    bring(host, inst(0), stale=[unit(7), unit(9)])
    assert not (host["units"] / unit(7)).exists()
    assert host["calls"][-3:] == [
        ("systemctl", "disable", "--now", "--quiet", unit(7), False),
        ("systemctl", "daemon-reload", True),
        ("router", True),
    ]
    assert host["lines"] == [f"{unit(7)}: removed (no device group for it now)"]
    assert host["calls"].count(("reload if needed", unit(0))) == 1  # the first one only


@pytest.mark.parametrize(
    ("roles", "over", "recheck"),
    [
        (
            ["prefill", "decode", "prefill"],
            {},
            [("recheck", True, "http://h:8000", "http://h:8002")],
        ),
        (["main", "decode", "prefill"], {}, []),  # not restarted
        (["decode", "main", "prefill"], {}, [("recheck", True, "http://h:8002")]),
        (["prefill", "decode"], {"pd": False}, []),
        (["prefill", "decode"], {"router": None}, []),
    ],
)
def test_a_restarted_prefill_or_decode_rechecks_the_hosts_pools(
    host: dict[str, Any], roles: list[str], over: dict[str, Any], recheck: list[tuple[str, ...]]
) -> None:
    host["running"] = {unit(i): {"sha": "new"} for i in range(1, len(roles))}
    insts = [inst(i, role=role) for i, role in enumerate(roles)]
    gated = bring(host, *insts, **({"pd": True, "router": {"unit": "r"}} | over))
    assert gated == [("gate", unit(0), True), *recheck]
