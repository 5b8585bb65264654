"""The canary analysis' load probe: a bounded asyncio client (stdlib only: asyncio streams,
HTTP/1.1, chunked bodies, server-sent events) that sends the same prompts to two vLLM instances,
the canary's and the baseline's, in the same time window, and records each request's time to
first token, inter-token gaps, output tokens per second or error. It also reads each instance's
``/metrics`` before and after and reports the deltas of vLLM's counters and histograms: the
names and types vLLM declares (the metrics of the version's reference data, generated from
the real wheel: :mod:`servefleet.base.vllm_reference`).

Bounded: ``requests`` per target, ``concurrency`` in flight per target, every request within
``request_timeout`` and the whole probe within ``timeout`` (a request still running then is
cut and counted as an error, one not yet sent is counted as one too); it then stops by itself.
It connects only to the origins it is given (``http://HOST:PORT`` of an instance, never a
router) and follows no redirect; each target's API key, if any, goes only in the requests to
its own origin's ``/v1/`` paths and is never in what it returns.

Every answer is read strictly: a status line, a Content-Length or chunk size, an event, a
usage, a model list or a ``/metrics`` sample it cannot read (not UTF-8, not a number as the
text format writes it, a list where an object belongs, a negative, NaN or infinite count, a
change of a counter or histogram past a float's range) is an :class:`OddAnswer`: the probe
stops and the analysis fails in one line naming the instance and the answer (#46 item 8).

GuideLLM was tried first and did not fit (docs/real-fleet.md, the canary analysis).
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import re
import reprlib
import time
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit

from servefleet.base.errors import ServefleetError
from servefleet.base.vllm_reference import reference
from servefleet.fleet.analysis.stats import Samples

METRICS_FILE = reference().metrics
MAX_HEAD = 65536  # bytes of a response's status line and headers
MAX_BODY = 16 << 20  # bytes of a response's body
PATH = "/v1/completions"
# the words prompts are made of: short, common ones (about a token each in any tokenizer)
WORDS = ("the of and to in is it that for on as with was at by be this from or an are not "
         "but all can one has had his her you they we which their time will about if up out "
         "them then so some would make like him into two more go see no way could my than "
         "first been call who its now find long down day did get come made may part").split()  # fmt: skip


def declared() -> dict[str, str]:
    """Every metric vLLM declares (the reference's): its name as a scrape shows it -> its type."""
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
    once), its /metrics deltas, vLLM names it scraped that its version does not declare."""

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


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = MAX_BODY * 4  # whole: the key found, cut after
SHOWN = 80  # characters of an odd answer a line shows


def _shown(answer: object, key: str | None = None) -> str:
    """``answer`` in one line of at most :data:`SHOWN` characters (its repr: line breaks and
    control characters escaped, nesting cut), the API key ``key`` never in it."""
    text = _REPR.repr(answer)
    if key:
        text = text.replace(key, "<the API key>")
    return text if len(text) <= SHOWN else text[: SHOWN - 3] + "..."


_UNSHOWN = object()


class OddAnswer(ServefleetError):
    """An answer of an instance that the probe cannot read: ``what`` it is and the ``answer``
    (shown cut to one line, if given). The analysis fails on it, naming the instance
    (:func:`_named`)."""

    def __init__(self, what: str, answer: object = _UNSHOWN, key: str | None = None) -> None:
        shown = "" if answer is _UNSHOWN else f": {_shown(answer, key)}"
        super().__init__(what + shown)
        self.what, self.answer = what, answer


_T = TypeVar("_T")


def _of(side: Side, e: OddAnswer) -> OddAnswer:
    """The odd answer ``e`` of ``side``, its line naming the instance that gave it."""
    t = side.target
    who = " ".join(x for x in (t.role, t.host, t.origin) if x)
    return OddAnswer(f"analysis: {who}: {e.what}", e.answer, t.key)


async def _named(side: Side, work: Awaitable[_T]) -> _T:
    """``work`` for ``side``: an odd answer raised again naming the instance that gave it."""
    try:
        return await work
    except OddAnswer as e:
        raise _of(side, e) from None


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
    except asyncio.IncompleteReadError:
        writer.close()
        raise _Failed("no HTTP response") from None
    except asyncio.LimitOverrunError:
        writer.close()
        raise OddAnswer(f"{path} answered a head longer than {MAX_HEAD} bytes") from None
    lines = raw.decode("latin-1").split("\r\n")
    status = re.fullmatch(r"HTTP/1\.[01] ([0-9]{3})(?: .*)?", lines[0])
    if not status:
        writer.close()
        raise OddAnswer(f"{path} answered a status line that is not HTTP/1.x", lines[0])
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return int(status.group(1)), reader, headers, writer


_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,15}")
_LENGTH = re.compile(r"[0-9]{1,15}")


async def _body(reader: asyncio.StreamReader, headers: Mapping[str, str], path: str) -> Any:
    """The body's pieces as they arrive (chunked, by length or to the end), at most MAX_BODY;
    the answer to ``path`` (named in an :class:`OddAnswer`)."""
    got = 0
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            try:
                size_line = await reader.readline()
            except ValueError:  # asyncio's: longer than the reader's limit
                raise OddAnswer(f"{path} answered a chunk size line longer than {MAX_HEAD} "
                                "bytes") from None  # fmt: skip
            if not size_line.endswith(b"\n"):
                raise _Failed("the stream was cut")
            hex_size = size_line.split(b";")[0].strip()
            if not _CHUNK_SIZE.fullmatch(hex_size):
                raise OddAnswer(f"{path} answered a chunk size that is not hex", size_line)
            size = int(hex_size, 16)
            if size == 0:
                return
            got += size
            if got > MAX_BODY:
                raise _Failed(f"the body passed {MAX_BODY} bytes")
            try:
                data = await reader.readexactly(size + 2)
            except asyncio.IncompleteReadError:
                raise _Failed("the stream was cut") from None
            if not data.endswith(b"\r\n"):
                raise OddAnswer(f"{path} answered a chunk longer than its size", data[-20:])
            yield data[:-2]
    elif "content-length" in headers:
        if not _LENGTH.fullmatch(headers["content-length"]):
            raise OddAnswer(f"{path} answered a Content-Length that is not a number",
                            headers["content-length"])  # fmt: skip
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
        return status, b"".join([piece async for piece in _body(reader, headers, path)])
    finally:
        writer.close()


def _event(data: bytes) -> Any:
    """An SSE event's data as JSON (an :class:`OddAnswer` when it is not UTF-8 or not JSON)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise OddAnswer(f"{PATH} answered an event that is not UTF-8", data) from None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
        raise OddAnswer(f"{PATH} answered an event that is not JSON", text) from None


