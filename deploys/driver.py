"""Only the RBLN driver (after the SKU check): `pyinfra inventories/prod.py deploys/driver.py`."""

try:
    from servefleet.entry.deploys import driver, host_plan
except ModuleNotFoundError as e:  # a pyinfra whose Python has no servefleet
    raise SystemExit(
        f"{__file__}: {e}; run the pyinfra installed with servefleet "
        "(uv tool install --with-executables-from pyinfra servefleet-VERSION-py3-none-any.whl)"
    ) from None

driver(plan=host_plan())
