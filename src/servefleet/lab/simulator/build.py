#!/usr/bin/env python3
"""Builder of the simulator's package artifacts for the servefleet lab: a SIMULATION of the RBLN
stack.

``python3 build.py OUT [MODEL...]`` (or ``build(Path(OUT), models)``) writes, from the simulator
sources next to this file (``servefleet/lab/simulator/``, shipped in the servefleet wheel):

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
"""

from __future__ import annotations

import base64
import contextlib
import glob
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

SIMULATOR = Path(__file__).resolve().parent
SERVEFLEET = SIMULATOR.parents[1]  # the servefleet package directory
PACKAGES = SIMULATOR / "packages"
RECIPES = SERVEFLEET / "_files" / "recipes"  # the package ships them
WHEEL_CACHE = Path(os.environ.get("SERVEFLEET_LAB_WHEEL_CACHE", "/var/cache/servefleet-lab/wheels"))
FORMAT = 2  # bump when the output layout changes
EPOCH = 315532800  # 1980-01-01: fixed timestamps make the artifacts reproducible
SDK_VERSIONS = ["0.12.0", "0.12.1"]
DRIVER_VERSIONS = ["3.5.1", "3.6.0"]
VLLM_VERSION = "0.30.0+cpu"
TORCH_VERSION = "2.13.0+cpu"
CUDA_VLLM_VERSIONS = ["0.30.0", "0.30.1"]  # PyPI's vllm and torch: CUDA builds, no local version
CUDA_TORCH_VERSION = "2.13.0"
NIXL_VERSION = "1.5.1"  # PyPI's nixl, which upstream vLLM's NixlConnector imports
HUB_DEPENDENCY = "huggingface-hub>=0.33.0"  # vllm's own (it downloads models); the real one
PURE = "py3-none-any"
# Platform tags of the real wheels (rbln.md §3.1): vllm's CPU build is manylinux_2_39 only;
# RBLN's workaround source serves one that a glibc 2.35 host takes; torch-rbln one per CPython
VLLM_CPU_TAG = "cp38-abi3-manylinux_2_39_x86_64"
VLLM_ASSETS_TAG = "cp38-abi3-manylinux_2_35_x86_64"
TORCH_RBLN_TAGS = tuple(f"cp3{m}-cp3{m}-manylinux_2_34_x86_64" for m in range(10, 15))
ARCTIC_VERSION = "0.1.1"
SIM_SUMMARY = "SIMULATION for the servefleet lab: stand-in for {name}"
SQUAT_SUMMARY = "SIMULATION for the servefleet lab: a SQUATTER posing as {name}"
RBLN_MODELS = ["openai/gpt-oss-120b", "nvidia/gpt-oss-120b-Eagle3-v3"]
MODEL_ID = re.compile(r"[A-Za-z0-9._-]+/[A-Za-z0-9._-]+")  # as the fetcher takes them
SPECULATIVE_KEYS = ("--speculative-config", "speculative_config", "speculative-config")


# ---------------------------------------------------------------------------------------------
# Wheels


def _record_hash(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name)


