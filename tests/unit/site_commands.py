"""vLLM's recipes site's own output for the recipes in shared/
(``shared/recipes/vllm-yaml/expected/commands.json``, beside the repository when present): its
entries, each resolved by servefleet, and an argv read as vLLM's parser reads it. The site
parity tests (test_vllm_site_parity.py, test_vllm_multinode.py, test_pd_roles.py) compare the
two."""

from __future__ import annotations

import json
from typing import Any

from repo_paths import SHARED

from servefleet.base.vllm_args import flag_name, is_flag
from servefleet.kinds.vllm import load_vllm_recipe, resolve_vllm

SITE = SHARED / "recipes" / "vllm-yaml"
EXPECTED = SITE / "expected" / "commands.json"


def argv_units(argv: list[str]) -> tuple[list[str], dict[str, str | None], list[str]]:
    """``vllm serve MODEL``, each flag's last value (vLLM's parser: order does not matter, a
    repeated flag's last value wins) and the positionals in order."""
    flags: dict[str, str | None] = {}
    positionals: list[str] = []
    rest = argv[3:]
    i = 0
    while i < len(rest):
        tok = rest[i]
        if not is_flag(tok):
            positionals.append(tok)
        elif "=" in tok:
            flags[flag_name(tok)] = tok.split("=", 1)[1]
        elif i + 1 < len(rest) and not is_flag(rest[i + 1]):
            flags[tok] = rest[i + 1]
            i += 1
        else:
            flags[tok] = None
        i += 1
    return argv[:3], flags, positionals


def site_entries(deploy_type: str = "single_node") -> list[dict[str, Any]]:
    return [e for e in json.loads(EXPECTED.read_text()) if e["deploy_type"] == deploy_type]


def site_key(e: dict[str, Any]) -> tuple[str, str, str, str]:
    return (e["recipe"], e["hardware"], e["strategy"], e["variant"])


def resolve_entry(e: dict[str, Any]) -> Any:
    """A site entry's selection resolved by servefleet (its recipe in shared/)."""
    r = load_vllm_recipe(SITE / "models" / f"{e['recipe']}.yaml")
    return resolve_vllm(r, hardware=e["hardware"], strategy=e["strategy"], variant=e["variant"])


def feature_names(spec: Any) -> list[str]:
    """The names of a spec's enabled features, in order (as the site lists them)."""
    return [f.partition("=")[0] for f in spec.selection["features"].split(",") if f]
