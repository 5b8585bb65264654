"""Parallel sizing of a server's final arguments: an explicit ``--tp`` written into the
strategy's parallel flag, and the GPUs the server takes (tensor x data x pipeline parallel size),
checked against the host's GPUs (CPU hardware is not capped).
"""

from __future__ import annotations

from servefleet.base.errors import RecipeError
from servefleet.base.vllm_args import flag_name, is_flag
from servefleet.kinds.vllm.hardware import generation
from servefleet.kinds.vllm.recipe import VllmRecipe

# Flags whose values multiply into the GPUs one server takes (aliases as vLLM spells them).
_PARALLEL = {
    "--tensor-parallel-size": "tp",
    "-tp": "tp",
    "--data-parallel-size": "dp",
    "-dp": "dp",
    "--pipeline-parallel-size": "pp",
    "-pp": "pp",
}


def _canonical(tok: str) -> str:
    name = flag_name(tok)
    return "--" + name[2:].replace("_", "-") if name.startswith("--") else name


def _parallel_values(args: list[str]) -> dict[str, tuple[str, str]]:
    """The last value of each parallel size flag: kind -> (flag as written, value)."""
    out: dict[str, tuple[str, str]] = {}
    for i, tok in enumerate(args):
        kind = _PARALLEL.get(_canonical(tok)) if is_flag(tok) else None
        if kind is None:
            continue
        if "=" in tok:
            out[kind] = (flag_name(tok), tok.split("=", 1)[1])
        elif i + 1 < len(args) and not is_flag(args[i + 1]):
            out[kind] = (tok, args[i + 1])
    return out


def with_size(args: list[str], flag: str | None, tp: int | None) -> list[str]:
    """The arguments with an explicit ``--tp`` as the strategy's parallel flag's value, wherever
    a layer left that flag (added at the end when no layer names it)."""
    if tp is None:
        return args
    flag = flag or "--tensor-parallel-size"
    kind = _PARALLEL.get(_canonical(flag))
    out, found = [], False
    i = 0
    while i < len(args):
        tok = args[i]
        same = is_flag(tok) and (
            _canonical(tok) == _canonical(flag) or (kind and _PARALLEL.get(_canonical(tok)) == kind)
        )
        if same and "=" in tok:
            out.append(f"{flag_name(tok)}={tp}")
            found = True
        elif same and i + 1 < len(args) and not is_flag(args[i + 1]):
            out += [tok, str(tp)]
            found = True
            i += 1
        else:
            out.append(tok)
        i += 1
    return out if found else [*out, flag, str(tp)]


def devices(r: VllmRecipe, gpu: str, args: list[str]) -> int:
    """GPUs the server takes: tensor x data x pipeline parallel size of its final arguments."""
    total = 1
    for flag, value in _parallel_values(args).values():
        try:
            n = int(value)
        except ValueError:
            raise RecipeError(
                f"{r.name}: {flag} {value!r} on {gpu} is not a whole number of GPUs"
            ) from None
        if n < 1:
            raise RecipeError(f"{r.name}: {flag} {value} on {gpu} is not a positive GPU count")
        total *= n
    count = int(r.profiles[gpu]["gpu_count"])
    # A CPU profile's gpu_count is no physical limit (the site does not cap its TP either).
    if total > count and generation(r.profiles[gpu]) != "cpu":
        sizes = " x ".join(f"{f} {v}" for f, v in _parallel_values(args).values())
        raise RecipeError(
            f"{r.name}: the command asks for {total} GPUs ({sizes}) but {gpu} has {count}"
        )
    return total
