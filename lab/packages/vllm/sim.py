"""Simulated ``vllm serve``: a SIMULATION for the servefleet lab, shipped in the lab's fake
``vllm 0.30.0+cpu`` wheel (console script ``vllm``). It is not vLLM and serves no model.

It behaves like a vLLM 0.30 + vllm-rbln 0.12 server from the outside: a closed, typed flag
table (exit 2 on anything else), import checks of the RBLN packages, a Hugging Face cache
check, NPU selection through ``RBLN_VISIBLE_DEVICES`` and ``rbln-smi -j``, a simulated compile
keyed like vllm-rbln's mega-cache, and an OpenAI-style HTTP API. Standard library only.

Every path under /etc/rbln-sim, /run/rbln-sim and /var/log/rbln-sim is prefixed by
``$RBLN_SIM_ROOT`` when that is set (tests only; a deploy never sets it).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import http.server
import importlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

VERSION = "0.30.0+cpu"
SIM_ROOT_ENV = "RBLN_SIM_ROOT"
SIM_ETC = "/etc/rbln-sim"
SIM_RUN = "/run/rbln-sim"
SIM_LOG = "/var/log/rbln-sim"
DEFAULT_COMPILE_SECONDS = 3.0
PROG = "vllm serve"


def sim_path(env: Mapping[str, str], path: str) -> str:
    """A simulation path, moved under ``$RBLN_SIM_ROOT`` when that is set.

    + env: the environment to read RBLN_SIM_ROOT from
    + path: an absolute path such as /etc/rbln-sim/fail-start
    """
    root = env.get(SIM_ROOT_ENV, "")
    return os.path.join(root, path.lstrip("/")) if root else path


# ---------------------------------------------------------------------------------------------
# The closed flag table (vLLM 0.30 value types; vllm-rbln 0.12 adds the --rbln-* flags)

_KV_CACHE_DTYPES = ["auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla"]
_DTYPES = ["auto", "half", "float16", "bfloat16", "float", "float32"]

# (flags, kind, choices or None, default). kind: int, hint (int with k/m/g suffix), float, str,
# choice, bool (--x/--no-x), json (a JSON object), names (one or more strings)
FLAGS: list[tuple[tuple[str, ...], str, list[str] | None, Any]] = [
    (("--host",), "str", None, "0.0.0.0"),
    (("--port",), "int", None, 8000),
    (("--model",), "str", None, None),
    (("--served-model-name",), "names", None, None),
    (("--dtype",), "choice", _DTYPES, "auto"),
    (("--seed",), "int", None, None),
    (("--max-model-len",), "hint", None, None),
    (("--max-num-batched-tokens",), "hint", None, None),
    (("--max-num-seqs",), "int", None, 1),  # vllm-rbln's default (upstream: 256)
    (("--block-size",), "int", None, None),
    (("--gpu-memory-utilization",), "float", None, 0.93),  # vllm-rbln's default
    (("--num-gpu-blocks-override",), "int", None, None),
    (("--kv-cache-dtype",), "choice", _KV_CACHE_DTYPES, "auto"),
    (("--quantization", "-q"), "str", None, None),
    (("--model-impl",), "choice", ["auto", "vllm", "transformers", "terratorch"], "auto"),
    (("--tokenizer-mode",), "str", None, "auto"),
    (("--trust-remote-code",), "bool", None, False),
    (("--enforce-eager",), "bool", None, False),
    (("--disable-sliding-window",), "bool", None, False),
    (("--enable-prefix-caching",), "bool", None, None),
    (("--enable-chunked-prefill",), "bool", None, None),
    (("--async-scheduling",), "bool", None, None),
    (("--language-model-only",), "bool", None, False),
    (("--mm-encoder-tp-mode",), "choice", ["weights", "data"], "weights"),
    (("--tensor-parallel-size", "-tp"), "int", None, 1),
    (("--pipeline-parallel-size", "-pp"), "int", None, 1),
    (("--data-parallel-size", "-dp"), "int", None, 1),
    (("--data-parallel-size-local", "-dpl"), "int", None, None),
    (("--data-parallel-hybrid-lb",), "bool", None, False),
    (("--enable-expert-parallel", "-ep"), "bool", None, False),
    (
        ("--distributed-executor-backend",),
        "choice",
        ["ray", "mp", "uni", "external_launcher"],
        None,
    ),
    (("--attention-backend",), "str", None, None),
    (("--linear-backend",), "str", None, None),
    (("--moe-backend",), "str", None, None),
    (("--reasoning-parser",), "str", None, None),
    (("--tool-call-parser",), "str", None, None),
    (("--enable-auto-tool-choice",), "bool", None, False),
    (("--tool-server",), "str", None, None),
    (("--speculative-config",), "json", None, None),
    (("--kv-transfer-config",), "json", None, None),
    (("--compilation-config", "-cc"), "json", None, None),
    (("--additional-config",), "json", None, None),
    (("--kernel-config",), "json", None, None),
    (("--hf-overrides",), "json", None, None),
    # vllm-rbln 0.12 RBLNConfig fields (--rbln-<field> / --no-rbln-<field>)
    (("--rbln-num-devices-per-local-rank",), "int", None, None),
    (("--rbln-use-custom-sampler",), "bool", None, None),
    (("--rbln-sub-block-size",), "int", None, None),
    (("--rbln-enforce-model-fp32",), "bool", None, None),
    (("--rbln-use-batch-attn-opt",), "bool", None, None),
    (("--rbln-use-custom-kernel",), "bool", None, None),
    (("--rbln-use-dynamic-kv-cache",), "bool", None, None),
    (("--rbln-enable-sub-block-cache",), "bool", None, None),
    (("--rbln-specialize-moe-decode",), "bool", None, None),
    (("--rbln-use-moe-tokens-mask",), "bool", None, None),
    (("--rbln-use-all2all-dispatch",), "bool", None, None),
    (("--rbln-use-all2all-combine",), "bool", None, None),
    (
        ("--rbln-decode-batch-bucket-strategy",),
        "choice",
        ["exponential", "exp", "linear", "manual"],
        None,
    ),
    (("--rbln-decode-batch-bucket-min",), "int", None, None),
    (("--rbln-decode-batch-bucket-step",), "int", None, None),
    (("--rbln-decode-batch-bucket-limit",), "int", None, None),
    (("--rbln-decode-batch-bucket-manual-buckets",), "str", None, None),
    (("--rbln-use-w8a8",), "bool", None, None),
    (("--rbln-compile-dtype",), "str", None, None),
]

# RBLNConfig fields: (field, env var still honoured in 0.12, default)
RBLN_FIELDS: list[tuple[str, str, Any]] = [
    ("num_devices_per_local_rank", "VLLM_RBLN_NUM_DEVICES_PER_LOCAL_RANK", 1),
    ("use_custom_sampler", "VLLM_RBLN_SAMPLER", True),
    ("sub_block_size", "VLLM_RBLN_SUB_BLOCK_SIZE", None),
    ("enforce_model_fp32", "VLLM_RBLN_ENFORCE_MODEL_FP32", False),
    ("use_batch_attn_opt", "VLLM_RBLN_BATCH_ATTN_OPT", False),
    ("use_custom_kernel", "RBLN_USE_CUSTOM_KERNEL", False),
    ("use_dynamic_kv_cache", "VLLM_RBLN_USE_DYNAMIC_KV_CACHE", True),
    ("enable_sub_block_cache", "VLLM_RBLN_SUB_BLOCK_CACHE", True),
    ("specialize_moe_decode", "VLLM_RBLN_SPECIALIZE_MOE_DECODE", True),
    ("use_moe_tokens_mask", "VLLM_RBLN_USE_MOE_TOKENS_MASK", True),
    ("use_all2all_dispatch", "VLLM_RBLN_DISPATCH_ALL2ALL", False),
    ("use_all2all_combine", "VLLM_RBLN_COMBINE_ALL2ALL", False),
    ("decode_batch_bucket_strategy", "VLLM_RBLN_DECODE_BATCH_BUCKET_STRATEGY", "exponential"),
    ("decode_batch_bucket_min", "VLLM_RBLN_DECODE_BATCH_BUCKET_MIN", 1),
    ("decode_batch_bucket_step", "VLLM_RBLN_DECODE_BATCH_BUCKET_STEP", 2),
    ("decode_batch_bucket_limit", "VLLM_RBLN_DECODE_BATCH_BUCKET_LIMIT", 1),
    ("decode_batch_bucket_manual_buckets", "VLLM_RBLN_DECODE_BATCH_BUCKET_MANUAL_BUCKETS", ""),
    ("use_w8a8", "VLLM_RBLN_USE_W8A8", False),
    ("compile_dtype", "VLLM_RBLN_COMPILE_DTYPE", None),
]
# RBLN options that do not key the compile cache (sampler graphs compile every start)
RBLN_UNCACHED = {"use_custom_sampler", "enable_sub_block_cache", "sub_block_size"}
# The three env vars the mega-cache hashes as env
COMPILE_ENV = [
    "VLLM_RBLN_USE_VLLM_MODEL",
    "VLLM_RBLN_NUM_HIDDEN_LAYERS",
    "VLLM_RBLN_USE_DEVICE_TENSOR",
]
# vLLM config fields (parsed, defaults applied) that enter the config hash. Frontend-only
# settings (host, port, served-model-name, parsers, tool choice, seed), prefix caching and the
# connector's own settings are deliberately absent.
CONFIG_FIELDS = [
    "model", "dtype", "max_model_len", "max_num_batched_tokens", "block_size", "kv_cache_dtype",
    "quantization", "model_impl", "trust_remote_code", "enforce_eager", "disable_sliding_window",
    "enable_chunked_prefill", "language_model_only", "mm_encoder_tp_mode", "tensor_parallel_size",
    "pipeline_parallel_size", "data_parallel_size", "enable_expert_parallel",
    "distributed_executor_backend", "attention_backend", "linear_backend", "moe_backend",
    "compilation_config", "kernel_config", "hf_overrides", "additional_config",
]  # fmt: skip


class SimError(Exception):
    """A start-up failure: printed as one line, exit status ``code``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def _human_int(text: str) -> int:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgG]?)", text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}")
    scale = {"": 1, "k": 1000, "m": 1000**2, "g": 1000**3}[m.group(2).lower()]
    if m.group(2).isupper():
        scale = {"K": 1024, "M": 1024**2, "G": 1024**3}[m.group(2)]
    value = float(m.group(1)) * scale
    if value != int(value):
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}")
    return int(value)


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"invalid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value


