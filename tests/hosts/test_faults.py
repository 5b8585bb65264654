"""Trustworthy under faults, on the lab fleet with the real pyinfra CLI: runs converge to what
runs (not to what an earlier run wrote), failed hosts roll back, standalone deploys keep serving,
bad data and hostile input never reach a host. Every assertion reads state back from the hosts.

Each test starts from the default data, converged on every host, no fault switch or barrier set
(``settled``); those that make the change start with it cold (``change_cold``). None leans on
what another test left.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from faults import (
    BARRIERS,
    CHANGE,
    CHANGE_RESOLVE,
    PORTS,
    REPO,
    changed_ops,
    check_converged,
    compile_log,
    hold,
    make_change_cold,
    op_names,
    record,
    release,
    resolved,
    restart_point,
    run,
    run_killed,
    run_many,
    running_sig,
    runs_argv,
    secrets,
    totals,
)
from labhelpers import on_host

from servefleet.base.shipped import FILES
from servefleet.fleet.lab.chat import chat_once

TWO = ["lab1", "lab2"]
LIMIT = ["--limit", "lab1", "--limit", "lab2"]
BASE = resolved()["servers"][0]["argv"]


def ok(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]
    return proc


def chat(state: dict[str, Any], host: str, port: int) -> str:
    address = next(h["address"] for h in state["hosts"] if h["name"] == host)
    return chat_once(address, port, "openai/gpt-oss-120b", "Hello", max_tokens=4)


def units_and_releases(state: dict[str, Any]) -> dict[str, str]:
    """Every unit file's bytes and the release list, per host (for byte-identical checks)."""
    out = {}
    for host in ("lab1", "lab2", "lab3"):
        out[host] = on_host(
            state, host,
            "cat /etc/systemd/system/servefleet-vllm-*.service 2>/dev/null; "
            "ls /opt/servefleet/releases 2>/dev/null; readlink /opt/servefleet/current || true",
        ).stdout  # fmt: skip
    return out


@pytest.fixture
def settled(lab: dict[str, Any]) -> dict[str, Any]:
    """The default data, converged on every host (the start of each test here): no fault switch
    of the simulation and no test barrier left on any host, then one run of the default data."""
    for host in ("lab1", "lab2", "lab3"):
        on_host(lab, host, "rm -rf /etc/rbln-sim/fail-start /etc/rbln-sim/fail-health "
                f"{BARRIERS}")  # fmt: skip
    ok(run(lab))
    return lab


@pytest.fixture
def change_cold(settled: dict[str, Any]) -> dict[str, Any]:
    """``settled``, and the change cold on lab1 and lab2: a run of it goes through every phase."""
    make_change_cold(settled, TWO)
    return settled


# -- SIGKILL of the controller, one point in each phase -------------------------------------

# phase -> (the operation whose start is the fault point, the port of the instance the converge
# restarted on the change there). A point inside the converge is a barrier the host program
# waits at (``faults.hold``), right after it restarted that instance, before its gate: the
# controller is killed there, never in a race with the converge.
PHASES = {
    "driver": (lambda n, name: "Install driver 3.6.0" in name, None),
    "release": (lambda n, name: "Install release" in name, None),
    "models": (lambda n, name: "Fetch nvidia/gpt-oss-120b-Eagle3-v3" in name, None),
    "units": (lambda n, name: "Upload the desired state" in name, None),
    # inside the converge: instance 0 restarted on the change and compiling
    "pre-warm": (lambda n, name: "Converge the instances" in name, 8000),
    # inside the converge: instance 1 restarted on the change (instance 0 warm and healthy)
    "restarts": (lambda n, name: "Converge the instances" in name, 8001),
}


