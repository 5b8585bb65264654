"""What one recipe selection resolves to: the exact argv and env of each server, and what it needs.

A ServeSpec is the only thing the pyinfra layer receives from the core. It is plain data:
``argv`` stays a list of tokens until one escaping step (``servefleet.systemd``) renders it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Server:
    """One server process of a selection (role ``main`` for aggregated serving; ``prefill`` and
    ``decode`` for prefill/decode disaggregation; ``companion-*`` for a helper beside a server).

    + role: the role name (``main``, ``prefill``, ``decode``)
    + argv: the full command, launcher first: ``["vllm", "serve", MODEL, "--flag", "value", ...]``
    + env: environment variables the recipe sets, in the card's order
    + npus: devices this server takes (``RBLN_VISIBLE_DEVICES`` gets this many)
    """

    role: str
    argv: list[str]
    env: dict[str, str]
    npus: int = 1

    def to_json(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "argv": list(self.argv),
            "env": dict(self.env),
            "npus": self.npus,
        }


@dataclass(frozen=True)
class Requirements:
    """What a host needs before this selection can serve (names only; versions come from data).

    + vllm_rbln_extras: extras of vllm-rbln, spelled as its metadata spells them (``kv-connectors``)
    + packages: further distributions to install (``arctic-inference`` for suffix decoding)
    + imports: import names that must succeed in the release venv before it counts as installed
    + models: Hugging Face ids that must be in ``$HF_HOME/hub`` before serving (model, draft model)
    """

    vllm_rbln_extras: list[str] = field(default_factory=list)
    packages: list[str] = field(default_factory=list)
    imports: list[str] = field(default_factory=list)
    models: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "vllm_rbln_extras": list(self.vllm_rbln_extras),
            "packages": list(self.packages),
            "imports": list(self.imports),
            "models": list(self.models),
        }


@dataclass(frozen=True)
class ServeSpec:
    """A resolved selection of one recipe.

    + recipe: the recipe's qualified name (``rbln/gpt-oss-120b``) or the path it was loaded from
    + kind: ``rbln`` (RBLN recipe card) or ``vllm`` (vLLM recipe, GPU hosts)
    + selection: every axis with its chosen value (RBLN: modes and options; vLLM: hardware,
      strategy, variant, features), plus ``target``/``strategy``/``sku`` where they apply
    + servers: one entry per role
    + requirements: packages, imports and models the selection needs
    + compile_fingerprint: sha256 of the compile inputs (RBLN only; None for GPU recipes)
    + skus: device SKUs the recipe is verified on (RBLN only)
    + router: the ``vllm-router`` argv in front of a prefill/decode pair (empty for one role);
      shown in JSON only when there is one
    """

    recipe: str
    kind: str
    selection: dict[str, str]
    servers: list[Server]
    requirements: Requirements
    compile_fingerprint: str | None = None
    skus: list[str] = field(default_factory=list)
    router: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "recipe": self.recipe,
            "kind": self.kind,
            "selection": dict(self.selection),
            "servers": [s.to_json() for s in self.servers],
            "requirements": self.requirements.to_json(),
            "compile_fingerprint": self.compile_fingerprint,
            "skus": list(self.skus),
        }
        if self.router:
            out["router"] = list(self.router)
        return out
