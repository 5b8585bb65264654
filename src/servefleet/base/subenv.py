"""The environment of the controller's subprocesses that do not deploy (``uv lock``, ``uv build``
and the build backends they run): an allow-list, so no secret of the operator's environment
(``HF_TOKEN``, the RBLN index password, ``UV_INDEX_*`` credentials) reaches code from an sdist."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

ALLOWED = frozenset(
    ["PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "TMPDIR", "TZ", "LANG", "LANGUAGE"]
    + ["SOURCE_DATE_EPOCH", "SSL_CERT_FILE", "SSL_CERT_DIR", "UV_CACHE_DIR", "UV_NO_CACHE"]
    + ["CC", "CXX", "CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS", "MAKEFLAGS"]
    + ["CMAKE_GENERATOR", "CMAKE_BUILD_PARALLEL_LEVEL", "MAX_JOBS"]
    + ["http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"]
)
ALLOWED_PREFIXES = ("LC_", "XDG_")


def child_env(
    extra: Mapping[str, str] | None = None,
    secrets: Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The allow-listed part of ``environ`` (default: this process's), without ``secrets`` (the
    names the data's creds_* keys give), plus ``extra``.

    + extra: variables the child needs (uv's own settings, an index's credentials for uv)
    + secrets: variable names that never pass, allowed or not
    + environ: the environment to take from
    """
    source = os.environ if environ is None else environ
    drop = set(secrets)
    env = {
        k: v
        for k, v in source.items()
        if (k in ALLOWED or k.startswith(ALLOWED_PREFIXES)) and k not in drop
    }
    env.update(extra or {})
    return env