@pytest.mark.parametrize("phase", list(PHASES))
def test_controller_killed_in_each_phase_then_the_next_run_converges(
    change_cold: dict[str, Any], phase: str
) -> None:
    lab = change_cold
    old_sig = running_sig(lab, "lab1")
    change = resolved(*CHANGE_RESOLVE)
    change_argv = change["servers"][0]["argv"]
    before = {h: len(compile_log(lab, h)) for h in TWO}
    at, port = PHASES[phase]
    then = None
    if port:
        unit = f"servefleet-vllm-{port - PORTS[0]}.service"
        reached = hold(lab, TWO, restart_point(unit, change["compile_fingerprint"]))

        def then() -> bool:  # both hosts wait right after restarting `unit` on the change
            return reached() and all(runs_argv(lab, h, port, change_argv) for h in TWO)

    try:
        started, killed = run_killed(lab, *LIMIT, *CHANGE, at=at, then=then)
    finally:
        release(lab, TWO)
    assert killed, f"the run ended before the {phase} fault point: {started}"
    ok(run(lab, *LIMIT, *CHANGE))
    check_converged(lab, TWO, before, LIMIT)
    for host in TWO:
        assert all(chat(lab, host, p) for p in PORTS)
    assert running_sig(lab, "lab1") != old_sig


def test_fault_points_cover_every_phase(change_cold: dict[str, Any]) -> None:
    """The operations of the change, as a --dry run lists them, hold each phase's fault point."""
    names = op_names(change_cold, *LIMIT, *CHANGE)
    for phase, (at, _) in PHASES.items():
        assert any(at(i + 1, n) for i, n in enumerate(names)), f"no {phase} operation in {names}"


# -- a failed gate rolls the host back; the same change then converges -----------------------


def test_gate_failure_at_instance_1_rolls_back_then_the_change_converges(
    settled: dict[str, Any],
) -> None:
    lab = settled
    throughput = resolved("--target", "throughput")["servers"][0]["argv"]
    # only the Throughput server on port 8001 of lab2 fails its health check
    on_host(
        lab, "lab2", "printf '%s\\n' '--max-num-seqs 8' '--port 8001' > /etc/rbln-sim/fail-health"
    )
    try:
        proc = run(
            lab, *LIMIT, "--data", "serve_target=Throughput", "--data", "serve_health_timeout=8"
        )
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0
        assert "servefleet: health gate: servefleet-vllm-1.service" in out
        assert "--- journal tail of servefleet-vllm-1.service ---" in out
        good = on_host(
            lab,
            "lab2",
            'python3 -c "import json; print(json.load(open('
            "'/opt/servefleet/state/good.json'))['release'])\"",
        ).stdout.strip()
        assert f"rolled back to {good}" in out
        for port in PORTS:  # lab2: every instance back on the old selection, serving
            assert runs_argv(lab, "lab2", port, BASE), f"lab2:{port} not rolled back"
            assert chat(lab, "lab2", port)
            assert runs_argv(lab, "lab1", port, throughput), f"lab1:{port} did not converge"
    finally:
        on_host(lab, "lab2", "rm -f /etc/rbln-sim/fail-health")
    ok(run(lab, *LIMIT, "--data", "serve_target=Throughput"))
    for host in TWO:
        for port in PORTS:
            assert runs_argv(lab, host, port, throughput), f"{host}:{port} not on Throughput"
    assert totals(run(lab, "--json", *LIMIT, "--data", "serve_target=Throughput"))["success"] == 0


def test_selection_fault_on_one_host_rolls_back_and_keeps_serving(settled: dict[str, Any]) -> None:
    lab = settled
    change_argv = resolved(*CHANGE_RESOLVE)["servers"][0]["argv"]
    # the new selection fails to start on lab2 (a text of its argv in the switch), the old runs
    on_host(lab, "lab2", "echo '--max-num-seqs 8' > /etc/rbln-sim/fail-start")
    try:
        proc = run(lab, *LIMIT, *CHANGE, "--data", "serve_health_timeout=20")
        assert proc.returncode != 0
        assert "rolled back to" in proc.stdout + proc.stderr
        for port in PORTS:
            assert runs_argv(lab, "lab2", port, BASE) and chat(lab, "lab2", port)
            assert runs_argv(lab, "lab1", port, change_argv) and chat(lab, "lab1", port)
    finally:
        on_host(lab, "lab2", "rm -f /etc/rbln-sim/fail-start")


# -- standalone deploys ------------------------------------------------------------------------


