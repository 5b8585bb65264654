"""rebel-compiler (import name ``rebel``): a SIMULATION for the servefleet lab.

Not the RBLN Compiler: it records its distribution version and answers ``get_npu_name`` from
the simulated ``rbln-smi -j``. The build marks squatter copies by flipping the flag below.
"""

from __future__ import annotations

import json
import shutil
import subprocess

__version__ = "@VERSION@"
__servefleet_simulation__ = True
__servefleet_squatter__ = False


def get_npu_name(index: int = 0) -> str | None:
    """The SKU of NPU ``index`` as rbln-smi names it, or None without a driver or device."""
    exe = shutil.which("rbln-smi")
    if exe is None:
        return None
    proc = subprocess.run([exe, "-j"], capture_output=True, text=True)
    if proc.returncode != 0:
        return None
    for dev in json.loads(proc.stdout).get("devices", []):
        if int(dev["npu"]) == index:
            return str(dev["name"])
    return None
