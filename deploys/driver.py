"""Only the RBLN driver (after the SKU check): `pyinfra inventories/prod.py deploys/driver.py`."""

from servefleet.deploys import driver, host_plan

driver(plan=host_plan())
