"""What one recipe selection resolves to: the exact argv and env of each server, and what it needs.

A ServeSpec is the only thing the pyinfra layer receives from the core. It is plain data:
``argv`` stays a list of tokens until one escaping step (``servefleet.render.systemd``) renders it.

Every spec is checked when it is built, whoever builds it (each kind's resolver, a host's
binding of placeholders, the data's extra arguments), so no printer has to: each argv word and
env value is printable text (:func:`word_problem`; a JSON value may have line breaks and tabs
between its tokens, as cards write them), no argv word holds an option inside it (``'x
--api-key k'`` is one word to vLLM and two options to whoever reads the command) unless it is a
JSON value, and each env name is a variable name. A spec that breaks one is a RecipeError naming
the recipe, the server and the word.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from servefleet.base.errors import RecipeError
from servefleet.base.remote import layout

_ENV_ALLOWED = layout.ENV_NAME_ALLOWED
# An option inside one word: whitespace, then a dash and a letter (not a negative number)
_INNER_OPTION = re.compile(r"\s(--?[A-Za-z][^\s=]*)")
# What may stand between a JSON value's tokens (not a carriage return: it rewrites a terminal's line)
_JSON_SPACE = str.maketrans("", "", "\t\n")
PRINTABLE = (
    "printable text (no control, format or line-separator characters; line breaks and tabs "
    "only between the tokens of a JSON value)"
)


def _json_value(text: str) -> bool:
    """Whether ``text`` is a JSON object or array. Strict JSON holds no raw control character
    inside a string, so a tab or line break in it stands between two tokens."""
    if not text.lstrip().startswith(("{", "[")):
        return False
    try:
        return isinstance(json.loads(text), (dict, list))
    except (ValueError, RecursionError):
        return False


def word_problem(text: str, argv: bool = True) -> str | None:
    """Why one argv word (or, with ``argv`` false, one env value) cannot be served, or None.

    + text: the word or value
    + argv: an argv word (also refused: an option inside it)
    """
    if not text.isprintable():
        json_value = _json_value(text)
        rest = text.translate(_JSON_SPACE) if json_value else text
        bad = next((c for c in rest if not c.isprintable()), None)
        if bad is not None:
            return f"holds the character U+{ord(bad):04X}; allowed: {PRINTABLE}"
    inner = _INNER_OPTION.search(text) if argv else None
    if inner and not _json_value(text):
        return (
            f"holds the option {inner.group(1)[:40]!r} inside one word; allowed: one option or "
            "value per word (a JSON value may hold any text)"
        )
    return None


def _shown(text: str) -> str:
    return repr(text) if len(text) <= 60 else repr(text[:57]) + "..."


def _argv_problem(argv: list[str], where: str) -> str | None:
    for i, word in enumerate(argv):
        problem = word_problem(word)
        if problem:
            flag = argv[i - 1] if i and argv[i - 1].startswith("--") else None
            of = f" (the value of {_shown(flag)})" if flag else ""
            return f"{where}: argv[{i}] {_shown(word)}{of} {problem}"
    return None


def _env_problem(env: dict[str, str], where: str) -> str | None:
    for name, value in env.items():
        if not layout.ENV_NAME.fullmatch(name):
            return f"{where}: env {_shown(name)} is not a variable name; allowed: {_ENV_ALLOWED}"
        problem = word_problem(value, argv=False)
        if problem:
            return f"{where}: env {name}={_shown(value)} {problem}"
    return None


@dataclass(frozen=True)
class Server:
    """One server process of a selection (role ``main`` for aggregated serving; ``prefill`` and
    ``decode`` for prefill/decode disaggregation; ``companion-*`` for a helper beside a server).

    + role: the role name (``main``, ``prefill``, ``decode``)
    + argv: the full command, launcher first: ``["vllm", "serve", MODEL, "--flag", "value", ...]``
    + env: environment variables the recipe sets, in the card's order
    + npus: devices this server takes (``RBLN_VISIBLE_DEVICES`` gets this many)
    + rank: its node's rank in a group spanning several hosts (0: the head; always 0 in a spec
      of one node)
    """

    role: str
    argv: list[str]
    env: dict[str, str]
    npus: int = 1
    rank: int = 0

    def to_json(self, ranked: bool = False) -> dict[str, Any]:
        """The server as JSON; with ``ranked`` (a spec of several nodes) its rank too."""
        out: dict[str, Any] = {"role": self.role}
        if ranked:
            out["rank"] = self.rank
        out.update(argv=list(self.argv), env=dict(self.env), npus=self.npus)
        return out


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
    + nodes: the hosts the selection spans (a multi-node strategy: one server per rank,
      ``0..nodes-1``, each on its own host); shown in JSON, with each server's rank, only when
      it is more than 1
    """

    recipe: str
    kind: str
    selection: dict[str, str]
    servers: list[Server]
    requirements: Requirements
    compile_fingerprint: str | None = None
    skus: list[str] = field(default_factory=list)
    router: list[str] = field(default_factory=list)
    nodes: int = 1

    def __post_init__(self) -> None:
        ranks = self._ranks_problem()
        if ranks:
            raise RecipeError(ranks)
        problems = []
        for s in self.servers:
            where = f"{self.recipe}: the {s.role} server" + (
                f" (rank {s.rank})" if self.nodes > 1 else ""
            )
            problems.append(_argv_problem(s.argv, where) or _env_problem(s.env, where))
        problems.append(_argv_problem(self.router, f"{self.recipe}: the router"))
        first = next((p for p in problems if p), None)
        if first:
            raise RecipeError(first)

    def _ranks_problem(self) -> str | None:
        """Why the servers' ranks do not make a group of ``nodes`` (one server per rank
        ``0..nodes-1``), or None."""
        nodes = self.nodes
        if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
            return (
                f"{self.recipe}: nodes {str(nodes)[:40]!r} is not a node count; allowed: 1 or more"
            )
        ranks = sorted(s.rank for s in self.servers)
        if ranks != (list(range(nodes)) if nodes > 1 else [0] * len(ranks)):
            return (
                f"{self.recipe}: the servers' ranks {ranks} are not one per node of {nodes}; "
                f"allowed: {', '.join(map(str, range(nodes)))}"
            )
        return None

    def to_json(self) -> dict[str, Any]:
        ranked = self.nodes > 1
        out: dict[str, Any] = {
            "recipe": self.recipe,
            "kind": self.kind,
            "selection": dict(self.selection),
        }
        if ranked:
            out["nodes"] = self.nodes
        out |= {
            "servers": [s.to_json(ranked) for s in self.servers],
            "requirements": self.requirements.to_json(),
            "compile_fingerprint": self.compile_fingerprint,
            "skus": list(self.skus),
        }
        if self.router:
            out["router"] = list(self.router)
        return out
