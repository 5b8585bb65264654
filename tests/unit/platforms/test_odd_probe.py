"""Odd probe output (issue #18 finding 14): every platform's parser raises the project's own error in
one line (or reads no device), never a TypeError or AttributeError that would abort the run."""

from __future__ import annotations

import json
from typing import Any

import pytest

from servefleet.base.errors import ProbeError, ServefleetError
from servefleet.kinds import platforms_of
from servefleet.kinds.vllm.kind import KIND as VLLM
from servefleet.platforms import Hardware, detect
from servefleet.platforms.rbln import PLATFORM as RBLN


def gpu_hardware(probe: dict[str, Any]) -> Hardware:
    """The devices a GPU host's probe shows, whichever GPU platform reads them."""
    return detect(platforms_of(VLLM), probe)[1]


ODD_SMI: list[Any] = [
    {"KMD_version": "3.5.1", "devices": [{"npu": None, "name": "RBLN-CR13"}]},
    {"KMD_version": "3.5.1", "devices": [{"npu": [0], "name": "RBLN-CR13"}]},
    {"KMD_version": "3.5.1", "devices": [{"npu": 10**30, "name": "RBLN-CR13"}]},
    {"KMD_version": "3.5.1", "devices": "all"},
    {"KMD_version": "3.5.1", "devices": [5]},
    {"KMD_version": ["3.5.1"], "devices": []},
    ["not", "an", "object"],
]


@pytest.mark.parametrize("smi", ODD_SMI)
def test_odd_rbln_smi_output_is_one_line(smi: Any) -> None:
    with pytest.raises(ProbeError) as e:
        RBLN.read({"smi": smi, "pci": []})
    assert str(e.value).startswith("rbln-smi -j: unexpected output") and "\n" not in str(e.value)


def test_odd_lspci_output_is_one_line() -> None:
    with pytest.raises(ProbeError):
        RBLN.read({"smi": None, "pci": [{"slot": 1}]})


ODD_AMD: list[Any] = [
    [{"gpu": 0, "asic": "N/A", "vram": "N/A", "driver": "N/A"}],
    {"gpu_data": [{"gpu": 0, "asic": {"market_name": "MI300X"}, "vram": {"size": "9" * 5000}}]},
]


@pytest.mark.parametrize("data", ODD_AMD)
def test_amd_smi_sections_it_cannot_read_are_no_crash(data: Any) -> None:
    hw = gpu_hardware({"gpus": [], "amd": [json.dumps(data)]})
    assert hw.devices == (0,) and hw.source == "amd-smi"


@pytest.mark.parametrize(
    "probe",
    [
        {"gpus": [{"index": 0}], "amd": []},
        {"gpus": ["9" * 5000 + ", H200, 1, 570"], "amd": []},
        {"gpus": None, "amd": [1, 2]},
        {"gpus": [], "amd": [json.dumps([{"gpu": "zero"}])]},
    ],
)
def test_odd_gpu_probe_output_reads_no_gpu_or_one_line(probe: dict[str, Any]) -> None:
    try:
        hw = gpu_hardware(probe)
    except ServefleetError as e:
        assert "\n" not in str(e)
    else:
        assert hw.devices == ()
