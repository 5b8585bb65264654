"""NVIDIA GPUs: devices, models, memory and driver from ``nvidia-smi``'s CSV query; servers get
``CUDA_VISIBLE_DEVICES``. The rest is every GPU platform's (:mod:`.gpu`)."""

from __future__ import annotations

from typing import Any

from servefleet.platforms.base import Hardware
from servefleet.platforms.gpu import Gpu, number

# What the probe runs (its output lands under "gpus"): one CSV line per GPU
NVIDIA_QUERY = (
    "nvidia-smi",
    "--query-gpu=index,name,memory.total,driver_version",
    "--format=csv,noheader,nounits",
)


def read_csv(lines: Any) -> Hardware | None:
    """``nvidia-smi``'s CSV lines (index, name, memory in MiB, driver), read strictly: None for
    anything else (no GPU, another query's output)."""
    if not isinstance(lines, list) or not all(isinstance(line, str) for line in lines):
        return None
    rows = [[f.strip() for f in line.split(",")] for line in lines if line.strip()]
    if not rows or any(len(r) != 4 or not number(r[0]) or not number(r[2]) for r in rows):
        return None
    return Hardware(
        source="nvidia-smi",
        skus=tuple(r[1] for r in rows),
        devices=tuple(int(r[0]) for r in rows),
        driver_version=rows[0][3],
        memory_mib=tuple(int(r[2]) for r in rows),
    )


class Nvidia(Gpu):
    name = "nvidia"
    title = "NVIDIA GPU"
    probe_commands = (("gpus", NVIDIA_QUERY, "lines", None),)
    devices_env = "CUDA_VISIBLE_DEVICES"

    def read(self, probe: dict[str, Any]) -> Hardware | None:
        return read_csv(probe.get("gpus") or [])

    def empty(self) -> Hardware:
        return Hardware("nvidia-smi", (), (), None)


PLATFORM = Nvidia()
