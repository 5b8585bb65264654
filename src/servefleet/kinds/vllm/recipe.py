"""A loaded vLLM recipe: the recipe mapping with the shared vocabulary it resolves against."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class VllmRecipe:
    """A loaded vLLM recipe with the shared vocabulary it resolves against.

    + name: qualified name ``vllm/<org>/<name>``, or the path it was loaded from
    + path: the recipe file
    + form: ``yaml`` (recipe YAML) or ``json`` (the recipes site's JSON)
    + data: the recipe mapping
    + profiles: ``taxonomy.hardware_profiles`` (GPU id -> profile)
    + strategies: strategy name -> strategy mapping (``strategies/*.yaml``)
    + platforms: ``platforms.yaml`` entries (for display)
    + recommended: the JSON form's ``recommended_command`` (None for YAML)
    + taxonomy: the whole ``taxonomy.yaml`` (tasks, ``kv_offload`` options and groups)
    """

    name: str
    path: Path
    form: str
    data: dict[str, Any]
    profiles: dict[str, dict[str, Any]]
    strategies: dict[str, dict[str, Any]]
    platforms: list[dict[str, Any]] = field(default_factory=list)
    recommended: dict[str, Any] | None = None
    taxonomy: dict[str, Any] = field(default_factory=dict)

    @property
    def meta(self) -> dict[str, Any]:
        return self.data.get("meta") or {}

    @property
    def model_id(self) -> str:
        return str(self.data["model"]["model_id"])

    @property
    def variants(self) -> dict[str, dict[str, Any]]:
        return self.data["variants"]

    @property
    def features(self) -> dict[str, dict[str, Any]]:
        return self.data.get("features") or {}

    @property
    def opt_in_features(self) -> list[str]:
        """``opt_in_features`` that name a feature of the recipe (others are ignored)."""
        return [f for f in self.data.get("opt_in_features") or [] if f in self.features]

    def opt_in_on(self, gpu: str) -> list[str]:
        """Features opt-in on this GPU: ``opt_in_features`` plus ``hardware_opt_in_features.<gpu>``
        (exact GPU id), each naming a feature of the recipe (others are ignored)."""
        per_hw = (self.data.get("hardware_opt_in_features") or {}).get(gpu) or []
        return list(
            dict.fromkeys([*self.opt_in_features, *(f for f in per_hw if f in self.features)])
        )

    def default_features(self, vname: str, gpu: str) -> list[str]:
        """The site's default features for a variant on a GPU, in recipe order: every feature not
        opt-in here, plus every feature the variant's ``default_modes`` names (forced on)."""
        forced = (self.variants[vname].get("default_modes") or {}).keys()
        opt_in = self.opt_in_on(gpu)
        return [f for f in self.features if f in forced or f not in opt_in]

    @property
    def declared_hardware(self) -> dict[str, str]:
        return self.meta.get("hardware") or {}

    @property
    def tasks(self) -> list[str]:
        """``meta.tasks`` (``text``, ``multimodal``, ``omni``, ``embedding``)."""
        return [str(t) for t in self.meta.get("tasks") or []]

    @property
    def is_omni(self) -> bool:
        """An omni recipe (``meta.tasks`` has ``omni``): one ``vllm serve --omni`` process with
        no strategy, as the site's ``resolveOmniCommand`` renders it."""
        return "omni" in self.tasks

    @property
    def omni_tasks(self) -> dict[str, dict[str, Any]]:
        """``omni.tasks`` by selector (``key``, else ``id``); a bare id becomes ``{id: ...}``."""
        out: dict[str, dict[str, Any]] = {}
        for t in (self.data.get("omni") or {}).get("tasks") or []:
            task = {"id": t} if isinstance(t, str) else dict(t)
            out[str(task.get("key") or task["id"])] = task
        return out

    @property
    def kv_offload_options(self) -> dict[str, dict[str, Any]]:
        """The taxonomy's composing KV-offload options (``kv_offload``)."""
        return self.taxonomy.get("kv_offload") or {}

    @property
    def compatible_strategies(self) -> list[str]:
        """``compatible_strategies`` plus strategies granted ``supported`` in ``strategy_hardware``.

        Empty for an omni recipe: it renders no strategy."""
        if self.is_omni:
            return []
        listed = list(self.data.get("compatible_strategies") or [])
        if self.recommended is not None and not listed:
            # The JSON form drops the list; its recommended strategy and the alternatives
            # it links to are the same set.
            cands = [self.recommended.get("strategy")]
            cands += list((self.recommended.get("alternatives") or {}).keys())
            listed = [c for c in dict.fromkeys(cands) if c in self.strategies]
        for s, gate in (self.data.get("strategy_hardware") or {}).items():
            if s not in listed and isinstance(gate, dict) and "supported" in gate.values():
                listed.append(s)
        return listed
