"""The simulated CUDA ``vllm serve`` across nodes (src/servefleet/fleet/lab/simulator/packages/vllm/:
parallel_plan.py, rendezvous.py, group_head.py): vLLM 0.30.0's derivation of node and data
parallel ranks and its refusals, and the group's rendezvous for real over TCP on 127.0.0.1, each
rank a ``vllm serve`` process with a simulated GPU host root of its own (as test_lab_gpu.py and
test_sim_pd.py start them, without the lab). Every process is killed at the end of its test;
waits are on conditions with deadlines. Where the real-wheel tier is built (tests/realvllm/
build.py), the refusals' words and the parallel config's hash factors are read from the wheel."""

from __future__ import annotations

import argparse
import ast
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from http import client as httpc
from pathlib import Path
from typing import Any

import pytest
from lab_sim_support import REPO, SIMULATOR, free_port, http
from sim_fixtures import MODEL, gpu_root

from servefleet.base.vllm_reference import reference

sys.path.insert(0, str(REPO / "tests" / "realvllm"))
import build as realvllm  # noqa: E402  (the real-wheel tier's venvs)

PACKAGE = SIMULATOR / "packages" / "vllm"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}


# ---------------------------------------------------------------------------------------------
# Where a server stands: vLLM's derivation and refusals (no process)


@pytest.fixture(scope="module")
def plan_mod(sim: Any) -> Any:
    return sys.modules[sim.__name__.rsplit(".", 1)[0] + ".parallel_plan"]


def plan(sim: Any, plan_mod: Any, *args: str) -> Any:
    ns = sim.parse_serve_args([MODEL, *args], "upstream")
    plan_mod.check_serve_modes(ns)
    return plan_mod.plan_of(ns)


def refusal(sim: Any, plan_mod: Any, *args: str) -> str:
    with pytest.raises(sim.SimError) as exc:
        plan(sim, plan_mod, *args)
    return str(exc.value)


TP = ["--tensor-parallel-size", "16", "--nnodes", "2", "--master-addr", "10.0.0.1"]
DEP = ["--enable-expert-parallel", "--data-parallel-hybrid-lb", "--data-parallel-size", "16",
       "--data-parallel-size-local", "8", "--data-parallel-address", "10.0.0.1"]  # fmt: skip


def test_tp_and_pp_across_nodes(sim: Any, plan_mod: Any) -> None:
    head = plan(sim, plan_mod, *TP, "--node-rank", "0")
    assert (head.group, head.head, head.address) == ("nodes", True, ("10.0.0.1", 29501))
    assert (head.local_world, head.dp_local, head.dp_rank, head.timeout) == (8, 1, 0, 600)
    worker = plan(sim, plan_mod, *TP, "--node-rank", "1", "--headless")
    assert (worker.group, worker.head, worker.node_rank_within_dp, worker.local_world) == (
        "nodes", False, 1, 8,
    )  # fmt: skip
    pp = plan(sim, plan_mod, "-tp", "8", "-pp", "2", "-n", "2", "-r", "1", "--headless",
              "--master-port", "30000", "--distributed-timeout-seconds", "9")  # fmt: skip
    assert (pp.address, pp.local_world, pp.timeout) == (("127.0.0.1", 30000), 8, 9)
    alone = plan(sim, plan_mod, "-tp", "8")
    assert (alone.group, alone.local_world, alone.dp_local) == (None, 8, 1)


