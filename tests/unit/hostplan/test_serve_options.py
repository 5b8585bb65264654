"""What the data adds to every server (issue #19): a graceful stop (``serve_shutdown_timeout``
as ``--shutdown-timeout`` and TimeoutStopSec above it), an API key through a root-only
EnvironmentFile (never in the unit, its argv or its hash), and extra arguments and environment
checked against the real ``vllm serve`` flag table of the host's platform. Each rendered command
line is parsed by the lab's simulated ``vllm serve`` (built from the same dumps of vLLM's
parser), so an argv the real server would refuse fails here."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import io
from typing import Any

import pytest
from host_inputs import CREDS, GPU_DATA, gpu_probe, probe
from lab_sim_support import load_sim
from systemd_parse import parse_unit

from servefleet.base import flags
from servefleet.base.errors import DataError
from servefleet.base.remote.layout import API_KEY_FILE, UNIT_SHA_VAR
from servefleet.entry.steps import credentials, ensure
from servefleet.hostplan.instance_unit import GUARD_ARGS, api_key_file, instance_command
from servefleet.hostplan.plan import plan_host
from servefleet.hostplan.probe_input import watched_paths
from servefleet.hostplan.types import HostPlan
from servefleet.settings.table import Settings, load_defaults, settings_from

SIM = load_sim("servefleet_lab_vllm_sim_serve_options")
KEY = "sk-" + "0123456789abcdef" * 3
ENV_KEY = "SERVEFLEET_API_KEY"


def settings(gpu: bool = False, environ: dict[str, str] | None = None, **over: Any) -> Settings:
    data = load_defaults()
    data.update(GPU_DATA if gpu else {})
    data.update(over)
    return settings_from(data.get, {**CREDS, **(environ or {})})


def plan(gpu: bool = False, environ: dict[str, str] | None = None, **over: Any) -> HostPlan:
    return plan_host(settings(gpu, environ, **over), gpu_probe() if gpu else probe())


def refused(gpu: bool = False, **over: Any) -> str:
    with pytest.raises(DataError) as e:
        plan(gpu, **over)
    assert len(str(e.value).splitlines()) == 1
    return str(e.value)


def served(p: HostPlan, index: int = 0) -> tuple[argparse.Namespace, list[str], dict[str, str]]:
    """Instance ``index``'s unit as systemd reads it, its argv parsed by the simulated vllm
    serve of the host's platform (exit 2 on anything the real parser refuses)."""
    argv, env = parse_unit(p.instances[index].text)
    assert argv[1] == "serve"
    platform = p.platform.flag_table
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            ns = SIM.parse_serve_args(argv[2:], platform)
        except SystemExit:  # pragma: no cover - the message is the failure
            pytest.fail(f"vllm serve refuses the unit's argv: {err.getvalue()}")
    return ns, argv, env


def setting(text: str, directive: str) -> list[str]:
    return [line.split("=", 1)[1] for line in text.splitlines() if line.startswith(directive + "=")]


# -- graceful restarts -----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["rbln", "upstream"])
def test_shutdown_timeout_is_a_flag_of_both_platforms_tables(name: str) -> None:
    flag = flags.table(name).flags["--shutdown-timeout"]
    assert (flag.dest, flag.values, flag.type) == ("shutdown_timeout", "one", "int")


@pytest.mark.parametrize("gpu", [False, True], ids=["rbln", "gpu"])
def test_every_server_drains_for_serve_shutdown_timeout_and_systemd_waits_longer(
    gpu: bool,
) -> None:
    default = plan(gpu)
    for inst in default.instances:
        assert setting(inst.text, "TimeoutStopSec") == ["90"]
    ns, argv, _ = served(default)
    assert ns.shutdown_timeout == 60 and argv[-4:-2] == ["--shutdown-timeout", "60"]
    cut = plan(gpu, serve_shutdown_timeout=0)
    ns, _, _ = served(cut)
    assert ns.shutdown_timeout == 0 and setting(cut.instances[0].text, "TimeoutStopSec") == ["30"]
    long = plan(gpu, serve_shutdown_timeout="600")
    assert served(long)[0].shutdown_timeout == 600
    assert setting(long.instances[0].text, "TimeoutStopSec") == ["630"]
    # a change restarts through the gate: another unit sha, the same compile fingerprint
    shas = {p.instances[0].sha for p in (default, cut, long)}
    assert len(shas) == 3
    assert default.spec.compile_fingerprint == cut.spec.compile_fingerprint


# -- the API key -----------------------------------------------------------------------------