def write_wheel(
    outdir: Path,
    name: str,
    version: str,
    files: Mapping[str, str | bytes],
    requires: list[str] = [],  # noqa: B006 (never mutated)
    extras: Mapping[str, list[str]] | None = None,
    entry_points: Mapping[str, Mapping[str, str]] | None = None,
    summary: str = "",
    requires_python: str | None = None,
    tag: str = PURE,
) -> Path:
    """Write a wheel of Python files with real metadata (METADATA, WHEEL, entry points, RECORD).

    + outdir: where the .whl goes
    + name, version: distribution name and version (local versions such as +cpu allowed)
    + files: archive path -> content
    + requires: Requires-Dist lines (PEP 508)
    + extras: extra name -> requirements (written with ``; extra == "<name>"`` markers)
    + entry_points: group -> {name: object reference}
    + summary: the Summary line
    + requires_python: a Requires-Python specifier
    + tag: the wheel's tag ``PYTHON-ABI-PLATFORM`` (dot-compressed sets allowed); in the file
      name, as WHEEL's ``Tag:`` lines, and purelib only when the platform is ``any``
    """
    dist = f"{_norm(name)}-{version}"
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    meta.append(f"Summary: {summary or SIM_SUMMARY.format(name=name)}")
    if requires_python:
        meta.append(f"Requires-Python: {requires_python}")
    meta += [f"Requires-Dist: {req}" for req in requires]
    for extra, reqs in (extras or {}).items():
        meta.append(f"Provides-Extra: {extra}")
        for req in reqs:
            joiner = " and " if ";" in req else "; "
            meta.append(f'Requires-Dist: {req}{joiner}extra == "{extra}"')
    content: dict[str, bytes] = {
        arc: (text.encode() if isinstance(text, str) else text) for arc, text in files.items()
    }
    content[f"{dist}.dist-info/METADATA"] = ("\n".join(meta) + "\n").encode()
    content[f"{dist}.dist-info/WHEEL"] = wheel_text(tag).encode()
    if entry_points:
        ep = ""
        for group, items in entry_points.items():
            ep += f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in items.items()) + "\n"
        content[f"{dist}.dist-info/entry_points.txt"] = ep.encode()
    record = [f"{arc},{_record_hash(data)},{len(data)}" for arc, data in content.items()]
    record.append(f"{dist}.dist-info/RECORD,,")
    content[f"{dist}.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    outdir.mkdir(parents=True, exist_ok=True)
    path = outdir / f"{dist}-{tag}.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for arc, data in content.items():
            info = zipfile.ZipInfo(arc, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return path


def wheel_text(tag: str) -> str:
    """A WHEEL file for ``tag``: one ``Tag:`` line per tag of its (dot-compressed) set, and
    ``Root-Is-Purelib`` true only for platform ``any``.

    + tag: ``PYTHON-ABI-PLATFORM``, e.g. ``cp38-abi3-manylinux_2_39_x86_64``
    """
    pythons, abis, platforms = (part.split(".") for part in tag.split("-"))
    purelib = "true" if platforms == ["any"] else "false"
    lines = ["Wheel-Version: 1.0", "Generator: servefleet-lab-build", f"Root-Is-Purelib: {purelib}"]
    lines += [f"Tag: {p}-{a}-{pl}" for p in pythons for a in abis for pl in platforms]
    return "\n".join(lines) + "\n"


def package_files(
    top: str, version: str, squatter: bool = False, exclude: tuple[str, ...] = ()
) -> dict[str, str]:
    """The sources of package ``top`` (a dir under packages/) with the version filled in.

    + top: a path under packages/, e.g. ``rebel`` or ``optimum/rbln``
    + version: replaces ``@VERSION@``
    + squatter: flip ``__servefleet_squatter__`` to True
    + exclude: file names to leave out
    """
    out: dict[str, str] = {}
    for path in sorted((PACKAGES / top).rglob("*.py")):
        if path.name in exclude or "__pycache__" in path.parts:
            continue
        text = path.read_text().replace("@VERSION@", version)
        if squatter:
            text = text.replace("__servefleet_squatter__ = False", "__servefleet_squatter__ = True")
            text = text.replace('"""', '"""SQUATTER (not from the RBLN index). ', 1)
        out[path.relative_to(PACKAGES).as_posix()] = text
    return out


def _next_patch(version: str) -> str:
    major, minor, patch = version.split(".")
    return f"{major}.{minor}.{int(patch) + 1}"


def build_wheels(index: Path) -> None:
    """All wheels of the five indexes."""
    private, public = index / "private", index / "public"
    for v in SDK_VERSIONS:
        rng = f"<{_next_patch(v)},>={v}"
        write_wheel(private, "rebel-compiler", v, package_files("rebel", v))
        write_wheel(private, "lmcache-rbln", v, package_files("lmcache_rbln", v))
        write_wheel(private, "nixl-rbln", v, package_files("nixl_rbln", v))
        write_wheel(
            public,
            "vllm-rbln",
            v,
            package_files("vllm_rbln", v),
            requires=[
                f"vllm=={VLLM_VERSION}",
                "torch",
                f'torch-rbln{rng}; platform_machine == "x86_64"',
                f"optimum-rbln{rng}",
            ],
            extras={
                "runtime": [f"rebel-compiler{rng}"],
                "kv-connectors": [f"nixl-rbln{rng}", f"lmcache-rbln{rng}"],
            },
            entry_points={
                "vllm.platform_plugins": {"rbln": "vllm_rbln:register"},
                "vllm.general_plugins": {
                    "rbln_custom_ops": "vllm_rbln:register_ops",
                    "rbln_new_models": "vllm_rbln:register_model",
                },
            },
            requires_python="<3.15,>=3.10",
        )
        write_wheel(
            public,
            "optimum-rbln",
            v,
            package_files("optimum/rbln", v),
            requires=[f"torch=={TORCH_VERSION}"],
            entry_points={"console_scripts": {"optimum-rbln-cli": "optimum.rbln.cli:main"}},
        )
        for tag in TORCH_RBLN_TAGS:
            write_wheel(
                public,
                "torch-rbln",
                v,
                package_files("torch_rbln", v),
                requires=[f"torch=={TORCH_VERSION}"],
                extras={"runtime": [f"rebel-compiler{rng}"]},
                entry_points={
                    "torch.backends": {"autoload": "torch_rbln:torch_backends_entry_point"}
                },
                tag=tag,
            )
    # squatters: same name on the public index, same or higher version
    for name, top, version in [
        ("rebel-compiler", "rebel", "0.12.0"),
        ("lmcache-rbln", "lmcache_rbln", "0.12.0.post1"),
        ("nixl-rbln", "nixl_rbln", "0.12.0.post1"),
    ]:
        write_wheel(
            public,
            name,
            version,
            package_files(top, version, squatter=True),
            summary=SQUAT_SUMMARY.format(name=name),
        )
    cpu = {"version": VLLM_VERSION, "device": "cpu"}
    vllm_builds = [
        (index / "vllm", VLLM_VERSION, TORCH_VERSION, cpu, VLLM_CPU_TAG),
        (index / "assets", VLLM_VERSION, TORCH_VERSION, cpu, VLLM_ASSETS_TAG),
        *(
            (
                public,
                v,
                CUDA_TORCH_VERSION,
                {"version": v, "device": "cuda", "torch": CUDA_TORCH_VERSION},
                PURE,
            )
            for v in CUDA_VLLM_VERSIONS
        ),
    ]
    for outdir, version, torch, build, tag in vllm_builds:
        vllm_files: dict[str, str | bytes] = {**package_files("vllm", version)}
        for path in sorted((PACKAGES / "vllm" / "flags").iterdir()):  # verbatim data
            vllm_files[path.relative_to(PACKAGES).as_posix()] = path.read_bytes()
        vllm_files["vllm/build.json"] = json.dumps(build, sort_keys=True) + "\n"  # see vllm.common
        if build["device"] == "cuda":
            vllm_files["vllm/__init__.py"] = str(vllm_files["vllm/__init__.py"]).replace(
                "(CPU build)", "(CUDA build, as on PyPI)"
            )
        write_wheel(
            outdir,
            "vllm",
            version,
            vllm_files,
            requires=[f"torch=={torch}", HUB_DEPENDENCY],
            entry_points={"console_scripts": {"vllm": "vllm.sim:main"}},
            requires_python=">=3.10",
            tag=tag,
        )
    write_wheel(index / "torch", "torch", TORCH_VERSION, package_files("torch", TORCH_VERSION))
    cuda_torch = package_files("torch", CUDA_TORCH_VERSION)
    cuda_torch["torch/__init__.py"] = cuda_torch["torch/__init__.py"].replace(
        "(CPU build)", "(CUDA build, the default on PyPI)"
    )
    write_wheel(public, "torch", CUDA_TORCH_VERSION, cuda_torch)
    write_wheel(public, "nixl", NIXL_VERSION, package_files("nixl", NIXL_VERSION))


# ---------------------------------------------------------------------------------------------
# The arctic-inference sdist and its build backend

ARCTIC_PYPROJECT = """\
# arctic-inference 0.1.1: a SIMULATION for the servefleet lab. As the real sdist, building it
# imports torch and compiles a C++20 extension (see setup.py).
[build-system]
requires = ["setuptools>=61", "torch"]
build-backend = "setuptools.build_meta"

[project]
name = "arctic_inference"
version = "{version}"
description = "SIMULATION for the servefleet lab: stand-in for arctic-inference"
requires-python = ">=3.10"

[tool.setuptools]
packages = ["arctic_inference", "arctic_inference.suffix_decoding"]
"""

ARCTIC_SETUP = """\
# arctic-inference 0.1.1: a SIMULATION for the servefleet lab. As the real setup.py it imports
# torch and builds arctic_inference.suffix_decoding._C, C++20 (cmake >= 3.18, a C++ compiler,
# the Python headers); without them it stops with one line naming what is missing.
import os, re, shutil, subprocess, sys, sysconfig

from setuptools import Extension, setup


def need(what):
    sys.exit("arctic-inference 0.1.1 cannot be built here: it needs " + what)


try:
    import torch  # noqa: F401 - the real setup.py imports torch
except ImportError:
    need("torch importable at build time")
cmake = shutil.which("cmake")
found = subprocess.run([cmake, "--version"], capture_output=True, text=True).stdout if cmake else ""
m = re.search(r"(\\d+)\\.(\\d+)", found)
if not m or (int(m.group(1)), int(m.group(2))) < (3, 18):
    need("cmake >= 3.18 on PATH")
if not (os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")):
    need("a C++20 compiler (c++ or g++) on PATH")
if not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")):
    need("the Python headers (Python.h, python3-dev)")
setup(
    ext_modules=[
        Extension(
            "arctic_inference.suffix_decoding._C",
            ["csrc/suffix.cpp"],
            language="c++",
            extra_compile_args=["-std=c++20"],
        )
    ]
)
"""


def _tar_add(tar: tarfile.TarFile, arcname: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(arcname)
    info.size, info.mode, info.mtime = len(data), mode, EPOCH
    info.uname = info.gname = "root"
    tar.addfile(info, io.BytesIO(data))


def _tar_dir(tar: tarfile.TarFile, arcname: str) -> None:
    info = tarfile.TarInfo(arcname)
    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, EPOCH
    info.uname = info.gname = "root"
    tar.addfile(info)


def _write_tgz(path: Path, members: list[tuple[str, bytes | None]]) -> None:
    """A reproducible .tar.gz; a None payload is a directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for arc, data in members:
            if data is None:
                _tar_dir(tar, arc)
            else:
                _tar_add(tar, arc, data)
    import gzip

    with open(path, "wb") as fh, gzip.GzipFile(fileobj=fh, mode="wb", mtime=EPOCH) as gz:
        gz.write(raw.getvalue())


def build_sdist(public: Path) -> Path:
    """arctic_inference-0.1.1.tar.gz (an sdist only, as the real 0.1.1)."""
    base = f"arctic_inference-{ARCTIC_VERSION}"
    pkg_info = (
        f"Metadata-Version: 2.1\nName: arctic_inference\nVersion: {ARCTIC_VERSION}\n"
        "Summary: SIMULATION for the servefleet lab: stand-in for arctic-inference\n"
        "Requires-Python: >=3.10\n"
    )
    members: list[tuple[str, bytes | None]] = [
        (base, None),
        (f"{base}/PKG-INFO", pkg_info.encode()),
        (f"{base}/pyproject.toml", ARCTIC_PYPROJECT.format(version=ARCTIC_VERSION).encode()),
        (f"{base}/setup.py", ARCTIC_SETUP.encode()),
        (f"{base}/csrc", None),
        (
            f"{base}/csrc/suffix.cpp",
            (PACKAGES / "arctic_inference" / "csrc" / "suffix.cpp").read_bytes(),
        ),
    ]
    for arc, text in package_files("arctic_inference", ARCTIC_VERSION).items():
        members.append((f"{base}/{arc}", text.encode()))
    path = public / f"{base}.tar.gz"
    _write_tgz(path, members)
    return path


def _setuptools_ok(path: Path) -> bool:
    m = re.match(r"setuptools-(\d+)\.(\d+)", path.name)
    return bool(m) and (int(m.group(1)), int(m.group(2))) >= (70, 1)  # type: ignore[union-attr]


def setuptools_wheel() -> Path:
    """A setuptools wheel new enough (>= 70.1) to build without the ``wheel`` package: from
    the cache, else fetched once with ``pip download`` and the machine's own pip config."""
    cached = sorted(p for p in WHEEL_CACHE.glob("setuptools-*.whl") if _setuptools_ok(p))
    if cached:
        return cached[-1]
    WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=WHEEL_CACHE) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
        cmd += ["--dest", tmp, "setuptools>=70.1"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        found = [p for p in Path(tmp).glob("setuptools-*.whl") if _setuptools_ok(p)]
        if proc.returncode != 0 or not found:
            raise RuntimeError(
                "cannot fetch the setuptools wheel the arctic-inference sdist builds with: "
                + (proc.stderr.strip().splitlines() or ["no wheel"])[-1]
            )
        target = WHEEL_CACHE / found[0].name
        os.replace(found[0], target)
    return target


# Real packages (not simulated: they need no NPU), fetched once for every Python a lock resolves
# for: vLLM's router at servefleet's default serve_router_version, and the Hugging Face client
# that vllm pulls in (a hub fetch runs its snapshot_download against the lab's hub)
ROUTER_REQUIREMENT = "vllm-router==0.1.17"
HUB_REQUIREMENT = "huggingface-hub==2.4.0"
REAL_PYTHONS = ("3.10", "3.11", "3.12", "3.13")
# What their dependencies need on Python 3.10 only: pip evaluates `python_version` markers for
# the Python it runs with (3.11 here), so it would not fetch them; a lock (uv, universal) needs
# them (`uv pip compile --universal --python-version 3.10` lists them)
PY310_ONLY = {ROUTER_REQUIREMENT: ("async-timeout", "exceptiongroup"), HUB_REQUIREMENT: ("tomli",)}


def host_uv_wheel() -> Path:
    """The real uv wheel for the lab's hosts (manylinux x86_64) at the controller's uv version,
    which the hosts take their uv from: from the cache, else fetched once with ``pip download``
    and the machine's own pip config."""
    from servefleet.release.uvbin import uv_version

    cache = WHEEL_CACHE / f"uv-{uv_version()}-host"
    if not (cache / ".complete").is_file():
        WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=WHEEL_CACHE, prefix=".uv-"))
        try:
            cmd = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--no-deps",
                   "--platform", "manylinux_2_17_x86_64", "--python-version", "3.11",
                   "--dest", str(tmp), f"uv=={uv_version()}"]  # fmt: skip
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0 or len(list(tmp.glob("uv-*.whl"))) != 1:
                said = [x for x in proc.stderr.splitlines() if x.strip()] or ["no wheel"]
                raise RuntimeError(f"cannot fetch uv=={uv_version()} for the hosts: {said[-1]}")
            (tmp / ".complete").write_text("")
            shutil.rmtree(cache, ignore_errors=True)
            os.replace(tmp, cache)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    (wheel,) = cache.glob("uv-*.whl")
    return wheel


