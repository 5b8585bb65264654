"""The testgpu platform: a GPU whose host lists its devices in ``<state>/gpus`` (``<index>
<memory MiB> <driver> <model...>`` lines); servers get ``TESTGPU_VISIBLE_DEVICES``. It serves
vLLM's recipes (``serves``) and installs what every GPU platform does (upstream vLLM at its
pin); its driver must be there: it reads ``driver_version`` (the driver it must find, which no
other GPU platform reads), and a host with another fails before any change."""

from __future__ import annotations

from typing import Any

from servefleet.platforms.base import Hardware, Wants
from servefleet.platforms.gpu import Gpu


class Testgpu(Gpu):
    """The platform, its host's device list in ``state``.

    + state: the directory that stands for the host's GPUs
    """

    name = "testgpu"
    title = "Test GPU"
    serves = ("vllm",)
    devices_env = "TESTGPU_VISIBLE_DEVICES"
    keys = Gpu.keys | {"driver_version"}

    def __init__(self, state: str) -> None:
        self.state = state
        self.probe_commands = (("testgpus", ("cat", f"{state}/gpus"), "lines", None),)

    def read(self, probe: dict[str, Any]) -> Hardware | None:
        rows = [line.split(maxsplit=3) for line in probe.get("testgpus") or [] if line.strip()]
        if not rows:
            return None
        return Hardware(
            "testgpu-list",
            tuple(r[3] for r in rows),
            tuple(int(r[0]) for r in rows),
            rows[0][2],
            tuple(int(r[1]) for r in rows),
        )

    def driver_needed(self, settings: Wants, hardware: Hardware) -> bool:
        return hardware.driver_version != settings.driver_version

    def driver_problem(self, settings: Wants) -> str | None:
        return (
            f"driver_version: servefleet installs no testgpu driver; allowed: the driver the "
            f"host has (wanted {settings.driver_version})"
        )

    def empty(self) -> Hardware:
        return Hardware("testgpu-list", (), (), None)
