"""The simulated server's /metrics (src/servefleet/fleet/lab/simulator/packages/vllm/
serving_metrics.py): vLLM 0.30.0's histograms, gauges and counters with the real names, types,
labels and buckets (flags/vllm-0.30.0-metrics.json, generated from the real wheel), in
prometheus_client's text format (parsed strictly: prom_text.py), observed from the simulated
requests' timings: a served request counted once, the queue of --max-num-seqs, the slowdown
switch read at each request. The HTTP API runs in this process (its handler on a loopback port),
every simulation path under a temporary $RBLN_SIM_ROOT. Waits have deadlines; times are only
bounded from below."""

from __future__ import annotations

import importlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from lab_sim_support import Stream, read_stream, request, serve_in_process, wait_for
from prom_text import Family, parse
from sim_fixtures import MODEL

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "one two three four"}]}
SUBJECT = f"/opt/servefleet/releases/5111e30ae8fe8dbf /x/bin/vllm serve {MODEL}"


def module(sim: Any, name: str) -> ModuleType:
    return importlib.import_module(sim.__name__.rsplit(".", 1)[0] + "." + name)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "etc/rbln-sim").mkdir(parents=True)
    return tmp_path


@contextmanager
def api(sim: Any, root: Path, *args: str) -> Iterator[tuple[int, Any]]:
    """The simulated HTTP API of ``vllm serve MODEL ARGS`` (upstream flags) on a loopback port,
    and its state."""
    http_api = module(sim, "http_api")
    ns = sim.parse_serve_args([MODEL, *args], "upstream")
    state = http_api._State(ns, {"RBLN_SIM_ROOT": str(root)}, {"compiled": False})
    state.subject = SUBJECT + (" " + " ".join(args) if args else "")
    with serve_in_process(http_api._make_handler(state)) as port:
        yield port, state


def scrape(port: int) -> dict[str, Family]:
    status, body = request(port, "GET", "/metrics")
    assert status == 200
    return parse(body.decode())


def vllm_families(families: dict[str, Family]) -> dict[str, Family]:
    return {n: f for n, f in families.items() if n.startswith("vllm:")}


def test_metrics_are_vllms_own(sim: Any, root: Path) -> None:
    """Every vllm: family is one vLLM 0.30.0 declares (always, not under an option), with its
    type, label set and bucket list; the ones a canary analysis and the monitoring kit read are
    there; HELP is vLLM's text, the content type prometheus_client's."""
    metrics = module(sim, "serving_metrics")
    real = metrics.declared()
    with api(sim, root) as (port, _):
        assert request(port, "POST", "/v1/chat/completions", dict(CHAT, max_tokens=3))[0] == 200
        families = vllm_families(scrape(port))
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            assert resp.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert set(families) == set(metrics.HELP)
    for name, family in families.items():
        want = real[name]
        assert (family.type, want["when"]) == (want["type"], "always"), name
        assert family.label_names() == set(want["labels"]), name
        assert family.help == metrics.HELP[name]
        if family.type == "histogram":
            assert family.buckets() == [want["buckets"]], name
    assert {
        "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
        "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
        "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds",
        "vllm:request_inference_time_seconds", "vllm:num_requests_running",
        "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total", "vllm:request_success_total",
    } <= set(families)  # fmt: skip
    reasons = {s.labels["finished_reason"] for s in families["vllm:request_success_total"].samples}
    assert reasons == {"stop", "length", "abort", "error", "repetition"}


def test_a_served_request_counts_once(sim: Any, root: Path) -> None:
    """One reply of 5 tokens: one TTFT, four inter-token latencies, one of each finished-request
    histogram, its tokens counted, every later scrape the same; the times hold together as
    vLLM's do (decode = the inter-token latencies' sum, e2e >= TTFT, queue + inference <= e2e)."""
    (root / "etc/rbln-sim/tokens-per-second").write_text("200\n")  # a step: 5 ms
    with api(sim, root) as (port, _):
        status, _ = request(port, "POST", "/v1/chat/completions", dict(CHAT, max_tokens=5))
        assert status == 200
        first, again = scrape(port), scrape(port)
    for families in (first, again):
        f = vllm_families(families)
        count = {n: x.value("_count") for n, x in f.items() if x.type == "histogram"}
        assert count.pop("vllm:inter_token_latency_seconds") == 4
        assert set(count.values()) == {1.0}, count
        assert f["vllm:generation_tokens_total"].value() == 5
        assert f["vllm:prompt_tokens_total"].value() == 4
        assert f["vllm:request_success_total"].value(finished_reason="length") == 1
        assert f["vllm:request_success_total"].value(finished_reason="abort") == 0
        assert f["vllm:num_requests_running"].value() == f["vllm:num_requests_waiting"].value() == 0
        assert f["vllm:kv_cache_usage_perc"].value() == 0
        s = {n: x.value("_sum") for n, x in f.items() if x.type == "histogram"}
        ttft, e2e = s["vllm:time_to_first_token_seconds"], s["vllm:e2e_request_latency_seconds"]
        # the schedule's lower bounds: the prefill (a step) to token 0, then a step a token
        assert ttft >= 0.005 and s["vllm:request_inference_time_seconds"] >= 5 * 0.005 - 1e-6
        assert s["vllm:request_decode_time_seconds"] == pytest.approx(
            s["vllm:inter_token_latency_seconds"], abs=1e-9
        )
        assert s["vllm:request_time_per_output_token_seconds"] == pytest.approx(
            s["vllm:request_decode_time_seconds"] / 4
        )
        assert e2e >= ttft and e2e >= (
            s["vllm:request_queue_time_seconds"] + s["vllm:request_inference_time_seconds"]
        )
        assert s["vllm:request_inference_time_seconds"] == pytest.approx(
            s["vllm:request_prefill_time_seconds"] + s["vllm:request_decode_time_seconds"]
        )


