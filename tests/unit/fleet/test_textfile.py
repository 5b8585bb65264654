"""#35 ``status --textfile``: drift, reachability, release and gate results in the Prometheus
text format (for node_exporter's textfile collector), each metric once with its HELP and TYPE."""

from __future__ import annotations

import re

from servefleet.fleet.statusview import TEXTFILE_METRICS, missing_status, textfile_metrics

SAMPLE = re.compile(r'^([a-z_]+)(\{([a-z_]+="(?:[^"\\]|\\.)*",?)*\})? (-?[0-9.e+]+)$')


def status(release: str = "abc", health: str = "ok", drift: bool = False, **over) -> dict:
    base = {
        "address": "10.0.0.1", "refusal": None, "release": release, "release_drift": [],
        "instances": [{"unit": "servefleet-vllm-0.service", "port": 8000, "drift": drift,
                       "health": health, "running": "x", "desired": "y"}],
        "stale_units": [], "router": None, "group": None,
    }  # fmt: skip
    return base | over


def parse(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.startswith("#"):
            assert re.match(r"^# (HELP|TYPE) [a-z_]+ .+$", line), line
            continue
        m = SAMPLE.match(line)
        assert m, line
        out.setdefault(m.group(1), []).append(line)
    return out


def test_each_host_and_instance_is_a_sample_and_drift_is_a_metric() -> None:
    statuses = {
        "h1": status(),
        "h2": status(health="not healthy within 30s", drift=True,
                     release_drift=["release abc: vllm: version 9.9.9, installed 0.30.0"]),
        "h3": missing_status({"unreachable": "ssh: timed out"}, "10.0.0.3",
                             [("servefleet-vllm-0.service", 8000)]),
        'h"4': status(release='a"b\\c'),  # label values escaped
    }  # fmt: skip
    text = textfile_metrics(statuses, 1764800000.4)
    got = parse(text)
    assert set(got) == set(TEXTFILE_METRICS) - {"servefleet_group_serving"}  # no group here
    assert text.count("# TYPE ") == len(TEXTFILE_METRICS)  # each metric once
    assert 'servefleet_host_reachable{host="h3"} 0' in got["servefleet_host_reachable"]
    assert 'servefleet_host_drift{host="h1"} 0' in got["servefleet_host_drift"]
    assert 'servefleet_host_drift{host="h2"} 1' in got["servefleet_host_drift"]
    assert 'servefleet_host_release_drift{host="h2"} 1' in got["servefleet_host_release_drift"]
    assert ('servefleet_instance_healthy{host="h2",unit="servefleet-vllm-0.service"} 0'
            in got["servefleet_instance_healthy"])  # fmt: skip
    assert 'servefleet_host_release_info{host="h\\"4",release="a\\"b\\\\c"} 1' in text
    assert got["servefleet_status_timestamp_seconds"] == [
        "servefleet_status_timestamp_seconds 1764800000"
    ]
    assert not any('host="h3"' in x for x in got["servefleet_host_drift"])  # unknown: no sample


def test_a_serving_group_is_one_sample() -> None:
    group = {"name": "g1", "rank": 0, "hosts": ["h1", "h2"], "sha": "s"}
    statuses = {"h1": status(group=group), "h2": status(group={**group, "rank": 1})}
    assert 'servefleet_group_serving{group="g1"} 1' in textfile_metrics(statuses, 0)
    statuses["h2"] = missing_status({"unreachable": "gone"}, "10.0.0.2", [])
    assert 'servefleet_group_serving{group="g1"} 0' in textfile_metrics(statuses, 0)
