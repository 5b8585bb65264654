"""vLLM's ``vllm.utils`` package, as far as a program that builds ``vllm serve``'s parser needs it.
A SIMULATION for the servefleet lab."""
