"""Fuzzing the canary analysis' probe (fleet/analysis/probe.py; #46, the fuzz campaign of
``kinds/test_fuzz_recipes.py`` extended to what instances answer): valid answers of an
instance (a vLLM 0.30.0 ``/metrics`` scrape before and after, a ``/v1/models`` list, a streamed
completion and a streamed chat, each framed chunked, by Content-Length or to the end) mutated,
and run through the analysis as ``rollout --analysis`` runs it (:class:`Analysis` with the real
probe), the instances on a fake connection that answers each request with the mutated bytes;
then the mutated scrapes, events and bodies through each parser alone (``parse_metrics``,
``checked``, ``deltas``, ``undeclared_names``; ``_event``, ``_tokens_of``, ``_usage_of``;
``_body``), past the first odd answer that ended the probe. Each input is read, or ends in one
line of :class:`ServefleetError` (an :class:`OddAnswer` naming the instance), no control
character and neither target's API key in it (nor in any line the analysis prints): never
another exception.

The mutations: of the text (a line deleted, doubled or swapped, a sample's value or bucket bound
made an odd number such as ``x``, ``nan``, ``+Inf``, ``1e999``, ``-1``, ``0x1f`` or 5,000
digits, a label made hostile, a raw line added), of an event's JSON (a node made a list where an
object belongs, a string, a huge, negative or non-finite number, nested deep; a key deleted or
renamed), of the framing (a chunk size or Content-Length odd, huge or off by some bytes, the
framing switched, the [DONE] left out), of the head (the status line, a header without its
colon, a head past the limit) and of the bytes on the wire (cut, two bytes
swapped, a byte flipped, bytes that are not UTF-8 or are line breaks inserted, a span deleted or
doubled). Deterministic (``derandomize``, no example database) and a few seconds; like the
recipe campaign, ``SERVEFLEET_FUZZ_EXAMPLES=N`` runs N inputs per test.
"""

from __future__ import annotations

import asyncio
import copy
import json
import math
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import pytest
from fuzz_support import campaign, locations
from hypothesis import given, strategies as st

from servefleet.base.errors import ServefleetError
from servefleet.fleet.analysis import probe, report
from servefleet.fleet.analysis.canary import Analysis, Outcome
from servefleet.fleet.analysis.probe import OddAnswer
from servefleet.settings.check_analysis import ANALYSIS

# Examples of each test: the file takes a few seconds; SERVEFLEET_FUZZ_EXAMPLES=N runs a longer
# campaign of N inputs per test, as for the recipes (fuzz_support.py)
EXAMPLES = {"metrics": 100, "models": 40, "stream": 100, "wire": 60}
DATA = dict(ANALYSIS, requests=2, concurrency=2, prompt_tokens=4, output_tokens=8, timeout=5,
            request_timeout=2)  # fmt: skip
# each target's API key, put in its answers where a mutation wrote KEY: never in a line
KEYS = {"c1": "sk-fuzz-canary-0815", "b1": "sk-fuzz-baseline-4711"}
KEY = "<KEY>"
MODEL = "openai/gpt-oss-120b"
TYPES = probe.declared()
TALLY: Counter[str] = Counter()  # how the inputs ended (printed at the end with -s)


def fuzz(kind: str) -> Any:
    return campaign(EXAMPLES[kind])


@pytest.fixture(scope="module", autouse=True)
def tally() -> Iterator[None]:
    yield
    if TALLY:
        lines = [f"{n:6} {how}" for how, n in sorted(TALLY.items())]
        print(f"\nprobe fuzz: {TALLY.total()} inputs through the analysis", *lines, sep="\n")


# ---------------------------------------------------------------------------------------------
# The seeds: what a vLLM 0.30.0 instance answers