def test_stack_twice_never_removes_the_release_units_name(settled: dict[str, Any]) -> None:
    lab = settled
    serving = on_host(lab, "lab1", "readlink /opt/servefleet/current").stdout.strip()
    for selection in ("lmcache=cpu", "spec_decode=suffix"):
        stack = ["--limit", "lab1", "--data", f"serve_selection={selection}"]
        ok(run(lab, *stack, deploy_file="deploys/stack.py"))
    on_host(lab, "lab1", f"test -f /opt/servefleet/{serving}/.servefleet-release.json")
    # a crash of a server now restarts it from the release its unit names
    rec = record(lab, "lab1", 8000)
    assert rec
    on_host(lab, "lab1", f"kill -9 {rec['pid']}")
    on_host(
        lab,
        "lab1",
        "for i in $(seq 60); do curl -sf localhost:8000/health && exit 0; sleep 0.5; done; exit 1",
        check=False,
    )
    state = on_host(
        lab, "lab1", "systemctl show -p ExecMainStatus -p ActiveState servefleet-vllm-0.service"
    ).stdout
    assert "ActiveState=active" in state and "ExecMainStatus=203" not in state, state
    assert runs_argv(lab, "lab1", 8000, BASE)
    ok(run(lab, "--limit", "lab1"))  # back to the default release; the others may go now
    kept = on_host(lab, "lab1", "ls /opt/servefleet/releases").stdout.split()
    named = set(
        re.findall(
            r"/releases/([0-9a-f]+)/",
            on_host(lab, "lab1", "cat /etc/systemd/system/servefleet-vllm-*.service").stdout,
        )
    )
    states = json.loads(on_host(lab, "lab1", "cat /opt/servefleet/state/good.json").stdout)
    assert named <= set(kept) and states["release"] in kept
    assert len(kept) <= 3, f"releases nothing names are removed: {kept}"


def test_driver_deploy_alone_brings_the_servers_back(settled: dict[str, Any]) -> None:
    lab = settled
    ok(
        run(
            lab,
            "--limit",
            "lab1",
            "--data",
            "driver_version=3.6.0",
            deploy_file="deploys/driver.py",
        )
    )
    assert json.loads(on_host(lab, "lab1", "rbln-smi -j").stdout)["KMD_version"] == "3.6.0"
    for port in PORTS:
        assert runs_argv(lab, "lab1", port, BASE) and chat(lab, "lab1", port)
    ok(run(lab, "--limit", "lab1", deploy_file="deploys/driver.py"))  # back to 3.5.1
    for port in PORTS:
        assert chat(lab, "lab1", port)