def _tokens_of(event: Any) -> int:
    """How many content pieces an SSE event carries (a completion's text, a chat delta's
    content or reasoning): an :class:`OddAnswer` unless it is an object whose ``choices`` are a
    list of objects, each text a string."""
    if not isinstance(event, dict):
        raise OddAnswer(f"{PATH} answered an event that is not an object", event)
    choices = event.get("choices")
    if not isinstance(choices, (list, type(None))):
        raise OddAnswer(f"{PATH} answered choices that are not a list", choices)
    n = 0
    for choice in choices or ():
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if not isinstance(choice, dict) or not isinstance(delta, (dict, type(None))):
            raise OddAnswer(f"{PATH} answered a choice that is not an object with a delta "
                            "object", choice)  # fmt: skip
        delta = delta or {}
        texts = (choice.get("text"), delta.get("content"), delta.get("reasoning_content"),
                 delta.get("reasoning"))  # fmt: skip
        if not all(isinstance(t, (str, type(None))) for t in texts):
            raise OddAnswer(f"{PATH} answered a choice whose text is not a string", choice)
        n += any(texts)
    return n


def _usage_of(event: Mapping[str, Any], most: int) -> int | None:
    """The completion tokens an event's ``usage`` counts (None: it counts none): an
    :class:`OddAnswer` unless it is an object and the count an integer from 0 to ``most``
    (the tokens asked for)."""
    usage = event.get("usage")
    if usage is None:
        return None
    if not isinstance(usage, dict):
        raise OddAnswer(f"{PATH} answered a usage that is not an object", usage)
    n = usage.get("completion_tokens")
    if n is not None and (type(n) is not int or not 0 <= n <= most):
        raise OddAnswer(f"{PATH} answered completion_tokens that are not 0 to {most}", n)
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
        async for piece in _body(reader, headers, PATH):
            buffer += piece.replace(b"\r\n", b"\n")
            while b"\n\n" in buffer and not done:
                event, buffer = buffer.split(b"\n\n", 1)
                data = b"\n".join(x[5:].strip() for x in event.split(b"\n")
                                  if x.startswith(b"data:"))  # fmt: skip
                if data == b"[DONE]":
                    done = True
                elif data:
                    parsed = _event(data)
                    if isinstance(parsed, dict) and "error" in parsed:
                        raise _Failed("an error event")
                    now = time.monotonic()
                    arrivals += [now] * min(1, _tokens_of(parsed))
                    usage = _usage_of(parsed, out_tokens) or usage
        if not done:
            raise _Failed("the stream ended without [DONE]")
        if not arrivals:
            raise _Failed("no token")
        gaps = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]
        tokens = usage or len(arrivals)
        return arrivals[0] - t0, gaps, tokens / max(arrivals[-1] - t0, 1e-9)
    finally:
        writer.close()


