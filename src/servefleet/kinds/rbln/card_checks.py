"""The checks of an RBLN recipe card: every field of a decoded card validated (slugs, names,
model ids, argument and env fragments, roles, grids, options, the router), every problem
collected and raised at once naming the file, and the :class:`Card` built from it. Fields the
resolver does not use yet are refused when set (a strategy's ``nodes``, a role's ``ranks``,
``scale`` and ``varies``)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from servefleet.base.errors import RecipeError
from servefleet.base.remote import layout
from servefleet.kinds.base import MODEL_ID, MODEL_ID_ALLOWED, launcher_problem
from servefleet.kinds.rbln.card_schema import Card, Delta, Grid, Option, Role, Strategy
from servefleet.kinds.roles import PD_ROLES, ROUTER_POLICIES

T = TypeVar("T")


def _split_fragment(what: str, fragment: object) -> list[str]:
    """Shell-split a fragment (POSIX rules), naming ``what`` in errors."""
    if not isinstance(fragment, str):
        raise RecipeError(f"{what}: fragment must be a string, got {type(fragment).__name__}")
    try:
        return shlex.split(fragment, posix=True)
    except ValueError as exc:
        raise RecipeError(f"{what}: cannot parse fragment {fragment!r}: {exc}") from None


def parse_arg_fragment(key: str, fragment: str) -> list[str]:
    """Parse an arg's shell fragment into argv tokens; the first token must be the key.

    + key: the arg's key in the card (``--max-num-seqs``)
    + fragment: the shell fragment (``--max-num-seqs 8``, ``--flag=value``)
    """
    tokens = _split_fragment(f"arg {key}", fragment)
    if not tokens or not (tokens[0] == key or tokens[0].startswith(key + "=")):
        raise RecipeError(f"arg {key}: fragment {fragment!r} does not start with {key}")
    if any(_is_option(v) for v in tokens[1:]):
        raise RecipeError(
            f"arg {key}: fragment {fragment!r} is more than one option; allowed: "
            f"'{key}', '{key} VALUE' or '{key}=VALUE'"
        )
    return tokens


def _is_option(token: str) -> bool:
    """A word that vLLM's parser reads as an option (``--host``), not a value (``-1``)."""
    return token.startswith("-") and not re.fullmatch(r"-[0-9.]+([eE][-+]?[0-9]+)?", token)


def parse_env_fragment(key: str, fragment: str) -> str:
    """Parse an env's shell fragment ``KEY=value`` and return the value (which may contain ``=``).

    + key: the variable name
    + fragment: the shell fragment (``LMCACHE_EXTRA_CONFIG='{...}'``)
    """
    if not layout.ENV_NAME.fullmatch(key):
        raise RecipeError(f"env {key!r}: not a valid variable name")
    tokens = _split_fragment(f"env {key}", fragment)
    if len(tokens) != 1 or not tokens[0].startswith(key + "="):
        raise RecipeError(f"env {key}: fragment {fragment!r} is not one {key}=value assignment")
    return tokens[0][len(key) + 1 :]