def metrics_text(scale: int) -> str:
    """A scrape of the counters the report shows, the TTFT and ITL histograms and a gauge
    (vLLM 0.30.0's names, types and buckets), as prometheus_client writes it, its counts ``scale`` times a base; with a
    ``_created`` series, a timestamp, an escaped label and a metric that is not vLLM's."""
    lab = f'engine="0",model_name="{MODEL}"'
    lines = ["# HELP python_gc_objects_collected_total Objects collected during gc",
             "# TYPE python_gc_objects_collected_total counter",
             f'python_gc_objects_collected_total{{generation="0"}} {41.0 * scale}']  # fmt: skip
    shown = {name for name, kind in report.SERVER_METRICS.items() if kind == "counter"}
    shown |= {"vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
              "vllm:num_requests_running"}  # fmt: skip
    metrics = [
        m for m in json.loads(probe.METRICS_FILE.read_text())["metrics"] if m["name"] in shown
    ]
    for i, m in enumerate(metrics):
        name, kind = m["name"], m["type"]
        lines += [f"# HELP {name} doc of {name}", f"# TYPE {name} {kind}"]
        if kind == "histogram":
            total = 0
            for j, le in enumerate([*(m.get("buckets") or [1.0]), math.inf]):
                total += (i + j) % 3 * scale
                bound = "+Inf" if le == math.inf else repr(float(le))
                lines.append(f'{name}_bucket{{{lab},le="{bound}"}} {float(total)}')
            lines += [f"{name}_count{{{lab}}} {float(total)}",
                      f"{name}_sum{{{lab}}} {0.0125 * total}"]  # fmt: skip
        elif kind == "counter":
            lines.append(f"{name}{{{lab}}} {float(i * scale)}")
            if i % 5 == 0:
                lines.append(f"{name.removesuffix('_total')}_created{{{lab}}} 1.7e+09")
        else:
            lines.append(f'{name}{{{lab},note="a \\"quoted\\" \\\\ value"}} {0.5 * scale}')
    lines.append(f"vllm:not_declared_total{{{lab}}} 1.0 1700000000000")
    return "\n".join(lines) + "\n"


METRICS = (metrics_text(1), metrics_text(3))  # before, after
MODELS = {"object": "list", "data": [{"id": MODEL, "object": "model", "created": 1700000000,
          "owned_by": "vllm", "root": MODEL, "parent": None, "max_model_len": 131072,
          "permission": [{"id": "modelperm-1", "allow_sampling": True}]}]}  # fmt: skip


def completion_events(tokens: int) -> list[Any]:
    head = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": MODEL}
    pieces = [{**head, "choices": [{"index": 0, "text": f"w{i} ", "logprobs": None,
               "finish_reason": None, "stop_reason": None}], "usage": None}
              for i in range(tokens)]  # fmt: skip
    usage = {"prompt_tokens": 4, "total_tokens": 4 + tokens, "completion_tokens": tokens}
    return [*pieces, {**head, "choices": [], "usage": usage}]


def chat_events(tokens: int) -> list[Any]:
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": MODEL}
    first = {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
             "logprobs": None, "finish_reason": None}]}  # fmt: skip
    think = {**head, "choices": [{"index": 0, "delta": {"reasoning_content": "hm"}}]}
    pieces = [{**head, "choices": [{"index": 0, "delta": {"content": f"w{i} "}}]}
              for i in range(tokens - 1)]  # fmt: skip
    usage = {"prompt_tokens": 4, "total_tokens": 4 + tokens, "completion_tokens": tokens}
    return [first, think, *pieces, {**head, "choices": [], "usage": usage}]


STREAMS = [completion_events(8), chat_events(8)]

# ---------------------------------------------------------------------------------------------
# The mutations

ODD_NUMBERS = ["x", "", "nan", "NaN", "-nan", "inf", "+Inf", "-Inf", "Infinity", "1e999",
               "-1e999", "-1", "-0", "-0.0", "1e-999", "0x1f", "1_000", "٣", "1.5.2", "1e",
               "9" * 19, "9" * 5000, "0." + "9" * 5000, "1" + "0" * 400, " 1", "1 1", '"1"',
               "true", "\x00", "\u2028", "1\x0b2"]  # fmt: skip
ODD_JSON: list[Any] = [
    None, True, 0, -1, 1.5, 10**400, -(10**30), math.nan, math.inf, -math.inf, "", "x",
    "\x1b[2J", "\ud800", "\u2028", [], [[]], [{}], {}, {"": None}, {"choices": "w"},
    {"delta": ["w"]}, {"text": 5}, {"completion_tokens": -1}, {"completion_tokens": 1e308},
    [[[[[[[[[[[[[[[[["deep"]]]]]]]]]]]]]]]]], KEY, f"Bearer {KEY}",
]  # fmt: skip
RAW_JSON = ["[" * 5000 + "]" * 5000, '{"a": ' * 3000 + "1" + "}" * 3000, "1" + "0" * 5000,
            "NaN", "-Infinity", "1e999", '"\\ud800"', '"\\u0000"', '{"k": 1, "k": 2}', "[1,",
            "", "null", "[DONE]", "\xff"]  # fmt: skip
