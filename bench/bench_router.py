"""Bench (not a test): what the router (``serve_router = "host"``, #21) gives clients of one
4-instance CR13 host during a rolling restart, and what it costs them otherwise. In one run, on a
one-host lab at the simulator's token rate:

- requests failed while a deploy restarts every instance (a warm change), with clients sent
  straight to the instances (each client keeps to one instance's port, as clients without a load
  balancer do) against the same clients sent through the router (target: 0 failed);
- the latency the router adds: p50 and p99 of one-token chats straight to an instance against
  through the router, sent alternately so both see the same machine.

A request fails when it is refused, answered other than 200, or its stream ends before every
token and ``[DONE]``. Needs root; leaves the lab down.

    .venv/bin/python bench/bench_router.py [--clients 2] [--tokens 20] [--tokens-per-second 100]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from http import client as httpc
from typing import Any

from labbench import BIN, lab, timed

MODEL = "openai/gpt-oss-120b"
RATE_FILE = "/etc/rbln-sim/tokens-per-second"
PORTS = [8000 + i for i in range(4)]
ROUTER = 8080


def chat(address: str, port: int, tokens: int, stream: bool) -> tuple[bool, float]:
    """One chat: whether it succeeded whole, and how long it took."""
    body = json.dumps({"model": MODEL, "max_tokens": tokens, "stream": stream,
                       "messages": [{"role": "user", "content": "Hello"}]})  # fmt: skip
    start = time.perf_counter()
    conn = httpc.HTTPConnection(address, port, timeout=120)
    try:
        conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            return False, time.perf_counter() - start
        if not stream:
            return bool(json.loads(data).get("choices")), time.perf_counter() - start
        events = [e for e in data.split(b"\n\n") if e.startswith(b"data: ")]
        got = sum(
            bool((json.loads(e[6:]).get("choices") or [{}])[0].get("delta", {}).get("content"))
            for e in events
            if e != b"data: [DONE]"
        )
        whole = events[-1:] == [b"data: [DONE]"] and got == tokens
        return whole, time.perf_counter() - start
    except (OSError, httpc.HTTPException, ValueError):
        return False, time.perf_counter() - start
    finally:
        conn.close()


def rollout_under_load(address: str, ports: list[int], args: argparse.Namespace,
                       change: str) -> dict[str, Any]:  # fmt: skip
    """Clients on ``ports`` (``args.clients`` per instance's worth) while a deploy restarts every
    instance; what became of their requests."""
    counts = {"sent": 0, "failed": 0}
    lock, stop = threading.Lock(), threading.Event()

    def client(port: int, k: int) -> None:
        i = k
        while not stop.is_set():
            ok, _ = chat(address, port, args.tokens, stream=i % 2 == 0)
            i += 1
            with lock:
                counts["sent"] += 1
                counts["failed"] += not ok
            if not ok:
                stop.wait(0.2)  # as a client would: try again soon

    threads = [threading.Thread(target=client, args=(ports[n % len(ports)], n), daemon=True)
               for n in range(len(PORTS) * args.clients)]  # fmt: skip
    for t in threads:
        t.start()
    elapsed = timed([str(BIN / "pyinfra"), "-y", "inventories/lab.py", "deploys/serve.py",
                     "--data", "serve_router=host", "--data", change])  # fmt: skip
    stop.set()
    for t in threads:
        t.join(180)
    return {**counts, "elapsed": elapsed}


def latencies(address: str, n: int) -> dict[str, list[float]]:
    """``n`` one-token chats each way, alternating: straight to instance 0, through the router."""
    out: dict[str, list[float]] = {"direct": [], "router": []}
    for _ in range(n):
        for way, port in (("direct", PORTS[0]), ("router", ROUTER)):
            ok, took = chat(address, port, 1, stream=False)
            if not ok:
                raise SystemExit(f"a {way} chat failed outside any restart")
            out[way].append(took)
    return out


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=2, help="clients per instance")
    parser.add_argument("--tokens", type=int, default=20, help="tokens of each request")
    parser.add_argument("--tokens-per-second", type=float, default=100.0)
    parser.add_argument("--latency-requests", type=int, default=300)
    args = parser.parse_args()
    try:
        lab("up", "--hosts", "1")
        from servefleet.fleet.lab.state import load_state

        host = load_state()["hosts"][0]
        lab("ssh", host["name"], f"echo {args.tokens_per_second:g} > {RATE_FILE}")
        timed([str(BIN / "pyinfra"), "-y", "inventories/lab.py", "deploys/serve.py",
               "--data", "serve_router=host"])  # fmt: skip
        direct = rollout_under_load(host["address"], PORTS, args, "serve_shutdown_timeout=61")
        routed = rollout_under_load(host["address"], [ROUTER], args, "serve_shutdown_timeout=60")
        lat = latencies(host["address"], args.latency_requests)
    finally:
        lab("down")
    print(f"Rolling restart of one host (4 instances), {len(PORTS) * args.clients} clients, "
          f"{args.tokens}-token requests at {args.tokens_per_second:g} tokens/s, streaming "
          "and not in turn:\n")  # fmt: skip
    print("| clients sent to | requests | failed | failed share | deploy (s) |")
    print("|---|---|---|---|---|")
    for name, row in (("each instance's port", direct), ("the router", routed)):
        share = row["failed"] / row["sent"] if row["sent"] else 0.0
        print(f"| {name} | {row['sent']} | {row['failed']} | {share:.1%} | {row['elapsed']:.1f} |")
    print(f"\nOne-token chats, {args.latency_requests} each way, alternating:\n")
    print("| way | p50 (ms) | p99 (ms) |")
    print("|---|---|---|")
    for way in ("direct", "router"):
        print(f"| {way} | {pct(lat[way], 50) * 1e3:.1f} | {pct(lat[way], 99) * 1e3:.1f} |")
    p50 = pct(lat["router"], 50) / pct(lat["direct"], 50)
    p99 = pct(lat["router"], 99) / pct(lat["direct"], 99)
    print(f"\nrouter / direct: p50 {p50:.2f}x, p99 {p99:.2f}x")
    return 0 if routed["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
