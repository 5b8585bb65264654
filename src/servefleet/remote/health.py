#!/usr/bin/env python3
"""servefleet health gate. Runs ON THE HOST (stdlib only).

usage: health.py UNIT PORT MODEL TIMEOUT [--host ADDR] [--warm-marker FILE]

Passes when the instance answers GET /health with 200 and a one-token chat completion within
TIMEOUT seconds. Fails at once when systemd reports the unit failed, or restarted it on failure since this check began.
On failure it prints the reason and the tail of the unit's journal (stderr) and exits 1.
On success it writes the warm marker, if given (the compile cache holds this config now).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path


def unit_state(unit: str) -> tuple[str, int]:
    out = subprocess.run(
        ["systemctl", "show", "-p", "ActiveState", "-p", "NRestarts", unit],
        capture_output=True,
        text=True,
    ).stdout
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return props.get("ActiveState", "unknown"), int(props.get("NRestarts", "0") or 0)


def probe(base: str, model: str) -> str | None:
    """None when healthy, else why not."""
    try:
        with urllib.request.urlopen(base + "/health", timeout=5) as r:
            if r.status != 200:
                return f"/health answered {r.status}"
        body = json.dumps(
            {"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "ping"}]}
        ).encode()
        req = urllib.request.Request(
            base + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            reply = json.load(r)
        if not reply.get("choices"):
            return "chat completion had no choices"
        return None
    except urllib.error.HTTPError as e:
        return f"{e.url} answered {e.code}"
    except (OSError, ValueError) as e:
        return f"not answering: {e}"


def main() -> None:
    ap = argparse.ArgumentParser(prog="health.py")
    ap.add_argument("unit")
    ap.add_argument("port", type=int)
    ap.add_argument("model")
    ap.add_argument("timeout", type=float)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--warm-marker")
    a = ap.parse_args()
    host = "127.0.0.1" if a.host in ("0.0.0.0", "::", "") else a.host
    base = f"http://{host}:{a.port}"
    deadline = time.monotonic() + a.timeout
    why: str | None = "not checked"
    _, baseline = unit_state(a.unit)  # NRestarts survives a manual restart: count from here
    while time.monotonic() < deadline:
        state, restarts = unit_state(a.unit)
        if state == "failed" or restarts > baseline:
            why = f"{a.unit} is {state} after {restarts - baseline} automatic restart(s)"
            break
        why = probe(base, a.model)
        if why is None:
            if a.warm_marker:
                Path(a.warm_marker).parent.mkdir(parents=True, exist_ok=True)
                Path(a.warm_marker).write_text(time.strftime("%Y-%m-%dT%H:%M:%S\n"))
            print(f"{a.unit}: healthy on port {a.port}")
            return
        time.sleep(1)
    else:
        why = f"not healthy within {a.timeout:g}s: {why}"
    journal = subprocess.run(
        ["journalctl", "-u", a.unit, "-n", "25", "--no-pager", "-o", "cat"],
        capture_output=True,
        text=True,
    ).stdout
    sys.stderr.write(
        f"servefleet: health gate: {a.unit}: {why}\n--- journal tail of {a.unit} ---\n{journal}"
    )
    sys.exit(1)


if __name__ == "__main__":
    main()
