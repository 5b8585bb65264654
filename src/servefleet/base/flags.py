"""The real ``vllm serve`` flag table, and the data's extra arguments and environment checked
against it and merged into a server's argv and env.

The table is the one the lab's simulated vLLM parses with: the dumps of the real parser in the
vLLM version's reference data (:mod:`servefleet.base.vllm_reference`; its build copies them into
the simulated wheel), one per platform (``rbln``: with the vllm-rbln plugin, what CR13 hosts
run; ``upstream``: GPU hosts), and the ``VLLM_*`` variables vLLM knows. Pure, no I/O beyond
reading those files once.

A flag is known by its ``dest`` (argparse's): ``--enable-x`` and ``--no-enable-x``, ``-tp`` and
``--tensor-parallel-size``, ``--max_num_seqs`` and ``--max-num-seqs``, ``--a.b v`` (a sub-key)
and ``--a '{...}'`` set the same thing, as vLLM's ``FlexibleArgumentParser`` reads them.
"""

from __future__ import annotations

import difflib
import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from servefleet.base.errors import DataError
from servefleet.base.vllm_args import is_flag
from servefleet.base.vllm_reference import reference

# A table by name is what a kind's ``flag_table`` names (``rbln``: vLLM with the vllm-rbln
# plugin; ``upstream``: vLLM alone): its dump, name in messages and variables are the reference's
_NO_VALUE = ("_StoreTrueAction", "BooleanOptionalAction", "_StoreRblnBool", "_HelpAction")
_OBJECT_TYPES = ("loads", "parse_dataclass", "union_dict_and_str")  # take ``--flag.sub v``

# What the deploy sets itself, and the data key that says it: never an extra argument
DEPLOY_FLAGS = {
    "port": "serve_base_port",
    "host": "serve_host",
    "shutdown_timeout": "serve_shutdown_timeout",
    "api_key": "creds_api_key_env",
    "hf_token": "creds_hf_token_env",
    "model": "serve_recipe",
    "help": "nothing (vllm serve would print its help and exit)",
    "config": "the flags themselves (a file of arguments would pass these checks unread)",
}
# What the recipe's selection decides because the deploy plans with it: the devices a server
# takes, what the release installs and which models are fetched
SELECTION_FLAGS = {
    "tensor_parallel_size": "the devices a server takes",
    "pipeline_parallel_size": "the devices a server takes",
    "data_parallel_size": "the devices a server takes",
    "data_parallel_size_local": "the devices a server takes",
    "nnodes": "the hosts a server spans",
    "node_rank": "the hosts a server spans",
    "speculative_config": "the draft model fetched and the packages installed",
    "kv_transfer_config": "the packages installed",
}
# Variables the deploy sets itself on every platform (or a secret's), and the data key that
# says it; a platform's own (its devices, a compile-only start) its kind names (``deploy_env``)
DEPLOY_ENV = {
    "VLLM_CACHE_ROOT": "serve_cache_root",
    "HOME": "serve_home",
    "HF_HOME": "models_hf_home",
    "HF_HUB_OFFLINE": "nothing (the servers never reach the hub)",
    "SERVEFLEET_UNIT": "nothing (the unit's own hash)",
    "SERVEFLEET_OPEN_PATHS": "serve_open_paths",
    "VLLM_API_KEY": "creds_api_key_env",
    "HF_TOKEN": "creds_hf_token_env",
    "HUGGING_FACE_HUB_TOKEN": "creds_hf_token_env",
}


@dataclass(frozen=True)
class Flag:
    """One argparse action of ``vllm serve``.

    + dest: what it sets (every spelling of it sets the same)
    + spelling: its first spelling (``--tensor-parallel-size``), for messages
    + values: ``none`` (a switch), ``one``, ``optional`` (``nargs="?"``) or ``some`` (``+``)
    + choices: the values it accepts, or None for any
    + type: the value parser's name in the dump (``int``, ``_optional_type(loads)``, ...)
    """

    dest: str
    spelling: str
    values: str
    choices: tuple[str, ...] | None
    type: str | None


@dataclass(frozen=True)
class Table:
    """A platform's ``vllm serve``: every spelling of every flag, and the ``VLLM_*`` variables."""

    name: str
    flags: Mapping[str, Flag]
    envs: frozenset[str]

    @property
    def shown(self) -> str:
        return reference().tables[self.name].shown


def _values(entry: Mapping[str, object]) -> str:
    if entry["action"] in _NO_VALUE:
        return "none"
    return {"?": "optional", "+": "some", "*": "some"}.get(str(entry["nargs"]), "one")


