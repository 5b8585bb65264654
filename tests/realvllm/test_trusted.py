"""What the lab takes on trust, checked against the real vLLM 0.30.0 wheel (issue #30; the table
in docs/lab.md): the committed metrics and routes data, the simulator's /metrics, routes and API
key guard, the VLLM_ variables it and servefleet read, --shutdown-timeout and SIGTERM, process
titles, and a NIXL prefill's kv_transfer_params. One extraction per platform
(gen_surface.py --extract under the tier's interpreter, ~10 s each)."""

from __future__ import annotations

import argparse
import ast
import http.client
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "tests" / "unit"))
import build  # noqa: E402
import gen_surface  # noqa: E402
from lab_sim_support import load_sim, serve_in_process, sim_vllm  # noqa: E402

SIM_PACKAGE = REPO / "src" / "servefleet" / "fleet" / "lab" / "simulator" / "packages" / "vllm"
SERVEFLEET = REPO / "src" / "servefleet"


def _surface(platform: str) -> dict[str, Any]:
    if not build.is_built():
        pytest.fail(
            f"the real-wheel tier is not built ({build.built()}): run ./setup.sh", pytrace=False
        )
    return gen_surface.run_extract(platform)


@pytest.fixture(scope="module")
def upstream() -> dict[str, Any]:
    return _surface("upstream")


@pytest.fixture(scope="module")
def rbln() -> dict[str, Any]:
    return _surface("rbln")


@pytest.fixture(scope="module")
def sim() -> Any:
    return load_sim("_trusted_vllm")


@pytest.fixture(scope="module")
def server(sim: Any) -> Iterator[tuple[int, Any]]:
    """The simulated HTTP API (its handler, in this process) with the API key ``k``."""
    http_api = sys.modules["_trusted_vllm.http_api"]
    ns = argparse.Namespace(
        api_key=["k"], served_model_name=None, model="m", max_model_len=4096
    )  # fmt: skip
    state = http_api._State(ns, {}, {"compiled": False})
    with serve_in_process(http_api._make_handler(state)) as port:
        yield port, state


