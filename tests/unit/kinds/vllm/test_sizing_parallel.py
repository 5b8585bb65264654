"""Parallel sizing of a server's final arguments (``sizing.py``), called directly: an explicit
``--tp`` written into the parallel flag wherever a layer left it (its aliases and spellings),
the GPUs a server takes (tensor x data x pipeline parallel size, the last value of each), a
multi-node rank's share on its node, and each refusal's whole line; CPU hardware is not capped.
The mutation campaign (#37) found these held only through whole resolves.
"""

from __future__ import annotations

import pytest
from repo_paths import RECIPES

from servefleet.base.errors import RecipeError
from servefleet.kinds.vllm import load_vllm_recipe
from servefleet.kinds.vllm.sizing import devices, rank_devices, with_size

# h200: 8 GPUs a node; xeon6: a CPU (generation cpu, gpu_count 4: no physical limit)
R = load_vllm_recipe(RECIPES / "no-strategies.yaml")
N = R.name
TP = "--tensor-parallel-size"


def _refused(fn: object, *args: object) -> str:
    with pytest.raises(RecipeError) as err:
        fn(*args)  # type: ignore[operator]
    msg = str(err.value)
    assert "\n" not in msg
    return msg


# ---------------------------------------------------------------------------------------------
# with_size: an explicit --tp


def test_no_tp_leaves_the_arguments() -> None:
    args = ["--max-model-len", "8192", TP, "8"]
    assert with_size(args, "--pipeline-parallel-size", None) is args


def test_tp_is_added_as_the_tensor_parallel_size_when_no_layer_names_it() -> None:
    assert with_size(["--max-model-len", "8192"], None, 4) == ["--max-model-len", "8192", TP, "4"]
    assert with_size([], "", 2) == [TP, "2"]
    # a flag without its value is no size: the size is added after it
    assert with_size([TP, "--enforce-eager"], None, 4) == [TP, "--enforce-eager", TP, "4"]
    assert with_size(["--enforce-eager", TP], None, 4) == ["--enforce-eager", TP, TP, "4"]


def test_tp_replaces_every_value_of_the_flag_where_it_stands() -> None:
    args = [TP, "8", "--max-model-len", "8192", f"{TP}=2", "--port", "1"]
    assert with_size(args, None, 4) == [
        TP,
        "4",
        "--max-model-len",
        "8192",
        f"{TP}=4",
        "--port",
        "1",
    ]
    # the alias and the underscore spelling are the same flag, kept as written
    assert with_size(["-tp", "8"], TP, 2) == ["-tp", "2"]
    assert with_size(["--tensor_parallel_size", "8"], None, 2) == ["--tensor_parallel_size", "2"]
    assert with_size(["--tensor_parallel_size=8"], None, 2) == ["--tensor_parallel_size=2"]
    assert with_size(["-tp=8"], "--tensor-parallel-size", 2) == ["-tp=2"]


def test_tp_goes_to_the_strategys_own_parallel_flag() -> None:
    args = [TP, "8", "-pp", "2"]
    assert with_size(args, "--pipeline-parallel-size", 4) == [TP, "8", "-pp", "4"]
    assert with_size([TP, "8"], "--pipeline_parallel_size", 4) == [
        TP,
        "8",
        "--pipeline_parallel_size",
        "4",
    ]
    # a flag that sizes nothing is matched by its name only
    assert with_size(["--other", "1", TP, "8"], "--other", 3) == ["--other", "3", TP, "8"]
    assert with_size([TP, "8"], "--other", 3) == [TP, "8", "--other", "3"]


# ---------------------------------------------------------------------------------------------
# devices: the GPUs one server takes


def test_devices_multiply_the_last_value_of_each_parallel_size() -> None:
    assert devices(R, "h200", ["--max-model-len", "8192"]) == 1
    assert devices(R, "h200", [TP, "2", "-dp", "2", "--pipeline_parallel_size=2"]) == 8
    assert devices(R, "h200", [TP, "8", "-tp", "2", "--data-parallel-size=3"]) == 6
    # a size flag without its value counts nothing
    assert devices(R, "h200", [TP, "--enforce-eager"]) == 1
    assert devices(R, "h200", ["-pp", "3", TP]) == 3


def test_devices_are_capped_by_the_node_but_not_on_a_cpu() -> None:
    assert devices(R, "h200", [TP, "8"]) == 8
    assert _refused(devices, R, "h200", [TP, "2", "-dp", "2", "--pipeline_parallel_size=4"]) == (
        f"{N}: the command asks for 16 GPUs ({TP} 2 x -dp 2 x --pipeline_parallel_size 4) but "
        "h200 has 8"
    )
    assert _refused(devices, R, "h200", [TP, "9"]) == (
        f"{N}: the command asks for 9 GPUs ({TP} 9) but h200 has 8"
    )
    assert devices(R, "xeon6", [TP, "64"]) == 64


