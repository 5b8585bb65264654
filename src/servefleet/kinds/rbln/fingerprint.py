"""The compile fingerprint: which inputs make vllm-rbln recompile, hashed into one sha256.

vllm-rbln keys its compile cache (rbln.md §3.5) on the vLLM config hash (ports zeroed), a few
engine settings, the speculative config, the RBLN compile options, three env vars, the NPU
name and the rebel-compiler major.minor. :data:`COMPILE_INPUTS` is the one table of what this
toolkit counts, each entry with its reason; :data:`NOT_COUNTED` lists what deliberately does
not count. Values are normalised before hashing: an absent flag takes vLLM's default,
``--flag=v`` equals ``--flag v``, ``--max_num_seqs`` equals ``--max-num-seqs`` and numbers
are parsed, so the same inputs in another order or spelling give the same fingerprint.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from servefleet.base import flags as vllm_flags
from servefleet.base.errors import RecipeError
from servefleet.kinds.loader import load_json_text

# ---------------------------------------------------------------------------------------------
# Value parsers


def _bool(v: Any) -> bool:
    """Flags give True/False; env vars are true when "true" or "1" (case-insensitive)."""
    if isinstance(v, bool):
        return v
    return str(v).strip().lower() in ("true", "1")


def _int(v: Any) -> int:
    text = str(v).strip()
    if isinstance(v, (dict, list)) or len(text) > 18:
        raise RecipeError(f"not an integer: {text[:40]!r}")
    try:
        return int(text)
    except ValueError:
        raise RecipeError(f"not an integer: {v!r}") from None


def _human_int(v: Any) -> int:
    """vLLM's human-readable ints for --max-model-len: ``1k`` = 1000, ``1K`` = 1024."""
    s = str(v).strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgG])", s)
    if not m:
        return _int(s)
    num, unit = m.groups()
    scale = {"k": 10**3, "m": 10**6, "g": 10**9, "K": 2**10, "M": 2**20, "G": 2**30}[unit]
    return int(float(num) * scale)


def _float(v: Any) -> float:
    try:
        return float(str(v).strip())
    except ValueError:
        raise RecipeError(f"not a number: {v!r}") from None


def _str(v: Any) -> str:
    return str(v)


def _strategy(v: Any) -> str:
    s = str(v).strip().lower()
    return "exponential" if s == "exp" else s


def _int_list(v: Any) -> list[int]:
    if isinstance(v, list):
        return [_int(x) for x in v]
    s = str(v).strip()
    if s.startswith("["):
        loaded = _json(s)
        if not isinstance(loaded, list):
            raise RecipeError(f"not a list of integers: {v!r}")
        return [_int(x) for x in loaded]
    return [_int(x) for x in s.split(",") if x.strip()]


def _json(v: Any) -> Any:
    if not isinstance(v, str):
        return v
    return load_json_text(v, f"not valid JSON: {v[:80]!r}")


def _canon(v: Any) -> Any:
    """A JSON config's value as given: an object (dotted fields merged) or a string."""
    return v


def _scalar(v: Any) -> Any:
    """Unknown ``--rbln-*`` values: booleans stay, numbers are parsed, the rest is a string."""
    if isinstance(v, bool):
        return v
    for conv in (int, float):
        try:
            return conv(v)
        except (TypeError, ValueError):
            pass
    return str(v)


# ---------------------------------------------------------------------------------------------
# The table


@dataclass(frozen=True)
class CompileInput:
    """One compile input.

    + key: its name in the canonical dict
    + source: ``model`` (the served model), ``flag`` (vLLM flag, then ``env`` fallbacks),
      ``env`` (variable only), ``spec`` (a field of ``--speculative-config``), ``json`` (a
      JSON config flag, its dotted fields merged), ``presence`` (whether the flag is given at
      all) or ``input`` (passed to the resolver)
    + names: flag names (without ``--``, dashes) or the spec field / input name
    + env: env vars read when no flag gives the value (vllm-rbln's deprecated spellings)
    + parse: normaliser of a given value
    + default: the value when nothing gives it (vLLM's or vllm-rbln's default)
    + reason: why it is a compile input (rbln.md)
    """

    key: str
    source: str
    names: tuple[str, ...]
    parse: Callable[[Any], Any]
    default: Any
    reason: str
    env: tuple[str, ...] = ()


