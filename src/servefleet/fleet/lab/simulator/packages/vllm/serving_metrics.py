"""The simulated engine's Prometheus metrics on /metrics: vLLM 0.30's request histograms, queue
gauges and token and request counters, observed from the simulated requests' real timings
(``time.monotonic()``, :class:`vllm.lifecycle.Flight`), so a load probe can hold them against
what it measures itself. A SIMULATION for the servefleet lab.

What is exposed (:data:`HELP`, in the order vLLM's ``PrometheusStatLogger`` declares them): the
gauges ``vllm:num_requests_running``, ``vllm:num_requests_waiting`` (the queue of
``--max-num-seqs``, :mod:`vllm.lifecycle`) and ``vllm:kv_cache_usage_perc`` (the tokens the
running requests hold, prompt and generated, over :data:`KV_CAPACITY_TOKENS`, at most 1); the
counters ``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total`` and
``vllm:request_success_total`` (every ``finished_reason``); the histograms of time to first token
and inter-token latency (observed at each token) and of a finished request's time per output
token, end-to-end latency, queue, running (inference), prefill and decode time. Their names,
types, labels and buckets are vLLM 0.30.0's (``flags/vllm-0.30.0-metrics.json``, generated from
the real wheel), the help texts its own; as in vLLM, a finished request's times are: queue =
scheduled - arrived, prefill = first token - scheduled, decode = last token - first token,
inference = last token - scheduled, time per output token = decode / (tokens - 1) (0 for one
token). A request cut before its first token counts in ``request_success_total`` only.

Written as prometheus_client writes its text format 0.0.4 (``generate_latest``): per family
``# HELP`` then ``# TYPE``, a counter's name with ``_total``, labels sorted by name, values as
its ``floatToGoString``, a histogram's ``_bucket`` series by ``le`` (``+Inf`` last, cumulative),
then ``_count``, then ``_sum``. Unlike a default prometheus_client the ``_created`` series are left
out (as with ``PROMETHEUS_DISABLE_CREATED_SERIES``): nothing servefleet ships reads them.
"""

from __future__ import annotations

import bisect
import json
import math
import os
import threading
from collections.abc import Sequence
from typing import Any

from .common import FLAGS_DIR
from .lifecycle import Flight

METRICS_FILE = "vllm-0.30.0-metrics.json"
KV_CAPACITY_TOKENS = 65536  # the simulated KV cache: 4096 blocks of 16 tokens
# vllm/v1/engine/__init__.py: FINISH_REASON_STRINGS (request_success_total's finished_reason)
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
TTFT = "vllm:time_to_first_token_seconds"
ITL = "vllm:inter_token_latency_seconds"
# name -> vLLM 0.30.0's documentation of the metric (vllm/v1/metrics/loggers.py), in its order
HELP = {
    "vllm:num_requests_running": "Number of requests in model execution batches.",
    "vllm:num_requests_waiting": "Number of requests waiting to be processed.",
    "vllm:kv_cache_usage_perc": "KV-cache usage. 1 means 100 percent usage.",
    "vllm:prompt_tokens_total": "Number of prefill tokens processed.",
    "vllm:generation_tokens_total": "Number of generation tokens processed.",
    "vllm:request_success_total": "Count of successfully processed requests.",
    TTFT: "Histogram of time to first token in seconds.",
    ITL: "Histogram of inter-token latency in seconds.",
    "vllm:request_time_per_output_token_seconds": (
        "Histogram of time_per_output_token_seconds per request."
    ),
    "vllm:e2e_request_latency_seconds": "Histogram of e2e request latency in seconds.",
    "vllm:request_queue_time_seconds": "Histogram of time spent in WAITING phase for request.",
    "vllm:request_inference_time_seconds": (
        "Histogram of time spent in RUNNING phase for request."
    ),
    "vllm:request_prefill_time_seconds": "Histogram of time spent in PREFILL phase for request.",
    "vllm:request_decode_time_seconds": "Histogram of time spent in DECODE phase for request.",
}


def declared() -> dict[str, dict[str, Any]]:
    """vLLM 0.30.0's metrics by name (``flags/vllm-0.30.0-metrics.json``)."""
    with open(os.path.join(FLAGS_DIR, METRICS_FILE)) as fh:
        return {m["name"]: m for m in json.load(fh)["metrics"]}


DECLARED = {name: declared()[name] for name in HELP}


