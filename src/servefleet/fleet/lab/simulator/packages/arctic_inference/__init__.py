"""arctic-inference (import name ``arctic_inference``): a SIMULATION for the servefleet lab.

Built from an sdist like the real 0.1.1: its build imports torch and compiles a C++20
extension (cmake >= 3.18, a C++ compiler, the Python headers), and fails clearly without them.
"""

__version__ = "@VERSION@"
__servefleet_simulation__ = True
__servefleet_squatter__ = False
