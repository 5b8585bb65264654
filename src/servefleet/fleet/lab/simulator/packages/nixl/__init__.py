"""nixl (import name ``nixl``): a SIMULATION for the servefleet lab, not NVIDIA's NIXL.

PyPI's ``nixl`` is what upstream vLLM's ``NixlConnector`` imports on a GPU host (vLLM does not
require it: a P/D stack installs it beside vllm). The real one is a meta package over its CUDA
variants (``nixl-cu12``, ``nixl-cu13``); this stand-in is one pure wheel that records its
version. The simulated server's transfer itself is in ``vllm.kv_transfer``.
"""

__version__ = "@VERSION@"
__servefleet_simulation__ = True
