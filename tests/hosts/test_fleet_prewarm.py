"""Fleet pre-warm on the 3-host lab (``serve_prewarm_scope=fleet``): one compile for the fleet,
read from every host's compile log; a corrupted copy is caught and that host compiles; a build
host without NPUs compiles (compile only) so that no serving host does."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from faults import (
    BARRIERS,
    changed_ops,
    compile_log,
    hold,
    release,
    resolved,
    run,
    run_killed,
    runs_argv,
    totals,
)
from labhelpers import on_host

from servefleet.fleet.lab.chat import chat_once

HOSTS = ["lab1", "lab2", "lab3"]
PORTS = [8000 + i for i in range(4)]
CACHE = "/var/cache/servefleet/vllm"
BUILD_CACHE = "/opt/servefleet/build-cache"  # a fleet pre-warm's compile-only builds
CHANGE = ["--data", "serve_target=Throughput"]  # compile-affecting (--max-num-seqs)


def fleet(store: Path, *extra: str) -> list[str]:
    return ["--data", "serve_prewarm_scope=fleet", "--data", f"serve_prewarm_store={store}", *extra]


def cold(state: dict[str, Any], hosts: list[str]) -> None:
    """Forget every compile on ``hosts``, the compile-only builds' too (running servers keep
    what they loaded)."""
    for host in hosts:
        on_host(state, host, f"rm -rf {CACHE}/rbln {CACHE}/servefleet-warm {BUILD_CACHE}")


def logs(state: dict[str, Any]) -> dict[str, int]:
    return {host: len(compile_log(state, host)) for host in HOSTS}


def new_compiles(state: dict[str, Any], before: dict[str, int]) -> dict[str, list[str]]:
    return {host: compile_log(state, host)[before[host] :] for host in HOSTS}


def loaded_bundle(state: dict[str, Any], host: str) -> bool:
    journal = on_host(state, host, "journalctl -u servefleet-vllm-0.service -o cat -n 40").stdout
    return "Loaded rbln mega-cache bundle" in journal.split("vLLM API server version")[-1]


def test_one_compile_for_the_fleet_and_a_corrupt_copy_compiles_locally(
    lab: dict[str, Any], tmp_path: Path
) -> None:
    store = tmp_path / "store"
    spec = resolved("--target", "throughput")
    argv, fingerprint = spec["servers"][0]["argv"], spec["compile_fingerprint"]
    assert run(lab).returncode == 0  # every host serves Latency: the change restarts them all
    cold(lab, HOSTS)
    before = logs(lab)
    done = run(lab, *fleet(store, *CHANGE))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    compiles = new_compiles(lab, before)
    assert len(compiles["lab1"]) == 1 and compiles["lab2"] == compiles["lab3"] == [], compiles
    assert (store / f"{fingerprint}.tar").is_file()
    for host in HOSTS:
        assert all(runs_argv(lab, host, p, argv) for p in PORTS), host
        marker = json.loads(on_host(lab, host, f"cat {CACHE}/servefleet-warm/{fingerprint}").stdout)
        assert marker["source"] == "copy of lab1", marker  # lab1's too: its build's copy
    assert loaded_bundle(lab, "lab2") and loaded_bundle(lab, "lab3")
    noop = run(lab, "--json", *fleet(store, *CHANGE))
    assert totals(noop)["success"] == 0

    # the kept copy is corrupted: lab3 (cold again, servers stopped) refuses it and compiles
    tar = store / f"{fingerprint}.tar"
    data = bytearray(tar.read_bytes())
    data[2048] ^= 0xFF
    tar.write_bytes(bytes(data))
    on_host(lab, "lab3", "systemctl stop 'servefleet-vllm-*.service'")
    cold(lab, ["lab3"])
    before = logs(lab)
    again = run(lab, "--limit", "lab3", *fleet(store, *CHANGE))
    assert again.returncode == 0, again.stdout[-4000:] + again.stderr[-4000:]
    out = again.stdout + again.stderr
    assert re.search(
        rf"copy of {fingerprint} is not usable here \(.*sha256.*\); this host compiles it", out
    ), out[-3000:]
    compiles = new_compiles(lab, before)
    assert len(compiles["lab3"]) == 1 and compiles["lab1"] == compiles["lab2"] == [], compiles
    assert all(runs_argv(lab, "lab3", p, argv) for p in PORTS)
    marker = json.loads(on_host(lab, "lab3", f"cat {CACHE}/servefleet-warm/{fingerprint}").stdout)
    assert marker["source"] == "compiled"


def test_a_build_host_without_npus_compiles_for_the_fleet(
    lab: dict[str, Any], tmp_path: Path
) -> None:
    store = tmp_path / "store"
    spec = resolved("--target", "throughput")
    hardware = on_host(lab, "lab3", "cat /etc/rbln-sim/hardware.json").stdout
    assert run(lab).returncode == 0  # every host serves Latency: the change restarts lab1, lab2
    try:
        no_npus = (
            'python3 -c \'import json; p="/etc/rbln-sim/hardware.json"; '
            'h=json.load(open(p)); h["devices"]=0; json.dump(h, open(p,"w"))\''
        )
        on_host(lab, "lab3", no_npus)
        # a build host that still serves is refused before any change
        refused = run(lab, "--limit", "lab3", *fleet(store, "--data", "serve_prewarm_host=lab3"))
        assert refused.returncode != 0
        assert (
            "serve_prewarm_host: this host has servers of ours" in refused.stdout + refused.stderr
        )
        on_host(lab, "lab3", "for u in /etc/systemd/system/servefleet-vllm-*.service; do "
                'systemctl disable --now "$(basename "$u")"; rm -f "$u"; done; '
                "systemctl daemon-reload")  # fmt: skip
        cold(lab, HOSTS)
        before = logs(lab)
        done = run(lab, *fleet(store, "--data", "serve_prewarm_host=lab3", *CHANGE))
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
        compiles = new_compiles(lab, before)
        assert compiles["lab1"] == compiles["lab2"] == [], compiles
        assert len(compiles["lab3"]) == 1 and "compile_only=1" in compiles["lab3"][0], compiles
        for host in ("lab1", "lab2"):
            assert all(runs_argv(lab, host, p, spec["servers"][0]["argv"]) for p in PORTS), host
            assert loaded_bundle(lab, host)
        units = on_host(lab, "lab3", "ls /etc/systemd/system | grep servefleet || true").stdout
        assert units.strip() == "", f"the build host keeps units: {units}"
        noop = run(lab, "--json", *fleet(store, "--data", "serve_prewarm_host=lab3", *CHANGE))
        assert totals(noop)["success"] == 0, changed_ops(noop)
    finally:
        on_host(lab, "lab3", "cat > /etc/rbln-sim/hardware.json", stdin=hardware)
        assert run(lab, "--limit", "lab3").returncode == 0


def serving(lab: dict[str, Any], host: str) -> bool:
    address = next(h["address"] for h in lab["hosts"] if h["name"] == host)
    try:
        return bool(chat_once(address, 8000, "openai/gpt-oss-120b", "hi", max_tokens=1))
    except Exception:  # noqa: BLE001 - not answering
        return False


def test_a_fleet_prewarm_killed_while_keeping_or_copying_the_cache_converges(
    lab: dict[str, Any], tmp_path: Path
) -> None:
    """The controller SIGKILLed as the seed's cache goes to the store, and as the copies go out:
    every host keeps serving, and the next run converges with still one compile in the fleet."""
    store = tmp_path / "store"
    argv = resolved("--target", "throughput")["servers"][0]["argv"]
    for step in ("Keep the compile-only cache", "Copy the fleet's compile cache"):
        assert run(lab).returncode == 0  # every host serves Latency
        cold(lab, HOSTS)
        shutil.rmtree(store, ignore_errors=True)
        before = logs(lab)
        started, killed = run_killed(
            lab, *fleet(store, *CHANGE), at=lambda n, name, step=step: step in name
        )
        assert killed, started
        assert all(serving(lab, host) for host in HOSTS), f"a host stopped serving at {step}"
        again = run(lab, *fleet(store, *CHANGE))
        assert again.returncode == 0, again.stdout[-4000:] + again.stderr[-4000:]
        compiles = new_compiles(lab, before)
        assert sum(map(len, compiles.values())) == 1, (step, compiles)
        for host in HOSTS:
            assert all(runs_argv(lab, host, p, argv) for p in PORTS), (step, host)
        assert totals(run(lab, "--json", *fleet(store, *CHANGE)))["success"] == 0


def test_a_fleet_prewarm_killed_while_the_seed_compiles_converges(lab: dict[str, Any]) -> None:
    """#46: the controller SIGKILLed while the seed's compile-only build runs (held at its fault
    point, with its root-staged copy of the models in build-hub): every host keeps serving, the
    next run converges onto the change, the one after changes nothing, and neither the build's
    unit nor its staged models are left."""
    store = Path(f"/tmp/servefleet-seed-kill-{os.getpid()}")
    change = resolved("--target", "throughput")
    argv, fp = change["servers"][0]["argv"], change["compile_fingerprint"]
    try:
        assert run(lab).returncode == 0  # every host serves Latency
        cold(lab, HOSTS)
        hold(lab, HOSTS, f"building-{fp}")  # the seed, whichever host it is, waits there
        try:
            started, killed = run_killed(
                lab,
                *fleet(store, *CHANGE),
                at=lambda n, name: "(compile only" in name,
                then=lambda: any_reached(lab, fp),
            )
            assert killed, started
            seeds = [h for h in HOSTS if held(lab, h, fp)]
            assert len(seeds) == 1, seeds  # one host compiles for the fleet
            assert all(serving(lab, host) for host in HOSTS), "a host stopped serving"
        finally:
            release(lab, HOSTS)
        again = run(lab, *fleet(store, *CHANGE))
        assert again.returncode == 0, again.stdout[-4000:] + again.stderr[-4000:]
        for host in HOSTS:
            assert all(runs_argv(lab, host, p, argv) for p in PORTS), host
            left = on_host(
                lab,
                host,
                "ls -d /opt/servefleet/build-hub "
                "/etc/systemd/system/servefleet-prewarm.service 2>/dev/null; true",
            )
            assert left.stdout.strip() == "", (host, left.stdout)  # fmt: skip
        assert totals(run(lab, "--json", *fleet(store, *CHANGE)))["success"] == 0
    finally:
        shutil.rmtree(store, ignore_errors=True)


def held(lab: dict[str, Any], host: str, fp: str) -> bool:
    return on_host(lab, host, f"test -e {BARRIERS}/reached-building-{fp}",
                   check=False).returncode == 0  # fmt: skip


def any_reached(lab: dict[str, Any], fp: str) -> bool:
    return any(held(lab, h, fp) for h in HOSTS)


def test_a_cache_a_hostile_server_wrote_never_reaches_another_host(
    lab: dict[str, Any], tmp_path: Path
) -> None:
    """#31 finding 5: lab1's serve user (its servers run model code and take prompts) writes a
    file into lab1's compile cache, where vllm-rbln loads bundles from (beside the sealed
    bundles: into them it cannot, #36). Then a fleet rollout
    with lab3 cold: no warm host is a source; lab3 builds compile only (as servefleet-build, in
    a network namespace of its own) and the copy lab3 serves from holds no such file."""
    store = tmp_path / "store"
    fingerprint = resolved("--target", "throughput")["compile_fingerprint"]
    assert run(lab).returncode == 0
    cold(lab, HOSTS)
    assert run(lab, *fleet(store, *CHANGE)).returncode == 0  # every host warm, from lab1's build
    poison = "x-planted-by-the-serve-user.bin"
    # the sealed cache is root's (#36): the serve user cannot write into it; it can write beside
    # it, in its own tree
    plant = 'd=$(ls -d {CACHE}/rbln/*/* | head -1); runuser -u servefleet -- sh -c "echo payload > {at}"'
    refused = on_host(lab, "lab1", plant.format(CACHE=CACHE, at=f"$d/rank0/{poison}"), check=False)
    assert refused.returncode != 0 and "Permission denied" in refused.stderr, refused
    on_host(lab, "lab1", plant.format(CACHE=CACHE, at=f"$d/../{poison}"))
    shutil.rmtree(store)
    on_host(lab, "lab3", "systemctl stop 'servefleet-vllm-*.service'")
    cold(lab, ["lab3"])
    before = logs(lab)
    done = run(lab, *fleet(store, *CHANGE))
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    compiles = new_compiles(lab, before)
    assert compiles["lab1"] == compiles["lab2"] == [] and len(compiles["lab3"]) == 1, compiles
    assert "compile_only=1" in compiles["lab3"][0], compiles
    manifest = json.loads((store / f"{fingerprint}.tar.json").read_text())
    assert manifest["origin"] == "compile only" and manifest["source"] == "lab3", manifest
    assert not any(poison in name for name in manifest["files"]), manifest["files"]
    found = on_host(lab, "lab3", f"find {CACHE} -name {poison}", check=False).stdout
    assert found.strip() == "", found
    assert loaded_bundle(lab, "lab3")
    build = on_host(lab, "lab3", f"stat -c '%U %a' {BUILD_CACHE}").stdout.split()
    assert build == ["servefleet-build", "700"], build


def test_a_file_the_serve_user_planted_in_its_hub_is_never_compiled_for_the_fleet(
    lab: dict[str, Any], tmp_path: Path
) -> None:
    """#46 item 2: lab3's serve user plants a module in its hub's snapshot of the model (its
    servers run model code with --trust-remote-code). The fleet's compile-only build on lab3
    reads root's checked copy of the model, never the serve user's hub: what the compile read
    (the simulator's compile.log records a digest of the snapshot's files) is what the other
    hosts' compiles read, and the fleet still compiles once."""
    store = tmp_path / "store"
    assert run(lab).returncode == 0
    cold(lab, HOSTS)
    before = logs(lab)
    assert run(lab, *fleet(store, *CHANGE)).returncode == 0  # lab1 builds for the fleet
    (first,) = new_compiles(lab, before)["lab1"]
    read = re.search(r" read=(\S+)", first)
    assert read and read[1] != "-", first
    snap = "/var/lib/servefleet/hf/hub/models--openai--gpt-oss-120b/snapshots"
    plant = f'runuser -u servefleet -- sh -c "echo planted > $(ls -d {snap}/*)/modeling_x.py"'
    on_host(lab, "lab3", plant)
    shutil.rmtree(store)
    on_host(lab, "lab3", "systemctl stop 'servefleet-vllm-*.service'")
    cold(lab, ["lab3"])
    before = logs(lab)
    done = run(lab, *fleet(store, *CHANGE))
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    compiles = new_compiles(lab, before)
    assert compiles["lab1"] == compiles["lab2"] == [] and len(compiles["lab3"]) == 1, compiles
    assert "compile_only=1" in compiles["lab3"][0], compiles
    assert f" read={read[1]}" in compiles["lab3"][0], (read[1], compiles["lab3"])
    left = on_host(lab, "lab3", "ls /opt/servefleet/build-hub 2>&1 || true").stdout
    assert "No such file" in left, left  # the copy is removed when the build ends
