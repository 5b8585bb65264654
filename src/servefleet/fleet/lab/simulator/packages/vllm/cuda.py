"""The CUDA build (vllm 0.30.0 from PyPI, on GPU hosts): torch's CUDA build, nvidia-smi's GPUs as
CUDA_VISIBLE_DEVICES shows them, the parallel sizes' GPUs (this node's share of them across
nodes) and their memory claims, the group's rendezvous, the simulated weight loading. A
SIMULATION for the servefleet lab."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import importlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from .checks import _import, _open_lock, check_reasoning_parser, fault_switch, find_snapshot
from .common import (
    BUILD,
    DEFAULT_LOAD_SECONDS,
    NO_CUDA_GPU,
    SIM_ETC,
    SIM_RUN,
    VERSION,
    SimError,
    _log,
    sim_path,
)
from .flag_table import _object
from .group_head import join_group
from .parallel_plan import Plan, group_args


def check_cuda_packages(ns: argparse.Namespace) -> dict[str, Any]:
    """Import what the CUDA build needs: torch, the exact CUDA build vLLM's kernels are linked
    against (a ``+cpu`` torch or another version does not load them), and what the arguments
    ask for (arctic-inference for ``suffix``, lmcache/nixl for their connectors). vllm-rbln is
    never imported; its connectors are unknown to upstream vLLM.

    + ns: the parsed arguments
    """
    torch = _import("torch", f"vllm {VERSION} runs on torch")
    found = str(getattr(torch, "__version__", "?"))
    base, _, local = found.partition("+")
    want = BUILD.get("torch", "")
    if (local and not local.startswith("cu")) or (want and base != want):
        raise SimError(
            f"ImportError: {os.path.dirname(os.path.abspath(__file__))}/_C.abi3.so: undefined "
            f"symbol: _ZN3c104cuda9SetDeviceEab (vllm {VERSION} is built against torch {want} "
            f"with CUDA; this is torch {found})"
        )
    mods = {"torch": torch}
    connector = str(_object(ns.kv_transfer_config).get("kv_connector", ""))
    if connector.startswith("RBLN"):
        raise SimError(f"ValueError: Unsupported connector type: {connector}")
    if "lmcache" in connector.lower():
        mods["lmcache"] = _import("lmcache", f"kv_connector {connector} needs lmcache")
    if "nixl" in connector.lower():
        mods["nixl"] = _import("nixl", f"kv_connector {connector} needs nixl")
    if _object(ns.speculative_config).get("method") == "suffix":
        mods["arctic_inference"] = _import(
            "arctic_inference", "speculative method 'suffix' needs arctic-inference"
        )
        _import("arctic_inference.suffix_decoding", "speculative method 'suffix'")
    return mods


def nvidia_smi(env: Mapping[str, str]) -> list[dict[str, Any]]:
    """The host's GPUs as ``nvidia-smi`` (found on the server's PATH) lists them: index, uuid,
    name, memory_total_mib, pci_bus_id. No nvidia-smi, or one that fails: no CUDA GPU.

    + env: the server's environment
    """
    exe = shutil.which("nvidia-smi", path=env.get("PATH", os.defpath))
    if exe is None:
        raise SimError(f"{NO_CUDA_GPU} (nvidia-smi not found: is the NVIDIA driver installed?)")
    fields = "index,uuid,name,memory.total,pci.bus_id"
    proc = subprocess.run(
        [exe, f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        env=dict(env),
    )
    if proc.returncode != 0:
        why = (proc.stdout.strip() or proc.stderr.strip()).splitlines()[:1] or ["no output"]
        raise SimError(f"{NO_CUDA_GPU} (nvidia-smi exited {proc.returncode}: {why[0]})")
    gpus = []
    for line in proc.stdout.splitlines():
        index, uuid, name, total, bus = (part.strip() for part in line.split(","))
        gpus.append(
            {
                "index": int(index),
                "uuid": uuid,
                "name": name,
                "memory_total_mib": int(total),
                "pci_bus_id": bus,
            }
        )
    return gpus


def visible_gpus(env: Mapping[str, str], gpus: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The GPUs this process sees, in CUDA's order: every GPU, or those ``CUDA_VISIBLE_DEVICES``
    names (indexes, or ``GPU-`` UUIDs or unique prefixes of them), in its order. Set but empty, it
    hides every GPU. An entry naming no GPU is refused (CUDA would silently drop it and every
    entry after it); so is a repeated one.

    + env: the server's environment
    + gpus: the host's GPUs (:func:`nvidia_smi`)
    """
    if not gpus:
        raise SimError(f"{NO_CUDA_GPU} (nvidia-smi lists no GPU)")
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return list(gpus)
    listed = ", ".join(str(g["index"]) for g in gpus)
    if not raw.strip():
        raise SimError(f"{NO_CUDA_GPU} (CUDA_VISIBLE_DEVICES is set and empty: no GPU is visible)")
    chosen: list[dict[str, Any]] = []
    for position, item in enumerate(part.strip() for part in raw.split(",")):
        if item.startswith("GPU-"):
            found = [g for g in gpus if g["uuid"].startswith(item)]
        else:
            found = [g for g in gpus if str(g["index"]) == item]
        if len(found) != 1 or found[0] in chosen:
            why = "names it twice" if found and found[0] in chosen else "names no GPU of this host"
            prefix = NO_CUDA_GPU if position == 0 else "RuntimeError: CUDA_VISIBLE_DEVICES"
            raise SimError(
                f"{prefix} (CUDA_VISIBLE_DEVICES={raw!r}: entry {item!r} {why}; nvidia-smi "
                f"lists GPUs {listed}; CUDA would ignore it and every entry after it)"
            )
        chosen.append(found[0])
    return chosen


