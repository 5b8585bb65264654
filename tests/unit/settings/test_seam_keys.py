"""#47: a key the host's data sets (to other than its default) must be read by the host's recipe
family or its hardware platform: one that only another family or platform reads is refused in
one line naming the key, who reads it and what this host is, by the settings every command
reads before any host change (and by the host plan, once the probe decided the platform)."""

from __future__ import annotations

from typing import Any

import pytest
from host_inputs import CREDS, GPU_DATA

from servefleet.base.errors import DataError
from servefleet.settings.table import Settings, load_defaults, settings_from


def keyed(base: dict[str, Any], **over: Any) -> Settings:
    """Settings of data that sets ``base`` and ``over`` (the rest are defaults), as the deploys
    read a host's data: with the keys it has."""
    data = {**load_defaults(), **base, **over}
    return settings_from(data.get, CREDS, keys=[*base, *over])


def gpu(**over: Any) -> Settings:
    return keyed(GPU_DATA, **over)


def rbln(**over: Any) -> Settings:
    return keyed({"serve_recipe": "rbln/gpt-oss-120b"}, **over)


@pytest.mark.parametrize(
    ("make", "over", "line"),
    [
        (gpu, {"serve_target": "Throughput"},
         "serve_target: read by the rbln recipe family only; this host's recipe family is vllm; "
         "allowed: unset on this host, or a serve_recipe of the rbln family"),
        (gpu, {"serve_recommended": True}, "serve_recommended: read by the rbln recipe family"),
        (gpu, {"driver_version": "3.6.0"},
         "driver_version: read by the rbln platform only; this host's platform is nvidia or amd; "
         "allowed: unset on this host"),
        (gpu, {"serve_prewarm_timeout": 60}, "serve_prewarm_timeout: read by the rbln platform"),
        (rbln, {"serve_hardware": "h200"},
         "serve_hardware: read by the vllm recipe family only; this host's recipe family is rbln"),
        (rbln, {"serve_load_timeout": 60},
         "serve_load_timeout: read by the nvidia or amd platform only; this host's platform is "
         "rbln"),
    ],
)  # fmt: skip
def test_a_key_no_seam_of_the_host_reads_is_refused_in_one_line(
    make: Any, over: dict[str, Any], line: str
) -> None:
    with pytest.raises(DataError) as e:
        make(**over)
    assert str(e.value).startswith(line) and "\n" not in str(e.value)


def test_a_key_at_its_default_or_named_fleet_wide_is_accepted() -> None:
    """Set to its default it changes nothing; where the RBLN driver's runfiles are is named once
    for a mixed fleet (the lab's group data does), so every host accepts it."""
    assert gpu(serve_target="Latency").serve_target == "Latency"
    url = "https://files.example/rebellions-x86_64-{version}.run"
    assert gpu(driver_runfile_url=url).driver_runfile_url == url
    assert rbln(serve_target="Throughput").given == frozenset({"serve_target"})
    assert gpu(serve_features={"spec_decoding": "on"}).serve_features == {"spec_decoding": "on"}
