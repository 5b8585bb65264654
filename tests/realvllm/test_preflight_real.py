"""The host program ``remote/preflight.py`` under the real vLLM 0.30.0 wheel (and vllm-rbln 0.12.0
over it), as a release's python runs it: its verdict on every command line servefleet resolves
and every single-node command of the recipes site (:mod:`corpus`) equals a direct parse by the
real vLLM (:mod:`judge_real`, vLLM's own ``main()``), on both platforms, with the same message.

The corpus runs with an empty environment, one pre-flight child a platform (a child imports
vLLM: about 10 s); the per-environment children are held by the cases below and by
tests/unit/base/remote/test_preflight.py."""

from __future__ import annotations

import json
import subprocess
from functools import cache
from typing import Any

import build
import pytest
from corpus import PLATFORMS, corpus

from servefleet.base.remote import REMOTE
from servefleet.base.remote.preflight import one_line

PREFLIGHT = REMOTE / "preflight.py"
TIMEOUT = 600
SEED_ENV = "VLLM_ENGINE_READY_TIMEOUT_S"


def python(platform: str) -> str:
    if not build.is_built():
        pytest.fail(
            f"the real-wheel venvs are not built ({build.built()}): run tests/realvllm/build.py",
            pytrace=False,
        )
    return str(build.python(platform))


def resolve(*args: str) -> dict[str, Any]:
    from click.testing import CliRunner

    from servefleet.entry.cli import main as cli

    result = CliRunner().invoke(cli, ["resolve", *args, "--format=json"])
    assert result.exit_code == 0, result.output
    spec: dict[str, Any] = json.loads(result.output)
    return spec


def run_preflight(platform: str, instances: list[dict[str, Any]]) -> tuple[int, list[Any], str]:
    proc = subprocess.run(
        [python(platform), str(PREFLIGHT), "-"],
        input=json.dumps(instances), capture_output=True, text=True, timeout=TIMEOUT, cwd="/",
    )  # fmt: skip
    return proc.returncode, [json.loads(line) for line in proc.stdout.splitlines()], proc.stderr


def run_judge(platform: str, argvs: list[list[str]]) -> list[Any]:
    proc = subprocess.run(
        [python(platform), str(build.HERE / "judge_real.py")],
        input=json.dumps(argvs), capture_output=True, text=True, timeout=TIMEOUT, cwd="/",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    verdicts: list[Any] = json.loads(proc.stdout.splitlines()[-1])  # vLLM logs to stdout first
    return verdicts


def instance(unit: str, argv: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    return {"unit": unit, "argv": ["/opt/release/bin/vllm", "serve", *argv], "env": env or {}}


# ---------------------------------------------------------------------------------------------
# What the issue asks to be proved, on the real wheels


@cache
def proofs() -> dict[str, Any]:
    seed = resolve("rbln/gpt-oss-120b")["servers"][0]
    h200 = resolve("vllm/openai/gpt-oss-120b", "--hardware=h200")["servers"][0]
    fp4 = ["openai/gpt-oss-120b", "--attention-config", '{"use_fp4_indexer_cache": true}']
    tool = ["openai/gpt-oss-120b", "--enable-auto-tool-choice", "--tool-call-parser", "nosuch"]
    rbln = [
        instance("seed.service", seed["argv"][2:], seed["env"]),
        instance("fp4.service", fp4),
        instance("tool.service", tool),
    ]
    upstream = [
        instance("h200.service", h200["argv"][2:], h200["env"]),
        instance("fp4.service", fp4),
    ]
    return {"rbln": run_preflight("rbln", rbln), "upstream": run_preflight("upstream", upstream)}


def test_the_seed_cards_default_command_passes_on_the_rbln_platform() -> None:
    code, results, _ = proofs()["rbln"]
    assert results[0] == {"unit": "seed.service", "ok": True}
    assert code == 1  # the two refused below


def test_the_shipped_h200_gpt_oss_120b_command_passes_upstream() -> None:
    _, results, _ = proofs()["upstream"]
    assert results[0] == {"unit": "h200.service", "ok": True}


@pytest.mark.parametrize("platform", PLATFORMS)
def test_a_config_key_the_pin_lacks_is_refused_with_vllms_message_and_the_gap(
    platform: str,
) -> None:
    code, results, stderr = proofs()[platform]
    fp4 = next(r for r in results if r["unit"] == "fp4.service")
    assert code == 1 and fp4["ok"] is False
    assert fp4["flag"] == "--attention-config" and fp4["key"] == "use_fp4_indexer_cache"
    assert fp4["message"].startswith(
        "argument --attention-config/-ac: 1 validation error for AttentionConfig "
        "use_fp4_indexer_cache Unexpected keyword argument"
    )
    assert fp4["gap"] == (
        "the recipe needs a newer vLLM than the pin 0.30.0 "
        "(key use_fp4_indexer_cache of --attention-config is not in it)"
    )
    assert stderr.count("\n") == 1 and stderr.startswith("servefleet: pre-flight: ")


def test_an_unknown_tool_call_parser_is_refused_as_vllm_serve_refuses_it() -> None:
    _, results, _ = proofs()["rbln"]
    tool = next(r for r in results if r["unit"] == "tool.service")
    assert tool["ok"] is False and tool["flag"] == "--tool-call-parser"
    assert tool["message"].startswith("KeyError: 'invalid tool call parser: nosuch (chose from {")
    assert " openai," in tool["message"].replace("{ ", " ").replace(",", ", ")


# ---------------------------------------------------------------------------------------------
# The corpus: the pre-flight's verdict and message equal the real vLLM's


def expected_message(verdict: list[str] | None) -> str | None:
    """What the pre-flight must say for the judge's verdict (its message on one line)."""
    if verdict is None:
        return None
    stage, message = verdict
    if stage == "engine":
        message = f"at engine start: {message}"
    if stage == "parse" and message.startswith("exit "):  # --help: argparse printed no error
        message = f"vllm serve exits at once (status {message.split()[1]}) with these arguments"
    return one_line(message)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_the_preflight_agrees_with_the_real_parser_on_the_whole_corpus(platform: str) -> None:
    cases = [c for c in corpus() if c["platform"] == platform]
    instances = [instance(f"case-{i}.service", c["argv"]) for i, c in enumerate(cases)]
    _, results, _ = run_preflight(platform, instances)
    verdicts = run_judge(platform, [c["argv"] for c in cases])
    assert len(results) == len(verdicts) == len(cases)
    disagreements = []
    for case, result, verdict in zip(cases, results, verdicts, strict=True):
        want = expected_message(verdict)
        got = None if result["ok"] else result["message"]
        if want != got:
            disagreements.append(f"{case['name']}: real {want!r}, pre-flight {got!r}")
    refused = sum(1 for v in verdicts if v is not None)
    print(
        f"\n{platform}: {len(cases)} command lines, {refused} refused by the real vLLM, "
        f"{len(disagreements)} disagreements"
    )
    assert not disagreements, "\n".join(disagreements[:20])
    assert len(cases) > 50 and refused < len(cases)
