"""Parallel sizing of a server's final arguments: an explicit ``--tp`` written into the
strategy's parallel flag, and the GPUs the server takes (tensor x data x pipeline parallel size;
a multi-node rank: its share on its node), checked against the host's GPUs (CPU hardware is not
capped).
"""

from __future__ import annotations

import math

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
# A node's data-parallel ranks in a group spanning nodes (not a factor of one server's GPUs).
_LOCAL = {"--data-parallel-size-local": "dp_local", "-dpl": "dp_local"}


def _canonical(tok: str) -> str:
    name = flag_name(tok)
    return "--" + name[2:].replace("_", "-") if name.startswith("--") else name


def _parallel_values(
    args: list[str], table: dict[str, str] | None = None
) -> dict[str, tuple[str, str]]:
    """The last value of each parallel size flag (of ``table``, default :data:`_PARALLEL`):
    kind -> (flag as written, value)."""
    table = _PARALLEL if table is None else table
    out: dict[str, tuple[str, str]] = {}
    for i, tok in enumerate(args):
        kind = table.get(_canonical(tok)) if is_flag(tok) else None
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


def _count(r: VllmRecipe, gpu: str, flag: str, value: str) -> int:
    """A parallel size flag's value as a positive whole number."""
    try:
        n = int(value)
    except ValueError:
        raise RecipeError(
            f"{r.name}: {flag} {value!r} on {gpu} is not a whole number of GPUs"
        ) from None
    if n < 1:
        raise RecipeError(f"{r.name}: {flag} {value} on {gpu} is not a positive GPU count")
    return n


def _sizes(r: VllmRecipe, gpu: str, args: list[str]) -> tuple[dict[str, int], str]:
    """Each parallel size of the final arguments (tp, dp, pp) and how they are written."""
    values = _parallel_values(args)
    sizes = {kind: _count(r, gpu, flag, value) for kind, (flag, value) in values.items()}
    return sizes, " x ".join(f"{f} {v}" for f, v in values.values())


def _capped(r: VllmRecipe, gpu: str) -> int | None:
    """The GPUs one node has, or None on CPU hardware (its ``gpu_count`` is no physical limit:
    the site does not cap its TP either)."""
    return None if generation(r.profiles[gpu]) == "cpu" else int(r.profiles[gpu]["gpu_count"])


def devices(r: VllmRecipe, gpu: str, args: list[str]) -> int:
    """GPUs the server takes: tensor x data x pipeline parallel size of its final arguments."""
    sizes, shown = _sizes(r, gpu, args)
    total = math.prod(sizes.values())
    count = _capped(r, gpu)
    if count is not None and total > count:
        raise RecipeError(
            f"{r.name}: the command asks for {total} GPUs ({shown}) but {gpu} has {count}"
        )
    return total


def rank_devices(r: VllmRecipe, gpu: str, args: list[str], nodes: int, rank: int) -> int:
    """GPUs one rank of a multi-node group takes on its node: tensor x pipeline parallel size x
    its data-parallel ranks here (``--data-parallel-size-local``; the data-parallel size must be
    the nodes' local ranks together), else the group's tensor x data x pipeline parallel size
    shared evenly by its nodes.

    + r: the recipe
    + gpu: the GPU id
    + args: the rank's final arguments
    + nodes: the group's node count
    + rank: the rank
    """
    sizes, shown = _sizes(r, gpu, args)
    local = _parallel_values(args, _LOCAL).get("dp_local")
    if local is not None:
        here = _count(r, gpu, *local)
        ranks = sizes.get("dp", 1)
        if ranks != here * nodes:  # vLLM waits for data-parallel ranks no node starts
            raise RecipeError(
                f"{r.name}: {shown or 'the default data-parallel size'} asks for {ranks} "
                f"data-parallel ranks but {nodes} nodes of "
                f"{local[0]} {here} start {here * nodes}; allowed: a data-parallel size of "
                "nodes x local ranks"
            )
        per = sizes.get("tp", 1) * sizes.get("pp", 1) * here
        shown = f"{shown}; {local[0]} {here} on each node"
    else:
        world = math.prod(sizes.values())
        if world % nodes:
            raise RecipeError(
                f"{r.name}: the command spans {world} GPUs ({shown}), which {nodes} nodes "
                f"cannot share evenly; allowed: a node count dividing {world}"
            )
        per = world // nodes
        shown = f"{shown} over {nodes} nodes"
    count = _capped(r, gpu)
    if count is not None and per > count:
        raise RecipeError(
            f"{r.name}: rank {rank} asks for {per} GPUs of its node ({shown}) but {gpu} has {count}"
        )
    return per
