"""What servefleet takes on trust from vLLM 0.30.0, read from the real wheel (issue #30).

usage: python tests/realvllm/gen_surface.py [--check]      # any python: writes (or checks) the data
       REAL_PYTHON tests/realvllm/gen_surface.py --extract OUT.json [--platform NAME]

The first form runs the second under the real-wheel tier's upstream interpreter
(``build.py``; ``./setup.sh`` builds it) and writes, into the version's reference data in
``src/servefleet/reference/vllm/<version>/`` (beside its flag dumps; the lab's build copies them
into the simulated vllm's ``flags/``):

- ``vllm-0.30.0-metrics.json``: every Prometheus metric vLLM's v1 stat logger declares
  (``vllm/v1/metrics/loggers.py`` ``PrometheusStatLogger.__init__`` and the loggers it builds:
  spec decoding, the KV connector's (NIXL), perf), each with its exposed name (a counter's with
  prometheus_client's ``_total``), type, labels, histogram buckets (``null`` where they follow
  ``--max-model-len``), where it is declared (file: function) and when (``always``, or the
  option that adds it). Read by instantiating the logger with a stand-in config and recording
  every metric constructed, so nothing is guessed from the source text.
- ``vllm-0.30.0-envs.json``: the ``VLLM_*`` variables ``vllm/envs.py`` knows, and those
  vllm-rbln adds on its platform (the simulator warns about any other, as vLLM does).
- ``vllm-0.30.0-routes.json``: every HTTP route of the OpenAI API server's app
  (``vllm/entrypoints/launchers/app.py`` ``build_app`` for a generate model, built without an
  engine), with its methods and whether ``--api-key`` guards it, as answered by calling vLLM's
  own ``AuthenticationMiddleware`` (no key: 401 or passed on).

``--extract`` (under a real interpreter) writes everything the tier's test_trusted.py checks,
the two documents' data plus the env var names of ``vllm/envs.py``, the ``--shutdown-timeout``
flag, the SIGTERM handler's source, the process titles vLLM sets, and the keys of a NIXL
prefill's ``kv_transfer_params``, and servefleet's path guard as the real app loads it from
``--middleware`` (its place among the app's middleware, what the whole stack answers each route
without a key), as one JSON object.

The only stand-in: ``prometheus_fastapi_instrumentator`` is not in the tier's pins (vLLM's
``instrumentator/metrics.py`` imports it to add ``GET /metrics`` and the ``http_*`` request
metrics); a stub with its ``expose`` adds the same ``GET /metrics`` route, and vLLM's own
``Mount("/metrics", ...)`` is added by vLLM's code as it is.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
VERSION = "0.30.0"
FLAGS = REPO / "src" / "servefleet" / "reference" / "vllm" / VERSION  # the version's reference data
METRICS_FILE = FLAGS / f"vllm-{VERSION}-metrics.json"
ROUTES_FILE = FLAGS / f"vllm-{VERSION}-routes.json"
ENVS_FILE = FLAGS / f"vllm-{VERSION}-envs.json"
MODEL = "served-model"  # the served model name the extraction builds its logger and app with


# ---------------------------------------------------------------- under the real interpreter


def _stub_instrumentator() -> None:
    """A stand-in for prometheus_fastapi_instrumentator (not pinned): ``expose`` adds
    ``GET /metrics`` as the real one does; ``add``/``instrument`` add nothing."""
    import types

    pfi = types.ModuleType("prometheus_fastapi_instrumentator")
    routing = types.ModuleType("prometheus_fastapi_instrumentator.routing")

    class Instrumentator:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def add(self, *args: Any, **kwargs: Any) -> Instrumentator:
            return self

        def instrument(self, app: Any, *args: Any, **kwargs: Any) -> Instrumentator:
            return self

        def expose(
            self, app: Any, endpoint: str = "/metrics", include_in_schema: bool = True, **kw: Any
        ) -> Instrumentator:
            @app.get(endpoint, include_in_schema=include_in_schema)
            def metrics() -> None:  # the real one renders the registry
                pass

            return self

    pfi.Instrumentator = Instrumentator  # type: ignore[attr-defined]
    pfi.routing = routing  # type: ignore[attr-defined]
    sys.modules.setdefault(pfi.__name__, pfi)
    sys.modules.setdefault(routing.__name__, routing)


def _where(vllm_root: str) -> str:
    """``file: function`` of the innermost frame inside the vllm (or vllm_rbln) package."""
    frame = sys._getframe(2)
    roots = [vllm_root, os.path.join(os.path.dirname(vllm_root), "vllm_rbln")]
    while frame is not None:
        path = frame.f_code.co_filename
        for root in roots:
            if path.startswith(root + os.sep):
                rel = os.path.relpath(path, os.path.dirname(root))
                qualname = frame.f_code.co_qualname  # type: ignore[attr-defined]
                return f"{rel}: {qualname.split('.<locals>')[0]}"
        frame = frame.f_back  # type: ignore[assignment]
    return "?"


def extract_metrics() -> list[dict[str, Any]]:
    """Every metric PrometheusStatLogger declares, under each option that adds some."""
    import types

    import prometheus_client.metrics as pm
    import vllm
    from vllm.config import CacheConfig
    from vllm.v1.metrics import loggers

    root = os.path.dirname(vllm.__file__)
    seen: dict[str, dict[str, Any]] = {}
    when = ["always"]
    original = pm.MetricWrapperBase.__init__

    def record(self: Any, name: str, documentation: str, labelnames: Any = (), *a: Any, **kw: Any):
        original(self, name, documentation, labelnames, *a, **kw)
        if not self._name.startswith("vllm:"):
            return
        kind = self._type
        entry = {
            "name": self._name + ("_total" if kind == "counter" else ""),
            "type": kind,
            "labels": list(self._labelnames),
            "source": _where(root),
            "when": when[0],
        }
        if kind == "histogram":
            entry["buckets"] = [b for b in self._upper_bounds if b != float("inf")]
        seen.setdefault(entry["name"], entry)

    pm.MetricWrapperBase.__init__ = record  # type: ignore[method-assign]
    max_model_len = 8192

    def config(**over: Any) -> Any:
        base: dict[str, Any] = dict(
            observability_config=types.SimpleNamespace(
                show_hidden_metrics=False, kv_cache_metrics=False
            ),
            model_config=types.SimpleNamespace(
                served_model_name=MODEL, max_model_len=max_model_len, is_diffusion=False
            ),
            speculative_config=None,
            kv_transfer_config=None,
            lora_config=None,
            parallel_config=types.SimpleNamespace(
                data_parallel_size=1, tensor_parallel_size=1, pipeline_parallel_size=1
            ),
        )
        base.update(over)
        return types.SimpleNamespace(**base)

    try:
        logger = loggers.PrometheusStatLogger(config(), engine_indexes=[0])
        logger.log_metrics_info("cache_config", CacheConfig())
        variants: list[tuple[str, dict[str, Any]]] = [
            (
                "--kv-cache-metrics",
                dict(
                    observability_config=types.SimpleNamespace(
                        show_hidden_metrics=False, kv_cache_metrics=True
                    )
                ),
            ),
            ("--enable-lora", dict(lora_config=types.SimpleNamespace(max_loras=1))),
            (
                "--speculative-config",
                dict(speculative_config=types.SimpleNamespace(num_speculative_tokens=3)),
            ),
        ]
        for option, over in variants:
            when[0] = option
            loggers.PrometheusStatLogger(config(**over), engine_indexes=[0])
        when[0] = "VLLM_COMPUTE_NANS_IN_LOGITS=1"
        os.environ["VLLM_COMPUTE_NANS_IN_LOGITS"] = "1"
        try:
            loggers.PrometheusStatLogger(config(), engine_indexes=[0])
        finally:
            del os.environ["VLLM_COMPUTE_NANS_IN_LOGITS"]
        when[0] = "--kv-transfer-config NixlConnector"
        # NixlConnector.build_prom_metrics returns NixlPromMetrics(vllm_config, metric_types,
        # labelnames, per_engine_labelvalues); its package imports what the tier does not pin
        # (einops), so nixl/stats.py is loaded alone and called as the connector calls it
        stats = _load(os.path.join(root, "distributed/kv_transfer/kv_connector/v1/nixl/stats.py"))
        from prometheus_client import Counter, Gauge, Histogram

        stats.NixlPromMetrics(
            config(), {Gauge: Gauge, Counter: Counter, Histogram: Histogram},
            ["model_name", "engine"], {0: [MODEL, "0"]},
        )  # fmt: skip
    finally:
        pm.MetricWrapperBase.__init__ = original  # type: ignore[method-assign]
    for entry in seen.values():  # the request-token histograms follow --max-model-len
        if entry["type"] == "histogram":
            from vllm.v1.metrics.buckets import build_1_2_5_buckets

            if entry["buckets"] == build_1_2_5_buckets(max_model_len):
                entry["buckets"] = None
    return sorted(seen.values(), key=lambda e: e["name"])


def _load(path: str) -> Any:
    """A module of the wheel loaded from its file alone, under a private name."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_gen_surface_" + Path(path).stem, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _app(api_key: list[str] | None, *more: str) -> Any:
    import warnings

    from vllm.entrypoints.launchers.app import build_app
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.tasks import FALLBACK_SUPPORTED_TASKS
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    _stub_instrumentator()
    argv = [MODEL, *more] + [a for k in api_key or [] for a in ("--api-key", k)]
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_app(args, supported_tasks=FALLBACK_SUPPORTED_TASKS), FALLBACK_SUPPORTED_TASKS


