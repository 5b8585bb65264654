"""Units checked by systemd's own ``systemd-analyze verify`` (test_systemd.py,
test_unit_template.py); the tests that need it skip where it is missing."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ANALYZE = shutil.which("systemd-analyze") or "/usr/bin/systemd-analyze"
needs_analyze = pytest.mark.skipif(not Path(ANALYZE).exists(), reason="systemd-analyze missing")


def verify(units: dict[str, str], tmp: Path) -> subprocess.CompletedProcess[str]:
    """``systemd-analyze verify`` of each unit (file name -> text), written into ``tmp``."""
    paths = []
    for name, body in units.items():
        path = tmp / name
        path.write_text(body, encoding="utf-8")
        paths.append(str(path))
    return subprocess.run(
        [ANALYZE, "verify", "--man=no", *paths], capture_output=True, text=True, check=False
    )