def test_the_key_reaches_the_server_through_a_root_file_never_the_unit() -> None:
    keyed = plan(environ={ENV_KEY: KEY})
    plain = plan()
    for inst, bare in zip(keyed.instances, plain.instances, strict=True):
        assert KEY not in inst.text
        assert setting(inst.text, "EnvironmentFile") == [API_KEY_FILE]
        assert setting(bare.text, "EnvironmentFile") == []
        argv, env = parse_unit(inst.text)
        assert all(KEY not in a for a in argv) and all(KEY not in v for v in env.values())
        assert "VLLM_API_KEY" not in env and "--api-key" not in argv
        # the text is the plain one plus the EnvironmentFile line and another sha
        strip = (f"EnvironmentFile={API_KEY_FILE}\n", f"{UNIT_SHA_VAR}={inst.sha}")
        text = inst.text.replace(strip[0], "").replace(strip[1], f"{UNIT_SHA_VAR}={bare.sha}")
        assert text == bare.text
    assert KEY not in repr(keyed.settings) and KEY not in str(keyed.desired_state())


def test_the_unit_sha_carries_nothing_of_the_key() -> None:
    """#31 finding 4: SERVEFLEET_UNIT is world-readable (the unit, /proc): it is the hash of the
    unit's text alone, the same for every key, so no guess at the key can be checked against
    it. A new key restarts the servers all the same: the plan sees the key file differ, and the
    probe whether each server runs with the file's key."""
    a = plan(environ={ENV_KEY: KEY}).instances[0]
    other = plan(environ={ENV_KEY: KEY[:-1] + "X"}).instances[0]
    plain = plan().instances[0]
    assert a.sha == other.sha != plain.sha and a.text == other.text  # plain: no EnvironmentFile
    without = "".join(x for x in a.text.splitlines(True) if UNIT_SHA_VAR not in x)
    assert hashlib.sha256(without.encode()).hexdigest()[:16] == a.sha
    assert api_key_file(KEY) == f"VLLM_API_KEY={KEY}\n"


def test_a_new_key_or_a_server_on_another_key_is_not_converged() -> None:
    import hmac

    secret = b"k" * 32
    line = api_key_file(KEY).encode()
    current = {"type": "file", "mode": "600", "user": "root", "group": "root",
               "sha256": hmac.new(secret, line, "sha256").hexdigest()}  # fmt: skip
    first = plan(environ={ENV_KEY: KEY})
    units = {
        i.unit: {"active": "active", "running": i.sha, "key_current": True,
                 "file": hashlib.sha256(i.text.encode()).hexdigest()}
        for i in first.instances
    }  # fmt: skip
    s = settings(environ={ENV_KEY: KEY})

    def again(key_current: bool, paths: dict[str, Any]) -> HostPlan:
        found = {u: dict(e, key_current=key_current) for u, e in units.items()}
        probed = probe(units=found, paths=paths, releases=[first.release.id])  # installed
        return plan_host(s, probed, secret_key=secret)

    assert again(True, {API_KEY_FILE: current}).key_file_current
    assert all(i.converged for i in again(True, {API_KEY_FILE: current}).instances)
    assert not again(True, {API_KEY_FILE: dict(current, sha256="0" * 64)}).key_file_current
    assert not again(True, {}).key_file_current  # no key file yet
    assert not any(i.converged for i in again(False, {API_KEY_FILE: current}).instances)


def test_a_key_systemd_or_http_could_misread_is_refused_without_showing_it() -> None:
    for bad in ("short", KEY + " x", KEY + '"', KEY + "$HOME", KEY + "\n"):
        with pytest.raises(DataError) as e:
            settings(environ={ENV_KEY: bad})
        assert str(e.value).startswith(f"creds_api_key_env: the value of {ENV_KEY} (not shown)")
        assert bad not in str(e.value)
    other = settings(creds_api_key_env="MY_KEY", environ={"MY_KEY": KEY, ENV_KEY: "short"})
    assert other.api_key == KEY
    assert settings().api_key is None  # no variable: open endpoints, as before


def test_the_deploy_writes_the_key_file_as_a_secret_and_watches_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    written: list[tuple[str, str, str]] = []
    monkeypatch.setattr(ensure, "put_secret", lambda **kw: written.append(tuple(kw.values())))
    keyed = plan(environ={ENV_KEY: KEY})
    credentials.api_key(keyed)
    assert written == [("Write the servers' API key (0600)", API_KEY_FILE, api_key_file(KEY))]
    # the probe found the file as written: no operation (a re-run changes nothing)
    digest = keyed.digest(API_KEY_FILE, api_key_file(KEY).encode())  # as the probe reports it
    found = {"type": "file", "mode": "600", "user": "root", "group": "root", "sha256": digest}
    assert API_KEY_FILE in watched_paths(keyed.settings)
    done = plan_host(keyed.settings, probe(paths={API_KEY_FILE: found}))
    written.clear()
    credentials.api_key(done)
    assert written == []
    credentials.api_key(plan())  # no key: nothing written
    assert written == []