def _routes(app: Any) -> list[tuple[str, list[str]]]:
    """(path, methods) of every route of the app, included routers flattened (FastAPI >=
    0.137 keeps them lazy); a mount answers every method (``*``)."""
    import fastapi.routing as fr
    from starlette.routing import Mount

    walk = getattr(fr, "_iter_routes_with_context", None)
    pairs = walk(app.routes) if walk else ((r, None) for r in app.routes)
    out = []
    for route, context in pairs:
        path = context.path if context is not None else getattr(route, "path", None)
        methods = context.methods if context is not None else getattr(route, "methods", None)
        if path is None:
            continue
        if isinstance(route, Mount):
            methods = {"*"}
        out.append((path, sorted(methods or {"*"})))
    return out


def _guarded(method: str, path: str) -> bool:
    """Whether vLLM's AuthenticationMiddleware answers 401 to a request without a key."""
    import asyncio

    from vllm.entrypoints.serve.middleware.authenticate import AuthenticationMiddleware

    passed: list[bool] = []

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        passed.append(True)

    status: list[int] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    scope = {
        "type": "http", "method": "GET" if method == "*" else method, "path": path,
        "root_path": "", "headers": [], "query_string": b"",
    }  # fmt: skip
    asyncio.run(AuthenticationMiddleware(inner, tokens=["k"])(scope, receive, send))
    return status == [401] and not passed