@functools.cache
def table(name: str) -> Table:
    """A flag table by name (``rbln`` or ``upstream``: a kind's ``flag_table``)."""
    ref = reference()
    files = ref.tables[name]
    dump = json.loads(files.flags.read_text(encoding="utf-8"))
    flags: dict[str, Flag] = {}
    for entry in dump["flags"]:
        raw = entry["choices"]
        choices = tuple(str(c) for c in raw) if isinstance(raw, list) else None
        spelling = next((f for f in entry["flags"] if f.startswith("--")), entry["flags"][0])
        flag = Flag(entry["dest"], spelling, _values(entry), choices, entry["type"])
        for each in entry["flags"]:
            flags[each] = flag
    envs = json.loads(ref.envs.read_text(encoding="utf-8"))
    known = [var for group in files.env_groups for var in envs[group]]
    return Table(name, flags, frozenset(known))


# ---------------------------------------------------------------------------------------------
# Reading argv as vLLM does


def spelled(token: str) -> tuple[str, str | None, str | None]:
    """A flag token as vLLM reads it: (its spelling, a dotted sub-key or None, an ``=`` value or
    None). ``--max_num_seqs=8`` -> (``--max-num-seqs``, None, ``8``); ``-cc.mode=3`` -> (``-cc``,
    ``mode``, ``3``)."""
    name, eq, value = token.partition("=")
    head, dot, sub = name.partition(".")
    if head.startswith("--"):
        head = "--" + head[2:].replace("_", "-")
    return head, (sub if dot else None), (value if eq else None)


@dataclass(frozen=True)
class Unit:
    """A flag and the values that follow it (or a token that is no flag: ``dest`` None)."""

    dest: str | None
    tokens: tuple[str, ...]

    @property
    def shown(self) -> str:
        return " ".join(self.tokens)


def _taken(tokens: Sequence[str], i: int, values: str, inline: bool) -> int:
    """How many tokens after ``tokens[i]`` are its values."""
    if inline or values == "none":
        return 0
    n = 0
    while i + 1 + n < len(tokens) and not is_flag(tokens[i + 1 + n]):
        n += 1
        if values in ("one", "optional"):
            break
    return n


def units(argv: Sequence[str], tab: Table) -> list[Unit]:
    """A server's argv as units, each flag with its values (a flag the table does not know takes
    the next token that is not a flag, as the recipes site reads it)."""
    out: list[Unit] = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        if not is_flag(tok):
            out.append(Unit(None, (tok,)))
            i += 1
            continue
        name, sub, value = spelled(tok)
        flag = tab.flags.get(name)
        dest = flag.dest if flag else f"?{name}"
        values = "one" if flag is None or sub is not None else flag.values
        n = _taken(argv, i, values, value is not None)
        out.append(Unit(dest, tuple(argv[i : i + 1 + n])))
        i += 1 + n
    return out


def _unknown(key: str, name: str, tab: Table) -> DataError:
    spellings = [s for s in tab.flags if s.startswith("--")]
    close = difflib.get_close_matches(name, spellings, n=1)
    hint = f"did you mean {close[0]}?" if close else f"allowed: a flag of vllm serve ({tab.shown})"
    return DataError(f"{key}: {name} is not a flag of vllm serve ({tab.shown}); {hint}")


def _check_value(key: str, flag: Flag, name: str, value: str) -> None:
    """A value the flag's choices and (int, float) parser accept, as argparse would."""
    if flag.choices is not None and value not in flag.choices:
        raise DataError(
            f"{key}: {name} {value!r} is not one of its choices; allowed: {', '.join(flag.choices)}"
        )
    kind = flag.type or ""
    if kind.startswith("_optional_type("):
        if value in ("", "None"):  # vLLM's optional_type: None
            return
        kind = kind.removeprefix("_optional_type(").removesuffix(")")
    what = {"int": "an int", "float": "a number"}.get(kind)
    if what is None:
        return
    try:
        int(value) if kind == "int" else float(value)
    except ValueError:
        raise DataError(
            f"{key}: {name} {value!r} is not {what}; allowed: {name} with {what}"
        ) from None


def extra_units(key: str, args: Sequence[str], tab: Table) -> list[Unit]:
    """The data's extra arguments as units, every flag known to ``tab`` with the values it
    takes, none the deploy or the selection decides; DataError (one line naming ``key``) else.

    + key: the data key, for messages (``serve_extra_args``)
    + args: its tokens
    + tab: the platform's table
    """
    out: list[Unit] = []
    i = 0
    while i < len(args):
        tok = args[i]
        if not is_flag(tok):
            raise DataError(
                f"{key}: {tok!r} follows no flag that takes a value; allowed: flags of vllm "
                f"serve ({tab.shown}), each followed by its value"
            )
        name, sub, value = spelled(tok)
        flag = tab.flags.get(name)
        if flag is None:
            raise _unknown(key, name, tab)
        refuse_decided(key, flag, name)
        if sub is not None and not any(t in (flag.type or "") for t in _OBJECT_TYPES):
            raise DataError(
                f"{key}: {name} takes no sub-keys ({tok}); allowed: sub-keys of a flag that "
                "takes a JSON object (--compilation-config.mode 3)"
            )
        values = "one" if sub is not None else flag.values
        n = _taken(args, i, values, value is not None)
        given = [value] if value is not None else list(args[i + 1 : i + 1 + n])
        if values == "none" and value is not None:
            raise DataError(f"{key}: {name} takes no value (got {value!r}); allowed: {name} alone")
        if values in ("one", "some") and not given:
            raise DataError(f"{key}: {name} needs a value; allowed: {name} VALUE")
        if sub is None:
            for v in given:
                _check_value(key, flag, name, v)
        out.append(Unit(flag.dest, tuple(args[i : i + 1 + n])))
        i += 1 + n
    return out


