"""The ``vllm serve`` flag table, generated from the dumps of the real parser (flags/*.json):
vLLM's value parsers and argparse actions by the names the dumps give them, FlexibleArgumentParser's
habits, and the ``VLLM_*`` variables vLLM knows. A SIMULATION for the servefleet lab."""

from __future__ import annotations

import argparse
import copy
import functools
import json
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .common import DEFAULT_PLATFORM, ENVS_FILE, FLAGS_DIR, PLATFORM_DEFAULTS, PLATFORMS, PROG
from .config_schemas import check_config, config_title, json_invalid

# vLLM's value parsers, by the names the dumps give them. Their __name__ is what argparse shows
# in "argument --x: invalid <name> value: 'v'", as vLLM's functions of the same name would.


def human_readable_int(value: str) -> int:
    """``25.6k`` = 25600 and ``1m`` = 10**6 (k/m/g/t: powers of 1000); ``2K`` = 2048 (K/M/G/T:
    powers of 1024, whole numbers only); anything else goes to ``int()``."""
    value = value.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if match:
        number, suffix = match.groups()
        if suffix.islower():
            return int(float(number) * 1000 ** ("kmgt".index(suffix) + 1))
        if "." in number:
            raise argparse.ArgumentTypeError(
                f"Decimals are not allowed with binary suffixes like {suffix}. "
                f"Did you mean to use {number}{suffix.lower()} instead?"
            )
        return int(number) * 1024 ** ("KMGT".index(suffix) + 1)
    return int(value)


def human_readable_int_or_auto(value: str) -> int:
    """:func:`human_readable_int`, or ``auto`` / ``-1`` (-1: let vLLM decide)."""
    value = value.strip()
    if value in ("auto", "-1"):
        return -1
    return human_readable_int(value)


def _json_object_text(val: str) -> Any:
    try:
        return json.loads(val)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"Invalid JSON: {exc}") from None


def parse_dataclass(val: str) -> dict[str, Any]:
    """A config dataclass from JSON, for a config argument the simulator knows no class of
    (:func:`vllm.config_schemas.config_title`): a JSON object, any keys."""
    value = _json_object_text(_expand_json_human_readable_numbers(val))
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"Input should be a JSON object: {val!r}")
    return value


def _config_type(flag: str, platform: str) -> Callable[[str], Any]:
    """vLLM's ``parse_dataclass`` of ``flag``'s config class: the JSON validated against the
    class's schema, pydantic's message as the argument's error (:mod:`vllm.config_schemas`)."""

    def parse_dataclass(val: str) -> Any:
        text = _expand_json_human_readable_numbers(val)
        invalid = json_invalid(flag, text, platform)  # pydantic reads the text itself
        if invalid is not None:
            raise argparse.ArgumentTypeError(invalid)
        value = json.loads(text)
        message = check_config(flag, value, platform)
        if message is not None:
            raise argparse.ArgumentTypeError(message)
        return value

    return parse_dataclass


def _parse_type(inner: Callable[[str], Any]) -> Callable[[str], Any]:
    def _parse_type(val: str) -> Any:  # vLLM's parse_type: a ValueError becomes the message
        try:
            return inner(val)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(
                f"Value {val} cannot be converted to {inner}."
            ) from exc

    return _parse_type


def _optional_type(inner: Callable[[str], Any]) -> Callable[[str], Any]:
    def _optional_type(val: str) -> Any:  # vLLM's optional_type: "" and "None" are None
        return None if val in ("", "None") else _parse_type(inner)(val)

    return _optional_type


def union_dict_and_str(val: str) -> Any:
    """A JSON object when the text is braced (``{...}``, through vLLM's ``optional_type``),
    else the text itself."""
    if not re.match(r"(?s)^\s*{.*}\s*$", val):
        return str(val)
    return _optional_type(json.loads)(val)


def _kernel_backend(val: str) -> str:  # --moe-backend and friends: lower case, "-" as "_"
    return val.lower().replace("-", "_")


def _device_ids(val: str) -> list[int]:  # --device-ids 0,1
    return [int(x) for x in val.split(",")]