def extract_routes() -> dict[str, Any]:
    from vllm.entrypoints.serve.middleware import authenticate

    app, tasks = _app(["k"])
    keyed = {type(m.cls).__name__ if not isinstance(m.cls, type) else m.cls.__name__
             for m in app.user_middleware}  # fmt: skip
    routes = []
    for path, methods in _routes(app):
        method = methods[0] if methods != ["*"] else "*"
        routes.append({"path": path, "methods": methods, "guarded": _guarded(method, path)})
    plain, _ = _app(None)
    unkeyed = {m.cls.__name__ for m in plain.user_middleware if isinstance(m.cls, type)}
    return {
        "supported_tasks": list(tasks),
        "guarded_prefixes": list(authenticate.GUARDED_PREFIX),
        "middleware_with_key": "AuthenticationMiddleware" in keyed,
        "middleware_without_key": "AuthenticationMiddleware" in unkeyed,
        "routes": sorted(routes, key=lambda r: (r["path"], r["methods"])),
    }


def _strings(tree: Any, prefix: str) -> list[str]:
    import ast

    return sorted(
        {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
         and n.value.startswith(prefix)}
    )  # fmt: skip


def _function(path: str, name: str) -> Any:
    import ast

    tree = ast.parse(Path(path).read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    raise LookupError(f"{path}: no function {name}")


def extract_shutdown() -> dict[str, Any]:
    """The --shutdown-timeout flag as the serve parser has it, and serve_http's handler."""
    import ast
    import inspect

    from vllm.entrypoints.launchers import launcher
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser())
    action = next(a for a in parser._actions if "--shutdown-timeout" in a.option_strings)
    serve_http = _function(inspect.getsourcefile(launcher) or "", "serve_http")
    signals = sorted(
        {
            n.args[0].attr
            for n in ast.walk(serve_http)
            if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "add_signal_handler"
            and isinstance(n.args[0], ast.Attribute)
        }
    )  # fmt: skip
    return {
        "flag": "--shutdown-timeout",
        "default": action.default,
        "type": getattr(action.type, "__name__", str(action.type)),
        "help": action.help,
        "signals": signals,
        "log_lines": _strings(serve_http, "[shutdown]"),
        "source": "vllm/entrypoints/launchers/launcher.py: serve_http",
    }


