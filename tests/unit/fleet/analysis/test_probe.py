"""The canary analysis' load probe (fleet/analysis/probe.py) against tiny streaming servers on
127.0.0.1 in this process (stream_server.py): the same prompts to both targets, each request's
TTFT, gaps and tokens/s, errors counted (an HTTP error, a stalled server cut by its deadlines),
the API key only in the /v1 requests to the targets and never in what the probe returns, and
vLLM's /metrics read with exactly the names and types vLLM 0.30.0 declares."""

from __future__ import annotations

import json

import pytest
from stream_server import Behaviour, streaming

from servefleet.base.errors import ServefleetError
from servefleet.fleet.analysis import probe, report, stats
from servefleet.fleet.analysis.probe import Load, Target
from servefleet.settings.check_analysis import ANALYSIS

LOAD = Load(requests=12, concurrency=3, prompt_tokens=20, output_tokens=8, timeout=30,
            request_timeout=10)  # fmt: skip


def test_the_same_prompts_go_to_both_and_every_request_is_timed() -> None:
    a, b = Behaviour(ttft=0.02, itl=0.004), Behaviour(ttft=0.02, itl=0.004)
    with streaming(a) as ca, streaming(b) as cb:
        sides, took = probe.run([Target("canary", ca), Target("baseline", cb)], LOAD)
    assert sorted(a.prompts) == sorted(b.prompts) and len(a.prompts) == LOAD.requests
    assert len(set(a.prompts)) == LOAD.requests  # each request its own prompt
    assert all(len(p.split()) == LOAD.prompt_tokens for p in a.prompts)
    for side in sides:
        s = side.samples
        assert side.model == "openai/gpt-oss-120b" and side.errors == []
        assert (s.requests, s.errors, len(s.ttft), len(s.tokens_per_s)) == (12, 0, 12, 12)
        assert all(len(gaps) == LOAD.output_tokens - 1 for gaps in s.itl)
        # the client's clock: events read together arrive together, so only the sum is bound
        assert all(t >= 0.02 for t in s.ttft) and all(sum(g) >= 0.9 * 7 * 0.004 for g in s.itl)
        assert all(0 < r <= 8 / 0.048 for r in s.tokens_per_s)
        # the server's own counters and histograms, as deltas over the probe
        assert side.metrics["vllm:generation_tokens_total"] == {"type": "counter", "delta": 96.0}
        assert side.metrics["vllm:request_success_total"]["delta"] == 12.0
        ttft = side.metrics["vllm:time_to_first_token_seconds"]
        assert ttft["type"] == "histogram" and ttft["count"] == 12.0
        assert 0.02 <= ttft["p50"] <= 0.04 and side.undeclared == []
    assert 0 < took < LOAD.timeout


def test_a_stalled_server_is_cut_by_the_deadlines_and_counted_as_errors() -> None:
    load = Load(requests=6, concurrency=2, prompt_tokens=4, output_tokens=4, timeout=3,
                request_timeout=1)  # fmt: skip
    stalled, fine = Behaviour(stall=True), Behaviour()
    with streaming(stalled) as cs, streaming(fine) as cf:
        sides, took = probe.run([Target("canary", cs), Target("baseline", cf)], load)
    canary, baseline = sides
    assert (canary.samples.errors, canary.samples.requests, canary.samples.ttft) == (6, 6, [])
    assert "timed out after 1 s" in canary.errors
    assert not set(canary.errors) - {"timed out after 1 s", "cut: the probe's deadline",
                                     "not sent: the probe's deadline passed"}  # fmt: skip
    assert baseline.samples.errors == 0 and len(baseline.samples.ttft) == 6
    assert took < load.timeout + 25  # it stopped by itself


def test_http_errors_are_counted_and_named() -> None:
    flaky, fine = Behaviour(fail_every=3), Behaviour()
    with streaming(flaky) as cf, streaming(fine) as cg:
        sides, _ = probe.run([Target("canary", cf), Target("baseline", cg)], LOAD)
    assert sides[0].samples.errors == 4 and sides[0].errors == ["HTTP 500"]
    assert len(sides[0].samples.ttft) == 8 and sides[1].samples.errors == 0


def test_a_server_that_cannot_be_reached_is_every_request_an_error() -> None:
    with streaming(Behaviour()) as gone:
        pass  # closed: its port refuses
    with streaming(Behaviour()) as fine:
        sides, _ = probe.run([Target("canary", gone), Target("baseline", fine)], LOAD)
    assert sides[0].samples.errors == LOAD.requests and sides[0].errors == ["connection refused"]
    assert sides[0].metrics_error == "/metrics: connection refused" and sides[0].metrics == {}


