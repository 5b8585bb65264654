"""The host program ``remote/preflight.py`` against the simulator's vllm package (on PYTHONPATH,
with the dist-info of vllm 0.30.0+cpu beside it), as it runs under a release's python: each
instance's command line parsed and checked by vLLM's own entry points in its environment and
directory, one JSON result per instance, refusals in one line with vLLM's message, the version
gap named; bad input refused in one line, nothing run. Recipe fixtures: tests/unit/recipes/preflight.
The deploy step's command (steps/preflight.py) under a kill around its pass marker."""

from __future__ import annotations

import ast
import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from lab_sim_support import sim_vllm
from preflight_cases import FIXTURES, PREFLIGHT, fixture_command, run_preflight

from servefleet.base.remote import REMOTE
from servefleet.base.remote.layout import PREFLIGHT as LAYOUT_PREFLIGHT
from servefleet.base.remote.preflight import flag_of, one_line, unknown_key, version_gap
from servefleet.entry.steps.preflight import command as step_command
from servefleet.hostplan.plan import plan_host
from servefleet.hostplan.types import HostPlan
from servefleet.kinds.vllm import load_vllm_recipe

KEY_LINE = (
    "argument --attention-config/-ac: 1 validation error for AttentionConfig "
    "use_fp4_indexer_cache Unexpected keyword argument [type=unexpected_keyword_argument, "
    "input_value=True, input_type=bool]"
)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A site directory holding the simulator's vllm package as vllm 0.30.0+cpu."""
    root = tmp_path_factory.mktemp("site")
    (root / "vllm").symlink_to(sim_vllm(), target_is_directory=True)
    info = root / "vllm-0.30.0+cpu.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.30.0+cpu\n")
    return root


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A simulation root per platform (its /etc/rbln-sim/platform)."""
    out = {}
    for platform in ("rbln", "upstream"):
        root = tmp_path_factory.mktemp(platform)
        (root / "etc/rbln-sim").mkdir(parents=True)
        (root / "etc/rbln-sim/platform").write_text(platform + "\n")
        out[platform] = root
    return out


def env(site: Path, root: Path, **extra: str) -> dict[str, str]:
    return {
        "PYTHONPATH": str(site),
        "PYTHONDONTWRITEBYTECODE": "1",  # the package is the source tree
        "RBLN_SIM_ROOT": str(root),
        **extra,
    }


def command(recipe: str, feature: str) -> list[str]:
    """A fixture recipe's command line as the unit names it (the release's vllm)."""
    return ["/opt/servefleet/releases/abc/bin/vllm", *fixture_command(recipe, feature)[1:]]


def test_too_new_recipe_is_refused_in_one_line_per_instance(
    site: Path, roots: dict[str, Path]
) -> None:
    features = [
        "unknown_key",
        "unknown_dotted_key",
        "wrong_enum",
        "wrong_type",
        "missing_template",
        "unknown_flag",
    ]
    instances = [
        {
            "unit": f"servefleet-vllm-{i}.service",
            "argv": command("too-new", f),
            "env": env(site, roots["upstream"], CUDA_VISIBLE_DEVICES=str(i)),
        }
        for i, f in enumerate(features)
    ]
    fits = command("fits-the-pin", "attention")
    instances.append({"unit": "ok.service", "argv": fits, "env": env(site, roots["upstream"])})
    status, results, err = run_preflight(instances, stdin=True)
    # stderr: one line for the operator, the first refusal (the deploy shows it)
    assert status == 1 and err.count("\n") == 1
    assert err.startswith(f"servefleet: pre-flight: {results[0]['line']}")
    assert err.rstrip().endswith(f"(and {len(features) - 1} more instance(s))")
    assert [r["unit"] for r in results] == [i["unit"] for i in instances]  # in order
    assert results[-1] == {"unit": "ok.service", "ok": True}
    by = dict(zip(features, results[:-1], strict=True))
    assert all(
        not r["ok"] and r["line"] == f"{r['unit']}: {r['flag']}: {r['message']}"
        for r in by.values()
    )
    assert "\n" not in "".join(r["line"] for r in by.values())
    key = by["unknown_key"]
    assert key["line"] == f"servefleet-vllm-0.service: --attention-config: {KEY_LINE}"
    assert key["key"] == "use_fp4_indexer_cache"
    assert key["gap"] == (
        "the recipe needs a newer vLLM than the pin 0.30.0 (key use_fp4_indexer_cache of "
        "--attention-config is not in it)"
    )
    dotted = by["unknown_dotted_key"]
    assert (dotted["flag"], dotted["key"]) == ("--kernel-config", "fused_everything")
    assert dotted["gap"] is not None
    enum = by["wrong_enum"]
    assert enum["flag"] == "--kv-transfer-config" and enum["gap"] is None and enum["key"] is None
    assert "kv_role Input should be 'kv_producer', 'kv_both' or 'kv_consumer'" in enum["message"]
    assert by["wrong_type"]["flag"] == "--compilation-config" and by["wrong_type"]["gap"] is None
    template = by["missing_template"]
    assert template["flag"] == "--chat-template" and template["gap"] is None
    assert template["message"].startswith(
        "VLLMValidationError: The supplied chat template string "
        "(examples/tool_chat_template_acme.jinja)"
        " appears path-like, but doesn't exist! Tried: examples/tool_chat_template_acme.jinja"
    )
    flag = by["unknown_flag"]
    assert flag["line"] == (
        "servefleet-vllm-5.service: --tool-call-parser-plugin: unrecognized arguments: "
        "--tool-call-parser-plugin acme_tools.py"
    )
    assert flag["gap"] == (
        "the recipe needs a newer vLLM than the pin 0.30.0 (flag --tool-call-parser-plugin is "
        "not in it)"
    )


def test_a_recipe_that_fits_passes_on_both_platforms(
    site: Path, roots: dict[str, Path], tmp_path: Path
) -> None:
    recipe = load_vllm_recipe(FIXTURES / "fits-the-pin.yaml")
    own = tmp_path / "tool_chat_template_acme.jinja"
    own.write_text("{{ messages }}")
    argvs = [command("fits-the-pin", f) for f in recipe.features]
    argvs.append([*command("fits-the-pin", "attention"), "--chat-template", str(own)])
    instances = [
        {"unit": f"{platform}-{i}", "argv": argv, "env": env(site, root)}
        for platform, root in sorted(roots.items())
        for i, argv in enumerate(argvs)
    ]
    status, results, err = run_preflight(instances)
    assert (status, err) == (0, "")
    assert results == [{"unit": i["unit"], "ok": True} for i in instances]


def test_each_instance_is_checked_in_its_own_environment_and_directory(
    site: Path, roots: dict[str, Path], tmp_path: Path
) -> None:
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples/tool_chat_template_acme.jinja").write_text("{{ messages }}")
    w8a8 = ["vllm", "serve", "m", "--rbln-use-w8a8"]
    template = command("too-new", "missing_template")
    instances = [
        {"unit": "rbln", "argv": w8a8, "env": env(site, roots["rbln"])},
        {"unit": "upstream", "argv": w8a8, "env": env(site, roots["upstream"])},
        {
            "unit": "here",
            "argv": template,
            "env": env(site, roots["upstream"]),
            "cwd": str(tmp_path),
        },
        {"unit": "root", "argv": template, "env": env(site, roots["upstream"])},  # cwd /
    ]
    status, results, _ = run_preflight(instances)
    assert status == 1
    assert [r["ok"] for r in results] == [True, False, True, False]
    assert results[1]["message"] == "unrecognized arguments: --rbln-use-w8a8"
    assert results[3]["flag"] == "--chat-template"


def test_a_release_whose_vllm_does_not_import_fails_each_instance(
    roots: dict[str, Path], tmp_path: Path
) -> None:
    empty = tmp_path / "empty-site"
    empty.mkdir()
    instances = [
        {"unit": u, "argv": ["vllm", "serve", "m"], "env": env(empty, roots["upstream"])}
        for u in ("a", "b")
    ]
    status, results, _ = run_preflight(instances)
    assert status == 1
    for unit, result in zip(("a", "b"), results, strict=True):
        assert result["ok"] is False and result["flag"] == "vllm" and result["gap"] is None
        assert result["line"] == (
            f"{unit}: vllm: cannot build vLLM's parser: ModuleNotFoundError: No module named 'vllm'"
        )


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ("{nope", "instances are not JSON"),
        ('{"unit": "a"}', "instances must be a JSON list, not dict"),
        ('[{"unit": "a", "argv": []}]', "instance 0 must be an object of unit, argv, env"),
        ('[{"unit": "a", "argv": [], "env": {}, "extra": 1}]', "instance 0 must be an object"),
        ('[{"unit": "", "argv": [], "env": {}}]', "instance 0: unit must be a one-line name"),
        ('[{"unit": "a\\nb", "argv": [], "env": {}}]', "unit must be a one-line name"),
        ('[{"unit": "a", "argv": "vllm serve", "env": {}}]', "argv must be a list of strings"),
        ('[{"unit": "a", "argv": ["vllm", "serve"], "env": {"X": 1}}]', "env must map names"),
        ('[{"unit": "a", "argv": ["vllm", "serve"], "env": {"A=B": "1"}}]', "env must map names"),
        ('[{"unit": "a", "argv": ["vllm", "serve", "m\\u0000"], "env": {}}]', "NUL bytes"),
        ('[{"unit": "a", "argv": ["vllm", "serve"], "env": {}, "cwd": "rel"}]', "cwd must be"),
        ('[{"unit": "a", "argv": ["python", "-m", "vllm"], "env": {}}]', "is not a vllm serve"),
    ],
)
def test_bad_input_is_refused_in_one_line_and_runs_nothing(data: str, says: str) -> None:
    status, results, err = run_preflight(data)
    assert status == 2 and results == []
    assert err.startswith("preflight: ") and says in err and err.count("\n") == 1
    assert "Traceback" not in err


def test_usage() -> None:
    proc = subprocess.run([sys.executable, str(PREFLIGHT)], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.startswith("usage: preflight.py INSTANCES_JSON")


def test_version_gap_names_the_flag_or_key_the_pin_lacks() -> None:
    pin = "0.30.0"
    assert version_gap("unrecognized arguments: --tool-call-parser-plugin x.py", pin) == (
        "the recipe needs a newer vLLM than the pin 0.30.0 (flag --tool-call-parser-plugin is "
        "not in it)"
    )
    assert version_gap("unrecognized arguments: --new-flag=3 --other", "0.31.2") == (
        "the recipe needs a newer vLLM than the pin 0.31.2 (flag --new-flag is not in it)"
    )
    nested = (
        "argument --compilation-config/-cc: 2 validation errors for CompilationConfig\n"
        "mode\n  Input should be 0, 1, 2 or 3 [type=enum, input_value=9, input_type=int]\n"
        "pass_config.fuse_x\n  Unexpected keyword argument [type=unexpected_keyword_argument, "
        "input_value=1, input_type=int]\n    For further information visit https://errors.x/v/u"
    )
    assert unknown_key(nested) == "pass_config.fuse_x" and flag_of(nested) == "--compilation-config"
    assert version_gap(nested, pin) == (
        "the recipe needs a newer vLLM than the pin 0.30.0 (key pass_config.fuse_x of "
        "--compilation-config is not in it)"
    )
    assert "For further information" not in one_line(nested)
    for other in (
        "argument --kv-transfer-config: 1 validation error for KVTransferConfig\nkv_role\n"
        "  Input should be 'kv_producer', 'kv_both' or 'kv_consumer' [type=literal_error]",
        "argument --max-model-len: invalid human_readable_int value: 'lots'",
        "unrecognized arguments: stray",  # a second model, not a flag
        "ValueError: The supplied chat template string (x.jinja) appears path-like, but "
        "doesn't exist! Tried: x.jinja and /v/x.jinja",
    ):
        assert version_gap(other, pin) is None, other
    assert flag_of("TypeError: Error: --enable-auto-tool-choice requires --tool-call-parser") == (
        "--enable-auto-tool-choice"
    )
    assert flag_of("KeyError: 'SOMETIMES'") == "vllm"
    assert len(one_line("x" * 5000)) == 2000


def test_the_program_imports_only_the_standard_library_at_its_top() -> None:
    """It runs under the release's python before anything else of ours is there: the standard
    library at module level, vLLM only inside the functions that the child runs."""
    tree = ast.parse(PREFLIGHT.read_text())
    top: set[str] = set()
    inner: set[str] = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        where = top if node in tree.body else inner
        where.update(n.split(".")[0] for n in names)
    assert top - {"__future__"} <= set(sys.stdlib_module_names)
    assert inner - set(sys.stdlib_module_names) == {"vllm"}


# ---------------------------------------------------------------------------------------------
# The pass marker under a kill: the deploy step's own command (steps/preflight.py), run by sh
# on this machine with the host program in a release venv that has the simulator's vllm

# each fake logs its call, then either kills the step's command where it is (SIGKILL to its
# process group, a session of its own: the shell and the fake die, as a controller or
# connection lost mid-command leaves them) or runs the real one
FAKE = """#!/bin/sh
echo {name} >> "$FAULT_LOG"
if [ "$KILL_AT" = {name} ]; then kill -KILL 0; fi
{then}
"""
RUNUSER = 'while [ "$1" != -- ]; do shift; done; shift; exec "$@"'  # as the serve user: here, us


@pytest.fixture
def host(site: Path, tmp_path: Path) -> dict[str, Any]:
    """A host root (serve_root) whose release is a venv seeing the simulator's vllm, with
    lib/preflight.py, and fakes of runuser, install and touch on PATH."""
    from host_inputs import probe, settings

    data = settings(serve_root=str(tmp_path / "root"))
    plan = plan_host(data, probe())
    release = Path(plan.release.path)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(release)], check=True)
    (purelib,) = release.glob("lib/python*/site-packages")
    (purelib / "sim-vllm.pth").write_text(f"{site}\n")
    Path(plan.lib).mkdir(parents=True)
    shutil.copy(PREFLIGHT, Path(plan.lib) / "preflight.py")
    fakes = tmp_path / "bin"
    fakes.mkdir()
    for name, then in (
        ("runuser", RUNUSER),
        ("install", f'exec {shutil.which("install")} "$@"'),
        ("touch", f'exec {shutil.which("touch")} "$@"'),
    ):
        (fakes / name).write_text(FAKE.format(name=name, then=then))
        (fakes / name).chmod(0o755)
    return {"settings": data, "plan": plan, "bin": fakes, "log": tmp_path / "calls"}


def run_step(host: dict[str, Any], plan: HostPlan, kill_at: str = "") -> int:
    """Run the pre-flight step's command as the host would (its stdin too); its exit status."""
    found = step_command(plan)
    assert found is not None
    cmd, stdin = found
    env = {"PATH": f"{host['bin']}:/usr/bin:/bin", "FAULT_LOG": str(host["log"]),
           "KILL_AT": kill_at, "PYTHONDONTWRITEBYTECODE": "1"}  # fmt: skip
    proc = subprocess.run(["sh", "-c", cmd], input=stdin, env=env, capture_output=True, text=True,
                          timeout=300, start_new_session=True)  # fmt: skip
    return proc.returncode


