"""Drift in a model or a compile cache, seen by ``status --verify`` and repaired by a deploy with
``serve_verify`` (#36), on lab1 after a converged deploy: a model file truncated (a disk fault),
then a byte of a sealed compile cache changed. Each time ``status --verify`` exits 1 naming the
file, the deploy with verification fetches the model again into a staging directory and swaps
it in (no server restarts: they loaded it at start) or drops the cache and warms it again (only
the instance that compiles it restarts), and the run after changes nothing. The serve user cannot
write into the sealed cache (tried as that user). A deploy killed inside each repair (the
controller and the host program, at the host programs' fault points: the model moved aside for
its swap, the cache moved out of use) converges on the next run, and the host serves meanwhile."""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any

from faults import BARRIERS, PORTS, REPO, changed_ops, hold, pyinfra_cmd, release, run, secrets
from labhelpers import on_host, wait_for
from test_plan_status import cli

from servefleet.fleet.lab.chat import chat_once

LIMIT = ("--limit", "lab1")
VERIFY = ("--data", "serve_verify=True")
MODEL = "openai/gpt-oss-120b"
HUB = "/var/lib/servefleet/hf/hub/models--openai--gpt-oss-120b"
CACHE = "/var/cache/servefleet/vllm"
USER = "servefleet"


def pids(lab: dict[str, Any]) -> list[str]:
    return on_host(lab, "lab1", "for i in 0 1 2 3; do systemctl show -p MainPID --value "
                   "servefleet-vllm-$i.service; done").stdout.split()  # fmt: skip


def verified(lab: dict[str, Any], named: str, why: str) -> None:
    """status --verify names ``named`` (and ``why``) and exits 1; a deploy with verification
    repairs it."""
    status = cli(lab, "status", "inventories/lab.py", *LIMIT, "--verify")
    assert status.returncode == 1, status.stdout + status.stderr
    assert f"servefleet: lab1: {named}" in status.stderr and why in status.stderr, status.stderr
    assert "read and hashed" in status.stdout  # how many files and bytes it read
    fixed = run(lab, *LIMIT, *VERIFY)
    assert fixed.returncode == 0, fixed.stdout[-4000:] + fixed.stderr[-4000:]
    again = cli(lab, "status", "inventories/lab.py", *LIMIT, "--verify")
    assert again.returncode == 0, again.stdout + again.stderr
    assert changed_ops(run(lab, "--json", *LIMIT, *VERIFY)) == []


def test_a_drifted_model_and_cache_are_seen_by_verify_and_repaired(lab: dict[str, Any]) -> None:
    first = run(lab, *LIMIT)
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-4000:]
    clean = cli(lab, "status", "inventories/lab.py", *LIMIT, "--verify")
    assert clean.returncode == 0, clean.stdout + clean.stderr  # a fresh deploy: nothing differs
    before = pids(lab)

    on_host(lab, "lab1", f"truncate -s 0 {HUB}/snapshots/$(cat {HUB}/.servefleet-complete)/"
            "model.safetensors")  # fmt: skip
    verified(lab, f"model {MODEL}: model.safetensors", "has 0 bytes, fetched with")
    assert on_host(lab, "lab1", f"stat -c %s {HUB}/snapshots/*/model.safetensors").stdout != "0\n"
    assert pids(lab) == before  # the servers loaded the model at start: none restarts

    on_host(lab, "lab1", f"f=$(ls {CACHE}/rbln/*/*/rank0/mega_cache.bin | head -1); "
            "printf X | dd of=$f bs=1 conv=notrunc status=none")  # fmt: skip
    verified(lab, "cache ", "/rank0/mega_cache.bin differs from the sha256 it was sealed with")
    now = pids(lab)
    assert now[0] != before[0] and now[1:] == before[1:], (before, now)  # only its compiler

    # sealed anew: root's, and the serve user can read it but not write into it
    sealed = on_host(lab, "lab1", f"stat -c '%U %a' {CACHE}/rbln/*/*/rank0/mega_cache.bin "
                     f"{CACHE}/rbln/*/*/rank0").stdout.split("\n")  # fmt: skip
    assert sealed[:2] == ["root 640", "root 750"], sealed
    as_user = f"runuser -u {USER} -- sh -c"
    for attempt in ("cat {f} > /dev/null", "printf X >> {f}", "touch $(dirname {f})/new",
                    "rm -f {f}", "mv $(dirname {f}) $(dirname {f}).moved"):  # fmt: skip
        cmd = attempt.format(f=f"$(ls {CACHE}/rbln/*/*/rank0/mega_cache.bin | head -1)")
        done = on_host(lab, "lab1", f"{as_user} '{cmd}'", check=False)
        assert (done.returncode == 0) == attempt.startswith("cat"), (attempt, done.stderr)


