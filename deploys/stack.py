"""Only the pinned Python release (after the SKU check): `pyinfra INVENTORY deploys/stack.py`."""

from servefleet.deploys import host_plan, stack

stack(plan=host_plan())
