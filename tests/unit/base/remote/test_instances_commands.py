"""``remote/instances.py``'s commands in-process (issue #37's mutation campaign): ``main``'s
command lines (``current``, ``router -``, ``peers STATE_DIR -``, the usage for anything else) and
the lock each takes; ``locked``'s restore and rollback (none to go back to, a rollback by hand
that swaps good and previous, a restore that fails its gate); ``converge``'s good run (the kept
unit texts, ``good.json`` and ``previous.json``, the clean-up, the warm caches swept and sealed)
and a rollback that fails too; ``report``'s lines. systemd, the gates, the router and the warm
markers are the test's; the state files are real, in a temporary serve root."""

from __future__ import annotations

import io
import json
import os
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

UNIT = "servefleet-vllm-0.service"
JOURNAL = "vllm: starting\nvllm: trouble\n"


def unit_text(sha: str) -> str:
    return f'[Service]\nEnvironment="{layout.UNIT_SHA_VAR}={sha}"\nExecStart=/bin/true {sha}\n'


def a_state(release: str, sha: str, text: bool = False, **over: Any) -> dict[str, Any]:
    inst: dict[str, Any] = {"unit": UNIT, "sha": sha, "port": 8000, "devices": "0",
                            "fingerprint": f"fp-{sha}"}  # fmt: skip
    if text:
        inst["text"] = unit_text(sha)
    state: dict[str, Any] = {
        "root": "/opt/servefleet", "release": release, "model": "acme/m", "host": None,
        "cache_root": "", "devices_env": "RBLN_VISIBLE_DEVICES", "health_timeout": 5,
        "prewarm_timeout": 5, "instances": [inst], "stale": [],
    }  # fmt: skip
    return state | over


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, Any]:
    """A serve root (``root``: its ``state`` dir, releases r0-r2 and r9, ``current`` -> r1)
    whose one instance runs sha a1 (``running``); gates of a sha in ``fail`` fail. Calls to the
    gate, the router, the re-check and the warm caches are recorded in ``calls``."""
    root = tmp_path / "opt"
    state_dir = root / layout.STATE
    (state_dir / layout.KEPT_UNITS).mkdir(parents=True)
    for release in ("r0", "r1", "r2", "r9"):
        (root / layout.RELEASES / release).mkdir(parents=True)
    os.symlink(f"{layout.RELEASES}/r1", root / layout.CURRENT)
    units = tmp_path / "units"
    units.mkdir()
    (units / UNIT).write_text(unit_text("a1"))
    w: dict[str, Any] = {"root": root, "state_dir": state_dir, "units": units,
                         "running": {UNIT: "a1"}, "fail": set(), "calls": [], "lines": []}  # fmt: skip
    calls: list[tuple[Any, ...]] = w["calls"]

    def live(devices_env: str) -> dict[str, dict[str, Any]]:
        return {u: {"active": "active", "sha": s, "port": 8000, "devices": {"0"}}
                for u, s in w["running"].items()}  # fmt: skip

    def gate(state: dict[str, Any], inst: dict[str, Any], restart: bool) -> None:
        calls.append(("gate", inst["sha"], restart))
        w["running"][inst["unit"]] = inst["sha"]
        if inst["sha"] in w["fail"]:
            raise systemd_units.Failed(f"health gate: {inst['unit']}: answered 500", JOURNAL)

    def systemctl(*args: str, check: bool = True) -> str:
        calls.append(("systemctl", *args))
        return ""

    monkeypatch.setattr(systemd_units, "UNIT_DIR", units)
    monkeypatch.setattr(systemd_units, "systemctl", systemctl)
    monkeypatch.setattr(systemd_units, "show", lambda units, *props: [{} for _ in units])
    monkeypatch.setattr(systemd_units, "live", live)
    monkeypatch.setattr(systemd_units, "file_key", lambda: None)
    monkeypatch.setattr(systemd_units, "log", w["lines"].append)
    monkeypatch.setattr(warm_state, "is_cold", lambda state, inst: False)
    monkeypatch.setattr(warm_state, "sweep", lambda root: calls.append(("sweep", root)))
    monkeypatch.setattr(
        warm_state, "seal_warm", lambda root, fps: calls.append(("seal", root, fps))
    )
    monkeypatch.setattr(restart_gate, "start_through_gate", gate)
    monkeypatch.setattr(restart_gate, "recheck_peers",
                        lambda state, prefills: calls.append(("recheck", prefills)))  # fmt: skip
    monkeypatch.setattr(rotation, "bring_router",
                        lambda state: calls.append(("router", state.get("router"))))  # fmt: skip
    return w


