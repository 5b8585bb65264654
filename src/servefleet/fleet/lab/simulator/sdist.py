"""The arctic-inference 0.1.1 sdist (an sdist only, as the real one): its pyproject and a
setup.py that, as the real one, imports torch and compiles a C++20 extension, stopping with one
line naming what is missing."""

from __future__ import annotations

from pathlib import Path

from .archives import write_tgz
from .inputs import PACKAGES, package_files

ARCTIC_VERSION = "0.1.1"

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
    write_tgz(path, members)
    return path
