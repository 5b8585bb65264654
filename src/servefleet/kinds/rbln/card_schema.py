"""The schema of an RBLN recipe card: what a validated card holds (its strategies, their
options, each option's grid of roles, modes and deltas). Built by
:func:`servefleet.kinds.rbln.card_checks.card_from_dict`; read by the resolver."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Delta:
    """What selecting one ``AXIS=VALUE`` changes in one role.

    + del_args: arg keys to remove (the flag and its value)
    + del_envs: env keys to remove
    + add_args: arg key -> argv tokens; replaces an existing key in place, else appended
    + add_envs: env key -> value; replaces an existing key in place, else appended
    """

    del_args: tuple[str, ...] = ()
    del_envs: tuple[str, ...] = ()
    add_args: dict[str, list[str]] = field(default_factory=dict)
    add_envs: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Role:
    """One server role of a grid's base (``main`` for aggregated serving).

    + role: the role name
    + launcher: the launcher's argv tokens (``["vllm", "serve"]``)
    + args: arg key -> argv tokens, in the card's order
    + envs: env key -> value, in the card's order
    """

    role: str
    launcher: list[str]
    args: dict[str, list[str]]
    envs: dict[str, str]


@dataclass(frozen=True)
class Grid:
    """The selectable grid of one option.

    + model: the model the launcher serves (``grid.model``, else the card's ``model``)
    + base: roles before any delta
    + modes: mode axis -> allowed values (default ``off`` if offered, else the first)
    + options: option axis -> allowed values (default ``option_base[axis]``)
    + option_base: option axis -> default value
    + recommended: axis -> value overlaid by ``--recommended``
    + excluded: partial selections that are refused
    + deltas: ``AXIS=VALUE`` -> role -> Delta
    + router: the router's policy in front of prefill/decode roles (None: the default, or one
      role)
    """

    model: str
    base: list[Role]
    modes: dict[str, list[str]]
    options: dict[str, list[str]]
    option_base: dict[str, str]
    recommended: dict[str, str]
    excluded: list[dict[str, str]]
    deltas: dict[str, dict[str, Delta]]
    router: str | None = None

    def offered(self) -> dict[str, list[str]]:
        """Every selectable axis with its values: modes first, then options."""
        return {**self.modes, **self.options}


@dataclass(frozen=True)
class Option:
    """One target of a strategy (``Latency``/``Throughput``).

    + target: the target name as the card spells it
    + npus: devices per server
    + skus: device SKUs the option is verified on (the first is the default)
    + grid: the selectable grid
    """

    target: str
    npus: int
    skus: list[str]
    grid: Grid


@dataclass(frozen=True)
class Strategy:
    """A serving strategy (``aggregated``): one option per target.

    + slug: the strategy's id
    + label: its display name
    + options: one per target, in the card's order
    """

    slug: str
    label: str
    options: list[Option]


@dataclass(frozen=True)
class Card:
    """A loaded RBLN recipe card.

    + name: the qualified recipe name (``rbln/gpt-oss-120b``) or the path it was loaded from
    + model: the card's ``model``
    + axes: display axes (axis -> values) from the card's top-level ``axes``
    + strategies: the strategies, first is the default
    + path: the file it was read from
    """

    name: str
    model: str
    axes: dict[str, list[str]]
    strategies: list[Strategy]
    path: Path | None = None


# ---------------------------------------------------------------------------------------------
# Fragments
