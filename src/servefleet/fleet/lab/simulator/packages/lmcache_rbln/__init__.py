"""lmcache-rbln (import name ``lmcache_rbln``): a SIMULATION for the servefleet lab.

An empty stand-in that records its distribution version. The build marks squatter copies by
flipping the flag below.
"""

__version__ = "@VERSION@"
__servefleet_simulation__ = True
__servefleet_squatter__ = False
