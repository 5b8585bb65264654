"""The compile-input table: what makes vllm-rbln recompile, each entry with its reason.

vllm-rbln keys its compile cache (rbln.md §3.5) on the vLLM config hash (ports zeroed), a few
engine settings, the speculative config, the RBLN compile options, three env vars, the NPU
name and the rebel-compiler major.minor. :data:`COMPILE_INPUTS` is the one table of what this
toolkit counts; :data:`NOT_COUNTED` lists what deliberately does not count.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from servefleet.kinds.rbln.compile_values import (
    parse_bool,
    parse_canon,
    parse_float,
    parse_human_int,
    parse_int,
    parse_int_list,
    parse_json,
    parse_str,
    parse_strategy,
)


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
        parse_str,
        None,
        "the model string as given keys the cache (HF id and local path differ) (§3.5)",
    ),
    CompileInput("vllm.dtype", "flag", ("dtype",), parse_str, "auto", _CFG),
    CompileInput("vllm.max_model_len", "flag", ("max-model-len",), parse_human_int, None, _CFG),
    CompileInput("vllm.block_size", "flag", ("block-size",), parse_int, None, _CFG),
    CompileInput("vllm.max_num_seqs", "flag", ("max-num-seqs",), parse_int, None, _SIG),
    CompileInput(
        "vllm.max_num_batched_tokens", "flag", ("max-num-batched-tokens",), parse_int, None, _CFG
    ),
    CompileInput(
        "vllm.gpu_memory_utilization",
        "flag",
        ("gpu-memory-utilization",),
        parse_float,
        0.9,
        _SIG + "; CacheConfig's own hash ignores it, RBLN adds it back",
    ),
    CompileInput(
        "vllm.num_gpu_blocks_override", "flag", ("num-gpu-blocks-override",), parse_int, None, _SIG
    ),
    CompileInput(
        "vllm.tensor_parallel_size",
        "flag",
        ("tensor-parallel-size", "tp"),
        parse_int,
        1,
        "parallel layout is in the config hash (§3.5)",
    ),
    CompileInput(
        "vllm.pipeline_parallel_size",
        "flag",
        ("pipeline-parallel-size", "pp"),
        parse_int,
        1,
        "parallel layout is in the config hash (§3.5)",
    ),
    CompileInput(
        "vllm.data_parallel_size",
        "flag",
        ("data-parallel-size", "dp"),
        parse_int,
        1,
        "parallel layout is in the config hash (§3.5)",
    ),
    CompileInput(
        "vllm.enable_expert_parallel",
        "flag",
        ("enable-expert-parallel", "ep"),
        parse_bool,
        False,
        "parallel layout (EP) is in the config hash (§3.5)",
    ),
    CompileInput("vllm.quantization", "flag", ("quantization",), parse_str, None, _UPSTREAM),
    CompileInput("vllm.kv_cache_dtype", "flag", ("kv-cache-dtype",), parse_str, "auto", _UPSTREAM),
    CompileInput("vllm.enforce_eager", "flag", ("enforce-eager",), parse_bool, False, _UPSTREAM),
    CompileInput(
        "vllm.trust_remote_code", "flag", ("trust-remote-code",), parse_bool, False, _UPSTREAM
    ),
    CompileInput(
        "vllm.distributed_executor_backend",
        "flag",
        ("distributed-executor-backend",),
        parse_str,
        None,
        _UPSTREAM,
    ),
    CompileInput(
        "vllm.model_impl",
        "flag",
        ("model-impl",),
        parse_str,
        "auto",
        "selects the vllm or optimum path, which compile different graphs (§3.3)",
    ),
    CompileInput(
        "vllm.disable_sliding_window",
        "flag",
        ("disable-sliding-window",),
        parse_bool,
        False,
        _MODEL + ": disable_sliding_window is not on its ignored list",
    ),
    CompileInput(
        "vllm.language_model_only",
        "flag",
        ("language-model-only",),
        parse_bool,
        False,
        _MODEL + ": it adds language_model_only for a multimodal model (counted for every "
        "model: a text model spends a compile at worst)",
    ),
    CompileInput(
        "vllm.mm_encoder_tp_mode",
        "flag",
        ("mm-encoder-tp-mode",),
        parse_str,
        "weights",
        _MULTIMODAL,
    ),
    CompileInput(
        "vllm.mm_encoder_attn_dtype",
        "flag",
        ("mm-encoder-attn-dtype",),
        parse_str,
        None,
        _MULTIMODAL,
    ),
    CompileInput(
        "vllm.hf_overrides",
        "json",
        ("hf-overrides",),
        parse_canon,
        None,
        _MODEL + ": hf_overrides is ignored, but hf_config, which they change, is hashed",
    ),
    CompileInput(
        "vllm.attention_backend",
        "flag",
        ("attention-backend",),
        parse_str,
        None,
        "AttentionConfig.compute_hash hashes every field; --attention-backend sets its backend",
    ),
    CompileInput(
        "vllm.attention_config",
        "json",
        ("attention-config",),
        parse_canon,
        None,
        "AttentionConfig.compute_hash hashes every field (the JSON counts whole)",
    ),
    CompileInput(
        "vllm.compilation_config",
        "json",
        ("compilation-config",),
        parse_canon,
        None,
        "VllmConfig.compute_hash adds CompilationConfig.compute_hash(), every field but paths "
        "and timings (the JSON counts whole)",
    ),
    CompileInput(
        "vllm.kernel_config",
        "json",
        ("kernel-config",),
        parse_canon,
        None,
        "VllmConfig.compute_hash adds KernelConfig.compute_hash(), every field but warm-ups "
        "(the JSON counts whole)",
    ),
    CompileInput("vllm.moe_backend", "flag", ("moe-backend",), parse_str, "auto", _KERNEL),
    CompileInput("vllm.linear_backend", "flag", ("linear-backend",), parse_str, "auto", _KERNEL),
    CompileInput(
        "vllm.additional_config",
        "json",
        ("additional-config",),
        parse_canon,
        None,
        "vllm-rbln resolves --additional-config into RBLNConfig (its keys are the --rbln-* "
        "options, read as those); keys that are not RBLN fields (refused by vllm-rbln) count whole",
    ),
    CompileInput(
        "vllm.kv_transfer_config",
        "presence",
        ("kv-transfer-config",),
        parse_bool,
        False,
        "compute_hash adds a constant factor when a KV transfer config is present, "
        "'None' when absent; its content does not count (§3.5)",
    ),
    CompileInput("spec.method", "spec", ("method",), parse_str, None, _SIG + ": spec method"),
    CompileInput(
        "spec.num_speculative_tokens",
        "spec",
        ("num_speculative_tokens",),
        parse_int,
        None,
        _SIG + ": num_speculative_tokens",
    ),
    CompileInput("spec.model", "spec", ("model",), parse_str, None, _SIG + ": draft model hash"),
    CompileInput(
        "spec.draft_tensor_parallel_size",
        "spec",
        ("draft_tensor_parallel_size",),
        parse_int,
        None,
        _SIG + ": draft TP size",
    ),
    _rbln(
        "num_devices_per_local_rank",
        parse_int,
        1,
        "VLLM_RBLN_NUM_DEVICES_PER_LOCAL_RANK",
        "VLLM_RBLN_TP_SIZE",
    ),
    _rbln("enforce_model_fp32", parse_bool, False, "VLLM_RBLN_ENFORCE_MODEL_FP32"),
    _rbln("use_batch_attn_opt", parse_bool, False, "VLLM_RBLN_BATCH_ATTN_OPT"),
    _rbln("use_custom_kernel", parse_bool, False, "RBLN_USE_CUSTOM_KERNEL"),
    _rbln("use_dynamic_kv_cache", parse_bool, True, "VLLM_RBLN_USE_DYNAMIC_KV_CACHE"),
    _rbln("specialize_moe_decode", parse_bool, True, "VLLM_RBLN_SPECIALIZE_MOE_DECODE"),
    _rbln("use_moe_tokens_mask", parse_bool, True, "VLLM_RBLN_USE_MOE_TOKENS_MASK"),
    _rbln("use_all2all_dispatch", parse_bool, False, "VLLM_RBLN_DISPATCH_ALL2ALL"),
    _rbln("use_all2all_combine", parse_bool, False, "VLLM_RBLN_COMBINE_ALL2ALL"),
    _rbln(
        "decode_batch_bucket_strategy",
        parse_strategy,
        "exponential",
        "VLLM_RBLN_DECODE_BATCH_BUCKET_STRATEGY",
    ),
    _rbln("decode_batch_bucket_min", parse_int, 1, "VLLM_RBLN_DECODE_BATCH_BUCKET_MIN"),
    _rbln("decode_batch_bucket_step", parse_int, 2, "VLLM_RBLN_DECODE_BATCH_BUCKET_STEP"),
    _rbln("decode_batch_bucket_limit", parse_int, 1, "VLLM_RBLN_DECODE_BATCH_BUCKET_LIMIT"),
    _rbln(
        "decode_batch_bucket_manual_buckets",
        parse_int_list,
        [],
        "VLLM_RBLN_DECODE_BATCH_BUCKET_MANUAL_BUCKETS",
    ),
    _rbln("use_w8a8", parse_bool, False, "VLLM_RBLN_USE_W8A8"),
    _rbln("compile_dtype", parse_str, None),
    _rbln("optimum_overrides", parse_json, None),
    CompileInput(
        "env.VLLM_RBLN_USE_VLLM_MODEL",
        "env",
        ("VLLM_RBLN_USE_VLLM_MODEL",),
        parse_bool,
        False,
        "one of the three env vars hashed into the mega-cache key (§3.4)",
    ),
    CompileInput(
        "env.VLLM_RBLN_NUM_HIDDEN_LAYERS",
        "env",
        ("VLLM_RBLN_NUM_HIDDEN_LAYERS",),
        parse_int,
        0,
        "one of the three env vars hashed into the mega-cache key (§3.4)",
    ),
    CompileInput(
        "env.VLLM_RBLN_USE_DEVICE_TENSOR",
        "env",
        ("VLLM_RBLN_USE_DEVICE_TENSOR",),
        parse_bool,
        True,
        "one of the three env vars hashed into the mega-cache key (§3.4)",
    ),
    CompileInput(
        "host.npus",
        "input",
        ("npus",),
        parse_int,
        1,
        "devices per server: NPU count per rank is a recompile trigger (§3.5)",
    ),
    CompileInput(
        "host.sku", "input", ("sku",), parse_str, None, "the NPU name is in the signature (§3.5)"
    ),
    CompileInput(
        "host.compiler",
        "input",
        ("compiler",),
        parse_str,
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

#: The ``rbln.*`` keys of :data:`COMPILE_INPUTS` (RBLNConfig's fields the table counts).
RBLN_KEYS = frozenset(e.key for e in COMPILE_INPUTS if e.key.startswith("rbln."))

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