_kernel_backend.__name__ = _device_ids.__name__ = "<lambda>"
_VALUE_TYPES: dict[str, Callable[[str], Any]] = {
    "int": int,
    "float": float,
    "str": str,
    "loads": json.loads,
    "human_readable_int": human_readable_int,
    "human_readable_int_or_auto": human_readable_int_or_auto,
    "parse_dataclass": parse_dataclass,
    "union_dict_and_str": union_dict_and_str,
}
_WRAPPERS = {"_optional_type": _optional_type, "_parse_type": _parse_type}
_LAMBDAS = {"device_ids": _device_ids}


def value_type(
    name: str | None, dest: str, flag: str = "", platform: str = DEFAULT_PLATFORM
) -> Callable[[str], Any] | None:
    """The value parser a dump names, e.g. ``_optional_type(human_readable_int)``.

    + name: the dump's ``type`` (None: the text as is)
    + dest: the argument, for the dump's anonymous ``<lambda>`` parsers
    + flag: the argument's first spelling, for the schema of its config class
    + platform: whose config classes
    """
    if name is None:
        return None
    if name == "<lambda>":
        return _LAMBDAS.get(dest, _kernel_backend)
    wrapped = re.fullmatch(r"(\w+)\((.*)\)", name)
    if wrapped:
        inner = value_type(wrapped.group(2), dest, flag, platform)
        assert inner is not None
        return _WRAPPERS[wrapped.group(1)](inner)
    if name == "parse_dataclass" and config_title(flag, platform) is not None:
        return _config_type(flag, platform)
    return _VALUE_TYPES[name]


