"""The testbox platform: hosts list their boxes in ``<state>/devices`` (``<index> <model>``
lines) and their driver in ``<state>/driver.json``, which its driver step writes and checks; a
release is its serving package at its pin. Everything it touches on a host lives in ``state``."""

from __future__ import annotations

import json
from typing import Any

from servefleet.platforms.base import DriverPlan, Hardware, Platform, Wants


class Testbox(Platform):
    """The platform, its host files under ``state``.

    + state: the directory that stands for the host's devices and driver
    + writes: the driver version its install writes (default: the wanted one; another makes
      the step's check fail)
    """

    name = "testbox"
    title = "Testbox"
    stack = "testbox"
    devices_env = "TESTBOX_VISIBLE_DEVICES"
    device_word = "boxes"
    driver_step = "runfile"
    keys = frozenset({"driver_version"})

    def __init__(self, state: str, writes: str | None = None) -> None:
        self.state = state
        self.writes = writes
        self.probe_commands = (
            ("boxes", ("cat", f"{state}/devices"), "lines", None),
            ("box_driver", ("cat", f"{state}/driver.json"), "json", None),
        )

    def read(self, probe: dict[str, Any]) -> Hardware | None:
        rows = [line.split() for line in probe.get("boxes") or []]
        driver = probe.get("box_driver") or {}
        return Hardware(
            "testbox-list",
            tuple(r[1] for r in rows),
            tuple(int(r[0]) for r in rows),
            driver.get("version") if isinstance(driver, dict) else None,
        )

    def driver_needed(self, settings: Wants, hardware: Hardware) -> bool:
        return hardware.driver_version != settings.driver_version

    def driver_plan(self, settings: Wants, kernel: str) -> DriverPlan:
        version = settings.driver_version
        written = json.dumps({"version": self.writes or version})
        return DriverPlan(
            version=version,
            install=(
                "sh",
                "-c",
                f"echo installing; printf %s '{written}' >{self.state}/driver.json",
            ),
            log=f"{self.state}/install-{version}.log",
            check=(("cat", f"{self.state}/driver.json"), "version"),
        )

    def required_pins(self) -> tuple[str, ...]:
        return ("testbox-serve",)

    def top_requirement(self, settings: Wants, extras: list[str]) -> tuple[str, str]:
        return f"testbox-serve=={settings.sdk_pins['testbox-serve']}", "testbox-serve"
