"""The rule that judges a canary against its baseline, measure by measure (pure; no numpy or
scipy). Both were sent the same requests in the same time window (:mod:`.probe`); each side's
per-request samples are a :class:`Samples`.

**The rule.** A latency measure (TTFT p50/p95, inter-token latency p50/p95) fails only when
both hold:

(a) the canary's value is worse than the baseline's by more than its threshold, as a fraction
    (``canary / baseline - 1 > threshold``; for output tokens/s, ``1 - canary / baseline >
    threshold``), and
(b) a one-sided Mann-Whitney U test on the per-request samples says the canary's are larger
    (tokens/s: smaller) at the significance level: the normal approximation with the tie
    correction and a continuity correction (:func:`mann_whitney_greater`).

(a) keeps a difference too small to matter from failing however sure the test is; (b) keeps a
difference the noise of a few dozen requests can make from failing however large it looks. The
per-request samples: each successful request's TTFT, its mean inter-token gap (the ITL
measures; their values are the percentiles of every gap of every request, as vLLM's histogram
counts them) and its output tokens over its duration. The p95 measures are tested with the same
U test: it asks whether the canary's samples are stochastically larger, which is what a slower
release makes them; a change only in the tail shows in (a) first.

The error rate has its own rule: it fails when the canary's rate is above the baseline's by
more than its threshold (absolute: 0.05 lets 2 errors more in 40 requests pass, not 3). No test:
a healthy instance answers a few dozen requests without an error, and a test at the same level
would let 5 errors in 40 against none pass (a one-sided Fisher exact p of 0.03). A measure with
no successful request on a side cannot be computed and fails.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

# measure -> (what it reads, the quantile; None: the median of per-request values)
LATENCIES = {"ttft_p50": ("ttft", 0.5), "ttft_p95": ("ttft", 0.95),
             "itl_p50": ("itl", 0.5), "itl_p95": ("itl", 0.95)}  # fmt: skip


@dataclass
class Samples:
    """One side's per-request samples.

    + ttft: each successful request's time to first token (s)
    + itl: each successful request's inter-token gaps (s), one list a request
    + tokens_per_s: each successful request's output tokens over its duration
    + errors: requests that failed (an HTTP error, a cut stream, a timeout)
    + requests: requests sent
    """

    ttft: list[float] = field(default_factory=list)
    itl: list[list[float]] = field(default_factory=list)
    tokens_per_s: list[float] = field(default_factory=list)
    errors: int = 0
    requests: int = 0

    def gaps(self) -> list[float]:
        """Every inter-token gap of every request."""
        return [g for gaps in self.itl for g in gaps]

    def itl_means(self) -> list[float]:
        """Each request's mean inter-token gap (the ITL measures' test samples)."""
        return [sum(gaps) / len(gaps) for gaps in self.itl if gaps]

    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0


@dataclass
class Measure:
    """One measure's verdict.

    + name: ``ttft_p50``, ..., ``tokens_per_s``, ``error_rate``
    + canary, baseline: each side's value (s, tokens/s or a fraction; None: no sample)
    + worse: how much worse the canary is (a fraction; negative: better)
    + threshold: how much worse it may be
    + p: the one-sided test's p-value
    + passed: the verdict
    + why: a failure's reason, in words
    """

    name: str
    canary: float | None
    baseline: float | None
    worse: float | None
    threshold: float
    p: float | None
    passed: bool
    why: str = ""


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile, linear between order statistics (numpy's default)."""
    xs = sorted(values)
    if not xs:
        raise ValueError("no values")
    at = (len(xs) - 1) * q
    lo = math.floor(at)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (at - lo)


def _upper_tail(z: float) -> float:
    """P(Z >= z) for a standard normal Z."""
    return 0.5 * math.erfc(z / math.sqrt(2))


def mann_whitney_greater(x: Sequence[float], y: Sequence[float]) -> float:
    """One-sided p-value that ``x`` is stochastically greater than ``y`` (Mann-Whitney U; the
    normal approximation, midranks for ties with the tie-corrected variance, a continuity
    correction of 1/2). 1.0 when every value is equal or a side is empty."""
    n1, n2 = len(x), len(y)
    if not n1 or not n2:
        return 1.0
    pooled = sorted([(v, 0) for v in x] + [(v, 1) for v in y])
    n = n1 + n2
    rank_x = 0.0
    ties = 0.0
    i = 0
    while i < n:
        j = i
        while j + 1 < n and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        mid = (i + j) / 2 + 1  # ranks from 1
        t = j - i + 1
        ties += t**3 - t
        rank_x += mid * sum(1 for k in range(i, j + 1) if pooled[k][1] == 0)
        i = j + 1
    u = rank_x - n1 * (n1 + 1) / 2
    mean = n1 * n2 / 2
    var = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1))) if n > 1 else 0.0
    if var <= 0:
        return 1.0
    return _upper_tail((u - mean - 0.5) / math.sqrt(var))


