"""Data for every host of every inventory: none by default.

The defaults of every key live in the servefleet package (src/servefleet/defaults.py), given to
the deploys as `@deploy(data_defaults=...)`; anything set here overrides them for the whole fleet.
"""
