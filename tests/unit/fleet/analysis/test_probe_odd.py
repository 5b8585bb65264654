"""A hostile or broken instance against the canary analysis (#46 item 8): answers the probe
(fleet/analysis/probe.py) cannot read (a Content-Length of ``abc``, a chunk size of ``-5``, a
status line that is not HTTP, an event that is a list, not UTF-8 or nested past the parser's
depth, a usage past what was asked, a model list without a model, a bucket bound of ``x``, a
negative, NaN or infinite counter, /metrics not UTF-8) end the analysis as failed, in one line
naming the instance and the answer, never a traceback; the rollout then rolls the canary back.
The servers are stream_server.py's, each answering one path with the test's bytes; the probe's
parsers also get arbitrary input (hypothesis): they return or raise OddAnswer, nothing else."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from stream_server import Behaviour, streaming

from servefleet.fleet.analysis import probe
from servefleet.fleet.analysis.canary import Analysis
from servefleet.fleet.analysis.probe import OddAnswer
from servefleet.fleet.rollout import HostResult, Rollout
from servefleet.settings.check_analysis import ANALYSIS

DATA = dict(ANALYSIS, requests=4, concurrency=2, prompt_tokens=4, output_tokens=8, timeout=20,
            request_timeout=5)  # fmt: skip
TTFT = "vllm:time_to_first_token_seconds"
COUNTER = 'vllm:generation_tokens_total{engine="0"}'


def http(body: bytes, *head: str) -> bytes:
    """A 200 answer with ``head``'s header lines and ``body``, as it is on the wire."""
    return ("HTTP/1.1 200 OK\r\n" + "".join(f"{h}\r\n" for h in head) + "\r\n").encode() + body


def sized(body: bytes) -> bytes:
    return http(body, f"Content-Length: {len(body)}")


def events(*data: bytes) -> bytes:
    """A chunked SSE stream of ``data`` events, then ``[DONE]``."""
    pieces = [b"data: " + d + b"\n\n" for d in (*data, b"[DONE]")]
    body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
    return http(body, "Transfer-Encoding: chunked")


TOKEN = b'{"choices": [{"index": 0, "text": "w "}]}'
DEEP = b"[" * 100_000 + b"]" * 100_000

