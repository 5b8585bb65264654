"""vLLM's ``vllm.entrypoints.openai``: the server's arguments. A SIMULATION for the servefleet
lab."""