class _Errors:
    """Collects validation problems; raises them together as one RecipeError."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.items: list[str] = []

    def add(self, msg: str) -> None:
        self.items.append(msg)

    def raise_if_any(self) -> None:
        if self.items:
            raise RecipeError(f"{self.source}: " + "; ".join(self.items))


def _str_map(obj: Any, where: str, errors: _Errors) -> dict[str, Any]:
    if obj is None:
        return {}
    if not isinstance(obj, dict):
        errors.add(f"{where} must be an object")
        return {}
    return obj


SLUG = re.compile(r"[a-z0-9_-]+\Z")
MAX_NPUS = 64  # devices one server may take (a CR13 host has 16)
# what may stand in a unit's comments and Description= (model ids, targets, SKUs): no control
# characters, no systemd specifier or variable characters
NAME = re.compile(r"[A-Za-z0-9._/-]+\Z")


def _check(pattern: re.Pattern[str], value: str, what: str, errors: _Errors) -> bool:
    if pattern.match(value):
        return True
    allowed = "[a-z0-9_-]" if pattern is SLUG else "[A-Za-z0-9._/-]"
    errors.add(f"{what} {value!r} has characters outside {allowed}")
    return False


def _model_id(value: str, what: str, errors: _Errors) -> bool:
    if MODEL_ID.fullmatch(value):
        return True
    errors.add(f"{what} {value!r} is not a model id; allowed: {MODEL_ID_ALLOWED}")
    return False


def _values_map(obj: Any, where: str, errors: _Errors) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for axis, values in _str_map(obj, where, errors).items():
        if (
            not isinstance(values, list)
            or not values
            or not all(isinstance(v, str) for v in values)
        ):
            errors.add(f"{where}.{axis} must be a non-empty list of strings")
            continue
        if _check(SLUG, axis, f"{where}: axis", errors) and all(
            [_check(NAME, v, f"{where}.{axis}: value", errors) for v in values]
        ):
            out[axis] = list(values)
    return out


def _parse_fragments(
    obj: Any, where: str, errors: _Errors, parse: Callable[[str, str], T]
) -> dict[str, T]:
    """Parse each ``key -> shell fragment`` of a map, collecting every error."""
    out: dict[str, T] = {}
    for key, fragment in _str_map(obj, where, errors).items():
        try:
            out[key] = parse(key, fragment)
        except RecipeError as exc:
            errors.add(f"{where}: {exc}")
    return out


def _parse_args(obj: Any, where: str, errors: _Errors) -> dict[str, list[str]]:
    return _parse_fragments(obj, where, errors, parse_arg_fragment)


def _parse_envs(obj: Any, where: str, errors: _Errors) -> dict[str, str]:
    return _parse_fragments(obj, where, errors, parse_env_fragment)


def _key_list(obj: Any, where: str, errors: _Errors) -> tuple[str, ...]:
    if obj is None:
        return ()
    if not isinstance(obj, list) or not all(isinstance(k, str) for k in obj):
        errors.add(f"{where} must be a list of keys")
        return ()
    return tuple(obj)


def _unused(obj: dict[str, Any], keys: tuple[str, ...], where: str, errors: _Errors) -> None:
    """Refuse fields the resolver does not use yet when they are set (null is allowed)."""
    for key in keys:
        value = obj.get(key)
        if value is None:
            continue
        if key == "nodes" and not (isinstance(value, int) and not isinstance(value, bool)):
            errors.add(
                f"{where}.nodes {_shown(value)} is not a node count; allowed: null (servefleet "
                "serves every server of a card on one host)"
            )
        else:
            errors.add(
                f"{where}.{key} is set ({_shown(value)}) but servefleet does not use it yet; "
                "allowed: null"
            )


def _label(value: Any, where: str, errors: _Errors) -> str | None:
    """A display name (``Aggregated``): null, or one line of printable text."""
    if value is None or (isinstance(value, str) and value.isprintable()):
        return value
    errors.add(
        f"{where}.label {_shown(value)} is not a label; allowed: null or one line of printable text"
    )
    return None


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _parse_router(obj: Any, where: str, roles: list[str], errors: _Errors) -> str | None:
    """A grid's ``router``: null, or ``{"policy": POLICY}`` in front of prefill/decode roles."""
    if obj is None:
        return None
    allowed = f'null or {{"policy": {"|".join(ROUTER_POLICIES)}}}'
    policy = obj.get("policy") if isinstance(obj, dict) else None
    if not isinstance(obj, dict) or set(obj) != {"policy"} or policy not in ROUTER_POLICIES:
        errors.add(f"{where}.router {_shown(obj)} is not a router; allowed: {allowed}")
        return None
    if sorted(roles) != sorted(PD_ROLES):
        errors.add(
            f"{where}.router is set on a grid of one role; allowed: null (a router stands in "
            "front of the roles prefill and decode)"
        )
        return None
    return str(policy)


def _parse_role(obj: Any, where: str, errors: _Errors) -> Role | None:
    if not isinstance(obj, dict):
        errors.add(f"{where} must be an object")
        return None
    role = obj.get("role")
    if not isinstance(role, str) or not role:
        errors.add(f"{where}.role must be a non-empty string")
        return None
    if not _check(SLUG, role, f"{where}: role", errors):
        return None
    _unused(obj, ("ranks", "scale", "varies"), where, errors)
    launcher = obj.get("launcher")
    problem = launcher_problem(launcher, f"{where}.launcher", "rbln")
    if problem:
        errors.add(problem)
    tokens = [] if problem else str(launcher).split()
    args = _parse_args(obj.get("args"), f"{where}.args", errors)
    envs = _parse_envs(obj.get("envs"), f"{where}.envs", errors)
    return Role(role=role, launcher=tokens, args=args, envs=envs)


