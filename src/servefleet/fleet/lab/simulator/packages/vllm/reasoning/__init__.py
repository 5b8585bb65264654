"""vLLM's ``vllm.reasoning``: the reasoning parser registry (:mod:`vllm.registries`). A
SIMULATION for the servefleet lab."""

from ..registries import ReasoningParserManager

__all__ = ["ReasoningParserManager"]
