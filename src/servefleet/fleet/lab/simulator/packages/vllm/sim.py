"""Simulated ``vllm serve``: a SIMULATION for the servefleet lab, shipped in the simulator's fake
``vllm 0.30.0+cpu`` wheel (console script ``vllm``). It is not vLLM and serves no model.

The same code is also the simulator's fake CUDA build, ``vllm 0.30.0`` (PyPI's, on the public
index): ``build.json`` next to this file, written into each wheel by the simulator's build.py,
says which build this is (no file: the CPU build). Everything below describes the CPU build with
vllm-rbln; the CUDA build is described at :func:`vllm.cuda.start_cuda`.

This module is the entry point (``serve``, ``main``) and names the simulated server's API in one
namespace; the server is split by concern into the package's modules: :mod:`vllm.common`
(build, simulation paths, config fields, SimError), :mod:`vllm.flag_table` (the parser),
:mod:`vllm.kv_transfer` (prefill/decode over the NIXL connector's side channel),
:mod:`vllm.compile_cache` (the cache key), :mod:`vllm.checks` (start-up checks, warm-up, fault
switches), :mod:`vllm.cuda` (the CUDA build), :mod:`vllm.http_api` (the HTTP API and its API
key), :mod:`vllm.generation` (the reply, its timing model and its streamed events),
:mod:`vllm.serving_metrics` (/metrics) and :mod:`vllm.lifecycle` (the requests in flight, the
engine's queue and the shutdown), and for the CUDA build across
nodes :mod:`vllm.parallel_plan` (where a server stands in its group: vLLM's node and data
parallel ranks, its refusals, the arguments a group agrees on), :mod:`vllm.rendezvous` and
:mod:`vllm.group_head` (the group's rendezvous over TCP, and how it lives and dies).

It behaves like a vLLM 0.30 + vllm-rbln 0.12 server from the outside: the real ``vllm serve``
flag set (exit 2 on anything else), import checks of the RBLN packages, a Hugging Face cache
check, NPU selection through ``RBLN_VISIBLE_DEVICES`` and ``rbln-smi -j``, a simulated compile
keyed like vllm-rbln's mega-cache, and an OpenAI-style HTTP API. Standard library only.

Flags: the parser is generated at run time from dumps of the real parser's argparse actions,
kept verbatim in ``flags/`` next to this file: ``vllm-0.30.0-rbln-0.12.0.json`` (vllm-rbln's
RBLN platform, what CR13 hosts run) and ``vllm-0.30.0-upstream.json`` (upstream vLLM, what GPU
hosts run). The file /etc/rbln-sim/platform picks the table: ``rbln`` (also when the file is
missing or empty) or ``upstream``; any other word refuses to start. Values are checked by
vLLM's own value parsers (int, float, ``32k``/``1M``, ``auto``, JSON, ``None`` for optional
values, choices) and FlexibleArgumentParser's habits are kept: ``--flag=value``, ``_`` for
``-`` in a flag name, ``--model X`` as the positional model, dotted sub-keys of JSON arguments
(``--speculative-config.method eagle3``, merged into the object the flag itself gives).

Environment: a ``VLLM_*`` variable vLLM 0.30.0 does not know (``flags/vllm-0.30.0-envs.json``;
on the rbln platform also vllm-rbln's ``VLLM_RBLN_*``) logs vLLM's start-up warning
``Unknown vLLM environment variable detected: NAME``, so a typo shows in the journal.

Compile-only (``VLLM_RBLN_COMPILE_ONLY=1``, rbln.md §3.6): every graph is compiled and cached on
a dummy device, no NPU claimed. The target NPU is ``RBLN_FORCE_NPU_NAME`` (legacy
``RBLN_TARGET_SOC``), else rbln-smi's name of the first NPU; with neither the start fails. The
variable is not part of the cache key (a CPU-compiled bundle must hit on the NPU host), it
refuses ``VLLM_DISABLE_COMPILE_CACHE=1``, and after warm-up the server serves as usual (on the
dummy device). Without compile-only a forced name is ignored (with a warning) for rbln-smi's.

The mega-cache bundle holds the signature, a simulated payload derived from model and signature
(byte-identical wherever the same signature compiles) and the payload's sha256. A bundle that
does not parse, names another signature or model, or fails its hash is logged
(``failed to load rbln mega-cache bundle from PATH: WHY; recompiling``) and compiled again.

Fault switches, files under /etc/rbln-sim: ``fail-start`` makes the server exit 1 before it
claims NPUs; ``fail-health`` makes ``GET /health`` answer 500 (read on every request). An EMPTY
switch file fails every server; a switch file holding lines of text fails only the servers
whose command line (their argv joined by single spaces) contains every line, e.g. the two lines
``--max-num-seqs 8`` and ``--port 8001``.

Serving: replies take real time, whole or streamed as server-sent events, by a deterministic
timing model of ``--max-num-seqs`` (a queue beyond it), ``--max-num-batched-tokens`` (prefill
chunks), ``--speculative-config`` and the running batch (:class:`vllm.generation.Timing`), at
``/etc/rbln-sim/tokens-per-second`` (read for every request; a fast default without the file)
and ``/etc/rbln-sim/slowdown``'s factor for this release and command line; /metrics carries
vLLM's request histograms, queue gauges and counters (:mod:`vllm.serving_metrics`). ``--api-key`` (or
``$VLLM_API_KEY``) guards every ``/v1`` path as vLLM does. SIGTERM or SIGINT: vLLM 0.30's
shutdown, no new request, the requests in flight drained for up to ``--shutdown-timeout``
seconds (0, the default: none), the rest aborted, then exit 0.

Prefill/decode (``--kv-transfer-config`` with ``NixlConnector``, on rbln ``RblnNixlConnector``):
the NIXL side channel on ``$VLLM_NIXL_SIDE_CHANNEL_HOST``:``$VLLM_NIXL_SIDE_CHANNEL_PORT``, a
prefill's ``kv_transfer_params``, a decode's fetch over TCP and its failures as vLLM's
(:mod:`vllm.kv_transfer`); ``servefleet_sim_requests_total{role=...}`` counts the requests by
the part they played.

Multi-node (the CUDA build; the CPU build with vllm-rbln refuses it): ``--nnodes``,
``--node-rank``, ``--master-addr``/``--master-port`` and the ``--data-parallel-*`` flags place the
server as vLLM 0.30.0 places it; node rank 0 (or the DP rank 0 front-end) listens for the other
ranks and serves only once every rank joined with the same arguments and loaded the model. A
``--headless`` rank opens no HTTP port and runs until SIGTERM, also after its head died
(vllm#32136); a head whose other rank died answers /health 503 and exits 0 after vLLM's 5 s
watchdog (vllm#48966). The main process keeps its command line: like vLLM, the simulator sets
no process title there (vLLM sets them only in its child processes).

Every path under /etc/rbln-sim, /run/rbln-sim and /var/log/rbln-sim is prefixed by
``$RBLN_SIM_ROOT`` when that is set (tests only; a deploy never sets it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from .checks import (
    _write_atomic,
    bundle_bytes,
    bundle_fault,
    check_packages,
    check_reasoning_parser,
    claim_devices,
    compile_only,
    compile_only_target,
    fault_switch,
    find_snapshot,
    ignored_npu_name,
    rbln_smi,
    warm_up,
)
from .common import (
    BUILD,
    COMPILE_ENV,
    COMPILE_ONLY_ENV,
    CONFIG_FIELDS,
    DEFAULT_PLATFORM,
    PLATFORMS,
    RBLN_FIELDS,
    SIM_RUN,
    VERSION,
    SimError,
    _log,
    sim_path,
    sim_platform,
)
from .compile_cache import _signature, bundle_path, cache_key
from .cuda import start_cuda
from .entrypoints.launchers.launcher import setup_server
from .exceptions import VLLMError
from .flag_table import (
    FlexibleArgumentParser,
    _object,
    build_parser,
    parse_serve_args,
    unknown_env_vars,
)
from .generation import slowdown, tokens_per_second
from .http_api import APIServer, _make_handler, _State
from .kv_transfer import kv_transfer
from .parallel_plan import check_serve_modes, plan_of
from .rendezvous import launch_line
from .serve_args import engine_config_error, platform_of, validate_parsed_serve_args

SHUTDOWN_SIGNALS = {signal.SIGTERM, signal.SIGINT}  # vLLM handles both alike
WATCHDOG_SECONDS = 5.0  # vllm/entrypoints/launchers/launcher.py: VLLM_WATCHDOG_TIME_S

# The console script's entry, and the simulated server's API in one namespace
__all__ = [
    "COMPILE_ENV",
    "COMPILE_ONLY_ENV",
    "CONFIG_FIELDS",
    "DEFAULT_PLATFORM",
    "PLATFORMS",
    "RBLN_FIELDS",
    "SimError",
    "build_parser",
    "bundle_bytes",
    "bundle_fault",
    "bundle_path",
    "cache_key",
    "compile_only",
    "compile_only_target",
    "fault_switch",
    "ignored_npu_name",
    "main",
    "parse_serve_args",
    "serve",
    "sim_platform",
    "unknown_env_vars",
    "warm_up",
]


def _record(ns: argparse.Namespace, env: Mapping[str, str]) -> None:
    run_dir = sim_path(env, SIM_RUN)
    os.makedirs(run_dir, exist_ok=True)
    record = {
        "argv": list(sys.argv),
        "env": dict(os.environ),
        "pid": os.getpid(),
        "uid": os.getuid(),
        "cwd": os.getcwd(),
        "time": time.time(),
    }
    # a compile-only build runs as another user than the servers: a record of its own (in the
    # sticky run directory, neither could replace the other's)
    dummy = BUILD["device"] != "cuda" and env.get(COMPILE_ONLY_ENV, "").strip().lower() in (
        "1",
        "true",
    )
    path = os.path.join(run_dir, f"vllm-{'compile-only-' if dummy else ''}{ns.port}.json")
    with contextlib.suppress(OSError):
        os.unlink(path)
    _write_atomic(path, json.dumps(record, indent=1, sort_keys=True).encode())


def _target(
    ns: argparse.Namespace, env: Mapping[str, str], rebel: str, dummy: bool
) -> tuple[str, str, list[int]]:
    """The NPU name and signature this server compiles for, and its NPU lock fds: in
    compile-only mode a dummy device (no rbln-smi check, no claim; the devices in the key are
    RBLN_VISIBLE_DEVICES' entries, else 1), else the claimed NPUs.

    + ns: the parsed arguments
    + env: the server's environment
    + rebel: the installed rebel-compiler version
    + dummy: compile-only mode
    """
    if dummy:
        npu, source = compile_only_target(env)
        sig = _signature(ns, env, npu, rebel, None)
        _log(
            f"compile-only target {npu} ({source}), no NPU claimed, rebel {rebel}, signature {sig}"
        )
        return npu, sig, []
    smi = rbln_smi(env)
    devices, fds = claim_devices(env, smi)
    npu = next(d["name"] for d in smi["devices"] if int(d["npu"]) == devices[0])
    warning = ignored_npu_name(env, npu)
    if warning is not None:
        _log(warning, "WARNING")
    sig = _signature(ns, env, npu, rebel, len(devices))
    _log(f"NPUs {devices} ({npu}), rebel {rebel}, signature {sig}")
    return npu, sig, fds


def _start_rbln(ns: argparse.Namespace, env: Mapping[str, str]) -> tuple[dict[str, Any], list[int]]:
    """The CPU build's start with vllm-rbln: packages, model, NPUs, compile (or the cached
    bundle); returns the server's info and its NPU lock fds."""
    dummy = compile_only(env)
    mods = check_packages(ns)
    find_snapshot(env, ns.model)
    draft = _object(ns.speculative_config).get("model")
    if draft:
        find_snapshot(env, str(draft))
    check_reasoning_parser(ns)  # the engine's config, once the tokenizer is read
    switch = fault_switch(env, "fail-start", sys.argv)
    if switch is not None:
        raise SimError(f"simulated start failure: {switch}")
    npu, sig, fds = _target(ns, env, mods["rebel"].__version__, dummy)
    bundle, compiled = warm_up(ns, env, sig, _log, npu=npu, compile_only=dummy)
    if dummy:
        _log(f"compile-only mode ({COMPILE_ONLY_ENV}=1): running on a dummy device for {npu}")
    return {"compiled": compiled, "bundle": bundle, "sig": sig}, fds


