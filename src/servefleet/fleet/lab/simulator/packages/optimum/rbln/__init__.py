"""optimum-rbln (import name ``optimum.rbln``): a SIMULATION for the servefleet lab.

An empty stand-in that records its distribution version.
"""

__version__ = "@VERSION@"
__servefleet_simulation__ = True
__servefleet_squatter__ = False