HOSTILE = ["", '"', "\\", "}", "{", ",", "=", 'le="1"', '",le="x', "\n", "\r", "\x00", "\x1b",
           "\x85", "\u2028", "\ufeff", "\ud800", "x" * 5000, KEY, "#", " "]  # fmt: skip
RAW_LINES = ["# TYPE", "#", "{", "}", "x", "1", " 1", "vllm:x{", '{le="1"} 3', "vllm:x{} 1",
             'vllm:time_to_first_token_seconds_bucket{le="1",le="2"} 1',
             'vllm:time_to_first_token_seconds_bucket{le=1} 1',
             'vllm:time_to_first_token_seconds_bucket{engine="0"} 1',
             'vllm:time_to_first_token_seconds_bucket{le="-1"} 1',
             'vllm:time_to_first_token_seconds_count{engine="0"} -0.0',
             "vllm:generation_tokens_total 1e308", "vllm:generation_tokens_total 1.7976931348623157e308",
             f'vllm:generation_tokens_total{{engine="1",model_name="{MODEL}"}} 1.7e308',
             'vllm:generation_tokens_total{a="' + "\\" * 3000 + '"} 1',
             'vllm:generation_tokens_total{a="' + "{" * 3000 + "} 1",
             "vllm:generation_tokens_total" + "{" * 3000 + " 1",
             "vllm:generation_tokens_total\t1\t2", "vllm:generation_tokens_total\x0b1",
             "vllm:request_success_created 1", "vllm:" + "x" * 5000 + " 1"]  # fmt: skip
# inserted into the bytes: not UTF-8, a lone surrogate's UTF-8, line breaks, framing
RAW_BYTES = [b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00", b"\r", b"\n", b"\r\n", b"\r\n\r\n",
             b"\n\n", b"data: ", b"data: [DONE]\n\n", b"0\r\n\r\n", b"\x85", b"\xe2\x80\xa8",
             b'"', b"{", b"}", b"[", KEY.encode()]  # fmt: skip


def put(line: str, pattern: str, new: str) -> str:
    """``line`` with the first match of ``pattern`` replaced by ``new`` (as it is)."""
    m = re.search(pattern, line)
    return line if m is None else line[: m.start()] + new + line[m.end() :]


@st.composite
def text_mutated(draw: Any, text: str, raw: list[str]) -> str:
    """``text`` after one to three mutations of its lines or of a span."""
    for _ in range(draw(st.integers(1, 3))):
        lines = text.split("\n")
        i, j = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
        how = draw(st.sampled_from(["delete", "double", "swap", "insert", "value", "value",
                                    "le", "label", "cut", "chars"]))  # fmt: skip
        if how == "delete":
            del lines[i]
        elif how == "double":
            lines.insert(i, lines[i])
        elif how == "swap":
            lines[i], lines[j] = lines[j], lines[i]
        elif how == "insert":
            lines.insert(i, draw(st.sampled_from(raw)))
        elif how == "value":  # a sample's value (the last word) made an odd number
            words = lines[i].rsplit(" ", 1)
            lines[i] = words[0] + " " + draw(st.sampled_from(ODD_NUMBERS))
        elif how == "le":  # a bucket's bound, or some bucket's
            buckets = [k for k, x in enumerate(lines) if 'le="' in x] or [i]
            k = draw(st.sampled_from(buckets))
            odd = draw(st.sampled_from(ODD_NUMBERS))
            lines[k] = put(lines[k], r'le="[^"]*"', f'le="{odd}"')
        elif how == "label":  # a label's value (or a whole label set) made hostile
            lines[i] = put(lines[i], r'"[^"]*"', f'"{draw(st.sampled_from(HOSTILE))}"')
        else:
            joined = "\n".join(lines)
            at = draw(st.integers(0, len(joined)))
            if how == "cut":
                joined = joined[:at]
            else:
                joined = joined[:at] + draw(st.sampled_from(HOSTILE + ODD_NUMBERS)) + joined[at:]
            lines = joined.split("\n")
        text = "\n".join(lines)
    return text