def serve(argv: Sequence[str]) -> int:
    """``vllm serve ARGS``: checks, warm-up, then the HTTP API until SIGTERM or SIGINT, then
    vLLM's shutdown (:func:`_shut_down`).

    + argv: the arguments after ``serve``
    """
    env = dict(os.environ)
    platform = platform_of(env)
    try:  # vLLM's parser refuses a --served-model-name without the positional model
        ns = parse_serve_args(argv, platform)
    except ValueError as exc:
        raise SimError(f"ValueError: {exc}") from None
    return start(ns, env, platform)


def start(ns: argparse.Namespace, env: Mapping[str, str], platform: str) -> int:
    """``vllm serve`` once its arguments parsed: the checks vLLM runs before it loads a model
    (``validate_parsed_serve_args``), the API server's set-up (``setup_server``: the version
    and arguments logged, ``validate_api_server_args``), the config classes the engine builds,
    then the engine (the model, the reasoning parser's look-up, the device, the warm-up) and
    the HTTP API until SIGTERM or SIGINT. Each failure is a SimError: one line, exit 1.

    + ns: the parsed arguments
    + env: the server's environment
    + platform: ``rbln`` or ``upstream``
    """
    try:
        validate_parsed_serve_args(ns)
    except (TypeError, ValueError) as exc:
        raise SimError(f"{type(exc).__name__}: {exc}") from None
    check_serve_modes(ns)
    if not ns.headless:  # a headless server sets up no API server
        try:
            setup_server(ns, reuse_port=False)
        except KeyError as exc:  # an unregistered parser: vLLM's traceback ends in the KeyError
            raise SimError(f"KeyError: {exc}") from None
    config_error = engine_config_error(ns, platform)
    if config_error is not None:
        raise SimError(f"pydantic_core._pydantic_core.ValidationError: {config_error}")
    plan = plan_of(ns)
    if plan.group is not None and BUILD["device"] != "cuda":
        raise SimError(
            "the lab's simulated vllm-rbln runs no multi-node group (--nnodes, --headless, data "
            "parallel across nodes): Rebellions documents single-server deployments only"
        )
    kv = kv_transfer(
        ns, env, sys.argv
    )  # the NIXL connector's configuration, checked before the model
    host = ns.host or "0.0.0.0"  # no --host: every interface, as vLLM

    def _stop(signum: int, frame: Any) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, _stop)
    _log(f"platform {platform}: the flag table of {PLATFORMS[platform]}")
    for name in unknown_env_vars(env, platform):
        _log(f"Unknown vLLM environment variable detected: {name}", "WARNING")
    _record(ns, env)
    if plan.headless:
        _log(launch_line(plan, VERSION))
    if BUILD["device"] == "cuda":
        info, fds = start_cuda(ns, env, plan, platform)
    else:
        info, fds = _start_rbln(ns, env)
    tokens_per_second(env)  # a bad rate or slowdown file fails the start, not the first request
    slowdown(env, f"{sys.prefix} {' '.join(sys.argv)}")
    if kv is not None:  # the engines' side channels, once the KV cache exists
        _log(f"KV transfer: {kv.connector} kv_role={kv.kv_role} policy={kv.policy}")
        kv.open()
    # from here SIGTERM and SIGINT wait for sigwait (every thread started below inherits the mask)
    signal.pthread_sigmask(signal.SIG_BLOCK, SHUTDOWN_SIGNALS)
    if plan.headless:
        return _headless(info, kv, fds)
    state = _State(ns, env, info, kv, group=info.get("group"))
    httpd = APIServer((host, ns.port), _make_handler(state))
    # a short poll: httpd.shutdown() returns within 0.1 s of the drain's end
    loop = threading.Thread(
        target=httpd.serve_forever, kwargs={"poll_interval": 0.1}, name="http", daemon=True
    )
    _log(f"Starting vLLM API server on http://{host}:{ns.port}")
    try:
        loop.start()
        _serve_until_stopped(state, ns.shutdown_timeout)
        httpd.shutdown()
    finally:
        httpd.server_close()
        _release(info, kv, fds)
        _log("Shutting down")
    return 0


