"""vLLM's ``vllm.entrypoints.launchers``: ``vllm serve``'s arguments (:mod:`.cli_args`) and the
API server's set-up (:mod:`.launcher`). A SIMULATION for the servefleet lab."""