def test_dp_ranks_across_nodes(sim: Any, plan_mod: Any) -> None:
    head = plan(sim, plan_mod, *DEP)
    assert (head.group, head.head, head.hybrid, head.dp_ranks) == ("dp", True, True, (0, 8))
    assert head.address == ("10.0.0.1", 29550) and not head.remote_headless
    worker = plan(sim, plan_mod, *DEP, "--data-parallel-start-rank", "8")
    assert (worker.group, worker.head, worker.hybrid, worker.dp_ranks) == ("dp", False, True, (8, 16))  # fmt: skip
    # --data-parallel-start-rank without --headless infers hybrid, which a local size of 1
    # turns into external LB (vLLM's warning); the head of that command is internal LB
    base = ["-tp", "8", "-dp", "2", "--data-parallel-size-local", "1", "-dpa", "10.0.0.1"]
    tp_dp_head = plan(sim, plan_mod, *base)
    assert (tp_dp_head.hybrid, tp_dp_head.external, tp_dp_head.remote_headless) == (False, False, True)  # fmt: skip
    tp_dp_worker = plan(sim, plan_mod, *base, "--data-parallel-start-rank", "1")
    assert (tp_dp_worker.external, tp_dp_worker.dp_ranks, tp_dp_worker.headless) == (True, (1, 2), False)  # fmt: skip
    headless = plan(sim, plan_mod, "-dp", "4", "-dpl", "2", "-dpr", "2", "--headless", "-dpp", "13345")  # fmt: skip
    assert (headless.group, headless.head, headless.hybrid, headless.address) == (
        "dp", False, False, ("127.0.0.1", 13345),
    )  # fmt: skip
    # with --nnodes the DP rank and local size come from the node rank
    nodes = plan(sim, plan_mod, "-dp", "2", "-tp", "8", "-n", "2", "-r", "1", "--headless")
    assert (nodes.dp_rank, nodes.dp_local, nodes.nnodes_within_dp, nodes.node_rank_within_dp) == (1, 1, 1, 0)  # fmt: skip
    span = plan(sim, plan_mod, "-dp", "2", "-tp", "16", "-n", "4", "-r", "3", "--headless")
    assert (span.dp_rank, span.nnodes_within_dp, span.node_rank_within_dp, span.local_world) == (1, 2, 1, 8)  # fmt: skip


@pytest.mark.parametrize(("args", "message"), [
    ([*TP, "--node-rank", "2"],
     "ValueError: Invalid data-parallel launch options: `--node-rank` must be between 0 and 1; "
     "got `--node-rank 2`. Set it to this node's zero-based index."),
    (["-tp", "3", "--nnodes", "2"],
     "`--nnodes 2` must evenly divide the total world size (3)."),
    (["--nnodes", "2", "--data-parallel-backend", "ray"],
     "`--nnodes 2` requires `--data-parallel-backend mp`; got `--data-parallel-backend ray`."),
    (["-tp", "2", "--nnodes", "2", "--distributed-executor-backend", "ray"],
     "Value error, nnodes > 1 can only be set when distributed executor backend is mp, uni or "
     "external_launcher."),
    (["--node-rank", "-1"], "node_rank Input should be greater than or equal to 0"),
    (["--nnodes", "0"], "nnodes Input should be greater than or equal to 1"),
    (["--headless", "--api-server-count", "2"],
     "ValueError: --api-server-count=2 cannot be used with --headless (no API servers are "
     "started in headless mode)."),
    (["-dp", "2", "--data-parallel-rank", "1", "--data-parallel-start-rank", "1"],
     "ValueError: Cannot use more than one data parallel load balancing mode."),
    (["--headless", "--data-parallel-hybrid-lb", "-dpl", "1"],
     "AssertionError: data_parallel_hybrid_lb is not applicable in headless mode"),
    (["-dp", "2", "--data-parallel-hybrid-lb"],
     "`--data-parallel-hybrid-lb` requires `--data-parallel-size-local`."),
    (["-dp", "2", "--data-parallel-external-lb"],
     "`--data-parallel-external-lb` requires a data-parallel rank."),
    (["-dp", "2", "--data-parallel-rank", "1", "-dpl", "2"],
     "an external data-parallel rank requires `--data-parallel-size-local 1`; got 2."),
    (["-dp", "4", "-dpl", "2", "-dpr", "4"],
     "Value error, data_parallel_rank (4) must be in the range [0, 4)"),
    (["--headless", "-dpl", "0"], "ValueError: data_parallel_size_local must be > 0 in headless mode"),
    (["-dp", "2", "-tp", "8", "-n", "2", "-r", "1"],
     "AssertionError"),  # internal DP LB on DP rank 1, two API servers: run_multi_api_server's assert
    (["-dp", "2", "-tp", "8", "-n", "2", "-r", "1", "--api-server-count", "1"],
     "Attempting to launch core_engines from dp_rank > 0, but found internal DPLB"),
    (["--enable-fault-tolerance"], "Fault tolerance requires external load balancer mode"),
])  # fmt: skip
def test_refusals_in_vllms_words(sim: Any, plan_mod: Any, args: list[str], message: str) -> None:
    assert message in refusal(sim, plan_mod, *args)