def test_the_api_key_goes_only_to_the_targets_v1_paths_and_is_never_returned() -> None:
    key = "sk-canary-secret-4711"
    a, b = Behaviour(key=key), Behaviour(key=key)
    with streaming(a) as ca, streaming(b) as cb:
        sides, _ = probe.run([Target("canary", ca, key=key), Target("baseline", cb, key=key)], LOAD)
    for server in (a, b):
        for seen in server.seen:
            said = seen.get("Authorization")
            assert said == (f"Bearer {key}" if seen["path"].startswith("/v1/") else None), seen
    assert all(s.samples.errors == 0 for s in sides)
    judged = stats.judge(sides[0].samples, sides[1].samples, ANALYSIS)
    said = json.dumps(report.verdict(sides, judged, 1.0, LOAD)) + repr(sides)
    assert key not in said and "/v1/models" not in said
    # without it: every request refused, and said so
    with streaming(Behaviour(key=key)) as ca, streaming(Behaviour()) as cb:
        sides, _ = probe.run([Target("canary", ca), Target("baseline", cb)], LOAD)
    assert sides[0].errors == ["/v1/models: HTTP 401"] and sides[0].samples.errors == 12


@pytest.mark.parametrize(
    "origin", ["https://10.0.0.1:8000", "http://10.0.0.1", "http://u:p@10.0.0.1:80",
               "http://10.0.0.1:8000/v1", "ftp://x:1"],
)  # fmt: skip
def test_only_an_instances_origin_is_probed(origin: str) -> None:
    with pytest.raises(ServefleetError) as e:
        probe.run([Target("canary", origin)], LOAD)
    assert str(e.value) == (
        f"analysis: {origin!r} is not an instance's origin; allowed: http://HOST:PORT"
    )


def test_an_origin_of_an_address() -> None:
    assert probe.origin_of("10.213.0.2", 8000) == "http://10.213.0.2:8000"
    assert probe.origin_of("fd00::2", 8001) == "http://[fd00::2]:8001"


# ---------------------------------------------------------------------------------------------
# vLLM's metrics: exactly the names and types 0.30.0 declares


def test_every_metric_the_analysis_names_is_one_vllm_declares_with_its_type() -> None:
    types = probe.declared()
    assert len(types) > 40 and types["vllm:time_to_first_token_seconds"] == "histogram"
    for name, kind in report.SERVER_METRICS.items():
        assert types.get(name) == kind, name


def test_a_vllm_name_that_is_not_declared_is_named() -> None:
    odd = ("# TYPE vllm:time_to_first_token histogram\n"
           'vllm:time_to_first_token_count{engine="0"} 3\n'
           'vllm:gpu_cache_usage_perc{engine="0"} 0.5\n'
           "python_gc_objects_collected_total 12\n")  # fmt: skip
    with streaming(Behaviour(extra_metrics=odd)) as ca, streaming(Behaviour()) as cb:
        sides, _ = probe.run([Target("canary", ca), Target("baseline", cb)], LOAD)
    assert sides[0].undeclared == ["vllm:gpu_cache_usage_perc", "vllm:time_to_first_token_count"]
    assert sides[1].undeclared == []


def test_series_belong_to_their_declared_family() -> None:
    types = probe.declared()
    fam = probe.family
    assert fam("vllm:time_to_first_token_seconds_bucket", types) == (
        "vllm:time_to_first_token_seconds"
    )
    assert fam("vllm:generation_tokens_total", types) == "vllm:generation_tokens_total"
    assert fam("vllm:generation_tokens_created", types) == "vllm:generation_tokens_total"
    assert fam("vllm:num_requests_running", types) == "vllm:num_requests_running"
    assert fam("vllm:num_requests_running_bucket", types) is None  # a gauge has no buckets
    assert fam("vllm:generation_tokens", types) is None


def test_deltas_of_counters_and_histograms() -> None:
    types = {"c_total": "counter", "h": "histogram", "g": "gauge"}
    before = probe.parse_metrics(
        'c_total{r="a"} 1\nc_total{r="b"} 2\n'
        'h_bucket{e="0",le="0.1"} 1\nh_bucket{e="0",le="1.0"} 2\nh_bucket{e="0",le="+Inf"} 2\n'
        'h_count{e="0"} 2\nh_sum{e="0"} 0.6\ng 5\n'
    )
    after = probe.parse_metrics(
        'c_total{r="a"} 4\nc_total{r="b"} 2\nc_total{r="c"} 1\n'
        'h_bucket{e="0",le="0.1"} 1\nh_bucket{e="0",le="1.0"} 12\nh_bucket{e="0",le="+Inf"} 12\n'
        'h_count{e="0"} 12\nh_sum{e="0"} 5.6\ng 7 1700000000\n# c_total 99\n'
    )
    out = probe.deltas(before, after, types)
    assert out["c_total"] == {"type": "counter", "delta": 4.0}
    assert out["h"]["count"] == 10.0 and out["h"]["sum"] == pytest.approx(5.0)
    assert out["h"]["p50"] == pytest.approx(0.1 + 0.9 * 0.5) and "g" not in out


def test_bucket_quantiles_interpolate_as_promql_does() -> None:
    q = probe.bucket_quantile
    buckets = [(0.1, 10.0), (0.2, 30.0), (float("inf"), 40.0)]
    assert q(buckets, 0.5) == pytest.approx(0.15)
    assert q(buckets, 0.95) == 0.2  # in the +Inf bucket: the highest finite bound
    assert q([], 0.5) is None and q([(1.0, 0.0)], 0.5) is None
