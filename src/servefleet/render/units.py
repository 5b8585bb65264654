"""Render a systemd unit for one server instance from the shipped ``templates/vllm.service.j2``.

argv and env arrive here as lists and maps; this is the one place they are escaped, by
systemd's rules (:mod:`servefleet.render.systemd`), never the shell's. The bytes the unit tests compare
are the bytes the deploy uploads.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import jinja2

from servefleet.base.errors import RecipeError
from servefleet.base.shipped import TEMPLATES_DIR
from servefleet.render.systemd import environment_line, exec_line

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def one_line(what: str, value: str) -> str:
    """A value shown in the unit's comments or Description=: one line, never a directive."""
    if _CONTROL.search(value):
        raise RecipeError(
            f"{what}: {value!r} holds a control character (a newline would add unit lines)"
        )
    return value


_PLAIN_PATH = re.compile(r"/[A-Za-z0-9._/-]+")


def plain_path(what: str, path: str) -> str:
    """An absolute path systemd reads as written (no specifier, quote or space to escape)."""
    if not _PLAIN_PATH.fullmatch(path):
        raise RecipeError(f"{what}: {path!r} is not an absolute path of [A-Za-z0-9._/-]")
    return path


@functools.cache
def environment(templates: Path = TEMPLATES_DIR) -> jinja2.Environment:
    """One Jinja environment per template directory and process: it compiles each template once
    (a deploy renders every instance of every host twice).

    + templates: the directory (``_files/templates``, or a component's, as
      :func:`servefleet.base.shipped.templates_of` finds it)
    """
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates)),
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
    guard: tuple[Sequence[str], Sequence[str]] | None = None,
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
    + guard: commands run as root before the server starts and after it stops (a rank's
      rendezvous guard: load it, remove it), or None
    """
    jenv = environment()
    recipe = one_line("recipe", recipe)
    shown = " ".join(one_line(f"selection {k}", f"{k}={v}") for k, v in selection.items())
    where = f"{rank}, " if rank else f"port {port}, "
    description = f"servefleet vLLM {recipe} instance {index} ({where}{device_word} {devices})"
    return jenv.get_template(template).render(
        recipe=recipe,
        selection=shown,
        description=one_line("Description", description).replace("%", "%%"),
        fingerprint=fingerprint or "-",
        index=index,
        port=port,
        devices=devices,
        user=user,
        environment=[environment_line(k, v) for k, v in env.items()],
        environment_file=environment_file and plain_path("EnvironmentFile", environment_file),
        exec_start=exec_line(exec_argv),
        stop_timeout=stop_timeout,
        restart="no" if rank else "on-failure",
        start_pre=guard and exec_line(guard[0]),
        stop_post=guard and exec_line(guard[1]),
    )
