"""vLLM 0.30.0's parser registries (``ToolParserManager``, ``ReasoningParserManager``): the names
the real wheel registers on each platform, generated from it by tests/realvllm/gen_registries.py
into ``flags/vllm-0.30.0-parsers.json``, plus any a plugin registers at run time. The simulator
has no parser classes: a registered name stands for one. A SIMULATION for the servefleet lab."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import os
import sys
from types import ModuleType
from typing import Any, ClassVar

from .common import BUILD, FLAGS_DIR, _log, sim_platform

PARSERS_FILE = "vllm-0.30.0-parsers.json"


@functools.cache
def registered(kind: str, platform: str) -> tuple[str, ...]:
    """The names real vLLM 0.30.0 registers on ``platform``, sorted.

    + kind: ``tool_call_parsers`` or ``reasoning_parsers``
    + platform: ``rbln`` or ``upstream``
    """
    with open(os.path.join(FLAGS_DIR, PARSERS_FILE)) as fh:
        return tuple(json.load(fh)[platform][kind])


def current_platform() -> str:
    """This process's platform: the CUDA build is upstream vLLM; the CPU build asks the host."""
    return "upstream" if BUILD["device"] == "cuda" else sim_platform(os.environ)


def import_plugin(plugin_path: str) -> ModuleType | None:
    """vLLM's ``import_plugin``: a module by name, else a Python file by its path; a file that
    fails to load is logged and skipped, as vLLM does."""
    try:
        return importlib.import_module(plugin_path)
    except ModuleNotFoundError:
        module_name = os.path.splitext(os.path.basename(plugin_path))[0]
        try:
            spec = importlib.util.spec_from_file_location(module_name, plugin_path)
            if spec is None or spec.loader is None:
                raise ModuleNotFoundError(f"No module named {module_name!r}") from None
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            spec.loader.exec_module(module)
            return module
        except Exception as exc:
            _log(f"Failed to load module '{module_name}' from {plugin_path}: {exc}", "ERROR")
            return None


class _Registry:
    """What both managers share: the data's names, the ones registered since, the lookup."""

    KIND: ClassVar[str]
    parsers: ClassVar[dict[str, Any]]

    @classmethod
    def list_registered(cls) -> list[str]:
        """The names of all registered parsers, sorted."""
        return sorted(set(registered(cls.KIND, current_platform())) | set(cls.parsers))

    @classmethod
    def _lookup(cls, name: str) -> Any:
        if name in cls.parsers:
            return cls.parsers[name]
        if name in registered(cls.KIND, current_platform()):
            return name  # the simulator's stand-in for the parser class
        return None

    @classmethod
    def register_module(
        cls, name: str | list[str] | None = None, force: bool = True, module: Any = None
    ) -> Any:
        """Register ``module`` under ``name`` (or its class name); a decorator without it."""

        def _register(obj: Any) -> Any:
            names = [name] if isinstance(name, str) else list(name or [obj.__name__])
            for item in names:
                if not force and item in cls.parsers:
                    raise KeyError(f"{item} is already registered at {obj.__module__}")
                cls.parsers[item] = obj
            return obj

        return _register(module) if module is not None else _register

    @classmethod
    def register_lazy_module(cls, name: str, module_path: str, class_name: str) -> None:
        cls.parsers[name] = (module_path, class_name)


class ToolParserManager(_Registry):
    """vLLM's ``vllm.tool_parsers.ToolParserManager``."""

    KIND = "tool_call_parsers"
    parsers: ClassVar[dict[str, Any]] = {}

    @classmethod
    def get_tool_parser(cls, name: str) -> Any:
        """The parser registered as ``name``; KeyError as vLLM's when there is none."""
        found = cls._lookup(name)
        if found is None:
            raise KeyError(f"Tool parser '{name}' not found.")
        return found

    @classmethod
    def import_tool_parser(cls, plugin_path: str) -> None:
        """Import a user-defined tool parser (it registers itself)."""
        import_plugin(plugin_path)


class ReasoningParserManager(_Registry):
    """vLLM's ``vllm.reasoning.ReasoningParserManager``."""

    KIND = "reasoning_parsers"
    parsers: ClassVar[dict[str, Any]] = {}

    @classmethod
    def get_reasoning_parser(cls, name: str) -> Any:
        """The parser registered as ``name``; KeyError as vLLM's when there is none."""
        found = cls._lookup(name)
        if found is None:
            registered_names = ", ".join(cls.list_registered())
            raise KeyError(
                f"Reasoning parser '{name}' not found. Available parsers: {registered_names}"
            )
        return found

    @classmethod
    def import_reasoning_parser(cls, plugin_path: str) -> None:
        """Import a user-defined reasoning parser (it registers itself)."""
        import_plugin(plugin_path)
