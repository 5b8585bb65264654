"""RBLN NPUs (RBLN-CR13 first): devices from ``rbln-smi -j`` once a driver exists, else from PCI
ids (vendor 0x1eff); the driver is Rebellions' runfile, which servefleet installs
(:mod:`.rbln_driver`); a release is ``vllm-rbln`` with its pinned SDK; servers get
``RBLN_VISIBLE_DEVICES``; a cold first start compiles (``VLLM_RBLN_COMPILE_ONLY`` builds it with
no NPU, into ``rbln/<model>/<sig>`` under the cache root), within ``serve_prewarm_timeout``.
"""

from __future__ import annotations

from typing import Any

from servefleet.base.errors import ProbeError
from servefleet.platforms import rbln_driver
from servefleet.platforms.base import DriverPlan, Hardware, Platform, Wants

# PCI device ids of vendor 0x1eff (rbln-npu-feature-discovery's rebellions-pci.ids; rbln.md §1.3);
# the second id of each pair is the SR-IOV virtual function.
RBLN_VENDOR = "1eff"
SKU_BY_PCI_DEVICE = {
    "1020": "RBLN-CA02", "1021": "RBLN-CA02", "1110": "RBLN-CA11", "1111": "RBLN-CA11",
    "1120": "RBLN-CA12", "1121": "RBLN-CA12", "1150": "RBLN-CA15", "1210": "RBLN-CA21",
    "1211": "RBLN-CA21", "1220": "RBLN-CA22", "1221": "RBLN-CA22", "1250": "RBLN-CA25",
    "1251": "RBLN-CA25", "2030": "RBLN-CR03", "2031": "RBLN-CR03", "2130": "RBLN-CR13",
    "2131": "RBLN-CR13", "2230": "RBLN-CR23", "2231": "RBLN-CR23",
}  # fmt: skip
# a compiled cache: rbln/<model>/<sig>, two names, neither "." nor ".."
_NAME = r"(?!\.{1,2}(?:/|$))[A-Za-z0-9._-]+"


def _from_smi(smi: Any) -> Hardware:
    """``rbln-smi -j``: ``{"KMD_version": "3.5.1", "devices": [{"npu": 0, "name": ...}]}``."""
    devices = smi.get("devices") if isinstance(smi, dict) else None
    driver = smi.get("KMD_version") if isinstance(smi, dict) else None
    ok = isinstance(smi, dict) and isinstance(devices or [], list)
    ok = ok and isinstance(driver, (str, type(None)))
    ok = ok and all(isinstance(d, dict) for d in devices or [])
    names, indexes = [], []
    for i, d in enumerate(devices or [] if ok else []):
        npu = d.get("npu", i)
        if isinstance(npu, bool) or not isinstance(npu, int) or not 0 <= npu < 1024:
            ok = False
            break
        names.append(str(d.get("name")))
        indexes.append(npu)
    if not ok:
        raise ProbeError(
            f"rbln-smi -j: unexpected output {str(smi)[:80]!r}; allowed: KMD_version and "
            "devices, each with an npu index 0-1023 and a name"
        )
    return Hardware("rbln-smi", tuple(names), tuple(indexes), driver)


def hardware_from_probe(probe: dict[str, Any]) -> Hardware:
    """Read the probe's ``rbln-smi -j`` output, or its ``lspci -n`` lines before a driver."""
    smi = probe.get("smi")
    if smi:
        return _from_smi(smi)
    skus = []
    pci = probe.get("pci") or []
    if not isinstance(pci, list) or not all(isinstance(line, str) for line in pci):
        raise ProbeError(f"lspci -n: unexpected output {str(pci)[:80]!r}; allowed: lines of text")
    for line in pci:
        # "03:00.0 1200: 1eff:2130" (slot, class, vendor:device[, (rev xx)])
        for field in line.split():
            vendor, _, device = field.partition(":")
            if vendor.lower() == RBLN_VENDOR and len(device) == 4:
                skus.append(SKU_BY_PCI_DEVICE.get(device.lower(), f"unknown 1eff:{device}"))
    return Hardware("lspci", tuple(skus), tuple(range(len(skus))), None)


class Rbln(Platform):
    name = "rbln"
    title = "RBLN NPU"
    stack = "rbln"
    flag_table = "rbln"  # vllm-rbln 0.12.0's `vllm serve`
    probe_commands = (
        ("smi", ("rbln-smi", "-j"), "json", None),  # once a driver exists
        ("pci", ("lspci", "-n"), "lines", "smi"),  # before: the PCI ids
    )
    device_word = "NPUs"
    devices_env = "RBLN_VISIBLE_DEVICES"
    deploy_env = {  # the compile-only pre-warm's
        "VLLM_RBLN_COMPILE_ONLY": "serve_prewarm_host",
        "RBLN_FORCE_NPU_NAME": "serve_prewarm_host",
    }
    driver_step = "runfile"
    compiles = True
    compile_only_env = {"VLLM_RBLN_COMPILE_ONLY": "1", "RBLN_FORCE_NPU_NAME": "{sku}"}
    cache_dirs = rf"^rbln/{_NAME}/{_NAME}$"
    keys = frozenset(
        {
            "driver_version",
            "driver_runfile_url",
            "driver_sha256",
            "driver_installer_args",
            "driver_apt_packages",
            "driver_apt_repo",
            "serve_prewarm_timeout",
        }
    )

    def read(self, probe: dict[str, Any]) -> Hardware | None:
        return hardware_from_probe(probe)

    def driver_needed(self, settings: Wants, hardware: Hardware) -> bool:
        return hardware.driver_version != settings.driver_version

    def driver_problem(self, settings: Wants) -> str | None:
        return rbln_driver.driver_problem(settings)

    def driver_plan(self, settings: Wants, kernel: str) -> DriverPlan | None:
        return rbln_driver.driver_plan(settings, kernel)

    def required_pins(self) -> tuple[str, ...]:
        return ("rebel-compiler", "vllm-rbln")

    def top_requirement(self, settings: Wants, extras: list[str]) -> tuple[str, str]:
        shown = f"[{','.join(extras)}]" if extras else ""
        return f"vllm-rbln{shown}=={settings.sdk_pins['vllm-rbln']}", "vllm-rbln"

    def first_start_timeout(self, settings: Wants) -> int:
        return settings.serve_prewarm_timeout


PLATFORM = Rbln()
