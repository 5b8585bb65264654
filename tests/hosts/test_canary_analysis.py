"""`servefleet rollout --analysis` on the session's 3-host lab after a converged deploy: a change
the lab makes 30 % slower on the canary (``/etc/rbln-sim/slowdown``: ``1.3`` and a fragment of
the new command line, on lab1 only) halts at the canary and rolls it back, the other hosts
untouched, the JSON and the report naming TTFT and tokens/s with both values; the same change
without the slowdown promotes. The lab's token rate is lowered for the test (each token 10 ms)
so that the times are the simulator's, not the machine's noise, and the probe sends one request
at a time: the simulator's timing model grows each step with the requests running
(docs/lab.md), so at one in flight ``--max-num-seqs`` alone changes no time and the change is
equal. The lab is left as a default deploy leaves it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from faults import REPO, resolved, run, runs_argv, secrets
from labhelpers import on_host

SERVEFLEET = str(Path(sys.executable).parent / "servefleet")
HOSTS = ["lab1", "lab2", "lab3"]
PORTS = [8000 + i for i in range(4)]
LATENCY = resolved()["servers"][0]["argv"]
THROUGHPUT = resolved("--target", "throughput")["servers"][0]["argv"]
RATE_FILE = "/etc/rbln-sim/tokens-per-second"
SLOWDOWN_FILE = "/etc/rbln-sim/slowdown"
LOAD = {"requests": 24, "concurrency": 1, "prompt_tokens": 64, "output_tokens": 24,
        "timeout": 120, "request_timeout": 20}  # fmt: skip
CHANGE = ("--data", "serve_target=Throughput", "--data", f"rollout_analysis={json.dumps(LOAD)}")


def fragment() -> str:
    """A flag and its value of the Throughput command line that the Latency one lacks
    (``--max-num-seqs 8``): what the slowdown file matches."""
    pairs = [f"{a} {b}" for a, b in zip(THROUGHPUT, THROUGHPUT[1:], strict=False)]
    latency = " ".join(LATENCY)
    return next(p for p in pairs if p.startswith("--") and f"{p} " not in f"{latency} ")


def rollout(state: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **secrets(state), "PYINFRA_PROGRESS": "off"}
    return subprocess.run([SERVEFLEET, "rollout", "inventories/lab.py", "--yes", *args], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=1800)  # fmt: skip


def units_and_releases(state: dict[str, Any], host: str) -> str:
    return on_host(state, host, "cat /etc/systemd/system/servefleet-vllm-*.service; "
                   "ls /opt/servefleet/releases; readlink /opt/servefleet/current").stdout  # fmt: skip


def test_a_slower_canary_halts_and_rolls_back_an_equal_one_promotes(
    lab: dict[str, Any], tmp_path: Path
) -> None:
    first = run(lab)
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-4000:]
    slower = fragment()
    try:
        for host in HOSTS:
            on_host(lab, host, f"echo 100 > {RATE_FILE}")
        on_host(lab, "lab1", f"echo '1.3 {slower}' > {SLOWDOWN_FILE}")
        before = {h: units_and_releases(lab, h) for h in HOSTS[1:]}

        # (a) 30 % slower on the canary: halted, the canary rolled back, the others untouched
        report = tmp_path / "slower"
        report.mkdir()
        halted = rollout(lab, "--canary", "1", "--analysis", "--analysis-report", str(report),
                         "--json", "--", *CHANGE)  # fmt: skip
        assert halted.returncode == 1, halted.stdout[-4000:] + halted.stderr[-4000:]
        result = json.loads(halted.stdout)
        lab1 = result["lab1"]
        assert lab1["result"] == "failed" and lab1["rolled_back"], lab1
        assert lab1["release_after"] == lab1["release_before"]
        assert all(result[h]["result"] == "not reached" for h in HOSTS[1:]), result
        analysis = lab1["analysis"]
        assert {"ttft_p50", "tokens_per_s"} <= set(analysis["failed"]), analysis["measures"]
        measures = {m["name"]: m for m in analysis["measures"]}
        for name in ("ttft_p50", "tokens_per_s"):
            m = measures[name]
            assert m["canary"] and m["baseline"] and m["worse"] > 0.1, m
        ttft, tps = measures["ttft_p50"], measures["tokens_per_s"]
        assert (f"ttft_p50: canary {ttft['canary'] * 1000:.1f} ms, baseline "
                f"{ttft['baseline'] * 1000:.1f} ms") in lab1["why"]  # fmt: skip
        assert (f"tokens_per_s: canary {tps['canary']:.1f} tok/s, baseline "
                f"{tps['baseline']:.1f} tok/s") in lab1["why"]  # fmt: skip
        assert analysis["canary"]["host"] == "lab1" and analysis["baseline"]["host"] == "lab2"
        assert analysis["canary"]["errors"] == 0 and analysis["baseline"]["errors"] == 0
        # the server's own histograms saw the probe too
        server = analysis["canary"]["server"]
        assert server["vllm:generation_tokens_total"]["delta"] >= LOAD["requests"] * 24
        assert json.loads((report / "analysis.json").read_text()) == analysis
        assert (report / "analysis.svg").read_text().startswith("<svg ")
        assert all(runs_argv(lab, "lab1", p, LATENCY) for p in PORTS)  # back as it was
        assert {h: units_and_releases(lab, h) for h in HOSTS[1:]} == before

        # (b) the same change at the same speed: promoted, every host on it
        on_host(lab, "lab1", f"rm -f {SLOWDOWN_FILE}")
        promoted = rollout(lab, "--canary", "1", "--analysis", "--json", "--", *CHANGE)
        assert promoted.returncode == 0, promoted.stdout[-4000:] + promoted.stderr[-4000:]
        result = json.loads(promoted.stdout)
        assert all(r["result"] == "ok" for r in result.values()), result
        assert result["lab1"]["analysis"]["passed"], result["lab1"]["analysis"]["measures"]
        for host in HOSTS:
            assert all(runs_argv(lab, host, p, THROUGHPUT) for p in PORTS), host
    finally:
        for host in HOSTS:
            on_host(lab, host, f"rm -f {RATE_FILE} {SLOWDOWN_FILE}", check=False)
        back = run(lab)  # the default data again, for the tests after this one
        assert back.returncode == 0, back.stdout[-3000:] + back.stderr[-3000:]
