"""``optimum-rbln-cli``: a SIMULATION for the servefleet lab (prints its version only)."""

from optimum.rbln import __version__


def main() -> int:
    print(f"optimum-rbln {__version__} (simulated for the servefleet lab)")
    return 0
