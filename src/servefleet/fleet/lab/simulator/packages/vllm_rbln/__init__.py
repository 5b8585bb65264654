"""vllm-rbln (import name ``vllm_rbln``): a SIMULATION for the servefleet lab.

The simulated ``vllm serve`` (in the lab's fake vllm wheel) imports it and compares its
version with ``rebel``'s. The plugin entry points are no-ops.
"""

__version__ = "@VERSION@"
__servefleet_simulation__ = True
__servefleet_squatter__ = False


def register() -> str:
    """``[vllm.platform_plugins] rbln``: the platform class path."""
    return "vllm_rbln.platform.RblnPlatform"


def register_ops() -> None:
    """``[vllm.general_plugins] rbln_custom_ops``: nothing to register in the simulation."""


def register_model() -> None:
    """``[vllm.general_plugins] rbln_new_models``: a no-op, as upstream."""