def _update(into: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """Merge ``extra`` into ``into`` the way vLLM merges dotted sub-keys: dicts recursively,
    lists appended, anything else replaced."""
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _update(into[key], value)
        elif isinstance(value, list) and isinstance(into.get(key), list):
            into[key] = into[key] + value
        else:
            into[key] = value
    return into


class _StoreRbln(argparse._StoreAction):
    """vllm-rbln's store of an RBLNConfig field (``--rbln-<field>``)."""


class _StoreRblnBool(argparse.BooleanOptionalAction):
    """vllm-rbln's ``--rbln-<field>`` / ``--no-rbln-<field>``."""


class _MergeAdditionalConfig(argparse._StoreAction):
    """vllm-rbln's ``--additional-config``: a repeated JSON object merges into the earlier one."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        current = getattr(namespace, self.dest, None)
        if isinstance(current, dict) and isinstance(values, dict):
            values = _update(copy.deepcopy(current), values)
        setattr(namespace, self.dest, values)


class LoRAParserAction(argparse.Action):
    """vLLM's ``--lora-modules``: items ``name=path`` or JSON ``{"name", "path"[, "base_model_name"]}``."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        modules: list[dict[str, Any]] = []
        for item in values or []:
            if item in (None, ""):
                continue
            if "=" in item and "," not in item:
                name, path = item.split("=")  # as vLLM: a second "=" is a ValueError
                modules.append({"name": name, "path": path})
                continue
            try:
                module = json.loads(item)
            except json.JSONDecodeError:
                parser.error(f"Invalid JSON format for --lora-modules: {item}")
            fields = set(module) if isinstance(module, dict) else set()
            if not {"name", "path"} <= fields <= {"name", "path", "base_model_name"}:
                parser.error(f"Invalid fields for --lora-modules: {item}")
            modules.append(module)
        setattr(namespace, self.dest, modules)


_ACTIONS: dict[str, Any] = {
    "_StoreAction": "store",
    "_StoreTrueAction": "store_true",
    "_AppendAction": "append",
    "_HelpAction": "help",
    "BooleanOptionalAction": argparse.BooleanOptionalAction,
    "_StoreRbln": _StoreRbln,
    "_StoreRblnBool": _StoreRblnBool,
    "_MergeAdditionalConfig": _MergeAdditionalConfig,
    "LoRAParserAction": LoRAParserAction,
}
_BOOL_ACTIONS = ("BooleanOptionalAction", "_StoreRblnBool")
# A default the dump could only write as a Python repr ("set()", "<Enum.X: 'x'>", "Cls(...)",
# "{'k': ...}") is None here; so is the default of an --rbln-* field, so that a given flag can be
# told from an unset one (RBLNConfig then takes the env var, then its own default).
_REPR_DEFAULT = re.compile(r"<.*>|\w+\(.*\)|\{.*\}", re.S)


def _default(entry: Mapping[str, Any]) -> Any:
    value = entry["default"]
    if entry["action"] in ("_StoreRbln", "_StoreRblnBool"):
        return None
    if isinstance(value, str) and _REPR_DEFAULT.fullmatch(value):
        return None
    return value


@functools.cache
def flag_table(platform: str = DEFAULT_PLATFORM) -> tuple[dict[str, Any], ...]:
    """The real parser's actions for ``platform`` (``rbln`` or ``upstream``), from flags/."""
    with open(os.path.join(FLAGS_DIR, PLATFORMS[platform])) as fh:
        return tuple(json.load(fh)["flags"])


@functools.cache
def known_env_vars(platform: str = DEFAULT_PLATFORM) -> frozenset[str]:
    """The ``VLLM_*`` variables vLLM 0.30.0 knows (and vllm-rbln's, on the rbln platform)."""
    with open(os.path.join(FLAGS_DIR, ENVS_FILE)) as fh:
        data = json.load(fh)
    return frozenset(data["vllm"] + (data["vllm_rbln"] if platform == "rbln" else []))


def unknown_env_vars(env: Mapping[str, str], platform: str = DEFAULT_PLATFORM) -> list[str]:
    """The ``VLLM_*`` names in ``env`` that real vLLM would warn about, sorted."""
    known = known_env_vars(platform)
    return sorted(k for k in env if k.startswith("VLLM_") and k not in known)


TASK_HINT = (
    "\n\nHint: --task is not a vllm serve option. For embedding, reranking, or reward models, "
    "use --runner pooling. To adapt a generative model for pooling, also use --convert embed, "
    "--convert classify, or --convert reward."
)


def _dotted_value(text: str) -> Any:
    """A dotted sub-key's value as vLLM reads it: JSON, else a human-readable integer
    (``1k``, ``2M``), else the text itself (``True``, ``auto``, ``1.5K`` stay strings; the
    flag's value parser, pydantic for a config class, then reads them by the field's type)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        try:
            return human_readable_int(text)
        except (ValueError, argparse.ArgumentTypeError):
            return text


def _expand_json_human_readable_numbers(val: str) -> str:
    """vLLM's expansion of bare (unquoted) human-readable numbers in a config argument's JSON
    (``{"max_cudagraph_capture_size": 1k}``), before pydantic reads it."""
    parts = re.split(r'("(?:[^"\\]|\\.)*")', val)
    for i in range(0, len(parts), 2):  # even indexes: outside strings
        parts[i] = re.sub(
            r"\b\d+(?:\.\d+)?[kKmMgGtT]\b",
            lambda m: str(human_readable_int(m.group())),
            parts[i],
        )
    return "".join(parts)


def _recursive_update(original: dict[str, Any], update: Mapping[str, Any]) -> None:
    """vLLM's merge of dotted sub-keys of one flag: dicts recursively, lists appended, anything
    else replaced."""
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(original.get(key), dict):
            _recursive_update(original[key], value)
        elif isinstance(value, list) and isinstance(original.get(key), list):
            original[key] += value
        else:
            original[key] = value


def preprocess(args: Sequence[str], parser: FlexibleArgumentParser | None = None) -> list[str]:
    """What vLLM's ``FlexibleArgumentParser.parse_args`` does to the arguments before argparse
    sees them, in its order: after ``serve``, ``--model X`` moved to the front as the positional
    (and a ``--served-model-name`` without a positional model refused); ``--help=WORD`` as
    ``--help``; ``_`` as ``-`` in a ``--flag`` name up to its first ``.``; ``-O3``, ``-O=3`` and
    ``-O 3`` as ``--optimization-level``; dotted sub-keys (``--a.b.c v``, ``-cc.x=v``,
    ``--a.b+ x,y`` for a list) taken out, merged into one object per flag spelling and appended
    at the end as that spelling's JSON text (so they replace, not merge with, the object the
    flag itself gives).

    + args: the command line after the program, e.g. ``["serve", "m", "--port", "8000"]``
    + parser: whose ``_pull_args_from_config`` reads a ``--config`` file's arguments in
    """
    args = list(args)
    if args and args[0] == "serve":
        model_idx = next((i for i, a in enumerate(args) if re.match(r"^--model(=.+|$)", a)), None)
        if model_idx is not None:
            if args[model_idx] == "--model":
                model_tag = args[model_idx + 1]  # as vLLM: a trailing --model is an IndexError
                rest_start_idx = model_idx + 2
            else:
                model_tag = args[model_idx].removeprefix("--model=")
                rest_start_idx = model_idx + 1
            args = ["serve", model_tag, *args[1:model_idx], *args[rest_start_idx:]]
        if (
            len(args) > 1
            and args[1].startswith("-")
            and not any(re.match(r"^--config(=.+|$)", a) for a in args)
            and any(re.match(r"^--served[-_]model[-_]name(=.+|$)", a) for a in args)
        ):
            raise ValueError(
                "`model` should be provided as the first positional argument when "
                "using `vllm serve`. i.e. `vllm serve <model> --<arg> <value>`."
            )
    if "--config" in args and parser is not None:
        args = parser._pull_args_from_config(args)
    processed: list[str] = []
    for i, arg in enumerate(args):
        if arg.startswith("--help="):
            processed.append("--help")
        elif arg.startswith("--"):
            key, eq, value = arg.partition("=")
            head, dot, tail = key[2:].partition(".")
            processed.append("--" + head.replace("_", "-") + dot + tail + eq + value)
        elif arg.startswith("-O") and arg != "-O":
            processed += ["--optimization-level", arg[3:] if arg[2] == "=" else arg[2:]]
        elif arg == "-O" and i + 1 < len(args) and args[i + 1] in {"0", "1", "2", "3"}:
            processed.append("--optimization-level")
        else:
            processed.append(arg)
    delete: set[int] = set()
    dict_args: dict[str, dict[str, Any]] = {}
    for i, arg in enumerate(processed):
        if i in delete or not (arg.startswith("-") and "." in arg):
            continue
        if "=" in arg:
            arg, value_str = arg.split("=", 1)
            if "." not in arg:  # the "." was in the value
                continue
        else:
            value_str = processed[i + 1]  # as vLLM: a trailing dotted key is an IndexError
            delete.add(i + 1)
        if arg.endswith("+"):
            arg = arg[:-1]
            value_str = json.dumps(value_str.split(","))
        key, *keys = arg.split(".")
        nested: Any = _dotted_value(value_str)
        for part in reversed(keys):
            nested = {part: nested}
        _recursive_update(dict_args.setdefault(key, {}), nested)
        delete.add(i)
    out = [a for i, a in enumerate(processed) if i not in delete]
    for flag, obj in dict_args.items():
        out += [flag, json.dumps(obj)]
    return out


class FlexibleArgumentParser(argparse.ArgumentParser):
    """vLLM's ``vllm.utils.argparse_utils.FlexibleArgumentParser``: argparse with vLLM's habits
    (:func:`preprocess`, a ``--config`` YAML file's arguments, the ``--task`` hint), argparse's
    abbreviations of long flags and its errors (exit 2)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._show_serve_task_hint = False

    def error(self, message: str) -> Any:  # argparse's format, exit 2
        if (
            (self.prog.endswith(" serve") or self._show_serve_task_hint)
            and message.startswith("unrecognized arguments:")
            and re.search(r"(^|\s)--task(=|\s|$)", message)
        ):
            message += TASK_HINT
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")

    @functools.cache  # noqa: B019 (parsers are built once per platform and kept)
    def format_usage(self) -> str:  # some 440 spellings: wrapped once, not on every error
        return super().format_usage()

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        items = list(sys.argv[1:] if args is None else args)
        self._show_serve_task_hint = items[:1] == ["serve"] and any(
            re.match(r"^--task(=.+|$)", arg) for arg in items[1:]
        )
        return super().parse_args(preprocess(items, self), namespace)

    def _pull_args_from_config(self, args: list[str]) -> list[str]:
        """vLLM's: the ``--config`` file's arguments (:meth:`load_config_file`) put where they
        rank below the command line's: after ``serve`` and its positional model."""
        assert args.count("--config") <= 1, "More than one config file specified!"
        index = args.index("--config")
        if index == len(args) - 1:
            raise ValueError("No config file specified! Please check your command-line arguments.")
        config_args = self.load_config_file(args[index + 1])
        if args[0].startswith("-"):  # no subcommand
            return config_args + args[0:index] + args[index + 2 :]
        if args[0] == "serve":
            model_in_cli = len(args) > 1 and not args[1].startswith("-")
            if not model_in_cli and "--model" not in config_args:
                raise ValueError(
                    "No model specified! Please specify model either "
                    "as a positional argument or in a config file."
                )
            if model_in_cli:
                return [*args[:2], *config_args, *args[2:index], *args[index + 2 :]]
        return [args[0], *config_args, *args[1:index], *args[index + 2 :]]

    def load_config_file(self, file_path: str) -> list[str]:
        """vLLM's: a YAML file's keys as ``--key value`` (a true bool as ``--key``, a false one
        as ``--no-key`` when this parser has it, a list's items after ``--key``, a mapping as
        JSON). PyYAML reads it, as it does for vLLM (which requires it)."""
        extension = file_path.split(".")[-1]
        if extension not in ("yaml", "yml"):
            raise ValueError(f"Config file must be of a yaml/yml type. {extension} supplied")
        import yaml  # only for --config: the rest of the simulator is the standard library

        with open(file_path) as config_file:
            config: dict[str, Any] = yaml.safe_load(config_file)
        processed_args: list[str] = []
        for key, value in config.items():
            if isinstance(value, bool):
                if value:
                    processed_args.append("--" + key)
                elif (no_key := f"--no-{key}") in self._option_string_actions:
                    processed_args.append(no_key)
            elif isinstance(value, list):
                if value:
                    processed_args += ["--" + key, *(str(item) for item in value)]
            elif isinstance(value, dict):
                processed_args += ["--" + key, json.dumps(value)]
            else:
                processed_args += ["--" + key, str(value)]
        return processed_args


def add_serve_args(
    parser: argparse.ArgumentParser, platform: str = DEFAULT_PLATFORM
) -> argparse.ArgumentParser:
    """vLLM's ``make_arg_parser``: the positional model and every action of ``platform``'s dump
    (taken after vllm-rbln's ``pre_register_and_update``) on ``parser``; the dump's help action
    only when the parser has none (a subcommand's parser comes with its own)."""
    parser.add_argument("model_tag", nargs="?", default=None, help="model id or path")
    for entry in flag_table(platform):
        flags, kind = entry["flags"], entry["action"]
        if kind == "_HelpAction" and any(f in parser._option_string_actions for f in flags):
            continue
        kwargs: dict[str, Any] = {"action": _ACTIONS[kind]}
        if kind != "_HelpAction":
            kwargs.update(dest=entry["dest"], default=_default(entry))
        if kind in _BOOL_ACTIONS:  # argparse makes the --no- spellings itself
            flags = [f for f in flags if not (f.startswith("--no-") and "--" + f[5:] in flags)]
        elif kind not in ("_HelpAction", "_StoreTrueAction"):
            parse = value_type(entry["type"], entry["dest"], entry["flags"][0], platform)
            kwargs.update(type=parse, choices=entry["choices"])
            if entry["nargs"] is not None:
                kwargs["nargs"] = entry["nargs"]
            if entry["nargs"] == "?":  # --hf-token alone: use the stored token
                kwargs["const"] = True
        parser.add_argument(*flags, **kwargs)
    return parser


@functools.cache
def build_parser(platform: str = DEFAULT_PLATFORM) -> FlexibleArgumentParser:
    """The ``vllm serve`` parser of ``platform``: every action of the dump, argparse errors."""
    parser = FlexibleArgumentParser(prog=PROG, add_help=False)
    add_serve_args(parser, platform)
    return parser


def parse_serve_args(argv: Sequence[str], platform: str = DEFAULT_PLATFORM) -> argparse.Namespace:
    """Parse the arguments after ``vllm serve`` (exits 2 on an unknown flag or bad value).

    + argv: the arguments after ``serve``
    + platform: the flag table, ``rbln`` or ``upstream``
    """
    processed = preprocess(["serve", *argv], build_parser(platform))[1:]  # after ``vllm serve``
    ns: argparse.Namespace = argparse.ArgumentParser.parse_args(build_parser(platform), processed)
    ns.model = ns.model_tag or ns.model  # vllm serve: the positional model wins
    for dest, value in PLATFORM_DEFAULTS[platform].items():
        if getattr(ns, dest) is None:
            setattr(ns, dest, value)
    return ns


def _object(value: Any) -> dict[str, Any]:
    """A JSON argument's object, or {} (unset, None, or a non-object JSON value)."""
    return value if isinstance(value, dict) else {}
