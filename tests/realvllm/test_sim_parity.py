"""The lab's simulated ``vllm serve`` handles its arguments as the real vLLM 0.30.0 wheel does
(issue #30): the same judge (:mod:`judge_real`: vLLM's own ``main()`` parser, the serve
subcommand's ``validate``, ``validate_api_server_args`` and the engine's reasoning-parser lookup,
by vLLM's module paths) run once a platform under the real wheel (tests/realvllm/build.py) and
once under the controller's python with the simulator's package as ``vllm 0.30.0+cpu`` on its
path and the platform chosen by ``$RBLN_SIM_ROOT/etc/rbln-sim/platform``, gives every case the
same verdict: passes or is refused, at the same stage, with the same class of message
(:func:`message_class`). The cases: the whole corpus (:mod:`corpus`) and the edge cases
(:mod:`edge_cases`), each edge case in a directory of its own holding its files.

A disagreement that needs a change outside the simulator's package is listed in
:data:`KNOWN_DISAGREEMENTS` with the reason; it must still disagree (a fixed one fails until it
is taken off the list)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import build
import pytest
from corpus import PLATFORMS, corpus
from edge_cases import edge_cases

sys.path.insert(0, str(build.HERE.parents[1] / "tests" / "unit"))
from lab_sim_support import sim_vllm  # noqa: E402

JUDGE = build.HERE / "judge_real.py"
SIMULATED_VLLM = build.HERE.parents[1] / "src/servefleet/fleet/lab/simulator/packages/vllm"
TIMEOUT = 600  # one judge run: importing the real vLLM takes some 10 s
SIM_VERSION = "0.30.0+cpu"

# (platform, case name) -> why the simulator cannot be made to agree from inside its package
KNOWN_DISAGREEMENTS: dict[tuple[str, str], str] = {}

Verdict = list[str] | None


def real_python(platform: str) -> str:
    if not build.is_built():
        pytest.fail(
            f"the real-wheel venvs are not built ({build.built()}): run tests/realvllm/build.py",
            pytrace=False,
        )
    return str(build.python(platform))


def clean_env() -> dict[str, str]:
    """This process's environment without what would steer either side's vllm."""
    drop = ("PYTHONPATH", "PYTHONHOME", "RBLN_SIM_ROOT")
    return {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("VLLM_")}


def simulated_site(where: Path) -> Path:
    """A site directory holding the simulator's vllm package as vllm 0.30.0+cpu."""
    site = where / "site"
    site.mkdir()
    (site / "vllm").symlink_to(sim_vllm(), target_is_directory=True)  # as its wheel lays it out
    info = site / f"vllm-{SIM_VERSION}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {SIM_VERSION}\n")
    return site


def simulation_root(where: Path, platform: str) -> Path:
    """A simulation root whose /etc/rbln-sim/platform names ``platform``."""
    root = where / f"root-{platform}"
    (root / "etc/rbln-sim").mkdir(parents=True)
    (root / "etc/rbln-sim/platform").write_text(platform + "\n")
    return root


def run_judge(python: str, items: list[dict[str, Any]], env: dict[str, str]) -> list[Verdict]:
    """The judge's verdicts on ``items`` (``{"argv", "cwd"}``), in one process."""
    proc = subprocess.run(
        [python, str(JUDGE)], input=json.dumps(items), capture_output=True, text=True,
        timeout=TIMEOUT, cwd="/", env=env,
    )  # fmt: skip
    assert proc.returncode == 0, f"{python} {JUDGE.name}: {proc.stderr[-3000:]}"
    verdicts: list[Verdict] = json.loads(proc.stdout.splitlines()[-1])  # vLLM logs to stdout
    assert len(verdicts) == len(items)
    return verdicts


def edge_items(platform: str, where: Path) -> list[dict[str, Any]]:
    """The edge cases of ``platform``, each with a directory of its own holding its files."""
    out = []
    for n, case in enumerate(edge_cases(platform)):
        cwd = where / f"edge-{platform}-{n}"
        cwd.mkdir()
        for rel, text in case["files"].items():
            (cwd / rel).parent.mkdir(parents=True, exist_ok=True)
            (cwd / rel).write_text(text)
        argv = [a.replace("{cwd}", str(cwd)) for a in case["argv"]]
        out.append({"name": f"edge: {case['name']}", "argv": argv, "cwd": str(cwd)})
    return out


# ---------------------------------------------------------------------------------------------
# The message class: what of a refusal must agree


EXCEPTION = re.compile(r"([A-Z]\w*(?:Error|Exception)): ")
ARGUMENT = re.compile(r"argument (\S+): (.*)", re.S)
KINDS = (
    "invalid choice",
    "expected one argument",
    "expected at least one argument",
    "expected at most one argument",
    "ignored explicit argument",
    "not allowed with argument",
)