@st.composite
def json_mutated(draw: Any, doc: Any) -> str:
    """``doc`` after one to three mutations of its nodes, as JSON text (sometimes with raw
    text no dumper writes in place of a node)."""
    doc = json.loads(json.dumps(doc))
    raws: list[str] = []
    for _ in range(draw(st.integers(1, 3))):
        loc = draw(st.sampled_from(locations(doc)))
        how = draw(st.sampled_from(["replace", "replace", "wrap", "delete", "rename", "raw"]))
        if how == "raw":
            raws.append(draw(st.sampled_from(RAW_JSON)))
            new: Any = f"zqraw{len(raws) - 1}zq"
        elif how == "wrap":
            new = [None]
        else:
            new = copy.deepcopy(draw(st.sampled_from(ODD_JSON)))  # mutated again, maybe
        if not loc:
            doc = new if how != "wrap" else [doc]
            continue
        parent = doc
        for step in loc[:-1]:
            parent = parent[step]
        key = loc[-1]
        if how == "wrap":
            new = [parent[key]]
        if how == "delete":
            del parent[key]
        elif how == "rename" and isinstance(parent, dict):
            parent[draw(st.sampled_from(["x", "Choices", "text ", "usage", "delta", "error"]))] = (
                parent.pop(key)
            )
        else:
            parent[key] = new
    text = json.dumps(doc)
    for n, raw in enumerate(raws):
        text = text.replace(f'"zqraw{n}zq"', raw)
    return text


ODD_LENGTHS = ["x", "abc", "nan", "inf", "1e999", "-1", "-0", "+5", "0x10", " ", "",
               "9" * 15, "9" * 16, "9" * 400, str(probe.MAX_BODY), str(probe.MAX_BODY + 1),
               "5, 5", "٣"]  # fmt: skip
ODD_SIZES = ["-5", "x", "", " ", "0x10", "ffffffffffffffff", "f" * 15, "1000000",
             "5;ext=1", "+5", "٣"]  # fmt: skip
STATUS_LINES = ["HTTP/1.1 200 OK", "HTTP/1.0 200 OK", "HTTP/1.1 200", "HTTP/1.1 500 Error",
                "HTTP/1.1 301 Moved", "HTTP/2 200", "HTTP/1.1 2000 OK", "HTTP/1.1 20 OK",
                "ICY 200 OK", "", "SSH-2.0-OpenSSH_9.2", "HTTP/1.1 200 OK\x00",
                "HTTP/1.1 200 \x1b[2J"]  # fmt: skip


@dataclass
class Framed:
    """An answer as it goes on the wire: status line, headers, body pieces, framing."""

    body: list[bytes]
    framing: str = "chunked"  # or "length", "eof"
    status: str = "HTTP/1.1 200 OK"
    headers: list[str] = field(default_factory=list)
    sizes: dict[int, str] = field(default_factory=dict)  # a chunk's size line, as written
    length: str | None = None  # the Content-Length, as written (None: the body's)

    def wire(self) -> bytes:
        body = b"".join(self.body)
        head = [self.status, *self.headers]
        if self.framing == "chunked":
            head.append("Transfer-Encoding: chunked")
            body = b"".join(
                self.sizes.get(i, f"{len(p):x}").encode("latin-1", "replace") + b"\r\n" + p
                + b"\r\n" for i, p in enumerate(self.body)
            ) + b"0\r\n\r\n"  # fmt: skip
        elif self.framing == "length":
            length = str(len(body)) if self.length is None else self.length
            head.append(f"Content-Length: {length}")
        return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1", "replace") + body


@st.composite
def framing_mutated(draw: Any, answer: Framed) -> Framed:
    """``answer`` with its framing switched or made odd, sometimes."""
    answer.framing = draw(st.sampled_from(["chunked", "chunked", "length", "eof"]))
    how = draw(st.sampled_from(["none", "none", "size", "length", "off", "status", "header"]))
    if how == "size" and answer.body:
        answer.sizes[draw(st.integers(0, len(answer.body) - 1))] = draw(st.sampled_from(ODD_SIZES))
    elif how == "length":
        answer.framing, answer.length = "length", draw(st.sampled_from(ODD_LENGTHS))
    elif how == "off":  # a size or a length that is a number, off by some bytes
        off = draw(st.sampled_from([-3, -1, 1, 2, 100, 1 << 20]))
        if answer.framing == "chunked" and answer.body:
            i = draw(st.integers(0, len(answer.body) - 1))
            answer.sizes[i] = f"{max(len(answer.body[i]) + off, 0):x}"
        else:
            answer.framing = "length"
            answer.length = str(max(len(b"".join(answer.body)) + off, 0))
    elif how == "status":
        answer.status = draw(st.sampled_from(STATUS_LINES))
    elif how == "header":
        answer.headers.append(draw(st.sampled_from(
            ["Transfer-Encoding: gzip, chunked", "Transfer-Encoding: CHUNKED", "no colon",
             "Content-Length: 1", ": x", "X: " + "x" * 70_000, "X:\x00\x1b", "Location: /x",
             "Transfer-Encoding: identity"])))  # fmt: skip
    return answer