def _functions(tree: Any) -> list[tuple[str, Any]]:
    """(class name or "", function) of a module's top-level functions and methods."""
    import ast

    out: list[tuple[str, Any]] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.append(("", node))
        elif isinstance(node, ast.ClassDef):
            out += [
                (node.name, n) for n in node.body
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            ]  # fmt: skip
    return out


def extract_proctitles() -> dict[str, Any]:
    """Every set_process_title call in vllm (and vllm_rbln): file, enclosing function, the
    title given (source text), and the prefix default."""
    import ast

    import vllm
    from vllm import envs

    base = os.path.dirname(vllm.__file__)
    roots = [base]
    try:
        import vllm_rbln

        roots.append(os.path.dirname(vllm_rbln.__file__))
    except ImportError:
        pass
    calls = []
    for root in roots:
        for path in sorted(Path(root).rglob("*.py")):
            text = path.read_text(errors="replace")
            if "set_process_title" not in text and "setproctitle" not in text:
                continue
            tree = ast.parse(text)
            for owner, fn in _functions(tree):
                for node in ast.walk(fn):
                    if not isinstance(node, ast.Call):
                        continue
                    callee = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                    if callee not in ("set_process_title", "setproctitle"):
                        continue
                    if fn.name == "set_process_title":
                        continue  # the helper itself
                    args = [ast.unparse(a) for a in node.args]
                    args += [f"{k.arg}={ast.unparse(k.value)}" for k in node.keywords]
                    where = f"{owner}.{fn.name}" if owner else fn.name
                    calls.append(
                        {
                            "source": f"{path.relative_to(os.path.dirname(root))}: {where}",
                            "call": f"{callee}({', '.join(args)})",
                        }
                    )
    helper = _function(os.path.join(base, "utils", "system_utils.py"), "set_process_title")
    return {
        "prefix_default": envs.environment_variables["VLLM_PROCESS_NAME_PREFIX"](),
        "format": ast.unparse(helper.body[-1]),
        "calls": sorted(calls, key=lambda c: (c["source"], c["call"])),
    }


def extract_envs() -> dict[str, Any]:
    """The VLLM_ variables vllm/envs.py knows (and vllm_rbln's), with the defaults of the ones
    the lab reads."""
    import ast

    from vllm import envs
    from vllm.config import CompilationMode

    rbln: list[str] = []
    read: set[str] = set()
    try:
        import vllm_rbln.config as rconfig  # type: ignore[import-not-found]
        import vllm_rbln.envs as renvs  # type: ignore[import-not-found]

        rbln = sorted(renvs.environment_variables)
        # vllm_rbln also reads names outside environment_variables (a deprecated alias: found
        # with os.environ.get, not known to vLLM's validate_environ)
        for probes in rconfig._ENV_PROBE.values():
            read.update(probes)
        for node in ast.walk(ast.parse(Path(renvs.__file__).read_text())):
            if (
                isinstance(node, ast.Call)
                and ast.unparse(node.func) in ("os.environ.get", "os.getenv")
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                read.add(str(node.args[0].value))
    except ImportError:
        pass
    # on rbln, vllm_rbln has added its variables to vllm's environment_variables by now
    names = sorted(n for n in envs.environment_variables if n.startswith("VLLM_") and n not in rbln)
    saved = dict(os.environ)
    defaults = {}
    try:
        for name in ("VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT", "VLLM_API_KEY"):
            os.environ.pop(name, None)
            defaults[name] = envs.environment_variables[name]()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return {
        "vllm": names,
        "vllm_rbln": rbln,
        "vllm_rbln_read": sorted(read),
        "defaults": defaults,
        "compilation_modes": [mode.name for mode in CompilationMode],
    }


def extract_rbln_config() -> dict[str, Any] | None:
    """vllm_rbln's RBLNConfig: each field's default and the variables that set it (the first
    found wins), and the fields its compute_hash leaves out of the compile cache's key."""
    import ast
    import dataclasses
    import inspect
    import textwrap

    try:
        import vllm_rbln.config as rconfig
        from vllm_rbln import envs as renvs
    except ImportError:
        return None
    fields = []
    for f in rconfig._fields_of(rconfig.RBLNConfig):
        if f.default is not dataclasses.MISSING:
            default = getattr(f.default, "default", f.default)  # a pydantic Field(default=...)
        else:
            default = f.default_factory()  # type: ignore[misc]
        attr, probes = rconfig._env_source(f.name)
        env = list(probes) if attr in renvs.environment_variables else []
        fields.append({"name": f.name, "default": default, "env": env})
    hash_fn = ast.parse(textwrap.dedent(inspect.getsource(rconfig.RBLNConfig.compute_hash)))
    ignored = next(
        ast.literal_eval(n.value)
        for n in ast.walk(hash_fn)
        if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "ignored_factors"
    )
    return {"fields": fields, "unhashed": sorted(ignored)}


def _class(path: str, name: str) -> Any:
    import ast

    tree = ast.parse(Path(path).read_text())
    return next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)


