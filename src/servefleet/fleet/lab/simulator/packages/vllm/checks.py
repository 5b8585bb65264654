"""Start-up checks of the CPU build with vllm-rbln: the RBLN packages (no squatter, one
major.minor), the model in the Hugging Face cache, rbln-smi's NPUs and their locks, compile-only
mode and its target NPU, the mega-cache bundle (loaded, or "compiled" and saved) and the fault
switches. A SIMULATION for the servefleet lab."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import importlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

from .common import (
    BUNDLE_FIELDS,
    BUNDLE_PAYLOAD_BYTES,
    COMPILE_ONLY_ENV,
    DEFAULT_COMPILE_SECONDS,
    NPU_NAME_ENV,
    SIM_ETC,
    SIM_LOG,
    SIM_RUN,
    SimError,
    sim_path,
)
from .compile_cache import _env_bool, bundle_path, cache_root, visible_devices
from .flag_table import _object
from .reasoning import ReasoningParserManager


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


def snapshot_digest(env: Mapping[str, str], model: str) -> str:
    """What a compile read of the model: a digest of every file of its snapshot (name and
    content; the real compiler's output depends on the config, the code and the weights), as
    compile.log records it, so a test sees whether a compile read a file planted in the hub.

    + env: the environment (HF_HOME)
    + model: an HF id org/name or a local path ("-": not found)
    """
    try:
        top = find_snapshot(env, model)
    except SimError:
        return "-"  # no snapshot to read (the server refuses it before it compiles)
    digest = hashlib.sha256()
    for here, dirs, files in os.walk(top):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(here, name)
            with open(path, "rb") as fh:
                content = hashlib.sha256(fh.read()).hexdigest()
            digest.update(f"{os.path.relpath(path, top)}\0{content}\n".encode())
    return digest.hexdigest()[:16]


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
        f" compile_only={int(compile_only)} npu={npu} read={snapshot_digest(env, ns.model)}\n"
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
    + name: ``fail-start``, ``fail-health`` or ``stale-peer``
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


def check_reasoning_parser(ns: argparse.Namespace) -> None:
    """The engine's look-up of the reasoning parser, once the model's config and tokenizer are
    read (vLLM's ``VllmConfig`` builds the ``ReasoningConfig`` of ``--reasoning-parser``, or of
    ``--reasoning-config``'s ``reasoning_parser``, and ``initialize_token_ids`` asks
    ``ReasoningParserManager.get_reasoning_parser``, vllm/config/reasoning.py): a name vLLM
    0.30.0 does not register fails the start with vLLM's KeyError, after the parse and the API
    server's checks passed.

    + ns: the parsed arguments
    """
    name = ns.reasoning_parser or _object(ns.reasoning_config).get("reasoning_parser")
    if not name:
        return
    try:
        ReasoningParserManager.get_reasoning_parser(str(name))
    except KeyError as exc:
        raise SimError(f"KeyError: {exc}") from None