# -- extra arguments and environment ---------------------------------------------------------


def test_extra_args_are_appended_and_vllm_serve_takes_them() -> None:
    base = plan()
    extra = plan(serve_extra_args=["--enable-log-requests", "--max-log-len", "100"])
    ns, argv, _ = served(extra)
    assert ns.enable_log_requests is True and ns.max_log_len == 100
    recipe = base.spec.servers[0].argv
    assert extra.spec.servers[0].argv == [*recipe, "--enable-log-requests", "--max-log-len", "100"]
    assert extra.instances[0].sha != base.instances[0].sha
    # extras count as compile inputs: their first start is treated as a recompile
    assert extra.spec.compile_fingerprint != base.spec.compile_fingerprint
    assert plan(serve_extra_args="--enable-log-requests --max-log-len 100").instances == (
        extra.instances
    )  # the one-string form (--data) is the same list


def test_a_served_model_name_from_the_extras_is_what_the_gate_asks_for() -> None:
    p = plan(serve_extra_args=["--served-model-name", "gpt"])
    assert served(p)[0].served_model_name == ["gpt"]
    assert p.desired_state()["model"] == "gpt"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-num-seq", "8"], "serve_extra_args: --max-num-seq is not a flag of vllm serve "
         "(vLLM 0.30.0 with vllm-rbln 0.12.0); did you mean --max-num-seqs?"),
        (["--frobnicate"], "serve_extra_args: --frobnicate is not a flag of vllm serve (vLLM "
         "0.30.0 with vllm-rbln 0.12.0); allowed: a flag of vllm serve (vLLM 0.30.0 with "
         "vllm-rbln 0.12.0)"),
        (["--max-num-seqs", "8"], "serve_extra_args: --max-num-seqs is set by the recipe already "
         "(--max-num-seqs 1); allowed: add --max-num-seqs to serve_override_args to replace the "
         "recipe's value"),
        (["--enable-prefix-caching"], "serve_extra_args: --enable-prefix-caching is set by the "
         "recipe already (--no-enable-prefix-caching)"),
        (["--max_model_len=4096"], "serve_extra_args: --max_model_len=4096 is set by the recipe "
         "already (--max-model-len 131072)"),
        (["--port", "9000"], "serve_extra_args: --port is set by the deploy; allowed: set "
         "serve_base_port instead"),
        (["--api-key", "x"], "serve_extra_args: --api-key is set by the deploy; allowed: set "
         "creds_api_key_env instead"),
        (["-tp", "2"], "serve_extra_args: -tp decides the devices a server takes"),
        (["--speculative-config.model", "x/y"], "serve_extra_args: --speculative-config decides "
         "the draft model fetched"),
        (["--max-log-len"], "serve_extra_args: --max-log-len needs a value"),
        (["--enable-log-requests=yes"], "serve_extra_args: --enable-log-requests takes no value"),
        (["--max-log-len", "many"], "serve_extra_args: --max-log-len 'many' is not an int"),
        (["--uvicorn-log-level", "loud"], "serve_extra_args: --uvicorn-log-level 'loud' is not one of its choices; allowed: critical, debug, error, info, trace, warning"),
        (["100"], "serve_extra_args: '100' follows no flag that takes a value"),
    ],
)  # fmt: skip
def test_extra_args_refused(args: list[str], message: str) -> None:
    assert refused(serve_extra_args=args).startswith(message)


def test_an_override_replaces_the_recipes_value_in_every_spelling() -> None:
    p = plan(
        serve_extra_args=["--max_num_seqs=8", "--enable-prefix-caching"],
        serve_override_args=["--max-num-seqs", "--enable-prefix-caching"],
    )
    ns, argv, _ = served(p)
    assert ns.max_num_seqs == 8 and ns.enable_prefix_caching is True
    assert not [a for a in argv if a.startswith("--max-num-seqs")]
    assert "--no-enable-prefix-caching" not in argv
    assert argv.count("--max_num_seqs=8") == 1
    assert p.instances[0].sha != plan().instances[0].sha
    assert refused(serve_override_args=["--max-num-seqs"]) == (
        "serve_override_args: --max-num-seqs is not in serve_extra_args; allowed: flags of "
        "serve_extra_args and variables of serve_extra_env that replace the recipe's"
    )
    # an override never lets the deploy's own flags in
    assert "--port is set by the deploy" in refused(
        serve_extra_args=["--port", "1"], serve_override_args=["--port"]
    )


