"""Data for every host of every inventory: none by default.

The defaults of every key live in the servefleet package's key table (`servefleet keys` prints
them; `servefleet init` writes them all here, commented); anything set here overrides them for
the whole fleet.
"""