def _parse_grid(obj: Any, where: str, card_model: str, errors: _Errors) -> Grid | None:
    if not isinstance(obj, dict):
        errors.add(f"{where} must be an object")
        return None
    model = obj.get("model") or card_model
    if not isinstance(model, str) or not model:
        errors.add(f"{where}: no model (grid.model or the card's model)")
        model = ""
    elif not _model_id(model, f"{where}.model", errors):
        model = ""
    base_raw = obj.get("base")
    base: list[Role] = []
    if not isinstance(base_raw, list) or not base_raw:
        errors.add(f"{where}.base must be a non-empty list of roles")
    else:
        for i, r in enumerate(base_raw):
            role = _parse_role(r, f"{where}.base[{i}]", errors)
            if role is not None:
                base.append(role)
    roles = {r.role for r in base}
    if len(roles) != len(base):
        errors.add(f"{where}.base has duplicate roles")
    elif len(base) > 1 and sorted(roles) != sorted(PD_ROLES):
        errors.add(
            f"{where}.base has the roles {', '.join(r.role for r in base)}; allowed: one role, "
            f"or the two roles {' and '.join(PD_ROLES)}"
        )
    router = _parse_router(obj.get("router"), where, [r.role for r in base], errors)
    modes = _values_map(obj.get("modes"), f"{where}.modes", errors)
    options = _values_map(obj.get("options"), f"{where}.options", errors)
    for axis in set(modes) & set(options):
        errors.add(f"{where}: axis {axis} is both a mode and an option")
    offered = {**modes, **options}

    def check_pairs(sel: dict[str, Any], what: str) -> dict[str, str]:
        out: dict[str, str] = {}
        for axis, value in sel.items():
            if axis not in offered:
                errors.add(f"{what} names axis {axis!r}, not offered (offered: {_names(offered)})")
            elif value not in offered[axis]:
                errors.add(
                    f"{what}: {axis}={value!r} is not offered (allowed: {', '.join(offered[axis])})"
                )
            else:
                out[axis] = value
        return out

    option_base = check_pairs(
        _str_map(obj.get("option_base"), f"{where}.option_base", errors), f"{where}.option_base"
    )
    raw_base = obj.get("option_base")
    for axis in options:
        if axis not in (raw_base if isinstance(raw_base, dict) else {}):
            errors.add(f"{where}.option_base has no default for option axis {axis}")
    recommended = check_pairs(
        _str_map(obj.get("recommended"), f"{where}.recommended", errors), f"{where}.recommended"
    )
    excluded: list[dict[str, str]] = []
    excluded_raw = obj.get("excluded") or []
    if not isinstance(excluded_raw, list):
        errors.add(f"{where}.excluded must be a list of partial selections")
    else:
        for i, entry in enumerate(excluded_raw):
            if not isinstance(entry, dict) or not entry:
                errors.add(f"{where}.excluded[{i}] must be a non-empty object")
                continue
            excluded.append(check_pairs(entry, f"{where}.excluded[{i}]"))
    deltas: dict[str, dict[str, Delta]] = {}
    for dkey, per_role in _str_map(obj.get("deltas"), f"{where}.deltas", errors).items():
        dwhere = f"{where}.deltas[{dkey}]"
        axis, eq, value = dkey.partition("=")
        if not eq:
            errors.add(f"{dwhere}: key must be AXIS=VALUE")
            continue
        check_pairs({axis: value}, dwhere)
        deltas[dkey] = {}
        for role_name, d in _str_map(per_role, dwhere, errors).items():
            rwhere = f"{dwhere}.{role_name}"
            if role_name not in roles:
                errors.add(f"{rwhere}: no such role (roles: {', '.join(sorted(roles))})")
                continue
            if not isinstance(d, dict):
                errors.add(f"{rwhere} must be an object")
                continue
            deltas[dkey][role_name] = Delta(
                del_args=_key_list(d.get("del_args"), f"{rwhere}.del_args", errors),
                del_envs=_key_list(d.get("del_envs"), f"{rwhere}.del_envs", errors),
                add_args=_parse_args(d.get("add_args"), f"{rwhere}.add_args", errors),
                add_envs=_parse_envs(d.get("add_envs"), f"{rwhere}.add_envs", errors),
            )
    return Grid(
        model=model,
        base=base,
        modes=modes,
        options=options,
        option_base=option_base,
        recommended=recommended,
        excluded=excluded,
        deltas=deltas,
        router=router,
    )


