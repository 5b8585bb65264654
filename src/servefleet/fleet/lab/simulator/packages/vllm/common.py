"""What the simulated vllm's modules share: which build this copy is (``build.json``), the
simulation's paths under /etc/rbln-sim, /run/rbln-sim and /var/log/rbln-sim (``$RBLN_SIM_ROOT``),
the RBLNConfig and vLLM config fields, :class:`SimError`, the host's platform word and the log
line. A SIMULATION for the servefleet lab (see :mod:`vllm.sim`)."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

BUILD_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "build.json")
CPU_BUILD = {"version": "0.30.0+cpu", "device": "cpu"}  # the RBLN stack's vllm


def wheel_build(path: str = BUILD_FILE) -> dict[str, str]:
    """Which build this copy is: ``{"version", "device"}`` from ``build.json`` (``device`` is
    ``cpu``, the RBLN stack's, or ``cuda``, PyPI's, which adds ``torch``: the torch version it is
    built against); the CPU build when there is no such file.

    + path: the build file
    """
    try:
        with open(path) as fh:
            build: dict[str, str] = json.load(fh)
    except FileNotFoundError:
        return dict(CPU_BUILD)
    if build.get("device") not in ("cpu", "cuda") or not build.get("version"):
        raise RuntimeError(f"{path} is not a build of the simulated vllm: {build!r}")
    return build


BUILD = wheel_build()
VERSION = BUILD["version"]
SIM_ROOT_ENV = "RBLN_SIM_ROOT"
SIM_ETC = "/etc/rbln-sim"
SIM_RUN = "/run/rbln-sim"
SIM_LOG = "/var/log/rbln-sim"
DEFAULT_COMPILE_SECONDS = 3.0
DEFAULT_LOAD_SECONDS = 2.0  # the CUDA build's weight loading (/etc/rbln-sim/load-seconds)
NO_CUDA_GPU = "RuntimeError: No CUDA GPUs are available"
PROG = "vllm serve"
FLAGS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "flags")
# /etc/rbln-sim/platform word -> the dump of the real parser for that platform
PLATFORMS = {"rbln": "vllm-0.30.0-rbln-0.12.0.json", "upstream": "vllm-0.30.0-upstream.json"}
DEFAULT_PLATFORM = "rbln"
ENVS_FILE = "vllm-0.30.0-envs.json"
# What the platform fills in for an argument left unset (vllm-rbln: --max-num-seqs 1)
PLATFORM_DEFAULTS: dict[str, dict[str, Any]] = {"rbln": {"max_num_seqs": 1}, "upstream": {}}


def sim_path(env: Mapping[str, str], path: str) -> str:
    """A simulation path, moved under ``$RBLN_SIM_ROOT`` when that is set.

    + env: the environment to read RBLN_SIM_ROOT from
    + path: an absolute path such as /etc/rbln-sim/fail-start
    """
    root = env.get(SIM_ROOT_ENV, "")
    return os.path.join(root, path.lstrip("/")) if root else path


# RBLNConfig fields: (field, the env vars still honoured in 0.12, first found wins, default),
# as vllm_rbln/config.py has them (checked by tests/realvllm/test_trusted.py)
RBLN_FIELDS: list[tuple[str, tuple[str, ...], Any]] = [
    (
        "num_devices_per_local_rank",
        ("VLLM_RBLN_NUM_DEVICES_PER_LOCAL_RANK", "VLLM_RBLN_TP_SIZE"),
        1,
    ),
    ("use_custom_sampler", ("VLLM_RBLN_SAMPLER",), True),
    ("sub_block_size", ("VLLM_RBLN_SUB_BLOCK_SIZE",), None),
    ("enforce_model_fp32", ("VLLM_RBLN_ENFORCE_MODEL_FP32",), False),
    ("use_batch_attn_opt", ("VLLM_RBLN_BATCH_ATTN_OPT",), False),
    ("use_custom_kernel", ("RBLN_USE_CUSTOM_KERNEL",), False),
    ("use_dynamic_kv_cache", ("VLLM_RBLN_USE_DYNAMIC_KV_CACHE",), None),  # unset: the path decides
    ("enable_sub_block_cache", ("VLLM_RBLN_SUB_BLOCK_CACHE",), True),
    ("specialize_moe_decode", ("VLLM_RBLN_SPECIALIZE_MOE_DECODE",), True),
    ("use_moe_tokens_mask", ("VLLM_RBLN_USE_MOE_TOKENS_MASK",), True),
    ("use_all2all_dispatch", ("VLLM_RBLN_DISPATCH_ALL2ALL",), False),
    ("use_all2all_combine", ("VLLM_RBLN_COMBINE_ALL2ALL",), False),
    ("decode_batch_bucket_strategy", ("VLLM_RBLN_DECODE_BATCH_BUCKET_STRATEGY",), "exponential"),
    ("decode_batch_bucket_min", ("VLLM_RBLN_DECODE_BATCH_BUCKET_MIN",), 1),
    ("decode_batch_bucket_step", ("VLLM_RBLN_DECODE_BATCH_BUCKET_STEP",), 2),
    ("decode_batch_bucket_limit", ("VLLM_RBLN_DECODE_BATCH_BUCKET_LIMIT",), 1),
    ("decode_batch_bucket_manual_buckets", ("VLLM_RBLN_DECODE_BATCH_BUCKET_MANUAL_BUCKETS",), []),
    ("use_w8a8", ("VLLM_RBLN_USE_W8A8",), False),
    ("compile_dtype", (), ""),  # a flag only: no variable sets it
]
# RBLN options that do not key the compile cache (sampler graphs compile every start)
RBLN_UNCACHED = {"use_custom_sampler", "enable_sub_block_cache", "sub_block_size"}
# The three env vars the mega-cache hashes as env
COMPILE_ENV = [
    "VLLM_RBLN_USE_VLLM_MODEL",
    "VLLM_RBLN_NUM_HIDDEN_LAYERS",
    "VLLM_RBLN_USE_DEVICE_TENSOR",
]
# Not in COMPILE_ENV on purpose: a bundle compiled on a dummy device must hit on the NPU host
COMPILE_ONLY_ENV = "VLLM_RBLN_COMPILE_ONLY"
# The target NPU's name when none is used: the current variable first, then its legacy name
NPU_NAME_ENV = ("RBLN_FORCE_NPU_NAME", "RBLN_TARGET_SOC")
BUNDLE_PAYLOAD_BYTES = 4096
BUNDLE_FIELDS = {"simulated", "model", "sig", "payload", "payload_sha256"}
# vLLM config fields (parsed, defaults applied) that enter the config hash. Frontend-only
# settings (host, port, served-model-name, parsers, tool choice, seed), prefix caching and the
# connector's own settings are deliberately absent.
CONFIG_FIELDS = [
    "model", "dtype", "max_model_len", "max_num_batched_tokens", "block_size", "kv_cache_dtype",
    "quantization", "model_impl", "trust_remote_code", "enforce_eager", "disable_sliding_window",
    "language_model_only", "mm_encoder_tp_mode", "mm_encoder_attn_dtype", "tensor_parallel_size",
    "pipeline_parallel_size", "data_parallel_size", "enable_expert_parallel",
    "distributed_executor_backend", "attention_backend", "attention_config", "linear_backend",
    "moe_backend", "compilation_config", "kernel_config", "hf_overrides", "additional_config",
]  # fmt: skip
# Not in CONFIG_FIELDS: enable_chunked_prefill (SchedulerConfig.compute_hash hashes only
# max_num_batched_tokens and max_num_seqs, and vllm-rbln refuses it off)


class SimError(Exception):
    """A start-up failure: printed as one line, exit status ``code``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def sim_platform(env: Mapping[str, str]) -> str:
    """The flag table of this host: the word in /etc/rbln-sim/platform, ``rbln`` by default.

    + env: the environment (RBLN_SIM_ROOT)
    """
    path = sim_path(env, SIM_ETC + "/platform")
    try:
        with open(path) as fh:
            name = fh.read().strip() or DEFAULT_PLATFORM
    except FileNotFoundError:
        return DEFAULT_PLATFORM
    if name not in PLATFORMS:
        raise SimError(f"{path} names platform {name!r}; expected one of {', '.join(PLATFORMS)}")
    return name


def _log(message: str, level: str = "INFO") -> None:
    sys.stderr.write(f"{level} {time.strftime('%m-%d %H:%M:%S')} [sim] {message}\n")
    sys.stderr.flush()
