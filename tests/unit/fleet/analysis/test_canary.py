"""The canary analysis as the rollout runs it (fleet/analysis/canary.py), on status reports
written here and a probe that answers recorded samples (analysis_cases.py): which instances are
probed (the first healthy serving one of the canary, of the hosts not yet upgraded: address and
port, each host's own key), the verdict, a failure naming each failed measure with both values,
no baseline, and the report written beside its picture."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from analysis_cases import RecordedProbe

from servefleet.base.errors import ServefleetError
from servefleet.fleet.analysis.canary import Analysis, serving
from servefleet.fleet.analysis.probe import Load, Target
from servefleet.settings.check_analysis import ANALYSIS


def status(address: str, *instances: dict[str, Any]) -> dict[str, Any]:
    return {"address": address, "release": "r1", "instances": list(instances)}


def inst(port: int, health: str = "ok", **more: Any) -> dict[str, Any]:
    return {"unit": f"servefleet-vllm-{port - 8000}.service", "port": port, "health": health,
            "running": "a1", **more}  # fmt: skip


STATUSES = {
    "h1": status("10.0.0.1", inst(8000, "down"), inst(8001)),
    "h2": status("10.0.0.2", inst(8000, headless=True)),  # a group's rank: nothing serves
    "h3": status("10.0.0.3", inst(8000), inst(8001)),
}
HOSTS = {h: dict(ANALYSIS) for h in ("h1", "h2", "h3")}


def test_the_first_healthy_serving_instances_are_probed_each_with_its_hosts_key() -> None:
    probe = RecordedProbe("equal")
    analysis = Analysis(HOSTS, {"h1": "k1", "h3": "k3"}, run_probe=probe)
    out = analysis(["h1"], ["h2", "h3"], STATUSES)
    assert out.passed and out.why == "" and out.host == "h1"
    (targets, load), = probe.calls  # fmt: skip
    assert targets == [Target("canary", "http://10.0.0.1:8001", "h1"),
                       Target("baseline", "http://10.0.0.3:8000", "h3")]  # fmt: skip
    assert [t.key for t in targets] == ["k1", "k3"]
    assert load == Load(40, 4, 128, 64, 180, 30)
    assert out.lines[0] == ("analysis: canary h1 http://10.0.0.1:8001 against baseline h3 "
                            "http://10.0.0.3:8000: 40 requests each, 4 at a time")  # fmt: skip
    assert out.lines[-1] == "analysis passed (1.5 s)"
    assert out.report is not None and out.report["passed"] and out.report["failed"] == []
    assert "k1" not in json.dumps(out.report) + "\n".join(out.lines)


def test_a_slower_canary_fails_naming_each_measure_with_both_values(tmp_path: Path) -> None:
    analysis = Analysis(HOSTS, run_probe=RecordedProbe("slower_30"), report_dir=tmp_path)
    out = analysis(["h1"], ["h3"], STATUSES)
    assert not out.passed and out.report is not None
    assert out.report["failed"] == ["ttft_p50", "itl_p50", "tokens_per_s"]
    m = {x["name"]: x for x in out.report["measures"]}
    ttft, tps = m["ttft_p50"], m["tokens_per_s"]
    assert out.why == (
        f"analysis: ttft_p50: canary {ttft['canary'] * 1000:.1f} ms, baseline "
        f"{ttft['baseline'] * 1000:.1f} ms ({ttft['why']}); itl_p50: canary "
        f"{m['itl_p50']['canary'] * 1000:.1f} ms, baseline {m['itl_p50']['baseline'] * 1000:.1f} "
        f"ms ({m['itl_p50']['why']}); tokens_per_s: canary {tps['canary']:.1f} tok/s, baseline "
        f"{tps['baseline']:.1f} tok/s ({tps['why']})"
    )
    table = [line for line in out.lines if line.startswith(("measure", "ttft_p50", "tokens"))]
    assert table[0].split()[:5] == ["measure", "canary", "h1", "baseline", "h3"]
    assert table[1].split()[-1] == "FAILED" and "ms" in table[1]
    assert out.lines[-1] == f"analysis report: {tmp_path}/analysis.json, {tmp_path}/analysis.svg"
    assert json.loads((tmp_path / "analysis.json").read_text()) == out.report
    svg = ET.fromstring((tmp_path / "analysis.svg").read_text())  # well-formed
    texts = [t.text or "" for t in svg.iter("{http://www.w3.org/2000/svg}text")]
    assert texts[0].endswith("FAILED: ttft_p50, itl_p50, tokens_per_s")
    assert "canary" in texts and "baseline" in texts
    assert len(list(svg.iter("{http://www.w3.org/2000/svg}circle"))) == 4 * 40  # every request


def test_no_baseline_is_one_line_and_nothing_is_probed() -> None:
    probe = RecordedProbe("equal")
    analysis = Analysis(HOSTS, run_probe=probe)
    assert analysis(["h1"], [], STATUSES).why == "analysis: no baseline: the canary is every host"
    out = analysis(["h1"], ["h2", "h9"], {**STATUSES, "h9": {"unreachable": "Could not connect"}})
    assert not out.passed and out.why == (
        "analysis: no baseline: no host not yet upgraded serves healthy (h2: no instance "
        "answers healthy; h9: Could not connect)"
    )
    out = analysis([], ["h3"], STATUSES)
    assert out.why == "analysis: no canary instance to probe (every canary host failed)"
    assert probe.calls == []


def test_a_probe_that_ran_past_its_bound_fails_the_analysis() -> None:
    def stuck(targets: Any, load: Any) -> Any:
        raise ServefleetError("analysis: the probe ran past 205 s")

    out = Analysis(HOSTS, run_probe=stuck)(["h1"], ["h3"], STATUSES)
    assert (out.passed, out.why, out.host) == (False, "analysis: the probe ran past 205 s", "h1")


def test_a_report_directory_that_cannot_be_written_is_said(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    out = Analysis(HOSTS, run_probe=RecordedProbe("equal"), report_dir=gone)(
        ["h1"], ["h3"], STATUSES
    )
    assert out.passed and out.lines[-1].startswith(
        f"analysis: the report was not written to {gone}"
    )


def test_serving_ports() -> None:
    assert serving(STATUSES["h1"]) == [8001] and serving(STATUSES["h2"]) == []
    assert serving(None) == [] and serving({"unreachable": "x"}) == []