def test_the_arguments_a_group_agrees_on(sim: Any, plan_mod: Any) -> None:
    def args(*extra: str) -> dict[str, Any]:
        ns = sim.parse_serve_args([MODEL, *TP, *extra], "upstream")
        return dict(plan_mod.group_args(ns))

    head = args("--node-rank", "0", "--port", "8000", "--served-model-name", "x")
    # what is the node's own does not count
    assert args("--node-rank", "1", "--headless", "--host", "10.0.0.2") == head
    assert args("--distributed-executor-backend", "mp") == head
    other = args("--max-model-len", "4096", "--dtype", "float16", "--revision", "abc")
    flags = {"max_model_len": "--max-model-len", "dtype": "--dtype"}
    assert plan_mod.differences(head, other, flags) == [
        ("--dtype", "auto", "float16"), ("--max-model-len", None, 4096), ("revision", None, "abc"),
    ]  # fmt: skip
    assert plan_mod.args_hash(head) != plan_mod.args_hash(other)
    for field in ("model", "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size",
                  "dtype", "max_model_len", "quantization", "enable_expert_parallel", "nnodes"):  # fmt: skip
        assert field in plan_mod.GROUP_FIELDS


# ---------------------------------------------------------------------------------------------
# Held to the real wheel where the real-wheel tier is built

REAL_WORDS = {  # the real wheel's file -> words of its refusals and log lines the simulator uses
    "engine/arg_utils.py": [
        "must evenly divide the total world size",
        "must be between 0 and ",
        ". Set it to this node's zero-based index.",
        "data_parallel_hybrid_lb is not applicable in headless mode",
        "requires a data-parallel rank. Set `--data-parallel-rank`, or set `--data-parallel-size` "
        "greater than 1 and use `--nnodes` with `--node-rank` so the rank can be inferred.",
        "data_parallel_size_local = 1, autoswitch to data_parallel_external_lb.",
        "requires `--data-parallel-size-local`. Set it to the number of data-parallel ranks on "
        "this node.",
        "Use the MP backend or set `--nnodes 1`.",
        "Fault tolerance requires external load balancer mode (--data-parallel-external-lb or "
        "--data-parallel-rank). Internal LB mode is not supported.",
    ],
    "entrypoints/cli/serve.py": [
        "cannot be used with --headless (no API servers are started in headless mode).",
        "Cannot use more than one data parallel load balancing mode. Choose one of: "
        "--data-parallel-multi-port-external-lb, --data-parallel-external-lb (or "
        "--data-parallel-rank), --data-parallel-hybrid-lb (or --data-parallel-start-rank).",
        "data_parallel_size_local must be > 0 in headless mode",
        "Launching vLLM (v",
        ") headless multiproc executor, with head node address ",
        " for torch.distributed process group.",
        " data parallel engine(s) in headless mode, with head node address ",
    ],
    "config/parallel.py": [
        "nnodes > 1 can only be set when distributed executor backend is mp, uni or "
        "external_launcher.",
        ") must be in the range [0, ",
    ],
    "v1/engine/utils.py": [
        "Attempting to launch core_engines from dp_rank > 0, but found internal DPLB, which is "
        "incompatible.",
        "must not use --headless in external or hybrid dp lb mode",
        "must use --headless unless in external or hybrid dp lb mode",
        "Message from engine with unexpected data parallel rank: ",
        "All DP workers must have identical configurations for parameters that affect "
        "collective communication (e.g., enable_eplb, eplb_config.log_balancedness). ",
        "Please ensure all workers are started with the same command-line arguments.",
    ],
    "v1/engine/core.py": ["Did not receive response from front-end process within "],
    "v1/executor/multiproc_executor.py": ["collective_rpc should not be called on follower node"],
    "v1/worker/gpu_worker.py": [" is out of bounds for "],
    "v1/engine/exceptions.py": [
        "EngineCore encountered an issue. See stack trace (above) for the root cause."
    ],
    "v1/engine/core_client.py": [
        "[shutdown] MPClient: engine core exited unexpectedly; starting cleanup"
    ],  # fmt: skip
}