def extract_kv_params() -> dict[str, Any]:
    """The keys of the kv_transfer_params a NIXL prefill's answer carries (the dict its
    pull scheduler's request_finished returns), read from the source: the nixl package imports
    what the tier does not pin."""
    import ast

    import vllm

    base = os.path.dirname(vllm.__file__)
    rel = "distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py"
    cls = _class(os.path.join(base, rel), "NixlPullConnectorScheduler")
    fn = next(
        n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "request_finished"
    )
    keys: list[str] = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "dict":
            keys = [k.arg for k in node.keywords if k.arg]
    modes = {}
    for name, file in (("NixlBaseConnectorScheduler", "base_scheduler.py"),):
        node = _class(os.path.join(base, os.path.dirname(rel), file), name)
        for stmt in node.body:
            if (
                isinstance(stmt, ast.AnnAssign)
                and getattr(stmt.target, "id", "") == "_TRANSFER_MODE"
            ):
                modes[name] = ast.literal_eval(stmt.value) if stmt.value else None
    out: dict[str, Any] = {
        "keys": keys,
        "source": f"vllm/{rel}: NixlPullConnectorScheduler.request_finished",
        "transfer_mode": modes.get("NixlBaseConnectorScheduler"),
    }
    try:
        import vllm_rbln

        rpath = os.path.join(
            os.path.dirname(vllm_rbln.__file__),
            "distributed/kv_transfer/kv_connector/v1/rbln_nixl/pull_scheduler.py",
        )
        rcls = _class(rpath, "RblnNixlPullConnectorScheduler")
        out["rbln_bases"] = [ast.unparse(b) for b in rcls.bases]
        out["rbln_overrides_request_finished"] = any(
            isinstance(n, ast.FunctionDef) and n.name == "request_finished" for n in rcls.body
        )
    except ImportError:
        pass
    return out


GUARD_DIR = REPO / "src" / "servefleet" / "base" / "remote" / "asgi"  # servefleet's path guard
GUARD_PATHS = "/v1/ /health /metrics"  # the open paths the extraction runs it with


def extract_guard() -> dict[str, Any]:
    """servefleet's path guard (#46) as the real app loads it from ``--middleware`` with an API
    key: the app's middleware classes, outermost first, and what the whole stack answers each
    route without a key: 404 (the guard), 401 (vLLM's key check) or ``passed`` (to the route)."""
    import asyncio

    sys.path.insert(0, str(GUARD_DIR))
    os.environ["SERVEFLEET_OPEN_PATHS"] = GUARD_PATHS
    app, _ = _app(["k"], "--middleware", "servefleet_paths.OpenPaths")
    stack = [m.cls.__name__ for m in app.user_middleware if isinstance(m.cls, type)]
    answers: dict[str, str] = {}
    for path, methods in _routes(app):
        passed: list[bool] = []
        status: list[int] = []

        async def inner(scope: Any, receive: Any, send: Any, passed: list[bool] = passed) -> None:
            passed.append(True)

        async def send(message: dict[str, Any], status: list[int] = status) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        whole: Any = inner
        for m in reversed(app.user_middleware):  # Starlette's order: the first is outermost
            whole = m.cls(whole, *m.args, **m.kwargs)
        scope = {
            "type": "http", "method": "GET" if methods == ["*"] else methods[0], "path": path,
            "root_path": "", "headers": [], "query_string": b"",
        }  # fmt: skip
        asyncio.run(whole(scope, receive, send))
        answers[path] = "passed" if passed else str(status[0])
    return {"paths": GUARD_PATHS, "stack": stack, "answers": answers}


def extract() -> dict[str, Any]:
    import vllm

    return {
        "vllm": vllm.__version__,
        "metrics": extract_metrics(),
        "routes": extract_routes(),
        "shutdown": extract_shutdown(),
        "proctitles": extract_proctitles(),
        "envs": extract_envs(),
        "kv_params": extract_kv_params(),
        "rbln_config": extract_rbln_config(),
        "guard": extract_guard(),
    }


