"""Drift in a model or a compile cache, seen by ``status --verify`` and repaired by a deploy with
``serve_verify`` (#36), on lab1 after a converged deploy: a model file truncated (a disk fault),
then a byte of a sealed compile cache changed. Each time ``status --verify`` exits 1 naming the
file, the deploy with verification fetches the model again into a staging directory and swaps
it in (no server restarts: they loaded it at start) or drops the cache and warms it again (only
the instance that compiles it restarts), and the run after changes nothing."""

from __future__ import annotations

from typing import Any

from faults import changed_ops, run
from labhelpers import on_host
from test_plan_status import cli

LIMIT = ("--limit", "lab1")
VERIFY = ("--data", "serve_verify=True")
MODEL = "openai/gpt-oss-120b"
HUB = "/var/lib/servefleet/hf/hub/models--openai--gpt-oss-120b"
CACHE = "/var/cache/servefleet/vllm"


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
