"""vLLM's ``vllm.entrypoints``: what ``vllm serve`` checks before it loads a model
(:mod:`vllm.serve_args`). A SIMULATION for the servefleet lab."""
