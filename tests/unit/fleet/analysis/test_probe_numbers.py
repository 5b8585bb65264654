"""The numbers the canary analysis reads from an instance's ``/metrics`` (fleet/analysis/probe.py),
two findings of the probe's fuzz campaign (test_fuzz_probe.py):

- a value or a bucket bound is read as the text format writes it (a float as Go's
  strconv.ParseFloat reads it: ASCII digits, a sign, a point, an exponent; ``NaN``, ``+Inf``,
  ``-Inf``), not as Python's float() does (``1_000``, `` 1 ``, ``٣``, ``1e999``): anything else
  is an odd answer naming the line;
- a change the analysis computes (a counter's delta, a histogram's count, sum, bucket change or
  quantile) that is not finite (two series near a float's largest add up to infinity) is an
  odd answer naming the metric and the value, so ``analysis.json`` is strict JSON."""

from __future__ import annotations

import json
import math
from pathlib import Path
from unittest import mock

import pytest
import stream_server
from analysis_cases import RecordedProbe
from stream_server import Behaviour, streaming

from servefleet.fleet.analysis import probe
from servefleet.fleet.analysis.canary import REPORT_JSON, Analysis
from servefleet.fleet.analysis.probe import OddAnswer
from servefleet.settings.check_analysis import ANALYSIS

HOSTS = {h: dict(ANALYSIS) for h in ("h1", "h2")}
STATUSES = {h: {"address": f"10.0.0.{i}", "release": "r1",
                "instances": [{"unit": "u", "port": 8000, "health": "ok"}]}
            for i, h in enumerate(HOSTS, 1)}  # fmt: skip
TYPES = {"c_total": "counter", "h": "histogram", "g": "gauge"}
BIG = "1.7e308"  # near a float's largest (1.7976931348623157e308): two add up to infinity


@pytest.mark.parametrize(
    ("text", "value"),
    [("1", 1.0), ("-0", -0.0), ("1.5", 1.5), (".5", 0.5), ("5.", 5.0), ("1e3", 1000.0),
     ("1E+3", 1000.0), ("2.5e-3", 0.0025), ("+7", 7.0), ("1e-999", 0.0), (BIG, 1.7e308),
     ("+Inf", math.inf), ("-Inf", -math.inf), ("Inf", math.inf), ("inf", math.inf),
     ("Infinity", math.inf), ("-infinity", -math.inf)],
)  # fmt: skip
def test_a_value_is_read_as_the_text_format_writes_it(text: str, value: float) -> None:
    assert probe.number(text) == value
    assert probe.parse_metrics(f'g{{a="1"}} {text}\n') == {"g": {'{a="1"}': value}}


@pytest.mark.parametrize("text", ["NaN", "nan", "NAN"])
def test_nan_is_a_value_and_a_gauge_may_be_it(text: str) -> None:
    scrape = probe.checked(probe.parse_metrics(f"vllm:num_requests_running {text}\n"),
                           probe.declared())  # fmt: skip
    assert math.isnan(scrape["vllm:num_requests_running"][""])


# each read by Python's float() (the last as infinity), none by the format's ParseFloat
NOT_VALUES = ["1_000", "1_0.5", "٣", "١٢", "１", "0x1f", "0x1p-2", "+nan", "-NaN", "1e999",
              "-1e999", "1" + "0" * 400, "infinit", "+-1", "1e", ".", "1.5.2", "e5"]  # fmt: skip


@pytest.mark.parametrize("text", NOT_VALUES)
def test_a_value_python_reads_but_the_format_does_not_is_odd(text: str) -> None:
    assert probe.number(text) is None
    line = f'c_total{{a="1"}} {text}'
    with pytest.raises(OddAnswer) as e:
        probe.parse_metrics(f"{line}\n")
    assert (e.value.what, e.value.answer) == ("/metrics answered a sample that is not a number",
                                              line)  # fmt: skip


@pytest.mark.parametrize("bound", [*NOT_VALUES, " 1", "1 ", " 1 ", "\t1", "1\n", "\u20031"])
def test_a_bucket_bound_python_reads_but_the_format_does_not_is_odd(bound: str) -> None:
    labels = f'{{e="0",le="{bound}"}}'
    scrape = {"h_bucket": {labels: 1.0}, "h_count": {'{e="0"}': 1.0}}
    with pytest.raises(OddAnswer) as e:
        probe.checked(scrape, TYPES)
    assert str(e.value).startswith("/metrics answered a bucket bound that is not a number of 0")
    with pytest.raises(OddAnswer):
        probe.deltas({}, scrape, TYPES)


def test_the_inf_bucket_is_read_in_each_spelling() -> None:
    for inf in ("+Inf", "Inf", "inf", "+Infinity"):
        after = probe.parse_metrics(f'h_bucket{{le="1.0"}} 1\nh_bucket{{le="{inf}"}} 10\n'
                                    "h_count 10\nh_sum 30\n")  # fmt: skip
        out = probe.deltas({}, probe.checked(after, TYPES), TYPES)["h"]
        assert (out["count"], out["p50"], out["p95"]) == (10.0, 1.0, 1.0)  # in +Inf: 1.0


def scrape(text: str) -> dict[str, dict[str, float]]:
    return probe.checked(probe.parse_metrics(text), TYPES)


