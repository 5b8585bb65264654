"""vLLM's ``vllm.tool_parsers``: the tool-call parser registry (:mod:`vllm.registries`). A
SIMULATION for the servefleet lab."""

from ..registries import ToolParserManager

__all__ = ["ToolParserManager"]