def _ratio(worse: float, better: float) -> float:
    """``worse / better - 1``, for positive values (inf when better is 0 and worse is not)."""
    if better > 0:
        return worse / better - 1
    return 0.0 if worse <= 0 else math.inf


def _latency(name: str, c: Samples, b: Samples, threshold: float, alpha: float) -> Measure:
    what, q = LATENCIES[name]
    values = {"ttft": lambda s: s.ttft, "itl": lambda s: s.gaps()}[what]
    tested = {"ttft": lambda s: s.ttft, "itl": lambda s: s.itl_means()}[what]
    if not values(c) or not values(b):
        side = "canary" if not values(c) else "baseline"
        return Measure(name, None, None, None, threshold, None, False,
                       f"no {what} sample on the {side}")  # fmt: skip
    vc, vb = quantile(values(c), q), quantile(values(b), q)
    worse = _ratio(vc, vb)
    p = mann_whitney_greater(tested(c), tested(b))
    failed = worse > threshold and p < alpha
    why = f"{worse:.0%} longer, threshold {threshold:.0%}, p={p:.2g}" if failed else ""
    return Measure(name, vc, vb, worse, threshold, p, not failed, why)


def _throughput(c: Samples, b: Samples, threshold: float, alpha: float) -> Measure:
    name = "tokens_per_s"
    if not c.tokens_per_s or not b.tokens_per_s:
        side = "canary" if not c.tokens_per_s else "baseline"
        return Measure(name, None, None, None, threshold, None, False,
                       f"no tokens/s sample on the {side}")  # fmt: skip
    vc, vb = quantile(c.tokens_per_s, 0.5), quantile(b.tokens_per_s, 0.5)
    worse = 1 - vc / vb if vb > 0 else 0.0
    p = mann_whitney_greater(b.tokens_per_s, c.tokens_per_s)
    failed = worse > threshold and p < alpha
    why = f"{worse:.0%} fewer, threshold {threshold:.0%}, p={p:.2g}" if failed else ""
    return Measure(name, vc, vb, worse, threshold, p, not failed, why)


def _errors(c: Samples, b: Samples, threshold: float) -> Measure:
    rc, rb = c.error_rate(), b.error_rate()
    failed = rc - rb > threshold
    why = f"{rc - rb:+.1%} over the baseline's, threshold {threshold:.0%}" if failed else ""
    return Measure("error_rate", rc, rb, rc - rb, threshold, None, not failed, why)


def judge(canary: Samples, baseline: Samples, thresholds: Mapping[str, float]) -> list[Measure]:
    """Every measure's verdict, in the order of :data:`LATENCIES`, then tokens/s, error rate.

    + thresholds: ``rollout_analysis``: each measure's threshold and ``significance``
    """
    alpha = thresholds["significance"]
    out = [_latency(m, canary, baseline, thresholds[m], alpha) for m in LATENCIES]
    out.append(_throughput(canary, baseline, thresholds["tokens_per_s"], alpha))
    out.append(_errors(canary, baseline, thresholds["error_rate"]))
    return out


# ---------------------------------------------------------------------------------------------
# The rule's operating characteristic on synthetic runs (docs/real-fleet.md's numbers)


def synthetic(
    rng: random.Random, requests: int, tokens: int, slower: float = 0.0, ttft: float = 0.05,
    itl: float = 0.01,
) -> Samples:  # fmt: skip
    """One side of a synthetic probe: each request's TTFT lognormal around ``ttft`` (sigma
    0.3), its own ITL level lognormal around ``itl`` (sigma 0.15), each gap lognormal around
    that (sigma 0.3); ``slower``: every time that much longer (0.3: 30 % slower)."""
    out = Samples(requests=requests)
    k = 1 + slower
    for _ in range(requests):
        first = ttft * rng.lognormvariate(0, 0.3) * k
        level = itl * rng.lognormvariate(0, 0.15) * k
        gaps = [level * rng.lognormvariate(0, 0.3) for _ in range(tokens - 1)]
        out.ttft.append(first)
        out.itl.append(gaps)
        out.tokens_per_s.append(tokens / (first + sum(gaps)))
    return out


def alarm_rate(
    trials: int, slower: float, thresholds: Mapping[str, float], seed: int = 35,
    requests: int | None = None, tokens: int | None = None,
) -> tuple[float, dict[str, int]]:  # fmt: skip
    """The share of ``trials`` synthetic probes whose canary (``slower``) fails the rule, and
    how often each measure failed.

    + requests, tokens: each side's requests and output tokens (default: the thresholds')
    """
    rng = random.Random(seed)
    n = int(requests or thresholds.get("requests", 40))
    t = int(tokens or thresholds.get("output_tokens", 64))
    failed = 0
    each: dict[str, int] = {}
    for _ in range(trials):
        verdict = judge(synthetic(rng, n, t, slower), synthetic(rng, n, t), thresholds)
        bad = [m.name for m in verdict if not m.passed]
        failed += bool(bad)
        for name in bad:
            each[name] = each.get(name, 0) + 1
    return failed / trials, each
