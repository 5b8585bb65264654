"""Companions: helper processes a vLLM server runs beside it on the same host (a feature's or
the KV-offload option's ``companion``), each a second server without GPUs of its own.
"""

from __future__ import annotations

import shlex
from typing import Any

from servefleet.base.errors import RecipeError
from servefleet.kinds.vllm.recipe import VllmRecipe
from servefleet.spec import Server


def companions(
    r: VllmRecipe, enabled: dict[str, str | None], kv_key: str | None, kv: dict[str, Any] | None
) -> list[Server]:
    """Helper processes that run beside ``vllm serve`` on the same host (no GPU of their own):
    the ``companion`` of each enabled feature, then the KV-offload option's."""
    out: list[tuple[str, str, Any]] = []
    for name in enabled:
        companion = r.features[name].get("companion") or {}
        if companion.get("command"):
            out.append((f"companion-{name}", f"{r.name}: features.{name}.companion", companion))
    if kv is not None and (kv.get("companion") or {}).get("command"):
        out.append((f"companion-kv-{kv_key}", f"kv_offload.{kv_key}.companion", kv["companion"]))
    servers = []
    for role, where, companion in out:
        text = str(companion["command"]).replace("\\\n", " ")
        try:
            argv = shlex.split(text, comments=True)
        except ValueError as e:
            raise RecipeError(f"{where}.command does not split as a shell command ({e})") from None
        if not argv:
            raise RecipeError(f"{where}.command holds no command")
        servers.append(Server(role=role, argv=argv, env={}, npus=0))
    return servers
