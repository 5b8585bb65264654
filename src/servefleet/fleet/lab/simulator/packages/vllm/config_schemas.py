"""vLLM 0.30.0's config classes, from the dumps of their JSON schemas (``flags/*-configs.json``):
the value of a config argument (``--attention-config``, ``--compilation-config``, ...) checked as
pydantic checks JSON against those classes (lax mode, ``extra="forbid"``: an unknown key is an
error), and refused in pydantic's own words. A SIMULATION for the servefleet lab.

What the schemas cannot show, written here once:

- vLLM's ``field_validator(mode="before")`` that read an enum by its member name:
  ``CompilationConfig.mode`` (``"VLLM_COMPILE"``), ``CompilationConfig.cudagraph_mode``
  (``"FULL_DECODE_ONLY"``; an unknown name is vLLM's bare ``KeyError``), and the attention
  backends (``AttentionConfig.backend``, ``mla_prefill_backend``, the values of
  ``backend_per_kind``). The dumps list the attention enums' values, not their member names, so
  there any name-shaped string (a Python identifier once upper-cased) passes and anything else is
  refused with the first sentence of vLLM's message.
- vLLM's ``field_validator(mode="wrap")`` ``_skip_none_validation``: a ``null`` for one of
  those fields (:data:`SKIP_NONE`, read from the real wheel's classes) passes unchecked.
- pydantic's error text is reproduced without the ``For further information visit`` URL line
  (its pydantic version is not in the dumps). Text that is not JSON is pydantic's
  ``json_invalid`` error (:func:`json_invalid`): its words for Python's JSON error, at Python's
  position (pydantic's own parser places some errors a few columns on).
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .common import DEFAULT_PLATFORM, FLAGS_DIR

CONFIG_FILES = {
    "rbln": "vllm-0.30.0-rbln-0.12.0-configs.json",
    "upstream": "vllm-0.30.0-upstream-configs.json",
}


@functools.cache
def config_classes(platform: str = DEFAULT_PLATFORM) -> dict[str, dict[str, Any]]:
    """Flag -> ``{"class", "extra", "schema"}`` of the JSON-object arguments on ``platform``.
    The rbln dump starts with the warning vllm-rbln logs on import; the JSON is what follows.

    + platform: ``rbln`` or ``upstream``
    """
    with open(os.path.join(FLAGS_DIR, CONFIG_FILES[platform])) as fh:
        text = fh.read()
    start = 0 if text.startswith("{") else text.index("\n{") + 1
    classes: dict[str, dict[str, Any]] = json.loads(text[start:])
    return classes


def config_schema(flag: str, platform: str = DEFAULT_PLATFORM) -> dict[str, Any] | None:
    """The JSON schema of ``flag``'s config class, None when there is none (not a config
    argument, or pydantic could not make one: ``--speculative-config``).

    + flag: the flag's first spelling, e.g. ``--attention-config``
    + platform: ``rbln`` or ``upstream``
    """
    entry = config_classes(platform).get(flag)
    schema = entry.get("schema") if entry else None
    return schema if isinstance(schema, dict) and "properties" in schema else None


# the config arguments whose class the dumps give no schema of (pydantic could not make one):
# their class's name, from the real wheel; their JSON is checked, their keys are not
NO_SCHEMA = {
    "--quantization-config": "QuantizationConfigArgs",
    "--ir-op-priority": "IrOpPriorityConfig",
}


def config_title(flag: str, platform: str = DEFAULT_PLATFORM) -> str | None:
    """The name of ``flag``'s config class (its schema's title, else :data:`NO_SCHEMA`'s), None
    when it is not a config argument the parser validates.

    + flag: the flag's first spelling
    + platform: ``rbln`` or ``upstream``
    """
    schema = config_schema(flag, platform)
    return str(schema["title"]) if schema is not None else NO_SCHEMA.get(flag)


@dataclass(frozen=True)
class LineError:
    """One of pydantic's line errors: where, its type, its message and the input there."""

    loc: tuple[str | int, ...]
    type: str
    msg: str
    input: Any