def _rbln(field: str, parse: Callable[[Any], Any], default: Any, *env: str) -> CompileInput:
    return CompileInput(
        key=f"rbln.{field}",
        source="flag",
        names=("rbln-" + field.replace("_", "-"),),
        parse=parse,
        default=default,
        env=env,
        reason="RBLN compile option: RBLNConfig fields key the cache via the config hash (§3.3, §3.5)",
    )


_CFG = "vLLM config hash (compute_hash, ports zeroed) and the docs' key list (§3.5)"
_UPSTREAM = "another field of the vLLM config hash that §3.5 hashes whole (ports zeroed)"
_SIG = "added to the mega-cache signature by vllm-rbln (§3.5)"
_MODEL = "ModelConfig.compute_hash hashes every field but its ignored list"
_MULTIMODAL = (
    "MultiModalConfig.compute_hash, in the config hash with compilation_config's "
    "compile_mm_encoder (counted always: a spare compile at worst)"
)
_KERNEL = "KernelConfig.compute_hash hashes it (the flag sets kernel_config's field)"

COMPILE_INPUTS: tuple[CompileInput, ...] = (
    CompileInput(
        "model",
        "model",
        ("model",),
        _str,
        None,
        "the model string as given keys the cache (HF id and local path differ) (§3.5)",
    ),
    CompileInput("vllm.dtype", "flag", ("dtype",), _str, "auto", _CFG),
    CompileInput("vllm.max_model_len", "flag", ("max-model-len",), _human_int, None, _CFG),
    CompileInput("vllm.block_size", "flag", ("block-size",), _int, None, _CFG),
    CompileInput("vllm.max_num_seqs", "flag", ("max-num-seqs",), _int, None, _SIG),
    CompileInput(
        "vllm.max_num_batched_tokens", "flag", ("max-num-batched-tokens",), _int, None, _CFG
    ),
    CompileInput(
        "vllm.gpu_memory_utilization",
        "flag",
        ("gpu-memory-utilization",),
        _float,
        0.9,
        _SIG + "; CacheConfig's own hash ignores it, RBLN adds it back",
    ),
    CompileInput(
        "vllm.num_gpu_blocks_override", "flag", ("num-gpu-blocks-override",), _int, None, _SIG
    ),
    CompileInput(
        "vllm.tensor_parallel_size",
        "flag",
        ("tensor-parallel-size", "tp"),
        _int,
        1,
        "parallel layout is in the config hash (§3.5)",
    ),
    CompileInput(
        "vllm.pipeline_parallel_size",
        "flag",
        ("pipeline-parallel-size", "pp"),
        _int,
        1,
        "parallel layout is in the config hash (§3.5)",
    ),
    CompileInput(
        "vllm.data_parallel_size",
        "flag",
        ("data-parallel-size", "dp"),
        _int,
        1,
        "parallel layout is in the config hash (§3.5)",
    ),
    CompileInput(
        "vllm.enable_expert_parallel",
        "flag",
        ("enable-expert-parallel", "ep"),
        _bool,
        False,
        "parallel layout (EP) is in the config hash (§3.5)",
    ),
    CompileInput("vllm.quantization", "flag", ("quantization",), _str, None, _UPSTREAM),
    CompileInput("vllm.kv_cache_dtype", "flag", ("kv-cache-dtype",), _str, "auto", _UPSTREAM),
    CompileInput("vllm.enforce_eager", "flag", ("enforce-eager",), _bool, False, _UPSTREAM),
    CompileInput("vllm.trust_remote_code", "flag", ("trust-remote-code",), _bool, False, _UPSTREAM),
    CompileInput(
        "vllm.distributed_executor_backend",
        "flag",
        ("distributed-executor-backend",),
        _str,
        None,
        _UPSTREAM,
    ),
    CompileInput(
        "vllm.model_impl",
        "flag",
        ("model-impl",),
        _str,
        "auto",
        "selects the vllm or optimum path, which compile different graphs (§3.3)",
    ),
    CompileInput(
        "vllm.disable_sliding_window",
        "flag",
        ("disable-sliding-window",),
        _bool,
        False,
        _MODEL + ": disable_sliding_window is not on its ignored list",
    ),
    CompileInput(
        "vllm.language_model_only",
        "flag",
        ("language-model-only",),
        _bool,
        False,
        _MODEL + ": it adds language_model_only for a multimodal model (counted for every "
        "model: a text model spends a compile at worst)",
    ),
    CompileInput(
        "vllm.mm_encoder_tp_mode",
        "flag",
        ("mm-encoder-tp-mode",),
        _str,
        "weights",
        _MULTIMODAL,
    ),
    CompileInput(
        "vllm.mm_encoder_attn_dtype", "flag", ("mm-encoder-attn-dtype",), _str, None, _MULTIMODAL
    ),
    CompileInput(
        "vllm.hf_overrides",
        "json",
        ("hf-overrides",),
        _canon,
        None,
        _MODEL + ": hf_overrides is ignored, but hf_config, which they change, is hashed",
    ),
    CompileInput(
        "vllm.attention_backend",
        "flag",
        ("attention-backend",),
        _str,
        None,
        "AttentionConfig.compute_hash hashes every field; --attention-backend sets its backend",
    ),
    CompileInput(
        "vllm.attention_config",
        "json",
        ("attention-config",),
        _canon,
        None,
        "AttentionConfig.compute_hash hashes every field (the JSON counts whole)",
    ),
    CompileInput(
        "vllm.compilation_config",
        "json",
        ("compilation-config",),
        _canon,
        None,
        "VllmConfig.compute_hash adds CompilationConfig.compute_hash(), every field but paths "
        "and timings (the JSON counts whole)",
    ),
    CompileInput(
        "vllm.kernel_config",
        "json",
        ("kernel-config",),
        _canon,
        None,
        "VllmConfig.compute_hash adds KernelConfig.compute_hash(), every field but warm-ups "
        "(the JSON counts whole)",
    ),
    CompileInput("vllm.moe_backend", "flag", ("moe-backend",), _str, "auto", _KERNEL),
    CompileInput("vllm.linear_backend", "flag", ("linear-backend",), _str, "auto", _KERNEL),
    CompileInput(
        "vllm.additional_config",
        "json",
        ("additional-config",),
        _canon,
        None,
        "vllm-rbln resolves --additional-config into RBLNConfig (its keys are the --rbln-* "
        "options, read as those); keys that are not RBLN fields (refused by vllm-rbln) count whole",
    ),
    CompileInput(
        "vllm.kv_transfer_config",
        "presence",
        ("kv-transfer-config",),
        _bool,
        False,
        "compute_hash adds a constant factor when a KV transfer config is present, "
        "'None' when absent; its content does not count (§3.5)",
    ),
    CompileInput("spec.method", "spec", ("method",), _str, None, _SIG + ": spec method"),
    CompileInput(
        "spec.num_speculative_tokens",
        "spec",
        ("num_speculative_tokens",),
        _int,
        None,
        _SIG + ": num_speculative_tokens",
    ),
    CompileInput("spec.model", "spec", ("model",), _str, None, _SIG + ": draft model hash"),
    CompileInput(
        "spec.draft_tensor_parallel_size",
        "spec",
        ("draft_tensor_parallel_size",),
        _int,
        None,
        _SIG + ": draft TP size",
    ),
    _rbln(
        "num_devices_per_local_rank",
        _int,
        1,
        "VLLM_RBLN_NUM_DEVICES_PER_LOCAL_RANK",
        "VLLM_RBLN_TP_SIZE",
    ),
    _rbln("enforce_model_fp32", _bool, False, "VLLM_RBLN_ENFORCE_MODEL_FP32"),
    _rbln("use_batch_attn_opt", _bool, False, "VLLM_RBLN_BATCH_ATTN_OPT"),
    _rbln("use_custom_kernel", _bool, False, "RBLN_USE_CUSTOM_KERNEL"),
    _rbln("use_dynamic_kv_cache", _bool, True, "VLLM_RBLN_USE_DYNAMIC_KV_CACHE"),
    _rbln("specialize_moe_decode", _bool, True, "VLLM_RBLN_SPECIALIZE_MOE_DECODE"),
    _rbln("use_moe_tokens_mask", _bool, True, "VLLM_RBLN_USE_MOE_TOKENS_MASK"),
    _rbln("use_all2all_dispatch", _bool, False, "VLLM_RBLN_DISPATCH_ALL2ALL"),
    _rbln("use_all2all_combine", _bool, False, "VLLM_RBLN_COMBINE_ALL2ALL"),
    _rbln(
        "decode_batch_bucket_strategy",
        _strategy,
        "exponential",
        "VLLM_RBLN_DECODE_BATCH_BUCKET_STRATEGY",
    ),
    _rbln("decode_batch_bucket_min", _int, 1, "VLLM_RBLN_DECODE_BATCH_BUCKET_MIN"),
    _rbln("decode_batch_bucket_step", _int, 2, "VLLM_RBLN_DECODE_BATCH_BUCKET_STEP"),
    _rbln("decode_batch_bucket_limit", _int, 1, "VLLM_RBLN_DECODE_BATCH_BUCKET_LIMIT"),
    _rbln(
        "decode_batch_bucket_manual_buckets",
        _int_list,
        [],
        "VLLM_RBLN_DECODE_BATCH_BUCKET_MANUAL_BUCKETS",
    ),
    _rbln("use_w8a8", _bool, False, "VLLM_RBLN_USE_W8A8"),
    _rbln("compile_dtype", _str, None),
    _rbln("optimum_overrides", _json, None),
    CompileInput(
        "env.VLLM_RBLN_USE_VLLM_MODEL",
        "env",
        ("VLLM_RBLN_USE_VLLM_MODEL",),
        _bool,
        False,
        "one of the three env vars hashed into the mega-cache key (§3.4)",
    ),
    CompileInput(
        "env.VLLM_RBLN_NUM_HIDDEN_LAYERS",
        "env",
        ("VLLM_RBLN_NUM_HIDDEN_LAYERS",),
        _int,
        0,
        "one of the three env vars hashed into the mega-cache key (§3.4)",
    ),
    CompileInput(
        "env.VLLM_RBLN_USE_DEVICE_TENSOR",
        "env",
        ("VLLM_RBLN_USE_DEVICE_TENSOR",),
        _bool,
        True,
        "one of the three env vars hashed into the mega-cache key (§3.4)",
    ),
    CompileInput(
        "host.npus",
        "input",
        ("npus",),
        _int,
        1,
        "devices per server: NPU count per rank is a recompile trigger (§3.5)",
    ),
    CompileInput(
        "host.sku", "input", ("sku",), _str, None, "the NPU name is in the signature (§3.5)"
    ),
    CompileInput(
        "host.compiler",
        "input",
        ("compiler",),
        _str,
        None,
        "rebel-compiler major.minor is in the signature (§3.5)",
    ),
)

