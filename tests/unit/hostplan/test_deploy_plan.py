"""The deploy's pure core: data validation, release plans, host plans, rendered units, data docs."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from host_inputs import probe, settings
from repo_paths import REPO
from systemd_parse import parse_unit

from servefleet.base.errors import DataError
from servefleet.entry.cli import main
from servefleet.fleet.datadoc import BEGIN, END, data_table
from servefleet.hostplan.extras import resolve_for
from servefleet.hostplan.instance_unit import GUARD_ARGS
from servefleet.hostplan.plan import plan_host
from servefleet.hostplan.probe_input import watched_paths
from servefleet.platforms.rbln import hardware_from_probe
from servefleet.release.plan import plan_release
from servefleet.settings.table import load_defaults, settings_from

TINY = REPO / "tests" / "data" / "rbln" / "tiny-moe.json"
PINS = load_defaults()["sdk_pins"]


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        (
            "sdk_pins",
            ["rebel-compiler>=0.12.0", "vllm-rbln==0.12.0"],
            "sdk_pins: 'rebel-compiler>=0.12.0' is not an exact pin",
        ),
        (
            "serve_target",
            "Fast",
            "serve_target: 'Fast' is not a target; allowed: Latency, Throughput",
        ),
        ("serve_base_port", "eighty", "serve_base_port: expected a whole number"),
        ("serve_selection", "lmcache", "serve_selection: expected AXIS=VALUE pairs"),
        (
            "pip_indexes",
            {"rbln": {"url": "https://u:p@idx/simple", "packages": ["rebel-compiler"]}},
            "credentials do not belong in data",
        ),
        (
            "pip_indexes",
            {"x": {"url": "https://idx/simple", "packages": ["left-pad"]}},
            "left-pad has no pin in sdk_pins",
        ),
    ],
)
def test_bad_data_names_the_key(key: str, value: Any, message: str) -> None:
    with pytest.raises(DataError) as e:
        settings(**{key: value})
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_missing_credential_variable_names_it() -> None:
    data = load_defaults()
    with pytest.raises(
        DataError, match=r"creds_index_user_env: environment variable RBLN_INDEX_USER is not set"
    ):
        settings_from(data.get, {})


def test_target_is_case_insensitive() -> None:
    assert settings(serve_target="throughput").serve_target == "Throughput"


def test_release_owned_packages_come_only_from_their_index() -> None:
    s = settings()
    rel = plan_release(s, resolve_for(s), "/etc/servefleet/secrets/netrc")
    by_name = {d.name: d.index for d in rel.downloads}
    assert by_name["rebel-compiler"] == "https://pypi.rbln.ai/simple"
    assert by_name["vllm"] == "https://wheels.vllm.ai/0.30.0/cpu"
    assert by_name["torch"] == "https://download.pytorch.org/whl/cpu"
    # LMCache off: no kv-connectors extra, and its packages are neither fetched nor constrained
    assert "lmcache-rbln" not in by_name and "nixl-rbln" not in by_name
    assert rel.requirements == ["vllm-rbln==0.12.0"]
    assert not any(
        c.startswith(("rebel-compiler", "lmcache-rbln", "vllm==", "torch=="))
        for c in rel.constraints
    )
    assert "transformers==5.15.1" in rel.constraints
    assert rel.netrc == "/etc/servefleet/secrets/netrc"


def test_release_kv_offload_and_suffix_decoding() -> None:
    s = settings(serve_selection={"lmcache": "cpu", "spec_decode": "suffix"})
    rel = plan_release(s, resolve_for(s), None)
    assert rel.requirements == ["vllm-rbln[kv-connectors]==0.12.0", "arctic-inference==0.1.1"]
    assert {"lmcache-rbln", "nixl-rbln"} <= {d.name for d in rel.downloads}
    assert {"lmcache_rbln", "arctic_inference"} <= set(rel.imports)
    assert {"lmcache-rbln", "arctic-inference"} <= set(rel.must_have)


def test_release_id_follows_pins_and_indexes() -> None:
    base = settings()
    spec = resolve_for(base)
    ids = {
        plan_release(base, spec, None).id,
        plan_release(
            settings(sdk_pins=[p.replace("0.12.0", "0.12.1") for p in load_defaults()["sdk_pins"]]),
            spec,
            None,
        ).id,
        plan_release(settings(pip_public_index="https://mirror.invalid/simple"), spec, None).id,
    }
    assert len(ids) == 3
    assert (
        plan_release(base, spec, None).id
        == plan_release(settings(), resolve_for(settings()), None).id
    )


def test_hardware_from_lspci_then_rbln_smi() -> None:
    hw = hardware_from_probe(probe())
    assert (hw.source, hw.sku, hw.devices, hw.driver_version) == (
        "lspci",
        "RBLN-CR13",
        (0, 1, 2, 3),
        None,
    )
    smi = {
        "KMD_version": "3.5.1",
        "devices": [
            {"npu": 0, "name": "RBLN-CR13", "device": "rbln0"},
            {"npu": 1, "name": "RBLN-CR13", "device": "rbln1"},
        ],
    }
    hw = hardware_from_probe(probe(smi=smi, pci=[]))
    assert (hw.source, hw.sku, hw.devices, hw.driver_version) == (
        "rbln-smi",
        "RBLN-CR13",
        (0, 1),
        "3.5.1",
    )


def test_host_plan_one_instance_per_npu_group() -> None:
    plan = plan_host(settings(), probe())
    assert plan.refusal is None and plan.driver_needed
    assert [(i.unit, i.port, i.devices) for i in plan.instances] == [
        (f"servefleet-vllm-{n}.service", 8000 + n, str(n)) for n in range(4)
    ]
    server = plan.spec.servers[0]
    for inst in plan.instances:
        argv, env = parse_unit(inst.text)
        assert argv == [
            f"{plan.release.path}/bin/vllm",
            *server.argv[1:],
            "--port",
            str(inst.port),
            "--shutdown-timeout",
            "60",
            *GUARD_ARGS,
        ]
        assert env == {
            **server.env,
            "PYTHONPATH": "/opt/servefleet/lib/asgi",
            "SERVEFLEET_OPEN_PATHS": "/v1/ /health /metrics /version",
            "RBLN_VISIBLE_DEVICES": inst.devices,
            "VLLM_CACHE_ROOT": "/var/cache/servefleet/vllm",
            "HOME": "/var/lib/servefleet",
            "HF_HOME": "/var/lib/servefleet/hf",
            "HF_HUB_OFFLINE": "1",
            "SERVEFLEET_UNIT": inst.sha,
        }


def test_host_plan_groups_npus_per_server(tmp_path: Path) -> None:
    plan = plan_host(settings(serve_recipe=str(TINY), serve_host="127.0.0.1"), probe())
    assert [i.devices for i in plan.instances] == ["0,1", "2,3"]
    argv, _ = parse_unit(plan.instances[1].text)
    assert argv[-8:] == ["--port", "8001", "--host", "127.0.0.1", "--shutdown-timeout", "60",
                         *GUARD_ARGS]  # fmt: skip


@pytest.mark.parametrize(
    ("data", "args"),
    [
        ({}, []),
        (
            {"serve_target": "Throughput", "serve_selection": {"lmcache": "cpu"}},
            ["--target", "throughput", "--set", "lmcache=cpu"],
        ),
        ({"serve_recommended": True}, ["--recommended"]),
        (
            {"serve_target": "Throughput", "serve_selection": {"spec_decode": "suffix"}},
            ["--target", "Throughput", "--set", "spec_decode=suffix"],
        ),
        (
            {"serve_recipe": str(TINY), "serve_selection": {"lmcache": "cpu"}},
            ["--set", "lmcache=cpu"],
        ),
        (
            {"sdk_pins": [p.replace("compiler==0.12.0", "compiler==0.12.1") for p in PINS]},
            ["--compiler-version", "0.12.1"],
        ),
    ],
)
def test_resolve_format_unit_is_the_deploys_instance_0(
    data: dict[str, Any], args: list[str]
) -> None:
    plan = plan_host(settings(**data), probe())
    recipe = data.get("serve_recipe", "rbln/gpt-oss-120b")
    result = CliRunner().invoke(main, ["resolve", recipe, *args, "--format", "unit"])
    assert result.exit_code == 0, result.output
    assert result.output == plan.instances[0].text


def test_host_plan_refuses_another_sku() -> None:
    plan = plan_host(settings(), probe(pci=["03:00.0 1200: 1eff:1250"]))
    assert (
        plan.refusal == "host SKU RBLN-CA25 is not one rbln/gpt-oss-120b is verified on (RBLN-CR13)"
    )
    assert "no RBLN NPU" in (plan_host(settings(), probe(pci=[])).refusal or "")


def test_host_plan_reads_state() -> None:
    s = settings()
    first = plan_host(s, probe())
    again = plan_host(
        s,
        probe(
            smi={
                "KMD_version": "3.5.1",
                "devices": [{"npu": n, "name": "RBLN-CR13"} for n in range(4)],
            },
            releases=[first.release.id],
            warm=[first.spec.compile_fingerprint],
            models=["openai/gpt-oss-120b"],
            units={
                "servefleet-vllm-0.service": {"active": "active"},
                "servefleet-vllm-7.service": {"active": "inactive"},
            },
        ),
    )
    assert not again.driver_needed and again.release_complete and again.warm
    assert again.missing_models == ()
    assert again.stale_units == ("servefleet-vllm-7.service",)
    assert again.active_units == {"servefleet-vllm-0.service"}


def test_docs_data_table_matches_the_key_table() -> None:
    doc = (REPO / "docs" / "data.md").read_text()
    assert BEGIN in doc and END in doc, "docs/data.md lacks the data-table markers"
    table = doc.split(BEGIN, 1)[1].split(END, 1)[0].strip() + "\n"
    assert table == data_table(), "docs/data.md is stale: run python -m servefleet.fleet.datadoc"


@pytest.mark.parametrize("kernel", ["6.1.0-18-amd64; rm -rf /", "6.1 0", "", "-x"])
def test_a_kernel_release_that_cannot_name_a_package_refuses_the_driver_step(kernel: str) -> None:
    plan = plan_host(settings(), probe(kernel=kernel))
    assert plan.refusal is not None and "kernel release" in plan.refusal
    assert plan_host(settings(), probe(kernel="6.1.0-18-amd64")).refusal is None


def test_the_preflight_checks_what_the_units_run_and_runs_once_per_release_and_argv() -> None:
    """#22: the pre-flight's input is each instance's ExecStart= and Environment=; its key
    covers the release and every command line, and a key that passed on the host (the probe's
    ``preflight`` list) is not checked again."""
    plan = plan_host(settings(), probe())
    from servefleet.render.systemd import environment_line, exec_line

    first = plan.instances[0]
    assert f"\nExecStart={exec_line(first.argv)}\n" in first.text and "--port" in first.argv
    for name, value in first.env:
        assert f"\nEnvironment={environment_line(name, value)}\n" in first.text
    assert plan.preflight_input[0] == {"unit": first.unit, "argv": list(first.argv),
                                       "env": dict(first.env)}  # fmt: skip
    assert plan.preflight_needed
    key = plan.preflight_key
    assert not plan_host(settings(), probe(preflight=[key])).preflight_needed
    other = plan_host(settings(serve_target="Throughput"), probe(preflight=[key]))
    assert other.preflight_key != key and other.preflight_needed


def test_serve_files_ship_with_the_release_and_the_argv_names_the_shipped_copy(
    tmp_path: Path,
) -> None:
    """#22: a file a command names (a chat template) ships into the release: its sha256 enters
    the release id, the argv names the shipped copy, and the probe watches it; a relative path
    neither serve_files nor the vllm wheel provides is refused at plan time in one line."""
    from servefleet.base.errors import DataError

    template = tmp_path / "tool_chat_template_x.jinja"
    template.write_text("{{ messages }}\n")
    extra = ["--chat-template", "examples/tool_chat_template_x.jinja"]
    with pytest.raises(DataError) as refused:
        plan_host(settings(serve_extra_args=extra), probe())
    line = str(refused.value)
    assert "\n" not in line and line.startswith("--chat-template examples/tool_chat_template_x")
    assert "serve_files" in line and "template_chatml.jinja" in line
    files = {"examples/tool_chat_template_x.jinja": str(template)}
    plain = plan_host(settings(), probe())
    plan = plan_host(
        settings(serve_extra_args=extra, serve_files=files, serve_files_root=str(tmp_path)), probe()
    )
    shipped = plan.release.files[0]
    assert shipped.sha256 == hashlib.sha256(template.read_bytes()).hexdigest()
    dest = f"{plan.release.path}/files/{shipped.name}"
    argv = plan.instances[0].argv
    assert argv[argv.index("--chat-template") + 1] == dest
    assert plan.release.id != plan_host(settings(serve_extra_args=extra[:0]), probe()).release.id
    assert dest in watched_paths(plan.settings, plan.release.id)
    template.write_text("{{ messages }} changed\n")  # other bytes: another release
    again = plan_host(
        settings(serve_extra_args=extra, serve_files=files, serve_files_root=str(tmp_path)), probe()
    )
    assert again.release.id not in (plan.release.id, plain.release.id)
    # a template the wheel ships and an absolute path need no serve_files
    for ok in ("template_chatml.jinja", "/srv/templates/x.jinja"):
        plan_host(settings(serve_extra_args=["--chat-template", ok]), probe())
