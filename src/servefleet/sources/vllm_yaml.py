"""vLLM recipe YAML (vllm-project/recipes' ``models/<org>/<name>.yaml``): ``vllm/<org>/<name>``.

The vLLM code is imported when a recipe is shown or resolved, not with the registry.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from servefleet.sources.base import Source
from servefleet.spec import ServeSpec


class VllmSource(Source):
    """What both forms of a vLLM recipe share: the loader reads either, one resolver."""

    kind = "vllm"
    label = "a vLLM recipe"
    options = {
        "--hardware": "hardware",
        "--variant": "variant",
        "--tp": "tp",
        "--feature": "features",
        "--no-feature": "no_features",
        "--kv-offload": "kv_offload",
        "--task": "task",
    }

    def show(self, path: Path, name: str) -> dict[str, Any]:
        from servefleet.vllm_recipes import describe_vllm, load_vllm_recipe

        return {"recipe": name, "kind": "vllm", **describe_vllm(load_vllm_recipe(path))}

    def resolve(
        self, path: Path, name: str, strategy: str | None, options: Mapping[str, Any]
    ) -> ServeSpec:
        from servefleet.vllm_recipes import load_vllm_recipe, resolve_vllm

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
        )


class VllmYamlSource(VllmSource):
    def detect(self, path: Path, text: str) -> bool:
        return True  # the last source tried: its loader says what is wrong with anything else

    def locate(self, rest: str, base: Path) -> Path | None:
        path = base / "vllm" / "models" / f"{rest}.yaml"
        return path if path.is_file() else None

    def names(self, base: Path) -> list[str]:
        from servefleet.vllm_recipes import list_vllm_recipes

        return list_vllm_recipes(base / "vllm")


SOURCE = VllmYamlSource()