def passed_keys(plan: HostPlan) -> list[str]:
    """The pass markers as the host's probe reads them (remote/probe.py's own preflights())."""
    code = (f"import json, sys; sys.path.insert(0, {str(REMOTE)!r}); import probe; "
            f"print(json.dumps(probe.preflights({f'{plan.state_dir}/{LAYOUT_PREFLIGHT}'!r})))")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    keys: list[str] = json.loads(proc.stdout)
    return keys


@pytest.mark.parametrize("kill_at", ["install", "touch"])
def test_a_run_killed_after_the_preflight_passed_but_before_its_marker_runs_it_again(
    host: dict[str, Any], kill_at: str
) -> None:
    """Killed after the pre-flight passed (before the marker's directory, or between it and the
    marker): no marker, so the next run's plan runs the pre-flight again, which writes it; the
    run after that needs none."""
    from host_inputs import probe

    plan = host["plan"]
    assert plan.preflight_needed
    assert run_step(host, plan, kill_at) == -signal.SIGKILL
    assert host["log"].read_text().split() == [
        "runuser",
        "install",
        *(["touch"] * (kill_at == "touch")),
    ]
    assert passed_keys(plan) == []
    again = plan_host(host["settings"], probe(preflight=passed_keys(plan)))
    assert again.preflight_needed and step_command(again) == step_command(plan)
    assert run_step(host, again) == 0
    assert host["log"].read_text().split().count("runuser") == 2  # the pre-flight ran again
    assert passed_keys(plan) == [plan.preflight_key]
    reached = plan_host(host["settings"], probe(preflight=passed_keys(plan)))
    assert not reached.preflight_needed and step_command(reached) is None