async def _model(target: Target) -> str:
    status, body = await _whole(target.origin, "/v1/models", target.key)
    if status != 200:
        raise _Failed(f"/v1/models: HTTP {status}")
    try:
        model = json.loads(body.decode("utf-8"))["data"][0]["id"]
    except (ValueError, KeyError, IndexError, TypeError, RecursionError):
        model = None
    if not isinstance(model, str) or not model:
        raise OddAnswer("/v1/models answered no model", body)
    return model


# a sample: its name, its labels (a label's value quoted, with escapes), its value (then maybe a
# timestamp)
_SAMPLE = re.compile(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\})?\s+(\S+)')
# a value as the text format writes it: a float as Go's strconv.ParseFloat reads it, in decimal
# (ASCII digits only, a sign, a point, an exponent; no ``_``, no space), or NaN or a signed Inf
# or Infinity, in any case (ParseFloat's; prometheus_client writes ``NaN``, ``+Inf``, ``-Inf``)
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_SPECIAL = re.compile(r"[+-]?inf(?:inity)?|nan", re.ASCII | re.IGNORECASE)


def number(text: str) -> float | None:
    """``text`` as the text format's float: its value, None when it is not one (Python's
    float() reads ``1_000``, `` 1 `` and ``٣`` too) or is a decimal past a float's range
    (``1e999``: ParseFloat refuses it, float() reads infinity)."""
    if _SPECIAL.fullmatch(text):
        return float(text)
    if _DECIMAL.fullmatch(text):
        value = float(text)
        return value if math.isfinite(value) else None
    return None


def parse_metrics(text: str) -> dict[str, dict[str, float]]:
    """A text exposition's samples: series name -> its labels (as written) -> value. A line
    that is neither a comment nor a sample with a number is an :class:`OddAnswer`."""
    out: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            raise OddAnswer("/metrics answered a line that is not a sample", line)
        value = number(m.group(3))
        if value is None:
            raise OddAnswer("/metrics answered a sample that is not a number", line)
        out.setdefault(m.group(1), {})[m.group(2) or ""] = value
    return out


