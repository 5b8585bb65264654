"""The spec a host serves: its kind's resolve of the data, with ``serve_extra_args`` and
``serve_extra_env`` merged into each serving server (checked against the platform's flag table).

Pure (no pyinfra import).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import threading
from typing import Any

from servefleet.base.flags import merge, table
from servefleet.kinds import Kind, deploy_env, kind_of, platforms_of
from servefleet.kinds.roles import DECODE, PREFILL
from servefleet.settings.table import Settings
from servefleet.spec import Server, ServeSpec

_RESOLVED: collections.OrderedDict[tuple[Any, ...], ServeSpec] = collections.OrderedDict()
_KEPT = 64  # the specs kept (a run's hosts share a few: one a data set and device model)
_LOCK = threading.Lock()  # gevent's greenlets plan hosts at once: a greenlet lock under pyinfra


def resolve_for(settings: Settings, sku: str | None = None) -> ServeSpec:
    """The serving spec the data selects, for the host's device model (its platform resolves),
    with the data's extra arguments and environment (:func:`with_extras`). Resolved once for
    each data, device model and recipe file as it is now (its stat): the specs are frozen, so
    the hosts of a run that share data share it, and a host's plan, its probe and its units are
    made from one resolve.

    + settings: validated data
    + sku: the host's device model, once known (RBLN: the NPU SKU)
    """
    family = kind_of(settings.serve_recipe)
    try:
        st = family.path_of(settings.serve_recipe).stat()
        stamp: tuple[int, ...] = (st.st_ino, st.st_size, st.st_mtime_ns)
    except (OSError, ValueError):
        stamp = ()
    key = (repr(settings), sku, stamp)
    with _LOCK:
        if key in _RESOLVED:
            _RESOLVED.move_to_end(key)
            return _RESOLVED[key]
    spec = with_extras(settings, family.resolve_data(settings, sku), family)
    with _LOCK:
        _RESOLVED[key] = spec
        while len(_RESOLVED) > _KEPT:
            _RESOLVED.popitem(last=False)
    return spec


def with_extras(settings: Settings, spec: ServeSpec, family: Kind) -> ServeSpec:
    """``serve_extra_args`` / ``serve_extra_env`` appended to each serving server's argv and env,
    checked against the flag table of the hosts' platform (the first of the recipe family's:
    the spec is resolved before a host's probe; NVIDIA and AMD share upstream's) (a flag or variable the recipe sets
    is refused unless ``serve_override_args`` names it; then the extra replaces it).

    The compile fingerprint then covers the extras too: a change of them counts as a recompile
    (its first start gets the pre-warm's time, alone), whether or not vllm-rbln's cache key
    holds them. What the release installs, the models and the devices never depend on them
    (the flags that decide those are refused).
    """
    s = settings
    if not (s.serve_extra_args or s.serve_extra_env or s.serve_override_args):
        return spec

    def extended(server: Server) -> Server:
        argv, env = merge(server.argv, server.env, s.serve_extra_args, s.serve_extra_env,
                          s.serve_override_args, table(platforms_of(family)[0].flag_table),
                          deploy_env())  # fmt: skip
        return dataclasses.replace(server, argv=argv, env=env)

    fingerprint = spec.compile_fingerprint
    if fingerprint is not None:
        extras = [list(s.serve_extra_args), s.serve_extra_env, list(s.serve_override_args)]
        text = fingerprint + "\n" + json.dumps(extras, sort_keys=True)
        fingerprint = hashlib.sha256(text.encode()).hexdigest()
    serving = ("main", PREFILL, DECODE)
    servers = [extended(x) if x.role in serving else x for x in spec.servers]
    return dataclasses.replace(spec, servers=servers, compile_fingerprint=fingerprint)