def _ask(port: int, method: str, path: str, key: str | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    body = json.dumps({"model": "m", "max_tokens": 1, "prompt": "x",
                       "messages": [{"role": "user", "content": "x"}]}).encode()  # fmt: skip
    conn.request(method, path, body=body if method == "POST" else None, headers=headers)
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, data


# (a) the committed data is the real wheel's -----------------------------------------------


def test_committed_data_is_the_real_wheels(upstream: dict[str, Any], rbln: dict[str, Any]) -> None:
    stale = [
        p.name
        for p, doc in gen_surface.documents(upstream, rbln).items()
        if not p.is_file() or p.read_text() != gen_surface.dump(doc)
    ]
    assert not stale, f"{stale}: regenerate with python tests/realvllm/gen_surface.py"


def test_both_platforms_declare_the_same_metrics_and_routes(
    upstream: dict[str, Any], rbln: dict[str, Any]
) -> None:
    assert rbln["metrics"] == upstream["metrics"]
    assert rbln["routes"] == upstream["routes"]


# (b) metrics --------------------------------------------------------------------------------


def _sim_metrics(state: Any) -> dict[str, tuple[str, list[str]]]:
    """name -> (type, label names sorted) of the simulator's vllm: metrics, from its exposition
    (a histogram's ``_bucket``, ``_count`` and ``_sum`` series are its family's; ``le`` is not a
    label of the family)."""
    text = sys.modules["_trusted_vllm.http_api"]._metrics(state)
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    out = {}
    for name, labels in re.findall(r"^([a-zA-Z_:][\w:]*)\{([^}]*)\} ", text, re.M):
        if not name.startswith("vllm:"):
            continue
        family = name
        if name not in types:
            family = re.sub(r"_(bucket|count|sum)$", "", name)
            assert types.get(family) == "histogram", name
        names = sorted(n for n in re.findall(r'(\w+)="', labels) if n != "le")
        out[family] = (types[family], names)
    return out


def _servefleet_metric_names() -> set[str]:
    """The vllm: metric names servefleet's own code (outside the simulator) reads."""
    names: set[str] = set()
    for path in SERVEFLEET.rglob("*.py"):
        if "simulator" in path.parts:
            continue
        names |= set(re.findall(r"""["'](vllm:[a-z0-9_]+)""", path.read_text()))
    return names


def test_servefleet_reads_only_real_metrics(upstream: dict[str, Any]) -> None:
    real = {m["name"] for m in upstream["metrics"]}
    assert _servefleet_metric_names() <= real


def test_simulated_metrics_have_real_names_and_types(
    upstream: dict[str, Any], server: tuple[int, Any]
) -> None:
    real = {m["name"]: m for m in upstream["metrics"]}
    sim = _sim_metrics(server[1])
    assert sim, "the simulator exposes no vllm: metric"
    wrong = {n: t for n, (t, _) in sim.items() if n not in real or real[n]["type"] != t}
    assert not wrong, f"not in vLLM 0.30.0 with that type: {wrong}"


def test_simulated_metrics_have_real_labels(
    upstream: dict[str, Any], server: tuple[int, Any]
) -> None:
    real = {m["name"]: sorted(m["labels"]) for m in upstream["metrics"]}
    sim = _sim_metrics(server[1])
    assert {n: labels for n, (_, labels) in sim.items()} == {n: real[n] for n in sim}


def test_simulated_histograms_have_real_buckets(
    upstream: dict[str, Any], server: tuple[int, Any]
) -> None:
    real = {m["name"]: m.get("buckets") for m in upstream["metrics"]}
    text = sys.modules["_trusted_vllm.http_api"]._metrics(server[1])
    found: dict[str, list[float]] = {}
    for name, le in re.findall(r'^(vllm:\w+)_bucket\{.*\ble="([^"]+)"', text, re.M):
        found.setdefault(name, []).append(float(le))
    assert found, "the simulator exposes no histogram"
    assert {n: b[:-1] for n, b in found.items()} == {n: real[n] for n in found}
    assert all(b[-1] == float("inf") for b in found.values())


# the real wheel's PrometheusStatLogger, rendered by its prometheus_client (the simulator's
# model name, engine 0, before any request)
REAL_EXPOSITION = """
import sys, types
import prometheus_client
from vllm.v1.metrics import loggers
ns = types.SimpleNamespace
config = ns(
    observability_config=ns(show_hidden_metrics=False, kv_cache_metrics=False),
    model_config=ns(served_model_name="m", max_model_len=4096, is_diffusion=False),
    speculative_config=None, kv_transfer_config=None, lora_config=None,
    parallel_config=ns(data_parallel_size=1, tensor_parallel_size=1, pipeline_parallel_size=1),
)
loggers.PrometheusStatLogger(config, engine_indexes=[0])
sys.stdout.write(prometheus_client.generate_latest().decode())
"""


def _families(text: str) -> dict[str, list[str]]:
    """name -> its lines (# HELP, # TYPE, samples), each family from its # HELP (or, without
    one, its # TYPE) line on."""
    out: dict[str, list[str]] = {}
    name = ""
    for line in text.splitlines():
        if line.startswith(("# HELP ", "# TYPE ")):
            name = line.split()[2]
        out.setdefault(name, []).append(line)
    return out


def test_simulated_metrics_are_written_as_the_real_wheel_writes_them(sim: Any) -> None:
    """Each vllm: family the simulator exposes, before any request, is line for line what the
    real wheel's stat logger and its prometheus_client write: HELP text, TYPE, label order,
    bucket bounds, value format (the real one also writes ``_created`` families, which the
    simulator leaves out)."""
    import subprocess

    if not build.is_built():
        pytest.fail(f"the real-wheel tier is not built ({build.built()}): run ./setup.sh",
                    pytrace=False)  # fmt: skip
    env = {"VLLM_CONFIGURE_LOGGING": "0", "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([str(build.python("upstream")), "-c", REAL_EXPOSITION],
                          capture_output=True, text=True, timeout=300, env=env, cwd="/")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    real = _families(proc.stdout)
    http_api = sys.modules["_trusted_vllm.http_api"]
    ns = argparse.Namespace(api_key=None, served_model_name=None, model="m", max_model_len=4096)
    ours = _families(http_api._metrics(http_api._State(ns, {}, {"compiled": False})))
    exposed = {n: lines for n, lines in ours.items() if n.startswith("vllm:")}
    assert exposed, "the simulator exposes no vllm: family"
    assert exposed == {n: real.get(n) for n in exposed}
    assert list(exposed) == [n for n in real if n in exposed]  # in the real wheel's order


# (c) routes and the API key ---------------------------------------------------------------


def _real_routes(upstream: dict[str, Any]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for r in upstream["routes"]["routes"]:
        out.setdefault(r["path"], set()).update(r["methods"])
    return out


def test_simulated_routes_exist_with_their_methods(
    upstream: dict[str, Any], sim: Any, server: tuple[int, Any]
) -> None:
    http_api = sys.modules["_trusted_vllm.http_api"]
    real = _real_routes(upstream)
    served = {**{p: "GET" for p in http_api.GET_ROUTES}, **{p: "POST" for p in http_api.ROUTES},
              **{p: "POST" for p in http_api.UNKEYED_POSTS}}  # fmt: skip
    missing = {p: m for p, m in served.items() if not ({m, "*"} & real.get(p, set()))}
    assert not missing, f"the simulator serves what vLLM 0.30.0 does not: {missing}"
    port = server[0]
    for path, method in served.items():  # and answers them (with the key), not 404/405
        status, _ = _ask(port, method, path, "k")
        assert status not in (404, 405), (method, path, status)
        if "*" not in real[path]:  # another method: 405, as FastAPI answers it
            other = "POST" if method == "GET" else "GET"
            assert _ask(port, other, path, "k")[0] == 405, (other, path)


def test_servefleet_calls_real_routes(upstream: dict[str, Any]) -> None:
    """Every vLLM path servefleet's host programs call: /health (gate, router health check) and
    POST /v1/chat/completions (gate, pd probe, lab chat)."""
    real = _real_routes(upstream)
    health = (SERVEFLEET / "base" / "remote" / "health.py").read_text()
    assert '"/health"' in health and '"/v1/chat/completions"' in health
    assert '"--health-check-endpoint", "/health"' in (SERVEFLEET / "router" / "plan.py").read_text()
    assert "GET" in real["/health"] and "POST" in real["/v1/chat/completions"]


def test_api_key_guards_what_vllm_guards(upstream: dict[str, Any], server: tuple[int, Any]) -> None:
    routes = upstream["routes"]
    assert routes["middleware_with_key"] and not routes["middleware_without_key"]
    http_api = sys.modules["_trusted_vllm.http_api"]
    assert tuple(routes["guarded_prefixes"]) == http_api.GUARDED_PREFIXES
    for r in routes["routes"]:  # the simulator's rule gives the real middleware's answer
        method = "GET" if r["methods"] == ["*"] else r["methods"][0]
        assert http_api.guarded(method, r["path"]) == r["guarded"], r
    port = server[0]
    for path, method in [*((p, "GET") for p in http_api.GET_ROUTES),
                         *((p, "POST") for p in (*http_api.ROUTES, *http_api.UNKEYED_POSTS)),
                         ("/v2/rerank", "POST")]:  # fmt: skip
        status, body = _ask(port, method, path)
        if http_api.guarded(method, path):
            assert (status, json.loads(body)) == (401, {"error": "Unauthorized"}), path
        else:
            assert status != 401, path


def test_the_real_app_runs_servefleets_path_guard_outermost(
    upstream: dict[str, Any], rbln: dict[str, Any]
) -> None:
    """#46 item 1: vLLM 0.30.0 imports ``--middleware servefleet_paths.OpenPaths`` (the unit's
    argv) and adds it outermost, before its own key check; through the whole stack, a route off
    the open paths is 404 without a key, one on them is vLLM's (401 under /v1, else passed)."""
    for surface in (upstream, rbln):
        guard = surface["guard"]
        assert guard["stack"][0] == "OpenPaths" and "AuthenticationMiddleware" in guard["stack"]
        exact, prefixes = guard["paths"].split(), ("/v1/",)
        assert guard["answers"], "no route answered"
        for path, answer in guard["answers"].items():
            if path.startswith(prefixes):
                assert answer == "401", (path, answer)
            elif path in exact:
                assert answer == "passed", (path, answer)
            else:
                assert answer == "404", (path, answer)
        for path in ("/invocations", "/scale_elastic_ep", "/tokenize", "/generative_scoring"):
            assert guard["answers"][path] == "404", path


def test_the_units_argv_names_the_guard_the_real_app_loaded(upstream: dict[str, Any]) -> None:
    sys.path.insert(0, str(REPO / "src"))
    from servefleet.base.remote import layout
    from servefleet.hostplan.instance_unit import GUARD_ARGS

    assert (
        GUARD_ARGS
        == ("--middleware", layout.PATH_GUARD)
        == ("--middleware", "servefleet_paths.OpenPaths")
    )
    assert gen_surface.GUARD_DIR == SERVEFLEET / "base" / "remote" / layout.ASGI
    assert (gen_surface.GUARD_DIR / f"{layout.PATH_GUARD_MODULE}.py").is_file()


# (d) environment variables ----------------------------------------------------------------


def _vllm_env_names(root: Path, skip: str | None = None) -> set[str]:
    names: set[str] = set()
    for path in root.rglob("*.py"):
        if skip and skip in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if re.fullmatch(r"VLLM_[A-Z0-9_]*[A-Z0-9]", node.value):
                    names.add(node.value)
    return names


def test_env_vars_read_exist_in_vllm(upstream: dict[str, Any], rbln: dict[str, Any]) -> None:
    """Every VLLM_ name the simulator and servefleet use is one vLLM or vllm-rbln reads (a
    deprecated alias vllm-rbln reads outside its table counts; CompilationMode's member names
    are not variables)."""
    known = set(upstream["envs"]["vllm"]) | set(upstream["envs"]["compilation_modes"])
    rbln_known = set(rbln["envs"]["vllm_rbln"]) | set(rbln["envs"]["vllm_rbln_read"])
    assert rbln["envs"]["vllm_rbln"], "vllm_rbln.envs lists no variable"
    sim = _vllm_env_names(SIM_PACKAGE)
    ours = _vllm_env_names(SERVEFLEET, skip="simulator")
    unknown = sorted(n for n in sim | ours if n not in known and n not in rbln_known)
    assert not unknown, f"not in vllm/envs.py nor vllm_rbln/envs.py: {unknown}"


def test_simulated_rbln_config_is_vllm_rblns(rbln: dict[str, Any], sim: Any) -> None:
    """The simulator's RBLNConfig fields (what keys its compile cache) are vllm-rbln 0.12.0's:
    the same fields, defaults and variables, and the same ones left out of the cache's key."""
    real = rbln["rbln_config"]
    common = sys.modules["_trusted_vllm.common"]
    simulated = [
        {"name": f, "default": d, "env": list(names)} for f, names, d in common.RBLN_FIELDS
    ]
    assert simulated == real["fields"]
    assert sorted(common.RBLN_UNCACHED) == real["unhashed"]


def test_servefleet_fingerprint_reads_vllm_rblns_variables(rbln: dict[str, Any]) -> None:
    """The compile fingerprint reads each RBLNConfig field from the variables vllm-rbln reads
    for it, in its order."""
    from servefleet.kinds.rbln import compile_table

    real = {f["name"]: f["env"] for f in rbln["rbln_config"]["fields"]}
    ours = {
        c.key.removeprefix("rbln."): list(c.env)
        for c in compile_table.COMPILE_INPUTS
        if c.key.startswith("rbln.") and c.key.removeprefix("rbln.") in real
    }
    assert ours == {name: real[name] for name in ours}
    hashed = set(real) - set(rbln["rbln_config"]["unhashed"])
    assert set(ours) == hashed, f"fields the fingerprint does not read: {hashed - set(ours)}"


def test_nixl_side_channel_defaults(upstream: dict[str, Any], sim: Any) -> None:
    kv = sys.modules["_trusted_vllm.kv_transfer"]
    defaults = upstream["envs"]["defaults"]
    assert defaults["VLLM_NIXL_SIDE_CHANNEL_HOST"] == kv.DEFAULT_HOST
    assert defaults["VLLM_NIXL_SIDE_CHANNEL_PORT"] == kv.DEFAULT_PORT
    sys.path.insert(0, str(REPO / "src"))
    from servefleet.hostplan import placement

    assert placement.SIDE_CHANNEL_PORT == "VLLM_NIXL_SIDE_CHANNEL_PORT"
    assert placement.SIDE_CHANNEL_DEFAULT == defaults["VLLM_NIXL_SIDE_CHANNEL_PORT"]


def test_prefill_kv_transfer_params_keys(
    upstream: dict[str, Any], rbln: dict[str, Any], sim: Any
) -> None:
    kv = sys.modules["_trusted_vllm.kv_transfer"]
    real = upstream["kv_params"]
    transfer = kv.KVTransfer(
        connector="NixlConnector", kv_role="kv_both", policy="fail", lease=30.0,
        enforce_compat=True, engines=[kv.Engine(0, "e", "localhost", 5600)], compat_hash="h",
        block_size=16, tp_size=1,
    )  # fmt: skip
    params = transfer.prefill_params(transfer.engines[0], "r", 20)
    assert list(params) == real["keys"]
    assert params["transfer_mode"] == real["transfer_mode"] == "pull"
    # vllm-rbln's pull scheduler answers with upstream's request_finished
    assert "NixlPullConnectorScheduler" in rbln["kv_params"]["rbln_bases"]
    assert rbln["kv_params"]["rbln_overrides_request_finished"] is False


# (e) shutdown -------------------------------------------------------------------------------


def test_shutdown_timeout_and_signals(upstream: dict[str, Any], rbln: dict[str, Any]) -> None:
    for surface in (upstream, rbln):
        shutdown = surface["shutdown"]
        assert (shutdown["default"], shutdown["type"]) == (0, "int")
        assert shutdown["signals"] == ["SIGINT", "SIGTERM"]
    sim = (SIM_PACKAGE / "sim.py").read_text()
    assert "SHUTDOWN_SIGNALS = {signal.SIGTERM, signal.SIGINT}" in sim
    real_lines = upstream["shutdown"]["log_lines"]
    assert "[shutdown] API server: shutdown triggered" in real_lines
    assert "[shutdown] API server: stopping engine client mode=%s timeout=%ss" in real_lines
    sys.path.insert(0, str(REPO / "src"))
    import dataclasses

    from servefleet.settings import table as settings

    field = next(
        f for f in dataclasses.fields(settings.Settings) if f.name == "serve_shutdown_timeout"
    )
    assert field.metadata["default"] > 0  # servefleet drains; vLLM's 0 aborts


# (f) process titles -------------------------------------------------------------------------

# the functions that set a title, each run in a child process of `vllm serve`, never in its
# main process (whose /proc/PID/cmdline and environ servefleet's probe reads: --port, the unit
# sha); set_process_title rewrites argv (and, without SPT_NOENV, environ) of its own process
CHILD_ENTRIES = {
    "vllm/entrypoints/launchers/dp_supervisor.py: _run_vllm_dp_server",
    "vllm/v1/engine/coordinator.py: DPCoordinatorProc.__init__",
    "vllm/v1/engine/core.py: EngineCoreProc.run_engine_core",
    "vllm/v1/executor/multiproc_executor.py: WorkerProc.setup_proc_title_and_log_prefix",
    "vllm/v1/utils.py: run_api_server_worker_proc",
}


def test_process_titles_only_in_children(upstream: dict[str, Any], rbln: dict[str, Any]) -> None:
    for surface in (upstream, rbln):
        titles = surface["proctitles"]
        assert titles["prefix_default"] == "VLLM"
        assert titles["format"] == "setproctitle.setproctitle(f'{prefix}::{name}')"
        assert {c["source"] for c in titles["calls"]} == CHILD_ENTRIES
    probe = (SERVEFLEET / "base" / "remote" / "systemd_units.py").read_text()
    assert "/proc/{pid}/cmdline" in probe and "/proc/{pid}/environ" in probe


# (g) a start that fails before the engine ---------------------------------------------------

FAILED_STARTS = {  # argv after `vllm serve` -> where vLLM stops it
    "unknown tool-call parser": ["some/model", "--enable-auto-tool-choice", "--tool-call-parser",
                                 "nosuch"],  # validate_api_server_args: KeyError, status 1
    "invalid choice": ["some/model", "--dtype", "nosuch"],  # argparse: status 2
}  # fmt: skip
PID_PREFIX = re.compile(r"^\(APIServer pid=\d+\) ")


def _last_error(stderr: str) -> str:
    """The line a failed start ends with: the exception (a traceback's last line, or the
    simulator's ERROR line) or argparse's error, without vLLM's process prefix."""
    line = PID_PREFIX.sub("", stderr.strip().splitlines()[-1])
    return re.sub(r"^ERROR \d\d-\d\d \d\d:\d\d:\d\d \[sim\] ", "", line)


def _vllm_serve(python: str, argv: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str]:
    import subprocess

    done = subprocess.run([python, *argv], capture_output=True, text=True, timeout=300, env=env,
                          cwd=cwd)  # fmt: skip
    return done.returncode, _last_error(done.stderr)


@pytest.mark.parametrize("platform", ["upstream", "rbln"])
def test_a_failed_start_exits_and_says_what_vllm_does(platform: str, tmp_path: Path) -> None:
    """``vllm serve`` that stops before its engine: the real console script and the simulator's
    (the lab's ``vllm``) exit with the same status and end on the same line (the journal tail
    the health gate shows)."""
    from concurrent.futures import ThreadPoolExecutor

    if not build.is_built():
        pytest.fail(f"the real-wheel tier is not built ({build.built()}): run ./setup.sh",
                    pytrace=False)  # fmt: skip
    real_bin = tmp_path / "real" / "vllm"  # vllm's console script (the rbln venv has none)
    real_bin.parent.mkdir()
    real_bin.write_text(
        "import sys\nfrom vllm.entrypoints.cli.main import main\nsys.exit(main())\n"
    )
    site, root = tmp_path / "site", tmp_path / "root"
    (site / "vllm-0.30.0+cpu.dist-info").mkdir(parents=True)
    (site / "vllm").symlink_to(sim_vllm(), target_is_directory=True)
    (site / "vllm-0.30.0+cpu.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: vllm\nVersion: 0.30.0+cpu\n"
    )
    (root / "etc/rbln-sim").mkdir(parents=True)
    (root / "etc/rbln-sim/platform").write_text(platform + "\n")
    script = tmp_path / "bin" / "vllm"  # argparse's prog is its name, as the console script's
    script.parent.mkdir()
    script.write_text("import sys\nfrom vllm.sim import main\nsys.exit(main())\n")
    base = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "VLLM_CONFIGURE_LOGGING": "1"}
    sim_env = {**base, "PYTHONPATH": str(site), "RBLN_SIM_ROOT": str(root),
               "PYTHONDONTWRITEBYTECODE": "1"}  # fmt: skip
    jobs = {}
    with ThreadPoolExecutor(max_workers=4) as pool:
        for name, argv in FAILED_STARTS.items():
            jobs[name] = (
                pool.submit(
                    _vllm_serve,
                    build.python(platform),
                    [str(real_bin), "serve", *argv],
                    base,
                    tmp_path,
                ),  # fmt: skip
                pool.submit(
                    _vllm_serve, sys.executable, [str(script), "serve", *argv], sim_env, tmp_path
                ),  # fmt: skip
            )
    for name, (real, sim) in jobs.items():
        assert real.result()[0] in (1, 2), (name, real.result())
        assert sim.result() == real.result(), name
