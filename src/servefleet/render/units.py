"""Render a systemd unit for one server instance from the shipped ``templates/vllm.service.j2``.

argv and env arrive here as lists and maps; this is the one place they are escaped, by
systemd's rules (:mod:`servefleet.render.systemd`), never the shell's. The bytes the unit tests compare
are the bytes the deploy uploads.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence

import jinja2

from servefleet.base.errors import RecipeError
from servefleet.base.shipped import TEMPLATES_DIR
from servefleet.render.systemd import environment_line, exec_line

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _one_line(what: str, value: str) -> str:
    """A value shown in the unit's comments or Description=: one line, never a directive."""
    if _CONTROL.search(value):
        raise RecipeError(
            f"{what}: {value!r} holds a control character (a newline would add unit lines)"
        )
    return value


_PLAIN_PATH = re.compile(r"/[A-Za-z0-9._/-]+")


def _plain_path(what: str, path: str) -> str:
    """An absolute path systemd reads as written (no specifier, quote or space to escape)."""
    if not _PLAIN_PATH.fullmatch(path):
        raise RecipeError(f"{what}: {path!r} is not an absolute path of [A-Za-z0-9._/-]")
    return path


@functools.lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    """One Jinja environment per process: it compiles each template once (a deploy renders every
    instance of every host twice)."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


def render_unit(
    *,
    exec_argv: Sequence[str],
    env: Mapping[str, str],
    recipe: str,
    selection: Mapping[str, str],
    fingerprint: str | None,
    index: int,
    port: int,
    devices: str,
    user: str,
    template: str = "vllm.service.j2",
    device_word: str = "NPUs",
    stop_timeout: int | None = None,
    environment_file: str | None = None,
    rank: str | None = None,
) -> str:
    """The unit text for instance ``index``.

    + exec_argv: the full command, executable path first
    + env: every variable the server gets (recipe env + the deploy's own)
    + recipe, selection, fingerprint: shown in the unit's header comment
    + index, port, devices: which instance this is, its port and its NPUs (``0,1``)
    + user: the system user it runs as
    + device_word: how the description names its devices (``NPUs``, ``GPUs``)
    + stop_timeout: seconds systemd waits for a stop before SIGKILL (None: systemd's default)
    + environment_file: a file of ``NAME=value`` lines systemd reads as root when it starts the
      server (the API key), or None; its content is never in the unit
    + rank: a rank of a serving group (``rank 1 of group g1, headless``): it is not restarted
      alone (the group restarts as one), and the description names it
    """
    jenv = _environment()
    recipe = _one_line("recipe", recipe)
    shown = " ".join(_one_line(f"selection {k}", f"{k}={v}") for k, v in selection.items())
    where = f"{rank}, " if rank else f"port {port}, "
    description = f"servefleet vLLM {recipe} instance {index} ({where}{device_word} {devices})"
    return jenv.get_template(template).render(
        recipe=recipe,
        selection=shown,
        description=_one_line("Description", description).replace("%", "%%"),
        fingerprint=fingerprint or "-",
        index=index,
        port=port,
        devices=devices,
        user=user,
        environment=[environment_line(k, v) for k, v in env.items()],
        environment_file=environment_file and _plain_path("EnvironmentFile", environment_file),
        exec_start=exec_line(exec_argv),
        stop_timeout=stop_timeout,
        restart="no" if rank else "on-failure",
    )


def render_router_unit(
    *,
    exec_argv: Sequence[str],
    env: Mapping[str, str],
    workers: Sequence[str],
    port: int,
    user: str,
    version: str,
) -> str:
    """The router's unit text (``templates/router.service.j2``).

    + exec_argv: the full command, executable path first
    + env: its variables (the unit's sha among them)
    + workers: the instance URLs it routes to (shown in the header comment)
    + port: where it listens
    + user: the system user it runs as (its own, never the servers')
    + version: the vllm-router version (shown)
    """
    shown = " ".join(_one_line("router worker", w) for w in workers)
    description = f"servefleet vllm-router (port {port}, {len(workers)} instances)"
    return (
        _environment()
        .get_template("router.service.j2")
        .render(
            version=_one_line("version", version),
            workers=shown,
            description=description,
            user=user,
            environment=[environment_line(k, v) for k, v in env.items()],
            exec_start=exec_line(exec_argv),
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
        _environment()
        .get_template("router-proxy.conf.j2")
        .render(
            listen=listen,
            backend=backend,
            paths=[_plain_path("router proxy path", p) for p in paths],
            admin_listen=admin_listen,
            admin_paths=[_plain_path("router admin path", p) for p in admin_paths],
            run=_plain_path("router proxy run directory", run),
            user=user,
            version=_one_line("version", version),
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
        _environment()
        .get_template("router-proxy.service.j2")
        .render(
            environment=[environment_line(k, v) for k, v in env.items()],
            mark=exec_line(list(mark)),
            copies=[exec_line(list(c)) for c in copies],
            nginx=_plain_path("nginx", nginx),
            loaded=_plain_path("router proxy configuration", loaded),
            run_name=run_name,
            description=_one_line("description", description),
            admin=admin,
        )
    )
