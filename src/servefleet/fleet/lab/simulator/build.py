#!/usr/bin/env python3
"""Builder of the simulator's package artifacts for the servefleet lab: a SIMULATION of the RBLN
stack.

``python3 build.py OUT [MODEL...]`` (or ``build(Path(OUT), models)``) writes, from the simulator
sources next to this file (``servefleet/fleet/lab/simulator/``, shipped in the servefleet wheel):

    OUT/index/private/   rebel-compiler, lmcache-rbln, nixl-rbln 0.12.0 + 0.12.1 (wheels)
    OUT/index/vllm/      vllm 0.30.0+cpu (the simulated server: console script ``vllm``), as
                         upstream builds it: manylinux_2_39 only (glibc >= 2.39)
    OUT/index/assets/    the same vllm 0.30.0+cpu tagged manylinux_2_35: RBLN's workaround source
                         for older glibc (vllm-rbln's release assets)
    OUT/index/torch/     torch 2.13.0+cpu
    OUT/index/public/    vllm-rbln, optimum-rbln, torch-rbln 0.12.0 + 0.12.1 (torch-rbln: one
                         cp310..cp314 manylinux_2_34 wheel per Python, as the real one),
                         arctic_inference-0.1.1.tar.gz (sdist) + the setuptools wheel it builds
                         with, the squatters (rebel-compiler 0.12.0, lmcache-rbln and
                         nixl-rbln 0.12.0.post1), and PyPI's CUDA builds that GPU hosts
                         install: vllm 0.30.0 (the same simulated server, as its CUDA build),
                         torch 2.13.0 and nixl 1.5.1 (for NixlConnector's prefill/decode);
                         and the REAL vllm-router and huggingface-hub wheels with their
                         dependencies (fetched once: they need no NPU, so they are not
                         simulated; every vllm requires huggingface-hub, as the real one)
    OUT/apt/             dkms and linux-headers-$(uname -r) stand-in .debs (not indexed)
    OUT/files/driver/    rebellions-x86_64-3.5.1.run, rebellions-x86_64-3.6.0.run
    OUT/files/models/    <org>/<name>.tar.gz: HF hub cache snapshots of every recipe model and
                         of each MODEL given, and manifest.json: the store's manifest
                         ``{"models": {"org/name": {"sha256", "revision", "path"}}}`` (path
                         relative to the store, ``org/name.tar.gz``) that the fetcher checks
    OUT/manifest.json    what is where, with sha256s (model paths relative to OUT/files)

Wheels and sdist are written directly (no build backend). Their content is pure Python, but the
wheels of packages that are platform wheels in reality carry the real platform tags (WHEEL's
``Tag:`` lines and ``Root-Is-Purelib: false`` match the file name), so a host's installer refuses
them where the real ones would not install (glibc too old, another Python). Nothing is
downloaded except, once, the setuptools wheel the sdist builds with and the real packages
(``pip download`` with the machine's own pip config, cached under
/var/cache/servefleet-lab/wheels). The output is keyed by
a hash of the simulator sources, the recipes, the kernel release and the MODELs: an unchanged
build returns at once.

The parts are the modules next to this file: ``inputs`` (where the sources are), ``archives``
(reproducible .tar.gz, sha256), ``wheels``, ``sdist``, ``fetched`` (the real wheels),
``debs``, ``runfiles`` and ``store`` (the model store).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import shutil
import sys
import tempfile
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if not __package__:  # ``python3 build.py``: the modules next to this file, as one package
    __package__ = "servefleet_lab_simulator"
    _package = sys.modules.setdefault(__package__, types.ModuleType(__package__))
    _package.__path__ = [str(Path(__file__).resolve().parent)]

from .archives import file_sha256  # noqa: E402
from .debs import build_debs, kernel_release  # noqa: E402
from .fetched import (  # noqa: E402
    HUB_REQUIREMENT,
    ROUTER_REQUIREMENT,
    host_uv_versions,
    host_uv_wheel,
    real_wheels,
    setuptools_wheel,
)
from .inputs import RECIPES, REFERENCE, SERVEFLEET, SIMULATOR  # noqa: E402
from .runfiles import build_runfiles  # noqa: E402
from .sdist import build_sdist  # noqa: E402
from .store import build_store, is_model_id, recipe_models  # noqa: E402
from .wheels import build_wheels  # noqa: E402

FORMAT = 2  # bump when the output layout changes


def source_key(models: Sequence[str] = ()) -> str:
    """Hash of everything the output depends on: simulator sources, recipes, the vLLM reference
    data, kernel release, the models added to the store."""
    added = ",".join(sorted(set(models)))
    uv = ",".join(host_uv_versions())
    h = hashlib.sha256(f"format={FORMAT} kernel={kernel_release()} models={added} uv={uv}".encode())
    paths = [p for p in SIMULATOR.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    paths += [p for p in RECIPES.rglob("*") if p.is_file()]
    paths += [p for p in REFERENCE.rglob("*") if p.is_file()]
    for path in sorted(paths):
        h.update(str(path.relative_to(SERVEFLEET)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _build_into(out: Path, key: str, models: Sequence[str]) -> dict[str, Any]:
    index = out / "index"
    build_wheels(index)
    build_sdist(index / "public")
    shutil.copy2(setuptools_wheel(), index / "public")
    for wheel in [*real_wheels(ROUTER_REQUIREMENT), *real_wheels(HUB_REQUIREMENT),
                  *map(host_uv_wheel, host_uv_versions())]:  # fmt: skip
        shutil.copy2(wheel, index / "public")
    headers = build_debs(out / "apt")
    files = out / "files"
    manifest: dict[str, Any] = {
        "source_key": key,
        "kernel_headers_package": headers,
        "driver": {},
        "models": {},
        "wheels": {},
        "debs": {},
    }
    for version, path in build_runfiles(files / "driver").items():
        rel = path.relative_to(files).as_posix()
        manifest["driver"][version] = {"path": rel, "sha256": file_sha256(path)}
    store = build_store(files / "models", [*recipe_models(), *models])
    for model, entry in store.items():
        manifest["models"][model] = dict(entry, path=f"models/{entry['path']}")
    for sub in sorted(p for p in index.iterdir() if p.is_dir()):
        manifest["wheels"][sub.name] = {
            p.name: {"sha256": file_sha256(p)} for p in sorted(sub.iterdir()) if p.is_file()
        }
    for deb in sorted((out / "apt").glob("*.deb")):
        manifest["debs"][deb.name] = {"sha256": file_sha256(deb)}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def build(out: Path, models: Sequence[str] = ()) -> dict[str, Any]:
    """Build the simulator's artifacts into ``out`` unless they are current; returns the manifest.

    + out: the output directory (replaced as a whole when the sources changed)
    + models: org/name ids the store holds besides the recipes' models
    """
    bad = [m for m in models if not is_model_id(m)]
    if bad:
        raise ValueError(f"not model ids ORG/NAME of [A-Za-z0-9._-]: {', '.join(map(repr, bad))}")
    out = Path(out)
    key = source_key(models)
    with contextlib.suppress(OSError, ValueError):
        manifest: dict[str, Any] = json.loads((out / "manifest.json").read_text())
        if manifest.get("source_key") == key:
            return manifest
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.build-", dir=out.parent))
    try:
        manifest = _build_into(tmp, key, models)
        old = None
        if out.exists():
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            os.rename(out, old)
        os.rename(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    for stale in glob.glob(str(out.parent / f".{out.name}.old-*")):
        shutil.rmtree(stale, ignore_errors=True)
    return manifest


def main(argv: list[str]) -> int:
    if not argv:
        sys.stderr.write("usage: python3 build.py OUT [MODEL...]\n")
        return 2
    manifest = build(Path(argv[0]), argv[1:])
    print(f"{argv[0]}: {len(manifest['models'])} models, {len(manifest['driver'])} runfiles")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
