"""vllm (CPU build): a SIMULATION for the servefleet lab, not vLLM.

The console script ``vllm`` runs :func:`vllm.sim.main` (only ``vllm serve`` is simulated).
"""

__version__ = "@VERSION@"
__servefleet_simulation__ = True