def keep(host: dict[str, Any], name: str, state: dict[str, Any]) -> None:
    """``state`` written as the kept ``name`` (good.json, previous.json) with its unit texts."""
    (host["state_dir"] / name).write_text(json.dumps(state))
    for inst in state["instances"]:
        (host["state_dir"] / layout.KEPT_UNITS / f"{inst['sha']}.service").write_text(
            unit_text(inst["sha"])
        )


def current(host: dict[str, Any]) -> str:
    return os.readlink(host["root"] / layout.CURRENT)


def gates(host: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [c for c in host["calls"] if c[0] == "gate"]


# -- converge ----------------------------------------------------------------------------------


def test_a_good_converge_keeps_its_state_and_units_and_seals_the_warm_caches(
    host: dict[str, Any],
) -> None:
    good = a_state("r1", "a1")
    keep(host, layout.GOOD, good)
    desired = a_state("r2", "b2", text=True, cache_root="/srv/cache")
    desired["instances"].append({**desired["instances"][0], "unit": "servefleet-vllm-1.service",
                                 "port": 8001, "devices": "1", "fingerprint": None})  # fmt: skip
    file = host["state_dir"] / layout.DESIRED
    file.write_text(json.dumps(desired))
    assert instances.converge(file) == 0
    assert gates(host) == [("gate", "b2", True), ("gate", "b2", True)]
    state_dir = host["state_dir"]
    assert (state_dir / layout.KEPT_UNITS / "b2.service").read_text() == unit_text("b2")
    assert json.loads((state_dir / layout.PREVIOUS).read_text()) == good
    recorded = json.loads((state_dir / layout.GOOD).read_text())
    assert recorded["release"] == "r2" and "stale" not in recorded
    assert all("text" not in i for i in recorded["instances"])
    released = sorted(p.name for p in (host["root"] / layout.RELEASES).iterdir())
    assert released == ["r1", "r2"]  # r0 and r9: named by nothing (current is r1 still)
    assert host["calls"][-2:] == [("sweep", "/srv/cache"), ("seal", "/srv/cache", ["fp-b2", ""])]


def test_a_converge_without_a_cache_root_sweeps_nothing(host: dict[str, Any]) -> None:
    file = host["state_dir"] / layout.DESIRED
    file.write_text(json.dumps(a_state("r2", "b2", text=True)))
    assert instances.converge(file) == 0
    assert not [c for c in host["calls"] if c[0] in ("sweep", "seal")]


def test_a_rollback_that_fails_too_says_so(
    host: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    keep(host, layout.GOOD, a_state("r1", "a1"))
    host["fail"] |= {"b2", "a1"}
    file = host["state_dir"] / layout.DESIRED
    file.write_text(json.dumps(a_state("r2", "b2", text=True)))
    assert instances.converge(file) == 1
    tail = f"--- journal tail of {UNIT} ---\n{JOURNAL}"
    assert capsys.readouterr().err == (
        f"servefleet: health gate: {UNIT}: answered 500\n{tail}"
        f"servefleet: health gate: {UNIT}: answered 500\n{tail}"
        "servefleet: rolling back to r1 failed too\n"
    )
    assert gates(host) == [("gate", "b2", True), ("gate", "a1", True)]
    assert current(host) == f"{layout.RELEASES}/r1"


def test_a_failed_converge_without_a_good_state_says_only_that(
    host: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    host["fail"].add("b2")
    file = host["state_dir"] / layout.DESIRED
    file.write_text(json.dumps(a_state("r2", "b2", text=True)))
    assert instances.converge(file) == 1
    assert capsys.readouterr() == ("", (
        f"servefleet: health gate: {UNIT}: answered 500\n--- journal tail of {UNIT} ---\n{JOURNAL}"
        "servefleet: no earlier good state on this host to roll back to\n"
    ))  # fmt: skip
    assert gates(host) == [("gate", "b2", True)]


# -- report ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "journal", "err"),
    [
        (f"health gate: {UNIT}: answered 500", JOURNAL,
         f"servefleet: health gate: {UNIT}: answered 500\n--- journal tail of {UNIT} ---\n{JOURNAL}"),
        (f"health gate: {UNIT}: not answering: a: b", "j\n",
         f"servefleet: health gate: {UNIT}: not answering: a: b\n--- journal tail of {UNIT} ---\nj\n"),
        (f"{UNIT}: prefill/decode re-check: x", "j\n",
         f"servefleet: {UNIT}: prefill/decode re-check: x\n--- journal tail of  ---\nj\n"),
        ("systemctl restart x: failed", "", "servefleet: systemctl restart x: failed\n"),
    ],
    ids=["gate", "gate-colons", "other", "no-journal"],
)  # fmt: skip
def test_report_names_the_gates_unit_over_its_journal(
    capsys: pytest.CaptureFixture[str], message: str, journal: str, err: str
) -> None:
    instances.report(systemd_units.Failed(message, journal))
    assert capsys.readouterr() == ("", err)


# -- main and locked ---------------------------------------------------------------------------


def test_current_points_the_link_at_the_release(host: dict[str, Any]) -> None:
    assert instances.main(["current", str(host["root"]), "r2"]) == 0
    assert current(host) == f"{layout.RELEASES}/r2"


@pytest.mark.parametrize(
    "argv",
    [[], ["converge"], ["converge", "a", "b"], ["bogus", "x"], ["router", "x"], ["router"],
     ["peers", "d", "x"], ["peers", "-"], ["current", "a"], ["current", "a", "b", "c"]],
)  # fmt: skip
def test_any_other_command_line_prints_the_usage(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert instances.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == instances.__doc__.split("\n\n")[1] + "\n"
    assert err.startswith("usage: instances.py converge STATE.json")


def test_router_reads_its_state_on_stdin(
    host: dict[str, Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[dict[str, Any]] = []
    monkeypatch.setattr(rotation, "bring_router", seen.append)
    doc = {"router": {"unit": "r"}, "model": "m", "instances": ["ignored"]}
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(doc)))
    assert instances.main(["router", "-"]) == 0
    assert seen == [{"router": {"unit": "r"}, "model": "m", "instances": []}]

    def fails(state: dict[str, Any]) -> None:
        raise systemd_units.Failed("health gate: servefleet-router.service: answered 502", "j\n")

    monkeypatch.setattr(rotation, "bring_router", fails)
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(doc)))
    assert instances.main(["router", "-"]) == 1
    assert capsys.readouterr().err == (
        "servefleet: health gate: servefleet-router.service: answered 502\n"
        "--- journal tail of servefleet-router.service ---\nj\n"
    )


def test_peers_rechecks_the_prefills_of_stdin_under_the_lock(
    host: dict[str, Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    state_dir = host["root"] / "other-state"
    seen: list[tuple[dict[str, Any], list[str]]] = []

    def recheck(state: dict[str, Any], prefills: list[str]) -> None:
        assert (state_dir / layout.STATE_LOCK).exists()  # taken before the re-check
        seen.append((state, prefills))
        if state.get("fail"):
            raise systemd_units.Failed(f"{UNIT}: prefill/decode re-check: answered 500")

    monkeypatch.setattr(restart_gate, "recheck_peers", recheck)
    for doc in ({"model": "m", "prefills": ["http://p:1", 8000]}, {"model": "m"}):
        monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(doc)))
        assert instances.main(["peers", str(state_dir), "-"]) == 0
    assert seen == [({"model": "m", "prefills": ["http://p:1", 8000]}, ["http://p:1", "8000"]),
                    ({"model": "m"}, [])]  # fmt: skip
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps({"fail": True, "prefills": []})))
    assert instances.main(["peers", str(state_dir), "-"]) == 1
    assert capsys.readouterr().err == f"servefleet: {UNIT}: prefill/decode re-check: answered 500\n"


