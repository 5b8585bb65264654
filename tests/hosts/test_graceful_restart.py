"""Graceful restarts (issue #19): a streaming request that takes about 5 s, running while a
deploy restarts its instance, completes with every token when the running server has
``--shutdown-timeout 60`` (serve_shutdown_timeout's default), and is cut when it has 0, which
proves the test can fail. The lab sets the simulated token rate (``/etc/rbln-sim/tokens-per-
second``); the server's drain is vLLM 0.30's (stop accepting, finish in flight, then abort)."""

from __future__ import annotations

import http.client
import json
import threading
import time
from typing import Any

from faults import BARRIERS, run
from labhelpers import on_host

HOST, PORT = "lab1", 8000
TOKENS, RATE = 100, 20  # 5 s at 20 tokens a second
RATE_FILE = "/etc/rbln-sim/tokens-per-second"


def deploy(lab: dict[str, Any], timeout: int) -> None:
    proc = run(lab, "--limit", HOST, "--data", f"serve_shutdown_timeout={timeout}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def stream(address: str, got: dict[str, Any], started: threading.Event) -> None:
    """One streamed chat of TOKENS tokens: how many token events came, and whether [DONE] did."""
    body = json.dumps({"model": "openai/gpt-oss-120b", "max_tokens": TOKENS, "stream": True,
                       "messages": [{"role": "user", "content": "Hello"}]})  # fmt: skip
    got.update(tokens=0, done=False)
    conn = http.client.HTTPConnection(address, PORT, timeout=60)
    try:
        conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        got["status"] = response.status
        while True:
            line = response.readline()
            if not line:
                break
            text = line.decode().strip()
            if text == "data: [DONE]":
                got["done"] = True
            elif text.startswith("data: "):
                choices = json.loads(text[6:]).get("choices") or [{}]
                if choices[0].get("delta", {}).get("content"):
                    got["tokens"] += 1
                    started.set()
    except (OSError, http.client.HTTPException, ValueError) as exc:
        got["error"] = repr(exc)
    finally:
        conn.close()
        started.set()


def restart_while_streaming(lab: dict[str, Any], new_timeout: int) -> dict[str, Any]:
    """Stream from instance 0, and once tokens flow, deploy a change that restarts it."""
    address = next(h["address"] for h in lab["hosts"] if h["name"] == HOST)
    got: dict[str, Any] = {}
    started = threading.Event()
    client = threading.Thread(target=stream, args=(address, got, started), daemon=True)
    client.start()
    assert started.wait(30), "no token within 30 s"
    began = time.monotonic()
    deploy(lab, new_timeout)
    client.join(120)
    assert not client.is_alive(), "the stream never ended"
    got["restart_took"] = time.monotonic() - began
    return got


def test_a_restart_finishes_a_streaming_request_unless_the_timeout_is_0(
    lab: dict[str, Any],
) -> None:
    on_host(lab, HOST, f"rm -rf /etc/rbln-sim/fail-start /etc/rbln-sim/fail-health {BARRIERS}")
    deploy(lab, 60)
    on_host(lab, HOST, f"echo {RATE} > {RATE_FILE}")
    try:
        drained = restart_while_streaming(lab, 61)  # the running server drains for up to 60 s
        assert drained == {**drained, "status": 200, "tokens": TOKENS, "done": True}, drained
        deploy(lab, 0)
        cut = restart_while_streaming(lab, 60)  # the running server has --shutdown-timeout 0
        assert cut["tokens"] < TOKENS and not cut["done"], cut
    finally:
        on_host(lab, HOST, f"rm -f {RATE_FILE}")
    deploy(lab, 60)