def gpus_needed(
    ns: argparse.Namespace, env: Mapping[str, str], visible: Sequence[dict[str, Any]], plan: Plan
) -> list[dict[str, Any]]:
    """The visible GPUs this server uses: a DP rank's workers on this node (tensor x pipeline
    parallel size, or its share of them across ``--nnodes``) for each local DP rank, refused
    as vLLM refuses when they are not there.

    + ns: the parsed arguments
    + env: the server's environment (CUDA_VISIBLE_DEVICES, for vLLM's message)
    + visible: the visible GPUs (:func:`visible_gpus`)
    + plan: where the server stands (:func:`vllm.parallel_plan.plan_of`)
    """
    tp, pp, dp = ns.tensor_parallel_size, ns.pipeline_parallel_size, ns.data_parallel_size
    for name, value in (("tensor", tp), ("pipeline", pp), ("data", dp)):
        if value < 1:
            raise SimError(f"ValueError: {name} parallel size must be at least 1, got {value}")
    if ns.distributed_executor_backend == "ray":
        try:
            importlib.import_module("ray")
        except ImportError as exc:
            raise SimError(
                f"ValueError: Failed to import Ray: {exc}. Please install Ray with `pip install "
                "ray`."
            ) from None
    world, dp_local = plan.local_world, plan.dp_local
    if plan.nnodes == 1 and tp * pp > len(visible):
        raise SimError(
            "pydantic_core._pydantic_core.ValidationError: 1 validation error for ParallelConfig: "
            f"Value error, World size ({tp * pp}) is larger than the number of available GPUs "
            f"({len(visible)}) in this node. If this is intentional and you are using: - ray, "
            "set '--distributed-executor-backend ray'. - multiprocessing, set '--nnodes' "
            "appropriately."
        )
    if plan.nnodes_within_dp > 1 and world > len(visible):  # the worker's device check
        raise SimError(
            f"AssertionError: DP adjusted local rank {len(visible)} is out of bounds for "
            f"{len(visible)} devices."
        )
    if world * dp_local > len(visible):
        rank = len(visible) // world  # the first local DP rank whose GPUs are not there
        if rank == 0:
            raise SimError(
                f"AssertionError: DP adjusted local rank {len(visible)} is out of bounds for "
                f"{len(visible)} devices."
            )
        raise SimError(
            "Exception: Error setting CUDA_VISIBLE_DEVICES: local range: "
            f"[{rank * world}, {(rank + 1) * world}) base value: "
            f'"{env.get("CUDA_VISIBLE_DEVICES")}"'
        )
    return list(visible[: world * dp_local])


def gpu_claims(folder: str, clean: bool = False) -> list[dict[str, Any]]:
    """The live claims in a GPU's claim folder: each ``<pid>.json`` held under an exclusive
    flock by its server. A file nobody holds is a dead server's: ignored, or removed with clean.

    + folder: /run/rbln-sim/cuda<index>
    + clean: remove dead servers' files
    """
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        return []
    live = []
    for name in names:
        path = os.path.join(folder, name)
        if not name.endswith(".json"):
            continue
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            with os.fdopen(os.dup(fd)) as fh, contextlib.suppress(ValueError):
                claim = json.loads(fh.read() or "{}")
                if isinstance(claim, dict) and isinstance(claim.get("mib"), int):
                    live.append(claim)
        else:
            if clean:
                with contextlib.suppress(OSError):
                    os.unlink(path)
        finally:
            os.close(fd)
    return live


def _gib(mib: float) -> float:
    return round(mib / 1024, 2)


