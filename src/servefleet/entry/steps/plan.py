"""Each host's plan, made before any operation is added: its data validated, its recipe
resolved, one probe of the host, the planner (:func:`servefleet.hostplan.plan.plan_host`), then what
the controller adds (the wheels it builds, the wheelhouse files the host lacks). Bad data or
recipe stops the whole run here, in one line, and no host changes. Probe output the host's kind
cannot read, and any error servefleet did not expect (a bug), fail that host alone, in one line:
the other hosts go on."""

from __future__ import annotations

import os
import secrets
from typing import Any

from pyinfra import host
from pyinfra.api.exceptions import PyinfraError

from servefleet.base.errors import DataError, ProbeError
from servefleet.entry.steps import connection, driver
from servefleet.entry.steps.errors import fail_host, one_line, unexpected
from servefleet.entry.steps.facts import HostProbe
from servefleet.entry.steps.fleet import run_plan
from servefleet.entry.steps.lib import per_run
from servefleet.entry.steps.operations import Stdin
from servefleet.entry.steps.wheelhouse import with_wheelhouse
from servefleet.entry.steps.wheels import with_built_wheels
from servefleet.fleet.inventory import check_host_name, check_ssh_data
from servefleet.hostplan.extras import resolve_for
from servefleet.hostplan.plan import plan_host
from servefleet.hostplan.probe_input import probe_args
from servefleet.hostplan.types import HostPlan
from servefleet.release.plan import with_locked_models
from servefleet.router import step as router
from servefleet.settings.table import KEYS, Settings, settings_from

_KEYS = frozenset(KEYS)


class _Validated(dict[Any, Settings]):
    """A run's hosts with the same data share the Settings it validates to (gone with the run)."""


def host_settings() -> Settings:
    """This host's validated data, its name and port too; PyinfraError (one line, nothing
    changes) when it is bad. Hosts whose data keys are the same and whose values of servefleet's
    keys are equal get the one Settings their data and this environment (the credentials'
    variables) validate to, validated once a run: the checks read nothing else that differs by
    host."""
    with one_line(recipe=False):
        check_host_name(host.name)
        data = host.data.dict()
        check_ssh_data(data)
        names = frozenset(k for k in data if isinstance(k, str))
        values = tuple((k, repr(data[k])) for k in sorted(names & _KEYS))
        same = (names, values, frozenset(os.environ.items()))  # credentials come from there
        validated = per_run(host.state, _Validated, lambda _: _Validated())
        settings = validated.get(same)
        if settings is None:
            settings = settings_from(host.data.get, keys=data.keys())
            validated[same] = settings
    return settings


def plan_or_failure(files: bool = False) -> HostPlan | str:
    """This host's plan, or why it has none (one line: probe output its kind cannot read, an
    error servefleet did not expect). Validates the data, resolves the recipe and probes the
    host (read-only).

    Raises PyinfraError (one line, the run stops before any change) on bad data or recipe.

    + files: also read the file hashes the serving release was installed with (``plan``)
    """
    connection.watch()
    try:
        with one_line():
            settings = with_locked_models(host_settings())
            spec = resolve_for(settings)
            key = secrets.token_bytes(32)  # the secrets' digests in the probe's output: HMACs
            args = probe_args(settings, spec, files, keyed=True)
            probe = host.get_fact(HostProbe, args=args, _stdin=Stdin(key.hex()))
            if probe is None:  # pyinfra has failed the host and shown the probe's output
                return "the host probe failed (its output is above)"
            fleet = run_plan()
            place = fleet.place(host.name, settings)
            plan = plan_host(settings, probe, spec, place, secret_key=key)
            driver.check_data(plan)
            plan = with_wheelhouse(with_built_wheels(plan))
            fleet.join(host.name, plan)
    except ProbeError as e:
        return str(e)
    except PyinfraError:
        raise  # bad data or recipe (one line, made above), or pyinfra's own
    except Exception as e:  # a bug: this host fails, the others go on
        return unexpected(e)
    return plan


def host_plan(files: bool = False) -> HostPlan | None:
    """This host's plan (:func:`plan_or_failure`); None when it has none: the host then fails
    alone, before any change, with one line naming why (a failing command).

    Raises PyinfraError (one line, the run stops before any change) on bad data or recipe.

    + files: also read the file hashes the serving release was installed with (``plan``)
    """
    plan = plan_or_failure(files)
    if isinstance(plan, str):
        fail_host(plan)
        return None
    with one_line():
        router.check_data(plan)  # what only a deploy needs (plan and status read without it)
        outside = plan.group and run_plan().group_outside(plan.group.name)
        if outside:  # a group restarts as one: a run over part of it changes nothing
            raise DataError(outside)
    return plan
