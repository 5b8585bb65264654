"""The monitoring kit's files, rendered: the Prometheus rules with the thresholds of
``monitoring_thresholds`` (:func:`rules`), the Grafana dashboard (:func:`dashboard`), an example
``prometheus.yml`` (:func:`prometheus_config`), a fleet repository's ``monitoring/``
(:func:`kit_files`), and every metric name they may read with what exposes it
(:func:`exposed`): vLLM (the names, types and buckets generated from its wheel, in the
version's reference data),
vllm-router (``router-metrics.json``, from its source and binary), servefleet's own
``status --textfile`` metrics and Prometheus's ``up`` of the targets ``status --prometheus``
writes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import fields
from importlib.resources import files
from pathlib import Path
from typing import Any

from servefleet.base.errors import DataError
from servefleet.base.vllm_reference import reference
from servefleet.fleet.statusview import TEXTFILE_METRICS
from servefleet.settings.checks import Refused
from servefleet.settings.table import MONITORING, Settings

HERE = Path(str(files("servefleet.fleet.monitoring")))
KEY = "monitoring_thresholds"
VLLM_METRICS = reference().metrics  # generated from the real wheel
ROUTER_METRICS = HERE / "router-metrics.json"
_WINDOW = re.compile(r"[1-9][0-9]{0,4}[smh]")  # a Prometheus duration the rules' rates take
_PLACEHOLDER = re.compile(r"@[A-Z0-9_]+@")

# where a fleet's Prometheus host keeps what the kit names (the example's paths)
TARGETS = "/etc/prometheus/servefleet.json"
RULES_FILE = "/etc/prometheus/servefleet-rules.yml"
NODE_EXPORTER = "localhost:9100"


def thresholds_of(given: Mapping[str, Any] | None = None) -> dict[str, int]:
    """``given`` checked as the data key ``monitoring_thresholds`` is, each field over its
    default; DataError names the field and what is allowed.

    + given: thresholds (a Settings' ``monitoring_thresholds``, or part of one); none: the defaults
    """
    check = next(f for f in fields(Settings) if f.name == KEY).metadata["check"]
    try:
        return dict(check(dict(given or {})))
    except Refused as e:
        raise e.error(KEY) from None


def _decimal(value: int, unit: int) -> str:
    """``value / unit`` as a PromQL number, exactly (2000 ms -> ``2``, 1250 -> ``1.25``)."""
    whole, rest = divmod(value, unit)
    digits = len(str(unit)) - 1
    return f"{whole}.{rest:0{digits}d}".rstrip("0").rstrip(".") if rest else str(whole)


def _filled(template: Path, values: Mapping[str, str]) -> str:
    """A template of the kit with each ``@NAME@`` replaced (every one must be given)."""
    text = template.read_text()
    for name, value in values.items():
        text = text.replace(f"@{name}@", value)
    left = _PLACEHOLDER.search(text)
    if left:
        raise ValueError(f"{template.name}: {left.group(0)} is not filled")
    return text


def rules(thresholds: Mapping[str, Any] | None = None, window: str = "5m") -> str:
    """The Prometheus rules file (``rules.yml.tmpl``): the recording rules (TTFT, ITL and queue
    time quantiles, tokens per second; by instance and by release) and the alerts, with these
    thresholds.

    + thresholds: ``monitoring_thresholds`` (each field over its default; ``for_seconds`` is every
      alert's ``for:``)
    + window: the range the rates and quantiles are taken over (a Prometheus duration)
    """
    t = thresholds_of(thresholds)
    if not _WINDOW.fullmatch(window):
        raise DataError(f"window: {window!r} is not a duration; allowed: a number and s, m or h")
    return _filled(
        HERE / "rules.yml.tmpl",
        {
            "VLLM": reference().shown,  # the version whose metrics the rules read
            "FOR": f"{t['for_seconds']}s",
            "WINDOW": window,
            "TTFT_P95_SECONDS": _decimal(t["ttft_p95_ms"], 1000),
            "QUEUE_P95_SECONDS": _decimal(t["queue_p95_ms"], 1000),
            "KV_CACHE_FRACTION": _decimal(t["kv_cache_percent"], 100),
            "STATUS_MAX_AGE": str(t["status_max_age_seconds"]),
        },
    )


def dashboard() -> str:
    """The Grafana dashboard of the fleet (``dashboard.json``; its data source is a variable)."""
    return (HERE / "dashboard.json").read_text()


def prometheus_config(
    *,
    targets: str = TARGETS,
    rules_file: str = RULES_FILE,
    textfile_targets: Sequence[str] = (NODE_EXPORTER,),
    interval: str = "30s",
    refresh: str = "1m",
) -> str:
    """A ``prometheus.yml`` (``prometheus.yml.tmpl``): the file_sd targets of
    ``status --prometheus``, node_exporter's (whose textfile collector reads
    ``status --textfile``) and the rules.

    + targets: the ``--prometheus`` file
    + rules_file: the rules (:func:`rules`)
    + textfile_targets: ``HOST:PORT`` of each node_exporter with servefleet's textfile
    + interval: the scrape and evaluation interval (a Prometheus duration)
    + refresh: how often the targets file is read again besides on its changes (a duration)
    """
    for name, value in (("interval", interval), ("refresh", refresh)):
        if not _WINDOW.fullmatch(value):
            raise DataError(f"{name}: {value!r} is not a duration; allowed: a number and s, m or h")
    return _filled(
        HERE / "prometheus.yml.tmpl",
        {
            "TARGETS": json.dumps(targets),  # a JSON string is a YAML one
            "RULES": json.dumps(rules_file),
            "TEXTFILE_TARGETS": ", ".join(json.dumps(t) for t in textfile_targets),
            "INTERVAL": interval,
            "REFRESH": refresh,
        },
    )


README = """# Monitoring: servefleet's Prometheus rules and Grafana dashboard

- `servefleet-rules.yml`: recording rules (TTFT, inter-token latency and queue time p50/p95,
  tokens per second, by instance and by release) and alerts: an instance down, unhealthy or not
  serving its release, a serving group down, a host unreachable or drifting from its data, a
  release changed after its install, status metrics gone stale, TTFT p95 over its threshold,
  the KV cache near full, requests waiting too long, the router down or finding an instance
  unhealthy. Copy it to /etc/prometheus/ and name it in `rule_files`.
- `servefleet-dashboard.json`: the fleet in Grafana (Dashboards, New, Import).
- `prometheus.yml`: an example scrape configuration; merge it into yours.

The thresholds are data (`monitoring_thresholds` in group_data/all.py; `servefleet keys
monitoring_thresholds`). After changing them, render the rules again:
`servefleet monitoring inventories/prod.py --out monitoring/servefleet-rules.yml`.

From cron on the Prometheus host, every few minutes:
`servefleet status inventories/prod.py --prometheus /etc/prometheus/servefleet.json --textfile /var/lib/prometheus/node-exporter/servefleet.prom`
"""


def kit_files(thresholds: Mapping[str, Any] | None = None) -> dict[str, str]:
    """A fleet repository's ``monitoring/`` (``servefleet init``): relative path -> text.

    + thresholds: ``monitoring_thresholds`` for the rules (none: the defaults)
    """
    return {
        "monitoring/servefleet-rules.yml": rules(thresholds),
        "monitoring/servefleet-dashboard.json": dashboard(),
        "monitoring/prometheus.yml": prometheus_config(),
        "monitoring/README.md": README,
    }


def fleet_thresholds(settings: Mapping[str, Settings]) -> dict[str, int]:
    """The one ``monitoring_thresholds`` of a fleet's hosts (Prometheus alerts on every host
    alike); DataError names two hosts whose data differ.

    + settings: each host's validated data
    """
    first: tuple[str, dict[str, int]] | None = None
    for host, s in settings.items():
        if first is None:
            first = (host, s.monitoring_thresholds)
        elif s.monitoring_thresholds != first[1]:
            raise DataError(
                f"{KEY}: {first[0]} and {host} differ; allowed: one value for every host of the "
                "inventory (group_data/all.py)"
            )
    return dict(first[1]) if first else dict(MONITORING)


def _names(metric: Mapping[str, Any]) -> list[str]:
    """The series names a declared metric shows on /metrics (a histogram's three)."""
    name = str(metric["name"])
    if metric["type"] == "histogram":
        return [f"{name}_bucket", f"{name}_sum", f"{name}_count"]
    return [name]


def exposed() -> dict[str, str]:
    """Every metric name the rules and the dashboard may read -> what exposes it."""
    out = {"up": "Prometheus, for each target of status --prometheus"}
    for path, who in ((VLLM_METRICS, reference().shown), (ROUTER_METRICS, "vllm-router")):
        for metric in json.loads(path.read_text())["metrics"]:
            out.update(dict.fromkeys(_names(metric), who))
    out.update(dict.fromkeys(TEXTFILE_METRICS, "servefleet status --textfile"))
    return out
