"""KV offload of a vLLM selection: the taxonomy's composing options (``kv_offload.<key>``) a
selection is offered after the site's gates (strategy, the recipe's ``kv_offload_support``,
opt-in, brand), the reason one is refused, and the packages its ``install`` line names.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from servefleet.base.errors import RecipeError
from servefleet.kinds.vllm.recipe import VllmRecipe


def kv_option(
    r: VllmRecipe, key: str | None, strategy: str | None, gpu: str
) -> dict[str, Any] | None:
    """The chosen KV-offload option after the site's gates, or None when none is chosen."""
    if key is None:
        return None
    options = r.kv_offload_options
    here = kv_offload_offered(r, gpu, strategy)
    if key not in options:
        raise RecipeError(
            f"{r.name}: unknown KV offload option {key!r} (options: {', '.join(options) or 'none'})"
        )
    if key not in here:
        why = _kv_refusal(r, key, strategy, gpu)
        raise RecipeError(
            f"{r.name}: KV offload {key} is not offered here: {why} "
            f"(options here: {', '.join(here) or 'none'})"
        )
    return dict(options[key])


def _kv_refusal(r: VllmRecipe, key: str, strategy: str | None, gpu: str) -> str | None:
    """Why a KV-offload option is not offered (None when it is)."""
    opt = r.kv_offload_options[key]
    deploy = r.strategies[strategy].get("deploy_type") if strategy else None
    if deploy in ("pd_cluster", "kv_store_lb"):
        return f"not with strategy {strategy} (it sets --kv-transfer-config itself)"
    allow = opt.get("strategies")
    if allow and strategy not in allow:
        with_what = f"strategy {strategy}" if strategy else "a recipe without strategies"
        return f"not with {with_what} (its strategies: {', '.join(allow)})"
    support = (r.data.get("kv_offload_support") or {}).get(key)
    if support == "unsupported":
        return f"the recipe marks it unsupported (kv_offload_support.{key})"
    if opt.get("requires_opt_in") and support != "verified":
        return f"it needs kv_offload_support.{key}: verified in the recipe"
    brands = opt.get("brands")
    brand = r.profiles[gpu].get("brand")
    if brands and brand not in brands:
        return f"not on {gpu} ({brand}; its brands: {', '.join(brands)})"
    return None


def kv_offload_offered(r: VllmRecipe, gpu: str, strategy: str | None) -> list[str]:
    """The KV-offload options of the taxonomy a selection may compose with (none for omni).

    + r: the recipe
    + gpu: the GPU id
    + strategy: the serving strategy (None for a recipe without strategies)
    """
    if r.is_omni:
        return []
    return [k for k in r.kv_offload_options if _kv_refusal(r, k, strategy, gpu) is None]


def install_names(r: VllmRecipe, install: Any) -> list[str]:
    """Distribution names a ``pip install`` line installs (``uv pip install "lmcache==0.5.1"``)."""
    if not isinstance(install, str):
        return []
    try:
        toks = shlex.split(install)
    except ValueError:
        return []
    if "install" not in toks:
        return []
    reqs = [t for t in toks[toks.index("install") + 1 :] if not t.startswith("-")]
    return [re.split(r"[<>=!~\[;@ ]", req, maxsplit=1)[0] for req in reqs if req]