_json_object.__name__ = "json"
_human_int.__name__ = "int"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse's format, exit 2
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The ``vllm serve`` parser: the closed flag table, argparse-style errors (exit 2)."""
    parser = _Parser(prog=PROG, allow_abbrev=False, add_help=True)
    parser.add_argument("model_tag", nargs="?", default=None, help="model id or path")
    for flags, kind, choices, default in FLAGS:
        dest = flags[0][2:].replace("-", "_")
        if kind == "bool":
            parser.add_argument(
                *flags, dest=dest, action=argparse.BooleanOptionalAction, default=default
            )
        elif kind == "choice":
            parser.add_argument(*flags, dest=dest, choices=choices, default=default)
        elif kind == "names":
            parser.add_argument(*flags, dest=dest, nargs="+", default=default)
        else:
            conv: Any = {
                "int": int,
                "hint": _human_int,
                "float": float,
                "str": str,
                "json": _json_object,
            }[kind]
            parser.add_argument(*flags, dest=dest, type=conv, default=default)
    return parser


_JSON_FLAGS = {f for flags, kind, _, _ in FLAGS if kind == "json" for f in flags}


def _dotted_value(text: str) -> Any:
    if text in ("True", "False"):
        return text == "True"
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _preprocess(argv: Sequence[str]) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """vLLM's FlexibleArgumentParser niceties: ``--a_b`` == ``--a-b``, and dotted overrides of
    JSON flags (``-cc.pass_config.x=True``, ``--kernel-config.y=False``)."""
    out: list[str] = []
    dotted: dict[str, dict[str, Any]] = {}
    items = list(argv)
    i = 0
    while i < len(items):
        arg = items[i]
        i += 1
        if not arg.startswith("-") or arg == "--" or re.fullmatch(r"-\d.*", arg):
            out.append(arg)
            continue
        name, eq, value = arg.partition("=")
        if name.startswith("--"):
            name = "--" + name[2:].replace("_", "-") if "." not in name else name
        base, dot, path = name.partition(".")
        if dot and base.replace("_", "-") in _JSON_FLAGS:
            base = base.replace("_", "-")
            if not eq:
                if i >= len(items):
                    _Parser(prog=PROG).error(f"argument {name}: expected one argument")
                value = items[i]
                i += 1
            node = dotted.setdefault(base, {})
            keys = path.split(".")
            for key in keys[:-1]:
                node = node.setdefault(key, {})
            node[keys[-1]] = _dotted_value(value)
            continue
        out.append(name + eq + value if eq else name)
    return out, dotted


def _merge(into: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value
    return into


def parse_serve_args(argv: Sequence[str]) -> argparse.Namespace:
    """Parse the arguments after ``vllm serve`` (exits 2 on an unknown flag or bad value).

    + argv: the arguments after ``serve``
    """
    args, dotted = _preprocess(argv)
    ns = build_parser().parse_args(args)
    for flag, extra in dotted.items():
        dest = next(f for f, _, _, _ in FLAGS if flag in f)[0][2:].replace("-", "_")
        setattr(ns, dest, _merge(getattr(ns, dest) or {}, extra))
    if ns.model_tag and ns.model and ns.model_tag != ns.model:
        _Parser(prog=PROG).error("the model is given both as positional and as --model")
    ns.model = ns.model_tag or ns.model
    if not ns.model:
        _Parser(prog=PROG).error("the following arguments are required: model_tag")
    return ns


# ---------------------------------------------------------------------------------------------
# The compile cache key (after the description of vllm-rbln 0.12's mega-cache)


def _env_bool(text: str) -> bool:
    return text.strip().lower() in ("1", "true")


def _rbln_options(ns: argparse.Namespace, env: Mapping[str, str]) -> dict[str, Any]:
    """RBLNConfig: a flag wins over the (deprecated) env var, which wins over the default."""
    opts: dict[str, Any] = {}
    extra = dict(ns.additional_config or {})
    for field, var, default in RBLN_FIELDS:
        flag = getattr(ns, "rbln_" + field)
        if flag is not None:
            value = flag
        elif field in extra:
            value = extra[field]
        elif var in env:
            raw = env[var]
            if isinstance(default, bool):
                value = _env_bool(raw)
            elif isinstance(default, int) and not isinstance(default, bool):
                value = int(raw)
            elif field == "sub_block_size":
                value = int(raw) if raw else None
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
    spec = ns.speculative_config or {}
    draft = spec.get("model")
    major_minor = ".".join(rebel_version.split("+")[0].split(".")[:2])
    return {
        "vllm_config": config,
        "kv_transfer": "present" if ns.kv_transfer_config is not None else "None",
        "max_num_seqs": ns.max_num_seqs,
        "num_gpu_blocks_override": ns.num_gpu_blocks_override,
        "gpu_memory_utilization": ns.gpu_memory_utilization,
        "dynamic_kv": rbln.pop("use_dynamic_kv_cache"),
        "rbln": rbln,
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
    ns = parse_serve_args(_strip_launcher(argv))
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


# ---------------------------------------------------------------------------------------------
# Start-up checks


def _import(name: str, why: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise SimError(f"ImportError: {exc} ({why})") from None


def check_packages(ns: argparse.Namespace) -> dict[str, Any]:
    """Import what this configuration needs; refuse squatters and mismatched versions."""
    mods = {
        "rebel": _import("rebel", "rebel-compiler is required by vllm-rbln: import rebel"),
        "vllm_rbln": _import("vllm_rbln", "the RBLN platform plugin vllm-rbln is not installed"),
    }
    kv = ns.kv_transfer_config or {}
    connector = str(kv.get("kv_connector", ""))
    if "lmcache" in connector.lower():
        mods["lmcache_rbln"] = _import(
            "lmcache_rbln",
            f"kv_connector {connector} needs lmcache-rbln (vllm-rbln[kv-connectors])",
        )
    if "nixl" in connector.lower():
        mods["nixl_rbln"] = _import(
            "nixl_rbln", f"kv_connector {connector} needs nixl-rbln (vllm-rbln[kv-connectors])"
        )
    spec = ns.speculative_config or {}
    if spec.get("method") == "suffix":
        mods["arctic_inference"] = _import(
            "arctic_inference", "speculative method 'suffix' needs arctic-inference"
        )
        _import("arctic_inference.suffix_decoding", "speculative method 'suffix'")
    for name in ("lmcache_rbln", "nixl_rbln", "torch_rbln", "optimum.rbln"):
        if name not in mods:
            with contextlib.suppress(ImportError):
                mods[name] = importlib.import_module(name)
    for name, mod in sorted(mods.items()):
        if getattr(mod, "__servefleet_squatter__", False):
            where = getattr(mod, "__file__", "?")
            raise SimError(
                f"refusing to start: module {name} ({where}) is a squatter package, "
                f"version {getattr(mod, '__version__', '?')}, not the RBLN one"
            )
    want = _major_minor(mods["vllm_rbln"].__version__)
    for name in ("rebel", "lmcache_rbln", "nixl_rbln", "torch_rbln", "optimum.rbln"):
        if name in mods and _major_minor(mods[name].__version__) != want:
            raise SimError(
                f"refusing to start: {name} {mods[name].__version__} does not match "
                f"vllm_rbln {mods['vllm_rbln'].__version__} (major.minor must agree)"
            )
    return mods


def _major_minor(version: str) -> str:
    return ".".join(version.split("+")[0].split(".")[:2])


def hub_dir(env: Mapping[str, str]) -> str:
    """The Hugging Face hub cache: $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if env.get("HF_HUB_CACHE"):
        return env["HF_HUB_CACHE"]
    home = env.get("HF_HOME") or os.path.join(
        env.get("XDG_CACHE_HOME") or os.path.join(env.get("HOME", "~"), ".cache"), "huggingface"
    )
    return os.path.join(home, "hub")


