"""vLLM's ``vllm.entrypoints.launchers.cli_args``: ``vllm serve``'s parser and the checks it
runs before it loads a model (:mod:`vllm.serve_args`). A SIMULATION for the servefleet lab."""

from ...serve_args import make_arg_parser, validate_parsed_serve_args

__all__ = ["make_arg_parser", "validate_parsed_serve_args"]
