"""The canary analysis' load probe: a bounded asyncio client (stdlib only: asyncio streams,
HTTP/1.1, chunked bodies, server-sent events) that sends the same prompts to two vLLM instances,
the canary's and the baseline's, in the same time window, and records each request's time to
first token, inter-token gaps, output tokens per second or error. It also reads each instance's
``/metrics`` before and after and reports the deltas of vLLM's counters and histograms: the
names and types vLLM 0.30.0 declares (``vllm-0.30.0-metrics.json``, generated from the real
wheel, shipped beside the simulator's flag tables).

Bounded: ``requests`` per target, ``concurrency`` in flight per target, every request within
``request_timeout`` and the whole probe within ``timeout`` (a request still running then is
cut and counted as an error, one not yet sent is counted as one too); it then stops by itself.
It connects only to the origins it is given (``http://HOST:PORT`` of an instance, never a
router) and follows no redirect; each target's API key, if any, goes only in the requests to
its own origin's ``/v1/`` paths and is never in what it returns.

GuideLLM was tried first and did not fit (docs/real-fleet.md, the canary analysis).
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from servefleet.base.errors import ServefleetError
from servefleet.base.shipped import VLLM_FLAGS_DIR
from servefleet.fleet.analysis.stats import Samples

METRICS_FILE = VLLM_FLAGS_DIR / "vllm-0.30.0-metrics.json"
MAX_HEAD = 65536  # bytes of a response's status line and headers
MAX_BODY = 16 << 20  # bytes of a response's body
PATH = "/v1/completions"
# the words prompts are made of: short, common ones (about a token each in any tokenizer)
WORDS = ("the of and to in is it that for on as with was at by be this from or an are not "
         "but all can one has had his her you they we which their time will about if up out "
         "them then so some would make like him into two more go see no way could my than "
         "first been call who its now find long down day did get come made may part").split()  # fmt: skip


def declared() -> dict[str, str]:
    """Every metric vLLM 0.30.0 declares: its name as a scrape shows it -> its type."""
    data = json.loads(METRICS_FILE.read_text(encoding="utf-8"))
    return {m["name"]: m["type"] for m in data["metrics"]}


@dataclass(frozen=True)
class Target:
    """One instance the probe sends to.

    + role: ``canary`` or ``baseline``
    + origin: ``http://ADDRESS:PORT``
    + host: the inventory host it runs on
    + key: its API key (``creds_api_key_env``'s), sent to this origin only; None: none
    """

    role: str
    origin: str
    host: str = ""
    key: str | None = field(default=None, repr=False, compare=False)


def origin_of(address: str, port: int) -> str:
    """``http://ADDRESS:PORT`` (an IPv6 address in brackets)."""
    return f"http://[{address}]:{port}" if ":" in address else f"http://{address}:{port}"


def _split(origin: str) -> tuple[str, int]:
    parts = urlsplit(origin)
    if (parts.scheme != "http" or not parts.hostname or parts.port is None
            or parts.path not in ("", "/") or parts.username or parts.query):  # fmt: skip
        raise ServefleetError(
            f"analysis: {origin!r} is not an instance's origin; allowed: http://HOST:PORT"
        )
    return parts.hostname, parts.port


@dataclass
class Side:
    """What the probe found of one target: its samples, the first errors (at most 5, each
    once), its /metrics deltas, vLLM names it scraped that 0.30.0 does not declare."""

    target: Target
    model: str | None = None
    samples: Samples = field(default_factory=Samples)
    errors: list[str] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    metrics_error: str | None = None
    undeclared: list[str] = field(default_factory=list)

    def error(self, why: str) -> None:
        self.samples.errors += 1
        if why not in self.errors and len(self.errors) < 5:
            self.errors.append(why)


class _Failed(Exception):
    """One request failed: why, in a few words."""


def prompt(i: int, words: int) -> str:
    """Prompt ``i`` of ``words`` words: the same for every target (seeded by ``i``)."""
    rng = random.Random(i)
    return " ".join(rng.choice(WORDS) for _ in range(words))


async def _exchange(
    origin: str, method: str, path: str, body: bytes | None, key: str | None
) -> tuple[int, asyncio.StreamReader, dict[str, str], asyncio.StreamWriter]:
    host, port = _split(origin)
    reader, writer = await asyncio.open_connection(host, port, limit=MAX_HEAD)
    head = [f"{method} {path} HTTP/1.1", f"Host: {urlsplit(origin).netloc}",
            "Connection: close", "Accept: */*"]  # fmt: skip
    if body is not None:
        head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    if key and path.startswith("/v1/"):
        head.append(f"Authorization: Bearer {key}")
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + (body or b""))
    await writer.drain()
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        writer.close()
        raise _Failed("no HTTP response") from None
    lines = raw.decode("latin-1").split("\r\n")
    status = re.fullmatch(r"HTTP/1\.[01] (\d{3})(?: .*)?", lines[0])
    if not status:
        writer.close()
        raise _Failed("no HTTP response")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return int(status.group(1)), reader, headers, writer