def real_wheels(requirement: str) -> list[Path]:
    """The wheel of requirement and its dependencies' wheels, for every Python of REAL_PYTHONS:
    from the cache, else fetched once with ``pip download`` and the machine's own pip config.

    + requirement: ``name==version``, a key of PY310_ONLY
    """
    extras = hashlib.sha256(",".join(PY310_ONLY[requirement]).encode()).hexdigest()[:8]
    cache = WHEEL_CACHE / f"{requirement.replace('==', '-')}-{extras}"
    if not (cache / ".complete").is_file():
        WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=WHEEL_CACHE, prefix=".real-"))
        try:
            for python in REAL_PYTHONS:
                more = PY310_ONLY[requirement] if python == "3.10" else ()
                cmd = [sys.executable, "-m", "pip", "download", "--only-binary=:all:",
                       "--python-version", python, "--dest", str(tmp), requirement,
                       *more]  # fmt: skip
                proc = subprocess.run(cmd, capture_output=True, text=True)
                if proc.returncode != 0:
                    said = [x for x in proc.stderr.splitlines() if x.strip()
                            and not x.startswith("WARNING:")] or ["no wheel"]  # fmt: skip
                    raise RuntimeError(
                        f"cannot fetch {requirement} for Python {python}: {said[-1]}"
                    )
            (tmp / ".complete").write_text("")
            shutil.rmtree(cache, ignore_errors=True)
            os.replace(tmp, cache)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return sorted(cache.glob("*.whl"))


