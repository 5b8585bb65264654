"""Render a systemd unit for one server instance from ``templates/vllm.service.j2``.

argv and env arrive here as lists and maps; this is the one place they are escaped, by
systemd's rules (:mod:`servefleet.systemd`), never the shell's. The bytes the unit tests compare
are the bytes the deploy uploads.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import jinja2

from servefleet.systemd import environment_line, exec_line

TEMPLATES_DIR = Path(
    os.environ.get("SERVEFLEET_TEMPLATES", Path(__file__).resolve().parents[2] / "templates")
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
) -> str:
    """The unit text for instance ``index``.

    + exec_argv: the full command, executable path first
    + env: every variable the server gets (recipe env + the deploy's own)
    + recipe, selection, fingerprint: shown in the unit's header comment
    + index, port, devices: which instance this is, its port and its NPUs (``0,1``)
    + user: the system user it runs as
    """
    loader = jinja2.FileSystemLoader(str(TEMPLATES_DIR))
    jenv = jinja2.Environment(
        loader=loader,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    return jenv.get_template(template).render(
        recipe=recipe,
        selection=" ".join(f"{k}={v}" for k, v in selection.items()),
        fingerprint=fingerprint or "-",
        index=index,
        port=port,
        devices=devices,
        user=user,
        environment=[environment_line(k, v) for k, v in env.items()],
        exec_start=exec_line(exec_argv),
    )
