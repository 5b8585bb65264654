"""The vLLM recipes site's JSON form of a model (the YAML's keys plus ``recommended_command``),
found by its path only: ``recipes list`` names the YAML recipes."""

from __future__ import annotations

from pathlib import Path

from servefleet.sources.vllm_yaml import VllmSource


class VllmJsonSource(VllmSource):
    def detect(self, path: Path, text: str) -> bool:
        return path.suffix == ".json"  # tried after the RBLN card


SOURCE = VllmJsonSource()
