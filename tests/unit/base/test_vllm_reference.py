"""The vLLM version seam (``base/vllm_reference.py``): each version's reference data, its files by
what they are and its facts, and a release's pins mapped to the version whose data it takes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from servefleet.base import vllm_reference as vr
from servefleet.base.errors import DataError
from servefleet.settings.table import DEFAULTS


def test_the_default_is_known_and_each_known_version_reads_whole() -> None:
    assert vr.DEFAULT in vr.known()
    for version in vr.known():
        ref = vr.reference(version)
        assert ref.version == version and ref.root.name == version
        assert set(ref.tables) == {"rbln", "upstream"}
        # every file of the directory but the manifest is named by it, and each is there
        assert {p.name for p in ref.files()} == {p.name for p in ref.root.iterdir()} - {vr.MANIFEST}
        for table in ref.tables.values():
            assert json.loads(table.flags.read_text())["vllm"] == version
            envs = json.loads(ref.envs.read_text())
            assert all(envs[group] for group in table.env_groups)
        assert json.loads(ref.parsers.read_text())["vllm"] == version


def test_the_facts_servefleet_relied_on_in_code_are_the_datas() -> None:
    """The values kinds/roles.py and the exposure held in code before the seam."""
    ref = vr.reference()
    assert ref.rendezvous_ports == {"--master-port": 29501, "--data-parallel-rpc-port": 29550,
                                    "": 29500}  # fmt: skip
    assert ref.guarded_prefixes == ("/v1", "/v2", "/inference", "/cohere")
    assert ref.shown == f"vLLM {vr.DEFAULT}"
    assert ref.key_guards("/v1/chat/completions") and not ref.key_guards("/invocations")
    guarded = {r.path for r in ref.routes if r.guarded}
    assert guarded and all(ref.key_guards(p) for p in guarded)
    assert not any(ref.key_guards(r.path) for r in ref.routes if not r.guarded)


def test_the_default_open_paths_are_routes_of_the_version() -> None:
    """``serve_open_paths``' default names what vLLM serves: each path a route, or the prefix of
    one (``/v1/``)."""
    paths = {r.path for r in vr.reference().routes}
    for open_path in DEFAULTS["serve_open_paths"]:
        if open_path.endswith("/"):
            assert any(p.startswith(open_path) for p in paths), open_path
        else:
            assert open_path in paths, open_path


@pytest.mark.parametrize("pin", [vr.DEFAULT, f"{vr.DEFAULT}+cpu", vr.DEFAULT.rsplit(".0", 1)[0]])
def test_a_pin_of_a_known_version_takes_its_data(pin: str) -> None:
    assert vr.version_of({"vllm": pin, "torch": "2.13.0"}) == vr.DEFAULT


@pytest.mark.parametrize(
    ("pins", "message"),
    [
        ({"vllm": "0.99.0"}, "sdk_pins: vllm==0.99.0: servefleet has no reference data for vLLM "
                             "0.99.0 (known: {known})"),
        ({"vllm": "0.99.0+cpu"}, "sdk_pins: vllm==0.99.0+cpu: servefleet has no reference data "
                                 "for vLLM 0.99.0 (known: {known})"),
        ({"torch": "2.13.0"}, "sdk_pins: no vllm pin, so no vLLM version to check against; "
                              "allowed: vllm==X with X one servefleet has reference data for "
                              "({known})"),
        ({"vllm": "latest"}, "sdk_pins: vllm==latest is not a version"),
    ],
)  # fmt: skip
def test_a_pin_without_data_is_refused_in_one_line(pins: dict[str, str], message: str) -> None:
    with pytest.raises(DataError) as info:
        vr.version_of(pins)
    assert str(info.value) == message.format(known=", ".join(vr.known()))


def test_an_unknown_version_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(DataError, match=r"no reference data for vLLM 0\.99\.0 \(known: "):
        vr.reference("0.99.0")


def test_a_new_version_is_a_directory_of_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copy of the default's directory under another version's name is read as that version,
    with no code change: found by :func:`known`, taken by a pin of it."""
    top = tmp_path / "vllm"
    shutil.copytree(vr.reference().root, top / vr.DEFAULT)
    new = top / "0.99.0"
    shutil.copytree(vr.reference().root, new)
    manifest = json.loads((new / vr.MANIFEST).read_text())
    manifest["vllm"] = "0.99.0"
    (new / vr.MANIFEST).write_text(json.dumps(manifest))
    monkeypatch.setattr(vr, "VLLM_REFERENCE_DIR", top)
    vr.reference.cache_clear()
    try:
        assert vr.known() == (vr.DEFAULT, "0.99.0")
        assert vr.version_of({"vllm": "0.99.0"}) == "0.99.0"
        ref = vr.reference("0.99.0")
        assert ref.root == new and ref.shown == "vLLM 0.99.0"
        assert ref.rendezvous_ports == vr.reference().rendezvous_ports
        (new / vr.MANIFEST).write_text(json.dumps(dict(manifest, metrics="../elsewhere.json")))
        vr.reference.cache_clear()
        with pytest.raises(DataError, match="metrics names '../elsewhere.json', not a file"):
            vr.reference("0.99.0")
    finally:
        vr.reference.cache_clear()