def refuse_decided(key: str, flag: Flag, name: str) -> None:
    """A flag the deploy sets itself, or one the recipe's selection must decide, is refused."""
    if flag.dest in DEPLOY_FLAGS:
        raise DataError(
            f"{key}: {name} is set by the deploy; allowed: set {DEPLOY_FLAGS[flag.dest]} instead"
        )
    if flag.dest in SELECTION_FLAGS:
        raise DataError(
            f"{key}: {name} decides {SELECTION_FLAGS[flag.dest]}, which the deploy plans from "
            "the recipe; allowed: choose it with serve_selection, serve_features or the recipe"
        )


def check_env(
    key: str, env: Mapping[str, str], tab: Table, platform_env: Mapping[str, str]
) -> None:
    """Extra variables: none the deploy sets itself (:data:`DEPLOY_ENV`, and ``platform_env``:
    the kinds' own, ``Kind.deploy_env``), and every ``VLLM_*`` one vLLM knows."""
    decided = {**DEPLOY_ENV, **platform_env}
    for name in env:
        if name in decided:
            raise DataError(
                f"{key}: {name} is set by the deploy; allowed: set {decided[name]} instead"
            )
        if name.startswith("VLLM_") and name not in tab.envs:
            close = difflib.get_close_matches(name, sorted(tab.envs), n=1)
            hint = (
                f"did you mean {close[0]}?"
                if close
                else f"allowed: a VLLM_* variable of {tab.shown}, or any other name"
            )
            raise DataError(f"{key}: {name} is not a variable {tab.shown} knows; {hint}")


def override_dests(key: str, names: Sequence[str], tab: Table) -> tuple[set[str], set[str]]:
    """The flags (by dest) and variables ``serve_override_args`` names."""
    dests: set[str] = set()
    envs: set[str] = set()
    for name in names:
        if not name.startswith("-"):
            envs.add(name)
            continue
        spelling = spelled(name)[0]
        flag = tab.flags.get(spelling)
        if flag is None:
            raise _unknown(key, spelling, tab)
        dests.add(flag.dest)
    return dests, envs


def merge(
    argv: Sequence[str],
    env: Mapping[str, str],
    extra_args: Sequence[str],
    extra_env: Mapping[str, str],
    override: Sequence[str],
    tab: Table,
    platform_env: Mapping[str, str],
) -> tuple[list[str], dict[str, str]]:
    """A server's argv and env with the data's extras appended: a flag or variable the recipe
    sets already is refused unless ``override`` names it, and then the extra replaces it (every
    spelling and sub-key of the recipe's is dropped). DataError (one line) names the key.

    + argv, env: the resolved server's
    + extra_args, extra_env, override: serve_extra_args, serve_extra_env, serve_override_args
    + tab: the table of the host's platform
    + platform_env: the variables a platform's deploy sets itself (:func:`check_env`)
    """
    extra = extra_units("serve_extra_args", extra_args, tab)
    check_env("serve_extra_env", extra_env, tab, platform_env)
    dests, envs = override_dests("serve_override_args", override, tab)
    given = {u.dest for u in extra}
    for name in override:
        named = spelled(name)[0] if name.startswith("-") else name
        wanted = tab.flags[named].dest in given if name.startswith("-") else name in extra_env
        if not wanted:
            where = "serve_extra_args" if name.startswith("-") else "serve_extra_env"
            raise DataError(
                f"serve_override_args: {name} is not in {where}; allowed: flags of "
                "serve_extra_args and variables of serve_extra_env that replace the recipe's"
            )
    recipe = units(argv, tab)
    for unit in extra:
        if unit.dest in dests:
            continue
        clash = next((u for u in recipe if u.dest == unit.dest), None)
        if clash is not None:
            raise DataError(
                f"serve_extra_args: {unit.tokens[0]} is set by the recipe already "
                f"({clash.shown}); allowed: add {spelled(unit.tokens[0])[0]} to "
                "serve_override_args to replace the recipe's value"
            )
    for name in extra_env:
        if name in env and name not in envs:
            raise DataError(
                f"serve_extra_env: {name} is set by the recipe already ({name}={env[name]}); "
                f"allowed: add {name} to serve_override_args to replace the recipe's value"
            )
    kept = [tok for u in recipe if u.dest not in dests for tok in u.tokens]
    return [*kept, *(tok for u in extra for tok in u.tokens)], {**env, **extra_env}
