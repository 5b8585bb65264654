"""The lab's model store without a lab: what lab/simulator/build.py puts in it (the recipes'
models, drafts included, and ``lab up --models`` ids), its manifest, the artifact cache keyed by
the added models, and a store served by the lab's file server that the fetcher fetches from and
``servefleet lab models`` lists."""

from __future__ import annotations

import hashlib
import json
import re
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from fetch_stubs import fetch, write_token

from servefleet.base.remote import snapshot_place, tar_safety
from servefleet.fleet.lab import fleet
from servefleet.fleet.lab.artifacts import ensure_artifacts
from servefleet.fleet.lab.cli import lab
from servefleet.fleet.lab.index import Config, make_server
from servefleet.fleet.lab.simulator import (
    build as lab_build,
    inputs as lab_inputs,
    store as lab_store,
)
from servefleet.fleet.lab.state import LabError

ADDED = ["acme/extra-1", "Zeta.org/model_v2.1"]
TOKEN = "hf_lab-unit-token"


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("lab-cache")


@pytest.fixture(scope="module")
def builds(cache: Path) -> dict[str, tuple[Path, dict[str, Any]]]:
    """The default build and one with ADDED, through the cache ``lab up`` uses."""
    return {"default": ensure_artifacts(cache), "added": ensure_artifacts(cache, ADDED)}


def _store(out: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / "files" / "models" / "manifest.json").read_text())
    return data


# --- what the store holds ------------------------------------------------------------------------
def test_the_store_manifest_lists_every_archive_with_its_sha256_and_revision(
    builds: dict[str, tuple[Path, dict[str, Any]]],
) -> None:
    out, manifest = builds["added"]
    store = _store(out)
    assert list(store) == ["models"]
    assert set(store["models"]) == set(lab_store.recipe_models()) | set(ADDED)
    for model, entry in store["models"].items():
        org, name = model.split("/")
        assert entry["path"] == f"{org}/{name}.tar.gz"
        archive = out / "files" / "models" / entry["path"]
        assert hashlib.sha256(archive.read_bytes()).hexdigest() == entry["sha256"]
        assert entry["revision"] == lab_store.model_revision(model)
        # the top manifest keeps its paths relative to files/
        assert manifest["models"][model] == dict(entry, path=f"models/{entry['path']}")


@pytest.mark.parametrize("model", ADDED)
def test_added_archives_are_hf_snapshots_the_fetcher_accepts(
    model: str, builds: dict[str, tuple[Path, dict[str, Any]]]
) -> None:
    out, _ = builds["added"]
    entry = _store(out)["models"][model]
    top = snapshot_place.repo_dir_name(model)
    with tarfile.open(out / "files" / "models" / entry["path"]) as tar:
        members = tar.getmembers()
        assert tar_safety.unsafe_member(members, top) is None
        refs = tar.extractfile(f"{top}/refs/main")
        assert refs is not None and refs.read().decode() == entry["revision"]
        names = {m.name for m in members}
    assert f"{top}/snapshots/{entry['revision']}/config.json" in names


def test_the_default_store_holds_only_the_recipes_models(
    builds: dict[str, tuple[Path, dict[str, Any]]],
) -> None:
    out, manifest = builds["default"]
    assert sorted(_store(out)["models"]) == lab_store.recipe_models() == sorted(manifest["models"])
    assert not set(ADDED) & set(manifest["models"])


def test_added_models_are_their_own_cached_build_beside_the_default(
    cache: Path, builds: dict[str, tuple[Path, dict[str, Any]]]
) -> None:
    default, added = builds["default"][0], builds["added"][0]
    assert default.parent == added.parent == cache / "artifacts"
    assert added.name.startswith(default.name + "-")
    start = time.monotonic()
    again = [ensure_artifacts(cache, list(reversed(ADDED)) + ADDED[:1]), ensure_artifacts(cache)]
    assert time.monotonic() - start < 2, "a warm lab up rebuilt the artifacts"
    assert [path for path, _ in again] == [added, default]
    assert sorted(p.name for p in (cache / "artifacts").iterdir()) == sorted(
        [default.name, added.name]
    )


def test_the_builder_refuses_unsafe_model_ids(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"not model ids ORG/NAME .*'\.\./etc'"):
        lab_build.build(tmp_path / "out", ["acme/ok", "../etc"])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("bad", ["../etc", "acme/..", "acme", "a/b/c", "acme/a b", "/abs/x"])
def test_lab_up_models_are_checked_as_the_fetcher_checks_them(bad: str) -> None:
    with pytest.raises(LabError, match=r"^--models: .* is not a model id ORG/NAME"):
        fleet.check_models(["acme/ok", bad])


def test_check_models_sorts_and_dedups() -> None:
    assert fleet.check_models(["b/y", "a/x", "b/y"]) == ["a/x", "b/y"]


