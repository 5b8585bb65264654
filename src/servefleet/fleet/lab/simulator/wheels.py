"""The simulated wheels of the lab's five indexes: a wheel writer with real metadata (METADATA,
WHEEL with the real platform tags, entry points, RECORD), and every wheel the indexes serve
(the RBLN SDK, vllm-rbln, optimum-rbln, torch-rbln, the squatters, vllm and torch as CPU and
CUDA builds, nixl)."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import zipfile
from collections.abc import Mapping
from pathlib import Path

from .inputs import package_files, reference_files

SDK_VERSIONS = ["0.12.0", "0.12.1"]
VLLM_VERSION = "0.30.0+cpu"
TORCH_VERSION = "2.13.0+cpu"
CUDA_VLLM_VERSIONS = ["0.30.0", "0.30.1"]  # PyPI's vllm and torch: CUDA builds, no local version
# the vLLM reference data every simulated vllm carries (0.30.1's too): servefleet's reference/vllm
REFERENCE_VERSION = VLLM_VERSION.partition("+")[0]
CUDA_TORCH_VERSION = "2.13.0"
NIXL_VERSION = "1.5.1"  # PyPI's nixl, which upstream vLLM's NixlConnector imports
HUB_DEPENDENCY = "huggingface-hub>=0.33.0"  # vllm's own (it downloads models); the real one
PURE = "py3-none-any"
# Platform tags of the real wheels (rbln.md §3.1): vllm's CPU build is manylinux_2_39 only;
# RBLN's workaround source serves one that a glibc 2.35 host takes; torch-rbln one per CPython
VLLM_CPU_TAG = "cp38-abi3-manylinux_2_39_x86_64"
VLLM_ASSETS_TAG = "cp38-abi3-manylinux_2_35_x86_64"
TORCH_RBLN_TAGS = tuple(f"cp3{m}-cp3{m}-manylinux_2_34_x86_64" for m in range(10, 15))
SIM_SUMMARY = "SIMULATION for the servefleet lab: stand-in for {name}"
SQUAT_SUMMARY = "SIMULATION for the servefleet lab: a SQUATTER posing as {name}"


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
        vllm_files.update(reference_files(REFERENCE_VERSION))  # verbatim data, in vllm/flags/
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
