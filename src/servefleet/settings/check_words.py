"""The checks of the words deploy data puts on a command line or in an environment: more
``vllm serve`` arguments and variables, the flags and variables that override the recipe's,
a recipe's selection and features, environment variable names and API keys. Pure Python.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from servefleet.base.remote import layout
from servefleet.settings.check_names import NAME, SLUG
from servefleet.settings.checks import CONTROL, Refused, bad, entries, matching, show, typed

_AXIS_VALUE = re.compile(r"[^\x00-\x1f\x7f-\x9f%$]+")
_FLAG = re.compile(r"--?[A-Za-z0-9][A-Za-z0-9._-]*")
ENV_NAME = layout.ENV_NAME  # the host contract's rule
API_KEY = re.compile(r"[A-Za-z0-9._~+/=:@%,-]{16,1024}")
API_KEY_ALLOWED = "16-1024 characters of A-Za-z0-9 and ._~+/=:@%,- (e.g. `openssl rand -hex 32`)"
_SELECTION_ALLOWED = (
    "axis -> value (or 'axis=value,...'), values without %, $ or control characters"
)


_axes = entries(
    matching(NAME, "an axis name", _SELECTION_ALLOWED),
    matching(_AXIS_VALUE, "an axis value", _SELECTION_ALLOWED),
    _SELECTION_ALLOWED,
)


_FEATURES = entries(
    matching(SLUG, "a feature", "a feature name of the recipe"),
    matching(SLUG, "on, off or a mode", "on, off or a mode name"),
    "feature -> on, off or a mode",
)


def features(value: Any) -> dict[str, str]:
    """A mapping feature -> on/off/mode, or its command-line form ``name=on,name=off``."""
    if isinstance(value, str):  # --data serve_features=spec_decoding=on
        pairs = [p.split("=", 1) for p in value.split(",") if p]
        if not all(len(p) == 2 for p in pairs):
            raise Refused(
                f"expected NAME=MODE pairs separated by commas, got {show(value)}",
                "feature -> on, off or a mode",
            )
        value = dict(pairs)
    result: dict[str, str] = _FEATURES(value)
    return result


def selection(value: Any) -> dict[str, str]:
    """A mapping axis -> value, or its command-line form ``axis=value,axis=value``."""
    if isinstance(value, str):  # --data serve_selection=lmcache=cpu,spec_decode=suffix
        pairs = [p.split("=", 1) for p in value.split(",") if p]
        if not all(len(p) == 2 for p in pairs):
            raise Refused(
                f"expected AXIS=VALUE pairs separated by commas, got {show(value)}",
                _SELECTION_ALLOWED,
            )
        axes = [axis for axis, _ in pairs]
        twice = next((axis for axis in axes if axes.count(axis) > 1), None)
        if twice is not None:
            raise bad(value, f"sets axis {twice!r} twice", _SELECTION_ALLOWED)
        value = dict(pairs)
    return dict(_axes(value))


_ARGS_ALLOWED = (
    "a list of vllm serve flags and their values (or one string, split as a shell would)"
)
_ENV_ALLOWED = "NAME -> value (or 'NAME=value,...'), values without control characters"
_OVERRIDE_ALLOWED = (
    "a list (or 'a,b') of flags (--max-num-seqs) and variables (NAME) of serve_extra_args and "
    "serve_extra_env"
)


def word(value: Any, allowed: str) -> str:
    """One argv token or env value from data: a string or a number, one line."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise Refused(f"expected a string, got {show(value)}", allowed)
    text = str(value)
    if CONTROL.search(text):
        raise bad(text, "holds a control character", allowed)
    return text


def extra_args(value: Any) -> tuple[str, ...]:
    """More ``vllm serve`` tokens: a list, or one string split as a shell would
    (``--data serve_extra_args='--max-num-seqs 8'``). The flag table checks them later."""
    if isinstance(value, str):
        try:
            value = shlex.split(value)
        except ValueError as e:
            raise bad(value, f"cannot be split as a shell would ({e})", _ARGS_ALLOWED) from None
    items = typed(value, (list, tuple), "a list", _ARGS_ALLOWED)
    out = tuple(word(v, _ARGS_ALLOWED) for v in items)
    if "" in out:
        raise bad(list(out), "holds an empty argument", _ARGS_ALLOWED)
    return out


def extra_env(value: Any) -> dict[str, str]:
    """More variables: a mapping NAME -> value, or ``NAME=value,NAME=value``."""
    if isinstance(value, str):
        pairs = [p.split("=", 1) for p in value.split(",") if p]
        if not all(len(p) == 2 for p in pairs):
            raise Refused(
                f"expected NAME=value pairs separated by commas, got {show(value)}", _ENV_ALLOWED
            )
        value = dict(pairs)
    name = matching(ENV_NAME, "an environment variable name", _ENV_ALLOWED)
    result: dict[str, str] = entries(name, lambda v: word(v, _ENV_ALLOWED), _ENV_ALLOWED)(value)
    return result


def override_names(value: Any) -> tuple[str, ...]:
    """Flags and variable names: a list, or ``--a,NAME``."""
    if isinstance(value, str):
        value = [v for v in value.split(",") if v]
    out = []
    for item in typed(value, (list, tuple), "a list", _OVERRIDE_ALLOWED):
        text = typed(item, str, "a string", _OVERRIDE_ALLOWED)
        if not (_FLAG.fullmatch(text) or ENV_NAME.fullmatch(text)):
            raise bad(text, "is not a flag or a variable name", _OVERRIDE_ALLOWED)
        out.append(text)
    return tuple(out)
