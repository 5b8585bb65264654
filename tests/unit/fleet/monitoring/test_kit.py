"""The monitoring kit's files: every metric name the rules and the dashboard read is one that
vLLM 0.30.0, vllm-router, servefleet's status --textfile or Prometheus (``up``) exposes, or a
recording rule the rules define; the thresholds of the data reach the rules; the dashboard is
Grafana JSON whose every panel has a query; the example prometheus.yml passes
``promtool check config``."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prom_tools import promtool

from servefleet.base.errors import DataError
from servefleet.fleet.monitoring.kit import (
    dashboard,
    exposed,
    fleet_thresholds,
    kit_files,
    prometheus_config,
    rules,
    thresholds_of,
)
from servefleet.fleet.statusview import TEXTFILE_METRICS
from servefleet.settings.table import MONITORING, default_settings

# PromQL's words that are not metric names (keywords, aggregation modifiers, set operators)
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
            "bool", "offset", "inf", "nan"}  # fmt: skip
NAME = re.compile(r"(?<![A-Za-z0-9_:.])[A-Za-z_:][A-Za-z0-9_:]*")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression (or a Grafana query) reads: its identifiers, less
    string literals, Grafana's ``$variables``, label matchers (``{...}``), ranges (``[...]``),
    the label lists of ``by``/``without``/``on``/``ignoring``/``group_left``/``group_right``
    and ``label_values``' label, function and aggregation names (an identifier before ``(``),
    keywords and numbers. Crude, but it never drops a name: what is left over is counted."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', " ", expr)
    text = re.sub(r"\$\{?\w+\}?", " ", text)
    text = re.sub(r"\{[^{}]*\}", " ", text)
    text = re.sub(r"\[[^\[\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", " ", text)
    text = re.sub(r"\blabel_values\s*\((.*),\s*[A-Za-z_]\w*\s*\)", r"(\1)", text)
    names = set()
    for m in NAME.finditer(text):
        after = text[m.end() :].lstrip()
        if after.startswith("(") or m.group(0).lower() in KEYWORDS:
            continue
        names.add(m.group(0))
    return names


def rule_list(text: str) -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(text)["groups"] for r in g["rules"]]


def dashboard_queries(doc: dict[str, Any]) -> list[str]:
    """Every query of the dashboard: each panel's targets and each query variable's."""
    out = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    for var in doc["templating"]["list"]:
        if var["type"] == "query":
            out.append(var["query"]["query"] if isinstance(var["query"], dict) else var["query"])
    return out


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('up{job="servefleet-vllm"} == 0', {"up"}),
        ("sum by (release, model_name) (instance:vllm_generation_tokens:rate)",
         {"instance:vllm_generation_tokens:rate"}),
        ('histogram_quantile(0.95, sum by (le) (rate(x_bucket{a="b",c=~"$host"}[5m])))', {"x_bucket"}),
        ("a / on(host) group_left(release) b offset 5m > bool 1e3 unless c", {"a", "b", "c"}),
        ("time() - max(ts) > 1800 or absent(ts)", {"ts"}),
        ('label_values(up{job="servefleet-vllm"}, host)', {"up"}),
        ("rate(x_total[$__rate_interval]) * 2", {"x_total"}),
        ('count(servefleet_host_drift{host=~"$host"} == 1) or vector(0)', {"servefleet_host_drift"}),
        ("vllm:kv_cache_usage_perc", {"vllm:kv_cache_usage_perc"}),
    ],
)  # fmt: skip
def test_the_name_parser_finds_every_metric_and_nothing_else(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_every_metric_the_rules_and_the_dashboard_read_is_exposed() -> None:
    known = exposed()
    recorded = {r["record"] for r in rule_list(rules()) if "record" in r}
    used: dict[str, set[str]] = {}
    for rule in rule_list(rules()):
        for name in metric_names(rule["expr"]):
            used.setdefault(name, set()).add(rule.get("alert") or rule["record"])
    for query in dashboard_queries(json.loads(dashboard())):
        for name in metric_names(query):
            used.setdefault(name, set()).add("dashboard")
    unknown = {n: sorted(w) for n, w in used.items() if n not in known and n not in recorded}
    assert unknown == {}
    # what they read is each exporter's: vLLM's histograms and gauges, the router's, ours
    assert {known[n] for n in used if n in known} == {
        "vLLM 0.30.0", "vllm-router", "servefleet status --textfile",
        "Prometheus, for each target of status --prometheus",
    }  # fmt: skip
    assert set(TEXTFILE_METRICS) <= set(used)  # every metric status --textfile writes is read
    assert recorded <= set(used)  # every recording rule is read, by an alert or the dashboard


def test_an_unknown_name_is_caught() -> None:
    """The check can fail: a name vLLM does not expose (its v0 name), an ITL histogram without
    its _bucket suffix."""
    known = exposed()
    for wrong in ("vllm:time_per_output_token_seconds_bucket", "vllm:inter_token_latency_seconds"):
        assert metric_names(f"rate({wrong}[5m])") == {wrong} and wrong not in known
    assert "vllm:inter_token_latency_seconds_bucket" in known
    assert "vllm_router_worker_health" in known and "servefleet_host_drift" in known


def test_the_dashboard_is_grafana_json_with_a_query_in_every_panel() -> None:
    doc = json.loads(dashboard())
    assert doc["uid"] == "servefleet-fleet" and doc["panels"]
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    for panel in doc["panels"]:
        exprs = [t.get("expr", "").strip() for t in panel.get("targets", [])]
        assert exprs and all(exprs), panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24 and pos["w"] > 0 and pos["h"] > 0, panel["title"]
    titles = " ".join(p["title"] for p in doc["panels"])
    for shown in (
        "per host and release",
        "Time to first token",
        "Inter-token latency",
        "tokens per second",
        "KV cache",
        "waiting",
        "Router workers healthy",
    ):
        assert shown in titles  # fmt: skip


def test_the_thresholds_of_the_data_reach_the_rules() -> None:
    text = rules({"ttft_p95_ms": 1250, "kv_cache_percent": 85, "queue_p95_ms": 30000,
                  "for_seconds": 30, "status_max_age_seconds": 900})  # fmt: skip
    alerts = {r["alert"]: r for r in rule_list(text) if "alert" in r}
    assert alerts["VllmTimeToFirstTokenHigh"]["expr"].endswith("> 1.25")
    assert "> 0.85" in alerts["VllmKvCacheNearFull"]["expr"]
    assert "> 30 or" in alerts["VllmRequestsWaitingTooLong"]["expr"]
    assert "> 900" in alerts["ServefleetStatusStale"]["expr"]
    assert {r["for"] for r in alerts.values()} == {"30s"}
    defaults = {r["alert"]: r for r in rule_list(rules()) if "alert" in r}
    assert defaults["VllmTimeToFirstTokenHigh"]["expr"].endswith("> 2")
    assert {r["for"] for r in defaults.values()} == {f"{MONITORING['for_seconds']}s"}
    assert "[90s]" in rules(window="90s") and "[5m]" not in rules(window="90s")


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ({"kv_cache_percent": 0}, "monitoring_thresholds.kv_cache_percent: 0 is out of range; "
         "allowed: 1-100"),
        ({"ttft_p99_ms": 1}, "monitoring_thresholds: 'ttft_p99_ms' is not a field (did you mean "
         "ttft_p95_ms?)"),
        ({"for_seconds": "1m"}, "monitoring_thresholds.for_seconds: expected a whole number, got "
         "'1m'"),
    ],
)  # fmt: skip
def test_bad_thresholds_are_one_line(given: dict[str, Any], said: str) -> None:
    with pytest.raises(DataError) as e:
        rules(given)
    assert str(e.value).startswith(said) and "\n" not in str(e.value)


def test_thresholds_are_over_the_defaults() -> None:
    assert thresholds_of({"for_seconds": 5}) == {**MONITORING, "for_seconds": 5}
    assert default_settings().monitoring_thresholds == MONITORING
    with pytest.raises(DataError, match="window: '5 m' is not a duration"):
        rules(window="5 m")


def test_a_fleet_has_one_set_of_thresholds() -> None:
    base = default_settings()
    strict = base.__class__(**{**base.__dict__, "monitoring_thresholds": {**MONITORING,
                            "ttft_p95_ms": 500}})  # fmt: skip
    assert fleet_thresholds({"h1": base, "h2": base}) == MONITORING
    assert fleet_thresholds({"h1": strict})["ttft_p95_ms"] == 500
    with pytest.raises(DataError) as e:
        fleet_thresholds({"h1": base, "h2": strict})
    assert str(e.value) == ("monitoring_thresholds: h1 and h2 differ; allowed: one value for "
                            "every host of the inventory (group_data/all.py)")  # fmt: skip


def test_the_example_prometheus_yml_passes_promtool_check_config(tmp_path: Path) -> None:
    (tmp_path / "rules.yml").write_text(rules())
    (tmp_path / "targets.json").write_text("[]\n")
    config = prometheus_config(targets=str(tmp_path / "targets.json"),
                               rules_file=str(tmp_path / "rules.yml"),
                               textfile_targets=["127.0.0.1:9100", "mon2:9100"], interval="15s",
                               refresh="5s")  # fmt: skip
    (tmp_path / "prometheus.yml").write_text(config)
    done = promtool("check", "config", str(tmp_path / "prometheus.yml"))
    assert done.returncode == 0, done.stdout + done.stderr
    doc = yaml.safe_load(config)
    assert doc["scrape_configs"][0]["file_sd_configs"][0]["files"] == [
        str(tmp_path / "targets.json")
    ]
    assert doc["scrape_configs"][1]["static_configs"][0]["targets"] == [
        "127.0.0.1:9100",
        "mon2:9100",
    ]
    assert doc["global"] == {"scrape_interval": "15s", "evaluation_interval": "15s"}
    assert doc["scrape_configs"][0]["file_sd_configs"][0]["refresh_interval"] == "5s"
    with pytest.raises(DataError, match="refresh: '1 m' is not a duration"):
        prometheus_config(refresh="1 m")


def test_the_kit_a_fleet_repository_gets() -> None:
    kit = kit_files()
    assert sorted(kit) == ["monitoring/README.md", "monitoring/prometheus.yml",
                           "monitoring/servefleet-dashboard.json",
                           "monitoring/servefleet-rules.yml"]  # fmt: skip
    assert kit["monitoring/servefleet-rules.yml"] == rules()
    example = yaml.safe_load(kit["monitoring/prometheus.yml"])
    assert example["rule_files"] == ["/etc/prometheus/servefleet-rules.yml"]