# --- recipe_models -------------------------------------------------------------------------------
def test_recipe_models_counts_every_speculative_draft(tmp_path: Path) -> None:
    (tmp_path / "rbln").mkdir()
    card = {
        "model": "org/served",
        "servers": [
            {"argv": ["--speculative-config", '{"model": "org/draft-list", "method": "eagle3"}']},
            {"argv": ['--speculative-config={"model": "org/draft-equals"}']},
            {
                "flags": {
                    "--speculative-config": '--speculative-config \'{\n"model": "org/d-str"}\''
                }
            },
            {"flags": {"--speculative-config": '{"model": "org/draft-bare-json"}'}},
            {"argv": ["--speculative-config", '{"method": "suffix"}']},
        ],
    }
    (tmp_path / "rbln" / "card.json").write_text(json.dumps(card))
    models = tmp_path / "vllm" / "models" / "org"
    models.mkdir(parents=True)
    (models / "m.yaml").write_text(
        "model:\n  model_id: org/yaml-model\n"
        "variants:\n  fp8:\n    model_id: org/yaml-variant\n"
        "features:\n  spec:\n    args:\n      - --speculative-config\n"
        '      - \'{"model": "org/yaml-draft", "num_speculative_tokens": 3}\'\n'
        'guide: |\n  vllm serve x --speculative-config \'{"model": "org/only-in-guide"}\'\n'
    )
    found = set(lab_store.recipe_models(tmp_path))
    assert found == set(lab_store.RBLN_MODELS) | {
        "org/served",
        "org/draft-list",
        "org/draft-equals",
        "org/d-str",
        "org/draft-bare-json",
        "org/yaml-model",
        "org/yaml-variant",
        "org/yaml-draft",
    }


def test_every_draft_the_shipped_recipes_name_is_in_the_store() -> None:
    named = set()
    for path in lab_inputs.RECIPES.rglob("*"):
        if path.suffix in (".json", ".yaml") and "speculative" in path.read_text():
            text = path.read_text().replace('\\"', '"')
            named.update(re.findall(r'"model"\s*:\s*"([\w.-]+/[\w.-]+)"', text))
    assert named and named <= set(lab_store.recipe_models())


# --- served and fetched --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def store_url(builds: dict[str, tuple[Path, dict[str, Any]]]) -> Iterator[str]:
    """The added build's files/ served by the lab's file server (Bearer token on /models/)."""
    config = Config("static", builds["added"][0] / "files", token=("/models/", TOKEN))
    server = make_server(config, "127.0.0.1", 0)
    server.RequestHandlerClass.log_message = lambda *args: None  # type: ignore[method-assign]
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/models"
    server.shutdown()
    server.server_close()


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    return write_token(tmp_path / "hf-token", TOKEN)


def test_an_added_model_is_served_and_fetched_complete(
    store_url: str, token_file: Path, tmp_path: Path
) -> None:
    home = tmp_path / "hf"
    token = ["--token-file", str(token_file), "--token-env", "HF_TOKEN"]
    proc = fetch(home, "--store", store_url, *token, model=ADDED[1])
    assert proc.returncode == 0, proc.stderr
    repo = home / "hub" / snapshot_place.repo_dir_name(ADDED[1])
    rev = lab_store.model_revision(ADDED[1])
    assert (repo / snapshot_place.MARKER).read_text() == rev
    config = json.loads((repo / "snapshots" / rev / "config.json").read_text())
    assert config["_name_or_path"] == ADDED[1]


def test_lab_models_lists_what_the_store_serves(
    store_url: str,
    token_file: Path,
    builds: dict[str, tuple[Path, dict[str, Any]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    state = {"model_store": {"url": store_url + "/"}, "secrets": {"HF_TOKEN": str(token_file)}}
    monkeypatch.setattr("servefleet.fleet.lab.state.load_state", lambda: state)
    result = CliRunner().invoke(lab, ["models"])
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.output.splitlines()]
    store = _store(builds["added"][0])["models"]
    assert rows == [[m, e["revision"], e["sha256"]] for m, e in sorted(store.items())]


def test_lab_models_with_a_wrong_token_is_one_line(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrong = tmp_path / "wrong"
    wrong.write_text("hf_wrong\n")
    state = {"model_store": {"url": store_url + "/"}, "secrets": {"HF_TOKEN": str(wrong)}}
    monkeypatch.setattr("servefleet.fleet.lab.state.load_state", lambda: state)
    result = CliRunner().invoke(lab, ["models"])
    assert result.exit_code == 2
    assert (
        result.output.strip()
        == f"servefleet lab: the model store refused the token in {wrong} (401)"
    )


def test_lab_up_passes_every_models_id_on(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def fake_up(*args: Any, models: list[str], **kwargs: Any) -> dict[str, Any]:
        seen["models"] = fleet.check_models(models)
        return {"hosts": []}

    monkeypatch.setattr(fleet, "up", fake_up)
    result = CliRunner().invoke(lab, ["up", "--models", "b/y, a/x", "--models", "c/z,"])
    assert result.exit_code == 0, result.output
    assert seen["models"] == ["a/x", "b/y", "c/z"]
    result = CliRunner().invoke(lab, ["up", "--models", "a/x,../etc"])
    assert result.exit_code == 2
    assert result.output.strip() == (
        "servefleet lab: --models: '../etc' is not a model id ORG/NAME of [A-Za-z0-9._-] (no '..')"
    )