def _release(info: Mapping[str, Any], kv: Any, fds: Sequence[int]) -> None:
    """Close what the server holds: its group's sockets, its side channels, its device locks."""
    if info.get("group") is not None:
        info["group"].close()
    if kv is not None:
        kv.close()
    for fd in fds:
        os.close(fd)


def _headless(info: Mapping[str, Any], kv: Any, fds: Sequence[int]) -> int:
    """A headless rank: no API server; it runs (or, once its head died, hangs: vllm#32136)
    until SIGTERM or SIGINT, then exits 0 as vLLM's ``run_headless`` does."""
    signum = signal.sigwait(SHUTDOWN_SIGNALS)
    _log(f"Received {signal.Signals(signum).name}: shutting down the headless engines")
    _release(info, kv, fds)
    _log("Shutting down.")
    return 0


def _serve_until_stopped(state: _State, timeout: int) -> None:
    """Serve until SIGTERM or SIGINT (then vLLM's shutdown), or until the group's engine died
    (a rank went away): vLLM's watchdog then stops the API server within
    ``VLLM_WATCHDOG_TIME_S`` (5 s) and the process exits 0 (vllm#48966), unless
    ``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH`` is set (then it stays, its /health at 503)."""
    group = state.group
    keep_alive = state.env.get("VLLM_KEEP_ALIVE_ON_ENGINE_DEATH", "0").strip() not in ("", "0")
    died: float | None = None
    while True:
        info = signal.sigtimedwait(SHUTDOWN_SIGNALS, 0.2)
        if info is not None:
            _shut_down(state, info.si_signo, timeout)
            return
        if group is None or not group.dead.is_set() or keep_alive:
            continue
        died = time.monotonic() if died is None else died
        if time.monotonic() - died >= WATCHDOG_SECONDS:
            _log(
                "[shutdown] MPClient: engine core exited unexpectedly; starting cleanup", "WARNING"
            )
            state.requests.shut_down(0)
            return