# path -> (its answer, what the line says of it after the instance's name)
ODD = {
    "le=x": ("/metrics", sized(f'{TTFT}_bucket{{engine="0",le="x"}} 3\n'
                               f'{TTFT}_count{{engine="0"}} 3\n'.encode()),
             "/metrics answered a bucket bound that is not a number of 0 or more: "
             "'{engine=\"0\",le=\"x\"}'"),
    "Content-Length abc": ("/v1/models", http(b"{}", "Content-Length: abc"),
                           "/v1/models answered a Content-Length that is not a number: 'abc'"),
    "Content-Length -1": ("/v1/completions", http(b"", "Content-Length: -1"),
                          "/v1/completions answered a Content-Length that is not a number: '-1'"),
    "chunk size -5": ("/v1/models", http(b"-5\r\nxx\r\n", "Transfer-Encoding: chunked"),
                      "/v1/models answered a chunk size that is not hex: b'-5\\r\\n'"),
    "head too long": ("/v1/models", b"HTTP/1.1 200 OK\r\nX: " + b"x" * 70_000 + b"\r\n\r\n",
                      "/v1/models answered a head longer than 65536 bytes"),
    "not HTTP": ("/v1/models", b"SSH-2.0-OpenSSH_9.2\r\n\r\n",
                 "/v1/models answered a status line that is not HTTP/1.x: 'SSH-2.0-OpenSSH_9.2'"),
    "event a list": ("/v1/completions", events(b"[1, 2]"),
                     "/v1/completions answered an event that is not an object: [1, 2]"),
    "choices a string": ("/v1/completions", events(b'{"choices": "w"}'),
                         "/v1/completions answered choices that are not a list: 'w'"),
    "delta a list": ("/v1/completions", events(b'{"choices": [{"delta": ["w"]}]}'),
                     "/v1/completions answered a choice that is not an object with a delta "
                     "object: {'delta': ['w']}"),
    "usage a string": ("/v1/completions", events(TOKEN, b'{"choices": [], "usage": "8"}'),
                       "/v1/completions answered a usage that is not an object: '8'"),
    "event not UTF-8": ("/v1/completions", events(b'{"choices": [{"text": "\xff"}]}'),
                        "/v1/completions answered an event that is not UTF-8: "
                        "b'{\"choices\": [{\"text\": \"\\xff\"}]}'"),
    "event too deep": ("/v1/completions", events(DEEP),
                       "/v1/completions answered an event that is not JSON: '" + "[" * 76
                       + "..."),  # the line's answer cut at 80 characters
    "usage huge": ("/v1/completions",
                   events(TOKEN, b'{"choices": [], "usage": {"completion_tokens": 1%s}}'
                          % (b"0" * 400)),
                   "/v1/completions answered completion_tokens that are not 0 to 8: 1"
                   + "0" * 76 + "..."),
    "usage negative": ("/v1/completions",
                       events(TOKEN, b'{"choices": [], "usage": {"completion_tokens": -1}}'),
                       "/v1/completions answered completion_tokens that are not 0 to 8: -1"),
    "usage NaN": ("/v1/completions",
                  events(TOKEN, b'{"choices": [], "usage": {"completion_tokens": NaN}}'),
                  "/v1/completions answered completion_tokens that are not 0 to 8: nan"),
    "no model": ("/v1/models", sized(b'[{"id": "m"}]'),
                 "/v1/models answered no model: b'[{\"id\": \"m\"}]'"),
    "metrics not UTF-8": ("/metrics", sized(COUNTER.encode() + b" 1\xff\n"),
                          "/metrics answered text that is not UTF-8: "
                          "b'ion_tokens_total{engine=\"0\"} 1\\xff\\n'"),  # 30 bytes before
    "counter negative": ("/metrics", sized(f"{COUNTER} -5\n".encode()),
                         f"/metrics answered a counter sample that is not a count: '{COUNTER} "
                         "-5.0'"),
    "counter NaN": ("/metrics", sized(f"{COUNTER} NaN\n".encode()),
                    f"/metrics answered a counter sample that is not a count: '{COUNTER} nan'"),
    "counter inf": ("/metrics", sized(f"{COUNTER} +Inf\n".encode()),
                    f"/metrics answered a counter sample that is not a count: '{COUNTER} inf'"),
    "sample not a number": ("/metrics", sized(f"{COUNTER} many\n".encode()),
                            "/metrics answered a sample that is not a number: "
                            f"'{COUNTER} many'"),
}  # fmt: skip


def instance(port: int) -> dict[str, Any]:
    return {"unit": "servefleet-vllm-0.service", "port": port, "health": "ok", "running": "a1"}


def statuses(canary: str, baseline: str, release: str = "r2") -> dict[str, Any]:
    """The status report of canary host c1 and baseline host b1 serving at these origins."""
    return {h: {"address": "127.0.0.1", "release": release,
                "instances": [instance(int(origin.rsplit(":", 1)[1]))]}
            for h, origin in (("c1", canary), ("b1", baseline))}  # fmt: skip


@pytest.mark.parametrize("case", list(ODD))
def test_an_odd_answer_fails_the_analysis_in_one_line_naming_it(case: str) -> None:
    path, answer, said = ODD[case]
    with streaming(Behaviour(odd={path: answer})) as c, streaming(Behaviour()) as b:
        out = Analysis({"c1": DATA}, run_probe=probe.run)(["c1"], ["b1"], statuses(c, b))
    assert (out.passed, out.host, out.report) == (False, "c1", None)
    assert out.why == f"analysis: canary c1 {c}: {said}"
    assert "\n" not in out.why and out.lines[-1].startswith("analysis: canary c1 ")


def test_an_odd_baseline_fails_it_too_and_the_key_is_never_shown() -> None:
    key = "sk-baseline-secret-4711"
    echo = sized(json.dumps({"data": [], "you_sent": f"Bearer {key}"}).encode())
    with streaming(Behaviour()) as c, streaming(Behaviour(odd={"/v1/models": echo})) as b:
        out = Analysis({"c1": DATA}, {"b1": key}, run_probe=probe.run)(
            ["c1"], ["b1"], statuses(c, b)
        )
    assert not out.passed and out.why == (
        f"analysis: baseline b1 {b}: /v1/models answered no model: "
        "b'{\"data\": [], \"you_sent\": \"Bearer <the API key>\"}'"
    )  # fmt: skip


