"""The command lines the real-wheel tier holds servefleet to: every ``vllm serve`` argv that
servefleet resolves, and every single-node command vLLM's recipes site builds.

- every combination of the seed card's grid (and its recommended selection), on each target, on
  the RBLN platform;
- every shipped vLLM recipe on each hardware it lists with each strategy, and each variant;
- every ``single_node`` entry of ``../shared/recipes/vllm-yaml/expected/commands.json`` (what
  the recipes site builds);

the vLLM ones on both platforms (a GPU host parses them with upstream's flag set; a CR13 host
with vllm-rbln's). A selection that servefleet refuses has no argv and is not in the corpus
(the resolver's refusals are tested elsewhere). Each case: ``name``, ``platform`` (``rbln`` or
``upstream``), ``argv`` (the words after ``vllm serve``), ``env`` and ``cwd``.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
EXPECTED = REPO.parent / "shared" / "recipes" / "vllm-yaml" / "expected" / "commands.json"
PLATFORMS = ("rbln", "upstream")

Case = dict[str, Any]


def _snapshot() -> Any:
    """tests/resolve_snapshot.py: the resolver's cases, as the refactor snapshot lists them."""
    sys.path.insert(0, str(REPO / "tests"))
    try:
        import resolve_snapshot
    finally:
        sys.path.remove(str(REPO / "tests"))
    return resolve_snapshot


def _serve_words(argv: list[str]) -> list[str]:
    """The words after ``vllm serve``."""
    assert argv[:2] == ["vllm", "serve"], argv
    return list(argv[2:])


def resolved() -> list[Case]:
    """Every server of every selection servefleet resolves, on its kind's platforms."""
    snap = _snapshot()
    names = snap.run(["recipes", "list"]).split("\n", 1)[1].split()
    out: list[Case] = []
    for recipe in names:
        rbln = recipe.startswith("rbln/")
        cases = snap.rbln_cases(recipe) if rbln else snap.vllm_cases(recipe)
        for case in cases:
            text = snap.run(["resolve", *case, "--format=json"])
            status, body = text.split("\n", 1)
            if status != "exit 0":
                continue
            spec = json.loads(body)
            for n, server in enumerate(spec["servers"]):
                for platform in ("rbln",) if rbln else PLATFORMS:
                    out.append(
                        {
                            "name": f"resolve {' '.join(case)} [server {n}] on {platform}",
                            "platform": platform,
                            "argv": _serve_words(server["argv"]),
                            "env": dict(server["env"]),
                            "cwd": "/",
                        }
                    )
    return out


def site() -> list[Case]:
    """The recipes site's single-node commands, on both platforms."""
    out: list[Case] = []
    for entry in json.loads(EXPECTED.read_text()):
        if entry.get("deploy_type") != "single_node":
            continue
        what = f"{entry['recipe']} {entry['hardware']} {entry['strategy']} {entry['variant']}"
        for platform in PLATFORMS:
            out.append(
                {
                    "name": f"site {what} {'+'.join(entry.get('features') or [])} on {platform}",
                    "platform": platform,
                    "argv": _serve_words(entry["argv"]),
                    "env": dict(entry.get("env") or {}),
                    "cwd": "/",
                }
            )
    return out


@functools.cache
def _corpus() -> tuple[Case, ...]:
    return tuple(resolved() + site())


def corpus() -> list[Case]:
    """The whole corpus (computed once a process), deduplicated by platform, argv, env, cwd."""
    seen: set[str] = set()
    out = []
    for case in _corpus():
        key = json.dumps([case["platform"], case["argv"], case["env"], case["cwd"]])
        if key not in seen:
            seen.add(key)
            out.append(dict(case))
    return out


if __name__ == "__main__":
    cases = corpus()
    by = {p: sum(1 for c in cases if c["platform"] == p) for p in PLATFORMS}
    envs = {json.dumps(c["env"], sort_keys=True) for c in cases}
    print(f"{len(cases)} cases ({by}), {len(envs)} distinct environments")
