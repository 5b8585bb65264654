"""vLLM's recipes, served on GPU hosts (the ``nvidia`` and ``amd`` platforms,
:mod:`servefleet.platforms`).

Recipes: vllm-project/recipes' YAML (``models/<org>/<name>.yaml``), named ``vllm/<org>/<name>``
(under ``<recipes>/vllm/``, or a recipes directory laid out as the upstream collection),
or the recipes site's JSON form of a model (the YAML's keys plus ``recommended_command``), by its
path. A host serves a recipe when its GPUs are the selected hardware profile's, with the
memory its variant needs, and its data can install what the recipe installs. Its own keys: the
selection's (``serve_hardware``, ``serve_variant``, ``serve_features``)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from servefleet.kinds.base import Hardware, Kind, Wants
from servefleet.kinds.roles import deployable
from servefleet.kinds.vllm import defaults as vllm_defaults
from servefleet.kinds.vllm.options import OPTIONS
from servefleet.spec import ServeSpec

NIXL = "nixl"  # PyPI's NIXL (the meta package over its CUDA builds): NixlConnector imports it


def with_nixl(spec: ServeSpec) -> ServeSpec:
    """A spec whose servers move KV blocks with vLLM's ``NixlConnector`` needs the ``nixl``
    package in its release (vLLM does not depend on it): pinned like every package."""
    uses = any(
        "NixlConnector" in arg and '"kv_connector"' in arg for x in spec.servers for arg in x.argv
    )
    req = spec.requirements
    if not uses or NIXL in req.packages:
        return spec
    return replace(spec, requirements=replace(req, packages=[*req.packages, NIXL]))


def _profile_name(
    spec: ServeSpec, profiles: dict[str, dict[str, Any]]
) -> tuple[str, dict[str, Any]]:
    gpu = spec.selection["hardware"]
    return gpu, profiles.get(gpu, {})


class Vllm(Kind):
    kind = "vllm"
    label = "a vLLM recipe"
    title = "vLLM"
    options = OPTIONS
    platforms = ("nvidia", "amd")  # AMD hosts: when nvidia-smi lists no GPU
    defaults = vllm_defaults.DEFAULTS
    keys = frozenset({"serve_hardware", "serve_variant", "serve_features"})

    # -- recipes

    def detect(self, path: Path, text: str) -> bool:
        return True  # the last kind tried: its loader says what is wrong with anything else

    def locate(self, rest: str, base: Path) -> Path | None:
        from servefleet.kinds.vllm.load import vllm_root

        path = vllm_root(base) / "models" / f"{rest}.yaml"
        return path if path.is_file() else None

    # The recipe code (servefleet.kinds.vllm) is imported when a recipe is listed, shown or
    # resolved, not with the registry.

    def names(self, base: Path) -> list[str]:
        from servefleet.kinds.vllm import list_vllm_recipes

        return list_vllm_recipes(base)  # recipes/vllm/models or an upstream checkout's models/

    def show(self, path: Path, name: str) -> dict[str, Any]:
        from servefleet.kinds.vllm import describe_vllm, load_vllm_recipe

        return {"recipe": name, "kind": "vllm", **describe_vllm(load_vllm_recipe(path))}

    def resolve(
        self, path: Path, name: str, strategy: str | None, options: Mapping[str, Any]
    ) -> ServeSpec:
        from servefleet.kinds.vllm import load_vllm_recipe, resolve_vllm

        return resolve_vllm(
            load_vllm_recipe(path),
            hardware=options.get("hardware"),
            strategy=strategy,
            variant=options.get("variant"),
            tp=options.get("tp"),
            features=list(options.get("features", ())),
            no_features=list(options.get("no_features", ())),
            kv_offload=options.get("kv_offload"),
            task=options.get("task"),
            pool_parallelism=options.get("pool_parallelism"),
            nodes=options.get("nodes"),
        )

    # -- hosts

    def _recipe(self, settings: Wants) -> Any:
        from servefleet.kinds.vllm import load_vllm_recipe

        return load_vllm_recipe(self.path_of(settings.serve_recipe))

    def resolve_data(self, settings: Wants, sku: str | None = None) -> ServeSpec:
        features = settings.serve_features
        on = [n if m == "on" else f"{n}={m}" for n, m in features.items() if m != "off"]
        off = [n for n, m in features.items() if m == "off"]
        from servefleet.kinds.vllm import resolve_vllm, single_node_strategies

        recipe = self._recipe(settings)
        spec = resolve_vllm(
            recipe,
            hardware=settings.serve_hardware,
            strategy=settings.serve_strategy,
            variant=settings.serve_variant,
            features=on,
            no_features=off,
            nodes=settings.serve_nodes,  # a group of hosts: the fleet plan places its ranks
        )
        usable = single_node_strategies(recipe, spec.selection["hardware"])
        spec = deployable(spec, f"serve_strategy of one host: {', '.join(usable) or 'none'}")
        return with_nixl(spec)

    def refusal(self, settings: Wants, spec: ServeSpec, hardware: Hardware) -> str | None:
        recipe = self._recipe(settings)
        gpu, profile = _profile_name(spec, recipe.profiles)
        want = str(profile.get("display_name") or gpu)
        if not hardware.devices:
            return f"no GPU found (nvidia-smi and amd-smi list none); {spec.recipe} on {gpu} needs {want} GPUs"
        models = sorted(set(hardware.skus))
        if not all(re.search(rf"\b{re.escape(want)}\b", m, re.I) for m in models):
            return f"host GPUs {', '.join(models)} are not {want} (serve_hardware {gpu})"
        per = spec.servers[0].npus
        if len(hardware.devices) < per:
            return (
                f"{spec.recipe} needs {per} GPUs per server; the host has {len(hardware.devices)}"
            )
        variant = recipe.variants.get(spec.selection.get("variant", ""), {})
        need = float(variant.get("vram_minimum_gb") or 0)
        have = sum(sorted(hardware.memory_mib)[:per]) / 1024 if hardware.memory_mib else None
        if need and have is not None and have < need:
            return (
                f"variant {spec.selection.get('variant')} needs {need:g} GB of GPU memory per "
                f"server; {per} of this host's GPUs have {have:.0f} GB"
            )
        backend = torch_backend(recipe.data)
        if backend not in ("auto", "") and settings.owner_of("torch") is None:
            return (
                f"the recipe installs torch for backend {backend}; allowed: pip_indexes naming "
                "the index that serves that build of torch"
            )
        minimum = str((recipe.data.get("model") or {}).get("min_vllm_version") or "")
        pinned = settings.sdk_pins.get("vllm", "")
        if minimum and _older(pinned, minimum):
            return f"sdk_pins: vllm=={pinned} is older than the recipe's min_vllm_version {minimum}"
        return None


def torch_backend(data: dict[str, Any]) -> str:
    """The torch backend of the recipe's pip install line (``--torch-backend auto``; the YAML form
    has it in its guide): ``auto``
    is the build the public index serves for the host's driver; another (``cu130``) needs the
    index of that build to own torch in the data. Empty when the line names none."""
    install = (data.get("model") or {}).get("install") or {}
    pip = install.get("pip") if isinstance(install, dict) else None
    command = pip.get("command", "") if isinstance(pip, dict) else str(pip or "")
    guide = (
        data.get("guide") if isinstance(data.get("guide"), str) else ""
    )  # the YAML's install notes
    found = re.search(r"--torch-backend[= ]+([A-Za-z0-9_.-]+)", f"{command}\n{guide}")
    return found.group(1) if found else ""


def _older(version: str, minimum: str) -> bool:
    def key(v: str) -> tuple[int, ...]:
        return tuple(int(x) for x in re.findall(r"\d+", v.split("+")[0])[:3])

    return bool(version) and key(version) < key(minimum)


KIND = Vllm()
