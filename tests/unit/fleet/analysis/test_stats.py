"""The canary analysis' rule (fleet/analysis/stats.py): the Mann-Whitney U test and quantiles
against values worked by hand; the rule on recorded samples; its false alarms and detection on
synthetic runs (seeded: the same numbers every run).

tests/data/analysis_samples.json was recorded by the probe (fleet/analysis/probe.py) from two streaming
servers on 127.0.0.1 (stream_server.py; 40 requests a side, 4 at a time, 12 output tokens):
``equal`` both with a TTFT of 20 ms and 4 ms between tokens; ``slower_30`` the canary's 30 %
longer (26 ms, 5.2 ms); ``noisy`` both at 20/4 ms with each request's times multiplied by its
own lognormal factor (sigma 0.5, seeded)."""

from __future__ import annotations

import math
import random

import pytest
from analysis_cases import recorded

from servefleet.fleet.analysis import stats
from servefleet.fleet.analysis.stats import Samples, judge, mann_whitney_greater, quantile
from servefleet.settings.check_analysis import ANALYSIS


def by_name(measures: list[stats.Measure]) -> dict[str, stats.Measure]:
    return {m.name: m for m in measures}


def test_mann_whitney_against_values_worked_by_hand() -> None:
    # no ties: U = 25 of 25, z = (25 - 12.5 - 0.5) / sqrt(25 * 11 / 12)
    assert mann_whitney_greater([6, 7, 8, 9, 10], [1, 2, 3, 4, 5]) == pytest.approx(
        0.0060929, abs=1e-7
    )
    assert mann_whitney_greater([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == pytest.approx(
        0.9966923, abs=1e-7
    )
    # ties: midranks 1.5, 4.5, 7.5; U = 14; the variance 16/12 * (9 - 72/56)
    z = (14 - 8 - 0.5) / math.sqrt(16 / 12 * (9 - 72 / 56))
    assert mann_whitney_greater([2, 2, 3, 3], [1, 1, 2, 2]) == pytest.approx(
        0.5 * math.erfc(z / math.sqrt(2))
    )
    assert mann_whitney_greater([1.0] * 5, [1.0] * 7) == 1.0  # all tied: no evidence
    assert mann_whitney_greater([], [1.0]) == 1.0 and mann_whitney_greater([1.0], []) == 1.0


def test_quantiles_interpolate_between_order_statistics() -> None:
    assert quantile([3, 1, 2, 4], 0.5) == 2.5
    assert quantile([1, 2, 3, 4, 5], 0.95) == pytest.approx(4.8)
    assert quantile([7], 0.95) == 7
    with pytest.raises(ValueError):
        quantile([], 0.5)


def test_equal_recorded_samples_pass_every_measure() -> None:
    verdict = judge(*recorded("equal"), ANALYSIS)
    assert [m.name for m in verdict] == ["ttft_p50", "ttft_p95", "itl_p50", "itl_p95",
                                         "tokens_per_s", "error_rate"]  # fmt: skip
    assert all(m.passed for m in verdict), verdict


def test_a_30_percent_slower_canary_fails_ttft_itl_and_tokens_per_s_with_both_values() -> None:
    canary, baseline = recorded("slower_30")
    m = by_name(judge(canary, baseline, ANALYSIS))
    failed = sorted(name for name, x in m.items() if not x.passed)
    assert failed == ["itl_p50", "tokens_per_s", "ttft_p50"]
    ttft = m["ttft_p50"]
    assert ttft.canary == quantile(canary.ttft, 0.5) and ttft.baseline == quantile(
        baseline.ttft, 0.5
    )
    assert ttft.worse is not None and ttft.worse > 0.1 and ttft.p is not None and ttft.p < 1e-6
    assert ttft.why.startswith(f"{ttft.worse:.0%} longer, threshold 10%, p=")
    tps = m["tokens_per_s"]
    assert tps.canary is not None and tps.baseline is not None and tps.canary < tps.baseline
    assert tps.why.startswith(f"{tps.worse:.0%} fewer, threshold 10%")
    # a threshold above the difference: the test alone never fails a measure
    assert all(x.passed for x in judge(canary, baseline, {**ANALYSIS, **dict.fromkeys(
        ("ttft_p50", "ttft_p95", "itl_p50", "itl_p95", "tokens_per_s"), 0.35)}))  # fmt: skip


def test_noisy_recorded_samples_pass() -> None:
    canary, baseline = recorded("noisy")
    assert quantile(canary.ttft, 0.95) / quantile(canary.ttft, 0.5) > 1.5  # noisy indeed
    assert all(m.passed for m in judge(canary, baseline, ANALYSIS))


def test_a_large_difference_the_noise_could_make_does_not_fail() -> None:
    """(b) alone: 4 requests a side, the canary's 50 % slower by its median: not significant."""
    c = Samples(ttft=[0.03, 0.06, 0.09, 0.2], itl=[[0.01]] * 4, tokens_per_s=[10.0] * 4,
                requests=4)  # fmt: skip
    b = Samples(ttft=[0.02, 0.04, 0.06, 0.25], itl=[[0.01]] * 4, tokens_per_s=[10.0] * 4,
                requests=4)  # fmt: skip
    m = by_name(judge(c, b, ANALYSIS))["ttft_p50"]
    assert m.worse == pytest.approx(0.5) and m.p is not None and m.p > 0.01 and m.passed


def test_the_error_rate_has_its_own_rule() -> None:
    ok = Samples(ttft=[0.01], itl=[[0.01]], tokens_per_s=[1.0], requests=40)
    two = Samples(ttft=[0.01], itl=[[0.01]], tokens_per_s=[1.0], errors=2, requests=40)
    three = Samples(ttft=[0.01], itl=[[0.01]], tokens_per_s=[1.0], errors=3, requests=40)
    assert by_name(judge(two, ok, ANALYSIS))["error_rate"].passed  # 5 %: not over 5 %
    m = by_name(judge(three, ok, ANALYSIS))["error_rate"]
    assert not m.passed and (m.canary, m.baseline) == (0.075, 0.0)
    assert m.why == "+7.5% over the baseline's, threshold 5%"
    assert by_name(judge(three, three, ANALYSIS))["error_rate"].passed  # both as bad


def test_a_side_without_a_successful_request_fails_what_it_cannot_measure() -> None:
    dead = Samples(errors=40, requests=40)
    fine = Samples(ttft=[0.01] * 3, itl=[[0.01, 0.02]] * 3, tokens_per_s=[5.0] * 3, requests=40)
    m = by_name(judge(dead, fine, ANALYSIS))
    assert not any(x.passed for x in m.values())
    assert m["ttft_p50"].why == "no ttft sample on the canary"
    assert m["tokens_per_s"].why == "no tokens/s sample on the canary"
    assert by_name(judge(fine, dead, ANALYSIS))["itl_p95"].why == "no itl sample on the baseline"


def test_false_alarms_and_detection_on_synthetic_runs() -> None:
    """A smaller run of docs/real-fleet.md's numbers (1000 trials there; 200 here)."""
    equal, _ = stats.alarm_rate(200, 0.0, ANALYSIS)
    slower, _ = stats.alarm_rate(200, 0.3, ANALYSIS)
    assert equal <= 0.05 and slower == 1.0
    assert stats.alarm_rate(50, 0.0, ANALYSIS) == stats.alarm_rate(50, 0.0, ANALYSIS)  # seeded


def test_synthetic_samples_are_slower_by_the_factor() -> None:
    a = stats.synthetic(random.Random(1), 400, 16)
    b = stats.synthetic(random.Random(1), 400, 16, slower=0.3)
    assert quantile(b.ttft, 0.5) == pytest.approx(1.3 * quantile(a.ttft, 0.5))
    assert len(a.itl[0]) == 15 and a.requests == 400 and a.errors == 0