def test_a_run_killed_after_the_marker_runs_nothing_twice(host: dict[str, Any]) -> None:
    """The run dies after the step's command ended (the marker written): the next run's plan
    has no pre-flight to run."""
    from host_inputs import probe

    plan = host["plan"]
    assert run_step(host, plan) == 0
    assert host["log"].read_text().split() == ["runuser", "install", "touch"]
    assert passed_keys(plan) == [plan.preflight_key]
    again = plan_host(host["settings"], probe(preflight=passed_keys(plan)))
    assert not again.preflight_needed and step_command(again) is None
    assert host["log"].read_text().split().count("runuser") == 1


def test_the_plans_preflight_fact_reads_the_programs_json_lines() -> None:
    """PreflightRefusal.process (the fact `servefleet plan` reads): None for a passing line (its
    process had sat after another function's return, so a pass read as a refusal), the first
    refused instance's line with its gap otherwise; non-JSON lines are passed over."""
    from servefleet.entry.steps.facts import PreflightRefusal

    fact = PreflightRefusal()
    passing = ['{"ok": true, "unit": "servefleet-vllm-0.service"}']
    assert fact.process(passing) is None
    refused = {"unit": "u1", "ok": False, "line": "u1: --x: unrecognized arguments: --x",
               "gap": "the recipe needs a newer vLLM than the pin 0.30.0 (flag --x is not in it)"}  # fmt: skip
    out = fact.process([*passing, "noise", json.dumps(refused)])
    assert out == f"pre-flight: {refused['line']}; {refused['gap']}"
    assert fact.process([json.dumps({**refused, "gap": None})]) == f"pre-flight: {refused['line']}"


