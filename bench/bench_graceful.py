"""Bench (not a test): requests in flight during a rolling restart, with ``serve_shutdown_timeout``
0 (vLLM's default: SIGTERM aborts what is running) against 60 (the servers drain first). On a
one-host lab at the simulator's token rate (``/etc/rbln-sim/tokens-per-second``), clients keep
long streaming chats running on every instance of the host while ``servefleet rollout`` restarts
each instance through the health gate (a warm change: tool calling off, outside the compile
key). Every request is counted once: completed (every token, then ``[DONE]``), aborted (taken,
then cut) or refused (not taken: refused while its instance restarted, or 503 while it drained).
The run counts only when the rollout restarted every instance. The target: 0 aborted with 60.
Needs root; leaves the lab down.

    .venv/bin/python bench/bench_graceful.py [--tokens 100] [--tokens-per-second 20] [--clients 1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from http import client as httpc
from typing import Any

from labbench import BIN, lab, timed

TIMEOUTS = (0, 60)  # serve_shutdown_timeout: vLLM's default, then servefleet's
MODEL = "openai/gpt-oss-120b"
RATE_FILE = "/etc/rbln-sim/tokens-per-second"

# Runs on the lab host (python3 -): each server unit's main process and its port
UNITS = r"""
import glob, json, os, subprocess
out = []
for path in sorted(glob.glob("/etc/systemd/system/servefleet-vllm-*.service")):
    unit = os.path.basename(path)
    pid = subprocess.run(["systemctl", "show", "-p", "MainPID", "--value", unit],
                         capture_output=True, text=True).stdout.strip()
    argv = open(f"/proc/{pid}/cmdline").read().split("\0") if pid not in ("", "0") else []
    port = int(argv[argv.index("--port") + 1]) if "--port" in argv else None
    out.append({"unit": unit, "pid": pid, "port": port})