#: Inputs added after fingerprints were first recorded (#37): left out of the hashed dict at
#: their default, so every selection that does not set them keeps its fingerprint (its warm
#: markers and store copies stay valid across the upgrade).
ADDED_AT_DEFAULT_OMITTED = frozenset(
    [
        "vllm.disable_sliding_window",
        "vllm.language_model_only",
        "vllm.mm_encoder_tp_mode",
        "vllm.mm_encoder_attn_dtype",
        "vllm.hf_overrides",
        "vllm.attention_backend",
        "vllm.attention_config",
        "vllm.compilation_config",
        "vllm.kernel_config",
        "vllm.moe_backend",
        "vllm.linear_backend",
        "vllm.additional_config",
    ]
)

_RBLN_KEYS = frozenset(e.key for e in COMPILE_INPUTS if e.key.startswith("rbln."))

#: RBLN option fields that do not key the cache (sampler graphs compile every start, §3.5).
RBLN_NOT_COMPILED = frozenset({"use_custom_sampler", "enable_sub_block_cache", "sub_block_size"})

#: What deliberately does not count, with the reason (documentation and tests).
NOT_COUNTED: dict[str, str] = {
    "--port": "ports are zeroed before hashing (§3.5)",
    "--host": "not part of the config hash (§3.5)",
    "--served-model-name": "not a recompile trigger (§3.5)",
    "--enable-prefix-caching": "CacheConfig.compute_hash ignores prefix-cache knobs (§3.5)",
    "--no-enable-prefix-caching": "CacheConfig.compute_hash ignores prefix-cache knobs (§3.5)",
    "--rbln-enable-sub-block-cache": "excluded from the key by vllm-rbln (§3.5)",
    "--rbln-sub-block-size": "excluded from the key by vllm-rbln (§3.5)",
    "--rbln-use-custom-sampler": "sampler graphs compile every start, uncached (§3.5)",
    "VLLM_RBLN_SUB_BLOCK_CACHE": "sub-block cache settings are not triggers (§3.5)",
    "VLLM_RBLN_SUB_BLOCK_SIZE": "sub-block cache settings are not triggers (§3.5)",
    "VLLM_RBLN_SAMPLER": "the sampler is not cached (§3.5)",
    "LMCACHE_*": "read by lmcache, not part of the vLLM config hash (§3.4, §3.5)",
    "PYTHONHASHSEED": "an LMCache requirement, not a compile input (§3.4)",
    "VLLM_ENGINE_READY_TIMEOUT_S": "an upstream startup timeout (§3.4)",
    "--kv-transfer-config content": "its compute_hash has no factors: only presence counts (§3.5)",
    "--tool-call-parser": "an API-server option, not an engine config (§3.5)",
    "--reasoning-parser": "an API-server option, not an engine config (§3.5)",
    "--enable-auto-tool-choice": "an API-server option, not an engine config (§3.5)",
}