def test_the_queue_shows_in_the_gauges_and_the_queue_time(sim: Any, root: Path) -> None:
    """--max-num-seqs 1: a second request waits (num_requests_waiting 1) until the first ends,
    and its queue time is at least the first's remaining time."""
    (root / "etc/rbln-sim/tokens-per-second").write_text("50\n")  # 20 tokens: 0.4 s
    with api(sim, root, "--max-num-seqs", "1") as (port, state):
        streams = [Stream(), Stream()]
        threads = []
        for got in streams:
            body = dict(CHAT, max_tokens=20)
            t = threading.Thread(target=read_stream, args=(port, "/v1/chat/completions", body, got))
            t.start()
            threads.append(t)
            wait_for("the request to be in", lambda: sum(state.requests.load()[:2]) == len(threads))
        f = vllm_families(scrape(port))
        running, waiting = f["vllm:num_requests_running"], f["vllm:num_requests_waiting"]
        assert (running.value(), waiting.value()) == (1, 1)
        assert 0 < f["vllm:kv_cache_usage_perc"].value() < 0.01
        for t in threads:
            t.join(30)
        assert all(got.done and len(got.tokens()) == 20 for got in streams)
        f = vllm_families(scrape(port))
    assert f["vllm:request_queue_time_seconds"].value("_count") == 2
    assert f["vllm:request_queue_time_seconds"].value("_sum") >= 0.2  # the second's wait
    assert f["vllm:num_requests_waiting"].value() == 0


def test_slowdown_is_read_at_each_request(sim: Any, root: Path) -> None:
    """The lab writes /etc/rbln-sim/slowdown while the server runs: the next request's timing
    has the factor of the first line its release and command line match; bad content answers
    500 with the switch's one line."""
    slowdown = root / "etc/rbln-sim/slowdown"
    with api(sim, root, "--max-num-seqs", "8") as (port, state):
        assert state.timing().step == 1 / 1000
        slowdown.write_text("1.3 --max-num-seqs 8\n")
        assert state.timing().step == pytest.approx(1.3 / 1000)
        slowdown.write_text("3 --max-num-seqs 1\n2 5111e30ae8fe8dbf\n")
        assert state.timing().step == pytest.approx(2 / 1000)
        (root / "etc/rbln-sim/tokens-per-second").write_text("100\n")
        status, _ = request(port, "POST", "/v1/chat/completions", dict(CHAT, max_tokens=2))
        assert status == 200
        ttft = vllm_families(scrape(port))["vllm:time_to_first_token_seconds"].value("_sum")
        assert ttft >= 2 / 100  # one step, twice as long
        slowdown.write_text("fast 5111e30ae8fe8dbf\n")
        status, raw = request(port, "POST", "/v1/chat/completions", dict(CHAT, max_tokens=2))
        assert status == 500
        assert json.loads(raw)["error"]["message"] == (
            f"{slowdown} line 1 holds 'fast 5111e30ae8fe8dbf'; expected FACTOR MATCH... with "
            "FACTOR a number >= 1 (e.g. '1.3 --max-num-seqs 8')"
        )
        assert vllm_families(scrape(port))["vllm:e2e_request_latency_seconds"].value("_count") == 1


def test_the_exposition_format(sim: Any) -> None:
    """Values and labels as prometheus_client writes them: floatToGoString, escaped values."""
    metrics = module(sim, "serving_metrics")
    assert [metrics.go_float(v) for v in (0, 1, 0.25, 7680, 1e6, 123456789.0, float("inf"))] == [
        "0.0", "1.0", "0.25", "7680.0", "1e+06", "1.23456789e+08", "+Inf"
    ]  # fmt: skip
    lines = metrics.EngineStats().lines('a "b"\\c\nd', 0, 0, 0)
    assert lines[2] == 'vllm:num_requests_running{engine="0",model_name="a \\"b\\"\\\\c\\nd"} 0.0'
    families = parse("\n".join(lines) + "\n")
    assert families["vllm:num_requests_running"].samples[0].labels["model_name"] == 'a "b"\\c\nd'