# ---------------------------------------------------------------------------------------------
# Debian stand-ins


def kernel_release() -> str:
    return os.uname().release


def _deb(outdir: Path, name: str, version: str, description: str, files: dict[str, str]) -> Path:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "DEBIAN").mkdir()
        control = (
            f"Package: {name}\nVersion: {version}\nArchitecture: all\n"
            "Maintainer: servefleet lab <lab@servefleet.invalid>\nSection: misc\n"
            f"Priority: optional\nDescription: {description}\n"
            " A SIMULATION for the servefleet lab: it only satisfies the RBLN driver\n"
            " runfile's prerequisite check.\n"
        )
        (root / "DEBIAN" / "control").write_text(control)
        for rel, text in files.items():
            target = root / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            target.chmod(0o755 if text.startswith("#!") else 0o644)
        outdir.mkdir(parents=True, exist_ok=True)
        path = outdir / f"{name}_{version}_all.deb"
        env = dict(os.environ, SOURCE_DATE_EPOCH=str(EPOCH))
        cmd = ["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(path)]
        subprocess.run(cmd, check=True, capture_output=True, env=env)
    return path


def build_debs(apt: Path) -> str:
    """dkms and linux-headers-<this kernel> stand-ins; returns the headers package name."""
    release = kernel_release()
    headers = f"linux-headers-{release}"
    dkms = "#!/bin/sh\n# dkms: a SIMULATION for the servefleet lab; builds nothing.\n"
    dkms += 'echo "dkms (servefleet lab stand-in): $*"\n'
    _deb(
        apt,
        "dkms",
        "3.0.10-8+sim1",
        "DKMS stand-in (servefleet lab simulation)",
        {"usr/sbin/dkms": dkms},
    )
    note = f"servefleet lab simulation: stand-in for the kernel headers of {release}\n"
    _deb(
        apt,
        headers,
        "1.0+sim1",
        f"kernel headers stand-in for {release} (servefleet lab)",
        {f"usr/src/{headers}/SERVEFLEET-LAB-SIMULATION": note},
    )
    return headers


# ---------------------------------------------------------------------------------------------
# Driver runfiles


def build_runfiles(driver_dir: Path) -> dict[str, Path]:
    """rebellions-x86_64-<ver>.run for every driver version."""
    template = (SIMULATOR / "driver" / "runfile.sh").read_text()
    smi = (SIMULATOR / "driver" / "rbln_smi.py").read_text()
    driver_dir.mkdir(parents=True, exist_ok=True)
    out = {}
    for version in DRIVER_VERSIONS:
        text = template.replace("@RBLN_SMI@", smi.rstrip("\n")).replace("@VERSION@", version)
        path = driver_dir / f"rebellions-x86_64-{version}.run"
        path.write_text(text)
        path.chmod(0o755)
        out[version] = path
    return out


# ---------------------------------------------------------------------------------------------
# Model store


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
    """Whether model is ``ORG/NAME`` of ``[A-Za-z0-9._-]`` without ``..``."""
    return bool(MODEL_ID.fullmatch(model)) and ".." not in model


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
    _write_tgz(path, members)
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
            "sha256": _sha256(path),
            "revision": model_revision(model),
        }
    text = json.dumps({"models": entries}, indent=2, sort_keys=True) + "\n"
    (models_dir / "manifest.json").write_text(text)
    return entries


