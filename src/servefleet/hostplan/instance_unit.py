"""One instance's command line and its systemd unit (``vllm serve`` from the release, on its
port and devices, with its environment and the unit's own sha), the servers' API key file, and
the model name clients ask for.

Pure (no pyinfra import): the deploy writes these texts, ``servefleet resolve --format unit``
prints them.
"""

from __future__ import annotations

import hashlib
from typing import Any

from servefleet.base.remote.layout import (
    API_KEY_FILE,
    API_KEY_VAR,
    ASGI,
    GROUP_SHA_VAR,
    LIB,
    OPEN_PATHS_VAR,
    PATH_GUARD,
    UNIT_SHA_VAR,
)
from servefleet.hostplan.serve_files import shipped_paths
from servefleet.kinds import kind_named, platforms_of
from servefleet.platforms.base import Platform
from servefleet.release.plan import ReleasePlan
from servefleet.render.systemd import environment_line
from servefleet.render.units import render_unit
from servefleet.settings.table import Settings
from servefleet.spec import Server, ServeSpec

HEADLESS = "--headless"  # a rank of a serving group that serves no API: it opens no port
# the path guard each serving instance runs, last on its command line (#46 item 1)
GUARD_ARGS = ("--middleware", PATH_GUARD)


def api_key_file(key: str) -> str:
    """The servers' EnvironmentFile (``remote/layout.py`` API_KEY_FILE): the key as vLLM reads it
    (the key's characters need no quoting: ``checks.API_KEY``)."""
    return f"{API_KEY_VAR}={key}\n"


def _served_on(spec: ServeSpec) -> Platform:
    """The first platform that serves the spec's family (a unit rendered with no host)."""
    return platforms_of(kind_named(spec.kind))[0]


def instance_command(
    settings: Settings,
    spec: ServeSpec,
    release: ReleasePlan,
    index: int,
    devices: str,
    platform: Platform | None = None,
    server: Server | None = None,
    group_sha: str | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The command line and environment instance ``index`` runs with (its unit's ExecStart= and
    Environment=, before the unit's own sha): what the pre-flight checks (arguments as
    :func:`render_instance`; ``server``: the spec's server it runs, default its first; a rank of
    a serving group: ``group_sha``, the group's hash, in its environment, and no port when it
    runs ``--headless``)."""
    server = server or spec.servers[0]
    port = settings.serve_base_port + index
    exec_argv = [f"{release.path}/bin/{server.argv[0]}", *shipped_paths(server.argv[1:], release)]
    serves = HEADLESS not in server.argv
    if serves:
        exec_argv += ["--port", str(port)]
        if settings.instance_host:
            exec_argv += ["--host", settings.instance_host]
    exec_argv += ["--shutdown-timeout", str(settings.serve_shutdown_timeout)]
    env = dict(server.env)
    if serves:  # the path guard, outermost: only serve_open_paths reach vLLM's app (#46)
        exec_argv += GUARD_ARGS
        guard_dir = f"{settings.serve_root}/{LIB}/{ASGI}"
        env["PYTHONPATH"] = ":".join(filter(None, [guard_dir, env.get("PYTHONPATH")]))
        env[OPEN_PATHS_VAR] = " ".join(settings.serve_open_paths)
    env.update(
        {(platform or _served_on(spec)).devices_env: devices},
        VLLM_CACHE_ROOT=settings.serve_cache_root,
        HOME=settings.serve_home,
        HF_HOME=settings.models_hf_home,
        HF_HUB_OFFLINE="1",
    )
    if group_sha:
        env[GROUP_SHA_VAR] = group_sha
    return exec_argv, env


def render_instance(
    settings: Settings, spec: ServeSpec, release: ReleasePlan, index: int, devices: str,
    platform: Platform | None = None, server: Server | None = None,
) -> tuple[str, str]:  # fmt: skip
    """The unit file of one instance and its SERVEFLEET_UNIT sha (:func:`instance_unit`'s)."""
    text, sha, _, _ = instance_unit(settings, spec, release, index, devices, platform, server)
    return text, sha


def instance_unit(
    settings: Settings, spec: ServeSpec, release: ReleasePlan, index: int, devices: str,
    platform: Platform | None = None, server: Server | None = None,
    group: tuple[str, str] | None = None, guard: tuple[list[str], list[str]] | None = None,
) -> tuple[str, str, list[str], dict[str, str]]:  # fmt: skip
    """The unit file of one instance, its SERVEFLEET_UNIT sha, and the command line and
    environment it runs (its one :func:`instance_command`; pure: the deploy writes this text,
    ``servefleet resolve --format unit`` prints it).

    + settings: validated data (user, paths, base port, host)
    + spec: the resolved selection (its first server)
    + release: the release the instance runs from
    + index: the instance (port ``serve_base_port + index``)
    + devices: its devices (``0,1``)
    + platform: the host's platform, whose variable gives them (default: the first that
      serves the spec's family, as ``servefleet resolve --format unit`` shows it)
    + server: the spec's server it runs (default: the first)
    + group: a rank of a serving group: (the group's name, its hash)
    + guard: a rank's rendezvous guard: the commands its unit runs as root before it starts and
      after it stops (``ranks.guard_commands``), or None
    """
    name, group_sha = group or (None, None)
    exec_argv, env = instance_command(settings, spec, release, index, devices, platform, server,
                                      group_sha)  # fmt: skip
    rank = None
    if group is not None:
        ranked = server or spec.servers[0]
        rank = f"rank {ranked.rank} of group {name}" + (
            ", headless" if HEADLESS in ranked.argv else ""
        )
    port = settings.serve_base_port + index
    fields: dict[str, Any] = dict(
        exec_argv=exec_argv,
        recipe=spec.recipe,
        selection=spec.selection,
        fingerprint=spec.compile_fingerprint,
        index=index,
        port=port,
        devices=devices,
        user=settings.serve_user,
        device_word=(platform or _served_on(spec)).device_word,
        # systemd waits this long for the stop before SIGKILL: the drain and 30 s more
        stop_timeout=settings.serve_shutdown_timeout + 30,
        environment_file=API_KEY_FILE if settings.api_key else None,
        rank=rank,
        guard=guard,
    )
    # the unit's text only: no digest of the API key (world-readable, it would let a guess be
    # confirmed offline, #31 finding 4); a new key restarts the servers because each one is
    # checked for the key it runs with (the probe, remote/instances.py)
    # rendered once, its sha line a placeholder: the sha is of the text without that line
    # (what a render without it gives), then written into it
    marked = render_unit(env={**env, UNIT_SHA_VAR: _PLACEHOLDER}, **fields)
    line = f"Environment={environment_line(UNIT_SHA_VAR, _PLACEHOLDER)}\n"
    assert marked.count(line) == 1, "the unit's sha line is written once"
    sha = hashlib.sha256(marked.replace(line, "").encode()).hexdigest()[:16]
    text = marked.replace(line, f"Environment={environment_line(UNIT_SHA_VAR, sha)}\n")
    return text, sha, exec_argv, env


_PLACEHOLDER = "0" * 15 + "x"  # never a sha (hex): where the unit's own sha goes


def served_name(argv: list[str], model: str) -> str:
    """The name clients (and the health gate's chat) must ask for: the first
    ``--served-model-name``, else the model."""
    for i, arg in enumerate(argv):
        if arg.replace("_", "-") == "--served-model-name" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.replace("_", "-").startswith("--served-model-name="):
            return arg.split("=", 1)[1]
    return model