def go_float(value: float) -> str:
    """A value as prometheus_client writes it (``floatToGoString``): ``2.0``, ``+Inf``, ``1e+06``
    style exponents where Go would use them."""
    d = float(value)
    if d == math.inf:
        return "+Inf"
    if d == -math.inf:
        return "-Inf"
    if math.isnan(d):
        return "NaN"
    s = repr(d)
    dot = s.find(".")
    if d > 0 and dot > 6:
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return s


def _labels(labels: dict[str, str]) -> str:
    """``{name="value",...}``, sorted by name, each value escaped as prometheus_client does."""
    pairs = [f'{k}="{_escape(v)}"' for k, v in sorted(labels.items())]
    return "{" + ",".join(pairs) + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class Histogram:
    """A histogram with upper bounds ``bounds`` (and +Inf), as prometheus_client counts it."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = list(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # per bucket, not cumulative; last: +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def lines(self, name: str, labels: dict[str, str]) -> list[str]:
        out, total = [], 0
        for bound, count in zip([*self.bounds, math.inf], self.counts, strict=True):
            total += count
            le = _labels({**labels, "le": go_float(bound)})
            out.append(f"{name}_bucket{le} {go_float(total)}")
        out.append(f"{name}_count{_labels(labels)} {go_float(total)}")
        out.append(f"{name}_sum{_labels(labels)} {go_float(self.sum)}")
        return out


class EngineStats:
    """The counters and histograms of one simulated engine (engine index 0), thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.histograms = {
            name: Histogram(m["buckets"])
            for name, m in DECLARED.items()
            if m["type"] == "histogram"
        }
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.finished = dict.fromkeys(FINISH_REASONS, 0)

    def token(self, flight: Flight, now: float) -> None:
        """A token of ``flight`` is ready at ``now``: the first one's time to first token (and
        the prompt counted as prefilled), else the inter-token latency.

        + flight: the request
        + now: ``time.monotonic()`` when the token was ready
        """
        with self._lock:
            self.generation_tokens += 1
            if flight.first is None:
                flight.first = now
                self.prompt_tokens += flight.prompt
                self.histograms[TTFT].observe(now - flight.arrived)
            else:
                self.histograms[ITL].observe(now - (flight.last or now))
            flight.last = now
            flight.generated += 1

    def finished_request(self, flight: Flight, reason: str, now: float) -> None:
        """``flight`` has ended at ``now`` with ``reason`` (one of :data:`FINISH_REASONS`):
        counted once, its times observed when it had its first token."""
        with self._lock:
            self.finished[reason] += 1
            if flight.first is None or flight.last is None or flight.scheduled is None:
                return
            decode = flight.last - flight.first
            for name, value in (
                ("vllm:request_time_per_output_token_seconds",
                 decode / (flight.generated - 1) if flight.generated > 1 else 0.0),
                ("vllm:e2e_request_latency_seconds", now - flight.arrived),
                ("vllm:request_queue_time_seconds", flight.scheduled - flight.arrived),
                ("vllm:request_inference_time_seconds", flight.last - flight.scheduled),
                ("vllm:request_prefill_time_seconds", flight.first - flight.scheduled),
                ("vllm:request_decode_time_seconds", decode),
            ):  # fmt: skip
                self.histograms[name].observe(value)

    def lines(self, model: str, running: int, waiting: int, kv_tokens: int) -> list[str]:
        """The exposition of every metric in :data:`HELP`, one text line each.

        + model: the served model name (label ``model_name``)
        + running: the requests running
        + waiting: the requests in the queue
        + kv_tokens: the tokens the running requests hold
        """
        labels = {"model_name": model, "engine": "0"}
        values = {
            "vllm:num_requests_running": running,
            "vllm:num_requests_waiting": waiting,
            "vllm:kv_cache_usage_perc": min(1.0, kv_tokens / KV_CAPACITY_TOKENS),
        }
        out = []
        with self._lock:
            values |= {
                "vllm:prompt_tokens_total": self.prompt_tokens,
                "vllm:generation_tokens_total": self.generation_tokens,
            }
            for name, doc in HELP.items():
                kind = DECLARED[name]["type"]
                out += [f"# HELP {name} {doc}", f"# TYPE {name} {kind}"]
                if kind == "histogram":
                    out += self.histograms[name].lines(name, labels)
                elif name == "vllm:request_success_total":
                    out += [
                        f"{name}{_labels({**labels, 'finished_reason': r})} {go_float(n)}"
                        for r, n in self.finished.items()
                    ]
                else:
                    out.append(f"{name}{_labels(labels)} {go_float(values[name])}")
        return out
