"""The simulated ``vllm serve``'s prefill/decode disaggregation (src/servefleet/fleet/lab/simulator/
packages/vllm/kv_transfer.py), as vLLM 0.30's NIXL connector does it: two simulated servers on
loopback, a prefill (``kv_producer``) and a decode (``kv_consumer``) with vllm-rbln's
``RblnNixlConnector``; the prefill's ``kv_transfer_params``, the decode's fetch over the side
channel, its failures in vLLM's words, the per-role counters, and the real vllm-router in P/D
mode in front of both (skipped without its binary: ``$VLLM_ROUTER`` or ``vllm-router`` on PATH).
Runs as test_sim_serving.py does (whose fixtures this reuses). Waits on conditions with
deadlines, never on fixed sleeps."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from http import client as httpc
from pathlib import Path
from typing import Any

import pytest
from lab_sim_support import (
    Server,
    Stream,
    derived_venv,
    free_port,
    http,
    read_stream,
    request,
    wait_for,
)
from repo_paths import REMOTE
from sim_fixtures import MODEL, gpu_root, vllm

sys.path.insert(0, str(REMOTE))
import health  # noqa: E402  (the host program the deploy's peer re-check runs)

PROMPT = "Tell me more about the lab and its simulated servers please"  # 11 words
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}]}
TO_PREFILL = health.TO_PREFILL  # what vllm-router sends a prefill (the deploy's re-check too)
INTERNAL = {
    "error": {
        "message": "Internal server error",
        "type": "InternalServerError",
        "param": None,
        "code": 500,
    }
}
CHAT_PATH = "/v1/chat/completions"


def kv_config(role: str, connector: str = "RblnNixlConnector", **extra: Any) -> str:
    config: dict[str, Any] = {"kv_connector": connector, "kv_role": role}
    if extra:
        config["kv_connector_extra_config"] = extra
    return json.dumps(config)


def pd_server(
    venv: Path,
    env: dict[str, str],
    role: str,
    side_port: int,
    npu: int,
    *args: str,
    side_host: str | None = "127.0.0.1",
    port: int | None = None,
    connector: str = "RblnNixlConnector",
    **extra: Any,
) -> Server:
    """A simulated server with ``connector`` as ``role`` on NPU (or GPU) ``npu``, its side
    channel on ``side_host`` (None: unset, vLLM's ``localhost``) : ``side_port``."""
    devices = "CUDA_VISIBLE_DEVICES" if connector == "NixlConnector" else "RBLN_VISIBLE_DEVICES"
    env = dict(env, VLLM_NIXL_SIDE_CHANNEL_PORT=str(side_port), **{devices: str(npu)})
    if side_host is not None:
        env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = side_host
    port = port or free_port()
    cmd = [str(venv / "bin" / "vllm"), "serve", MODEL, "--host", "127.0.0.1", "--port", str(port)]
    config = kv_config(role, connector, **extra)
    server = Server([*cmd, "--kv-transfer-config", config, *args], env, port)
    server.wait_ready()
    return server


def prefill(port: int, **body: Any) -> dict[str, Any]:
    """A prefill request as the router sends it (max_tokens 1); its answer's params."""
    status, raw = request(
        port, "POST", CHAT_PATH, dict(CHAT, max_tokens=1, kv_transfer_params=TO_PREFILL, **body)
    )
    assert status == 200, raw
    answer = json.loads(raw)
    assert answer["usage"]["completion_tokens"] == 1
    params: dict[str, Any] = answer["kv_transfer_params"]
    return params


def metric(port: int, name: str, role: str | None = None) -> int:
    """A sample of /metrics (``role``: the servefleet_sim_requests_total one of that role; a
    vllm: metric: engine 0's, request_success_total's of finished_reason length)."""
    text = http(port, "/metrics")[1].decode()
    if role:
        want = f'{name}{{model_name="{MODEL}",role="{role}"}}'
    elif name == "vllm:request_success_total":
        want = f'{name}{{engine="0",finished_reason="length",model_name="{MODEL}"}}'
    elif name.startswith("vllm:"):
        want = f'{name}{{engine="0",model_name="{MODEL}"}}'
    else:
        want = f'{name}{{model_name="{MODEL}"}}'
    line = next(x for x in text.splitlines() if x.startswith(want + " "))
    return int(float(line.rsplit(" ", 1)[1]))


def roles(port: int) -> dict[str, int]:
    return {
        r: metric(port, "servefleet_sim_requests_total", r) for r in ("prefill", "decode", "local")
    }


def side_channel(port: int, *lines: bytes) -> list[dict[str, Any]]:
    """Send raw lines to a side channel; its answers, one per line, until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"".join(lines))
        sock.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return [json.loads(x) for x in data.splitlines()]


@pytest.fixture
def pair(venv: Path, sim_env: dict[str, str]) -> Iterator[tuple[Server, Server, int, int]]:
    """A prefill (side channel unset: vLLM's localhost) and a decode, with their side ports."""
    p_side, d_side = free_port(), free_port()
    p = pd_server(venv, sim_env, "kv_producer", p_side, 0, side_host=None)
    try:
        d = pd_server(venv, sim_env, "kv_consumer", d_side, 1)
    except BaseException:
        p.stop()
        raise
    yield p, d, p_side, d_side
    for server in (p, d):
        if server.proc.poll() is None:
            server.stop()


# ---------------------------------------------------------------------------------------------
# Prefill, then decode


def test_prefill_answers_params_and_decode_fetches_them(
    pair: tuple[Server, Server, int, int],
) -> None:
    p, d, p_side, d_side = pair
    params = prefill(p.port)
    blocks = math.ceil(len(PROMPT.split()) / 16)
    assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
    assert params["remote_host"] == "localhost" and params["remote_port"] == p_side
    assert len(params["remote_block_ids"]) == 1 and len(params["remote_block_ids"][0]) == blocks
    assert re.fullmatch(r"[0-9a-f-]{36}", params["remote_engine_id"]), params
    assert params["remote_request_id"].startswith("chatcmpl-") and params["tp_size"] == 1
    assert metric(p.port, "servefleet_sim_kv_leases") == 1

    # the decode: the router's original request plus the prefill's params
    status, raw = request(
        d.port, "POST", CHAT_PATH, dict(CHAT, max_tokens=8, kv_transfer_params=params)
    )
    assert status == 200, raw
    answer = json.loads(raw)
    assert answer["usage"]["completion_tokens"] == 8 and "kv_transfer_params" not in answer
    assert metric(p.port, "servefleet_sim_kv_leases") == 0  # read, then freed
    assert roles(p.port) == {"prefill": 1, "decode": 0, "local": 0}
    assert roles(d.port) == {"prefill": 0, "decode": 1, "local": 0}
    assert metric(d.port, "vllm:request_success_total") == 1

    # the same blocks again: the prefill freed them (stricter than an RDMA read)
    status, raw = request(d.port, "POST", CHAT_PATH, dict(CHAT, kv_transfer_params=params))
    assert (status, json.loads(raw)) == (500, INTERNAL)

    # streamed decode; X-Request-Id names the request as in vLLM
    fresh = prefill(p.port)
    got = read_stream(
        d.port, CHAT_PATH, dict(CHAT, max_tokens=5, kv_transfer_params=fresh), Stream()
    )
    assert got.status == 200 and got.done and len(got.tokens()) == 5
    conn_id = "___prefill_addr_x___decode_addr_y_1"
    status, raw = _post(p.port, dict(CHAT, max_tokens=1, kv_transfer_params=TO_PREFILL), conn_id)
    assert status == 200 and json.loads(raw)["id"] == "chatcmpl-" + conn_id
    assert json.loads(raw)["kv_transfer_params"]["remote_request_id"].startswith(
        "chatcmpl-" + conn_id
    )

    # no params: both generate locally, as vLLM does
    for server in (p, d):
        assert request(server.port, "POST", CHAT_PATH, dict(CHAT, max_tokens=2))[0] == 200
    assert roles(d.port) == {"prefill": 0, "decode": 3, "local": 1}
    assert roles(p.port) == {"prefill": 3, "decode": 0, "local": 1}
    # a bad kv_transfer_params is a bad request
    status, raw = request(d.port, "POST", CHAT_PATH, dict(CHAT, kv_transfer_params=[1]))
    assert status == 400 and "kv_transfer_params must be an object" in raw.decode()

    # the side channel answers hostile lines in one line each, never crashes
    answers = side_channel(
        p_side, b"nonsense\n", b'{"op": "dance"}\n', b'{"op": "handshake"}\n',
        b'{"op": "read", "engine_id": "other"}\n',
        json.dumps({"op": "read", "engine_id": params["remote_engine_id"],
                    "request_id": "nope", "block_ids": [[0]]}).encode() + b"\n",
        b"x" * 70000 + b"\n",
    )  # fmt: skip
    assert [a["ok"] for a in answers] == [False, False, True, False, False, False], answers
    assert answers[2]["engine_id"] == params["remote_engine_id"]
    assert "holds no KV blocks for request 'nope'" in answers[4]["error"]
    assert "at most 65536 bytes" in answers[5]["error"]
    assert request(p.port, "GET", "/health")[0] == 200

    code, err = d.stop()
    assert code == 0 and "NIXL transfer failure: transfer_failed" in err
    assert "Internal server error" not in err.split("transfer_failed")[0]
    code, err = p.stop()
    assert code == 0 and f"listening on tcp://localhost:{p_side}" in err


def sse(port: int, body: dict[str, Any]) -> tuple[int, list[Any]]:
    """POST ``body`` streamed; the status and every event's data (JSON, or ``[DONE]``)."""
    conn = httpc.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", CHAT_PATH, json.dumps(dict(body, stream=True)),
                     {"Content-Type": "application/json"})  # fmt: skip
        resp = conn.getresponse()
        raw = resp.read().decode()
    finally:
        conn.close()
    assert raw.endswith("\n\n"), raw
    events = [e.removeprefix("data: ") for e in raw[:-2].split("\n\n")]
    return resp.status, [e if e == "[DONE]" else json.loads(e) for e in events]


def _post(port: int, body: dict[str, Any], request_id: str) -> tuple[int, bytes]:
    conn = httpc.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        headers = {"Content-Type": "application/json", "X-Request-Id": request_id}
        conn.request("POST", CHAT_PATH, json.dumps(body), headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


# ---------------------------------------------------------------------------------------------
# Failures, as vLLM's kv_load_failure_policy "fail" answers them


def test_decode_fails_on_a_wrong_engine_or_a_dead_side_channel(
    pair: tuple[Server, Server, int, int],
) -> None:
    p, d, p_side, d_side = pair
    params = prefill(p.port)

    # another engine id than the side channel's
    wrong = dict(params, remote_engine_id="0" * 8)
    status, raw = request(d.port, "POST", CHAT_PATH, dict(CHAT, kv_transfer_params=wrong))
    assert (status, json.loads(raw)) == (500, INTERNAL)
    # the prefill advertised localhost (VLLM_NIXL_SIDE_CHANNEL_HOST unset) and the port lands on
    # another NIXL server on the decode's host (here: the decode's own side channel)
    own = dict(params, remote_port=d_side)
    status, events = sse(d.port, dict(CHAT, kv_transfer_params=own))
    assert status == 200 and events[1:] == [INTERNAL, "[DONE]"], events
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    # nothing listens there: ZMQ waits out vLLM's 5 s handshake timeout
    dead = dict(params, remote_port=free_port())
    start = time.monotonic()
    status, raw = request(d.port, "POST", CHAT_PATH, dict(CHAT, kv_transfer_params=dead))
    assert (status, json.loads(raw)) == (500, INTERNAL) and time.monotonic() - start >= 5
    # the right params still work (the failures changed nothing)
    status, raw = request(d.port, "POST", CHAT_PATH, dict(CHAT, kv_transfer_params=params))
    assert status == 200, raw
    assert metric(d.port, "vllm:request_success_total") == 1
    assert roles(d.port)["decode"] == 4

    d_engine = side_channel(d_side, b'{"op": "handshake"}\n')[0]["engine_id"]
    code, err = d.stop()
    assert code == 0
    mismatch = r"Remote NIXL agent engine ID mismatch\. Expected (\S+),received (\S+)\."
    assert re.findall(mismatch, err) == [
        ("0" * 8, params["remote_engine_id"]),
        (params["remote_engine_id"], d_engine),
    ], err
    assert err.count("NIXL transfer failure: handshake_failed | Context: {") == 3
    assert "zmq.error.Again: Resource temporarily unavailable" in err
    assert "failed with an internal error during generation" in err and "Traceback" not in err


def test_restarted_prefill_fails_the_old_params(venv: Path, sim_env: dict[str, str]) -> None:
    p_side, d_side, p_port = free_port(), free_port(), free_port()
    p = pd_server(venv, sim_env, "kv_producer", p_side, 0, port=p_port)
    d = pd_server(venv, sim_env, "kv_both", d_side, 1)
    try:
        old = prefill(p.port)
        assert p.stop()[0] == 0
        p = pd_server(venv, sim_env, "kv_producer", p_side, 0, port=p_port)  # same ports
        new = prefill(p.port)
        assert new["remote_engine_id"] != old["remote_engine_id"]  # a new engine at every start
        status, raw = request(d.port, "POST", CHAT_PATH, dict(CHAT, kv_transfer_params=old))
        assert (status, json.loads(raw)) == (500, INTERNAL)
        status, raw = request(d.port, "POST", CHAT_PATH, dict(CHAT, kv_transfer_params=new))
        assert status == 200, raw
    finally:
        p.stop()
        code, err = d.stop()
    assert code == 0
    assert (
        f"Remote NIXL agent engine ID mismatch. Expected {old['remote_engine_id']},"
        f"received {new['remote_engine_id']}." in err
    )


def test_stale_peer_switch_keeps_a_restarted_prefills_old_engine(
    venv: Path, sim_env: dict[str, str]
) -> None:
    """/etc/rbln-sim/stale-peer (here naming kv_consumer): a decode started under it keeps the
    engine id it first read at each side channel (NIXL <= 1.3.2), so after the prefill restarts
    the new params fail until the decode restarts; a prefill it does not match is unaffected."""
    switch = Path(sim_env["RBLN_SIM_ROOT"]) / "etc/rbln-sim/stale-peer"
    switch.write_text("kv_consumer\n")
    p_side, d_side, p_port, d_port = free_port(), free_port(), free_port(), free_port()
    p = pd_server(venv, sim_env, "kv_producer", p_side, 0, port=p_port)
    d = pd_server(venv, sim_env, "kv_consumer", d_side, 1, port=d_port)
    p_url, d_url = f"http://127.0.0.1:{p_port}", f"http://127.0.0.1:{d_port}"
    try:  # the deploy's re-check (health.pd_probe): the router's two requests
        assert health.pd_probe(p_url, d_url, MODEL, 10) is None
        assert p.stop()[0] == 0
        p = pd_server(venv, sim_env, "kv_producer", p_side, 0, port=p_port)  # a new engine
        new = prefill(p.port)
        status, raw = request(d.port, "POST", CHAT_PATH, dict(CHAT, kv_transfer_params=new))
        assert (status, json.loads(raw)) == (500, INTERNAL)
        why = health.pd_probe(p_url, d_url, MODEL, 10)
        assert (
            why == f"decode {d_url} after prefill {p_url}: {d_url}/v1/chat/completions answered 500"
        )
        code, err = d.stop()
        assert code == 0
        assert "NIXL transfer failure: transfer_failed | Context: {" in err
        assert f"and that peer runs engine {new['remote_engine_id']} now" in err
        d = pd_server(venv, sim_env, "kv_consumer", d_side, 1, port=d_port)  # restarted: fresh
        assert health.pd_probe(p_url, d_url, MODEL, 10) is None
        assert roles(d.port)["decode"] == 1
    finally:
        p.stop()
        d.stop()


def test_lease_expires(venv: Path, sim_env: dict[str, str]) -> None:
    """Blocks not read within kv_lease_duration are released with vLLM's warning."""
    p = pd_server(venv, sim_env, "kv_producer", free_port(), 0, kv_lease_duration=1)
    d = pd_server(venv, sim_env, "kv_consumer", free_port(), 1)
    try:
        params = prefill(p.port)
        assert metric(p.port, "servefleet_sim_kv_leases") == 1
        wait_for("the lease to expire", lambda: metric(p.port, "servefleet_sim_kv_leases") == 0)
        status, raw = request(d.port, "POST", CHAT_PATH, dict(CHAT, kv_transfer_params=params))
        assert (status, json.loads(raw)) == (500, INTERNAL)
    finally:
        d.stop()
        code, err = p.stop()
    assert code == 0
    assert f"Releasing expired KV blocks for request {params['remote_request_id']}" in err


def test_recompute_policy_prefills_locally(venv: Path, sim_env: dict[str, str]) -> None:
    env = dict(sim_env, RBLN_VISIBLE_DEVICES="1", VLLM_NIXL_SIDE_CHANNEL_PORT=str(free_port()))
    port = free_port()
    config = '{"kv_connector": "RblnNixlConnector", "kv_role": "kv_consumer", "kv_load_failure_policy": "recompute"}'
    cmd = [str(venv / "bin/vllm"), "serve", MODEL, "--host", "127.0.0.1", "--port", str(port)]
    d = Server([*cmd, "--kv-transfer-config", config], env, port)
    d.wait_ready()
    dead = dict(TO_PREFILL, do_remote_decode=False, do_remote_prefill=True, remote_block_ids=[[0]],
                remote_engine_id="e", remote_request_id="r", remote_host="127.0.0.1",
                remote_port=free_port())  # fmt: skip
    try:
        status, raw = request(
            d.port, "POST", CHAT_PATH, dict(CHAT, max_tokens=3, kv_transfer_params=dead)
        )
        assert status == 200 and json.loads(raw)["usage"]["completion_tokens"] == 3
    finally:
        code, err = d.stop()
    assert "recomputing it locally" in err


# ---------------------------------------------------------------------------------------------
# Start-up: the configuration and the side channel's bind


def test_side_channel_port_taken_fails_the_start(venv: Path, sim_env: dict[str, str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        side = taken.getsockname()[1]
        env = dict(sim_env, VLLM_NIXL_SIDE_CHANNEL_HOST="127.0.0.1",
                   VLLM_NIXL_SIDE_CHANNEL_PORT=str(side))  # fmt: skip
        proc = vllm(venv / "bin/python", MODEL, "--port", str(free_port()),
                    "--kv-transfer-config", kv_config("kv_producer"), env=env)  # fmt: skip
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert (
        f"zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:{side}')" in proc.stderr
    )


@pytest.mark.parametrize(
    ("config", "env", "message"),
    [
        ('{"kv_connector": "RblnNixlConnector"}', {},
         "ValueError: Please specify kv_role when kv_connector is set, supported roles are "
         "('kv_producer', 'kv_consumer', 'kv_both')"),
        (kv_config("kv_producer", kv_lease_duration="long"), {},
         "kv_lease_duration is 'long'; expected a number of seconds > 0"),
        ('{"kv_connector": "RblnNixlPushConnector", "kv_role": "kv_producer"}', {},
         "the simulation models NIXL's pull connectors only"),
        (kv_config("kv_producer"), {"VLLM_NIXL_SIDE_CHANNEL_PORT": "56x"},
         "ValueError: invalid literal for int() with base 10: '56x' (VLLM_NIXL_SIDE_CHANNEL_PORT)"),
        (kv_config("kv_producer"), {"VLLM_NIXL_SIDE_CHANNEL_HOST": "no-such-host.invalid"},
         "zmq.error.ZMQError: No such device (addr='tcp://no-such-host.invalid:5600')"),
    ],
)  # fmt: skip
def test_refuses_bad_connector_settings(
    venv: Path, sim_env: dict[str, str], config: str, env: dict[str, str], message: str
) -> None:
    proc = vllm(
        venv / "bin/python", MODEL, "--kv-transfer-config", config, env=dict(sim_env, **env)
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert message in proc.stderr, proc.stderr
    assert len([x for x in proc.stderr.splitlines() if x.startswith("ERROR")]) == 1


def test_without_a_nixl_connector_params_are_ignored(venv: Path, sim_env: dict[str, str]) -> None:
    port = free_port()
    cmd = [str(venv / "bin/vllm"), "serve", MODEL, "--host", "127.0.0.1", "--port", str(port)]
    server = Server(cmd, sim_env, port)
    server.wait_ready()
    try:
        body = dict(CHAT, max_tokens=1, kv_transfer_params=TO_PREFILL)
        status, raw = request(port, "POST", CHAT_PATH, body)
        assert status == 200 and "kv_transfer_params" not in json.loads(raw)
        assert roles(port) == {"prefill": 0, "decode": 0, "local": 1}
    finally:
        assert server.stop()[0] == 0


# ---------------------------------------------------------------------------------------------
# GPU hosts: the CUDA build with upstream's NixlConnector (and PyPI's nixl beside vllm)


@pytest.fixture(scope="module")
def nixl_venv(gpu_venv: Path, out: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The GPU venv (vllm 0.30.0 from the public index) plus the public index's nixl."""
    dest = tmp_path_factory.mktemp("nixlvenv") / "v"
    derived_venv(gpu_venv, dest, wheels=(out / "index/public/nixl-1.5.1-py3-none-any.whl",))
    for script in ("vllm",):  # its console script, pointed at this venv's python
        text = (gpu_venv / "bin" / script).read_text().replace(str(gpu_venv), str(dest))
        (dest / "bin" / script).write_text(text)
        (dest / "bin" / script).chmod(0o755)
    return dest


@pytest.fixture
def cuda_env(hf_home: Path, tmp_path: Path) -> dict[str, str]:
    root = gpu_root(tmp_path / "gpu-root")
    (root / "etc/rbln-sim/load-seconds").write_text("0.2\n")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "RBLN_", "HF_"))}
    base.pop("CUDA_VISIBLE_DEVICES", None)
    return dict(base, RBLN_SIM_ROOT=str(root), PATH=f"{root}/usr/bin:/usr/bin:/bin",
                HF_HOME=str(hf_home), HF_HUB_OFFLINE="1",
                VLLM_CACHE_ROOT=str(tmp_path / "vllm-cache-gpu"))  # fmt: skip


def test_gpu_prefill_decode_and_the_compatibility_check(
    nixl_venv: Path, gpu_venv: Path, cuda_env: dict[str, str], venv: Path, sim_env: dict[str, str]
) -> None:
    """Two CUDA servers pair as the RBLN ones do; an RBLN decode refuses a GPU prefill's blocks
    (the handshake's compatibility hash: another vLLM build); without nixl the connector's
    import fails the start."""
    proc = subprocess.run(
        [str(gpu_venv / "bin/vllm"), "serve", MODEL, "--kv-transfer-config",
         kv_config("kv_producer", "NixlConnector")],
        capture_output=True, text=True, env=cuda_env, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 1 and "ImportError: No module named 'nixl'" in proc.stderr

    p = pd_server(nixl_venv, cuda_env, "kv_producer", free_port(), 0, connector="NixlConnector")
    servers = [p]
    try:
        d = pd_server(nixl_venv, cuda_env, "kv_consumer", free_port(), 1, connector="NixlConnector")
        servers.append(d)
        rbln = pd_server(venv, sim_env, "kv_consumer", free_port(), 2)
        servers.append(rbln)
        params = prefill(p.port)
        status, raw = request(rbln.port, "POST", CHAT_PATH, dict(CHAT, kv_transfer_params=params))
        assert (status, json.loads(raw)) == (500, INTERNAL)
        status, raw = request(
            d.port, "POST", CHAT_PATH, dict(CHAT, max_tokens=3, kv_transfer_params=params)
        )
        assert status == 200 and json.loads(raw)["usage"]["completion_tokens"] == 3, raw
        assert roles(d.port)["decode"] == 1 and roles(p.port)["prefill"] == 1
    finally:
        errs = [server.stop()[1] for server in servers]
    assert "RuntimeError: NIXL compatibility hash mismatch. Local: " in errs[2]
    assert "Prefill and decode instances have incompatible configurations." in errs[2]


# ---------------------------------------------------------------------------------------------
# The real vllm-router in P/D mode in front of both


def router_binary() -> str | None:
    beside = Path(sys.executable).parent / "vllm-router"  # the dev extra's (pyproject)
    found = os.environ.get("VLLM_ROUTER") or shutil.which("vllm-router")
    return found or (str(beside) if beside.is_file() else None)


@pytest.mark.skipif(router_binary() is None, reason="no vllm-router ($VLLM_ROUTER or on PATH)")
def test_real_router_goes_prefill_then_decode(
    pair: tuple[Server, Server, int, int], tmp_path: Path
) -> None:
    p, d, _, _ = pair
    port = free_port()
    cmd = [
        str(router_binary()), "--vllm-pd-disaggregation", "--policy", "round_robin",
        "--prefill", f"http://127.0.0.1:{p.port}", "--decode", f"http://127.0.0.1:{d.port}",
        "--host", "127.0.0.1", "--port", str(port), "--prometheus-host", "127.0.0.1",
        "--prometheus-port", str(free_port()), "--worker-startup-check-interval", "1",
        "--health-check-interval-secs", "1", "--log-dir", str(tmp_path),
    ]  # fmt: skip
    log = (tmp_path / "router.out").open("w")
    router = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    try:

        def ready() -> bool:
            assert router.poll() is None, (tmp_path / "router.out").read_text()
            try:
                return request(port, "GET", "/health")[0] == 200
            except OSError:
                return False

        wait_for("the router", ready, timeout=60)
        status, raw = request(port, "POST", CHAT_PATH, dict(CHAT, max_tokens=6))
        assert status == 200, raw
        assert json.loads(raw)["usage"]["completion_tokens"] == 6
        got = read_stream(port, CHAT_PATH, dict(CHAT, max_tokens=4), Stream())
        assert got.status == 200 and got.done and len(got.tokens()) == 4
        assert roles(p.port) == {"prefill": 2, "decode": 0, "local": 0}
        assert roles(d.port) == {"prefill": 0, "decode": 2, "local": 0}
        assert metric(p.port, "servefleet_sim_kv_leases") == 0
    finally:
        router.send_signal(signal.SIGTERM)
        try:
            router.wait(10)
        except subprocess.TimeoutExpired:
            router.kill()
            router.wait(10)
        log.close()
