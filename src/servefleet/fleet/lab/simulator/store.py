"""The lab's model store: every model the shipped recipes name (drafts included) and each
model added, as a HF hub cache snapshot archive ``<org>/<name>.tar.gz``, and the store's
``manifest.json`` that the fetcher checks."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from servefleet.base.remote import layout

from .archives import file_sha256, write_tgz
from .inputs import RECIPES

RBLN_MODELS = ["openai/gpt-oss-120b", "nvidia/gpt-oss-120b-Eagle3-v3"]
SPECULATIVE_KEYS = ("--speculative-config", "speculative_config", "speculative-config")


def _speculative_models(text: str) -> Iterator[str]:
    try:
        conf = json.loads(text)
    except json.JSONDecodeError:
        return
    if isinstance(conf, dict) and isinstance(conf.get("model"), str):
        yield conf["model"]


def _walk(node: Any) -> Iterator[str]:
    """Model ids in a parsed recipe: ``model_id``/``model`` keys and speculative drafts."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("model_id", "model") and isinstance(value, str) and "/" in value:
                yield value
            if key in SPECULATIVE_KEYS and isinstance(value, str):
                yield from _speculative_models(value)  # a bare JSON value
            yield from _walk(value)
    elif isinstance(node, list):
        for i, item in enumerate(node):
            if item == "--speculative-config" and i + 1 < len(node):
                yield from _speculative_models(str(node[i + 1]))
            elif isinstance(item, str) and item.startswith("--speculative-config="):
                yield from _speculative_models(item.partition("=")[2])
            else:
                yield from _walk(item)
    elif isinstance(node, str):
        for m in re.finditer(r"--speculative-config[ =]'(\{.*?\})'", node, re.S):
            yield from _speculative_models(m.group(1))


def recipe_models(recipes: Path = RECIPES) -> list[str]:
    """Every model the shipped recipes name: the RBLN card's model and draft, each vLLM
    recipe's ``model_id`` (variants included) and every speculative draft model.

    + recipes: the recipes directory
    """
    import yaml

    models: set[str] = set(RBLN_MODELS)
    for path in sorted((recipes / "rbln").glob("*.json")):
        models.update(_walk(json.loads(path.read_text())))
    for path in sorted((recipes / "vllm" / "models").rglob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        for key in ("guide",):
            if isinstance(data, dict):
                data.pop(key, None)
        models.update(_walk(data))
    return sorted(m for m in models if is_model_id(m))


def is_model_id(model: str) -> bool:
    """Whether model is a model id as the fetcher takes them (the host contract's rule)."""
    return bool(layout.MODEL_ID.fullmatch(model))


def model_revision(model: str) -> str:
    return hashlib.sha1(f"servefleet-lab-sim:{model}".encode()).hexdigest()


def build_model(models_dir: Path, model: str) -> Path:
    """``<org>/<name>.tar.gz`` holding ``models--<org>--<name>/{refs/main,snapshots/<rev>/...}``.

    + models_dir: OUT/files/models
    + model: org/name
    """
    org, name = model.split("/")
    rev = model_revision(model)
    repo = f"models--{org}--{name}"
    config = {
        "_name_or_path": model,
        "architectures": ["SimulatedForCausalLM"],
        "model_type": "servefleet-lab-simulation",
        "servefleet_lab_simulation": True,
    }
    weights = f"servefleet lab simulation: stand-in weights of {model}\n".encode()
    members: list[tuple[str, bytes | None]] = [
        (repo, None),
        (f"{repo}/refs", None),
        (f"{repo}/refs/main", rev.encode()),
        (f"{repo}/snapshots", None),
        (f"{repo}/snapshots/{rev}", None),
        (f"{repo}/snapshots/{rev}/config.json", (json.dumps(config, indent=2) + "\n").encode()),
        (f"{repo}/snapshots/{rev}/model.safetensors", weights),
    ]
    path = models_dir / org / f"{name}.tar.gz"
    write_tgz(path, members)
    return path


def build_store(models_dir: Path, models: list[str]) -> dict[str, dict[str, str]]:
    """The model store: an archive of each model and ``manifest.json``; returns its entries.

    + models_dir: OUT/files/models (served as the store's URL)
    + models: org/name ids
    """
    entries = {}
    for model in sorted(set(models)):
        path = build_model(models_dir, model)
        entries[model] = {
            "path": path.relative_to(models_dir).as_posix(),
            "sha256": file_sha256(path),
            "revision": model_revision(model),
        }
    text = json.dumps({"models": entries}, indent=2, sort_keys=True) + "\n"
    (models_dir / "manifest.json").write_text(text)
    return entries
