"""The canary analysis' report: the verdict as a dict (``--json``, and ``analysis.json`` beside
its picture), the table the terminal shows, one line per failed measure with both values, and
an SVG of the canary's and the baseline's latency distributions side by side (TTFT and each
request's mean inter-token latency: a box from the 25th to the 75th percentile, whiskers to the
5th and 95th, the median, every request a dot). Hand-written SVG: no plotting library."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any
from xml.sax.saxutils import escape

from servefleet.fleet.analysis.probe import Load, Side
from servefleet.fleet.analysis.stats import Measure, quantile
from servefleet.fleet.fleetview import table as text_table

# the server's own metrics the report shows (a unit test holds each to the reference's names)
SERVER_METRICS = {
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram",
    "vllm:generation_tokens_total": "counter",
    "vllm:prompt_tokens_total": "counter",
    "vllm:request_success_total": "counter",
    "vllm:num_preemptions_total": "counter",
}
UNITS = {"ttft_p50": "ms", "ttft_p95": "ms", "itl_p50": "ms", "itl_p95": "ms",
         "tokens_per_s": "tok/s", "error_rate": "%"}  # fmt: skip


def _r(value: float | None, digits: int = 6) -> float | None:
    return None if value is None or math.isinf(value) else round(value, digits)


def _side(side: Side) -> dict[str, Any]:
    s = side.samples
    return {
        "host": side.target.host,
        "origin": side.target.origin,
        "model": side.model,
        "requests": s.requests,
        "errors": s.errors,
        "first_errors": list(side.errors),
        "samples": {
            "ttft_s": [_r(v) for v in s.ttft],
            "itl_mean_s": [_r(v) for v in s.itl_means()],
            "tokens_per_s": [_r(v, 3) for v in s.tokens_per_s],
        },
        "server": {k: v for k, v in side.metrics.items() if k in SERVER_METRICS},
        "metrics_error": side.metrics_error,
        "undeclared_metrics": list(side.undeclared),
    }


def verdict(
    sides: Sequence[Side], measures: Sequence[Measure], took: float, load: Load
) -> dict[str, Any]:
    """The analysis as a dict: passed, the failed measures, each measure (both values, how much
    worse, the threshold, the test's p), each side (its samples and the server's metrics) and
    the probe's load and time."""
    canary, baseline = sides
    return {
        "passed": all(m.passed for m in measures),
        "failed": [m.name for m in measures if not m.passed],
        "measures": [
            {
                "name": m.name,
                "canary": _r(m.canary),
                "baseline": _r(m.baseline),
                "worse": _r(m.worse, 4),
                "threshold": m.threshold,
                "p": None if m.p is None else float(f"{m.p:.3g}"),
                "passed": m.passed,
                "why": m.why,
            }  # fmt: skip
            for m in measures
        ],
        "canary": _side(canary),
        "baseline": _side(baseline),
        "load": vars(load),
        "took_s": round(took, 2),
    }


def _value(name: str, value: float | None) -> str:
    if value is None:
        return "-"
    unit = UNITS[name]
    if unit == "ms":
        return f"{value * 1000:.1f} ms"
    if unit == "%":
        return f"{value:.1%}"
    return f"{value:.1f} tok/s"


def failed_lines(report: Mapping[str, Any]) -> list[str]:
    """One line per failed measure: its name, both values and why."""
    return [
        f"analysis: {m['name']}: canary {_value(m['name'], m['canary'])}, baseline "
        f"{_value(m['name'], m['baseline'])} ({m['why']})"
        for m in report["measures"]
        if not m["passed"]
    ]


def table(report: Mapping[str, Any]) -> str:
    """The verdict as the terminal shows it: a row per measure, then the server's view."""
    c, b = report["canary"], report["baseline"]
    head = ["measure", f"canary {c['host']}", f"baseline {b['host']}", "worse", "threshold",
            "p", "verdict"]  # fmt: skip
    rows = []
    for m in report["measures"]:
        worse = "-" if m["worse"] is None else f"{m['worse']:+.1%}"
        p = "-" if m["p"] is None else f"{m['p']:.2g}"
        rows.append([m["name"], _value(m["name"], m["canary"]), _value(m["name"], m["baseline"]),
                     worse, f"{m['threshold']:.0%}", p, "ok" if m["passed"] else "FAILED"])  # fmt: skip
    lines = text_table(rows, head).splitlines()
    for role, side in (("canary", c), ("baseline", b)):
        lines.append(f"{role} {side['origin']}: {side['requests']} requests, "
                     f"{side['errors']} failed{_errors(side)}; server: {_server(side)}")  # fmt: skip
    verdict = "passed" if report["passed"] else "FAILED: " + ", ".join(report["failed"])
    lines.append(f"analysis {verdict} ({report['took_s']:g} s)")
    return "\n".join(lines)


def _errors(side: Mapping[str, Any]) -> str:
    return f" ({'; '.join(side['first_errors'])})" if side["first_errors"] else ""