async def _body(reader: asyncio.StreamReader, headers: Mapping[str, str]) -> Any:
    """The body's pieces as they arrive (chunked, by length or to the end), at most MAX_BODY."""
    got = 0
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            size_line = await reader.readline()
            if not size_line.endswith(b"\n"):
                raise _Failed("the stream was cut")
            try:
                size = int(size_line.split(b";")[0].strip(), 16)
            except ValueError:
                raise _Failed("a malformed chunk") from None
            if size == 0:
                return
            got += size
            if got > MAX_BODY:
                raise _Failed(f"the body passed {MAX_BODY} bytes")
            try:
                data = await reader.readexactly(size + 2)
            except asyncio.IncompleteReadError:
                raise _Failed("the stream was cut") from None
            yield data[:-2]
    elif "content-length" in headers:
        length = int(headers["content-length"])
        if length > MAX_BODY:
            raise _Failed(f"the body passed {MAX_BODY} bytes")
        try:
            yield await reader.readexactly(length)
        except asyncio.IncompleteReadError:
            raise _Failed("the body was cut") from None
    else:
        while data := await reader.read(65536):
            got += len(data)
            if got > MAX_BODY:
                raise _Failed(f"the body passed {MAX_BODY} bytes")
            yield data


async def _whole(origin: str, path: str, key: str | None) -> tuple[int, bytes]:
    status, reader, headers, writer = await _exchange(origin, "GET", path, None, key)
    try:
        return status, b"".join([piece async for piece in _body(reader, headers)])
    finally:
        writer.close()


def _tokens_of(event: Mapping[str, Any]) -> int:
    """How many content pieces an SSE event carries (a completion's text, a chat delta's
    content or reasoning)."""
    n = 0
    for choice in event.get("choices") or ():
        delta = choice.get("delta") or {}
        text = choice.get("text") or delta.get("content") or delta.get("reasoning_content")
        n += bool(text or delta.get("reasoning"))
    return n


