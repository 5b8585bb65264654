"""The parser registries of the real vLLM 0.30.0, as data for the simulator.

usage: python tests/realvllm/gen_registries.py [--check]     # with the project's python

Runs itself (``--dump``) under each real venv that ``build.py`` built (``upstream``: vLLM's
CpuPlatform, what GPU hosts run; ``rbln``: vllm-rbln's RblnPlatform, what CR13 hosts run) and
writes the tool-call parser names and reasoning parser names each registers, sorted, to the
version's reference data, ``src/servefleet/reference/vllm/0.30.0/vllm-0.30.0-parsers.json`` (the
lab's build copies it into the simulated vllm's ``flags/``). On each platform the registries are
read after ``vllm serve``'s parser is built as ``vllm/entrypoints/cli/main.py`` builds it and
after vLLM's general plugins are loaded (vllm-rbln is one), so a name a plugin registers is
counted.
``--check`` writes nothing and exits 1 when the committed file differs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
OUT = REPO / "src/servefleet/reference/vllm/0.30.0/vllm-0.30.0-parsers.json"
PLATFORMS = ("rbln", "upstream")


def dump() -> dict[str, list[str]]:
    """``--dump``, under a real venv: this vLLM's registered parser names."""
    import vllm.entrypoints.cli.serve as serve
    from vllm.plugins import load_general_plugins
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    top = FlexibleArgumentParser(description="vLLM CLI")
    subparsers = top.add_subparsers(required=False, dest="subparser")
    for cmd in serve.cmd_init():
        cmd.subparser_init(subparsers)
    load_general_plugins()
    return {
        "reasoning_parsers": sorted(ReasoningParserManager.list_registered()),
        "tool_call_parsers": sorted(ToolParserManager.list_registered()),
    }


def generate() -> dict[str, Any]:
    """The registries of both platforms, each read by its own real python."""
    sys.path.insert(0, str(HERE))
    import build

    if not build.is_built():
        raise SystemExit(
            f"the real vLLM venvs are not built ({build.built()}): run tests/realvllm/build.py"
        )
    out: dict[str, Any] = {"vllm": "0.30.0", "vllm_rbln": "0.12.0"}
    procs = {  # both at once: each import of vLLM's CLI takes seconds
        platform: subprocess.Popen(
            [str(build.python(platform)), __file__, "--dump"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd="/",
        )
        for platform in PLATFORMS
    }
    for platform, proc in procs.items():
        stdout, stderr = proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"{platform}: {stderr.strip().splitlines()[-1:]}")
        out[platform] = json.loads(stdout.strip().splitlines()[-1])
    return out


def render(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    if argv[1:] == ["--dump"]:
        print(json.dumps(dump(), sort_keys=True))
        return 0
    text = render(generate())
    if argv[1:] == ["--check"]:
        same = OUT.is_file() and OUT.read_text() == text
        print(f"{OUT.name}: {'up to date' if same else 'differs from the real wheels'}")
        return 0 if same else 1
    if argv[1:]:
        print("usage: gen_registries.py [--check]", file=sys.stderr)
        return 2
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