# ---------------------------------------------------------------------------------------------
# Entry point


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def source_key(models: Sequence[str] = ()) -> str:
    """Hash of everything the output depends on: simulator sources, recipes, kernel release, the
    models added to the store."""
    from servefleet.release.uvbin import uv_version

    added = ",".join(sorted(set(models)))
    h = hashlib.sha256(
        f"format={FORMAT} kernel={kernel_release()} models={added} uv={uv_version()}".encode()
    )
    paths = [p for p in SIMULATOR.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    paths += [p for p in RECIPES.rglob("*") if p.is_file()]
    for path in sorted(paths):
        h.update(str(path.relative_to(SERVEFLEET)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _build_into(out: Path, key: str, models: Sequence[str]) -> dict[str, Any]:
    index = out / "index"
    build_wheels(index)
    build_sdist(index / "public")
    shutil.copy2(setuptools_wheel(), index / "public")
    for wheel in [*real_wheels(ROUTER_REQUIREMENT), *real_wheels(HUB_REQUIREMENT),
                  host_uv_wheel()]:  # fmt: skip
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
        manifest["driver"][version] = {"path": rel, "sha256": _sha256(path)}
    store = build_store(files / "models", [*recipe_models(), *models])
    for model, entry in store.items():
        manifest["models"][model] = dict(entry, path=f"models/{entry['path']}")
    for sub in sorted(p for p in index.iterdir() if p.is_dir()):
        manifest["wheels"][sub.name] = {
            p.name: {"sha256": _sha256(p)} for p in sorted(sub.iterdir()) if p.is_file()
        }
    for deb in sorted((out / "apt").glob("*.deb")):
        manifest["debs"][deb.name] = {"sha256": _sha256(deb)}
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
