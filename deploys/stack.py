"""Only the pinned Python release (after the SKU check): `pyinfra INVENTORY deploys/stack.py`."""

try:
    from servefleet.entry.deploys import host_plan, stack
except ModuleNotFoundError as e:  # a pyinfra whose Python has no servefleet
    raise SystemExit(
        f"{__file__}: {e}; run the pyinfra installed with servefleet "
        "(uv tool install --with-executables-from pyinfra servefleet-VERSION-py3-none-any.whl)"
    ) from None

stack(plan=host_plan())
