"""Bench (not a test): a compile-affecting rollout (``servefleet rollout --canary 1
--batch-size 4``) over 1, 4 and 8 lab hosts with ``serve_prewarm_scope`` host vs fleet: compiles
in the fleet (read from every host's compile log) and wall time, with the simulator's compile
time fixed. Then the serving capacity of one host during a rolling restart: a client samples
every instance while the host rolls, and the fewest healthy instances seen must stay >= N-1.
Needs root; brings an 8-host lab up and leaves the machine with the lab down.

    .venv/bin/python bench/bench_prewarm.py [--hosts 1,4,8] [--compile-seconds 10]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from typing import Any

from labbench import BIN, lab, timed

CACHE = "/var/cache/servefleet/vllm"
TARGETS = ("Throughput", "Latency")  # alternated: every trial is a compile-affecting change


def _ssh(host: str, command: str) -> str:
    return lab("ssh", host, command)


def _compiles(hosts: list[str]) -> int:
    return sum(
        len(_ssh(h, "cat /var/log/rbln-sim/compile.log 2>/dev/null || true").splitlines())
        for h in hosts
    )


def rollout_trial(hosts: list[str], scope: str, target: str, store: str) -> tuple[int, float]:
    for h in hosts:  # the change is cold everywhere (running servers keep what they loaded)
        _ssh(h, f"rm -rf {CACHE}/rbln {CACHE}/servefleet-warm")
    before = _compiles(hosts)
    limit = [a for h in hosts for a in ("--limit", h)]
    data = ["--data", f"serve_target={target}", "--data", f"serve_prewarm_scope={scope}",
            "--data", f"serve_prewarm_store={store}"]  # fmt: skip
    cmd = [str(BIN / "servefleet"), "rollout", "inventories/lab.py", "--yes", "--canary", "1",
           "--batch-size", "4", *limit, "--", *data]  # fmt: skip
    elapsed = timed(cmd)
    return _compiles(hosts) - before, elapsed


def capacity_trial(host: str, address: str, ports: list[int]) -> tuple[int, int]:
    """The fewest healthy instances seen on ``host`` while a warm change restarts them all."""
    from servefleet.fleet.lab.chat import chat_once

    low, samples = len(ports), 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal low, samples
        while not stop.is_set():
            up = 0
            for port in ports:
                try:
                    up += bool(chat_once(address, port, "openai/gpt-oss-120b", "hi", max_tokens=1))
                except Exception:  # noqa: BLE001 - restarting
                    pass
            low, samples = min(low, up), samples + 1
            time.sleep(0.05)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    # tool calling is outside the compile key: every unit changes, every start is warm
    timed([str(BIN / "pyinfra"), "-y", "--limit", host, "--data",
           "serve_selection=tool_calling=off", "inventories/lab.py", "deploys/serve.py"])  # fmt: skip
    stop.set()
    thread.join()
    return low, samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="1,4,8", help="comma-separated host counts")
    parser.add_argument("--compile-seconds", default="10", help="the simulator's compile time")
    args = parser.parse_args()
    counts = [int(x) for x in args.hosts.split(",")]
    rows: list[tuple[int, str, int, float]] = []
    try:
        lab("up", "--hosts", str(max(counts)), "--compile-seconds", args.compile_seconds)
        from servefleet.fleet.lab.state import load_state

        state: dict[str, Any] = load_state()
        names = [h["name"] for h in state["hosts"]]
        timed([str(BIN / "pyinfra"), "-y", "inventories/lab.py", "deploys/serve.py"])
        trial = 0
        for n in counts:
            for scope in ("host", "fleet"):
                with tempfile.TemporaryDirectory(prefix="servefleet-bench-store-") as store:
                    target = TARGETS[trial % 2]
                    compiles, elapsed = rollout_trial(names[:n], scope, target, store)
                trial += 1
                rows.append((n, scope, compiles, elapsed))
                print(f"  {n} hosts, {scope}: {compiles} compiles, {elapsed:.1f} s",
                      file=sys.stderr, flush=True)  # fmt: skip
        first = state["hosts"][0]
        ports = [8000 + i for i in range(4)]
        low, samples = capacity_trial(first["name"], first["address"], ports)
    finally:
        lab("down")
    print(f"Rollout of a compile-affecting change (compile {args.compile_seconds} s, "
          "--canary 1 --batch-size 4):\n")  # fmt: skip
    print("| hosts | pre-warm scope | compiles | wall time (s) | vs host scope |")
    print("|---|---|---|---|---|")
    by = {(n, scope): (c, t) for n, scope, c, t in rows}
    for n, scope, compiles, elapsed in rows:
        ratio = elapsed / by[(n, "host")][1]
        print(f"| {n} | {scope} | {compiles} | {elapsed:.1f} | {ratio:.2f}x |")
    n_ports = len(ports)
    print(f"\nRolling restart of one host ({n_ports} instances, {samples} samples of all of them): "
          f"fewest healthy at once {low} of {n_ports} (floor N-1 = {n_ports - 1})")  # fmt: skip
    return 0 if low >= n_ports - 1 else 1


if __name__ == "__main__":
    sys.exit(main())
