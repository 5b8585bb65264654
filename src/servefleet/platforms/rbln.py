"""RBLN NPU hosts (RBLN-CR13 first): devices from ``rbln-smi -j`` once a driver exists, else
from PCI ids; the driver is a runfile servefleet installs; a release is ``vllm-rbln`` with its
pinned SDK; servers get ``RBLN_VISIBLE_DEVICES``; a cold first start compiles (pre-warm)."""

from __future__ import annotations

from typing import Any

from servefleet.data import Settings
from servefleet.platforms import Hardware, Platform
from servefleet.recipes import load_rbln
from servefleet.resolve import resolve_rbln
from servefleet.spec import ServeSpec

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


def hardware_from_probe(probe: dict[str, Any]) -> Hardware:
    """Read the probe's ``rbln-smi -j`` output, or its ``lspci -n`` lines before a driver."""
    smi = probe.get("smi")
    if smi:
        devices = smi.get("devices") or []
        return Hardware(
            source="rbln-smi",
            skus=tuple(str(d.get("name")) for d in devices),
            devices=tuple(int(d.get("npu", i)) for i, d in enumerate(devices)),
            driver_version=smi.get("KMD_version"),
        )
    skus = []
    for line in probe.get("pci") or []:
        # "03:00.0 1200: 1eff:2130" (slot, class, vendor:device[, (rev xx)])
        for field in line.split():
            vendor, _, device = field.partition(":")
            if vendor.lower() == RBLN_VENDOR and len(device) == 4:
                skus.append(SKU_BY_PCI_DEVICE.get(device.lower(), f"unknown 1eff:{device}"))
    return Hardware("lspci", tuple(skus), tuple(range(len(skus))), None)


class Rbln(Platform):
    name = "rbln"
    device_word = "NPUs"
    devices_env = "RBLN_VISIBLE_DEVICES"
    driver_step = "runfile"
    compiles = True

    def resolve(self, settings: Settings, sku: str | None = None) -> ServeSpec:
        card = load_rbln(settings.recipe)
        return resolve_rbln(
            card,
            target=settings.target,
            strategy=settings.strategy,
            sets=settings.selection,
            recommended=settings.recommended,
            sku=sku,
            compiler_version=settings.pins["rebel-compiler"],
        )

    def hardware(self, probe: dict[str, Any]) -> Hardware:
        return hardware_from_probe(probe)

    def refusal(self, settings: Settings, spec: ServeSpec, hardware: Hardware) -> str | None:
        if not hardware.devices:
            return (
                f"no RBLN NPU found (by {hardware.source}); "
                f"the recipe needs one of {', '.join(spec.skus)}"
            )
        if hardware.sku not in spec.skus:
            found = ", ".join(sorted(set(hardware.skus)))
            return (
                f"host SKU {found} is not one {spec.recipe} is verified on ({', '.join(spec.skus)})"
            )
        return None

    def driver_needed(self, settings: Settings, hardware: Hardware) -> bool:
        return hardware.driver_version != settings.driver_version

    def required_pins(self) -> tuple[str, ...]:
        return ("rebel-compiler", "vllm-rbln")

    def top_requirement(self, settings: Settings, spec: ServeSpec) -> tuple[str, str]:
        extras = spec.requirements.vllm_rbln_extras
        shown = f"[{','.join(extras)}]" if extras else ""
        return f"vllm-rbln{shown}=={settings.pins['vllm-rbln']}", "vllm-rbln"

    def first_start_timeout(self, settings: Settings) -> int:
        return settings.prewarm_timeout


PLATFORM = Rbln()
