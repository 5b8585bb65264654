"""The canary analysis' probe against the lab's simulated ``vllm serve`` (two servers started
on this machine as test_sim_serving.py starts them, sim_fixtures.py): every request streamed
and timed, the counters it moved read from /metrics, and every ``vllm:`` name the simulator
exposes one that vLLM 0.30.0 declares."""

from __future__ import annotations

from pathlib import Path

from sim_fixtures import MODEL, serve

from servefleet.fleet.analysis import probe
from servefleet.fleet.analysis.probe import Load, Target


def test_the_probe_reads_the_simulated_server(venv: Path, sim_env: dict[str, str]) -> None:
    a = serve(venv, sim_env)
    b = serve(venv, {**sim_env, "RBLN_VISIBLE_DEVICES": "1"})  # an NPU of its own
    load = Load(requests=8, concurrency=2, prompt_tokens=16, output_tokens=8, timeout=60,
                request_timeout=20)  # fmt: skip
    try:
        sides, _ = probe.run([Target("canary", f"http://127.0.0.1:{a.port}"),
                              Target("baseline", f"http://127.0.0.1:{b.port}")], load)  # fmt: skip
    finally:
        a.stop()
        b.stop()
    for side in sides:
        s = side.samples
        assert (side.model, s.errors, side.errors, side.metrics_error) == (MODEL, 0, [], None)
        assert len(s.ttft) == 8 and all(len(gaps) == 7 for gaps in s.itl)
        assert side.metrics["vllm:generation_tokens_total"]["delta"] == 64.0
        assert side.metrics["vllm:request_success_total"]["delta"] == 8.0
        assert side.undeclared == []
