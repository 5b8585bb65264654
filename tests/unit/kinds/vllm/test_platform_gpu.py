"""GPU hosts through the same host plan: the vLLM recipe resolves for the host's GPUs, the
platform checks the GPU model and memory, the release is upstream vllm, units get
CUDA_VISIBLE_DEVICES and no compile pre-warm."""

from __future__ import annotations

import json
import re

import pytest
from host_inputs import GPU_DATA, H200, gpu_probe, gpu_settings
from systemd_parse import parse_unit

from servefleet.base.errors import DataError
from servefleet.hostplan.instance_unit import GUARD_ARGS
from servefleet.hostplan.plan import plan_host
from servefleet.hostplan.types import Place
from servefleet.kinds import find, kind_of as platform_for, platforms_of
from servefleet.kinds.vllm.kind import torch_backend
from servefleet.platforms.nvidia import read_csv as _nvidia
from servefleet.settings.table import load_defaults, settings_from

RECIPE = GPU_DATA["serve_recipe"]
H100 = [f"{i}, NVIDIA H100 80GB HBM3, 81559, 570.133.20" for i in range(8)]


def resolved(*features: str) -> list[str]:
    source, path = find(RECIPE)
    options = {"hardware": "h200", "features": list(features)}
    return source.resolve(path, RECIPE, None, options).servers[0].argv


def test_the_recipe_resolves_to_one_server_on_the_first_gpus() -> None:
    plan = plan_host(gpu_settings(), gpu_probe())
    assert plan.refusal is None and plan.platform.name == "nvidia"
    assert not plan.driver_needed and plan.warm and plan.spec.compile_fingerprint is None
    [inst] = plan.instances
    exec_argv, env = parse_unit(inst.text)
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and "RBLN_VISIBLE_DEVICES" not in env
    assert exec_argv[0] == f"{plan.release.path}/bin/vllm"
    assert exec_argv[1:] == [*resolved()[1:], "--port", "8000", "--shutdown-timeout", "60",
                             *GUARD_ARGS]  # fmt: skip
    state = plan.desired_state()
    assert state["devices_env"] == "CUDA_VISIBLE_DEVICES"
    assert state["prewarm_timeout"] == 1800 and state["instances"][0]["fingerprint"] == "-"


def test_the_release_is_upstream_vllm_at_its_pin() -> None:
    plan = plan_host(gpu_settings(), gpu_probe())
    rel = plan.release
    assert rel.requirements == ["vllm==0.30.0"] and rel.downloads == []
    assert rel.imports == ["vllm"] and "vllm" in rel.must_have
    assert "vllm-rbln" not in json.dumps(rel.to_json())


def test_eagle3_is_opt_in_and_brings_its_draft_model() -> None:
    off = plan_host(gpu_settings(), gpu_probe())
    on = plan_host(gpu_settings(serve_features={"spec_decoding": "on"}), gpu_probe())
    assert off.spec.requirements.models == ["openai/gpt-oss-120b"]
    assert on.spec.requirements.models == ["openai/gpt-oss-120b", "nvidia/gpt-oss-120b-Eagle3-v3"]
    assert on.spec.servers[0].argv == resolved("spec_decoding")
    assert on.instances[0].sha != off.instances[0].sha


def test_the_data_can_split_a_host_into_several_servers() -> None:
    plan = plan_host(gpu_settings(serve_instances=4), gpu_probe())
    assert [(i.port, i.devices) for i in plan.instances] == [
        (8000, "0"), (8001, "1"), (8002, "2"), (8003, "3")
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("lines", "why"),
    [
        (H100, "host GPUs NVIDIA H100 80GB HBM3 are not H200 (serve_hardware h200)"),
        ([], "no GPU found (nvidia-smi and amd-smi list none)"),
        (
            [f"{i}, NVIDIA H200, 40960, 570.133.20" for i in range(8)],
            "variant default needs 96 GB of GPU memory per server; 1 of this host's GPUs have 40 GB",
        ),
    ],
)
def test_a_host_with_other_gpus_is_refused_before_any_change(lines: list[str], why: str) -> None:
    plan = plan_host(gpu_settings(), gpu_probe(lines))
    assert plan.refusal is not None and why in plan.refusal


