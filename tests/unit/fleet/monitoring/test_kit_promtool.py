"""The shipped rules under Debian's promtool: ``promtool check rules`` on them as rendered (the
defaults, and other thresholds), and ``promtool test rules`` with series written here for every
alert: each fires when it should (after its ``for:``, with its labels), and not when it should not
(before its ``for:``, on the healthy series beside it, after the condition ends). The series are
the metrics as their exporters write them: vLLM 0.30.0's histograms with their real buckets,
vllm-router's gauges, ``status --textfile``'s metrics, ``up`` of the file_sd targets. The alert
tests read the rules without their annotations (promtool compares them whole); one test holds
the annotations that use template functions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from prom_tools import promtool

from servefleet.fleet.monitoring.kit import VLLM_METRICS, rules

BUCKETS = {m["name"]: m["buckets"] for m in json.loads(VLLM_METRICS.read_text())["metrics"]
           if m["type"] == "histogram" and m.get("buckets")}  # fmt: skip
TARGET = 'job="servefleet-vllm",host="h1",instance="10.0.0.1:8000",release="r1"'
OTHER = 'job="servefleet-vllm",host="h2",instance="10.0.0.2:8000",release="r1"'
VLLM = ',model_name="m",engine="0"'  # the labels vLLM's PrometheusStatLogger adds
NODE = ',job="node",instance="prom:9100"'  # the textfile collector's target
T1 = {"job": "servefleet-vllm", "host": "h1", "instance": "10.0.0.1:8000", "release": "r1"}
WARN, PAGE = {"severity": "warning"}, {"severity": "page"}


def series(name: str, labels: str, values: str) -> dict[str, str]:
    return {"series": f"{name}{{{labels}}}", "values": values}


def histogram(name: str, labels: str, seconds: float, minutes: int = 12) -> list[dict[str, str]]:
    """vLLM's histogram ``name`` (its real buckets) with 60 requests a minute, each taking
    ``seconds``: every ``le`` at or above it counts them all."""
    les = [*BUCKETS[name], "+Inf"]
    return [series(f"{name}_bucket", f'{labels},le="{le}"',
                   f"0+{60 if le == '+Inf' or seconds <= float(le) else 0}x{minutes}")
            for le in les]  # fmt: skip


def case(
    alert: str,
    inputs: list[dict[str, str]],
    fires: dict[str, str],
    at: str = "6m",
    quiet: tuple[str, ...] = ("2m",),
) -> dict[str, Any]:
    """A promtool test group: ``alert`` fires at ``at`` with exactly the labels ``fires`` (the
    healthy series beside it fire nothing), and not at the times ``quiet`` (before its ``for:``
    of 2m, or after the condition ended)."""
    tests = [{"eval_time": t, "alertname": alert, "exp_alerts": []} for t in quiet]
    tests.append({"eval_time": at, "alertname": alert, "exp_alerts": [{"exp_labels": fires}]})
    return {"interval": "1m", "input_series": inputs, "alert_rule_test": tests}


def pair(name: str, bad: str, bad_values: str, good: str, good_values: str) -> list[dict[str, str]]:
    """The series ``name`` of what is in trouble (``bad``) and of what is fine beside it."""
    return [series(name, bad, bad_values), series(name, good, good_values)]


H1, H2 = f'host="h1"{NODE}', f'host="h2"{NODE}'
UNIT = 'host="{}",unit="servefleet-vllm-{}.service"' + NODE
ROUTER = 'job="servefleet-router",host="r1",instance="10.0.0.9:29000"'
R1 = {"job": "servefleet-router", "host": "r1", "instance": "10.0.0.9:29000"}
M = {**T1, "model_name": "m"}
TTFT, QUEUE = "vllm:time_to_first_token_seconds", "vllm:request_queue_time_seconds"
# one case an alert; the condition holds from 1m ("1 0x8": 1, then 0 for 8 minutes); "quiet" at
# 2m (pending: its for: is 2m) and, where the condition ends, after
CASES = [
    case("ServefleetInstanceDown", pair("up", TARGET, "1 0x5 1x4", OTHER, "1x10"),
         {**T1, **PAGE}, quiet=("2m", "9m")),
    case("ServefleetInstanceUnhealthy",
         pair("servefleet_instance_healthy", UNIT.format("h1", 0), "1 0x9", UNIT.format("h1", 1),
              "1x10"),
         {"host": "h1", "unit": "servefleet-vllm-0.service", **PAGE}),
    case("ServefleetInstanceNotServingRelease",
         pair("servefleet_instance_drift", UNIT.format("h1", 2), "0 1x5 0x4", UNIT.format("h2", 2),
              "0x10"),
         {"host": "h1", "unit": "servefleet-vllm-2.service", **WARN}, quiet=("2m", "9m")),
    case("ServefleetGroupNotServing",
         pair("servefleet_group_serving", f'group="dsv3"{NODE}', "1 0x9", f'group="b"{NODE}',
              "1x10"),
         {"group": "dsv3", **PAGE}),
    case("ServefleetHostUnreachable", pair("servefleet_host_reachable", H1, "1 0x9", H2, "1x10"),
         {"host": "h1", **PAGE}),
    case("ServefleetHostDrift", pair("servefleet_host_drift", H2, "0 1x5 0x4", H1, "0x10"),
         {"host": "h2", **WARN}, quiet=("2m", "9m")),
    case("ServefleetReleaseDrift", pair("servefleet_host_release_drift", H1, "0 2x9", H2, "0x10"),
         {"host": "h1", **WARN}),
    # written every minute until 10m, then never again: stale (over 1800 s) from 40m
    case("ServefleetStatusStale",
         [series("servefleet_status_timestamp_seconds", NODE.lstrip(","), "0+60x10 600x60")],
         WARN, at="45m", quiet=("2m", "20m", "31m")),
    # every first token after 3 s on h1, 0.3 s on h2
    case("VllmTimeToFirstTokenHigh",
         [*histogram(TTFT, TARGET + VLLM, 3.0), *histogram(TTFT, OTHER + VLLM, 0.3)],
         {**M, **WARN}),
    case("VllmKvCacheNearFull",
         pair("vllm:kv_cache_usage_perc", TARGET + VLLM, "0.5 0.95x5 0.5x4", OTHER + VLLM,
              "0.89x10"),
         {**M, **WARN}, quiet=("2m", "9m")),
    # h1's requests wait 8 s in the queue, h2's 1 s
    case("VllmRequestsWaitingTooLong",
         [*histogram(QUEUE, TARGET + VLLM, 8.0), *histogram(QUEUE, OTHER + VLLM, 1.0)],
         {**M, **WARN}),
    case("VllmRouterDown",
         pair("up", ROUTER, "1 0x9", 'job="servefleet-router",host="r2",instance="r2:29000"',
              "1x10"),
         {**R1, **PAGE}),
    case("VllmRouterWorkerUnhealthy",
         pair("vllm_router_worker_health", f'{ROUTER},worker="http://10.0.0.1:8000"', "1 0x9",
              f'{ROUTER},worker="http://10.0.0.2:8000"', "1x10"),
         {**R1, "worker": "http://10.0.0.1:8000", **WARN}),
]  # fmt: skip
# a second way in for two of them: the file_sd label of an unreachable host's targets, and
# requests that wait while none runs (no queue time recorded: none leaves the queue); and the
# status metrics never scraped at all
MORE = [
    case("ServefleetHostUnreachable",
         [series("up", f'{OTHER},unreachable="1"', "_ 1x9"), series("up", TARGET, "1x10")],
         {"host": "h2", **PAGE}),
    case("VllmRequestsWaitingTooLong",
         [series("vllm:num_requests_waiting", TARGET + VLLM, "0 3x9"),
          series("vllm:num_requests_running", TARGET + VLLM, "0x10"),
          series("vllm:num_requests_waiting", OTHER + VLLM, "0 3x9"),
          series("vllm:num_requests_running", OTHER + VLLM, "0 2x9")],
         {**M, **WARN}),
    case("ServefleetStatusStale", [series("up", TARGET, "1x10")], WARN, at="5m", quiet=("1m",)),
]  # fmt: skip


def alerts_of(text: str) -> list[str]:
    return [r["alert"] for g in yaml.safe_load(text)["groups"] for r in g["rules"] if "alert" in r]


def without_annotations(text: str) -> str:
    doc = yaml.safe_load(text)
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    return yaml.safe_dump(doc, sort_keys=False)


def promtool_test(tmp_path: Path, rules_text: str, groups: list[dict[str, Any]]) -> str:
    (tmp_path / "rules.yml").write_text(rules_text)
    spec = {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": groups}
    (tmp_path / "test.yml").write_text(json.dumps(spec, indent=1))  # JSON is YAML
    done = promtool("test", "rules", "test.yml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_rendered_rules_pass_promtool_check(tmp_path: Path) -> None:
    for name, thresholds in {"defaults": None, "other": {"ttft_p95_ms": 1250, "for_seconds": 0,
                             "kv_cache_percent": 5, "queue_p95_ms": 7}}.items():  # fmt: skip
        path = tmp_path / f"{name}.yml"
        path.write_text(rules(thresholds, window="90s"))
        done = promtool("check", "rules", str(path))
        assert done.returncode == 0, done.stdout + done.stderr
        count = sum(len(g["rules"]) for g in yaml.safe_load(path.read_text())["groups"])
        assert f"SUCCESS: {count} rules found" in done.stdout, done.stdout


def test_every_alert_fires_when_it_should_and_not_when_it_should_not(tmp_path: Path) -> None:
    text = rules()
    named = [c["alert_rule_test"][-1]["alertname"] for c in CASES]
    assert sorted(named) == sorted(alerts_of(text))  # one case for every alert
    out = promtool_test(tmp_path, without_annotations(text), [*CASES, *MORE])
    assert "SUCCESS" in out


def test_a_case_that_is_wrong_fails_promtool(tmp_path: Path) -> None:
    """The check can fail: an instance that is up does not fire, a threshold above the value
    does not either."""
    for wrong in (
        case("ServefleetInstanceDown", [series("up", TARGET, "1x10")], {**T1, **PAGE}),
        case("VllmKvCacheNearFull", [series("vllm:kv_cache_usage_perc", TARGET + VLLM, "0.85x10")],
             {**T1, "model_name": "m", **WARN}),
    ):  # fmt: skip
        (tmp_path / "rules.yml").write_text(without_annotations(rules()))
        spec = {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": [wrong]}
        (tmp_path / "test.yml").write_text(json.dumps(spec))
        done = promtool("test", "rules", "test.yml", cwd=tmp_path)
        assert done.returncode != 0 and "FAILED" in done.stdout + done.stderr


def test_the_thresholds_of_the_data_move_the_alerts(tmp_path: Path) -> None:
    """KV cache at 85 % fires at a threshold of 80 %, after a for: of 60 s."""
    text = rules({"kv_cache_percent": 80, "for_seconds": 60})
    group = case("VllmKvCacheNearFull", [series("vllm:kv_cache_usage_perc", TARGET + VLLM,
                 "0.5 0.85x9")], {**T1, "model_name": "m", **WARN}, at="3m", quiet=("1m",))  # fmt: skip
    promtool_test(tmp_path, without_annotations(text), [group])


def test_the_annotations_expand(tmp_path: Path) -> None:
    """Summaries and descriptions as Prometheus expands them (humanizeDuration,
    humanizePercentage, $value)."""
    ttft = case("VllmTimeToFirstTokenHigh",
                histogram("vllm:time_to_first_token_seconds", TARGET + VLLM, 3.0),
                {**T1, "model_name": "m", **WARN})  # fmt: skip
    ttft["alert_rule_test"][-1]["exp_alerts"][0]["exp_annotations"] = {
        "summary": "h1 10.0.0.1:8000: TTFT p95 4.875s",
        "description": "The 95th percentile of time to first token over 5m is above 2 s "
        "(release r1, model m).",
    }
    kv = case("VllmKvCacheNearFull", [series("vllm:kv_cache_usage_perc", TARGET + VLLM,
              "0.5 0.95x9")], {**T1, "model_name": "m", **WARN})  # fmt: skip
    kv["alert_rule_test"][-1]["exp_alerts"][0]["exp_annotations"] = {
        "summary": "h1 10.0.0.1:8000: KV cache 95% used",
        "description": "The KV cache is above 0.9 of its blocks: new requests wait or running "
        "ones are preempted.",
    }
    drift = case("ServefleetReleaseDrift", [series("servefleet_host_release_drift",
                 f'host="h1"{NODE}', "0 2x9")], {"host": "h1", **WARN})  # fmt: skip
    drift["alert_rule_test"][-1]["exp_alerts"][0]["exp_annotations"] = {
        "summary": "h1: a release differs from its install (2 differences)",
        "description": "Files of a release on h1 changed after it was installed (a version "
        "edited, a module removed): the next deploy installs it again beside the drifted tree.",
    }
    promtool_test(tmp_path, rules(), [ttft, kv, drift])