@functools.cache
def _short() -> dict[str, str]:
    """vLLM's one-dash spellings and the long name each stands for (``tp`` ->
    ``tensor-parallel-size``, ``cc`` -> ``compilation-config``, ``q`` -> ``quantization``,
    ``sc`` -> ``speculative-config``, ...), from the flag table of vLLM 0.30.0 (the same on both
    platforms): a spelling the fingerprint does not know would not count."""
    tab = vllm_flags.table("rbln")
    return {
        name[1:]: flag.spelling[2:]
        for name, flag in tab.flags.items()
        if not name.startswith("--") and flag.spelling.startswith("--")
    }


_BOOL_FLAGS = frozenset(
    [e.names[0] for e in COMPILE_INPUTS if e.source == "flag" and e.parse is _bool]
    + ["rbln-" + f.replace("_", "-") for f in ("use_custom_sampler", "enable_sub_block_cache")]
    + [
        "trust-remote-code",
        "enable-auto-tool-choice",
        "enable-prefix-caching",
        "enforce-eager",
        "disable-log-requests",
        "disable-log-stats",
        "enable-chunked-prefill",
    ]
)
_VALUE_FLAGS = frozenset(
    [n for e in COMPILE_INPUTS if e.source == "flag" and e.parse is not _bool for n in e.names]
    + [n for e in COMPILE_INPUTS if e.source == "json" for n in e.names]
    + ["speculative-config", "kv-transfer-config", "model", "port", "host", "served-model-name"]
)