def test_a_vllm_whose_entry_point_moved_refuses_in_one_line_naming_version_and_name(
    tmp_path: Path,
) -> None:
    """A vLLM whose ``vllm.entrypoints.cli.serve`` has no ``setup_server`` (a future move): every
    instance is refused with the version and the missing name, never passed."""
    cli = tmp_path / "vllm" / "entrypoints" / "cli"
    cli.mkdir(parents=True)
    for pkg in (tmp_path / "vllm", cli.parent, cli):
        (pkg / "__init__.py").write_text("")
    (cli / "serve.py").write_text(
        "import argparse\nFlexibleArgumentParser = argparse.ArgumentParser\n"
    )
    info = tmp_path / "vllm-0.31.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.31.0\n")
    data = json.dumps([{"unit": "u.service", "argv": ["vllm", "serve", "m"],
                        "env": {"PYTHONPATH": str(tmp_path)}}])  # fmt: skip
    proc = subprocess.run([sys.executable, str(REMOTE / "preflight.py"), data],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 1
    result = json.loads(proc.stdout)
    assert result["ok"] is False
    assert result["message"].startswith(
        "cannot check with vLLM 0.31.0: vllm.entrypoints.cli.serve has no setup_server"
    )
    assert proc.stderr.count("\n") == 1
