"""vllm-router's metrics as the kit records them (``router-metrics.json``, from the router's
src/metrics.rs) against the real router of the dev extra (vllm-router 0.1.17): every name is in
its binary, and a router run on loopback with a worker that answers and one that does not shows
``vllm_router_active_workers`` and ``vllm_router_worker_health{worker}`` 1 and 0 on /metrics,
the gauge the router-worker alert reads."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest
from lab_sim_support import free_port
from prom_tools import http_server

from servefleet.fleet.monitoring.kit import ROUTER_METRICS

DOC = json.loads(ROUTER_METRICS.read_text())


def test_every_recorded_name_is_in_the_router_binary() -> None:
    assert metadata.version("vllm-router") == DOC["version"]
    spec = importlib.util.find_spec("vllm_router_rs")
    assert spec is not None and spec.origin, "vllm-router's extension module"
    binary = Path(spec.origin).read_bytes()
    missing = [m["name"] for m in DOC["metrics"] if m["name"].encode() not in binary]
    assert missing == []
    assert b"vllm_router_no_such_metric" not in binary  # the check can fail


@pytest.fixture
def worker() -> Iterator[int]:
    """A worker that answers the router's health checks: its port."""
    models = b'{"object": "list", "data": [{"id": "m", "object": "model"}]}'
    with http_server(lambda path: (200 if path in ("/health", "/v1/models") else 404, models),
                     "application/json") as port:  # fmt: skip
        yield port


def scrape(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            return str(r.read().decode())
    except OSError:
        return ""


def test_a_running_router_shows_each_workers_health(worker: int, tmp_path: Path) -> None:
    binary = Path(sys.executable).parent / "vllm-router"
    assert binary.exists(), f"{binary}: the dev extra's vllm-router (pip install -e '.[dev]')"
    metrics_port, dead = free_port(), free_port()
    alive, gone = f"http://127.0.0.1:{worker}", f"http://127.0.0.1:{dead}"
    log = (tmp_path / "router.log").open("wb")
    router = subprocess.Popen(
        [str(binary), "--host", "127.0.0.1", "--port", str(free_port()),
         "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
         "--worker-urls", alive, gone, "--health-check-interval-secs", "1",
         "--worker-startup-timeout-secs", "5"],
        stdout=log, stderr=log,
    )  # fmt: skip
    log.close()
    want = (
        "vllm_router_active_workers 2",
        f'vllm_router_worker_health{{worker="{alive}"}} 1',
        f'vllm_router_worker_health{{worker="{gone}"}} 0',
    )
    try:
        deadline, text = time.monotonic() + 60, ""
        while not all(line in text.splitlines() for line in want):
            assert router.poll() is None, (tmp_path / "router.log").read_text()[-3000:]
            assert time.monotonic() < deadline, f"after 60 s, /metrics shows:\n{text}"
            time.sleep(0.3)
            text = scrape(metrics_port)
    finally:
        router.terminate()
        router.wait(timeout=30)
    recorded = {m["name"]: m for m in DOC["metrics"]}
    assert recorded["vllm_router_worker_health"] == {"name": "vllm_router_worker_health",
                                                     "type": "gauge", "labels": ["worker"]}  # fmt: skip
    assert "# TYPE vllm_router_worker_health gauge" in text