def test_a_size_that_is_not_a_gpu_count_is_refused() -> None:
    assert _refused(devices, R, "h200", [TP, "two"]) == (
        f"{N}: {TP} 'two' on h200 is not a whole number of GPUs"
    )
    assert _refused(devices, R, "h200", ["-dp=1.5"]) == (
        f"{N}: -dp '1.5' on h200 is not a whole number of GPUs"
    )
    assert _refused(devices, R, "h200", [TP, "0"]) == (
        f"{N}: {TP} 0 on h200 is not a positive GPU count"
    )
    assert _refused(devices, R, "h200", ["-pp", "-2"]) == (
        f"{N}: -pp -2 on h200 is not a positive GPU count"
    )
    assert devices(R, "h200", [TP, "1"]) == 1
    # the value is everything after the first "="
    assert _refused(devices, R, "h200", [f"{TP}=4=2"]) == (
        f"{N}: {TP} '4=2' on h200 is not a whole number of GPUs"
    )
    assert _refused(rank_devices, R, "h200", ["-pp", "x", "-dpl", "1"], 1, 0) == (
        f"{N}: -pp 'x' on h200 is not a whole number of GPUs"
    )


# ---------------------------------------------------------------------------------------------
# rank_devices: one rank's share of a multi-node group


def test_a_rank_with_local_data_parallel_ranks_takes_them_times_tp_and_pp() -> None:
    args = ["--data-parallel-size", "16", "--data-parallel-size-local", "8"]
    assert rank_devices(R, "h200", args, 2, 1) == 8
    assert rank_devices(R, "h200", [TP, "2", "-dp", "8", "-dpl", "4"], 2, 0) == 8
    assert rank_devices(R, "h200", ["-pp", "2", "-dp", "6", "-dpl", "3"], 2, 1) == 6
    # no data-parallel size: one rank in all
    assert rank_devices(R, "h200", ["-dpl", "1"], 1, 0) == 1


def test_local_ranks_that_do_not_add_up_are_refused() -> None:
    args = [TP, "2", "--data-parallel-size", "16", "--data-parallel-size-local", "8"]
    assert _refused(rank_devices, R, "h200", args, 3, 0) == (
        f"{N}: {TP} 2 x --data-parallel-size 16 asks for 16 data-parallel ranks but 3 nodes of "
        "--data-parallel-size-local 8 start 24; allowed: a data-parallel size of nodes x local "
        "ranks"
    )
    # no data-parallel size: one rank, named as the default
    assert _refused(rank_devices, R, "h200", ["-dpl", "2"], 2, 0) == (
        f"{N}: the default data-parallel size asks for 1 data-parallel ranks but 2 nodes of "
        "-dpl 2 start 4; allowed: a data-parallel size of nodes x local ranks"
    )
    assert _refused(rank_devices, R, "h200", ["-dpl", "x"], 2, 0) == (
        f"{N}: -dpl 'x' on h200 is not a whole number of GPUs"
    )


def test_a_rank_over_its_node_is_refused_by_its_number() -> None:
    args = [TP, "2", "-dp", "16", "-dpl", "8"]
    assert _refused(rank_devices, R, "h200", args, 2, 1) == (
        f"{N}: rank 1 asks for 16 GPUs of its node ({TP} 2 x -dp 16; -dpl 8 on each node) but "
        "h200 has 8"
    )
    assert rank_devices(R, "xeon6", args, 2, 1) == 16


def test_a_rank_without_local_ranks_takes_an_even_share() -> None:
    assert rank_devices(R, "h200", [TP, "8", "-pp", "2"], 2, 0) == 8
    assert rank_devices(R, "h200", [TP, "4", "--data-parallel-size", "4"], 2, 1) == 8
    assert _refused(rank_devices, R, "h200", [TP, "12"], 5, 0) == (
        f"{N}: the command spans 12 GPUs ({TP} 12), which 5 nodes cannot share evenly; allowed: "
        "a node count dividing 12"
    )
    assert _refused(rank_devices, R, "h200", [TP, "32"], 2, 3) == (
        f"{N}: rank 3 asks for 16 GPUs of its node ({TP} 32 over 2 nodes) but h200 has 8"
    )
    per = rank_devices(R, "h200", [TP, "16"], 2, 0)
    assert per == 8 and type(per) is int
    assert rank_devices(R, "xeon6", [TP, "32"], 2, 0) == 16
