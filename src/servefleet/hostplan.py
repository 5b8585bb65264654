"""What one host needs, computed from its data, its recipe and one probe of its state.

Pure (no pyinfra import): the deploys turn a HostPlan into operations. Everything a host's
operations depend on is decided here, once, before any operation is added.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from servefleet.data import Settings
from servefleet.errors import RecipeError
from servefleet.recipes import load_rbln
from servefleet.release import ReleasePlan, plan_release
from servefleet.render import render_unit
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

SECRETS_DIR = "/etc/servefleet/secrets"  # 0700 root: the only place secrets live on a host
NETRC = f"{SECRETS_DIR}/netrc"  # index credentials (pip reads it through $NETRC)
HF_TOKEN_FILE = f"{SECRETS_DIR}/hf_token"  # Hugging Face token (read at fetch time only)
UNIT_PREFIX = "servefleet-vllm-"


@dataclass(frozen=True)
class Hardware:
    """The NPUs of a host: from ``rbln-smi -j`` once a driver exists, else from PCI ids."""

    source: str  # "rbln-smi" or "lspci"
    skus: tuple[str, ...]  # one per device
    devices: tuple[int, ...]  # NPU indexes (RBLN_VISIBLE_DEVICES values)
    driver_version: str | None

    @property
    def sku(self) -> str | None:
        return self.skus[0] if len(set(self.skus)) == 1 else None


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


@dataclass(frozen=True)
class Instance:
    """One ``vllm serve`` process: a unit, a port, a group of NPUs."""

    index: int
    unit: str
    port: int
    devices: str
    text: str  # the rendered unit file


@dataclass(frozen=True)
class HostPlan:
    settings: Settings
    spec: ServeSpec
    hardware: Hardware
    refusal: str | None  # why this host must not be touched (wrong SKU, no NPU), or None
    driver_needed: bool
    release: ReleasePlan
    release_complete: bool
    current: str | None  # the release `current` points at now
    instances: tuple[Instance, ...]
    stale_units: tuple[str, ...]  # our units beyond the instances this host now runs
    active_units: frozenset[str]
    warm: bool  # the compile cache is warm for spec.compile_fingerprint
    missing_models: tuple[str, ...]
    kernel: str

    @property
    def warm_marker(self) -> str:
        return f"{self.settings.cache_root}/servefleet-warm/{self.spec.compile_fingerprint}"

    @property
    def lib(self) -> str:
        return f"{self.settings.root}/lib"


def resolve_for(settings: Settings, sku: str | None = None) -> ServeSpec:
    """The serving spec the data selects, for the host's SKU."""
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


def plan_host(settings: Settings, probe: dict[str, Any], spec: ServeSpec | None = None) -> HostPlan:
    """Everything one host needs, from its validated data and its probe.

    + settings: the host's validated data
    + probe: the output of the PROBE script on the host
    + spec: ``resolve_for(settings)``, when the caller has it already
    """
    spec = spec or resolve_for(settings)
    hardware = hardware_from_probe(probe)
    refusal = None
    if not hardware.devices:
        refusal = f"no RBLN NPU found (by {hardware.source}); the recipe needs one of {', '.join(spec.skus)}"
    elif hardware.sku not in spec.skus:
        found = ", ".join(sorted(set(hardware.skus)))
        refusal = (
            f"host SKU {found} is not one {spec.recipe} is verified on ({', '.join(spec.skus)})"
        )
    else:
        try:
            spec = resolve_for(settings, hardware.sku)
        except RecipeError as e:  # pragma: no cover - sku was checked above
            refusal = str(e)
    server = spec.servers[0]
    release = plan_release(settings, spec, NETRC)
    groups = [
        hardware.devices[i : i + server.npus]
        for i in range(0, len(hardware.devices) - server.npus + 1, server.npus)
    ]
    instances = []
    for i, group in enumerate(groups):
        port = settings.base_port + i
        devices = ",".join(str(d) for d in group)
        exec_argv = [f"{release.path}/bin/{server.argv[0]}", *server.argv[1:], "--port", str(port)]
        if settings.host:
            exec_argv += ["--host", settings.host]
        env = dict(server.env)
        env.update(
            RBLN_VISIBLE_DEVICES=devices,
            VLLM_CACHE_ROOT=settings.cache_root,
            HOME=settings.home,
            HF_HOME=settings.hf_home,
            HF_HUB_OFFLINE="1",
        )
        unit = f"{UNIT_PREFIX}{i}.service"
        text = render_unit(
            exec_argv=exec_argv,
            env=env,
            recipe=spec.recipe,
            selection=spec.selection,
            fingerprint=spec.compile_fingerprint,
            index=i,
            port=port,
            devices=devices,
            user=settings.user,
        )
        instances.append(Instance(i, unit, port, devices, text))
    names = {inst.unit for inst in instances}
    return HostPlan(
        settings=settings,
        spec=spec,
        hardware=hardware,
        refusal=refusal,
        driver_needed=hardware.driver_version != settings.driver_version,
        release=release,
        release_complete=release.id in probe.get("releases", []),
        current=probe.get("current"),
        instances=tuple(instances),
        stale_units=tuple(u for u in probe.get("units", {}) if u not in names),
        active_units=frozenset(u for u, s in probe.get("units", {}).items() if s == "active"),
        warm=spec.compile_fingerprint in probe.get("warm", []),
        missing_models=tuple(
            m for m in spec.requirements.models if m not in probe.get("models", [])
        ),
        kernel=str(probe.get("kernel", "")),
    )


# The probe: one round trip that reads everything plan_host needs. Runs on the host with
# python3; prints one JSON object. Arguments: serve_root, models_hf_home, serve_cache_root, models.
PROBE = r"""
import glob, json, os, subprocess, sys
root, hf_home, cache_root, models = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
def run(cmd):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        return p.stdout if p.returncode == 0 else None
    except OSError:
        return None
out = {"kernel": os.uname().release}
smi = run(["rbln-smi", "-j"])
try:
    out["smi"] = json.loads(smi) if smi else None
except ValueError:
    out["smi"] = None
pci = None if out["smi"] else run(["lspci", "-n"])
out["pci"] = pci.splitlines() if pci else []
rel = os.path.join(root, "releases")
out["releases"] = sorted(d for d in (os.listdir(rel) if os.path.isdir(rel) else [])
                         if os.path.exists(os.path.join(rel, d, ".servefleet-release.json")))
cur = os.path.join(root, "current")
out["current"] = os.path.basename(os.readlink(cur)) if os.path.islink(cur) else None
units = sorted(os.path.basename(u) for u in glob.glob("/etc/systemd/system/servefleet-vllm-*.service"))
states = subprocess.run(["systemctl", "is-active", *units], capture_output=True,
                        text=True).stdout.split() if units else []
states += ["unknown"] * len(units)
out["units"] = dict(zip(units, states))
warm = os.path.join(cache_root, "servefleet-warm")
out["warm"] = sorted(os.listdir(warm)) if os.path.isdir(warm) else []
out["models"] = [m for m in models if os.path.isfile(os.path.join(
    hf_home, "hub", "models--" + m.replace("/", "--"), "refs", "main"))]
print(json.dumps(out))
"""