def find_snapshot(env: Mapping[str, str], model: str) -> str:
    """The snapshot dir of ``model`` in the hub cache (or a local dir with config.json).

    + env: the environment (HF_HOME, HF_HUB_CACHE)
    + model: an HF id org/name or a local path
    """
    if os.path.isdir(model):
        if os.path.isfile(os.path.join(model, "config.json")):
            return model
        raise SimError(f"model directory {model} has no config.json")
    repo = os.path.join(hub_dir(env), "models--" + model.replace("/", "--"))
    try:
        with open(os.path.join(repo, "refs", "main")) as fh:
            revision = fh.read().strip()
    except OSError:
        raise SimError(
            f"model {model} is not in the Hugging Face cache {hub_dir(env)} "
            f"(HF_HUB_OFFLINE={env.get('HF_HUB_OFFLINE', '')!r}; this server never downloads)"
        ) from None
    snap = os.path.join(repo, "snapshots", revision)
    if not os.path.isfile(os.path.join(snap, "config.json")):
        raise SimError(f"model {model}: snapshot {revision} has no config.json in {repo}")
    return snap


def rbln_smi(env: Mapping[str, str]) -> dict[str, Any]:
    """Run ``rbln-smi -j`` (found on the server's PATH) and return its JSON."""
    exe = shutil.which("rbln-smi", path=env.get("PATH", os.defpath))
    if exe is None:
        raise SimError("RuntimeError: rbln-smi not found: is the RBLN driver installed?")
    proc = subprocess.run([exe, "-j"], capture_output=True, text=True, env=dict(env))
    if proc.returncode != 0:
        raise SimError(f"RuntimeError: rbln-smi -j failed: {proc.stderr.strip()}")
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def claim_devices(env: Mapping[str, str], smi: Mapping[str, Any]) -> tuple[list[int], list[int]]:
    """Lock this server's NPUs (flock in /run/rbln-sim); returns (indexes, open lock fds)."""
    present = {int(d["npu"]): d for d in smi.get("devices", [])}
    wanted = visible_devices(env)
    if wanted is None:
        wanted = sorted(present)
    if not wanted:
        raise SimError("RuntimeError: no RBLN NPU found (rbln-smi -j lists no devices)")
    run_dir = sim_path(env, SIM_RUN)
    fds: list[int] = []
    for index in wanted:
        if index not in present:
            raise SimError(
                f"RuntimeError: RBLN_VISIBLE_DEVICES names NPU {index}, but rbln-smi lists "
                f"{sorted(present) or 'none'}"
            )
        lock = os.path.join(run_dir, f"npu{index}.lock")
        try:
            fd = os.open(lock, os.O_RDONLY)
        except FileNotFoundError:
            fd = os.open(lock, os.O_RDONLY | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise SimError(
                f"RuntimeError: NPU {index} (rbln{index}) is held by another server"
            ) from None
        fds.append(fd)
    return wanted, fds


def _write_atomic(path: str, data: bytes, mode: int = 0o644) -> None:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def compile_seconds(env: Mapping[str, str]) -> float:
    try:
        with open(sim_path(env, SIM_ETC + "/compile-seconds")) as fh:
            return float(fh.read().strip())
    except (OSError, ValueError):
        return DEFAULT_COMPILE_SECONDS


def warm_up(ns: argparse.Namespace, env: Mapping[str, str], sig: str, log: Any) -> tuple[str, bool]:
    """Load the mega-cache bundle, or "compile" and save it; returns (bundle, compiled)."""
    bundle = bundle_path(cache_root(env), ns.model, sig)
    disabled = _env_bool(env.get("VLLM_DISABLE_COMPILE_CACHE", "0"))
    if os.path.isfile(bundle) and not disabled:
        log(f"Loaded rbln mega-cache bundle from {bundle}")
        return bundle, False
    seconds = compile_seconds(env)
    log(f"compiling {ns.model} (signature {sig}): simulated, {seconds:g} s")
    time.sleep(seconds)
    line = f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')} model={ns.model} sig={sig} port={ns.port}\n"
    with open(os.path.join(sim_path(env, SIM_LOG), "compile.log"), "a") as fh:
        fh.write(line)
    if not disabled:
        os.makedirs(os.path.dirname(bundle), exist_ok=True)
        payload = json.dumps({"simulated": True, "model": ns.model, "sig": sig}).encode()
        _write_atomic(bundle, payload)
        log(f"Saved rbln mega-cache bundle to {bundle}")
    return bundle, True


# ---------------------------------------------------------------------------------------------
# HTTP

_REPLY_WORDS = (
    "This is a simulated reply from the servefleet lab; no model ran to produce these words, "
    "which repeat in a fixed order so that tests can predict them"
).split()


class _State:
    def __init__(self, ns: argparse.Namespace, env: Mapping[str, str], info: dict[str, Any]):
        self.ns = ns
        self.env = env
        self.info = info
        self.names: list[str] = ns.served_model_name or [ns.model]
        self.requests = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.started = int(time.time())


def _make_handler(state: _State) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        server_version = "vllm-sim/" + VERSION

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            sys.stderr.write(f"INFO: {self.address_string()} {format % args}\n")

        def _send(self, code: int, body: Any, ctype: str = "application/json") -> None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802
            path = self.path.split("?")[0]
            if path == "/health":
                failing = os.path.exists(sim_path(state.env, SIM_ETC + "/fail-health"))
                self._send(500 if failing else 200, b"", "text/plain")
            elif path == "/v1/models":
                data = [
                    {
                        "id": name,
                        "object": "model",
                        "created": state.started,
                        "owned_by": "vllm",
                        "root": state.ns.model,
                        "parent": None,
                        "max_model_len": state.ns.max_model_len,
                    }
                    for name in state.names
                ]
                self._send(200, {"object": "list", "data": data})
            elif path == "/version":
                self._send(200, {"version": VERSION})
            elif path == "/metrics":
                self._send(200, _metrics(state).encode(), "text/plain; version=0.0.4")
            else:
                self._send(404, {"detail": "Not Found"})

        def do_POST(self) -> None:  # noqa: N802
            if self.path.split("?")[0] != "/v1/chat/completions":
                self._send(404, {"detail": "Not Found"})
                return
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                req = json.loads(raw)
                assert isinstance(req, dict) and isinstance(req.get("messages"), list)
            except (ValueError, AssertionError):
                self._send(400, _error("invalid request: expected a JSON object with messages"))
                return
            if req.get("model") not in state.names:
                msg = f"The model `{req.get('model')}` does not exist."
                self._send(404, _error(msg, "NotFoundError", 404))
                return
            self._send(200, _chat(state, req, raw))

    return Handler


def _error(message: str, kind: str = "BadRequestError", code: int = 400) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def _chat(state: _State, req: dict[str, Any], raw: bytes) -> dict[str, Any]:
    limit = req.get("max_tokens") or req.get("max_completion_tokens") or 16
    limit = max(1, int(limit))
    n = min(limit, len(_REPLY_WORDS))
    text = " ".join(_REPLY_WORDS[:n])
    prompt = sum(len(str(m.get("content", "")).split()) for m in req["messages"])
    state.requests += 1
    state.prompt_tokens += prompt
    state.generation_tokens += n
    return {
        "id": "chatcmpl-" + hashlib.sha1(raw).hexdigest()[:16],
        "object": "chat.completion",
        "created": int(time.time()),
        "model": req["model"],
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "length" if n == limit else "stop",
            }
        ],
        "usage": {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n},
    }