def test_restore_without_a_good_state_changes_nothing(
    host: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    assert instances.main(["restore", str(host["state_dir"])]) == 0
    assert (host["state_dir"] / layout.STATE_LOCK).exists()  # the state dir's own lock
    assert not (host["root"] / layout.STATE_LOCK).exists()
    assert capsys.readouterr() == (
        "",
        "servefleet: no good state on this host; nothing to restore\n",
    )
    assert host["calls"] == []


def test_rollback_without_a_previous_state_fails(
    host: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    keep(host, layout.GOOD, a_state("r1", "a1"))
    assert instances.main(["rollback", str(host["state_dir"])]) == 1
    assert capsys.readouterr() == (
        "",
        "servefleet: no previous state on this host; nothing to rollback\n",
    )
    assert host["calls"] == []


def test_converge_takes_the_lock_of_its_files_directory(
    host: dict[str, Any], tmp_path: Path
) -> None:
    there = tmp_path / "elsewhere"
    there.mkdir()
    (there / layout.DESIRED).write_text(json.dumps(a_state("r2", "b2", text=True)))
    assert instances.main(["converge", str(there / layout.DESIRED)]) == 0
    assert (there / layout.STATE_LOCK).exists()
    assert not (host["state_dir"] / layout.STATE_LOCK).exists()
    assert gates(host) == [("gate", "b2", True)]


def test_a_rollback_by_hand_swaps_good_and_previous(
    host: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    good, previous = a_state("r1", "a1"), a_state("r0", "a0")
    keep(host, layout.GOOD, good)
    keep(host, layout.PREVIOUS, previous)
    (host["state_dir"] / layout.KEPT_UNITS / "c3.service").write_text(unit_text("c3"))
    (host["units"] / "servefleet-vllm-7.service").write_text(unit_text("c3"))  # no group now
    assert instances.main(["rollback", str(host["state_dir"])]) == 0
    assert capsys.readouterr() == ("servefleet: rolled back to r0\n", "")
    assert gates(host) == [("gate", "a0", True)]
    assert json.loads((host["state_dir"] / layout.GOOD).read_text()) == previous
    assert json.loads((host["state_dir"] / layout.PREVIOUS).read_text()) == good
    assert current(host) == f"{layout.RELEASES}/r0"
    assert (host["units"] / UNIT).read_text() == unit_text("a0")
    assert not (host["units"] / "servefleet-vllm-7.service").exists()
    assert ("systemctl", "disable", "--now", "--quiet", "servefleet-vllm-7.service") in host[
        "calls"
    ]
    # the clean-up: what neither state names is gone
    assert not (host["state_dir"] / layout.KEPT_UNITS / "c3.service").exists()
    assert sorted(p.name for p in (host["root"] / layout.RELEASES).iterdir()) == ["r0", "r1"]


def test_a_restore_whose_gate_fails_reports_it(
    host: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    keep(host, layout.GOOD, a_state("r1", "a1"))
    host["running"][UNIT] = "b2"
    host["fail"].add("a1")
    assert instances.main(["restore", str(host["state_dir"])]) == 1
    assert capsys.readouterr() == (
        "",
        f"servefleet: health gate: {UNIT}: answered 500\n--- journal tail of {UNIT} ---\n{JOURNAL}",
    )
    assert (host["state_dir"] / layout.PREVIOUS).exists() is False


def test_a_restore_brings_back_the_good_state(host: dict[str, Any]) -> None:
    keep(host, layout.GOOD, a_state("r0", "a0"))
    assert instances.main(["restore", str(host["state_dir"])]) == 0
    assert gates(host) == [("gate", "a0", True)]
    assert current(host) == f"{layout.RELEASES}/r0"
    assert not (host["state_dir"] / layout.PREVIOUS).exists()  # a restore records nothing
