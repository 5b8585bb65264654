"""#33, #47: the recipe family seam and the platform seam. A test-only family and its platform
(``tests/testkind``: ``Testkind`` behind ``servefleet.kinds.base.Kind``, ``Testbox`` behind
``servefleet.platforms.base.Platform``; no file under ``src/`` names them) are registered here,
and resolve (through ``servefleet resolve`` with the family's option), plan, render and run the
platform's own driver step through the real ``pyinfra`` CLI on the ``@local`` connector, with
the family's own defaults."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from repo_paths import REPO

from servefleet.base.errors import RecipeError
from servefleet.base.remote import REMOTE
from servefleet.base.remote.layout import RELEASE_MARKER, RELEASES
from servefleet.entry.cli import main
from servefleet.entry.cmd_resolve import resolve_command
from servefleet.hostplan.plan import plan_host
from servefleet.hostplan.probe_input import probe_args
from servefleet.kinds import KINDS, default_kind, kind_of, register, unregister
from servefleet.kinds.rbln.kind import KIND as RBLN
from servefleet.settings import table
from servefleet.settings.table import DEFAULTS, KIND, Settings, settings_from

TESTS = REPO / "tests"
sys.path.insert(0, str(TESTS))
from testkind import RECIPE, Testbox, Testkind, register_both, unregister_both  # noqa: E402

PYINFRA = Path(sys.executable).parent / "pyinfra"


@pytest.fixture
def state(tmp_path: Path) -> Path:
    """The test kind's host files: two TB-1 boxes, no driver yet."""
    where = tmp_path / "state"
    where.mkdir()
    (where / "devices").write_text("0 TB-1\n1 TB-1\n")
    return where


@pytest.fixture
def both(state: Path) -> Iterator[tuple[Testkind, Testbox]]:
    """The test family and its platform, registered for the test only."""
    made = register_both(str(state))
    yield made
    unregister_both(*made)


@pytest.fixture
def kind(both: tuple[Testkind, Testbox]) -> Testkind:
    """The test family (registered with its platform)."""
    return both[0]


@pytest.fixture
def platform(both: tuple[Testkind, Testbox]) -> Testbox:
    """The test platform (registered with its family)."""
    return both[1]


def data_of(tmp_path: Path) -> dict[str, Any]:
    """A host's data naming the test kind's recipe: only what the host sets (the rest its kind's
    defaults, then the key table's)."""
    return {
        "serve_recipe": str(RECIPE),
        "serve_root": str(tmp_path / "opt"),
        "sdk_installer": "pip",
    }


def settings_of(tmp_path: Path) -> Settings:
    data = data_of(tmp_path)
    return settings_from(data.get, {}, keys=data.keys())


def probe_of(**over: Any) -> dict[str, Any]:
    found = {"kernel": "6.1.0-x", "libc": "glibc 2.39", "boxes": ["0 TB-1", "1 TB-1"],
             "box_driver": None, "releases": [], "units": {}, "warm": [], "models": []}  # fmt: skip
    return {**found, **over}


def test_no_file_under_src_names_the_test_kind() -> None:
    named = [
        str(p.relative_to(REPO))
        for p in (REPO / "src").rglob("*")
        if p.is_file() and b"testkind" in p.read_bytes().lower()
    ]
    assert named == []


def test_the_key_table_holds_no_platform_value() -> None:
    """The keys a platform decides say KIND in the table; the defaults of a host whose data names
    no recipe are the default kind's (RBLN's) for those, the table's for every other key."""
    from dataclasses import fields

    written = {f.name: f.metadata["default"] for f in fields(Settings) if f.name in table.KEYS}
    decided = sorted(k for k, v in written.items() if v is KIND)
    assert decided == sorted(RBLN.defaults)
    assert "rbln" not in repr(written).lower()
    assert default_kind() is RBLN
    assert DEFAULTS == {k: RBLN.defaults[k] if v is KIND else v for k, v in written.items()}