def _metrics(state: _State) -> str:
    label = f'model_name="{state.names[0]}"'
    rows = [
        ("vllm:num_requests_running", "gauge", 0),
        ("vllm:num_requests_waiting", "gauge", 0),
        ("vllm:request_success_total", "counter", state.requests),
        ("vllm:prompt_tokens_total", "counter", state.prompt_tokens),
        ("vllm:generation_tokens_total", "counter", state.generation_tokens),
        ("vllm_sim:compiled_at_start", "gauge", int(state.info["compiled"])),
    ]
    out = []
    for name, kind, value in rows:
        out += [f"# TYPE {name} {kind}", f"{name}{{{label}}} {value}"]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------
# Entry point


def _log(message: str) -> None:
    sys.stderr.write(f"INFO {time.strftime('%m-%d %H:%M:%S')} [sim] {message}\n")
    sys.stderr.flush()


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
    path = os.path.join(run_dir, f"vllm-{ns.port}.json")
    with contextlib.suppress(OSError):
        os.unlink(path)
    _write_atomic(path, json.dumps(record, indent=1, sort_keys=True).encode())


def serve(argv: Sequence[str]) -> int:
    """``vllm serve ARGS``: checks, warm-up, then the HTTP API until SIGTERM.

    + argv: the arguments after ``serve``
    """
    ns = parse_serve_args(argv)
    env = dict(os.environ)

    def _stop(signum: int, frame: Any) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, _stop)
    _log(f"vLLM API server version {VERSION} (simulated for the servefleet lab)")
    _log(f"non-default args: model={ns.model!r} port={ns.port} host={ns.host!r}")
    _record(ns, env)
    mods = check_packages(ns)
    find_snapshot(env, ns.model)
    draft = (ns.speculative_config or {}).get("model")
    if draft:
        find_snapshot(env, str(draft))
    if os.path.exists(sim_path(env, SIM_ETC + "/fail-start")):
        raise SimError(f"simulated start failure: {sim_path(env, SIM_ETC + '/fail-start')} exists")
    smi = rbln_smi(env)
    devices, fds = claim_devices(env, smi)
    npu = next(d["name"] for d in smi["devices"] if int(d["npu"]) == devices[0])
    sig = _signature(ns, env, npu, mods["rebel"].__version__, len(devices))
    _log(f"NPUs {devices} ({npu}), rebel {mods['rebel'].__version__}, signature {sig}")
    bundle, compiled = warm_up(ns, env, sig, _log)
    state = _State(ns, env, {"compiled": compiled, "bundle": bundle, "sig": sig})
    httpd = http.server.ThreadingHTTPServer((ns.host, ns.port), _make_handler(state))
    httpd.daemon_threads = True
    _log(f"Starting vLLM API server on http://{ns.host}:{ns.port}")
    try:
        httpd.serve_forever()
    finally:
        httpd.server_close()
        for fd in fds:
            os.close(fd)
        _log("Shutting down")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Console script ``vllm``: only ``serve`` and ``--version`` are simulated."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args in (["--version"], ["-v"]):
        print(VERSION)
        return 0
    if not args or args[0] != "serve":
        top = _Parser(prog="vllm")
        top.add_argument("subcommand", choices=["serve"])
        top.parse_args(args[:1])
        return 2
    try:
        return serve(args[1:])
    except SimError as exc:
        sys.stderr.write(f"ERROR {time.strftime('%m-%d %H:%M:%S')} [sim] {exc}\n")
        return exc.code
    except SystemExit as exc:
        return int(exc.code or 0) if not isinstance(exc.code, str) else 1


if __name__ == "__main__":
    sys.exit(main())