@st.composite
def wire_mutated(draw: Any, wire: bytes) -> bytes:
    """``wire`` after one to three mutations of its bytes."""
    for _ in range(draw(st.integers(1, 3))):
        if not wire:
            return draw(st.sampled_from(RAW_BYTES))
        at = draw(st.integers(0, len(wire) - 1))
        to = draw(st.integers(at, min(len(wire), at + 64)))
        how = draw(st.sampled_from(["cut", "swap", "flip", "insert", "insert", "delete", "double"]))
        if how == "cut":
            wire = wire[:at]
        elif how == "swap":
            other = draw(st.integers(0, len(wire) - 1))
            b = bytearray(wire)
            b[at], b[other] = b[other], b[at]
            wire = bytes(b)
        elif how == "flip":
            b = bytearray(wire)
            b[at] ^= 1 << draw(st.integers(0, 7))
            wire = bytes(b)
        elif how == "insert":
            wire = wire[:at] + draw(st.sampled_from(RAW_BYTES)) + wire[at:]
        elif how == "delete":
            wire = wire[:at] + wire[to:]
        else:
            wire = wire[:to] + wire[at:to] + wire[to:]
    return wire


def sse(events: list[str], done: bool = True) -> list[bytes]:
    """Each event as vLLM sends it, one chunk each, then ``[DONE]``."""
    return [f"data: {e}\n\n".encode("utf-8", "surrogatepass") for e in events] + (
        [b"data: [DONE]\n\n"] if done else []
    )


def valid(path: str, n: int = 0) -> bytes:
    """The seed answer to ``path`` (``n``: the n-th /metrics scrape, the stream's seed)."""
    if path == "/metrics":
        return Framed([METRICS[min(n, 1)].encode()], "length").wire()
    if path == "/v1/models":
        return Framed([json.dumps(MODELS).encode()], "length").wire()
    return Framed(sse([json.dumps(e) for e in STREAMS[n % 2]])).wire()


# ---------------------------------------------------------------------------------------------
# Instances on a fake connection


class Writer:
    """The probe's side of a connection: the request it writes picks the answer fed back."""

    def __init__(self, wire: Wire, port: int, reader: asyncio.StreamReader) -> None:
        self.wire, self.port, self.reader = wire, port, reader

    def write(self, data: bytes) -> None:
        path = data.split(b" ", 2)[1].decode()
        answers = self.wire.answers[self.port].get(path) or [b"HTTP/1.1 404 Not Found\r\n\r\n"]
        n = self.wire.asked[self.port, path]
        self.wire.asked[self.port, path] += 1
        answer = answers[min(n, len(answers) - 1)]
        self.reader.feed_data(answer.replace(KEY.encode(), self.wire.keys[self.port]))
        self.reader.feed_eof()

    async def drain(self) -> None:
        return None

    def close(self) -> None:
        return None


@dataclass
class Wire:
    """Instances answering from bytes: port -> path -> its answers (the n-th request to a path
    gets the n-th, the last again after)."""

    answers: dict[int, dict[str, list[bytes]]]
    keys: dict[int, bytes]  # port -> its target's API key
    asked: Counter[tuple[int, str]] = field(default_factory=Counter)

    async def open_connection(
        self, host: str, port: int, limit: int
    ) -> tuple[asyncio.StreamReader, Writer]:
        reader = asyncio.StreamReader(limit=limit)
        return reader, Writer(self, port, reader)


CANARY, BASELINE = 8001, 8002


