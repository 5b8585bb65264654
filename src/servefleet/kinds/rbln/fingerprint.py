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

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from servefleet.base.errors import RecipeError
from servefleet.kinds.rbln.argv_scan import json_flag, json_value, scan_argv
from servefleet.kinds.rbln.compile_table import (
    ADDED_AT_DEFAULT_OMITTED,
    COMPILE_INPUTS,
    RBLN_KEYS,
    RBLN_NOT_COMPILED,
)
from servefleet.kinds.rbln.compile_values import parse_scalar


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
    extra = json_value(scanned, "additional-config")
    rbln_extra: dict[str, Any] = {}
    if isinstance(extra, dict):  # RBLNConfig's fields, as vllm-rbln reads them: as the flags
        rbln_extra = {k: v for k, v in extra.items() if f"rbln.{k}" in RBLN_KEYS}
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
            value = extra if name == "additional-config" else json_value(scanned, name)
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
                out[key] = parse_scalar(value)
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