def test_the_test_kind_resolves_through_the_cli_with_its_own_option(kind: Testkind) -> None:
    """``servefleet resolve`` made after the kind is registered takes its option; another kind's
    option given to its recipe is refused in one line, as between the built-in kinds."""
    resolve = resolve_command()
    result = CliRunner().invoke(resolve, [str(RECIPE), "--lanes", "2"])
    assert result.exit_code == 0, result.output
    spec = json.loads(result.output)
    assert spec["kind"] == "testkind" and spec["selection"] == {"lanes": "2"}
    assert spec["servers"][0]["npus"] == 2
    assert spec["servers"][0]["argv"][:3] == ["vllm", "serve", "testorg/tiny-model"]
    assert "Testkind: boxes a server takes." in CliRunner().invoke(resolve, ["--help"]).output
    shell = CliRunner().invoke(resolve, [str(RECIPE), "--format", "shell"])
    assert shell.output == "TESTBOX_LANES=1 vllm serve testorg/tiny-model --max-model-len 512\n"
    refused = CliRunner().invoke(resolve, [str(RECIPE), "--target", "Throughput"])
    assert refused.exit_code != 0 and isinstance(refused.exception, RecipeError)
    assert "--target applies to the other kind of recipe only" in str(refused.exception)
    assert "(its options: --lanes, --strategy, --format)" in str(refused.exception)
    unregister(kind)
    try:
        assert "--lanes" not in CliRunner().invoke(resolve_command(), ["--help"]).output
    finally:
        register(kind)


def test_register_refuses_a_taken_name_or_option_and_keeps_the_built_in_kinds(
    kind: Testkind, state: Path
) -> None:
    with pytest.raises(RecipeError, match="kind 'testkind' cannot be registered: the name is"):
        register(Testkind())
    other = Testkind()
    other.kind = "otherkind"
    with pytest.raises(RecipeError, match="option --lanes is testkind's"):
        register(other)
    with pytest.raises(RecipeError, match="kind 'rbln' is built in"):
        unregister(RBLN)
    assert [k.kind for k in KINDS] == ["rbln", "testkind", "vllm"]


def test_its_probe_commands_run_in_the_host_probe_and_it_reads_their_output(
    kind: Testkind, platform: Testbox, state: Path, tmp_path: Path
) -> None:
    """The probe input carries the platform's device commands; the host program runs them as it
    runs RBLN's and the GPUs' (``remote/probe.py``'s ``accelerators``), and the platform reads
    what they printed."""
    args = json.loads(
        probe_args(settings_of(tmp_path), kind.resolve_data(settings_of(tmp_path)), False)
    )
    commands = args["accelerators"]
    assert commands == [
        [n, list(argv), form, unless] for n, argv, form, unless in platform.probe_commands
    ]
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import probe; out = {}; "
            "probe.accelerators(out, json.loads(sys.argv[2])); print(json.dumps(out))")  # fmt: skip
    run = [sys.executable, "-c", code, str(REMOTE), json.dumps(commands)]
    out = json.loads(subprocess.run(run, capture_output=True, text=True, check=True).stdout)
    assert out == {"boxes": ["0 TB-1", "1 TB-1"], "box_driver": None}
    hardware = platform.read(out)
    assert hardware is not None
    assert (hardware.skus, hardware.devices, hardware.driver_version) == (
        ("TB-1",) * 2,
        (0, 1),
        None,
    )
    (state / "driver.json").write_text('{"version": "1.0"}')
    out = json.loads(subprocess.run(run, capture_output=True, text=True, check=True).stdout)
    assert (read := platform.read(out)) is not None and read.driver_version == "1.0"


