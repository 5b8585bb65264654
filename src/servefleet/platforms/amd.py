"""AMD GPUs: devices, models, memory and driver from ``amd-smi static --json``; servers get
``HIP_VISIBLE_DEVICES``. The rest is every GPU platform's (:mod:`.gpu`)."""

from __future__ import annotations

import json
from typing import Any

from servefleet.base.errors import ProbeError
from servefleet.platforms.base import Hardware
from servefleet.platforms.gpu import Gpu, number

# What the probe runs (its output lands under "amd"): one JSON document
AMD_QUERY = ("amd-smi", "static", "--asic", "--vram", "--driver", "--json")


def _section(gpu: dict[str, Any], key: str) -> dict[str, Any]:
    """A section of one GPU in amd-smi's JSON; amd-smi prints ``"N/A"`` for one it cannot read."""
    value = gpu.get(key)
    return value if isinstance(value, dict) else {}


def read_json(text: str) -> Hardware | None:
    """amd-smi's JSON (a list of GPUs, or ``{"gpu_data": [...]}``): None when it lists none."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
        return None
    gpus = (
        data
        if isinstance(data, list)
        else data.get("gpu_data", [])
        if isinstance(data, dict)
        else []
    )
    names, devices, memory, driver = [], [], [], None
    for i, gpu in enumerate(g for g in gpus if isinstance(g, dict)):
        asic, vram, drv = (_section(gpu, k) for k in ("asic", "vram", "driver"))
        size = vram.get("size") or {}
        value = size.get("value") if isinstance(size, dict) else size
        index = gpu.get("gpu", i)
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < 1024:
            raise ProbeError(f"amd-smi: unexpected gpu index {str(index)[:40]!r}; allowed: 0-1023")
        names.append(str(asic.get("market_name") or "AMD GPU"))
        devices.append(index)
        memory.append(int(str(value)) if number(str(value)) else 0)
        driver = driver or str(drv.get("version") or "") or None
    if not devices:
        return None
    return Hardware("amd-smi", tuple(names), tuple(devices), driver, tuple(memory))


class Amd(Gpu):
    name = "amd"
    title = "AMD GPU"
    probe_commands = (("amd", AMD_QUERY, "lines", None),)
    devices_env = "HIP_VISIBLE_DEVICES"

    def read(self, probe: dict[str, Any]) -> Hardware | None:
        amd = probe.get("amd") or []
        lines = isinstance(amd, list) and all(isinstance(x, str) for x in amd)
        return read_json("\n".join(amd) if lines else "")


PLATFORM = Amd()