def argument_kind(rest: str) -> str:
    """The kind of argparse's error about one argument: argparse's own phrase, the value
    parser's name (``invalid int value``, ``cannot be converted to <function loads>``),
    pydantic's class and error types, else the value parser's message up to its first colon."""
    for kind in KINDS:
        if rest.startswith(kind):
            return kind
    invalid = re.match(r"invalid (\S+) value:", rest)
    if invalid:
        return f"invalid {invalid.group(1)} value"
    converted = re.match(r"Value .* cannot be converted to (<\w+ '?[\w.]+)", rest, re.S)
    if converted:  # vLLM's parse_type, naming the value parser
        return f"cannot be converted to {converted.group(1)}>"
    pydantic = re.match(r"\d+ validation errors? for (\w+)", rest)
    if pydantic:
        types = sorted(set(re.findall(r"\[type=(\w+)", rest)))
        return f"validation error for {pydantic.group(1)} {types}"
    return rest.split(":", 1)[0].strip()


def message_class(verdict: Verdict) -> tuple[str, ...] | None:
    """What must agree of a verdict: None for a pass, else the stage and

    - for vLLM's exceptions, the exception's type name;
    - for ``--help`` and the like (argparse exits without an error), the exit status;
    - for argparse's errors: ``unrecognized arguments`` with the words (and whether vLLM's
      ``--task`` hint follows), ``argument FLAGS`` with :func:`argument_kind`, else argparse's
      phrase before its colon (``the following arguments are required``, ...).

    + verdict: the judge's ``[stage, message]`` or None
    """
    if verdict is None:
        return None
    stage, message = verdict
    exception = EXCEPTION.match(message)
    if exception:
        return stage, exception.group(1)
    if re.fullmatch(r"exit -?\w+", message):
        return stage, message
    first = message.split("\n", 1)[0]
    if first.startswith("unrecognized arguments: "):
        hint = "with the --task hint" if "Hint: --task" in message else ""
        return stage, "unrecognized arguments", first.split(": ", 1)[1], hint
    argument = ARGUMENT.match(message)
    if argument:
        return stage, f"argument {argument.group(1)}", argument_kind(argument.group(2))
    return stage, first.split(":", 1)[0]


def wording(verdict: Verdict) -> Verdict:
    """A verdict without what cannot be the same on both sides: pydantic's URL lines, objects'
    addresses and where each side's vllm package lies (for the summary's count only)."""
    if verdict is None:
        return None
    stage, message = verdict
    message = re.sub(r"\n +For further information visit \S+", "", message)
    message = re.sub(r" at 0x[0-9a-f]+", "", message)
    message = re.sub(r"\S*/vllm/transformers_utils/", "vllm/transformers_utils/", message)
    return [stage, message]


# ---------------------------------------------------------------------------------------------
# Both sides, once a platform


def judged(platform: str, where: Path) -> list[dict[str, Any]]:
    """Every case of ``platform`` (the corpus's, then the edge cases) with both sides' verdicts
    (``part``, ``name``, ``real``, ``sim``): each side judges them all in one process."""
    python = real_python(platform)
    cases = [
        {"part": "corpus", "name": c["name"], "argv": c["argv"], "cwd": c["cwd"]}
        for c in corpus()
        if c["platform"] == platform
    ]
    cases += [dict(c, part="edge") for c in edge_items(platform, where)]
    items = [{"argv": c["argv"], "cwd": c["cwd"]} for c in cases]
    sim_env = {
        **clean_env(),
        "PYTHONPATH": str(simulated_site(where)),
        "PYTHONDONTWRITEBYTECODE": "1",  # the package is the source tree
        "RBLN_SIM_ROOT": str(simulation_root(where, platform)),
    }
    real = run_judge(python, items, clean_env())
    sim = run_judge(sys.executable, items, sim_env)
    return [dict(c, real=r, sim=s) for c, r, s in zip(cases, real, sim, strict=True)]


def disagreements(platform: str, cases: list[dict[str, Any]]) -> list[str]:
    """Each case whose verdicts' classes differ, as a line (the documented ones only when they
    now agree: strict)."""
    out = []
    for case in cases:
        differ = message_class(case["real"]) != message_class(case["sim"])
        known = KNOWN_DISAGREEMENTS.get((platform, case["name"]))
        if differ and known is None:
            out.append(f"{case['name']}: real {case['real']!r}, sim {case['sim']!r}")
        elif not differ and known is not None:
            out.append(f"{case['name']}: agrees now, take it off KNOWN_DISAGREEMENTS ({known})")
    return out


@pytest.mark.parametrize("platform", PLATFORMS)
def test_the_simulator_judges_every_case_as_the_real_wheel(platform: str, tmp_path: Path) -> None:
    cases = judged(platform, tmp_path)
    assert len({c["name"] for c in cases}) == len(cases), "case names must be unique"
    found = disagreements(platform, cases)
    for part in ("corpus", "edge"):
        mine = [c for c in cases if c["part"] == part]
        refused = sum(1 for c in mine if c["real"] is not None)
        worded = sum(1 for c in mine if wording(c["real"]) != wording(c["sim"]))
        print(
            f"\n{platform} {part}: {len(mine)} cases, {refused} refused by the real vLLM, "
            f"{len(disagreements(platform, mine))} disagreements, "
            f"{worded} messages worded otherwise"
        )
    known = sum(1 for p, _ in KNOWN_DISAGREEMENTS if p == platform)
    print(f"{platform}: {len(cases)} cases, {len(found)} disagreements, {known} documented")
    assert not found, f"{len(found)} disagreements on {platform}:\n" + "\n".join(found)
    edge = [c for c in cases if c["part"] == "edge"]
    assert 0 < sum(1 for c in edge if c["real"] is not None) < len(edge)