def _server(side: Mapping[str, Any]) -> str:
    """The server's own view: its TTFT and ITL histograms' p50 and the tokens it counted."""
    if side["metrics_error"]:
        return side["metrics_error"]
    s = side["server"]
    parts = []
    for name, label in (("vllm:time_to_first_token_seconds", "TTFT"),
                        ("vllm:inter_token_latency_seconds", "ITL")):  # fmt: skip
        h = s.get(name)
        if h and h.get("p50") is not None:
            parts.append(f"{label} p50 {h['p50'] * 1000:.1f} ms over {h['count']:g}")
    tokens = s.get("vllm:generation_tokens_total")
    if tokens:
        parts.append(f"{tokens['delta']:g} tokens generated")
    return ", ".join(parts) or "no vLLM histograms"


# ---------------------------------------------------------------------------------------------
# The picture

_W, _PANEL_H, _TOP = 860, 150, 56
_COLOURS = {"canary": "#d95f02", "baseline": "#1b9e77"}


def _ticks(top: float) -> list[float]:
    raw = top / 5 if top > 0 else 1.0
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    return [i * step for i in range(int(top / step) + 1)]


def _panel(x0: float, title: str, data: Mapping[str, list[float]]) -> list[str]:
    """One panel: a row per side, a box, whiskers, the median and every sample as a dot."""
    width = _W / 2 - 60
    values = [v for vs in data.values() for v in vs]
    top = max(values) * 1.05 if values else 1.0

    def x(v: float) -> float:
        return x0 + 70 + (width - 80) * v / top

    out = [f'<text x="{x0 + 10}" y="{_TOP - 14}" font-weight="bold">{escape(title)}</text>']
    axis_y = _TOP + _PANEL_H - 20
    out.append(f'<line x1="{x(0):.1f}" y1="{axis_y}" x2="{x(top):.1f}" y2="{axis_y}" '
               'stroke="#444"/>')  # fmt: skip
    for t in _ticks(top):
        out.append(f'<line x1="{x(t):.1f}" y1="{axis_y}" x2="{x(t):.1f}" y2="{axis_y + 4}" '
                   f'stroke="#444"/><text x="{x(t):.1f}" y="{axis_y + 16}" '
                   f'text-anchor="middle" font-size="10">{t * 1000:g}</text>')  # fmt: skip
    for row, (role, vs) in enumerate(data.items()):
        y = _TOP + 20 + row * 55
        colour = _COLOURS[role]
        out.append(f'<text x="{x0 + 10}" y="{y + 4}" font-size="12">{role}</text>')
        if not vs:
            out.append(f'<text x="{x(0) + 4:.1f}" y="{y + 4}" font-size="11">no sample</text>')
            continue
        q = {p: quantile(vs, p) for p in (0.05, 0.25, 0.5, 0.75, 0.95)}
        out.append(f'<line x1="{x(q[0.05]):.1f}" y1="{y}" x2="{x(q[0.95]):.1f}" y2="{y}" '
                   f'stroke="{colour}"/>')  # fmt: skip
        out.append(f'<rect x="{x(q[0.25]):.1f}" y="{y - 10}" '
                   f'width="{max(x(q[0.75]) - x(q[0.25]), 1):.1f}" height="20" '
                   f'fill="{colour}" fill-opacity="0.25" stroke="{colour}"/>')  # fmt: skip
        out.append(f'<line x1="{x(q[0.5]):.1f}" y1="{y - 12}" x2="{x(q[0.5]):.1f}" '
                   f'y2="{y + 12}" stroke="{colour}" stroke-width="2.5"/>')  # fmt: skip
        for i, v in enumerate(vs):
            jitter = ((i * 0.618034) % 1 - 0.5) * 30  # the same picture for the same samples
            out.append(f'<circle cx="{x(v):.1f}" cy="{y + 22 + jitter / 3:.1f}" r="2" '
                       f'fill="{colour}" fill-opacity="0.6"/>')  # fmt: skip
        out.append(f'<text x="{x(q[0.5]):.1f}" y="{y - 15}" text-anchor="middle" '
                   f'font-size="10">p50 {q[0.5] * 1000:.1f}</text>')  # fmt: skip
    return out


def svg(report: Mapping[str, Any]) -> str:
    """The picture of ``report`` (:func:`verdict`): TTFT and mean ITL of each side, in ms."""
    c, b = report["canary"], report["baseline"]
    verdict = "passed" if report["passed"] else "FAILED: " + ", ".join(report["failed"])
    title = f"canary {c['host']} ({c['origin']}) vs baseline {b['host']} ({b['origin']}): {verdict}"
    height = _TOP + _PANEL_H + 20
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{height}" '
        f'viewBox="0 0 {_W} {height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{_W}" height="{height}" fill="white"/>',
        f'<text x="10" y="18" font-size="13">{escape(title)}</text>',
    ]
    for x0, key, name in ((0, "ttft_s", "TTFT (ms)"),
                          (_W / 2, "itl_mean_s", "inter-token latency, each request's mean (ms)")):  # fmt: skip
        data = {"canary": [v for v in c["samples"][key] if v is not None],
                "baseline": [v for v in b["samples"][key] if v is not None]}  # fmt: skip
        parts += _panel(x0, name, data)
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