def answering(lab: dict[str, Any]) -> int:
    """How many of lab1's instances answer a chat (a refused connection: one that does not)."""
    address = next(h["address"] for h in lab["hosts"] if h["name"] == "lab1")
    count = 0
    for port in PORTS:
        try:
            count += bool(chat_once(address, port, MODEL, "hi", max_tokens=1))
        except OSError:
            pass
    return count


def units(lab: dict[str, Any]) -> str:
    return on_host(lab, "lab1", "systemctl is-active servefleet-vllm-{0,1,2,3}.service; "
                   "journalctl -n 20 --no-pager -u servefleet-vllm-0.service", check=False).stdout  # fmt: skip


def killed_at(lab: dict[str, Any], point: str, program: str) -> None:
    """A deploy with verification held at the host programs' fault point ``point``, then the
    controller and the host program ``program`` SIGKILLed there (as a power cut would leave
    them); the host still serves."""
    reached = hold(lab, ["lab1"], point)
    env = {**os.environ, **secrets(lab), "PYINFRA_PROGRESS": "off"}
    proc = subprocess.Popen(pyinfra_cmd(*LIMIT, *VERIFY), cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # fmt: skip
    try:
        wait_for(lambda: reached() or proc.poll() is not None, f"{point} not reached", 600)
        assert proc.poll() is None, f"the deploy ended before {point}"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pattern = f"[{program[0]}]{program[1:]}"  # never this shell's own command line
        on_host(lab, "lab1", f"pkill -KILL -f '{pattern}'; sleep 0.2; ! pgrep -f '{pattern}'")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        release(lab, ["lab1"])
    assert answering(lab) >= 3, units(lab)  # at most the instance the drop stopped is down


def test_a_repair_killed_midway_converges_on_the_next_run(lab: dict[str, Any]) -> None:
    first = run(lab, *LIMIT)
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-4000:]

    # the model: killed while it was moved aside for the swap (it is in no place a moment)
    on_host(lab, "lab1", f"truncate -s 1 {HUB}/snapshots/$(cat {HUB}/.servefleet-complete)/"
            "model.safetensors")  # fmt: skip
    killed_at(lab, "model-moved-aside", "fetch_model.py")
    assert on_host(lab, "lab1", f"test -e {HUB}", check=False).returncode != 0  # moved aside
    fixed = run(lab, *LIMIT, *VERIFY)
    assert fixed.returncode == 0, fixed.stdout[-4000:] + fixed.stderr[-4000:]
    assert on_host(lab, "lab1", f"ls -a {HUB}/.. | grep -c '^.fetch-' || true").stdout == "0\n"

    # the cache: killed once it was moved out of use, before its marker went
    on_host(lab, "lab1", f"f=$(ls {CACHE}/rbln/*/*/rank0/mega_cache.bin | head -1); "
            "printf Y | dd of=$f bs=1 conv=notrunc status=none")  # fmt: skip
    killed_at(lab, "cache-moved-out", "warm_state.py")
    assert on_host(lab, "lab1", f"ls {CACHE}/.servefleet-dropped | wc -l").stdout == "1\n"
    fixed = run(lab, *LIMIT, *VERIFY)
    assert fixed.returncode == 0, fixed.stdout[-4000:] + fixed.stderr[-4000:]
    assert on_host(lab, "lab1", f"ls {CACHE}/.servefleet-dropped | wc -l").stdout == "0\n"

    status = cli(lab, "status", "inventories/lab.py", *LIMIT, "--verify")
    assert status.returncode == 0, status.stdout + status.stderr
    assert answering(lab) == 4
    assert changed_ops(run(lab, "--json", *LIMIT, *VERIFY)) == []
    assert on_host(lab, "lab1", f"ls {BARRIERS} 2>/dev/null | wc -l").stdout == "0\n"