def test_a_vllm_pin_older_than_the_recipe_needs_is_refused() -> None:
    plan = plan_host(gpu_settings(sdk_pins=["vllm==0.9.2"]), gpu_probe())
    assert plan.refusal is not None
    assert re.fullmatch(
        r"sdk_pins: vllm==0\.9\.2 is older than the recipe's min_vllm_version 0\.10\.\d+",
        plan.refusal,
    )


def test_gpu_data_must_pin_vllm_and_rbln_data_its_sdk() -> None:
    with pytest.raises(DataError, match="sdk_pins: vllm must be pinned"):
        gpu_settings(sdk_pins=["torch==2.13.0"])
    data = load_defaults()
    data["sdk_pins"] = ["vllm==0.30.0"]
    with pytest.raises(DataError, match="sdk_pins: rebel-compiler must be pinned"):
        settings_from(data.get, {})
    assert [p.required_pins() for p in platforms_of(platform_for(RECIPE))] == [("vllm",)] * 2


def test_a_build_host_is_refused_for_gpu_recipes() -> None:
    with pytest.raises(DataError, match="serve_prewarm_host: nvidia hosts do not compile"):
        plan_host(gpu_settings(), gpu_probe(), place=Place(builder=True))


def test_nvidia_smi_csv_is_read_strictly() -> None:
    hw = _nvidia(H200[:2])
    assert hw is not None and hw.skus == ("NVIDIA H200", "NVIDIA H200")
    assert hw.devices == (0, 1) and hw.memory_mib == (143771, 143771)
    assert hw.driver_version == "570.133.20"
    assert _nvidia(["No devices were found"]) is None
    assert _nvidia(["0, NVIDIA H200, 143771 MiB, 570"]) is None  # units: not our query


def test_the_torch_backend_comes_from_the_recipes_install_line() -> None:
    source, path = find(RECIPE)
    from servefleet.kinds.vllm import load_vllm_recipe

    assert torch_backend(load_vllm_recipe(path).data) == "auto"
    pinned = {
        "model": {"install": {"pip": {"command": "uv pip install vllm --torch-backend cu130"}}}
    }
    assert torch_backend(pinned) == "cu130"
    assert torch_backend({"model": {}}) == ""


AMD_SMI = [
    {"gpu": i, "asic": {"market_name": "AMD Instinct MI300X"},
     "vram": {"type": "HBM", "size": {"value": 196592, "unit": "MB"}},
     "driver": {"name": "amdgpu", "version": "6.8.5"}}
    for i in range(8)
]  # fmt: skip


def test_amd_hosts_are_read_from_amd_smi_and_get_hip_visible_devices() -> None:
    probe_ = gpu_probe([], amd=json.dumps(AMD_SMI, indent=1).splitlines())
    plan = plan_host(gpu_settings(serve_hardware="mi300x"), probe_)
    assert plan.refusal is None and plan.hardware.source == "amd-smi"
    assert (
        plan.hardware.skus[0] == "AMD Instinct MI300X" and plan.hardware.driver_version == "6.8.5"
    )
    exec_argv, env = parse_unit(plan.instances[0].text)
    assert env["HIP_VISIBLE_DEVICES"] == "0" and "CUDA_VISIBLE_DEVICES" not in env
    assert env["VLLM_ROCM_USE_AITER"] == "1"  # the recipe's AMD override lands in the unit
    assert "ROCM_AITER_UNIFIED_ATTN" in exec_argv
    assert plan.desired_state()["devices_env"] == "HIP_VISIBLE_DEVICES"


def test_serve_features_take_the_command_line_form() -> None:
    assert gpu_settings(serve_features="spec_decoding=on,tool_calling=off").serve_features == {
        "spec_decoding": "on",
        "tool_calling": "off",
    }