def _shut_down(state: _State, signum: int, timeout: int) -> None:
    """vLLM's shutdown after ``signum`` (:mod:`vllm.lifecycle`): no new request, the requests in
    flight drained for up to ``timeout`` seconds (0: not at all), the rest aborted."""
    _log(f"[shutdown] API server: shutdown triggered ({signal.Signals(signum).name})")
    mode = "drain" if timeout > 0 else "abort"
    _log(f"[shutdown] API server: stopping engine client mode={mode} timeout={timeout}s")
    in_flight, aborted = state.requests.shut_down(timeout)
    _log(f"[shutdown] API server: engine client stopped ({in_flight} requests in flight at the "
         f"signal, {aborted} aborted)")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    """Console script ``vllm``: only ``serve`` and ``--version`` are simulated."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args in (["--version"], ["-v"]):
        print(VERSION)
        return 0
    if not args or args[0] != "serve":
        top = FlexibleArgumentParser(prog="vllm")
        top.add_argument("subcommand", choices=["serve"])
        top.parse_args(args[:1])
        return 2
    try:  # through vLLM's own entry point objects (vllm.entrypoints.cli.main)
        from .entrypoints.cli.main import _build

        parser, cmds = _build()
        try:  # what the parse and the subcommand's validate raise: vLLM's traceback, exit 1
            ns = parser.parse_args(args)
            cmds[ns.subparser].validate(ns)
        except (IndexError, TypeError, ValueError, OSError, VLLMError) as exc:
            raise SimError(f"{type(exc).__name__}: {exc}") from None
        return int(ns.dispatch_function(ns) or 0)
    except SimError as exc:
        sys.stderr.write(f"ERROR {time.strftime('%m-%d %H:%M:%S')} [sim] {exc}\n")
        return exc.code
    except SystemExit as exc:
        return int(exc.code or 0) if not isinstance(exc.code, str) else 1


if __name__ == "__main__":
    sys.exit(main())
