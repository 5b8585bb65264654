"""Each host's plan, made before any operation is added: its data validated, its recipe
resolved, one probe of the host, the planner (:func:`servefleet.hostplan.plan_host`), then what
the controller adds (the wheels it builds, the wheelhouse files the host lacks). Bad data or
recipe stops the whole run here, in one line, and no host changes."""

from __future__ import annotations

import secrets

from pyinfra import host

from servefleet.hostplan import HostPlan, plan_host, probe_args, resolve_for
from servefleet.release import with_locked_models
from servefleet.settings import Settings, settings_from
from servefleet.steps import connection, driver
from servefleet.steps.errors import one_line
from servefleet.steps.facts import HostProbe
from servefleet.steps.operations import Stdin
from servefleet.steps.wheelhouse import with_wheelhouse
from servefleet.steps.wheels import with_built_wheels


def host_settings() -> Settings:
    """This host's validated data; PyinfraError (one line, nothing changes) when it is bad."""
    with one_line(recipe=False):
        settings = settings_from(host.data.get, keys=host.data.dict().keys())
    return settings


def host_plan(files: bool = False) -> HostPlan:
    """Validate this host's data, resolve its recipe and probe the host (read-only).

    Raises PyinfraError (one line, the run stops before any change) on bad data or recipe.

    + files: also read the file hashes the serving release was installed with (``plan``)
    """
    connection.watch()
    with one_line():
        settings = with_locked_models(host_settings())
        spec = resolve_for(settings)
        key = secrets.token_bytes(32)  # the secrets' digests in the probe's output: HMACs
        args = probe_args(settings, spec, files, keyed=True)
        probe = host.get_fact(HostProbe, args=args, _stdin=Stdin(key.hex()))
        builder = host.name == settings.serve_prewarm_host
        plan = plan_host(settings, probe, spec, builder=builder, secret_key=key)
        driver.check_data(plan)
        plan = with_wheelhouse(with_built_wheels(plan))
    return plan
