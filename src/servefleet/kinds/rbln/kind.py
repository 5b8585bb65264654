"""RBLN recipe cards on RBLN NPU hosts (RBLN-CR13 first).

Recipes: docs.rbln.ai's JSON cards, bare or inside the page text, named ``rbln/<name>``. Hosts:
devices from ``rbln-smi -j`` once a driver exists, else from PCI ids; the driver is a runfile
servefleet installs (:mod:`.driver`); a release is ``vllm-rbln`` with its pinned SDK and the
extras the selection needs; servers get ``RBLN_VISIBLE_DEVICES``; a cold first start compiles
(pre-warm). Its data defaults: :mod:`.defaults`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from servefleet.base.errors import ProbeError, RecipeError
from servefleet.kinds.base import DriverPlan, Hardware, Kind, ResolveOption, Wants
from servefleet.kinds.loader import load_json, load_yaml
from servefleet.kinds.rbln import defaults as rbln_defaults, driver
from servefleet.kinds.rbln.card import Card, load_card
from servefleet.kinds.rbln.resolve import (
    default_selection,
    pick_option,
    pick_strategy,
    resolve_rbln,
)
from servefleet.kinds.roles import deployable
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


def is_card(obj: Any) -> bool:
    """An RBLN card has ``strategies`` whose options carry a ``grid``."""
    if not isinstance(obj, dict) or not isinstance(obj.get("strategies"), list):
        return False
    for s in obj["strategies"]:
        if isinstance(s, dict) and isinstance(s.get("options"), list):
            if any(isinstance(o, dict) and "grid" in o for o in s["options"]):
                return True
    return False


def describe(card: Card) -> dict[str, Any]:
    """What a card offers, per strategy and target: axes, defaults, recommended, excluded."""
    return {
        "recipe": card.name,
        "kind": "rbln",
        "model": card.model,
        "display_axes": card.axes,
        "strategies": [
            {
                "slug": s.slug,
                "label": s.label,
                "targets": [
                    {
                        "target": o.target,
                        "npus": o.npus,
                        "skus": o.skus,
                        "axes": o.grid.offered(),
                        "defaults": default_selection(o.grid),
                        "recommended": default_selection(o.grid, recommended=True),
                        "excluded": o.grid.excluded,
                    }
                    for o in s.options
                ],
            }
            for s in card.strategies
        ],
    }


def parse_sets(
    sets: tuple[str, ...], card: Card, target: str, strategy: str | None
) -> dict[str, str]:
    """``AXIS=VALUE`` items of ``--set`` as a map; one that is not names what is offered."""
    out: dict[str, str] = {}
    for item in sets:
        axis, eq, value = item.partition("=")
        if not eq or not axis:
            grid = pick_option(card, pick_strategy(card, strategy), target).grid
            offered = "; ".join(f"{a}: {', '.join(v)}" for a, v in grid.offered().items())
            raise RecipeError(f"--set {item!r} is not AXIS=VALUE (offered: {offered})")
        out[axis] = value
    return out


class Rbln(Kind):
    kind = "rbln"
    label = "an RBLN recipe card"
    title = "RBLN"
    options = (
        ResolveOption("--target", "target", "Latency (default) or Throughput, any case."),
        ResolveOption("--set", "sets", "choose a value.", metavar="AXIS=VALUE", multiple=True),
        ResolveOption(
            "--recommended", "recommended", "start from the recommended values.", is_flag=True
        ),
        ResolveOption("--sku", "sku", "NPU SKU (default: the option's first)."),
        ResolveOption(
            "--compiler-version",
            "compiler_version",
            "rebel-compiler version for the fingerprint (default: the data's pin).",
            metavar="X.Y.Z",
        ),
    )
    name = "rbln"
    defaults = rbln_defaults.DEFAULTS
    flag_table = "rbln"  # vllm-rbln 0.12.0's `vllm serve`
    probe_commands = (
        ("smi", ("rbln-smi", "-j"), "json", None),  # once a driver exists
        ("pci", ("lspci", "-n"), "lines", "smi"),  # before: the PCI ids
    )
    device_word = "NPUs"
    devices_env = "RBLN_VISIBLE_DEVICES"
    deploy_env = {
        "RBLN_VISIBLE_DEVICES": "the host's device groups",
        "VLLM_RBLN_COMPILE_ONLY": "serve_prewarm_host",  # the compile-only pre-warm's
        "RBLN_FORCE_NPU_NAME": "serve_prewarm_host",
    }
    driver_step = "runfile"
    compiles = True

    # -- recipes

    def detect(self, path: Path, text: str) -> bool:
        start = text.find("{")
        if start >= 0:
            try:
                if is_card(load_json(text, str(path), start)[0]):
                    return True
            except RecipeError:
                pass
        try:
            return is_card(load_yaml(text, str(path)))
        except RecipeError:
            return False

    def locate(self, rest: str, base: Path) -> Path | None:
        path = base / "rbln" / f"{rest}.json"
        return path if path.is_file() else None

    def names(self, base: Path) -> list[str]:
        return [f"rbln/{p.stem}" for p in sorted((base / "rbln").glob("*.json"))]

    def show(self, path: Path, name: str) -> dict[str, Any]:
        return describe(load_card(path, name=name))

    def resolve(
        self, path: Path, name: str, strategy: str | None, options: Mapping[str, Any]
    ) -> ServeSpec:
        card = load_card(path, name=name)
        target = options.get("target") or "Latency"
        return resolve_rbln(
            card,
            target=target,
            strategy=strategy,
            sets=parse_sets(options.get("sets", ()), card, target, strategy),
            recommended=bool(options.get("recommended")),
            sku=options.get("sku"),
            compiler_version=options.get("compiler_version"),
        )

    # -- hosts

    def resolve_data(self, settings: Wants, sku: str | None = None) -> ServeSpec:
        card = load_card(self.path_of(settings.serve_recipe), name=settings.serve_recipe)
        spec = resolve_rbln(
            card,
            target=settings.serve_target,
            strategy=settings.serve_strategy,
            sets=settings.serve_selection,
            recommended=settings.serve_recommended,
            sku=sku,
            compiler_version=settings.sdk_pins["rebel-compiler"],
        )
        one = [s.slug for s in card.strategies if all(len(o.grid.base) == 1 for o in s.options)]
        allowed = f"serve_strategy of one role: {', '.join(one)}" if one else "a card of one role"
        return deployable(spec, allowed)

    def hardware(self, probe: dict[str, Any]) -> Hardware:
        return hardware_from_probe(probe)

    def refusal(self, settings: Wants, spec: ServeSpec, hardware: Hardware) -> str | None:
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

    def driver_needed(self, settings: Wants, hardware: Hardware) -> bool:
        return hardware.driver_version != settings.driver_version

    def driver_problem(self, settings: Wants) -> str | None:
        return driver.driver_problem(settings)

    def driver_plan(self, settings: Wants, kernel: str) -> DriverPlan | None:
        return driver.driver_plan(settings, kernel)

    def release_extras(self, spec: ServeSpec) -> list[str]:
        return list(spec.requirements.vllm_rbln_extras)

    def unit_data(self, options: Mapping[str, Any], data: dict[str, Any]) -> None:
        version = options.get("compiler_version")
        if version:  # the fingerprint's compiler is the pinned one
            data["sdk_pins"] = [
                f"rebel-compiler=={version}" if p.startswith("rebel-compiler==") else p
                for p in data["sdk_pins"]
            ]

    def required_pins(self) -> tuple[str, ...]:
        return ("rebel-compiler", "vllm-rbln")

    def top_requirement(self, settings: Wants, spec: ServeSpec) -> tuple[str, str]:
        extras = self.release_extras(spec)
        shown = f"[{','.join(extras)}]" if extras else ""
        return f"vllm-rbln{shown}=={settings.sdk_pins['vllm-rbln']}", "vllm-rbln"

    def first_start_timeout(self, settings: Wants) -> int:
        return settings.serve_prewarm_timeout


KIND = Rbln()