def test_the_rollout_rolls_the_canary_back_on_an_odd_answer() -> None:
    lines: list[str] = []
    runs: list[tuple[list[str], str]] = []

    def pyinfra(hosts: list[str], deploy: str, compiling: Sequence[str] = ()) -> Any:
        runs.append((list(hosts), deploy))
        return 0, {"failed_hosts": []}, ""

    with streaming(Behaviour(odd={"/v1/completions": events(b"[1, 2]")})) as c, \
            streaming(Behaviour()) as b:  # fmt: skip
        now = statuses(c, b)
        rollout = Rollout(inventory="inv.py", deploy="/fleet/deploys/serve.py", pyinfra_args=[],
                          report=lambda kind, hosts: {h: now[h] for h in hosts if h in now},
                          echo=lines.append,
                          analyse=Analysis({"c1": DATA}, run_probe=probe.run))  # fmt: skip
        rollout.pyinfra = pyinfra  # type: ignore[method-assign]
        rollout.results = {"c1": HostResult(result="ok")}
        start = {"c1": {**now["c1"], "release": "r1"}}
        assert not rollout.analysed(["c1"], set(), [["b1"]], start)
    said = f"analysis: canary c1 {c}: {ODD['event a list'][2]}"
    assert runs == [(["c1"], "/fleet/deploys/rollback.py")]
    assert said in lines and "halting: rolling the canary back on c1" in lines
    r = rollout.results["c1"]
    assert (r.result, r.why, r.rolled_back) == ("failed", said, True)


# ---------------------------------------------------------------------------------------------
# The parsers on arbitrary input: a value or an OddAnswer, never another exception

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.sampled_from(["choices", "text", "delta", "content", "reasoning",
                                       "usage", "completion_tokens", "x"]), inner, max_size=4),
    max_leaves=12,
)  # fmt: skip
PARSERS = settings(max_examples=300, derandomize=True, database=None, deadline=None,
                   suppress_health_check=[HealthCheck.too_slow])  # fmt: skip


@PARSERS
@given(JSON)
def test_events_of_any_shape_are_read_or_odd(event: Any) -> None:
    try:
        n = probe._tokens_of(event)
        usage = probe._usage_of(event, 8)
    except OddAnswer as e:
        assert "\n" not in str(e) and len(str(e)) < 200
    else:
        assert n >= 0 and (usage is None or 0 <= usage <= 8)


@PARSERS
@given(st.binary(max_size=40) | st.text(max_size=40).map(lambda t: t.encode("utf-8", "replace")))
def test_event_data_of_any_bytes_is_read_or_odd(data: bytes) -> None:
    try:
        probe._event(data)
    except OddAnswer as e:
        assert "\n" not in str(e)


LINE = st.one_of(
    st.text(max_size=30),
    st.builds(lambda series, labels, value: f"{series}{labels} {value}",
              st.sampled_from([f"{TTFT}_bucket", f"{TTFT}_count", f"{TTFT}_sum",
                               "vllm:generation_tokens_total", "vllm:num_requests_running"]),
              st.sampled_from(["", '{engine="0"}', '{le="0.1"}', '{le="x"}', '{le="-1"}',
                               '{engine="}",le="+Inf"}', '{le="NaN"}', "{", '{a="\\""}']),
              st.sampled_from(["1", "-1", "NaN", "+Inf", "-Inf", "x", "1e400", "0x1"])),
)  # fmt: skip


@PARSERS
@given(st.lists(LINE, max_size=6))
def test_metrics_of_any_text_are_read_or_odd(lines: list[str]) -> None:
    types = probe.declared()
    try:
        scrape = probe.checked(probe.parse_metrics("\n".join(lines)), types)
        probe.deltas(scrape, scrape, types)
    except OddAnswer as e:
        assert "\n" not in str(e)


@PARSERS
@given(st.sampled_from(["chunked", "length", "none"]), st.text(max_size=8),
       st.binary(max_size=60))  # fmt: skip
def test_bodies_of_any_framing_are_read_or_odd(how: str, length: str, raw: bytes) -> None:
    async def read() -> bytes:
        reader = asyncio.StreamReader(limit=probe.MAX_HEAD)
        reader.feed_data(raw)
        reader.feed_eof()
        headers = {"chunked": {"transfer-encoding": "chunked"},
                   "length": {"content-length": length.strip()}, "none": {}}[how]  # fmt: skip
        return b"".join([p async for p in probe._body(reader, headers, "/x")])

    try:
        asyncio.run(read())
    except (OddAnswer, probe._Failed) as e:
        assert "\n" not in str(e)