# ---------------------------------------------------------------------------------------------
# argv scanning


@dataclass
class ScannedArgv:
    """A ``vllm serve`` argv read the way vLLM's parser reads it (last occurrence wins).

    + positionals: non-flag tokens after the launcher (the model first)
    + flags: normalised flag name -> value (``True``/``False`` for switches)
    + dotted: ``speculative-config`` -> {field: value} from ``--speculative-config.field v``
    """

    positionals: list[str]
    flags: dict[str, Any]
    dotted: dict[str, dict[str, Any]]


def _norm_flag(token: str) -> str:
    """``--max_num_seqs`` -> ``max-num-seqs``, ``-tp`` -> ``tensor-parallel-size``; a dotted
    JSON field keeps its own spelling (``speculative-config.num_speculative_tokens``)."""
    head, dot, sub = token.lstrip("-").partition(".")
    head = head.replace("_", "-")
    return _short().get(head, head) + dot + sub


def scan_argv(argv: Sequence[str]) -> ScannedArgv:
    """Read flags and positionals of a ``vllm serve`` argv.

    + argv: the full command, launcher first (``vllm serve MODEL --flag v ...``)
    """
    rest = list(argv[2:]) if len(argv) > 1 and argv[1] == "serve" else list(argv[1:])
    out = ScannedArgv([], {}, {})
    i = 0
    while i < len(rest):
        tok = rest[i]
        i += 1
        if not tok.startswith("-") or tok == "-":
            out.positionals.append(tok)
            continue
        name, eq, value = tok.partition("=")
        flag = _norm_flag(name)
        head, dot, sub = flag.partition(".")
        if eq:
            val: Any = value
        elif flag in _BOOL_FLAGS or (flag.startswith("no-") and flag[3:] in _BOOL_FLAGS):
            val = None
        elif i < len(rest) and (flag in _VALUE_FLAGS or dot or not rest[i].startswith("-")):
            val = rest[i]
            i += 1
        else:
            val = None
        if val is None:
            if flag.startswith("no-"):
                out.flags[flag[3:]] = False
            else:
                out.flags[flag] = True
        elif dot:
            try:
                parsed = load_json_text(val, f"--{flag}")
            except RecipeError:
                parsed = val  # a dotted value that is not JSON is a string
            out.dotted.setdefault(head, {})[sub] = parsed
        else:
            out.flags[flag] = val
    return out


