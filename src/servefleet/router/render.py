"""The router's unit, its proxy's unit and its proxy's nginx configuration, rendered from the
templates beside this module (``router/templates/``), escaped by systemd's rules
(:mod:`servefleet.render.systemd`) like every unit; :mod:`servefleet.router.plan` says what goes
in them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from servefleet.base.errors import RecipeError
from servefleet.base.shipped import templates_of
from servefleet.render.systemd import environment_line, exec_line
from servefleet.render.units import environment, one_line, plain_path

TEMPLATES = templates_of("servefleet.router")  # router/templates (SERVEFLEET_TEMPLATES: that)


def render_router_unit(
    *,
    exec_argv: Sequence[str],
    guard: Sequence[str],
    env: Mapping[str, str],
    workers: Sequence[str],
    port: int,
    user: str,
    version: str,
) -> str:
    """The router's unit text (``templates/router.service.j2``).

    + exec_argv: the full command, executable path first
    + guard: the command, run as root before it starts, that lets only root and ``user``
      connect to its port (an argv)
    + env: its variables (the unit's sha among them)
    + workers: the instance URLs it routes to (shown in the header comment)
    + port: where it listens
    + user: the system user it runs as (its own, never the servers')
    + version: the vllm-router version (shown)
    """
    shown = " ".join(one_line("router worker", w) for w in workers)
    description = f"servefleet vllm-router (port {port}, {len(workers)} instances)"
    return (
        environment(TEMPLATES)
        .get_template("router.service.j2")
        .render(
            version=one_line("version", version),
            workers=shown,
            description=description,
            user=user,
            environment=[environment_line(k, v) for k, v in env.items()],
            exec_start=exec_line(exec_argv),
            guard=exec_line(guard),
        )
    )


def render_proxy_conf(
    *,
    listen: str,
    backend: str,
    paths: Sequence[str],
    admin_listen: str | None,
    admin_paths: Sequence[str],
    run: str,
    user: str | None,
    version: str,
    timeout: int,
    max_body: str,
) -> str:
    """The router proxy's nginx configuration (``templates/router-proxy.conf.j2``).

    + listen: nginx's ``listen`` of the clients' port (``ADDRESS:PORT`` or ``PORT``)
    + backend: vllm-router's loopback ``ADDRESS:PORT``
    + paths: the exact paths clients reach; every other answers 404
    + admin_listen: the ``listen`` of the worker API's port for the fleet's hosts (None: none)
    + admin_paths: the worker API paths it passes, with the admin key only
    + run: the runtime directory (its pid, temporary files and the admin key's copy)
    + user: the user its workers run as (None: the master's, when it is not root)
    + version: the vllm-router version (shown)
    + timeout: seconds a request and its answer may take
    + max_body: the largest request body (nginx's size syntax)
    """
    for what, value in (("listen", listen), ("backend", backend), ("admin_listen", admin_listen)):
        if value is not None and not re.fullmatch(r"[A-Za-z0-9.:\[\]]+", value):
            raise RecipeError(f"router proxy {what}: {value!r} is not an address and port")
    return (
        environment(TEMPLATES)
        .get_template("router-proxy.conf.j2")
        .render(
            listen=listen,
            backend=backend,
            paths=[plain_path("router proxy path", p) for p in paths],
            admin_listen=admin_listen,
            admin_paths=[plain_path("router admin path", p) for p in admin_paths],
            run=plain_path("router proxy run directory", run),
            user=user,
            version=one_line("version", version),
            timeout=int(timeout),
            max_body=max_body,
        )
    )


def render_proxy_unit(
    *, env: Mapping[str, str], mark: Sequence[str], copies: Sequence[Sequence[str]], nginx: str,
    loaded: str, run_name: str, description: str, admin: bool,
) -> str:  # fmt: skip
    """The router proxy's unit text (``templates/router-proxy.service.j2``).

    + env: its variables (the unit's sha among them)
    + mark: the command that records the unit's sha where the host reads it, an argv
    + copies: the commands that copy its configuration (and admin key) into its runtime
      directory, each an argv
    + nginx: nginx's path
    + loaded: the configuration copy it runs
    + run_name: its RuntimeDirectory= (under /run)
    + description: its Description=
    + admin: whether it checks the admin key (shown)
    """
    return (
        environment(TEMPLATES)
        .get_template("router-proxy.service.j2")
        .render(
            environment=[environment_line(k, v) for k, v in env.items()],
            mark=exec_line(list(mark)),
            copies=[exec_line(list(c)) for c in copies],
            nginx=plain_path("nginx", nginx),
            loaded=plain_path("router proxy configuration", loaded),
            run_name=run_name,
            description=one_line("description", description),
            admin=admin,
        )
    )