def analysed(odd: dict[str, list[bytes]], where: str) -> Outcome:
    """The analysis of a canary and a baseline, ``where`` (canary, baseline or both) answering
    ``odd`` for its paths and the seeds for the rest: its outcome, checked."""
    seeds = {"/metrics": [valid("/metrics", 0), valid("/metrics", 1)],
             "/v1/models": [valid("/v1/models")],
             "/v1/completions": [valid(probe.PATH, 0), valid(probe.PATH, 1)]}  # fmt: skip
    mine = {**seeds, **odd}
    wire = Wire({CANARY: mine if where != "baseline" else seeds,
                 BASELINE: mine if where != "canary" else seeds},
                {CANARY: KEYS["c1"].encode(), BASELINE: KEYS["b1"].encode()})  # fmt: skip
    statuses = {h: {"address": "127.0.0.1", "release": "r",
                    "instances": [{"unit": "u", "port": port, "health": "ok"}]}
                for h, port in (("c1", CANARY), ("b1", BASELINE))}  # fmt: skip
    analysis = Analysis({"c1": DATA}, KEYS, run_probe=probe.run)
    with mock.patch.object(asyncio, "open_connection", wire.open_connection):
        out = analysis(["c1"], ["b1"], statuses)
    for line in [out.why, *out.lines]:
        assert line.isprintable() and not any(k in line for k in KEYS.values()), line
    if out.report is None:  # the probe ended: one line of ServefleetError
        assert out.why.startswith("analysis: ") and not out.passed, out
        TALLY[re.sub(r"^analysis: \S+ \S+ \S+: |: .*", "", out.why)] += 1  # path and what
    else:
        json.dumps(out.report, allow_nan=False)  # strict JSON, as analysis.json is written
        report.svg(out.report)
        TALLY["read: passed" if out.passed else "read: judged failed"] += 1
    return out


def one_line(call: Any, *args: Any) -> Any:
    """``call(*args)``: its value, or None after an :class:`OddAnswer` (one printable line)."""
    try:
        return call(*args)
    except OddAnswer as e:
        assert str(e).isprintable() and len(str(e)) < 200, str(e)
        return None


# ---------------------------------------------------------------------------------------------
# The campaign


@st.composite
def metrics_case(draw: Any) -> tuple[list[bytes], list[str]]:
    """Two scrapes (before, after), one or both mutated, each framed."""
    texts = list(METRICS)
    for i in draw(st.sampled_from([[0], [1], [1], [0, 1]])):
        texts[i] = draw(text_mutated(texts[i], RAW_LINES))
    raw = [t.encode("utf-8", "surrogatepass") for t in texts]
    if draw(st.integers(0, 4)) == 0:  # bytes that are not UTF-8 in the text
        i = draw(st.integers(0, 1))
        at = draw(st.integers(0, len(raw[i])))
        raw[i] = raw[i][:at] + draw(st.sampled_from(RAW_BYTES)) + raw[i][at:]
    answers = [draw(framing_mutated(Framed([r], "length"))).wire() for r in raw]
    return answers, texts


@fuzz("metrics")
@given(case=metrics_case(), where=st.sampled_from(["canary", "baseline", "both"]))
def test_a_mutated_metrics_scrape_is_read_or_one_line(case: Any, where: str) -> None:
    answers, texts = case
    analysed({"/metrics": answers}, where)
    scrapes = [one_line(probe.parse_metrics, t) for t in texts]
    scrapes = [s if s is None else one_line(probe.checked, s, TYPES) for s in scrapes]
    for s in scrapes:
        if s is not None:
            assert probe.undeclared_names(s, TYPES) == sorted(probe.undeclared_names(s, TYPES))
    if None not in scrapes:
        before, after = scrapes
        changes = one_line(probe.deltas, before, after, TYPES) or {}
        for d in changes.values():  # counts, sums, quantiles: finite (strict JSON)
            assert all(v is None or isinstance(v, float | int) and math.isfinite(v)
                       for k, v in d.items() if k != "type")  # fmt: skip


@fuzz("models")
@given(text=json_mutated(MODELS), framed=st.data(), where=st.sampled_from(["canary", "baseline"]))
def test_a_mutated_model_list_is_read_or_one_line(text: str, framed: Any, where: str) -> None:
    body = text.encode("utf-8", "surrogatepass")
    answer = framed.draw(framing_mutated(Framed([body], "length"))).wire()
    out = analysed({"/v1/models": [answer]}, where)
    assert out.report is not None or "/v1/models answered" in out.why