def _input_repr(value: Any) -> str:
    """pydantic's ``input_value``: the repr, cut to 50 characters around ``...``."""
    text = repr(value)
    return text if len(text) <= 50 else f"{text[:25]}...{text[-24:]}"


def validation_message(title: str, errors: list[LineError]) -> str:
    """``str(ValidationError)`` as pydantic writes it (no URL lines).

    + title: the class validated, e.g. ``AttentionConfig``
    + errors: the line errors, in order
    """
    lines = [f"{len(errors)} validation error{'s' if len(errors) != 1 else ''} for {title}"]
    for error in errors:
        if error.loc:
            lines.append(".".join(str(part) for part in error.loc))
        lines.append(
            f"  {error.msg} [type={error.type}, input_value={_input_repr(error.input)}, "
            f"input_type={type(error.input).__name__}]"
        )
    return "\n".join(lines)


def _expected(values: list[Any]) -> str:
    """pydantic's list of allowed values: ``'a', 'b' or 'c'``."""
    shown = [repr(v) for v in values]
    return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " or " + shown[-1]


class _Named:
    """An enum member given by a name the dumps cannot check (see the module's docstring)."""


NAMED = _Named()
_TRUE = {"1", "on", "t", "true", "y", "yes"}
_FALSE = {"0", "off", "f", "false", "n", "no"}
_CUDA_GRAPH_MODES = {
    "NONE": 0,
    "PIECEWISE": 1,
    "FULL": 2,
    "FULL_DECODE_ONLY": [2, 0],
    "FULL_AND_PIECEWISE": [2, 1],
}
_COMPILATION_MODES = {
    "NONE": 0,
    "STOCK_TORCH_COMPILE": 1,
    "DYNAMO_TRACE_ONCE": 2,
    "VLLM_COMPILE": 3,
}


class _ValueError(Exception):
    """A before-validator's ValueError: pydantic's ``value_error``."""


def _cudagraph_mode(value: Any) -> Any:
    if isinstance(value, str):
        return _CUDA_GRAPH_MODES[value.upper()]  # vLLM's CUDAGraphMode[...]: a bare KeyError
    return value


def _compilation_mode(value: Any) -> Any:
    if isinstance(value, str):
        if value.upper() not in _COMPILATION_MODES:
            raise _ValueError(
                f"Invalid compilation mode: {value}. "
                f"Valid modes are: {', '.join(_COMPILATION_MODES)}"
            )
        return _COMPILATION_MODES[value.upper()]
    return value


def _backend_name(value: Any, auto: bool = False) -> Any:
    if isinstance(value, str):
        if auto and value.lower() == "auto":
            return None
        if not value.upper().isidentifier():
            raise _ValueError(f"Unknown attention backend: '{value.upper()}'.")
        return NAMED
    return value


def _backend_per_kind(value: Any) -> Any:
    if isinstance(value, dict):
        return {kind: _backend_name(name) for kind, name in value.items()}
    return value


# (config class, field) -> vLLM's before-validator of that field
BEFORE: dict[tuple[str, str], Callable[[Any], Any]] = {
    ("CompilationConfig", "cudagraph_mode"): _cudagraph_mode,
    ("CompilationConfig", "mode"): _compilation_mode,
    ("AttentionConfig", "backend"): functools.partial(_backend_name, auto=True),
    ("AttentionConfig", "mla_prefill_backend"): _backend_name,
    ("AttentionConfig", "backend_per_kind"): _backend_per_kind,
}


# config class -> its fields whose None vLLM's _skip_none_validation lets through
SKIP_NONE: dict[str, frozenset[str]] = {
    "CompilationConfig": frozenset(
        {
            "cudagraph_mode",
            "ir_enable_torch_wrap",
            "level",
            "max_cudagraph_capture_size",
            "mode",
            "use_inductor_graph_partition",
        }
    ),
    "KernelConfig": frozenset(
        {"enable_cutedsl_warmup", "enable_flashinfer_autotune", "enable_jit_warmup"}
    ),
    "PassConfig": frozenset(
        {
            "enable_qk_norm_rope_fusion",
            "enable_sp",
            "fuse_act_padding",
            "fuse_act_quant",
            "fuse_allreduce_rms",
            "fuse_attn_quant",
            "fuse_gemm_comms",
            "fuse_mla_dual_rms_norm",
            "fuse_norm_quant",
            "fuse_qk_norm_rope_kvcache",
            "fuse_rope_kvcache",
            "fuse_rope_kvcache_cat_mla",
        }
    ),
}