def test_it_plans_and_renders_from_its_own_defaults(kind: Testkind, tmp_path: Path) -> None:
    """Its defaults are the host's (its pin, no index, its driver version); the plan gives each
    box group a unit with the kind's devices variable, a release of its top package, and a driver
    change, all through the kind's interface."""
    s = settings_of(tmp_path)
    assert kind_of(s.serve_recipe) is kind
    assert (s.sdk_pins, s.pip_indexes, s.driver_version) == ({"testbox-serve": "1.0"}, (), "1.0")
    plan = plan_host(s, probe_of())
    assert plan.refusal is None and plan.driver_needed and plan.hardware.source == "testbox-list"
    assert plan.release.requirements == ["testbox-serve==1.0"]
    assert [i.devices for i in plan.instances] == ["0", "1"]
    unit = plan.instances[1].text
    assert 'Environment="TESTBOX_VISIBLE_DEVICES=1"' in unit and "(port 8001, boxes 1)" in unit
    assert f'ExecStart="{plan.release.path}/bin/vllm" "serve" "testorg/tiny-model"' in unit
    assert plan_host(s, probe_of(box_driver={"version": "1.0"})).driver_needed is False
    wrong = plan_host(s, probe_of(boxes=["0 TB-2"]))
    assert wrong.refusal == "host boxes ('TB-2',) are not TB-1"
    # the docs name where its defaults live
    sdk_pins = CliRunner().invoke(main, ["keys", "sdk_pins"]).output
    assert "testkind recipes: their own default (testkind/defaults.py)" in sdk_pins


def _deploy(
    tmp_path: Path, state: Path, writes: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``pyinfra -y inventory.py deploy.py`` on ``@local``: a deploy file that registers the kind
    and runs servefleet's driver deploy on the host's plan (its real probe)."""
    data = data_of(tmp_path)
    (tmp_path / "inventory.py").write_text(f"hosts = [('@local', {data!r})]\n")
    (tmp_path / "deploy.py").write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(TESTS)!r})\n"
        "from testkind import register_both\n"
        f"register_both({str(state)!r}, writes={writes!r})\n"
        "from servefleet.entry.deploys import driver, host_plan\n"
        "driver(plan=host_plan())\n"
    )
    return subprocess.run(
        [str(PYINFRA), "-y", "inventory.py", "deploy.py"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # pyinfra writes its progress to stderr
        text=True,
        timeout=300,
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="the driver deploy makes root's directories")
def test_its_driver_step_runs_through_pyinfra_on_local(
    kind: Testkind, state: Path, tmp_path: Path
) -> None:
    """The driver deploy plans the host from its real probe (the kind's commands), runs the
    kind's driver change (install, check, servers back) and a second run has nothing to do.
    Everything it writes is under tmp_path: serve_root and the kind's state."""
    plan = plan_host(settings_of(tmp_path), probe_of())
    # the host holds its release: the driver deploy installs none (nor resolves one)
    release = tmp_path / "opt" / RELEASES / plan.release.id
    release.mkdir(parents=True)
    (release / RELEASE_MARKER).write_text("{}\n")
    first = _deploy(tmp_path, state)
    assert first.returncode == 0, first.stdout
    assert json.loads((state / "driver.json").read_text()) == {"version": "1.0"}
    assert (state / "install-1.0.log").read_text() == "installing\n"
    assert (
        "Install driver 1.0" in first.stdout and "Check that cat reports driver 1.0" in first.stdout
    )
    assert (tmp_path / "opt" / "lib" / "driver.py").is_file()
    again = _deploy(tmp_path, state)
    assert again.returncode == 0, again.stdout
    assert "Install driver" not in again.stdout and "Grand total   -" in again.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="the driver deploy makes root's directories")
def test_its_driver_check_fails_the_host_when_the_driver_reports_another_version(
    kind: Testkind, state: Path, tmp_path: Path
) -> None:
    plan = plan_host(settings_of(tmp_path), probe_of())
    release = tmp_path / "opt" / RELEASES / plan.release.id
    release.mkdir(parents=True)
    (release / RELEASE_MARKER).write_text("{}\n")
    failed = _deploy(tmp_path, state, writes="0.9")
    assert failed.returncode != 0
    assert "servefleet: cat reports driver 0.9, wanted 1.0" in failed.stdout
    assert json.loads((state / "driver.json").read_text()) == {"version": "0.9"}