@pytest.mark.parametrize(
    ("before", "after", "said"),
    [("", f'c_total{{r="a"}} {BIG}\nc_total{{r="b"}} {BIG}\n',
      "a counter whose change is not finite: 'c_total delta inf'"),
     ("", f'h_bucket{{e="0",le="+Inf"}} 1\nh_count{{e="0"}} {BIG}\nh_count{{e="1"}} {BIG}\n',
      "a histogram whose count is not finite: 'h count inf'"),
     ("", f'h_count{{e="0"}} 1\nh_sum{{e="0"}} {BIG}\nh_sum{{e="1"}} {BIG}\n',
      "a histogram whose sum is not finite: 'h sum inf'"),
     ("", f'h_bucket{{e="0",le="0.5"}} {BIG}\nh_bucket{{e="1",le="0.5"}} {BIG}\n'
      'h_bucket{e="0",le="+Inf"} 1\nh_count{e="0"} 1\n',
      "a histogram whose change is not finite: 'h_bucket{le=\"0.5\"} change inf'"),
     # each bucket's change finite (a reset: -1.7e308, then +1.7e308), their difference not:
     # the quantile's interpolation is inf / inf
     (f'h_bucket{{le="1"}} {BIG}\nh_bucket{{le="2"}} 0\nh_count 0\n',
      f'h_bucket{{le="1"}} 0\nh_bucket{{le="2"}} {BIG}\nh_count 1\n',
      "a histogram whose p50 is not finite: 'h p50 nan'")],
    ids=["counter", "count", "sum", "bucket", "quantile"],
)  # fmt: skip
def test_a_change_that_is_not_finite_is_odd_naming_the_metric(
    before: str, after: str, said: str
) -> None:
    with pytest.raises(OddAnswer) as e:
        probe.deltas(scrape(before), scrape(after), TYPES)
    assert str(e.value) == f"/metrics answered {said}"


def test_changes_near_the_largest_float_that_are_finite_are_read() -> None:
    before = scrape(f'c_total{{r="a"}} {BIG}\nc_total{{r="b"}} {BIG}\n')
    after = scrape(f'c_total{{r="a"}} {BIG}\nc_total{{r="b"}} 1.7000000000000001e308\n')
    assert probe.deltas(before, after, TYPES)["c_total"]["delta"] > 0
    assert probe.deltas(before, before, TYPES)["c_total"]["delta"] == 0.0


def overflowing(b: Behaviour, text: str) -> str:
    """The stream server's /metrics ``text``; after the first request, a second series of its
    token counter and both near a float's largest."""
    if b.served:
        lab = 'model_name="openai/gpt-oss-120b",engine="0"'
        text = text.replace(f"vllm:generation_tokens_total{{{lab}}} {float(b.tokens)}",
                            f"vllm:generation_tokens_total{{{lab}}} {BIG}\n"
                            f'vllm:generation_tokens_total{{{lab[:-2]}1"}} {BIG}')  # fmt: skip
    return text


def test_an_infinite_delta_fails_the_analysis_naming_the_instance(tmp_path: Path) -> None:
    data = dict(ANALYSIS, requests=2, concurrency=2, prompt_tokens=4, output_tokens=4,
                timeout=20, request_timeout=5)  # fmt: skip
    real = stream_server.metrics_text
    canary, baseline = Behaviour(), Behaviour()

    def metrics_text(b: Behaviour) -> str:
        return overflowing(b, real(b)) if b is canary else real(b)

    with mock.patch.object(stream_server, "metrics_text", metrics_text), \
            streaming(canary) as c, streaming(baseline) as b:  # fmt: skip
        statuses = {h: {"address": "127.0.0.1", "release": "r2",
                        "instances": [{"unit": "u", "port": int(o.rsplit(":", 1)[1]),
                                       "health": "ok"}]}
                    for h, o in (("c1", c), ("b1", b))}  # fmt: skip
        out = Analysis({"c1": data}, report_dir=tmp_path, run_probe=probe.run)(
            ["c1"], ["b1"], statuses
        )
    assert (out.passed, out.report) == (False, None)
    assert out.why == (f"analysis: canary c1 {c}: /metrics answered a counter whose change is "
                       "not finite: 'vllm:generation_tokens_total delta inf'")  # fmt: skip
    assert not (tmp_path / REPORT_JSON).exists()


def test_the_report_is_strict_json(tmp_path: Path) -> None:
    """A number that is not finite never reaches analysis.json: Infinity and NaN are not
    JSON (RFC 8259), and strict readers refuse them."""
    analysis = Analysis(HOSTS, report_dir=tmp_path, run_probe=RecordedProbe("equal"))
    with pytest.raises(ValueError, match="not JSON compliant"):
        analysis.write({"passed": True, "canary": {"server": {"c": {"delta": math.inf}}}})
    assert not (tmp_path / REPORT_JSON).exists()
    out = analysis(["h1"], ["h2"], STATUSES)
    assert out.lines[-1].startswith("analysis report: ")

    def refuse(constant: str) -> None:
        raise ValueError(constant)

    assert json.loads((tmp_path / REPORT_JSON).read_text(), parse_constant=refuse) == out.report