print(json.dumps(out))
"""


@dataclass
class Tally:
    """What became of the requests of one trial."""

    completed: int = 0
    aborted: int = 0
    refused: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, outcome: str) -> None:
        with self.lock:
            setattr(self, outcome, getattr(self, outcome) + 1)


def stream_once(address: str, port: int, tokens: int, auth: dict[str, str],
                streaming: threading.Event, wait: float) -> str:  # fmt: skip
    """One streaming chat of ``tokens`` tokens: ``completed``, ``aborted`` (taken, then cut) or
    ``refused`` (not taken). Sets ``streaming`` at its first token."""
    body = {"model": MODEL, "max_tokens": tokens, "stream": True,
            "messages": [{"role": "user", "content": "Tell me a long story"}]}  # fmt: skip
    conn = httpc.HTTPConnection(address, port, timeout=wait)
    try:
        try:
            conn.request("POST", "/v1/chat/completions", json.dumps(body),
                         {"Content-Type": "application/json", **auth})  # fmt: skip
            resp = conn.getresponse()
        except OSError:  # refused while restarting, or reset before an answer
            return "refused"
        if resp.status != 200:  # 503 while draining
            resp.read()
            return "refused"
        got, done, rest = 0, False, b""
        try:
            while data := resp.read1(65536):
                *events, rest = (rest + data).split(b"\n\n")
                for event in events:
                    if event == b"data: [DONE]":
                        done = True
                        continue
                    choices = json.loads(event.removeprefix(b"data: "))["choices"]
                    if choices and choices[0].get("delta", {}).get("content"):
                        got += 1
                        streaming.set()
        except (httpc.HTTPException, OSError, ValueError):  # IncompleteRead: cut
            pass
        return "completed" if done and got == tokens else "aborted"
    finally:
        conn.close()


def units(state: dict[str, Any], host: dict[str, Any]) -> list[dict[str, Any]]:
    from servefleet.fleet.lab.hosts import ssh_command

    proc = subprocess.run(ssh_command(state, host["name"], ["python3", "-"]), input=UNITS,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"{host['name']}: reading the units failed:\n{proc.stderr}")
    got: list[dict[str, Any]] = json.loads(proc.stdout)
    if not got or any(u["port"] is None for u in got):
        raise SystemExit(f"{host['name']}: no running server units: {got}")
    return got


def trial(state: dict[str, Any], timeout: int, args: argparse.Namespace) -> dict[str, Any]:
    """Serve with ``serve_shutdown_timeout=timeout``, then roll a restarting change out under
    load; the tally and the rollout's wall time."""
    host = state["hosts"][0]
    data = ["--data", f"serve_shutdown_timeout={timeout}"]
    timed([str(BIN / "pyinfra"), "-y", *data, "inventories/lab.py", "deploys/serve.py"])
    before = units(state, host)
    auth = {"Authorization": f"Bearer {os.environ[args.api_key_env]}"} if args.api_key_env else {}
    wait = args.tokens / args.tokens_per_second + 120  # a request's client-side limit
    tally, stop = Tally(), threading.Event()

    def client(port: int, streaming: threading.Event) -> None:
        while not stop.is_set():
            outcome = stream_once(host["address"], port, args.tokens, auth, streaming, wait)
            tally.add(outcome)
            if outcome == "refused":
                stop.wait(0.2)  # its instance restarts: ask again soon

    clients = []
    for u in before:
        for _ in range(args.clients):
            streaming = threading.Event()
            thread = threading.Thread(target=client, args=(u["port"], streaming), daemon=True)
            thread.start()
            clients.append((thread, streaming))
    deadline = time.monotonic() + 60
    for _, streaming in clients:  # every client streams before the rollout starts
        if not streaming.wait(max(0.0, deadline - time.monotonic())):
            raise SystemExit("the clients did not start streaming within 60 s")
    cmd = [str(BIN / "servefleet"), "rollout", "inventories/lab.py", "--yes", "--canary", "1",
           "--batch-size", "1", "--", *data, "--data", "serve_selection=tool_calling=off"]  # fmt: skip
    elapsed = timed(cmd)
    stop.set()
    for thread, _ in clients:
        thread.join(wait)
    after = units(state, host)
    if [u["unit"] for u in before] != [u["unit"] for u in after]:
        raise SystemExit(f"the rollout changed the units: {before} -> {after}")
    kept = [u["unit"] for u, v in zip(before, after, strict=True) if u["pid"] == v["pid"]]
    if kept:
        raise SystemExit(f"the rollout did not restart {', '.join(kept)}: the run does not count")
    return {"timeout": timeout, "instances": len(before), "elapsed": elapsed,
            "completed": tally.completed, "aborted": tally.aborted, "refused": tally.refused}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=100, help="tokens of each request")
    parser.add_argument("--tokens-per-second", type=float, default=20.0,
                        help="the simulator's token rate (100 tokens at 20/s: a 5 s request)")  # fmt: skip
    parser.add_argument("--clients", type=int, default=1,
                        help="clients per instance, each one request at a time")  # fmt: skip
    parser.add_argument("--compile-seconds", default="1", help="the simulator's compile time")
    parser.add_argument("--api-key-env", metavar="VAR",
                        help="send Authorization: Bearer $VAR (when the servers need a key)")  # fmt: skip
    args = parser.parse_args()
    if args.tokens < 1 or args.clients < 1 or not args.tokens_per_second > 0:
        parser.error("--tokens and --clients must be >= 1, --tokens-per-second > 0")
    if args.api_key_env and not os.environ.get(args.api_key_env):
        parser.error(f"--api-key-env {args.api_key_env}: that variable is not set")
    rows = []
    try:
        lab("up", "--hosts", "1", "--compile-seconds", args.compile_seconds)
        from servefleet.fleet.lab.state import load_state

        state: dict[str, Any] = load_state()
        name = state["hosts"][0]["name"]
        lab("ssh", name, f"echo {args.tokens_per_second:g} > {RATE_FILE}")
        for timeout in TIMEOUTS:
            row = trial(state, timeout, args)
            rows.append(row)
            print(f"  serve_shutdown_timeout={timeout}: {row['aborted']} aborted, "
                  f"{row['completed']} completed, {row['refused']} refused, "
                  f"{row['elapsed']:.1f} s", file=sys.stderr, flush=True)  # fmt: skip
    finally:
        lab("down")
    seconds = args.tokens / args.tokens_per_second
    print(f"Rolling restart of one host ({rows[0]['instances']} instances) under "
          f"{args.clients} streaming client(s) per instance, {args.tokens}-token requests "
          f"({seconds:g} s each):\n")  # fmt: skip
    print("| serve_shutdown_timeout | completed | aborted in flight | aborted share "
          "| refused (restarting) | rollout (s) | vs timeout 0 |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        taken = row["completed"] + row["aborted"]
        share = row["aborted"] / taken if taken else 0.0
        ratio = row["elapsed"] / rows[0]["elapsed"]
        print(f"| {row['timeout']} | {row['completed']} | {row['aborted']} | {share:.0%} "
              f"| {row['refused']} | {row['elapsed']:.1f} | {ratio:.2f}x |")  # fmt: skip
    abort, drain = rows
    print(f"\nAborted in flight: {abort['aborted']} with timeout 0, {drain['aborted']} with 60 "
          "(target 0).")  # fmt: skip
    # the bench sees aborts (timeout 0 cuts some), and draining cuts none
    return 0 if abort["aborted"] > 0 and drain["aborted"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
