"""arctic-inference (import name ``arctic_inference``): a SIMULATION for the servefleet lab.

Pure Python, built from an sdist by setuptools like the real 0.1.1 (which compiles C++).
"""

__version__ = "@VERSION@"
__servefleet_simulation__ = True
__servefleet_squatter__ = False
