"""torch-rbln (import name ``torch_rbln``): a SIMULATION for the servefleet lab.

An empty stand-in that records its distribution version. The build marks squatter copies by
flipping the flag below.
"""

__version__ = "@VERSION@"
__servefleet_simulation__ = True
__servefleet_squatter__ = False


def torch_backends_entry_point() -> None:
    """The ``[torch.backends] autoload`` entry point; nothing to register in the simulation."""