@st.composite
def stream_case(draw: Any) -> tuple[bytes, list[str]]:
    """A streamed completion or chat: one to three events mutated, sometimes raw SSE lines
    added or [DONE] left out, framed."""
    seed = draw(st.sampled_from(STREAMS))
    events = [json.dumps(e) for e in seed]
    for i in draw(st.sets(st.integers(0, len(events) - 1), min_size=1, max_size=3)):
        events[i] = draw(json_mutated(seed[i]))
    body = sse(events, done=draw(st.integers(0, 5)) > 0)
    if draw(st.integers(0, 3)) == 0:
        at = draw(st.integers(0, len(body)))
        body.insert(at, draw(st.sampled_from([b"data:\n\n", b": comment\n\n", b"event: x\n\n",
                                              b"data: {}\r\n\r\n", b"data: [DONE]\n\n",
                                              b"data: \xff\n\n", b"\n\n\n", b"data: 1\ndata: 2\n\n",
                                              b'data: {"error": "x"}\n\n'])))  # fmt: skip
    return draw(framing_mutated(Framed(body))).wire(), events


@fuzz("stream")
@given(case=stream_case(), where=st.sampled_from(["canary", "baseline", "both"]))
def test_a_mutated_stream_is_read_or_one_line(case: Any, where: str) -> None:
    answer, events = case
    analysed({probe.PATH: [answer]}, where)
    for text in events:
        event = one_line(probe._event, text.encode("utf-8", "surrogatepass"))
        n = None if event is None else one_line(probe._tokens_of, event)
        if n is not None:
            assert n >= 0
            usage = one_line(probe._usage_of, event, DATA["output_tokens"])
            assert usage is None or 0 <= usage <= DATA["output_tokens"]


@fuzz("wire")
@given(path=st.sampled_from(["/metrics", "/v1/models", probe.PATH]), data=st.data(),
       where=st.sampled_from(["canary", "baseline", "both"]))  # fmt: skip
def test_a_mutated_answer_on_the_wire_is_read_or_one_line(path: str, data: Any, where: str) -> None:
    """Any answer's bytes as they are on the wire, its head too, cut, swapped, flipped, ..."""
    wire = data.draw(wire_mutated(valid(path, data.draw(st.integers(0, 1)))))
    analysed({path: [wire]}, where)

    async def body() -> bytes:
        reader = asyncio.StreamReader(limit=probe.MAX_HEAD)
        reader.feed_data(wire.partition(b"\r\n\r\n")[2])
        reader.feed_eof()
        head = wire.partition(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in head)}
        return b"".join([p async for p in probe._body(reader, headers, path)])

    try:
        asyncio.run(body())
    except (OddAnswer, probe._Failed) as e:
        assert str(e).isprintable()


def test_the_harness_reports_a_crash() -> None:
    """An exception of another kind in a parser goes through the analysis: the test fails."""
    with mock.patch.object(probe, "_tokens_of", side_effect=KeyError("a bug")):
        with pytest.raises(KeyError, match="a bug"):
            analysed({}, "canary")


def test_the_seeds_are_read_and_the_harness_tells_an_odd_answer() -> None:
    """The seeds pass through the fake connection as a server's answers do (both sides read,
    every request streamed, the counters' deltas seen); an odd answer is one line naming it."""
    out = analysed({}, "both")
    assert out.report is not None
    for role in ("canary", "baseline"):
        side = out.report[role]
        assert (side["model"], side["errors"], side["metrics_error"]) == (MODEL, 0, None)
        assert len(side["samples"]["ttft_s"]) == 2
        assert side["server"]["vllm:generation_tokens_total"]["type"] == "counter"
        assert side["undeclared_metrics"] == ["vllm:not_declared_total"]
    odd = Framed([b'{"choices": "w"}'], "length").wire()
    out = analysed({"/v1/models": [odd]}, "baseline")
    assert out.why == (f"analysis: baseline b1 http://127.0.0.1:{BASELINE}: /v1/models answered "
                       "no model: b'{\"choices\": \"w\"}'")  # fmt: skip
    with pytest.raises(ServefleetError):
        probe.checked(probe.parse_metrics(METRICS[0].replace('le="0.5"', 'le="x"')), TYPES)
