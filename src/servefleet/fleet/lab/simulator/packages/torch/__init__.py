"""torch (CPU build): a SIMULATION for the servefleet lab, not PyTorch.

Only records its distribution version, which the fake RBLN wheels pin.
"""

__version__ = "@VERSION@"
__servefleet_simulation__ = True