def _number(value: Any) -> float | None:
    """The number pydantic's lax mode reads from ``value`` (bools, numbers, numeric text)."""
    if isinstance(value, (bool, int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def _scalar(kind: str, value: Any) -> tuple[str, str] | None:
    """The (type, message) of ``value`` failing JSON schema type ``kind``; None when it passes."""
    if kind == "boolean":
        if isinstance(value, bool):
            return None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            ok = value in (0, 1)
        elif isinstance(value, str):
            ok = value.lower() in _TRUE | _FALSE
        else:
            return "bool_type", "Input should be a valid boolean"
        return (
            None
            if ok
            else ("bool_parsing", "Input should be a valid boolean, unable to interpret input")
        )
    if kind == "integer":
        if isinstance(value, (bool, int)):
            return None
        if isinstance(value, float):
            if value.is_integer():
                return None
            return (
                "int_from_float",
                "Input should be a valid integer, got a number with a fractional part",
            )
        if isinstance(value, str):
            text = value.strip().lstrip("+-")
            if text.isdigit() and text.isascii():
                return None
            return (
                "int_parsing",
                "Input should be a valid integer, unable to parse string as an integer",
            )
        return "int_type", "Input should be a valid integer"
    if kind == "number":
        if isinstance(value, (bool, int, float)):
            return None
        if isinstance(value, str):
            if _number(value) is not None:
                return None
            return (
                "float_parsing",
                "Input should be a valid number, unable to parse string as a number",
            )
        return "float_type", "Input should be a valid number"
    if kind == "string":
        return None if isinstance(value, str) else ("string_type", "Input should be a valid string")
    if kind == "null":
        return None if value is None else ("none_required", "Input should be None")
    raise ValueError(f"schema type {kind!r} is not modeled")


_BOUNDS = (
    ("minimum", "greater_than_equal", "greater than or equal to", lambda v, b: v >= b),
    ("exclusiveMinimum", "greater_than", "greater than", lambda v, b: v > b),
    ("maximum", "less_than_equal", "less than or equal to", lambda v, b: v <= b),
    ("exclusiveMaximum", "less_than", "less than", lambda v, b: v < b),
)


class _Validator:
    """Checks values against one config class's schema (its ``$defs`` resolve ``$ref``)."""

    def __init__(self, defs: Mapping[str, Any], json_input: bool = True) -> None:
        self.defs = defs
        self.json_input = json_input  # validate_json's words, else a Python value's

    def resolve(self, schema: Mapping[str, Any]) -> tuple[Mapping[str, Any], bool]:
        """The schema a ``$ref`` names (and True: a class of its own), else the schema itself."""
        ref = schema.get("$ref")
        if isinstance(ref, str):
            return self.defs[ref.rsplit("/", 1)[-1]], True
        return schema, False

    def tag(self, schema: Mapping[str, Any]) -> str:
        """pydantic's name of a union member in an error's location (``int``, ``list[str]``)."""
        target, named = self.resolve(schema)
        if named:
            return str(target.get("title", "?"))
        if "const" in schema or "enum" in schema:
            values = [schema["const"]] if "const" in schema else schema["enum"]
            return "literal[" + ",".join(repr(v) for v in values) + "]"
        kind = schema.get("type")
        if kind == "array":
            inner = self.tag(schema.get("items", {}))
            return f"{'set' if schema.get('uniqueItems') else 'list'}[{inner}]"
        if kind == "object":
            extra = schema.get("additionalProperties")
            return f"dict[str,{self.tag(extra) if isinstance(extra, dict) else 'any'}]"
        names = {"integer": "int", "number": "float", "string": "str", "boolean": "bool"}
        return names.get(str(kind), "none" if kind == "null" else "any")

    def check(
        self, schema: Mapping[str, Any], value: Any, loc: tuple[str | int, ...]
    ) -> list[LineError]:
        """The line errors of ``value`` against ``schema`` at location ``loc``."""
        if value is NAMED:
            return []
        target, named = self.resolve(schema)
        if "anyOf" in target:
            return self._union(target["anyOf"], value, loc)
        if "enum" in target or "const" in target:
            values = [target["const"]] if "const" in target else list(target["enum"])
            if any(v == value and type(v) is type(value) for v in values):
                return []
            error = "enum" if named else "literal_error"
            return [LineError(loc, error, f"Input should be {_expected(values)}", value)]
        kind = target.get("type")
        if kind == "object" and "properties" in target:
            return self._dataclass(target, value, loc)
        if kind == "object":
            return self._dict(target, value, loc)
        if kind == "array":
            return self._array(target, value, loc)
        if kind is None:  # Any
            return []
        failed = _scalar(str(kind), value)
        if failed is not None:
            return [LineError(loc, failed[0], failed[1], value)]
        number = _number(value) if kind in ("integer", "number") else None
        for key, error, words, ok in _BOUNDS:
            bound = target.get(key)
            if number is not None and bound is not None and not ok(number, bound):
                return [LineError(loc, error, f"Input should be {words} {bound}", value)]
        return []

    def _union(self, members: list[Any], value: Any, loc: tuple[str | int, ...]) -> list[LineError]:
        nullable = any(m.get("type") == "null" for m in members)
        if value is None and nullable:
            return []
        rest = [m for m in members if m.get("type") != "null"]
        if len(rest) == 1:  # Optional[X]: pydantic's nullable, no union in the location
            return self.check(rest[0], value, loc)
        errors: list[LineError] = []
        for member in rest:
            found = self.check(member, value, (*loc, self.tag(member)))
            if not found:
                return []
            errors += found
        return errors

    def _dataclass(
        self, schema: Mapping[str, Any], value: Any, loc: tuple[str | int, ...]
    ) -> list[LineError]:
        title = str(schema.get("title", "?"))
        if not isinstance(value, dict):
            msg = (
                "Input should be an object"
                if self.json_input
                else f"Input should be a dictionary or an instance of {title}"
            )
            return [LineError(loc, "dataclass_type", msg, value)]
        props: Mapping[str, Any] = schema["properties"]
        errors: list[LineError] = []
        for name, field in props.items():
            if name not in value:
                if name in schema.get("required", ()):
                    errors.append(LineError((*loc, name), "missing", "Field required", value))
                continue
            given = value[name]
            if given is None and name in SKIP_NONE.get(title, ()):
                continue
            before = BEFORE.get((title, name))
            if before is not None:
                try:
                    given = before(given)
                except _ValueError as exc:
                    errors.append(
                        LineError((*loc, name), "value_error", f"Value error, {exc}", value[name])
                    )
                    continue
            errors += self.check(field, given, (*loc, name))
        if schema.get("additionalProperties") is False:
            errors += [
                LineError(
                    (*loc, key), "unexpected_keyword_argument", "Unexpected keyword argument", extra
                )
                for key, extra in value.items()
                if key not in props
            ]
        return errors

    def _dict(
        self, schema: Mapping[str, Any], value: Any, loc: tuple[str | int, ...]
    ) -> list[LineError]:
        if not isinstance(value, dict):
            return [LineError(loc, "dict_type", "Input should be a valid dictionary", value)]
        errors: list[LineError] = []
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key, item in value.items():
                errors += self.check(extra, item, (*loc, key))
        least = schema.get("minProperties")
        if not errors and least is not None and len(value) < least:
            msg = (
                f"Dictionary should have at least {least} item{'s' if least != 1 else ''} "
                f"after validation, not {len(value)}"
            )
            errors.append(LineError(loc, "too_short", msg, value))
        return errors

    def _array(
        self, schema: Mapping[str, Any], value: Any, loc: tuple[str | int, ...]
    ) -> list[LineError]:
        if not isinstance(value, list):
            if schema.get("uniqueItems"):
                return [LineError(loc, "set_type", "Input should be a valid set", value)]
            return [LineError(loc, "list_type", "Input should be a valid list", value)]
        errors: list[LineError] = []
        for index, item in enumerate(value):
            errors += self.check(schema.get("items", {}), item, (*loc, index))
        return errors


def check_config(
    flag: str, value: Any, platform: str = DEFAULT_PLATFORM, json_input: bool = True
) -> str | None:
    """pydantic's message for ``value`` (parsed JSON) given to ``flag``; None when it passes
    or the flag has no schema.

    + flag: the flag's first spelling, e.g. ``--attention-config``
    + value: the JSON value
    + platform: ``rbln`` or ``upstream``
    + json_input: pydantic reads the argument's JSON text (the parser's ``parse_dataclass``);
      False: the class is built from the parsed value (at engine start)
    """
    schema = config_schema(flag, platform)
    if schema is None:
        if flag in NO_SCHEMA and json_input and not isinstance(value, dict):
            error = LineError((), "dataclass_type", "Input should be an object", value)
            return validation_message(NO_SCHEMA[flag], [error])
        return None
    errors = _Validator(schema.get("$defs", {}), json_input).check(schema, value, ())
    return validation_message(str(schema["title"]), errors) if errors else None


def _container(text: str, pos: int) -> str:
    """The innermost JSON container open at ``pos`` (``{``, ``[``, or "" at the top)."""
    stack: list[str] = []
    in_string = escaped = False
    for char in text[:pos]:
        if in_string:
            escaped = not escaped and char == "\\"
            in_string = escaped or char != '"'
        elif char == '"':
            in_string = True
        elif char in "{[":
            stack.append(char)
        elif char in "}]" and stack:
            stack.pop()
    return stack[-1] if stack else ""


def _json_words(text: str, exc: json.JSONDecodeError) -> str:
    """pydantic's (jiter's) words for the JSON error Python found in ``text``."""
    at_end = exc.pos >= len(text.rstrip())
    here = text[exc.pos] if exc.pos < len(text) else ""
    inside = {"{": "an object", "[": "a list"}.get(_container(text, exc.pos), "a value")
    if exc.msg.startswith("Unterminated string"):
        return "EOF while parsing a string"
    if at_end and exc.msg.startswith("Expecting"):
        return f"EOF while parsing {inside}"
    if exc.msg.startswith("Expecting property name"):
        return "trailing comma" if here == "}" else "key must be a string"
    if exc.msg == "Expecting value":
        if here in ("]", "}"):
            return "trailing comma"
        return "expected ident" if here in ("t", "f", "n") else "expected value"
    if exc.msg == "Expecting ':' delimiter":
        return "expected `:`"
    if exc.msg == "Expecting ',' delimiter":
        return f"expected `,` or `{'}' if inside == 'an object' else ']'}`"
    if exc.msg == "Extra data":
        return "trailing characters"
    if exc.msg.startswith("Invalid control character"):
        return "control character (\\u0000-\\u001F) found while parsing a string"
    if exc.msg.startswith("Invalid \\escape"):
        return "invalid escape"
    return exc.msg


def json_invalid(flag: str, text: str, platform: str = DEFAULT_PLATFORM) -> str | None:
    """pydantic's message when ``text``, given to ``flag``, is not JSON (vLLM has pydantic
    validate the text against the flag's config class); None when it is JSON or the flag is
    not a config argument (:func:`config_title`).

    + flag: the flag's first spelling, e.g. ``--compilation-config``
    + text: the argument's text
    + platform: ``rbln`` or ``upstream``
    """
    title = config_title(flag, platform)
    if title is None:
        return None
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        line, column = exc.lineno, exc.colno
        at_end = exc.pos >= len(text.rstrip()) and exc.msg.startswith("Expecting")
        if at_end or exc.msg.startswith("Unterminated string"):  # pydantic: the last one read
            line, column = text.count("\n") + 1, len(text.rstrip().split("\n")[-1])
        words = f"Invalid JSON: {_json_words(text, exc)} at line {line} column {column}"
        return validation_message(title, [LineError((), "json_invalid", words, text)])
    return None
