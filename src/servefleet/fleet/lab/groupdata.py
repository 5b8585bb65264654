"""``group_data/lab.py``'s values, derived from the running lab's state.

pyinfra loads every file in group_data/ for every inventory, so with no lab up this returns
nothing instead of failing (inventories/lab.py is the one that says the lab is not up).
"""

from __future__ import annotations

from typing import Any

from servefleet.base.errors import ServefleetError
from servefleet.fleet.lab import layout
from servefleet.fleet.lab.state import load_state

KEYRING = "/etc/apt/keyrings/servefleet-lab.gpg"
# lab index (a key of the state's "indexes") -> the packages it owns; every other package comes
# from the public index (``pip_indexes`` below; ``servefleet lab republish`` reads it too, and
# takes the first owner of a package two indexes own)
INDEX_OWNS: dict[str, tuple[str, ...]] = {
    "private": ("rebel-compiler", "lmcache-rbln", "nixl-rbln"),
    "vllm": ("vllm",),
    "torch": ("torch",),  # the lab's fakes need no companions
    "assets": ("vllm",),  # RBLN's glibc workaround: the same vllm for older glibc
}
# the lowest glibc the wheels of a lab index need, where it is not any glibc (see
# lab/simulator/wheels.py)
INDEX_GLIBC = {"vllm": "2.39", "assets": "2.35"}


def lab_group_data() -> dict[str, Any]:
    """Data keys pointing a deploy at the lab's own package sources (see servefleet/settings/table.py)."""
    try:
        state = load_state()
    except ServefleetError:
        return {}
    files = layout.url(layout.PORT_FILES)
    idx = state["indexes"]
    indexes: dict[str, Any] = {
        "rbln": {"url": idx["private"], "packages": list(INDEX_OWNS["private"]), "auth": True},
        "vllm": {
            "url": idx["vllm"],
            "packages": list(INDEX_OWNS["vllm"]),
            "glibc": INDEX_GLIBC["vllm"],
        },
        "torch": {"url": idx["torch"], "packages": list(INDEX_OWNS["torch"])},
    }
    if "assets" in idx:  # RBLN's glibc workaround, a second source of vllm (older glibc)
        indexes["vllm-rbln-assets"] = {
            "url": idx["assets"],
            "packages": list(INDEX_OWNS["assets"]),
            "glibc": INDEX_GLIBC["assets"],
        }
    return {
        "driver_runfile_url": files + "driver/rebellions-x86_64-{version}.run",
        "driver_sha256": {v: d["sha256"] for v, d in state["driver"].items()},
        "driver_apt_repo": {
            "src": f"deb [signed-by={KEYRING}] {state['apt']['url']} {state['apt']['suite']}",
            "key": state["apt"]["key"],
        },
        "pip_indexes": indexes,
        "pip_public_index": idx["public"],
        "pip_trusted_hosts": [layout.BRIDGE_IP],
        "models_store_url": files + "models",
        "models_hub_url": layout.url(layout.PORT_HUB, ""),  # with models_store_url=null
    }
