"""vLLM's ``vllm.entrypoints.chat_utils``: the chat template check (:mod:`vllm.serve_args`).
A SIMULATION for the servefleet lab."""

from ..serve_args import validate_chat_template

__all__ = ["validate_chat_template"]