def claim_gpus(
    ns: argparse.Namespace, env: Mapping[str, str], gpus: Sequence[dict[str, Any]]
) -> list[int]:
    """Claim ``--gpu-memory-utilization`` of each GPU's memory: a ``<pid>.json`` in
    /run/rbln-sim/cuda<index>/ held under an exclusive flock until this process ends (what
    nvidia-smi shows as used). Refused as vLLM refuses when the GPU's free memory (its total
    less the live claims) is less than that; returns the claims' fds.

    + ns: the parsed arguments
    + env: the server's environment (RBLN_SIM_ROOT)
    + gpus: the GPUs this server uses (:func:`gpus_needed`), in its device order
    """
    utilization = ns.gpu_memory_utilization
    if not 0 < utilization <= 1:
        raise SimError(
            "pydantic_core._pydantic_core.ValidationError: 1 validation error for CacheConfig: "
            f"gpu_memory_utilization Input should be greater than 0 and less than or equal to 1 "
            f"[input_value={utilization}]"
        )
    run_dir = sim_path(env, SIM_RUN)
    os.makedirs(run_dir, exist_ok=True)
    fds: list[int] = []
    try:
        for position, gpu in enumerate(gpus):
            folder = os.path.join(run_dir, f"cuda{gpu['index']}")
            os.makedirs(folder, exist_ok=True)
            with contextlib.suppress(OSError):  # servers of any user claim here
                os.chmod(folder, 0o1777)
            mutex = _open_lock(os.path.join(run_dir, f"cuda{gpu['index']}.lock"))
            try:
                fcntl.flock(mutex, fcntl.LOCK_EX)
                total = gpu["memory_total_mib"]
                held = gpu_claims(folder, clean=True)
                free = total - sum(c["mib"] for c in held)
                want = int(total * utilization)
                if free < want:
                    for c in held:
                        _log(
                            f"GPU {gpu['index']} ({gpu['uuid']}): {c['mib']} MiB held by pid "
                            f"{c.get('pid')} (vllm on port {c.get('port')})"
                        )
                    raise SimError(
                        f"ValueError: Free memory on device cuda:{position} "
                        f"({_gib(free)}/{_gib(total)} GiB) on startup is less than desired GPU "
                        f"memory utilization ({utilization}, {_gib(want)} GiB). Decrease GPU "
                        "memory utilization or reduce GPU memory used by other processes."
                    )
                path = os.path.join(folder, f"{os.getpid()}.json")
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fds.append(fd)
                claim = {"pid": os.getpid(), "mib": want, "port": ns.port}
                claim["process"] = sys.executable
                os.write(fd, json.dumps(claim).encode())
            finally:
                os.close(mutex)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return fds


def load_seconds(env: Mapping[str, str]) -> float:
    """How long the CUDA build "loads" the weights: /etc/rbln-sim/load-seconds, else 2.

    + env: the environment (RBLN_SIM_ROOT)
    """
    try:
        with open(sim_path(env, SIM_ETC + "/load-seconds")) as fh:
            return float(fh.read().strip())
    except (OSError, ValueError):
        return DEFAULT_LOAD_SECONDS


def start_cuda(
    ns: argparse.Namespace, env: Mapping[str, str], plan: Plan, platform: str
) -> tuple[dict[str, Any], list[int]]:
    """The CUDA build's start (``vllm 0.30.0``; upstream flag table): torch's CUDA build,
    ``nvidia-smi``'s GPUs as ``CUDA_VISIBLE_DEVICES`` shows them, the model (and draft) in the HF
    cache, this node's GPUs for its part of the parallel sizes, the fail-start switch, the
    GPUs' memory claimed, the group's rendezvous when it has one (:mod:`vllm.rendezvous`), then
    /etc/rbln-sim/load-seconds of "loading" and, in a group, every rank ready. No compile, no
    mega-cache, no vllm-rbln. Returns the server's info (``group``: its part in the group, or
    None) and its claims' fds.

    + ns: the parsed arguments
    + env: the server's environment
    + plan: where the server stands (:func:`vllm.parallel_plan.plan_of`)
    + platform: the flag table's name
    """
    check_cuda_packages(ns)
    visible = visible_gpus(env, nvidia_smi(env))
    find_snapshot(env, ns.model)
    draft = _object(ns.speculative_config).get("model")
    if draft:
        find_snapshot(env, str(draft))
    check_reasoning_parser(ns)  # the engine's config, once the tokenizer is read
    used = gpus_needed(ns, env, visible, plan)
    switch = fault_switch(env, "fail-start", sys.argv)
    if switch is not None:
        raise SimError(f"simulated start failure: {switch}")
    fds = claim_gpus(ns, env, used)
    indexes = [g["index"] for g in used]
    _log(
        f"CUDA GPUs {indexes} ({used[0]['name'] if used else 'none'}), "
        f"CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES')!r}, "
        f"{ns.gpu_memory_utilization} of their memory claimed"
    )
    group = join_group(plan, group_args(ns), list(sys.argv), platform, env)
    seconds = load_seconds(env)
    _log(f"Starting to load model {ns.model}...")
    time.sleep(seconds)
    _log(f"Loading weights took {seconds:.2f} seconds (simulated)")
    if group is not None:
        if plan.group == "nodes" and not plan.headless and plan.node_rank_within_dp > 0:
            # an API server on a follower node: its engine asks its executor for the KV cache
            raise SimError(
                "AssertionError: collective_rpc should not be called on follower node "
                "(RuntimeError: Engine core initialization failed. See root cause above. "
                "Failed core proc(s): {'EngineCore': 1})"
            )
        group.ready()
    info = {"compiled": False, "bundle": None, "sig": None, "gpus": indexes, "group": group}
    return info, fds
