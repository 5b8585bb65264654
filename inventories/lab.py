"""The local lab fleet (`servefleet lab up`): try every command here before a real fleet."""

try:
    from servefleet.fleet.lab.inventory import lab_inventory
except ModuleNotFoundError as e:  # a pyinfra whose Python has no servefleet
    raise SystemExit(
        f"{__file__}: {e}; run the pyinfra installed with servefleet "
        "(uv tool install --with-executables-from pyinfra servefleet-VERSION-py3-none-any.whl)"
    ) from None

globals().update(lab_inventory())
