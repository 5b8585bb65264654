"""The compile cache key of a ``vllm serve`` command line (after the description of vllm-rbln
0.12's mega-cache), the NPUs RBLN_VISIBLE_DEVICES names, and where the bundle of a key lives. A
SIMULATION for the servefleet lab."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from .common import COMPILE_ENV, CONFIG_FIELDS, RBLN_FIELDS, RBLN_UNCACHED, SimError
from .flag_table import _object, parse_serve_args


def _env_bool(text: str) -> bool:
    return text.strip().lower() in ("1", "true")


def _rbln_options(ns: argparse.Namespace, env: Mapping[str, str]) -> dict[str, Any]:
    """RBLNConfig: a flag wins over the (deprecated) env var, which wins over the default."""
    opts: dict[str, Any] = {}
    extra = _object(ns.additional_config)
    for field, names, default in RBLN_FIELDS:
        flag = getattr(ns, "rbln_" + field, None)  # the upstream table has no --rbln-* flags
        var = next((name for name in names if name in env), None)
        if flag is not None:
            value = flag
        elif field in extra:
            value = extra[field]
        elif var is not None:
            raw = env[var]
            if isinstance(default, bool) or field == "use_dynamic_kv_cache":
                value = _env_bool(raw)
            elif isinstance(default, int):
                value = int(raw)
            elif field == "sub_block_size":
                value = int(raw) if raw else None
            elif isinstance(default, list):
                value = [int(bucket) for bucket in raw.split(",")]
            else:
                value = raw
        else:
            value = default
        opts[field] = value
    return opts


def visible_devices(env: Mapping[str, str]) -> list[int] | None:
    """The NPU indexes in ``RBLN_VISIBLE_DEVICES`` (deprecated alias RBLN_DEVICES), or None."""
    raw = env.get("RBLN_VISIBLE_DEVICES", env.get("RBLN_DEVICES"))
    if raw is None or not raw.strip():
        return None
    try:
        return [int(x) for x in raw.split(",") if x.strip()]
    except ValueError:
        raise SimError(
            f"RBLN_VISIBLE_DEVICES={raw!r}: expected a comma list of NPU indexes"
        ) from None


def _key_factors(
    ns: argparse.Namespace,
    env: Mapping[str, str],
    npu_name: str,
    rebel_version: str,
    num_devices: int,
) -> dict[str, Any]:
    config = {field: getattr(ns, field) for field in CONFIG_FIELDS}
    if isinstance(config.get("additional_config"), dict):
        fields = {f for f, _, _ in RBLN_FIELDS}
        config["additional_config"] = {
            k: v for k, v in config["additional_config"].items() if k not in fields
        }
    rbln = {k: v for k, v in _rbln_options(ns, env).items() if k not in RBLN_UNCACHED}
    spec = _object(ns.speculative_config)
    draft = spec.get("model")
    major_minor = ".".join(rebel_version.split("+")[0].split(".")[:2])
    return {
        "vllm_config": config,
        "kv_transfer": "present" if ns.kv_transfer_config is not None else "None",
        "max_num_seqs": ns.max_num_seqs,
        "num_gpu_blocks_override": ns.num_gpu_blocks_override,
        "gpu_memory_utilization": ns.gpu_memory_utilization,
        # RBLNConfig.compute_hash: unset and True build the same graph
        "dynamic_kv": rbln.pop("use_dynamic_kv_cache") is not False,
        "rbln": rbln,
        # OptimumRBLNConfig.compute_hash (the optimum path's RBLN options) hashes it
        "optimum_overrides": getattr(ns, "rbln_optimum_overrides", None),
        "spec_method": spec.get("method"),
        "spec_tokens": spec.get("num_speculative_tokens"),
        "draft_model": hashlib.sha1(draft.encode()).hexdigest() if draft else None,
        "draft_tp": spec.get("draft_tensor_parallel_size"),
        "env": {var: env.get(var) for var in COMPILE_ENV},
        "npu": npu_name,
        "rebel": major_minor,
        "devices": num_devices,
    }


def _strip_launcher(argv: Sequence[str]) -> list[str]:
    items = list(argv)
    if items and os.path.basename(items[0]) == "vllm":
        items = items[1:]
    if items and items[0] == "serve":
        items = items[1:]
    return items


def cache_key(
    argv: Sequence[str],
    env: Mapping[str, str],
    npu_name: str,
    rebel_version: str,
    num_devices: int | None = None,
) -> str:
    """The 16-hex compile signature of a ``vllm serve`` command line.

    + argv: the command line; a leading ``vllm`` and ``serve`` are skipped
    + env: the server's environment (compile env vars, RBLN_VISIBLE_DEVICES, VLLM_RBLN_*)
    + npu_name: the NPU SKU as rbln-smi names it, e.g. RBLN-CR13
    + rebel_version: the installed rebel-compiler version (only major.minor counts)
    + num_devices: NPUs of this server; default: the entries of RBLN_VISIBLE_DEVICES, else 1
    """
    ns = parse_serve_args(_strip_launcher(argv), "rbln")  # the mega-cache is vllm-rbln's
    return _signature(ns, env, npu_name, rebel_version, num_devices)


def _signature(
    ns: argparse.Namespace,
    env: Mapping[str, str],
    npu_name: str,
    rebel_version: str,
    num_devices: int | None,
) -> str:
    if num_devices is None:
        devices = visible_devices(env)
        num_devices = len(devices) if devices else 1
    factors = _key_factors(ns, env, npu_name, rebel_version, num_devices)
    blob = json.dumps(factors, sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


def bundle_path(cache_root: str, model: str, sig: str) -> str:
    """``<cache_root>/rbln/<sanitized-model>-<sha1(model)[:8]>/<sig>/rank0/mega_cache.bin``.

    + cache_root: $VLLM_CACHE_ROOT
    + model: the model string as given
    + sig: the 16-hex signature
    """
    sanitized = re.sub(r"[^A-Za-z0-9._-]", "_", model)
    model_dir = f"{sanitized}-{hashlib.sha1(model.encode()).hexdigest()[:8]}"
    return os.path.join(cache_root, "rbln", model_dir, sig, "rank0", "mega_cache.bin")


def cache_root(env: Mapping[str, str]) -> str:
    """$VLLM_CACHE_ROOT, else $XDG_CACHE_HOME/vllm, else ~/.cache/vllm (vLLM's rule)."""
    if env.get("VLLM_CACHE_ROOT"):
        return env["VLLM_CACHE_ROOT"]
    xdg = env.get("XDG_CACHE_HOME") or os.path.join(
        env.get("HOME", os.path.expanduser("~")), ".cache"
    )
    return os.path.join(xdg, "vllm")
