"""What the installed vLLM defines at the module paths the simulator stands in for. Run with a
real-wheel python (tests/realvllm/build.py): reads a JSON object ``{module: [name, ...]}`` on
stdin (a module given as ``@MODULE.NAME``: the module that defines MODULE's NAME, as
``sys.modules[NAME.__module__]``) and prints one JSON object, for each module, ``null`` (it does not import: the error) or
``{name: description}``; a description is ``null`` (no such name), ``{"kind": "class",
"methods": {method: parameters}}``, ``{"kind": "function", "parameters": [...]}`` or
``{"kind": "value"}`` (parameters: the names, in order, without ``self``/``cls``)."""

from __future__ import annotations

import importlib
import inspect
import json
import sys
from typing import Any


def parameters(func: Any) -> list[str] | None:
    try:
        names = list(inspect.signature(func).parameters)
    except (TypeError, ValueError):
        return None
    return [n for n in names if n not in ("self", "cls")]


def describe(value: Any) -> dict[str, Any]:
    if inspect.isclass(value):
        methods = {
            name: parameters(member)
            for name, member in vars(value).items()
            if callable(member) or isinstance(member, (staticmethod, classmethod))
        }
        methods = {n: parameters(getattr(value, n)) for n in methods}
        return {"kind": "class", "methods": methods}
    if callable(value):
        return {"kind": "function", "parameters": parameters(value)}
    return {"kind": "value"}


def main() -> None:
    wanted: dict[str, list[str]] = json.load(sys.stdin)
    out: dict[str, Any] = {}
    for module, names in wanted.items():
        try:
            if module.startswith("@"):
                owner, _, attr = module[1:].rpartition(".")
                mod = sys.modules[getattr(importlib.import_module(owner), attr).__module__]
            else:
                mod = importlib.import_module(module)
        except Exception as exc:  # the module's own import error, as text
            out[module] = f"{type(exc).__name__}: {exc}"
            continue
        out[module] = {n: describe(getattr(mod, n)) if hasattr(mod, n) else None for n in names}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