def test_failed_driver_install_shows_its_log_and_servers_run_again(
    settled: dict[str, Any],
) -> None:
    lab = settled
    # the runfile refuses an option it does not know (exit 2), after the servers were stopped
    proc = run(
        lab,
        "--limit",
        "lab1",
        "--data",
        "driver_version=3.6.0",
        "--data",
        'driver_installer_args=["--silent", "--no-such-option"]',
        deploy_file="deploys/driver.py",
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "installer failed; its log" in out and "unknown option: --no-such-option" in out
    assert json.loads(on_host(lab, "lab1", "rbln-smi -j").stdout)["KMD_version"] == "3.5.1"
    for port in PORTS:
        assert runs_argv(lab, "lab1", port, BASE) and chat(lab, "lab1", port)


def test_runfile_with_another_sha256_is_refused_and_nothing_runs(
    settled: dict[str, Any], tmp_path: Path
) -> None:
    lab = settled
    on_host(lab, "lab1", "rm -f /var/cache/servefleet/driver/rebellions-x86_64-3.6.0.run*")
    before = units_and_releases(lab)
    bad = {v: "0" * 64 for v in lab["driver"]}
    gd = tmp_path / "gd"
    gd.mkdir()
    (gd / "lab.py").write_text(
        f"from servefleet.fleet.lab.groupdata import lab_group_data\n"
        f"globals().update(lab_group_data())\ndriver_sha256 = {bad!r}\n"
    )
    proc = run(lab, "--limit", "lab1", "--group-data", str(gd), "--data", "driver_version=3.6.0")
    assert proc.returncode != 0
    assert "sha256" in proc.stdout + proc.stderr
    assert json.loads(on_host(lab, "lab1", "rbln-smi -j").stdout)["KMD_version"] == "3.5.1"
    on_host(lab, "lab1", "test ! -e /var/cache/servefleet/driver/rebellions-x86_64-3.6.0.run")
    assert units_and_releases(lab) == before
    for port in PORTS:
        assert chat(lab, "lab1", port)


# -- ports, devices, rollback by hand -------------------------------------------------------------


def _listener_units(state: dict[str, Any], host: str) -> dict[int, str]:
    """port -> the systemd unit of the process listening on it (from the host's sockets)."""
    script = (
        "for p in 8000 8001 8002 8003 8004; do "
        "pid=$(ss -Hltnp \"sport = :$p\" | sed -n 's/.*pid=\\([0-9]*\\).*/\\1/p' | head -1); "
        '[ -n "$pid" ] && echo "$p $(sed -n \'s#^0::.*/##p;s#^1:name=systemd:.*/##p\' '
        '/proc/$pid/cgroup | head -1)"; done; true'
    )
    out = on_host(state, host, script).stdout
    return {int(a): b for a, b in (line.split() for line in out.splitlines() if " " in line)}


def test_port_shift_onto_ports_the_old_instances_hold(settled: dict[str, Any]) -> None:
    lab = settled
    ok(run(lab, "--limit", "lab1", "--data", "serve_base_port=8001"))
    owners = _listener_units(lab, "lab1")
    assert owners == {8001 + i: f"servefleet-vllm-{i}.service" for i in range(4)}, owners
    for i in range(4):
        assert runs_argv(lab, "lab1", 8001 + i, BASE) and chat(lab, "lab1", 8001 + i)
    journal = on_host(
        lab, "lab1", "journalctl -u 'servefleet-vllm-*' --since -3min -o cat --no-pager"
    ).stdout
    assert "Address already in use" not in journal
    ok(run(lab, "--limit", "lab1"))
    assert _listener_units(lab, "lab1") == {
        8000 + i: f"servefleet-vllm-{i}.service" for i in range(4)
    }


def test_fewer_devices_removes_stale_units(settled: dict[str, Any]) -> None:
    lab = settled
    hw = "/etc/rbln-sim/hardware.json"
    saved = on_host(lab, "lab3", f"cat {hw}").stdout
    on_host(lab, "lab3", f"cat > {hw}", stdin=json.dumps({**json.loads(saved), "devices": 2}))
    try:
        ok(run(lab, "--limit", "lab3"))
        units = on_host(lab, "lab3", "ls /etc/systemd/system | grep servefleet-vllm || true").stdout
        assert units.split() == ["servefleet-vllm-0.service", "servefleet-vllm-1.service"]
        assert (
            on_host(
                lab, "lab3", "systemctl is-active servefleet-vllm-2.service", check=False
            ).stdout.strip()
            != "active"
        )
        assert chat(lab, "lab3", 8000) and chat(lab, "lab3", 8001)
    finally:
        on_host(lab, "lab3", f"cat > {hw}", stdin=saved)
    ok(run(lab, "--limit", "lab3"))
    assert all(chat(lab, "lab3", p) for p in PORTS)


def test_rollback_by_hand(settled: dict[str, Any]) -> None:
    lab = settled
    ok(run(lab, "--limit", "lab1", "--data", "serve_target=Throughput"))
    throughput = resolved("--target", "throughput")["servers"][0]["argv"]
    assert runs_argv(lab, "lab1", 8000, throughput)
    env = {**os.environ, **secrets(lab)}
    proc = subprocess.run(
        [
            str(Path(os.sys.executable).parent / "servefleet"),
            "rollback",
            "inventories/lab.py",
            "--limit",
            "lab1",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for port in PORTS:
        assert runs_argv(lab, "lab1", port, BASE) and chat(lab, "lab1", port)
    # the data still asks for the default selection: a deploy now changes nothing
    assert totals(run(lab, "--json", "--limit", "lab1"))["success"] == 0


# -- bad data and hostile input: one line, nothing changes -------------------------------------


def _bad_data_cases() -> list[tuple[str, object, str]]:
    sys.path.insert(0, str(REPO / "tests" / "unit"))
    from bad_data_cases import BAD_DATA_CASES

    return BAD_DATA_CASES


def test_bad_data_matrix_changes_nothing_on_any_host(settled: dict[str, Any]) -> None:
    lab = settled
    before = units_and_releases(lab)

    cases = [(k, v if isinstance(v, str) else json.dumps(v), m) for k, v, m in _bad_data_cases()]
    # each run: the real pyinfra CLI against every host, in a process of its own
    runs = run_many(lab, [["--data", f"{key}={text}"] for key, text, _ in cases])

    def refused(case: tuple[str, str, str], proc: subprocess.CompletedProcess[str]) -> str | None:
        key, text, message = case
        out = proc.stdout + proc.stderr
        errors = [line for line in out.splitlines() if "servefleet:" in line]
        if proc.returncode == 0:
            return f"{key}={text} was accepted"
        if len(errors) != 1 or key not in errors[0] or message not in errors[0]:
            return f"{key}={text}: {errors or out[-500:]}"
        return "a traceback" if "Traceback" in out else None

    problems = [p for p in map(refused, cases, runs) if p]
    assert not problems, problems
    assert units_and_releases(lab) == before


@pytest.mark.parametrize(
    "slug", ["tp2\nExecStartPre=+/usr/bin/touch /tmp/pwned", "tp%n", "tp$HOME"]
)
def test_hostile_card_is_refused_before_any_change(
    settled: dict[str, Any], tmp_path: Path, slug: str
) -> None:
    lab = settled
    card = json.loads((FILES / "recipes" / "rbln" / "gpt-oss-120b.json").read_text())
    card["strategies"][0]["slug"] = slug
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(card))
    before = units_and_releases(lab)
    proc = run(lab, "--data", f"serve_recipe={path}")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "slug" in out and "Traceback" not in out
    assert units_and_releases(lab) == before
    for host in ("lab1", "lab2", "lab3"):
        on_host(lab, host, "test ! -e /tmp/pwned")


def test_odd_probe_output_on_one_host_fails_that_host_alone(settled: dict[str, Any]) -> None:
    """#18 finding 14: lab2's rbln-smi prints JSON its parser cannot read. lab2 fails alone, in
    one line, before any change; lab1 and lab3 run to the end (converged: nothing to change);
    ``servefleet status`` names lab2 and only lab2."""
    lab = settled
    before = units_and_releases(lab)
    odd = json.dumps({"KMD_version": "3.5.1", "devices": [{"npu": None, "name": "RBLN-CR13"}]})
    script = f"#!/bin/sh\necho {shlex.quote(odd)}\n"
    on_host(lab, "lab2", "mv /usr/bin/rbln-smi /usr/bin/rbln-smi.real && "
            f"printf '%s' {shlex.quote(script)} > /usr/bin/rbln-smi && chmod 755 /usr/bin/rbln-smi")  # fmt: skip
    try:
        proc = run(lab, "--json")
        status = subprocess.run(
            [str(Path(sys.executable).parent / "servefleet"), "status", "inventories/lab.py"],
            cwd=REPO, env={**os.environ, **secrets(lab)}, capture_output=True, text=True,
            timeout=600,
        )  # fmt: skip
    finally:
        on_host(lab, "lab2", "mv -f /usr/bin/rbln-smi.real /usr/bin/rbln-smi")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in out, out[-3000:]
    assert json.loads(proc.stdout)["results"]["failed_hosts"] == ["lab2"], out[-3000:]
    # the hosts' output goes to stderr (the --json on stdout lists the operation's arguments)
    err = re.sub(r"\x1b\[[0-9;]*m", "", proc.stderr)
    mine = [x.split("] ", 1)[-1].strip() for x in err.splitlines() if "servefleet: lab" in x]
    assert len(mine) == 1, err[-3000:]
    assert mine[0].startswith("servefleet: lab2: rbln-smi -j: unexpected output"), mine
    assert units_and_releases(lab) == before
    problems = [x for x in status.stderr.splitlines() if x.startswith("servefleet: ")]
    assert status.returncode == 1 and len(problems) == 1, status.stdout + status.stderr
    assert problems[0].startswith("servefleet: lab2: rbln-smi -j: unexpected output")
    ok(run(lab))  # the real rbln-smi back: every host converged


# -- a non-root operator with --sudo -----------------------------------------------------------


def test_sudo_with_a_non_root_user(settled: dict[str, Any]) -> None:
    lab = settled
    for host in ("lab1", "lab2", "lab3"):
        on_host(
            lab,
            host,
            "id ops >/dev/null 2>&1 || useradd -m -s /bin/bash ops; "
            "install -d -m 700 -o ops -g ops ~ops/.ssh; "
            "install -m 600 -o ops -g ops /root/.ssh/authorized_keys ~ops/.ssh/; "
            "echo 'ops ALL=(ALL) NOPASSWD:ALL' > /etc/sudoers.d/ops; chmod 440 /etc/sudoers.d/ops",
        )
    # fresh secrets and units: the deploy must write them through sudo
    for host in TWO:
        on_host(lab, host, "rm -rf /etc/servefleet/secrets")
    proc = ok(run(lab, *LIMIT, "--ssh-user", "ops", "--sudo", "--data", "serve_target=Throughput"))
    throughput = resolved("--target", "throughput")["servers"][0]["argv"]
    for host in TWO:
        out = on_host(lab, host, "stat -c '%a %U' /etc/servefleet/secrets/netrc").stdout
        assert out.strip() == "600 root"
        assert all(runs_argv(lab, host, p, throughput) for p in PORTS)
    assert not [s for s in secrets(lab).values() if s in proc.stdout + proc.stderr]
    again = run(
        lab, "--json", *LIMIT, "--ssh-user", "ops", "--sudo", "--data", "serve_target=Throughput"
    )
    assert totals(again)["success"] == 0, changed_ops(again)


def test_the_lab_index_password_is_hard_to_quote(lab: dict[str, Any]) -> None:
    """Every deploy test logs in to the private index with it: '#' and shell metacharacters.
    Whitespace, quotes and backslashes no netrc reader reads alike, so settings refuses them
    (#18 finding 10) and the lab's password has none."""
    password = secrets(lab)["RBLN_INDEX_PASSWORD"]
    assert all(c in password for c in "#$!;&|<>()*`"), password
    assert not any(c in password for c in " \t\"'\\"), password


# -- the test barrier of the host programs (the fault points above) ------------------------------


def test_the_test_barrier_waits_only_in_a_root_only_directory(settled: dict[str, Any]) -> None:
    """``fault_point.barrier`` (the fault points inside the converge) waits while a root-only
    /run/servefleet-test holds its hold file, and is off for a link, a directory others may
    write or own, and a planted link in place of its reached file."""
    lab = settled
    call = (
        'timeout 20 python3 -c \'import sys, time; sys.path.insert(0, "/opt/servefleet/lib"); '
        'import fault_point as f; t = time.monotonic(); f.barrier("p", deadline=15); '
        "print(round(time.monotonic() - t))'"
    )
    fresh = f"rm -rf {BARRIERS} /tmp/sf-barrier /tmp/sf-barrier-target; "
    root_only = f"install -d -m 700 {BARRIERS} && touch {BARRIERS}/hold-p; "
    try:
        # off: no directory, a link to a root-only one, group-writable, owned by another user
        for setup in (
            fresh,
            fresh + f"install -d -m 700 /tmp/sf-barrier && touch /tmp/sf-barrier/hold-p && "
            f"ln -s /tmp/sf-barrier {BARRIERS}; ",
            fresh + root_only + f"chmod 770 {BARRIERS}; ",
            fresh + root_only + f"chown nobody {BARRIERS}; ",
            fresh + root_only + f"ln -s /tmp/sf-barrier-target {BARRIERS}/reached-p; ",
        ):
            out = on_host(lab, "lab1", setup + call).stdout.strip()
            assert out == "0", (setup, out)
            on_host(lab, "lab1", f"test ! -e /tmp/sf-barrier/reached-p && "
                    f"test ! -e /tmp/sf-barrier-target && test ! -f {BARRIERS}/reached-p")  # fmt: skip
        # on: it says it reached the point and waits until the hold is gone
        on_host(lab, "lab1", fresh + root_only + f"({call} > /tmp/sf-barrier.out 2>&1 &)")
        on_host(lab, "lab1", f"for i in $(seq 100); do test -e {BARRIERS}/reached-p && exit 0; "
                "sleep 0.1; done; exit 1")  # fmt: skip
        on_host(lab, "lab1", f"test -s /tmp/sf-barrier.out && exit 1; rm {BARRIERS}/hold-p; "
                "for i in $(seq 100); do test -s /tmp/sf-barrier.out && exit 0; sleep 0.1; done; "
                "exit 1")  # fmt: skip
        waited = int(on_host(lab, "lab1", "cat /tmp/sf-barrier.out").stdout)
        assert waited < 15, f"the barrier waited out its deadline ({waited} s)"
    finally:
        on_host(lab, "lab1", fresh + "rm -f /tmp/sf-barrier.out")