def strings(source: str) -> list[str]:
    """Every string literal of a module, f-strings' literal parts joined around ``{}``."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.append(node.value)
        elif isinstance(node, ast.JoinedStr):
            out.append(
                "{}".join(v.value if isinstance(v, ast.Constant) else "" for v in node.values)
            )
    return out


def real_vllm() -> Path:
    if not realvllm.is_built():
        pytest.skip(
            f"the real-wheel tier is not built ({realvllm.built()}): run tests/realvllm/build.py"
        )
    return next((realvllm.built() / "upstream" / "lib").glob("python3*/site-packages/vllm"))


def test_the_words_are_the_real_wheels() -> None:
    real = real_vllm()
    ours = [s for p in PACKAGE.glob("*.py") for s in strings(p.read_text())]
    for rel, words in REAL_WORDS.items():
        theirs = strings((real / rel).read_text())
        for w in words:
            assert any(w in s for s in theirs), f"{rel} no longer says {w!r}"
            assert any(w in s for s in ours), f"the simulator does not say {w!r}"


def test_the_parallel_hash_and_defaults_are_the_real_wheels(plan_mod: Any) -> None:
    """PARALLEL_HASH_FIELDS: ParallelConfig's fields less compute_hash's ignored factors, those a
    flag sets; the master port, RPC port and handshake timeout: the wheel's."""
    source = (real_vllm() / "config/parallel.py").read_text()
    tree = ast.parse(source)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ParallelConfig")
    fields = [n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]  # fmt: skip
    hash_fn = next(
        n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "compute_hash"
    )
    ignored = next(
        {e.value for e in n.value.elts}  # type: ignore[attr-defined]
        for n in ast.walk(hash_fn)
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "ignored_factors"
    )
    table = json.loads(reference().tables["upstream"].flags.read_text())
    dests = {e["dest"] for e in table["flags"]}
    real = [f for f in fields if f not in ignored and f in dests and f != "world_size"]
    assert list(plan_mod.PARALLEL_HASH_FIELDS) == real
    defaults = {n.target.id: n.value for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}  # fmt: skip
    assert ast.literal_eval(defaults["master_port"]) == plan_mod.MASTER_PORT
    rpc = defaults["data_parallel_rpc_port"]
    assert isinstance(rpc, ast.Call) and ast.literal_eval(rpc.keywords[0].value) == plan_mod.DP_RPC_PORT  # fmt: skip
    core = (real_vllm() / "v1/engine/core.py").read_text()
    assert f"HANDSHAKE_TIMEOUT_MINS = {plan_mod.HANDSHAKE_TIMEOUT // 60}\n" in core
    master = next(e for e in table["flags"] if e["dest"] == "master_port")
    assert master["default"] == plan_mod.MASTER_PORT


# ---------------------------------------------------------------------------------------------
# Groups of simulated servers on 127.0.0.1


