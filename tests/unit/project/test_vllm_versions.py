"""The vLLM version seam holds (#47): no file of the product names a vLLM version but the seam's
module (``base/vllm_reference.py``) and its data (``reference/vllm/<version>/``). A version number
of the line of any version servefleet has data for (``0.30``, ``0.30.0``, ``0.30.1``, ...), in
code, a comment, a docstring or a template, is refused, except the lines listed here, each with
why it stays.

Not held: the lab (``fleet/lab/``): its simulator stands in for particular releases (its wheels'
versions, the timing of vLLM 0.30's server), and #47 moves it out of the product; nor the
documentation (``_files/docs``), which says which release a fact is of."""

from __future__ import annotations

import re
from pathlib import Path

from layer_table import SRC

from servefleet.base.vllm_reference import known

SEAM = {SRC / "base" / "vllm_reference.py", SRC / "reference"}
# the lab (above), and the documentation the package shows (a link to the repository's docs/)
NOT_PRODUCT = {SRC / "fleet" / "lab", SRC / "_files" / "docs"}
# A line (stripped) that may still name a version -> why
EXCEPTIONS = {
    '"vllm==0.30.0+cpu",  # pinned by vllm-rbln, vLLM CPU wheels index':
        "the RBLN kind's default pins (kinds/, reshaped by the platform seam; #48 takes them "
        "from the version's manifest)",
    '"vllm": {"url": "https://wheels.vllm.ai/0.30.0/cpu", "packages": ["vllm"], "glibc": "2.39"},':
        "the RBLN kind's default index of vLLM's CPU wheels (as above)",
    'SDK_PINS = ["vllm==0.30.0", "torch==2.13.0", "nixl==1.5.1"]':
        "the vLLM kind's default pins (as above)",
    "``sc`` -> ``speculative-config``, ...), from the flag table of vLLM 0.30.0 (the same on both":
        "a docstring of kinds/rbln/argv_flags.py (kinds/ is being reshaped elsewhere)",
    "+ pin: the vLLM version that refused, e.g. ``0.30.0``":
        "a host program (base/remote/preflight.py imports nothing of the controller; #48 makes "
        "the pre-flight follow the wheel)",
    '"""The running vLLM\'s version, without its local part (``0.30.0+cpu``: ``0.30.0``)."""':
        "the pre-flight, as above",
    "written (vLLM 0.30.0): the pre-flight cannot check, so it refuses, naming what is missing.\"\"\"":
        "the pre-flight, as above",
    '"vllm serve\'s entry point as vLLM 0.30.0 has it)"}  # fmt: skip':
        "the pre-flight's refusal message, as above",
}  # fmt: skip


def version_lines() -> re.Pattern[str]:
    """A version of the minor line of any known version (``0.30`` -> 0.30, 0.30.0, 0.30.1)."""
    lines = sorted({".".join(v.split(".")[:2]) for v in known()})
    alternatives = "|".join(re.escape(line) for line in lines)
    return re.compile(rf"(?<![\d.])(?:{alternatives})(?:\.\d+)*(?![\d])")


def product_files() -> list[Path]:
    out = []
    for path in sorted(SRC.rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts or path.suffix == ".pyc":
            continue
        if any(path == s or s in path.parents for s in SEAM | NOT_PRODUCT):
            continue
        out.append(path)
    return out


def test_no_product_file_names_a_vllm_version_outside_the_seam() -> None:
    pattern = version_lines()
    found, excused = [], set()
    for path in product_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if pattern.search(line):
                if line.strip() in EXCEPTIONS:
                    excused.add(line.strip())
                else:
                    found.append(f"{path.relative_to(SRC)}:{number}: {line.strip()}")
    assert found == [], "name the version through servefleet.base.vllm_reference instead"
    assert excused == set(EXCEPTIONS), f"stale exceptions: {set(EXCEPTIONS) - excused}"


def test_the_pattern_finds_the_versions_and_nothing_else() -> None:
    pattern = version_lines()
    for text in ('"vllm==0.30.0"', "vLLM 0.30's", "0.30.1", "wheels.vllm.ai/0.30.0/cpu"):
        assert pattern.search(text), text
    for text in ("10.0.0.300", "0.300", "1.0.30", "2.13.0", "0.12.0"):
        assert not pattern.search(text), text
