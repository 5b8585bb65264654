"""Render a systemd unit for one server instance from the shipped ``templates/vllm.service.j2``.

argv and env arrive here as lists and maps; this is the one place they are escaped, by
systemd's rules (:mod:`servefleet.systemd`), never the shell's. The bytes the unit tests compare
are the bytes the deploy uploads.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence

import jinja2

from servefleet.errors import RecipeError
from servefleet.shipped import TEMPLATES_DIR
from servefleet.systemd import environment_line, exec_line

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
    """
    jenv = _environment()
    recipe = _one_line("recipe", recipe)
    shown = " ".join(_one_line(f"selection {k}", f"{k}={v}") for k, v in selection.items())
    description = (
        f"servefleet vLLM {recipe} instance {index} (port {port}, {device_word} {devices})"
    )
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