class Rank:
    """One ``vllm serve`` of a group, its log in a file."""

    def __init__(self, cmd: list[str], env: dict[str, str], log: Path, port: int | None) -> None:
        self.log_path, self.port = log, port
        with open(log, "w") as fh:
            self.proc = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT)

    def log(self) -> str:
        return self.log_path.read_text()

    def wait_log(self, text: str, timeout: float = 30) -> None:
        wait_for(f"{text!r} in {self.log_path.name}", lambda: text in self.log(), timeout)

    def wait_exit(self, timeout: float = 30) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.log_path.name} still runs:\n{self.log()}") from None

    def health(self) -> int:
        assert self.port is not None
        try:
            return http(self.port, "/health")[0]
        except OSError:
            return 0  # no answer: the server is not (or no longer) listening

    def wait_serving(self, timeout: float = 30) -> None:
        def up() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.log_path.name} exited:\n{self.log()}")
            return self.health() == 200

        wait_for(f"{self.log_path.name} to serve", up, timeout)


def wait_for(what: str, check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def group(gpu_venv: Path, hf_home: Path, tmp_path: Path) -> Iterator[Callable[..., Rank]]:
    """A function starting one rank (a host root of its own, named ``host``); every rank is
    killed at the end."""
    started: list[Rank] = []
    base = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "RBLN_", "HF_"))}
    base.pop("CUDA_VISIBLE_DEVICES", None)

    def start(host: str, *args: str, http_port: bool = True, **extra_env: str) -> Rank:
        root = tmp_path / host
        if not root.exists():
            gpu_root(root)
            (root / "etc/rbln-sim/load-seconds").write_text("0.2\n")
        env = dict(base, RBLN_SIM_ROOT=str(root), HF_HOME=str(hf_home), HF_HUB_OFFLINE="1",
                   PATH=f"{root}/usr/bin:{gpu_venv}/bin:/usr/bin:/bin",
                   VLLM_CACHE_ROOT=str(tmp_path / "cache"), **extra_env)  # fmt: skip
        port = free_port() if http_port else None
        cmd = [str(gpu_venv / "bin/vllm"), "serve", MODEL, *args]
        if port is not None:
            cmd += ["--host", "127.0.0.1", "--port", str(port)]
        rank = Rank(cmd, env, tmp_path / f"{host}-{len(started)}.log", port)
        started.append(rank)
        return rank

    yield start
    for rank in started:
        if rank.proc.poll() is None:
            rank.proc.kill()
        rank.proc.wait(10)


def tp(port: int, rank: int, *extra: str) -> list[str]:
    args = ["-tp", "2", "--nnodes", "2", "--node-rank", str(rank), "--master-addr", "127.0.0.1",
            "--master-port", str(port), "--distributed-timeout-seconds", "30"]  # fmt: skip
    return [*args, *(["--headless"] if rank > 0 else []), *extra]


def claimed(root: Path) -> list[str]:
    """The GPUs with a claim under a host root (run/rbln-sim/cuda<i>/<pid>.json)."""
    return sorted(p.parent.name for p in (root / "run/rbln-sim").glob("cuda*/*.json"))


