"""Simulated ``vllm serve``: a SIMULATION for the servefleet lab, shipped in the lab's fake
``vllm 0.30.0+cpu`` wheel (console script ``vllm``). It is not vLLM and serves no model.

The same code is also the lab's fake CUDA build, ``vllm 0.30.0`` (PyPI's, on the public index):
``build.json`` next to this file, written into each wheel by lab/build.py, says which build this
is (no file: the CPU build). Everything below describes the CPU build with vllm-rbln; the CUDA
build is described at :func:`start_cuda`.

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

Every path under /etc/rbln-sim, /run/rbln-sim and /var/log/rbln-sim is prefixed by
``$RBLN_SIM_ROOT`` when that is set (tests only; a deploy never sets it).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import fcntl
import functools
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
from collections.abc import Callable, Mapping, Sequence
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


# ---------------------------------------------------------------------------------------------
# The flag table, generated from the dumps of the real parser (flags/*.json)

# vLLM's value parsers, by the names the dumps give them. Their __name__ is what argparse shows
# in "argument --x: invalid <name> value: 'v'", as vLLM's functions of the same name would.


def human_readable_int(value: str) -> int:
    """``25.6k`` = 25600 and ``1m`` = 10**6 (k/m/g/t: powers of 1000); ``2K`` = 2048 (K/M/G/T:
    powers of 1024, whole numbers only); anything else goes to ``int()``."""
    value = value.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if match:
        number, suffix = match.groups()
        if suffix.islower():
            return int(float(number) * 1000 ** ("kmgt".index(suffix) + 1))
        if "." in number:
            raise argparse.ArgumentTypeError(
                f"Decimals are not allowed with binary suffixes like {suffix}. "
                f"Did you mean to use {number}{suffix.lower()} instead?"
            )
        return int(number) * 1024 ** ("KMGT".index(suffix) + 1)
    return int(value)


def human_readable_int_or_auto(value: str) -> int:
    """:func:`human_readable_int`, or ``auto`` / ``-1`` (-1: let vLLM decide)."""
    value = value.strip()
    if value in ("auto", "-1"):
        return -1
    return human_readable_int(value)


def parse_dataclass(val: str) -> dict[str, Any]:
    """A config dataclass from JSON: a JSON object. The dumps do not list each config class's
    fields, so unknown keys pass here (real vLLM's pydantic check refuses them)."""
    try:
        value = json.loads(val)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"Invalid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"Input should be a JSON object: {val!r}")
    return value


def union_dict_and_str(val: str) -> Any:
    """A JSON object when the text is braced (``{...}``), else the text itself."""
    if not re.match(r"(?s)^\s*{.*}\s*$", val):
        return str(val)
    return json.loads(val)


def _optional_type(inner: Callable[[str], Any]) -> Callable[[str], Any]:
    def _optional_type(val: str) -> Any:  # vLLM's optional_type: "" and "None" are None
        return None if val in ("", "None") else inner(val)

    return _optional_type


def _parse_type(inner: Callable[[str], Any]) -> Callable[[str], Any]:
    def _parse_type(val: str) -> Any:  # vLLM's parse_type: a ValueError becomes the message
        try:
            return inner(val)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(
                f"Failed to parse '{val}' as <function {inner.__name__}>: {exc}"
            ) from exc

    return _parse_type


def _kernel_backend(val: str) -> str:  # --moe-backend and friends: lower case, "-" as "_"
    return val.lower().replace("-", "_")


def _device_ids(val: str) -> list[int]:  # --device-ids 0,1
    return [int(x) for x in val.split(",")]


_kernel_backend.__name__ = _device_ids.__name__ = "<lambda>"
_VALUE_TYPES: dict[str, Callable[[str], Any]] = {
    "int": int,
    "float": float,
    "str": str,
    "loads": json.loads,
    "human_readable_int": human_readable_int,
    "human_readable_int_or_auto": human_readable_int_or_auto,
    "parse_dataclass": parse_dataclass,
    "union_dict_and_str": union_dict_and_str,
}
_WRAPPERS = {"_optional_type": _optional_type, "_parse_type": _parse_type}
_LAMBDAS = {"device_ids": _device_ids}


def value_type(name: str | None, dest: str) -> Callable[[str], Any] | None:
    """The value parser a dump names, e.g. ``_optional_type(human_readable_int)``.

    + name: the dump's ``type`` (None: the text as is)
    + dest: the argument, for the dump's anonymous ``<lambda>`` parsers
    """
    if name is None:
        return None
    if name == "<lambda>":
        return _LAMBDAS.get(dest, _kernel_backend)
    wrapped = re.fullmatch(r"(\w+)\((.*)\)", name)
    if wrapped:
        inner = value_type(wrapped.group(2), dest)
        assert inner is not None
        return _WRAPPERS[wrapped.group(1)](inner)
    return _VALUE_TYPES[name]


def _update(into: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """Merge ``extra`` into ``into`` the way vLLM merges dotted sub-keys: dicts recursively,
    lists appended, anything else replaced."""
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _update(into[key], value)
        elif isinstance(value, list) and isinstance(into.get(key), list):
            into[key] = into[key] + value
        else:
            into[key] = value
    return into


class _StoreRbln(argparse._StoreAction):
    """vllm-rbln's store of an RBLNConfig field (``--rbln-<field>``)."""


class _StoreRblnBool(argparse.BooleanOptionalAction):
    """vllm-rbln's ``--rbln-<field>`` / ``--no-rbln-<field>``."""


class _MergeAdditionalConfig(argparse._StoreAction):
    """vllm-rbln's ``--additional-config``: a repeated JSON object merges into the earlier one."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        current = getattr(namespace, self.dest, None)
        if isinstance(current, dict) and isinstance(values, dict):
            values = _update(copy.deepcopy(current), values)
        setattr(namespace, self.dest, values)


class LoRAParserAction(argparse.Action):
    """vLLM's ``--lora-modules``: items ``name=path`` or JSON ``{"name", "path"[, "base_model_name"]}``."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        modules: list[dict[str, Any]] = []
        for item in values or []:
            if item in (None, ""):
                continue
            if "=" in item and "," not in item:
                name, path = item.split("=")  # as vLLM: a second "=" is a ValueError
                modules.append({"name": name, "path": path})
                continue
            try:
                module = json.loads(item)
            except json.JSONDecodeError:
                parser.error(f"Invalid JSON format for --lora-modules: {item}")
            fields = set(module) if isinstance(module, dict) else set()
            if not {"name", "path"} <= fields <= {"name", "path", "base_model_name"}:
                parser.error(f"Invalid fields for --lora-modules: {item}")
            modules.append(module)
        setattr(namespace, self.dest, modules)


_ACTIONS: dict[str, Any] = {
    "_StoreAction": "store",
    "_StoreTrueAction": "store_true",
    "_AppendAction": "append",
    "_HelpAction": "help",
    "BooleanOptionalAction": argparse.BooleanOptionalAction,
    "_StoreRbln": _StoreRbln,
    "_StoreRblnBool": _StoreRblnBool,
    "_MergeAdditionalConfig": _MergeAdditionalConfig,
    "LoRAParserAction": LoRAParserAction,
}
_BOOL_ACTIONS = ("BooleanOptionalAction", "_StoreRblnBool")
# A default the dump could only write as a Python repr ("set()", "<Enum.X: 'x'>", "Cls(...)",
# "{'k': ...}") is None here; so is the default of an --rbln-* field, so that a given flag can be
# told from an unset one (RBLNConfig then takes the env var, then its own default).
_REPR_DEFAULT = re.compile(r"<.*>|\w+\(.*\)|\{.*\}", re.S)


def _default(entry: Mapping[str, Any]) -> Any:
    value = entry["default"]
    if entry["action"] in ("_StoreRbln", "_StoreRblnBool"):
        return None
    if isinstance(value, str) and _REPR_DEFAULT.fullmatch(value):
        return None
    return value


@functools.cache
def flag_table(platform: str = DEFAULT_PLATFORM) -> tuple[dict[str, Any], ...]:
    """The real parser's actions for ``platform`` (``rbln`` or ``upstream``), from flags/."""
    with open(os.path.join(FLAGS_DIR, PLATFORMS[platform])) as fh:
        return tuple(json.load(fh)["flags"])


@functools.cache
def known_env_vars(platform: str = DEFAULT_PLATFORM) -> frozenset[str]:
    """The ``VLLM_*`` variables vLLM 0.30.0 knows (and vllm-rbln's, on the rbln platform)."""
    with open(os.path.join(FLAGS_DIR, ENVS_FILE)) as fh:
        data = json.load(fh)
    return frozenset(data["vllm"] + (data["vllm_rbln"] if platform == "rbln" else []))


def unknown_env_vars(env: Mapping[str, str], platform: str = DEFAULT_PLATFORM) -> list[str]:
    """The ``VLLM_*`` names in ``env`` that real vLLM would warn about, sorted."""
    known = known_env_vars(platform)
    return sorted(k for k in env if k.startswith("VLLM_") and k not in known)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse's format, exit 2
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")

    @functools.cache  # noqa: B019 (parsers are built once per platform and kept)
    def format_usage(self) -> str:  # some 440 spellings: wrapped once, not on every error
        return super().format_usage()


@functools.cache
def build_parser(platform: str = DEFAULT_PLATFORM) -> argparse.ArgumentParser:
    """The ``vllm serve`` parser of ``platform``: every action of the dump, argparse errors."""
    parser = _Parser(prog=PROG, allow_abbrev=False, add_help=False)
    parser.add_argument("model_tag", nargs="?", default=None, help="model id or path")
    for entry in flag_table(platform):
        flags, kind = entry["flags"], entry["action"]
        kwargs: dict[str, Any] = {"action": _ACTIONS[kind]}
        if kind != "_HelpAction":
            kwargs.update(dest=entry["dest"], default=_default(entry))
        if kind in _BOOL_ACTIONS:  # argparse makes the --no- spellings itself
            flags = [f for f in flags if not (f.startswith("--no-") and "--" + f[5:] in flags)]
        elif kind not in ("_HelpAction", "_StoreTrueAction"):
            kwargs.update(type=value_type(entry["type"], entry["dest"]), choices=entry["choices"])
            if entry["nargs"] is not None:
                kwargs["nargs"] = entry["nargs"]
            if entry["nargs"] == "?":  # --hf-token alone: use the stored token
                kwargs["const"] = True
        parser.add_argument(*flags, **kwargs)
    return parser


def _dotted_value(text: str) -> Any:
    if text in ("True", "False"):  # as pydantic reads them for a bool field
        return text == "True"
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _flexible(argv: Sequence[str]) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """vLLM's FlexibleArgumentParser before argparse: ``--model X`` becomes the positional,
    ``_`` counts as ``-`` in a ``--flag`` name up to its first ``.``, and dotted sub-keys
    (``--a.b.c v``, ``-cc.x=v``, ``--a.b+ x,y`` for a list) are taken out and collected into one
    object per flag. Returns (the remaining arguments, flag -> object)."""
    args = list(argv)
    for i, arg in enumerate(args):
        if arg.startswith("--model="):
            args = [arg[len("--model=") :], *args[:i], *args[i + 1 :]]
            break
        if arg == "--model" and i + 1 < len(args):
            args = [args[i + 1], *args[:i], *args[i + 2 :]]
            break
    named = []
    for arg in args:
        if arg.startswith("--"):
            key, eq, value = arg.partition("=")
            head, dot, tail = key[2:].partition(".")
            arg = "--" + head.replace("_", "-") + dot + tail + eq + value
        named.append(arg)
    rest: list[str] = []
    dotted: dict[str, dict[str, Any]] = {}
    items = iter(named)
    for arg in items:
        key, eq, value = arg.partition("=")
        if not arg.startswith("-") or "." not in key:
            rest.append(arg)
            continue
        if not eq:
            following = next(items, None)
            if following is None:
                _Parser(prog=PROG).error(f"argument {key}: expected one argument")
            value = str(following)
        if key.endswith("+"):
            key, value = key[:-1], json.dumps(value.split(","))
        flag, *path = key.split(".")
        nested: Any = _dotted_value(value)
        for part in reversed(path):
            nested = {part: nested}
        _update(dotted.setdefault(flag, {}), nested)
    return rest, dotted


def parse_serve_args(argv: Sequence[str], platform: str = DEFAULT_PLATFORM) -> argparse.Namespace:
    """Parse the arguments after ``vllm serve`` (exits 2 on an unknown flag or bad value).

    + argv: the arguments after ``serve``
    + platform: the flag table, ``rbln`` or ``upstream``
    """
    parser = build_parser(platform)
    args, dotted = _flexible(argv)
    # as vLLM: each collected object goes back in as the flag's JSON text, for its value parser
    tail = [item for flag, obj in dotted.items() for item in (flag, json.dumps(obj))]
    ns = parser.parse_args(args + tail)
    if dotted:  # ... merged here into the object the flag itself gives (any spelling of it)
        given = vars(parser.parse_args(args))
        for flag, extra in dotted.items():
            dest = parser._option_string_actions[flag].dest
            if isinstance(getattr(ns, dest), dict):
                base = given[dest] if isinstance(given[dest], dict) else {}
                given[dest] = _update(copy.deepcopy(base), extra)
                setattr(ns, dest, given[dest])
    ns.model = ns.model_tag or ns.model  # vllm serve: the positional model wins
    for dest, value in PLATFORM_DEFAULTS[platform].items():
        if getattr(ns, dest) is None:
            setattr(ns, dest, value)
    return ns


def _object(value: Any) -> dict[str, Any]:
    """A JSON argument's object, or {} (unset, None, or a non-object JSON value)."""
    return value if isinstance(value, dict) else {}


# ---------------------------------------------------------------------------------------------
# The compile cache key (after the description of vllm-rbln 0.12's mega-cache)


def _env_bool(text: str) -> bool:
    return text.strip().lower() in ("1", "true")


def _rbln_options(ns: argparse.Namespace, env: Mapping[str, str]) -> dict[str, Any]:
    """RBLNConfig: a flag wins over the (deprecated) env var, which wins over the default."""
    opts: dict[str, Any] = {}
    extra = _object(ns.additional_config)
    for field, var, default in RBLN_FIELDS:
        flag = getattr(ns, "rbln_" + field, None)  # the upstream table has no --rbln-* flags
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
    spec = _object(ns.speculative_config)
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
    kv = _object(ns.kv_transfer_config)
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
    spec = _object(ns.speculative_config)
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


def _open_lock(path: str) -> int:
    """A descriptor to flock ``path`` (made when missing; servers of any user share it)."""
    try:
        return os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)


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
        fd = _open_lock(os.path.join(run_dir, f"npu{index}.lock"))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise SimError(
                f"RuntimeError: NPU {index} (rbln{index}) is held by another server"
            ) from None
        fds.append(fd)
    return wanted, fds


def compile_only(env: Mapping[str, str]) -> bool:
    """Whether ``VLLM_RBLN_COMPILE_ONLY`` asks for compile-only mode (compile and cache every
    graph on a dummy device, no NPU); refused with ``VLLM_DISABLE_COMPILE_CACHE``, as the mode
    exists to fill that cache.

    + env: the server's environment
    """
    if not _env_bool(env.get(COMPILE_ONLY_ENV, "0")):
        return False
    if _env_bool(env.get("VLLM_DISABLE_COMPILE_CACHE", "0")):
        raise SimError(
            f"ValueError: {COMPILE_ONLY_ENV}={env[COMPILE_ONLY_ENV]} is incompatible with "
            f"VLLM_DISABLE_COMPILE_CACHE={env['VLLM_DISABLE_COMPILE_CACHE']}: compile-only "
            "mode exists to fill the compile cache"
        )
    return True


def forced_npu_name(env: Mapping[str, str]) -> tuple[str, str] | None:
    """(variable, name) of the forced target NPU: ``RBLN_FORCE_NPU_NAME``, else the legacy
    ``RBLN_TARGET_SOC``; None when neither is set (an empty value counts as unset).

    + env: the server's environment
    """
    for var in NPU_NAME_ENV:
        name = env.get(var, "").strip()
        if name:
            return var, name
    return None


def compile_only_target(env: Mapping[str, str]) -> tuple[str, str]:
    """The NPU name compile-only mode compiles for, and where it came from: the forced name
    (rbln-smi is not run), else rbln-smi's name of the first NPU of RBLN_VISIBLE_DEVICES (or the
    first listed when it names none that is present). Without either the real stack cannot
    know its target: SimError. No NPU is checked or claimed.

    + env: the server's environment
    """
    forced = forced_npu_name(env)
    if forced is not None:
        return forced[1], forced[0]
    wanted = visible_devices(env) or []
    try:
        present = {int(d["npu"]): str(d["name"]) for d in rbln_smi(env).get("devices", [])}
    except (SimError, ValueError) as exc:
        why = str(exc).removeprefix("RuntimeError: ")
    else:
        if present:
            first = wanted[0] if wanted and wanted[0] in present else min(present)
            return present[first], f"rbln-smi, NPU {first}"
        why = "rbln-smi -j lists no devices"
    raise SimError(
        f"RuntimeError: {COMPILE_ONLY_ENV}=1 cannot tell which NPU to compile for: {why}; "
        f"set {NPU_NAME_ENV[0]} (e.g. RBLN-CR13) or the legacy {NPU_NAME_ENV[1]}"
    )


def ignored_npu_name(env: Mapping[str, str], npu: str) -> str | None:
    """The warning for a forced NPU name that differs from the mounted NPU's, or None: outside
    compile-only mode the runtime uses the device it runs on.

    + env: the server's environment
    + npu: rbln-smi's name of the server's first NPU
    """
    forced = forced_npu_name(env)
    if forced is None or forced[1] == npu:
        return None
    var, name = forced
    return f"{var}={name} ignored: the runtime uses the mounted NPU, {npu}"


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


def bundle_bytes(model: str, sig: str) -> bytes:
    """The simulated mega-cache bundle of ``model`` at ``sig``: compact JSON (no byte of it
    can change unnoticed) with a 4 KiB payload derived from both, as hex, and the payload's
    sha256; byte-identical wherever this signature compiles.

    + model: the model string as given
    + sig: the 16-hex signature
    """
    payload = b"".join(
        hashlib.sha256(f"{model}\0{sig}\0{i}".encode()).digest()
        for i in range(BUNDLE_PAYLOAD_BYTES // 32)
    )
    doc = {
        "simulated": True,
        "model": model,
        "sig": sig,
        "payload": payload.hex(),
        "payload_sha256": hashlib.sha256(payload).hexdigest(),
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def bundle_fault(path: str, model: str, sig: str) -> str | None:
    """Why the bundle at ``path`` cannot be loaded for ``model`` at ``sig``; None when sound.

    + path: the bundle file
    + model: the model string as given
    + sig: the 16-hex signature the server computed
    """
    try:
        with open(path, "rb") as fh:
            doc = json.loads(fh.read())
    except OSError as exc:
        return f"cannot read it: {exc.strerror}"
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        return f"not a bundle: {exc}"
    if not isinstance(doc, dict) or set(doc) != BUNDLE_FIELDS or doc["simulated"] is not True:
        fields = sorted(doc) if isinstance(doc, dict) else type(doc).__name__
        return f"not a bundle: fields {fields}, want {sorted(BUNDLE_FIELDS)} (simulated: true)"
    if doc["sig"] != sig:
        return f"it is the bundle of signature {doc['sig']!r}, not {sig}"
    if doc["model"] != model:
        return f"it is the bundle of model {doc['model']!r}, not {model!r}"
    if not isinstance(doc["payload"], str) or not re.fullmatch(r"(?:[0-9a-f]{2})*", doc["payload"]):
        return "payload is not lower-case hex bytes"
    digest = hashlib.sha256(bytes.fromhex(doc["payload"])).hexdigest()
    if digest != doc["payload_sha256"]:
        return f"payload sha256 {digest} does not match {doc['payload_sha256']!r}"
    return None


def warm_up(
    ns: argparse.Namespace,
    env: Mapping[str, str],
    sig: str,
    log: Any,
    *,
    npu: str,
    compile_only: bool,
) -> tuple[str, bool]:
    """Load the mega-cache bundle, or "compile" and save it; returns (bundle, compiled). A
    bundle that fails :func:`bundle_fault` is logged and compiled again (then overwritten).

    + ns: the parsed arguments
    + env: the server's environment (VLLM_CACHE_ROOT, VLLM_DISABLE_COMPILE_CACHE)
    + sig: the 16-hex signature
    + log: ``log(message[, level])``
    + npu: the NPU name in the signature, for compile.log
    + compile_only: compile-only mode, for compile.log
    """
    bundle = bundle_path(cache_root(env), ns.model, sig)
    disabled = _env_bool(env.get("VLLM_DISABLE_COMPILE_CACHE", "0"))
    if os.path.isfile(bundle) and not disabled:
        fault = bundle_fault(bundle, ns.model, sig)
        if fault is None:
            log(f"Loaded rbln mega-cache bundle from {bundle}")
            return bundle, False
        log(f"failed to load rbln mega-cache bundle from {bundle}: {fault}; recompiling", "WARNING")
    seconds = compile_seconds(env)
    log(f"compiling {ns.model} (signature {sig}): simulated, {seconds:g} s")
    time.sleep(seconds)
    line = (  # new fields go at the end: parsers of the first ones keep working
        f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')} model={ns.model} sig={sig} port={ns.port}"
        f" compile_only={int(compile_only)} npu={npu}\n"
    )
    log_dir = sim_path(env, SIM_LOG)
    os.makedirs(log_dir, exist_ok=True)  # a host without the driver (compile-only) has none
    with open(os.path.join(log_dir, "compile.log"), "a") as fh:
        fh.write(line)
    if not disabled:
        os.makedirs(os.path.dirname(bundle), exist_ok=True)
        _write_atomic(bundle, bundle_bytes(ns.model, sig))
        log(f"Saved rbln mega-cache bundle to {bundle}")
    return bundle, True


def fault_switch(env: Mapping[str, str], name: str, argv: Sequence[str]) -> str | None:
    """Whether switch /etc/rbln-sim/``name`` fails this process: None if not, else why.

    An empty switch file fails every process; one holding lines of text fails the processes
    whose command line, ``argv`` joined by single spaces, contains every one of those lines.

    + env: the environment (RBLN_SIM_ROOT)
    + name: ``fail-start`` or ``fail-health``
    + argv: the process's command line
    """
    path = sim_path(env, f"{SIM_ETC}/{name}")
    if not os.path.exists(path):
        return None
    try:
        with open(path) as fh:
            text = fh.read()
    except OSError:  # present but unreadable: the old rule, it exists
        text = ""
    lines = [line for line in text.splitlines() if line]
    if not lines:
        return f"{path} exists"
    line = " ".join(argv)
    return (
        f"{path} matches {' + '.join(map(repr, lines))}" if all(x in line for x in lines) else None
    )


# ---------------------------------------------------------------------------------------------
# The CUDA build (vllm 0.30.0 from PyPI, on GPU hosts)


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
    ns: argparse.Namespace, env: Mapping[str, str], visible: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The visible GPUs this server uses: the first tensor x pipeline parallel size of them per
    local data parallel rank, refused as vLLM refuses when they are not there.

    + ns: the parsed arguments
    + env: the server's environment (CUDA_VISIBLE_DEVICES, for vLLM's message)
    + visible: the visible GPUs (:func:`visible_gpus`)
    """
    tp, pp, dp = ns.tensor_parallel_size, ns.pipeline_parallel_size, ns.data_parallel_size
    dp_local = ns.data_parallel_size_local or dp
    for name, value in (("tensor", tp), ("pipeline", pp), ("data", dp), ("local data", dp_local)):
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
    world = tp * pp
    if world > len(visible):
        raise SimError(
            "pydantic_core._pydantic_core.ValidationError: 1 validation error for ParallelConfig: "
            f"Value error, World size ({world}) is larger than the number of available GPUs "
            f"({len(visible)}) in this node. If this is intentional and you are using: - ray, "
            "set '--distributed-executor-backend ray'. - multiprocessing, set '--nnodes' "
            "appropriately."
        )
    if world * dp_local > len(visible):
        rank = len(visible) // world  # the first local DP rank whose GPUs are not there
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


def start_cuda(ns: argparse.Namespace, env: Mapping[str, str]) -> tuple[dict[str, Any], list[int]]:
    """The CUDA build's start (``vllm 0.30.0``; upstream flag table): torch's CUDA build,
    ``nvidia-smi``'s GPUs as ``CUDA_VISIBLE_DEVICES`` shows them, the model (and draft) in the HF
    cache, tensor x pipeline x data parallel size GPUs, the fail-start switch, the GPUs' memory
    claimed, then /etc/rbln-sim/load-seconds of "loading". No compile, no mega-cache, no
    vllm-rbln. Returns the server's info and its claims' fds.

    + ns: the parsed arguments
    + env: the server's environment
    """
    check_cuda_packages(ns)
    visible = visible_gpus(env, nvidia_smi(env))
    find_snapshot(env, ns.model)
    draft = _object(ns.speculative_config).get("model")
    if draft:
        find_snapshot(env, str(draft))
    used = gpus_needed(ns, env, visible)
    switch = fault_switch(env, "fail-start", sys.argv)
    if switch is not None:
        raise SimError(f"simulated start failure: {switch}")
    fds = claim_gpus(ns, env, used)
    indexes = [g["index"] for g in used]
    _log(
        f"CUDA GPUs {indexes} ({used[0]['name']}), "
        f"CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES')!r}, "
        f"{ns.gpu_memory_utilization} of their memory claimed"
    )
    seconds = load_seconds(env)
    _log(f"Starting to load model {ns.model}...")
    time.sleep(seconds)
    _log(f"Loading weights took {seconds:.2f} seconds (simulated)")
    return {"compiled": False, "bundle": None, "sig": None, "gpus": indexes}, fds


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
        self.argv = list(sys.argv)  # this process's command line, for the fail-health switch
        self.names: list[str] = [n for n in ns.served_model_name or [] if n] or [ns.model]
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
                failing = fault_switch(state.env, "fail-health", state.argv) is not None
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


def _log(message: str, level: str = "INFO") -> None:
    sys.stderr.write(f"{level} {time.strftime('%m-%d %H:%M:%S')} [sim] {message}\n")
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
    switch = fault_switch(env, "fail-start", sys.argv)
    if switch is not None:
        raise SimError(f"simulated start failure: {switch}")
    npu, sig, fds = _target(ns, env, mods["rebel"].__version__, dummy)
    bundle, compiled = warm_up(ns, env, sig, _log, npu=npu, compile_only=dummy)
    if dummy:
        _log(f"compile-only mode ({COMPILE_ONLY_ENV}=1): running on a dummy device for {npu}")
    return {"compiled": compiled, "bundle": bundle, "sig": sig}, fds


def serve(argv: Sequence[str]) -> int:
    """``vllm serve ARGS``: checks, warm-up, then the HTTP API until SIGTERM.

    + argv: the arguments after ``serve``
    """
    env = dict(os.environ)
    # the CUDA build is upstream vLLM whatever the host says; the CPU build asks the host
    platform = "upstream" if BUILD["device"] == "cuda" else sim_platform(env)
    ns = parse_serve_args(argv, platform)
    host = ns.host or "0.0.0.0"  # no --host: every interface, as vLLM

    def _stop(signum: int, frame: Any) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, _stop)
    _log(f"vLLM API server version {VERSION} (simulated for the servefleet lab)")
    _log(f"non-default args: model={ns.model!r} port={ns.port} host={ns.host!r}")
    _log(f"platform {platform}: the flag table of {PLATFORMS[platform]}")
    for name in unknown_env_vars(env, platform):
        _log(f"Unknown vLLM environment variable detected: {name}", "WARNING")
    _record(ns, env)
    if BUILD["device"] == "cuda":
        info, fds = start_cuda(ns, env)
    else:
        info, fds = _start_rbln(ns, env)
    state = _State(ns, env, info)
    httpd = http.server.ThreadingHTTPServer((host, ns.port), _make_handler(state))
    httpd.daemon_threads = True
    _log(f"Starting vLLM API server on http://{host}:{ns.port}")
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