def test_the_host_platforms_table_decides() -> None:
    rbln = plan(serve_extra_args=["--rbln-use-w8a8"])
    assert served(rbln)[0].rbln_use_w8a8 is True
    assert refused(gpu=True, serve_extra_args=["--rbln-use-w8a8"]).startswith(
        "serve_extra_args: --rbln-use-w8a8 is not a flag of vllm serve (vLLM 0.30.0);"
    )
    gpu = plan(gpu=True, serve_extra_args=["--enable-log-requests"])
    assert served(gpu)[0].enable_log_requests is True
    assert gpu.spec.compile_fingerprint is None  # nothing compiles on GPU hosts


def test_extra_env_accepted_refused_and_overridden() -> None:
    base = plan()
    p = plan(serve_extra_env={"VLLM_LOGGING_LEVEL": "DEBUG", "OMP_NUM_THREADS": 4})
    _, _, env = served(p)
    assert env["VLLM_LOGGING_LEVEL"] == "DEBUG" and env["OMP_NUM_THREADS"] == "4"
    assert SIM.unknown_env_vars(env, "rbln") == []  # vLLM would warn of no variable
    assert p.instances[0].sha != base.instances[0].sha
    assert plan(serve_extra_env="VLLM_LOGGING_LEVEL=DEBUG,OMP_NUM_THREADS=4").instances == (
        p.instances
    )
    assert refused(serve_extra_env={"VLLM_LOGING_LEVEL": "DEBUG"}) == (
        "serve_extra_env: VLLM_LOGING_LEVEL is not a variable vLLM 0.30.0 with vllm-rbln 0.12.0 "
        "knows; did you mean VLLM_LOGGING_LEVEL?"
    )
    assert refused(serve_extra_env={"VLLM_ENGINE_READY_TIMEOUT_S": "60"}) == (
        "serve_extra_env: VLLM_ENGINE_READY_TIMEOUT_S is set by the recipe already "
        "(VLLM_ENGINE_READY_TIMEOUT_S=9600); allowed: add VLLM_ENGINE_READY_TIMEOUT_S to "
        "serve_override_args to replace the recipe's value"
    )
    for name, key in [("VLLM_API_KEY", "creds_api_key_env"), ("RBLN_VISIBLE_DEVICES", "the host")]:
        assert refused(serve_extra_env={name: "x"}).startswith(
            f"serve_extra_env: {name} is set by the deploy; allowed: set {key}"
        )
    over = plan(
        serve_extra_env={"VLLM_ENGINE_READY_TIMEOUT_S": "60"},
        serve_override_args="VLLM_ENGINE_READY_TIMEOUT_S",
    )
    _, _, env = served(over)
    assert env["VLLM_ENGINE_READY_TIMEOUT_S"] == "60"
    assert list(env) == list(served(base)[2])  # replaced where the recipe had it
    assert refused(gpu=True, serve_extra_env={"VLLM_RBLN_SAMPLER": "0"}).startswith(
        "serve_extra_env: VLLM_RBLN_SAMPLER is not a variable vLLM 0.30.0 knows"
    )


# -- the path guard (#46 item 1) -------------------------------------------------------------


@pytest.mark.parametrize("gpu", [False, True], ids=["rbln", "gpu"])
def test_every_server_runs_the_path_guard_with_the_open_paths_of_the_data(gpu: bool) -> None:
    p = plan(gpu, serve_open_paths=["/v1/", "/health", "/ping"])
    for index in range(len(p.instances)):
        ns, argv, env = served(p, index)
        assert ns.middleware == ["servefleet_paths.OpenPaths"] and argv[-2:] == list(GUARD_ARGS)
        assert env["SERVEFLEET_OPEN_PATHS"] == "/v1/ /health /ping"
        assert env["PYTHONPATH"] == "/opt/servefleet/lib/asgi"  # root's, the guard's only
    assert "/opt/servefleet/lib/asgi/servefleet_paths.py" in watched_paths(p.settings)


def test_a_headless_rank_serves_no_api_and_runs_no_guard() -> None:
    p = plan()
    server = dataclasses.replace(p.spec.servers[0], argv=[*p.spec.servers[0].argv, "--headless"])
    argv, env = instance_command(p.settings, p.spec, p.release, 0, "0", server=server)
    assert "--middleware" not in argv and "--port" not in argv
    assert "SERVEFLEET_OPEN_PATHS" not in env and "PYTHONPATH" not in env


def test_the_operators_pythonpath_comes_after_the_guards() -> None:
    p = plan(serve_extra_env={"PYTHONPATH": "/srv/mine"})
    _, _, env = served(p)
    assert env["PYTHONPATH"] == "/opt/servefleet/lib/asgi:/srv/mine"


def test_the_open_paths_are_set_by_serve_open_paths_only() -> None:
    message = refused(serve_extra_env={"SERVEFLEET_OPEN_PATHS": "/"})
    assert message.startswith("serve_extra_env: SERVEFLEET_OPEN_PATHS is set by the deploy")
    assert "set serve_open_paths instead" in message