def test_a_tp_group_serves_through_rank_0(group: Callable[..., Rank], tmp_path: Path) -> None:
    port = free_port()
    nics = {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}  # the recipes' env
    worker = group("node1", *tp(port, 1), http_port=False, **nics)  # first: it retries for rank 0
    worker.wait_log("Waiting for node rank 0 at tcp://127.0.0.1")
    head = group("node0", *tp(port, 0), **nics)
    head.wait_serving()
    status, body = http(head.port or 0, "/v1/chat/completions", CHAT)
    assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 3
    metrics = http(head.port or 0, "/metrics")[1].decode()
    assert f'servefleet_sim_group_ranks{{model_name="{MODEL}"}} 2' in metrics
    assert f'servefleet_sim_group_size{{model_name="{MODEL}"}} 2' in metrics
    # each node claims its share of tp 2: one GPU each
    assert claimed(tmp_path / "node0") == claimed(tmp_path / "node1") == ["cuda0"]
    log = worker.log()
    assert "Launching vLLM (v0.30.0) headless multiproc executor, with head node address " \
        f"127.0.0.1:{port} for torch.distributed process group." in log  # fmt: skip
    assert "Starting vLLM API server" not in log and "vLLM API server version" not in log
    assert f"world_size=2 rank=1 local_rank=0 distributed_init_method=tcp://127.0.0.1:{port}" in log
    record = json.loads((tmp_path / "node1/run/rbln-sim/vllm-8000.json").read_text())
    assert record["pid"] == worker.proc.pid and "--headless" in record["argv"]
    for rank in (worker, head):
        rank.proc.send_signal(signal.SIGTERM)
        assert rank.wait_exit() == 0


def test_disagreeing_arguments_fail_both(group: Callable[..., Rank]) -> None:
    port = free_port()
    head = group("node0", *tp(port, 0, "--max-model-len", "8192"))
    head.wait_log("listens on")
    worker = group("node1", *tp(port, 1, "--max-model-len", "4096"), http_port=False)
    assert worker.wait_exit() == 1 and head.wait_exit() == 1
    line = "--max-model-len (node rank 0: 8192, node rank 1: 4096)"
    for rank in (head, worker):
        assert f"RuntimeError: node rank 1 of the group at tcp://127.0.0.1:{port} was started " \
            f"with other arguments than node rank 0: {line}" in rank.log()  # fmt: skip


def test_a_dp_group_disagreeing_fails_both_as_vllm(group: Callable[..., Rank]) -> None:
    port = free_port()
    dp = ["-dp", "2", "-dpl", "1", "-dpa", "127.0.0.1", "-dpp", str(port), "--enable-eplb"]
    head = group("node0", *dp)
    head.wait_log("listens on")
    worker = group("node1", *dp[:-1], "-dpr", "1", "--headless", http_port=False)
    assert worker.wait_exit() == 1 and head.wait_exit() == 1
    for rank in (head, worker):
        assert "RuntimeError: Configuration mismatch detected for engine 1. All DP workers must " \
            "have identical configurations" in rank.log()  # fmt: skip
        assert "Differing: --enable-eplb (DP rank 0: true, DP rank 1: false)" in rank.log()


def test_a_second_rank_0_or_rank_1_fails(group: Callable[..., Rank]) -> None:
    port = free_port()
    head = group("node0", *tp(port, 0))
    head.wait_log("listens on")
    second = group("node0b", *tp(port, 0))
    assert second.wait_exit() == 1
    assert "torch.distributed.DistNetworkError: The server socket has failed to listen on any " \
        f"local network address. port: {port}, useIpv6: false, code: -98, name: EADDRINUSE" \
        in second.log() and "this would be a second node rank 0" in second.log()  # fmt: skip
    worker = group("node1", *tp(port, 1), http_port=False)
    head.wait_serving()
    again = group("node1b", *tp(port, 1), http_port=False)
    assert again.wait_exit() == 1
    assert f"RuntimeError: node rank 1 of the group at tcp://127.0.0.1:{port} is pid " \
        f"{worker.proc.pid} on " in again.log() and "a second node rank 1 cannot join" in again.log()  # fmt: skip
    assert head.health() == 200 and worker.proc.poll() is None  # the group goes on


def serving_pair(group: Callable[..., Rank]) -> tuple[int, Rank, Rank]:
    """A 2-node TP group serving: its master port, rank 0 and the headless rank 1."""
    port = free_port()
    head = group("node0", *tp(port, 0))
    worker = group("node1", *tp(port, 1), http_port=False)
    head.wait_serving()
    return port, head, worker


