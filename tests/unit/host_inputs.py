"""A host's inputs as the host plan takes them, shared by the unit tests that plan hosts: the
deploy data (the key table's defaults, with the index credentials), a probe of a CR13 host (and
of a converged one, and of an H200 GPU host), the units a probe reports for a plan's instances,
and the real probe run on this machine against the lab's stand-ins."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from lab_sim_support import SIMULATOR

from servefleet.entry.steps.facts import PROBE
from servefleet.hostplan.extras import resolve_for
from servefleet.hostplan.plan import plan_host
from servefleet.hostplan.probe_input import probe_args
from servefleet.settings.table import load_defaults, settings_from

CREDS = {"RBLN_INDEX_USER": "u", "RBLN_INDEX_PASSWORD": "p"}
CR13_PCI = [
    "03:00.0 1200: 1eff:2130",
    "04:00.0 1200: 1eff:2130",
    "05:00.0 1200: 1eff:2130",
    "06:00.0 1200: 1eff:2130",
]
CR13 = {"sku": "RBLN-CR13", "pci_device": "2130", "devices": 4}  # the lab's hardware.json
SMI = {"KMD_version": "3.5.1", "devices": [{"npu": n, "name": "RBLN-CR13"} for n in range(4)]}


def settings(**over: Any):
    """The key table's defaults, ``over`` on top, the index credentials set."""
    data = load_defaults()
    data.update(over)
    return settings_from(data.get, CREDS)


def defaults(**data: object):
    """Only ``data``'s keys given, every other key its default (as a host's data without them)."""
    return settings_from(lambda k: data.get(k), environ=CREDS, keys=data.keys())


def probe(**over: Any) -> dict[str, Any]:
    """A fresh CR13 host's probe (4 NPUs by lspci, no driver yet), ``over`` on top."""
    p: dict[str, Any] = {
        "kernel": "6.1.0-x",
        "libc": "glibc 2.39",  # Ubuntu 24.04: upstream vLLM's CPU wheel installs
        "smi": None,
        "pci": CR13_PCI,
        "releases": [],
        "current": None,
        "units": {},
        "warm": [],
        "models": [],
    }
    p.update(over)
    return p


def probed_units(plan: Any, running: dict[int, str | None], active: str = "active") -> dict:
    """What the probe reports of the plan's units: each written as planned, ``active``, running
    what ``running`` says by instance index (its planned sha otherwise)."""
    return {
        i.unit: {
            "active": active,
            "running": running.get(i.index, i.sha),
            "file": hashlib.sha256(i.text.encode()).hexdigest(),
            "reload": False,
        }
        for i in plan.instances
    }


def converged_probe(**over: object) -> dict:
    """The probe of a host the default data converged: driver, release, warm, models, units."""
    first = plan_host(settings(), probe(smi=SMI))
    pins = dict(first.release.expect)
    state = {
        "smi": SMI,
        "releases": [first.release.id],
        "current": first.release.id,
        "current_pins": pins,
        "warm": [first.spec.compile_fingerprint],
        "models": list(first.spec.requirements.models),
        "units": probed_units(first, {}),
        "good": first.release.id,
        "good_shas": [i.sha for i in first.instances],
    }
    return probe(**{**state, **over})


def run_probe(
    tmp: Path, hardware: dict[str, Any] | None, *, driver: bool, timeout: float = 120, **over: Any
) -> dict:
    """PROBE on this machine, with the lab's stand-ins first on PATH and RBLN_SIM_ROOT=tmp (a
    probe that does not answer within ``timeout`` seconds is killed: TimeoutExpired)."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    if driver:
        smi = (SIMULATOR / "driver" / "rbln_smi.py").read_text().replace("@VERSION@", "3.5.1")
        (bin_dir / "rbln-smi").write_text(smi.replace("#!/usr/bin/python3", f"#!{sys.executable}"))
        (bin_dir / "rbln-smi").chmod(0o755)
    lspci = (SIMULATOR / "sim" / "lspci").read_text()
    (bin_dir / "lspci").write_text(lspci.replace("#!/usr/bin/python3", f"#!{sys.executable}"))
    (bin_dir / "lspci").chmod(0o755)
    if hardware is not None:
        (tmp / "etc" / "rbln-sim").mkdir(parents=True, exist_ok=True)
        (tmp / "etc" / "rbln-sim" / "hardware.json").write_text(json.dumps(hardware))
    # the serve user's trees in tmp: past the data's check (#31 (3): only below /var/lib, ...)
    s = dataclasses.replace(settings(serve_root=str(tmp / "opt"), **over),
                            models_hf_home=str(tmp / "hf"), serve_cache_root=str(tmp / "cache"))  # fmt: skip
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "RBLN_SIM_ROOT": str(tmp),
        "HOME": str(tmp),
    }
    out = subprocess.run(
        [shutil.which("python3") or sys.executable, "-c", PROBE, probe_args(s, resolve_for(s))],
        env=env, capture_output=True, text=True, check=True, timeout=timeout,
    )  # fmt: skip
    return json.loads(out.stdout)


# An H200 GPU host: the vLLM recipe's data, nvidia-smi's CSV lines (index, name, MiB, driver)
H200 = [f"{i}, NVIDIA H200, 143771, 570.133.20" for i in range(8)]
GPU_DATA = {
    "serve_recipe": "vllm/openai/gpt-oss-120b",
    "serve_hardware": "h200",
    "sdk_pins": ["vllm==0.30.0", "torch==2.13.0"],
    "sdk_extra_packages": {},
    "pip_indexes": {},
    "pip_public_index": "https://pypi.example/simple",
}


def gpu_settings(**over: Any):
    data = load_defaults()
    data.update(GPU_DATA)
    data.update(over)
    return settings_from(data.get, {})


def gpu_probe(lines: list[str] | None = None, **over: Any) -> dict[str, Any]:
    """A GPU host's probe: no NPU, nvidia-smi's ``lines`` (8 H200s by default)."""
    return probe(smi=None, pci=[], gpus=H200 if lines is None else lines, **over)