async def _one(
    target: Target, model: str, text: str, out_tokens: int
) -> tuple[float, list[float], float]:
    """One streamed completion: (TTFT, inter-token gaps, output tokens/s)."""
    body = json.dumps({"model": model, "prompt": text, "max_tokens": out_tokens,
                       "ignore_eos": True, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()  # fmt: skip
    t0 = time.monotonic()
    status, reader, headers, writer = await _exchange(target.origin, "POST", PATH, body, target.key)
    try:
        if status != 200:
            raise _Failed(f"HTTP {status}")
        arrivals: list[float] = []
        usage: int | None = None
        buffer, done = b"", False
        async for piece in _body(reader, headers):
            buffer += piece.replace(b"\r\n", b"\n")
            while b"\n\n" in buffer and not done:
                event, buffer = buffer.split(b"\n\n", 1)
                data = b"\n".join(x[5:].strip() for x in event.split(b"\n")
                                  if x.startswith(b"data:"))  # fmt: skip
                if data == b"[DONE]":
                    done = True
                elif data:
                    try:
                        parsed = json.loads(data)
                    except ValueError:
                        raise _Failed("an event that is not JSON") from None
                    if isinstance(parsed, dict) and "error" in parsed:
                        raise _Failed("an error event")
                    now = time.monotonic()
                    arrivals += [now] * min(1, _tokens_of(parsed))
                    usage = ((parsed.get("usage") or {}).get("completion_tokens")) or usage
        if not done:
            raise _Failed("the stream ended without [DONE]")
        if not arrivals:
            raise _Failed("no token")
        gaps = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]
        tokens = usage if isinstance(usage, int) and usage > 0 else len(arrivals)
        return arrivals[0] - t0, gaps, tokens / max(arrivals[-1] - t0, 1e-9)
    finally:
        writer.close()


async def _model(target: Target) -> str:
    status, body = await _whole(target.origin, "/v1/models", target.key)
    if status != 200:
        raise _Failed(f"/v1/models: HTTP {status}")
    try:
        return str(json.loads(body)["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise _Failed("/v1/models names no model") from None


_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_metrics(text: str) -> dict[str, dict[str, float]]:
    """A text exposition's samples: series name -> its labels (as written) -> value."""
    out: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and not line.startswith("#"):
            try:
                out.setdefault(m.group(1), {})[m.group(2) or ""] = float(m.group(3))
            except ValueError:
                continue
    return out


def family(series: str, types: Mapping[str, str]) -> str | None:
    """The declared metric a series belongs to (a histogram's _bucket/_sum/_count, a counter's
    _created), else None."""
    if series in types:
        return series
    for suffix in ("_bucket", "_sum", "_count", "_created"):
        base = series.removesuffix(suffix)
        if base != series:
            if types.get(base) == "histogram":
                return base
            if suffix == "_created" and types.get(base + "_total") == "counter":
                return base + "_total"
    return None


def _le(labels: str) -> tuple[str, float] | None:
    m = re.search(r'(?:^\{|,)le="([^"]*)"', labels)
    if not m:
        return None
    rest = re.sub(r',?le="[^"]*"', "", labels).replace("{,", "{")
    return rest, float(m.group(1))


def bucket_quantile(buckets: Sequence[tuple[float, float]], q: float) -> float | None:
    """A quantile from cumulative (upper bound, count) buckets, as PromQL's
    histogram_quantile interpolates them."""
    buckets = sorted(buckets)
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if upper == float("inf"):
                return lower
            width = count - below
            return lower + (upper - lower) * ((rank - below) / width if width else 0)
        lower, below = upper, count
    return lower


def deltas(
    before: Mapping[str, Mapping[str, float]],
    after: Mapping[str, Mapping[str, float]],
    types: Mapping[str, str],
) -> dict[str, Any]:
    """The change of each declared counter (summed over its labels) and histogram (its count,
    its sum and its p50/p95 over the buckets that changed) between two scrapes."""
    out: dict[str, Any] = {}
    for name, kind in sorted(types.items()):
        if kind == "counter" and name in after:
            d = sum(v - before.get(name, {}).get(k, 0.0) for k, v in after[name].items())
            out[name] = {"type": "counter", "delta": d}
        elif kind == "histogram" and f"{name}_count" in after:

            def change(series: str, labels: str, value: float) -> float:
                return value - before.get(series, {}).get(labels, 0.0)

            count = sum(change(f"{name}_count", k, v) for k, v in after[f"{name}_count"].items())
            total = sum(change(f"{name}_sum", k, v)
                        for k, v in after.get(f"{name}_sum", {}).items())  # fmt: skip
            per_le: dict[float, float] = {}
            for labels, v in after.get(f"{name}_bucket", {}).items():
                le = _le(labels)
                if le is not None:
                    per_le[le[1]] = per_le.get(le[1], 0.0) + change(f"{name}_bucket", labels, v)
            buckets = list(per_le.items())
            out[name] = {"type": "histogram", "count": count, "sum": total,
                         "p50": bucket_quantile(buckets, 0.5) if count else None,
                         "p95": bucket_quantile(buckets, 0.95) if count else None}  # fmt: skip
    return out


def undeclared_names(scrape: Mapping[str, Any], types: Mapping[str, str]) -> list[str]:
    """The ``vllm:`` series of a scrape that belong to no metric vLLM 0.30.0 declares."""
    return sorted(s for s in scrape if s.startswith("vllm:") and family(s, types) is None)


async def _scrape(side: Side) -> dict[str, dict[str, float]] | None:
    try:
        status, body = await asyncio.wait_for(_whole(side.target.origin, "/metrics", None), 10)
    except (OSError, asyncio.TimeoutError, _Failed) as e:
        side.metrics_error = f"/metrics: {_why(e)}"
        return None
    if status != 200:
        side.metrics_error = f"/metrics: HTTP {status}"
        return None
    return parse_metrics(body.decode("utf-8", "replace"))


def _why(e: BaseException) -> str:
    if isinstance(e, asyncio.TimeoutError):
        return "timed out"
    if isinstance(e, ConnectionRefusedError):
        return "connection refused"
    if isinstance(e, OSError):
        return e.strerror or type(e).__name__
    return str(e)


@dataclass(frozen=True)
class Load:
    """The probe's bounds (``rollout_analysis``'s fields of the same names)."""

    requests: int
    concurrency: int
    prompt_tokens: int
    output_tokens: int
    timeout: float
    request_timeout: float

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> Load:
        return cls(int(data["requests"]), int(data["concurrency"]), int(data["prompt_tokens"]),
                   int(data["output_tokens"]), float(data["timeout"]),
                   float(data["request_timeout"]))  # fmt: skip


async def _side(side: Side, load: Load, deadline: float) -> None:
    """Every request of one target, ``concurrency`` at a time, until done or the deadline."""
    samples = side.samples
    samples.requests = load.requests
    try:
        side.model = await asyncio.wait_for(_model(side.target), load.request_timeout)
    except (OSError, asyncio.TimeoutError, _Failed) as e:
        side.errors.append(_why(e))
        samples.errors = load.requests
        return
    queue = iter(range(load.requests))

    async def worker() -> None:
        for i in queue:
            left = deadline - time.monotonic()
            if left <= 0:
                side.error("not sent: the probe's deadline passed")
                continue
            try:
                ttft, gaps, rate = await asyncio.wait_for(
                    _one(side.target, side.model or "", prompt(i, load.prompt_tokens),
                         load.output_tokens),
                    min(load.request_timeout, left),
                )  # fmt: skip
            except asyncio.TimeoutError:
                over = left < load.request_timeout
                side.error("cut: the probe's deadline" if over
                           else f"timed out after {load.request_timeout:g} s")  # fmt: skip
            except (OSError, _Failed, ValueError) as e:
                side.error(_why(e))
            else:
                samples.ttft.append(ttft)
                samples.itl.append(gaps)
                samples.tokens_per_s.append(rate)

    await asyncio.gather(*(worker() for _ in range(min(load.concurrency, load.requests))))


async def _probe(targets: Sequence[Target], load: Load) -> list[Side]:
    sides = [Side(t) for t in targets]
    types = declared()
    before = await asyncio.gather(*(_scrape(s) for s in sides))
    deadline = time.monotonic() + load.timeout
    # the targets side by side: each its own workers, all started together
    await asyncio.gather(*(_side(s, load, deadline) for s in sides))
    after = await asyncio.gather(*(_scrape(s) for s in sides))
    for side, b, a in zip(sides, before, after, strict=True):
        if b is not None and a is not None:
            side.metrics = deltas(b, a, types)
            side.undeclared = undeclared_names(a, types)
    return sides


def run(targets: Sequence[Target], load: Load) -> tuple[list[Side], float]:
    """Probe ``targets`` side by side with ``load``: each target's :class:`Side` and the
    seconds it took. Stops by itself: every request within ``load.request_timeout``, the whole
    within ``load.timeout`` (and 25 s more for the two /metrics scrapes and the model lookup).

    + targets: the canary's and the baseline's instance (origins ``http://HOST:PORT``)
    + load: the bounds (:meth:`Load.of` the ``rollout_analysis`` data)
    """
    for t in targets:
        _split(t.origin)
    t0 = time.monotonic()
    try:
        sides = asyncio.run(asyncio.wait_for(_probe(targets, load), load.timeout + 25))
    except asyncio.TimeoutError:
        raise ServefleetError(f"analysis: the probe ran past {load.timeout + 25:g} s") from None
    return sides, time.monotonic() - t0