def _json_value(scanned: ScannedArgv, flag: str) -> Any:
    """A JSON config flag's value: the object with its dotted fields merged, the text when it
    is not a JSON object (vLLM's ``union_dict_and_str``), or None when absent."""
    try:
        return json_flag(scanned, flag)
    except RecipeError:
        return scanned.flags.get(flag)


def json_flag(scanned: ScannedArgv, flag: str) -> dict[str, Any] | None:
    """A JSON-valued flag (``speculative-config``) merged with its dotted fields; None if absent.

    + scanned: the scanned argv
    + flag: the flag name without ``--``
    """
    raw = scanned.flags.get(flag)
    if raw is None and flag not in scanned.dotted:
        return None
    value: dict[str, Any] = {}
    if isinstance(raw, str):
        loaded = load_json_text(raw, f"--{flag}: not valid JSON: {raw[:80]!r}")
        if not isinstance(loaded, dict):
            raise RecipeError(f"--{flag}: expected a JSON object, got {raw[:80]!r}")
        value.update(loaded)
    value.update(scanned.dotted.get(flag, {}))
    return value


# ---------------------------------------------------------------------------------------------
# The fingerprint


def compiler_minor(version: str) -> str:
    """``0.12.0`` -> ``0.12``; refuse what is not a version.

    + version: a rebel-compiler version
    """
    m = re.match(r"(\d+)\.(\d+)(?:\.\d+)?(?:[.+-]?[0-9A-Za-z.+-]*)?\Z", version.strip())
    if not m:
        raise RecipeError(f"--compiler-version {version!r} is not a version like 0.12.0")
    return f"{int(m.group(1))}.{int(m.group(2))}"


