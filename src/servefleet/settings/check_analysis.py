"""The check of ``rollout_analysis``: the canary analysis of ``servefleet rollout --analysis``
(:mod:`servefleet.fleet.analysis`), as data. Each field has its check and default here, once;
data gives any of them (``--data 'rollout_analysis={"requests": 80}'``) and the others keep
their defaults. A bad field is refused in one line naming it and what it allows
(``rollout_analysis.requests: 0 is out of range; allowed: 1-10000``). Pure Python.

The load: ``requests`` per target (the canary's instance and the baseline's, the same prompts to
both), ``concurrency`` in flight per target, prompts of ``prompt_tokens`` words, answers of
``output_tokens`` tokens; ``timeout`` seconds for the whole probe, ``request_timeout`` for one
request. The thresholds: how much worse the canary may be than the baseline before a measure
can fail, as a fraction (``0.1``: a TTFT or ITL 10 % longer, 10 % fewer output tokens/s;
``error_rate``: its error rate above the baseline's, absolute), and ``significance``: the level
of the one-sided test that must also find it worse (docs/real-fleet.md, the rule).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from servefleet.settings import checks as c

__all__ = ["ANALYSIS", "MEASURES", "number", "rollout_analysis"]

# the measures the rule judges, each with its threshold field of the same name
MEASURES = ("ttft_p50", "ttft_p95", "itl_p50", "itl_p95", "tokens_per_s", "error_rate")


def number(low: float, high: float) -> c.Check:
    """A finite int or float (never a bool or a string) within [low, high]."""
    allowed = f"a number from {low:g} to {high:g}"

    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise c.Refused(f"expected a number, got {c.show(value)}", allowed)
        if not math.isfinite(value) or not low <= value <= high:
            raise c.bad(value, "is out of range", allowed)
        return float(value)

    return check


_FIELDS: dict[str, tuple[c.Check, float]] = {
    "requests": (c.whole(1, 10000), 40),
    "concurrency": (c.whole(1, 256), 4),
    "prompt_tokens": (c.whole(1, 32768), 128),
    "output_tokens": (c.whole(2, 8192), 64),
    "timeout": (c.whole(1, 3600), 180),
    "request_timeout": (c.whole(1, 3600), 30),
    "ttft_p50": (number(0, 10), 0.10),
    "ttft_p95": (number(0, 10), 0.20),
    "itl_p50": (number(0, 10), 0.10),
    "itl_p95": (number(0, 10), 0.20),
    "tokens_per_s": (number(0, 1), 0.10),
    "error_rate": (number(0, 1), 0.05),
    "significance": (number(1e-9, 0.5), 0.01),
}
ANALYSIS: dict[str, float] = {name: default for name, (_, default) in _FIELDS.items()}
_RECORD = c.record(
    {name: check for name, (check, _) in _FIELDS.items()}, (), "a mapping of " + ", ".join(_FIELDS)
)


def rollout_analysis(value: Any) -> dict[str, float]:
    """Each field given checked, over :data:`ANALYSIS` (a field not given keeps its default);
    a request's timeout is at most the whole probe's."""
    given: Mapping[str, Any] = _RECORD(value)
    out = {**ANALYSIS, **given}
    if out["request_timeout"] > out["timeout"]:
        raise c.Refused(
            f"{c.show(out['request_timeout'])} is more than timeout ({out['timeout']:g})",
            "at most the whole probe's timeout",
            ".request_timeout",
        )
    return out