def checked(
    scrape: dict[str, dict[str, float]], types: Mapping[str, str]
) -> dict[str, dict[str, float]]:
    """``scrape`` when each sample of a declared counter or histogram is a finite count (not
    negative, not NaN or infinite) and each bucket has its bound; else an :class:`OddAnswer`."""
    for series, samples in scrape.items():
        name = family(series, types)
        kind = types.get(name) if name else None
        if kind not in ("counter", "histogram"):
            continue
        for labels, value in samples.items():
            if not math.isfinite(value) or value < 0:
                raise OddAnswer(f"/metrics answered a {kind} sample that is not a count",
                                f"{series}{labels} {value}")  # fmt: skip
            if kind == "histogram" and series.endswith("_bucket") and _le(labels) is None:
                raise OddAnswer("/metrics answered a bucket without its le", series + labels)
    return scrape


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
    """A bucket's labels without its ``le`` and its bound (None: no ``le``): an
    :class:`OddAnswer` unless the bound is a number of 0 or more (``+Inf`` for the last)."""
    m = re.search(r'(?:^\{|,)le="([^"]*)"', labels)
    if not m:
        return None
    rest = re.sub(r',?le="[^"]*"', "", labels).replace("{,", "{")
    bound = number(m.group(1))
    if bound is None or not bound >= 0:  # NaN too
        raise OddAnswer(
            "/metrics answered a bucket bound that is not a number of 0 or more", labels
        )
    return rest, bound


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
    its sum and its p50/p95 over the buckets that changed) between two scrapes: an
    :class:`OddAnswer` naming the metric when one is not finite (each sample is, but two
    series near a float's largest add up to infinity)."""
    out: dict[str, Any] = {}
    for name, kind in sorted(types.items()):
        if kind == "counter" and name in after:
            d = sum(v - before.get(name, {}).get(k, 0.0) for k, v in after[name].items())
            out[name] = _finite(name, {"type": "counter", "delta": d})
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
            for bound, v in per_le.items():  # what the quantiles are computed from
                _finite(f'{name}_bucket{{le="{bound:g}"}}', {"type": "histogram", "change": v})
            buckets = list(per_le.items())
            p50, p95 = (bucket_quantile(buckets, q) if count else None for q in (0.5, 0.95))
            out[name] = _finite(name, {"type": "histogram", "count": count, "sum": total,
                                       "p50": p50, "p95": p95})  # fmt: skip
    return out


def _finite(name: str, change: dict[str, Any]) -> dict[str, Any]:
    """``change`` (a metric's in :func:`deltas`) when each of its numbers is finite; else an
    :class:`OddAnswer` naming the metric and the number (the report is strict JSON)."""
    for key, value in change.items():
        if isinstance(value, float) and not math.isfinite(value):
            what = "change" if key == "delta" else key
            raise OddAnswer(f"/metrics answered a {change['type']} whose {what} is not finite",
                            f"{name} {key} {value}")  # fmt: skip
    return change


def undeclared_names(scrape: Mapping[str, Any], types: Mapping[str, str]) -> list[str]:
    """The ``vllm:`` series of a scrape that belong to no metric vLLM declares (``types``)."""
    return sorted(s for s in scrape if s.startswith("vllm:") and family(s, types) is None)


async def _scrape(side: Side, types: Mapping[str, str]) -> dict[str, dict[str, float]] | None:
    try:
        status, body = await asyncio.wait_for(_whole(side.target.origin, "/metrics", None), 10)
    except (OSError, asyncio.TimeoutError, _Failed) as e:
        side.metrics_error = f"/metrics: {_why(e)}"
        return None
    if status != 200:
        side.metrics_error = f"/metrics: HTTP {status}"
        return None
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise OddAnswer("/metrics answered text that is not UTF-8",
                        body[max(e.start - 30, 0) : e.end + 10]) from None  # fmt: skip
    return checked(parse_metrics(text), types)


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
            except (OSError, _Failed) as e:
                side.error(_why(e))
            else:
                samples.ttft.append(ttft)
                samples.itl.append(gaps)
                samples.tokens_per_s.append(rate)

    await asyncio.gather(*(worker() for _ in range(min(load.concurrency, load.requests))))


async def _probe(targets: Sequence[Target], load: Load) -> list[Side]:
    sides = [Side(t) for t in targets]
    types = declared()
    # an odd answer ends the probe, raised naming the instance that gave it
    before = await asyncio.gather(*(_named(s, _scrape(s, types)) for s in sides))
    deadline = time.monotonic() + load.timeout
    # the targets side by side: each its own workers, all started together
    await asyncio.gather(*(_named(s, _side(s, load, deadline)) for s in sides))
    after = await asyncio.gather(*(_named(s, _scrape(s, types)) for s in sides))
    for side, b, a in zip(sides, before, after, strict=True):
        if b is not None and a is not None:
            try:
                side.metrics = deltas(b, a, types)
            except OddAnswer as e:
                raise _of(side, e) from None
            side.undeclared = undeclared_names(a, types)
    return sides


def run(targets: Sequence[Target], load: Load) -> tuple[list[Side], float]:
    """Probe ``targets`` side by side with ``load``: each target's :class:`Side` and the
    seconds it took. Stops by itself: every request within ``load.request_timeout``, the whole
    within ``load.timeout`` (and 25 s more for the two /metrics scrapes and the model lookup).

    + targets: the canary's and the baseline's instance (origins ``http://HOST:PORT``)
    + load: the bounds (:meth:`Load.of` the ``rollout_analysis`` data)

    An answer it cannot read ends it: an :class:`OddAnswer`, one line naming the instance and
    the answer.
    """
    for t in targets:
        _split(t.origin)
    t0 = time.monotonic()
    try:
        sides = asyncio.run(asyncio.wait_for(_probe(targets, load), load.timeout + 25))
    except asyncio.TimeoutError:
        raise ServefleetError(f"analysis: the probe ran past {load.timeout + 25:g} s") from None
    return sides, time.monotonic() - t0