def test_killing_rank_0_leaves_the_headless_rank_hanging(group: Callable[..., Rank]) -> None:
    port, head, worker = serving_pair(group)
    head.proc.kill()
    worker.wait_log("neither exit nor rejoin when the head dies (vllm#32136)")
    deadline = time.monotonic() + 3.0  # the observation window: it keeps running
    while time.monotonic() < deadline:
        assert worker.proc.poll() is None, worker.log()
        time.sleep(0.1)
    # a new rank 0 does not get it back: it waits for a rank that never comes
    new_head = group("node0", *tp(port, 0, "--distributed-timeout-seconds", "2"))
    assert new_head.wait_exit() == 1
    assert "torch.distributed.DistStoreError: Timed out after 3 seconds waiting for clients. " \
        "1/2 clients joined." in new_head.log()  # fmt: skip
    assert worker.proc.poll() is None
    worker.proc.send_signal(signal.SIGTERM)  # what stops it: the unit's stop
    assert worker.wait_exit() == 0 and "Shutting down." in worker.log()


def test_killing_rank_1_fails_rank_0s_health(group: Callable[..., Rank]) -> None:
    _, head, worker = serving_pair(group)
    worker.proc.kill()
    wait_for("rank 0's /health to fail", lambda: head.health() == 503, 5)
    status, body = http(head.port or 0, "/v1/chat/completions", CHAT)
    assert status == 500 and "EngineCore encountered an issue" in body.decode()
    assert head.wait_exit(15) == 0  # vLLM's watchdog, 5 s; exit 0 (vllm#48966)
    assert head.health() == 0  # the port is closed
    assert "node rank 1 (pid " in head.log() and "the engine is dead" in head.log()


def test_a_rank_0_not_there_yet_and_timeouts(group: Callable[..., Rank]) -> None:
    port = free_port()
    lone = group("node1", *tp(port, 1, "--distributed-timeout-seconds", "2"), http_port=False)
    assert lone.wait_exit() == 1
    assert "torch.distributed.DistNetworkError: The client socket has timed out after 2000ms " \
        f"while trying to connect to (127.0.0.1, {port})." in lone.log()  # fmt: skip
    head = group("node0", *tp(port, 0, "--distributed-timeout-seconds", "2"))
    assert head.wait_exit() == 1
    assert "torch.distributed.DistStoreError: Timed out after 3 seconds waiting for clients. " \
        "1/2 clients joined." in head.log()  # fmt: skip


@pytest.mark.parametrize(("nics", "message"), [
    ({"GLOO_SOCKET_IFNAME": "$IFACE_NAME"},
     "ifa != nullptr. Unable to find address for: $IFACE_NAME"),
    ({"NCCL_SOCKET_IFNAME": "=eth9"},
     "NCCL WARN Bootstrap : no socket interface found; NCCL_SOCKET_IFNAME==eth9"),
])  # fmt: skip
def test_a_data_nic_that_is_not_there(
    group: Callable[..., Rank], nics: dict[str, str], message: str
) -> None:
    rank = group("node1", *tp(free_port(), 1), http_port=False, **nics)
    assert rank.wait_exit() == 1 and message in rank.log()


def test_a_rank_1_without_headless_fails_as_vllm(group: Callable[..., Rank]) -> None:
    port = free_port()
    head = group("node0", *tp(port, 0))
    worker = group("node1", *tp(port, 1)[:-1], http_port=False)  # no --headless
    assert worker.wait_exit() == 1 and head.wait_exit() == 1
    assert "AssertionError: collective_rpc should not be called on follower node" in worker.log()
    assert "left the group at" in head.log() and "while the model loaded" in head.log()


def dp(port: int, *extra: str) -> list[str]:
    return ["--enable-expert-parallel", "-dp", "4", "--data-parallel-size-local", "2",
            "--data-parallel-address", "127.0.0.1", "--data-parallel-rpc-port", str(port), *extra]  # fmt: skip