def _names(offered: dict[str, list[str]]) -> str:
    return ", ".join(f"{a} ({'|'.join(v)})" for a, v in offered.items()) or "none"


def _parse_option(obj: Any, where: str, card_model: str, errors: _Errors) -> Option | None:
    if not isinstance(obj, dict):
        errors.add(f"{where} must be an object")
        return None
    target = obj.get("target")
    if not isinstance(target, str) or not target:
        errors.add(f"{where}.target must be a non-empty string")
        target = ""
    elif not _check(NAME, target, f"{where}: target", errors):
        target = ""
    npus = obj.get("npus")
    if not isinstance(npus, int) or isinstance(npus, bool) or npus < 1:
        errors.add(f"{where}.npus must be a positive integer, got {npus!r}"[:200])
        npus = 1
    elif npus > MAX_NPUS:
        shown = str(npus) if len(str(npus)) <= 24 else str(npus)[:21] + "..."
        errors.add(f"{where}.npus must be at most {MAX_NPUS}, got {shown}")
        npus = 1
    skus = obj.get("skus")
    if not isinstance(skus, list) or not skus or not all(isinstance(s, str) for s in skus):
        errors.add(f"{where}.skus must be a non-empty list of strings")
        skus = []
    skus = [sku for sku in skus if _check(NAME, sku, f"{where}: SKU", errors)]
    grid = _parse_grid(obj.get("grid"), f"{where}.grid", card_model, errors)
    if grid is None:
        return None
    return Option(target=target, npus=npus, skus=list(skus), grid=grid)


def card_from_dict(obj: dict[str, Any], *, name: str, path: Path | None = None) -> Card:
    """Validate a decoded card and build a :class:`Card`; every problem is reported at once.

    + obj: the decoded JSON object
    + name: the qualified name or path to record in the card (and to name in errors)
    + path: the file it came from, if any
    """
    errors = _Errors(name)
    model = obj.get("model")
    if not isinstance(model, str) or not model:
        errors.add("the card has no 'model' string")
        model = ""
    elif not _check(NAME, model, "model", errors) or not _model_id(model, "model", errors):
        model = ""
    axes: dict[str, list[str]] = {}
    axes_raw = obj.get("axes") or []
    if isinstance(axes_raw, list):
        for a in axes_raw:
            if isinstance(a, dict) and isinstance(a.get("axis"), str):
                options = a.get("options") or []
                if not isinstance(options, list):
                    errors.add(f"axes {a['axis']}: 'options' must be a list of {{value: ...}}")
                    continue
                axes[a["axis"]] = [
                    o["value"]
                    for o in options
                    if isinstance(o, dict) and isinstance(o.get("value"), str)
                ]
    strategies: list[Strategy] = []
    raw = obj.get("strategies")
    if not isinstance(raw, list) or not raw:
        errors.add("'strategies' must be a non-empty list")
        raw = []
    for i, s in enumerate(raw):
        where = f"strategies[{i}]"
        if not isinstance(s, dict):
            errors.add(f"{where} must be an object")
            continue
        slug = s.get("slug")
        if not isinstance(slug, str) or not slug:
            errors.add(f"{where}.slug must be a non-empty string")
            continue
        if not _check(SLUG, slug, f"{where}: slug", errors):
            continue
        where = f"strategy {slug}"
        _unused(s, ("nodes",), where, errors)
        opts_raw = s.get("options")
        if not isinstance(opts_raw, list) or not opts_raw:
            errors.add(f"{where}: 'options' must be a non-empty list")
            continue
        options = []
        for j, o in enumerate(opts_raw):
            tgt = o.get("target") if isinstance(o, dict) else None
            opt = _parse_option(o, f"{where} option {tgt or j}", model, errors)
            if opt is not None:
                options.append(opt)
        targets = [o.target.lower() for o in options]
        if len(set(targets)) != len(targets):
            errors.add(f"{where}: duplicate targets {', '.join(o.target for o in options)}")
        label = _label(s.get("label"), where, errors) or slug
        strategies.append(Strategy(slug=slug, label=label, options=options))
    slugs = [s.slug for s in strategies]
    if len(set(slugs)) != len(slugs):
        errors.add(f"duplicate strategy slugs: {', '.join(slugs)}")
    errors.raise_if_any()
    return Card(name=name, model=model, axes=axes, strategies=strategies, path=path)