def compile_inputs(
    argv: Sequence[str], env: Mapping[str, str], npus: int, sku: str, compiler_version: str
) -> dict[str, Any]:
    """The canonical compile inputs of one server: every :data:`COMPILE_INPUTS` key, normalised.

    + argv: the full ``vllm serve`` argv
    + env: the server's environment (recipe env; only compile env vars are read)
    + npus: devices per server
    + sku: the NPU SKU (``RBLN-CR13``)
    + compiler_version: the rebel-compiler version (only major.minor counts)
    """
    scanned = scan_argv(argv)
    spec = json_flag(scanned, "speculative-config") or {}
    extra = _json_value(scanned, "additional-config")
    rbln_extra: dict[str, Any] = {}
    if isinstance(extra, dict):  # RBLNConfig's fields, as vllm-rbln reads them: as the flags
        rbln_extra = {k: v for k, v in extra.items() if f"rbln.{k}" in _RBLN_KEYS}
        rest = {k: v for k, v in extra.items() if k not in rbln_extra}
        extra = {k: v for k, v in rest.items() if k not in RBLN_NOT_COMPILED} or None
    inputs = {"npus": npus, "sku": sku, "compiler": compiler_minor(compiler_version)}
    out: dict[str, Any] = {}
    for entry in COMPILE_INPUTS:
        value: Any = None
        if entry.source == "model":  # vllm serve: the positional model wins over --model
            value = scanned.positionals[0] if scanned.positionals else scanned.flags.get("model")
        elif entry.source == "flag":
            for name in entry.names:
                if name in scanned.flags:
                    value = scanned.flags[name]
            if value is None and entry.key.startswith("rbln."):
                value = rbln_extra.get(entry.key[len("rbln.") :])
            if value is None:
                value = next((env[e] for e in entry.env if e in env), None)
        elif entry.source == "json":
            name = entry.names[0]
            value = extra if name == "additional-config" else _json_value(scanned, name)
        elif entry.source == "env":
            value = env.get(entry.names[0])
        elif entry.source == "spec":
            value = spec.get(entry.names[0])
        elif entry.source == "presence":
            value = entry.names[0] in scanned.flags or entry.names[0] in scanned.dotted
        elif entry.source == "input":
            value = inputs[entry.names[0]]
        try:
            parsed = entry.default if value is None else entry.parse(value)
        except RecipeError as exc:
            raise RecipeError(f"compile input {entry.key}: {exc}") from None
        if parsed != entry.default or entry.key not in ADDED_AT_DEFAULT_OMITTED:
            out[entry.key] = parsed
    known = {e.key for e in COMPILE_INPUTS}
    for flag, value in scanned.flags.items():
        if flag.startswith("rbln-"):
            field = flag[len("rbln-") :].replace("-", "_")
            key = f"rbln.{field}"
            if field not in RBLN_NOT_COMPILED and key not in known:
                out[key] = _scalar(value)
    return out


def fingerprint(inputs: Mapping[str, Any]) -> str:
    """sha256 (hex) of the canonical JSON of compile inputs (sorted keys, no spaces).

    + inputs: the dict from :func:`compile_inputs`
    """
    text = json.dumps(inputs, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def compile_fingerprint(
    argv: Sequence[str], env: Mapping[str, str], npus: int, sku: str, compiler_version: str
) -> str:
    """The compile fingerprint of one server (see :func:`compile_inputs` for the parameters).

    + argv: the full ``vllm serve`` argv
    + env: the server's environment
    + npus: devices per server
    + sku: the NPU SKU
    + compiler_version: the rebel-compiler version
    """
    return fingerprint(compile_inputs(argv, env, npus, sku, compiler_version))