# ---------------------------------------------------------------- under any python


def real_python(platform: str = "upstream") -> Path:
    """The tier's interpreter of ``platform``; SystemExit naming ./setup.sh when not built."""
    sys.path.insert(0, str(HERE))
    import build  # tests/realvllm/build.py

    if not build.is_built():
        raise SystemExit(
            f"the real-wheel tier is not built ({build.built()}): run ./setup.sh "
            "(or python tests/realvllm/build.py)"
        )
    return Path(build.python(platform))


def run_extract(platform: str = "upstream") -> dict[str, Any]:
    """Everything :func:`extract` reads, from the real wheel of ``platform`` (one process)."""
    python = real_python(platform)
    with tempfile.TemporaryDirectory(prefix="gen-surface-") as tmp:
        out = Path(tmp) / "surface.json"
        env = dict(os.environ, VLLM_CONFIGURE_LOGGING="0", HF_HUB_OFFLINE="1", PYTHONPATH="")
        proc = subprocess.run(
            [str(python), str(Path(__file__).resolve()), "--extract", str(out)],
            capture_output=True, text=True, env=env, cwd=tmp,
        )  # fmt: skip
        if proc.returncode != 0 or not out.is_file():
            tail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-5:]
            raise RuntimeError(f"{python} gen_surface.py --extract failed: " + " | ".join(tail))
        result: dict[str, Any] = json.loads(out.read_text())
        return result


def documents(surface: dict[str, Any], rbln: dict[str, Any]) -> dict[Path, dict[str, Any]]:
    """The data files' contents from the upstream and the rbln extraction."""
    source = f"vLLM {surface['vllm']}'s own code, read by tests/realvllm/gen_surface.py"
    return {
        ENVS_FILE: {
            "about": (
                "VLLM_* environment variables the simulated vllm serve knows: any other VLLM_* "
                "variable in the server's environment logs vLLM's warning 'Unknown vLLM "
                "environment variable detected: NAME' (vllm/envs.py validate_environ). 'vllm': "
                "the VLLM_-prefixed keys of environment_variables in vllm/envs.py (the only ones "
                "validate_environ looks at); 'vllm_rbln': the keys of vllm_rbln/envs.py's "
                "environment_variables, which vllm-rbln adds to vLLM's on the rbln platform only."
            ),
            "source": f"vLLM {surface['vllm']} and vllm-rbln 0.12.0, read by "
            "tests/realvllm/gen_surface.py",
            "vllm": surface["envs"]["vllm"],
            "vllm_rbln": rbln["envs"]["vllm_rbln"],
        },
        METRICS_FILE: {
            "about": (
                "Every Prometheus metric vLLM's v1 stat logger declares (PrometheusStatLogger and "
                "the loggers it builds). name: as a scrape shows it (a counter with "
                "prometheus_client's _total); labels in order (engine is the engine index, "
                "model_name the served model name); buckets: a histogram's upper bounds "
                "without +Inf, null where they are a 1-2-5 series up to --max-model-len; "
                "when: always, or the option or variable that adds the metric."
            ),
            "source": source,
            "metrics": surface["metrics"],
        },
        ROUTES_FILE: {
            "about": (
                "The HTTP routes of vLLM's OpenAI API server app for a generate model "
                "(build_app, no engine), with methods ('*': a mount, any method) and whether "
                "--api-key (or VLLM_API_KEY) guards it: vLLM's AuthenticationMiddleware, "
                "called without a key, answers 401 (paths starting with guarded_prefixes; "
                "OPTIONS always passes). Routes that other options add (--enable-scale-out, "
                "VLLM_SERVER_DEV_MODE, pooling or speech tasks) are not listed."
            ),
            "source": source,
            **surface["routes"],
        },
    }


def dump(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=1, sort_keys=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extract", metavar="OUT", help="(real interpreter) write the extraction")
    parser.add_argument("--check", action="store_true", help="compare, write nothing")
    args = parser.parse_args(argv)
    if args.extract:
        Path(args.extract).write_text(json.dumps(extract(), indent=1) + "\n")
        return 0
    stale = []
    for path, doc in documents(run_extract("upstream"), run_extract("rbln")).items():
        text = dump(doc)
        if path.is_file() and path.read_text() == text:
            continue
        stale.append(path.name)
        if not args.check:
            path.write_text(text)
    verb = "differs from the real wheel" if args.check else "written"
    for name in stale:
        print(f"{name}: {verb}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