def test_dp_ranks_across_nodes_serve(group: Callable[..., Rank], tmp_path: Path) -> None:
    # multi_node_dep's shape: hybrid LB, every node serves its own DP ranks over HTTP
    port = free_port()
    head = group("node0", *dp(port, "--data-parallel-hybrid-lb"))
    worker = group(
        "node1", *dp(port, "--data-parallel-hybrid-lb", "--data-parallel-start-rank", "2")
    )
    for rank in (head, worker):
        rank.wait_serving()
        assert http(rank.port or 0, "/v1/chat/completions", CHAT)[0] == 200
    assert claimed(tmp_path / "node0") == claimed(tmp_path / "node1") == ["cuda0", "cuda1"]
    metrics = http(head.port or 0, "/metrics")[1].decode()
    assert f'servefleet_sim_group_ranks{{model_name="{MODEL}"}} 4' in metrics
    worker.proc.kill()
    wait_for("the head's /health to fail", lambda: head.health() == 503, 5)


def test_a_dp_node_whose_head_died_hangs(group: Callable[..., Rank]) -> None:
    """A hybrid DP node serving its own ranks, its head killed: it stays up and healthy (its
    engines are alive) and a generation request never ends (the DP wave waits for the head)."""
    port = free_port()
    head = group("node0", *dp(port, "--data-parallel-hybrid-lb"))
    worker = group(
        "node1", *dp(port, "--data-parallel-hybrid-lb", "--data-parallel-start-rank", "2")
    )
    worker.wait_serving()
    head.proc.kill()
    worker.wait_log("neither exit nor rejoin when the head dies (vllm#32136)")
    assert worker.health() == 200
    conn = httpc.HTTPConnection("127.0.0.1", worker.port or 0, timeout=2)
    conn.request(
        "POST", "/v1/chat/completions", json.dumps(CHAT), {"Content-Type": "application/json"}
    )
    with pytest.raises(TimeoutError):
        conn.getresponse()
    conn.close()
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.wait_exit() == 0


def test_headless_dp_engines_and_the_headless_rule(group: Callable[..., Rank]) -> None:
    port = free_port()
    head = group("node0", *dp(port))  # internal LB: the remote engines must be headless
    worker = group("node1", *dp(port, "--data-parallel-start-rank", "2", "--headless"), http_port=False)  # fmt: skip
    head.wait_serving()
    assert "Launching 2 data parallel engine(s) in headless mode, with head node address " \
        f"tcp://127.0.0.1:{port}." in worker.log()  # fmt: skip
    for rank in (worker, head):
        rank.proc.send_signal(signal.SIGTERM)
        assert rank.wait_exit() == 0
    # multi_node_tp_dp as the recipes' site builds it: the worker infers hybrid, then external
    # LB (local size 1), the head stays internal LB, so vLLM's head refuses the worker
    port = free_port()
    base = ["-dp", "2", "--data-parallel-size-local", "1", "-dpa", "127.0.0.1", "-dpp", str(port)]
    head = group("node2", *base)
    worker = group("node3", *base, "--data-parallel-start-rank", "1")
    assert worker.wait_exit() == 1 and head.wait_exit() == 1
    for rank in (head, worker):
        assert "RuntimeError: Remote engine 1 must use --headless unless in external or hybrid " \
            "dp lb mode" in rank.log()  # fmt: skip
    assert "autoswitch to data_parallel_external_lb" in worker.log()


def test_rbln_runs_no_group(sim: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU build (vllm-rbln) refuses a multi-node command at once."""
    root = tmp_path / "root"
    (root / "etc/rbln-sim").mkdir(parents=True)
    monkeypatch.setenv("RBLN_SIM_ROOT", str(root))
    ns = sim.parse_serve_args([MODEL, "-tp", "2", "--nnodes", "2", "-r", "1", "--headless"], "rbln")
    with pytest.raises(sim.SimError, match="runs no multi-node group"):
        sim.start(ns, dict(os.environ), "rbln")
    assert isinstance(ns, argparse.Namespace)
