"""#47: a new hardware platform is one module plus data. ``tests/testplatform`` (a GPU no file
under ``src/`` names) is registered here and serves vLLM's recipes, unchanged, through the same
probe and planner as NVIDIA and AMD hosts: the probe runs its command when nvidia-smi lists no
GPU, ``plan_host`` decides the host's platform from what it read, and its units get its devices
variable. The key it alone reads is refused on a host of another platform by the host plan."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from host_inputs import CREDS, GPU_DATA, gpu_probe
from repo_paths import REPO

from servefleet.base.errors import DataError
from servefleet.hostplan.extras import resolve_for
from servefleet.hostplan.plan import plan_host
from servefleet.hostplan.probe_input import probe_args
from servefleet.kinds import kind_of, platforms_of
from servefleet.platforms import register, unregister
from servefleet.settings.table import Settings, load_defaults, settings_from

sys.path.insert(0, str(REPO / "tests"))
from testplatform import Testgpu  # noqa: E402  (tests/ is not a package)

TWO = ["0 143771 7.1 NVIDIA H200", "1 143771 7.1 NVIDIA H200"]


@pytest.fixture
def testgpu(tmp_path: Path) -> Iterator[Testgpu]:
    """The test platform, registered for the test only."""
    made = Testgpu(str(tmp_path))
    register(made)
    yield made
    unregister(made)


def data(**over: object) -> Settings:
    values = {**load_defaults(), **GPU_DATA, **over}
    return settings_from(values.get, CREDS, keys=[*GPU_DATA, *over])


def test_it_serves_the_vllm_family_through_the_probe_and_the_planner(testgpu: Testgpu) -> None:
    s = data(driver_version="7.1")  # accepted: a platform of the family reads it
    assert [p.name for p in platforms_of(kind_of(s.serve_recipe))] == ["nvidia", "amd", "testgpu"]
    commands = json.loads(probe_args(s, resolve_for(s), False))["accelerators"]
    assert commands[-1] == ["testgpus", ["cat", f"{testgpu.state}/gpus"], "lines", "gpus"]
    plan = plan_host(s, gpu_probe([], testgpus=TWO))
    assert plan.platform is testgpu and plan.refusal is None and not plan.driver_needed
    assert plan.hardware.source == "testgpu-list" and plan.hardware.memory_mib == (143771,) * 2
    unit = plan.instances[0].text
    assert 'Environment="TESTGPU_VISIBLE_DEVICES=0"' in unit and "CUDA_VISIBLE" not in unit
    assert json.loads(json.dumps(plan.desired_state()))["devices_env"] == "TESTGPU_VISIBLE_DEVICES"
    other = plan_host(s, gpu_probe([], testgpus=["0 143771 6.0 NVIDIA H200"]))
    assert other.driver_needed and testgpu.driver_problem(s) == (
        "driver_version: servefleet installs no testgpu driver; allowed: the driver the host "
        "has (wanted 7.1)"
    )


def test_the_key_it_alone_reads_is_refused_on_an_nvidia_host_by_the_plan(
    testgpu: Testgpu,
) -> None:
    s = data(driver_version="7.1")
    with pytest.raises(DataError) as e:
        plan_host(s, gpu_probe())  # nvidia-smi lists 8 H200s: an NVIDIA host
    assert str(e.value) == (
        "driver_version: read by the rbln or testgpu platform only; this host's platform is "
        "nvidia; allowed: unset on this host"
    )
    assert plan_host(data(), gpu_probe()).platform.name == "nvidia"
