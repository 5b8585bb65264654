"""Tests for the bugs of issue #37 that got through the unit suite, one test or more each.

Each was shown failing under its mutant (applied by hand to the source, then reverted):

1. ``kinds/rbln/resolve.py``: option deltas applied before mode deltas.
2. ``kinds/vllm/layers.py``: ``ENV_ORDER`` with kv_offload after strategy_overrides.
3. ``kinds/vllm/sizing.py``: a parallel size of 0 accepted.
4. ``base/remote/trusted.py``: ``read()`` opening without ``O_NOFOLLOW``.
5. ``base/remote/instances.py``: ``converge`` never rolling back.
6. ``entry/steps/facts.py``: ``WheelhouseFiles.process`` returning the raw output (in
   test_facts_process.py, with every fact's ``process()``).
7. ``rollout.py``: ``--max-failures`` counted per batch instead of over the rollout.
8. The compile fingerprint: every flag of vLLM's own table that the fingerprint's table counts
   changes it, every other one does not, and ``--quantization`` is among those that count.
"""

from __future__ import annotations

import errno
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from flag_settings import FLAGS, settings, spelling
from rbln_cases import COMPILER, TINY
from repo_paths import REMOTE

from servefleet.base import flags
from servefleet.base.errors import RecipeError
from servefleet.fleet.rollout import Rollout
from servefleet.kinds.rbln import compile_table, fingerprint as fpm
from servefleet.kinds.rbln.card import load_card
from servefleet.kinds.rbln.resolve import resolve_rbln
from servefleet.kinds.vllm import load_vllm_recipe, resolve_vllm

sys.path.insert(0, str(REMOTE))
import instances  # noqa: E402  (a host program: imported as the host imports it)
import layout  # noqa: E402
import restart_gate  # noqa: E402
import systemd_units  # noqa: E402
import trusted  # noqa: E402
import warm_state  # noqa: E402

# ---------------------------------------------------------------------------------------------
# 1. RBLN: within a role, the deltas apply in the order of the grid's modes, then its options
# (resolve.py's step 4), so an option's delta wins over a mode's on the same key.


def _tiny_with_option_delta(tmp_path: Path) -> Path:
    """tiny-moe with a ``sampler=on`` delta (an option) touching what ``lmcache=cpu`` (a mode)
    adds (``--max-num-seqs``, ``LMCACHE_CHUNK_SIZE``) and deleting what ``spec_decode=eagle3``
    (a mode) adds (``--speculative-config``)."""
    card = json.loads(TINY.read_text())
    grid = card["strategies"][0]["options"][0]["grid"]
    grid["deltas"]["sampler=on"] = {
        "main": {
            "add_args": {"--max-num-seqs": "--max-num-seqs 3"},
            "add_envs": {"LMCACHE_CHUNK_SIZE": "LMCACHE_CHUNK_SIZE=512"},
            "del_args": ["--speculative-config"],
            "del_envs": [],
        }
    }
    path = tmp_path / "both-touch.json"
    path.write_text(json.dumps(card))
    return path


def test_an_option_delta_applies_after_a_mode_delta_on_the_same_key(tmp_path: Path) -> None:
    card = load_card(_tiny_with_option_delta(tmp_path), name="rbln/both-touch")
    spec = resolve_rbln(card, sets={"lmcache": "cpu", "sampler": "on"}, compiler_version=COMPILER)
    main = spec.servers[0]
    # the mode's value first (2, 256), then the option's over it, in the key's base place
    assert main.argv[3:5] == ["--max-num-seqs", "3"], main.argv
    assert main.argv.count("--max-num-seqs") == 1
    assert main.env["LMCACHE_CHUNK_SIZE"] == "512"
    # without the option's delta the mode's value stands
    alone = resolve_rbln(card, sets={"lmcache": "cpu", "sampler": "off"}).servers[0]
    assert alone.argv[3:5] == ["--max-num-seqs", "2"] and alone.env["LMCACHE_CHUNK_SIZE"] == "256"


def test_an_option_delta_deletes_what_a_mode_delta_added(tmp_path: Path) -> None:
    card = load_card(_tiny_with_option_delta(tmp_path), name="rbln/both-touch")
    kept = resolve_rbln(card, sets={"spec_decode": "eagle3", "sampler": "off"}).servers[0]
    assert any(w.startswith("--speculative-config") for w in kept.argv)
    gone = resolve_rbln(card, sets={"spec_decode": "eagle3", "sampler": "on"})
    assert not any(w.startswith("--speculative-config") for w in gone.servers[0].argv)
    assert gone.requirements.models == ["acme/tiny-moe"]  # no draft model to fetch


# ---------------------------------------------------------------------------------------------
# 2. vLLM env: the KV-offload option's env, then the strategy overrides' (ENV_ORDER), so a
# recipe's strategy override of a variable the option sets wins.

ENV_RECIPE = """\
meta:
  hardware: {h200: verified}
model:
  model_id: acme/env-8b
variants:
  default: {precision: bf16, vram_minimum_gb: 16}
compatible_strategies: [single_node_tp]
kv_offload_support:
  offloading_fs: verified
"""


def test_a_strategy_override_env_wins_over_the_kv_offload_env(tmp_path: Path) -> None:
    plain = tmp_path / "plain.yaml"
    plain.write_text(ENV_RECIPE)
    # the taxonomy's offloading_fs sets PYTHONHASHSEED=0 (the shipped taxonomy: no root here)
    env = resolve_vllm(load_vllm_recipe(plain), kv_offload="offloading_fs").servers[0].env
    assert env["PYTHONHASHSEED"] == "0"
    override = tmp_path / "override.yaml"
    override.write_text(
        ENV_RECIPE + 'strategy_overrides:\n  single_node_tp:\n    env: {PYTHONHASHSEED: "7"}\n'
    )
    spec = resolve_vllm(load_vllm_recipe(override), kv_offload="offloading_fs")
    assert spec.servers[0].env["PYTHONHASHSEED"] == "7"
    assert spec.selection["kv_offload"] == "offloading_fs"


# ---------------------------------------------------------------------------------------------
# 3. vLLM: a parallel size of 0 in the final argv is refused, not a server on no GPU


@pytest.mark.parametrize(
    "flag", ["--data-parallel-size", "--pipeline-parallel-size", "--tensor-parallel-size", "-dp"]
)
def test_a_parallel_size_of_zero_is_refused(tmp_path: Path, flag: str) -> None:
    path = tmp_path / "zero.yaml"
    path.write_text(ENV_RECIPE + f'hardware_overrides:\n  h200:\n    extra_args: ["{flag}", "0"]\n')
    with pytest.raises(RecipeError) as err:
        resolve_vllm(load_vllm_recipe(path), hardware="h200")
    msg = str(err.value)
    assert f"{flag} 0 on h200 is not a positive GPU count" in msg and "\n" not in msg


# ---------------------------------------------------------------------------------------------
# 4. trusted.read: the file read is never a link (a serve user's planted marker)


def test_read_refuses_a_link_planted_as_the_file(tmp_path: Path) -> None:
    secret = tmp_path / "root-only"
    secret.write_text('{"dirs": [], "source": "planted"}\n')
    secret.chmod(0o600)
    marker_dir = tmp_path / "warm"
    marker_dir.mkdir()
    (marker_dir / "real").write_text("ours\n")
    (marker_dir / "planted").symlink_to(secret)  # absolute
    (marker_dir / "relative").symlink_to("real")  # to a regular file beside it
    fd = os.open(marker_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert trusted.read(fd, "real") == "ours\n"
        for name in ("planted", "relative"):
            with pytest.raises(OSError) as err:
                trusted.read(fd, name)
            assert err.value.errno == errno.ELOOP, name
    finally:
        os.close(fd)


def test_a_warm_marker_planted_as_a_link_is_not_warm(tmp_path: Path) -> None:
    """The consequence on the host: the warm record behind a link is never read."""
    cache = tmp_path / "cache"
    warm = cache / layout.WARM_DIR
    warm.mkdir(parents=True, mode=0o755)
    warm.chmod(0o755)
    record = tmp_path / "elsewhere.json"
    record.write_text(json.dumps({"dirs": ["rbln/m/sig"], "source": "compiled"}))
    (warm / "ab").mkdir()  # a directory named like a marker is not one either
    (warm / ("cd" * 32)).write_text(json.dumps({"dirs": [], "source": "compiled"}))
    (warm / ("ef" * 32)).symlink_to(record)
    state = {"cache_root": str(cache)}
    assert warm_state.warm_record(state, "cd" * 32) == {"dirs": [], "source": "compiled"}
    assert warm_state.warm_record(state, "ef" * 32) is None
    assert warm_state.warm_record(state, "ab") is None


# ---------------------------------------------------------------------------------------------
# 5. instances.converge: a failed gate rolls the host back to good.json, through the gate


def _unit(sha: str) -> str:
    return f'[Service]\nEnvironment="{layout.UNIT_SHA_VAR}={sha}"\nExecStart=/bin/true {sha}\n'


def _state(release: str, sha: str, text: bool) -> dict[str, Any]:
    inst: dict[str, Any] = {"unit": "servefleet-vllm-0.service", "sha": sha, "port": 8000,
                            "devices": "0", "fingerprint": "-"}  # fmt: skip
    if text:
        inst["text"] = _unit(sha)
    return {"root": "/opt/servefleet", "release": release, "model": "acme/m", "host": None,
            "cache_root": "/nonexistent", "devices_env": "RBLN_VISIBLE_DEVICES",
            "health_timeout": 5, "prewarm_timeout": 5, "instances": [inst], "stale": []}  # fmt: skip


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, Any]:
    """A host serving release r1 (sha a1, good.json and its kept unit), its systemd and gates
    the test's: a unit restarted to sha b2 fails its gate."""
    root = tmp_path / "opt"
    state_dir = root / layout.STATE
    (state_dir / layout.KEPT_UNITS).mkdir(parents=True)
    units = tmp_path / "units"
    units.mkdir()
    unit = "servefleet-vllm-0.service"
    (units / unit).write_text(_unit("a1"))
    (state_dir / layout.KEPT_UNITS / "a1.service").write_text(_unit("a1"))
    good = _state("r1", "a1", text=False)
    (state_dir / layout.GOOD).write_text(json.dumps(good))
    os.symlink(f"{layout.RELEASES}/r1", root / layout.CURRENT)
    running = {unit: "a1"}
    gates: list[str] = []

    def live(devices_env: str) -> dict[str, dict[str, Any]]:
        return {u: {"active": "active", "pid": 1, "sha": s, "port": 8000, "devices": {"0"}}
                for u, s in running.items()}  # fmt: skip

    def start_through_gate(state: dict[str, Any], inst: dict[str, Any], restart: bool) -> None:
        running[inst["unit"]] = inst["sha"]  # restarted on the text bring_to wrote
        gates.append(inst["sha"])
        if inst["sha"] == "b2":
            raise systemd_units.Failed(f"health gate: {inst['unit']}: answered 500 to the chat")

    monkeypatch.setattr(systemd_units, "UNIT_DIR", units)
    monkeypatch.setattr(systemd_units, "systemctl", lambda *a, check=True: "")
    monkeypatch.setattr(systemd_units, "live", live)
    monkeypatch.setattr(restart_gate, "start_through_gate", start_through_gate)
    desired = state_dir / layout.DESIRED
    desired.write_text(json.dumps(_state("r2", "b2", text=True)))
    return {"root": root, "state_dir": state_dir, "units": units, "unit": unit,
            "running": running, "gates": gates, "desired": desired, "good": good}  # fmt: skip


def test_converge_rolls_back_to_the_good_state_when_a_gate_fails(
    host: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    assert instances.converge(host["desired"]) == 1
    err = capsys.readouterr().err
    assert "servefleet: health gate: servefleet-vllm-0.service: answered 500" in err
    assert "servefleet: rolled back to r1" in err
    assert host["gates"] == ["b2", "a1"]  # the new unit's gate, then the good one's
    assert host["running"] == {host["unit"]: "a1"}
    assert (host["units"] / host["unit"]).read_text() == _unit("a1")
    assert os.readlink(host["root"] / layout.CURRENT) == f"{layout.RELEASES}/r1"
    assert json.loads((host["state_dir"] / layout.GOOD).read_text()) == host["good"]
    assert not (host["state_dir"] / layout.KEPT_UNITS / "b2.service").exists()


def test_converge_without_a_good_state_says_so(
    host: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    (host["state_dir"] / layout.GOOD).unlink()
    assert instances.converge(host["desired"]) == 1
    assert "no earlier good state on this host to roll back to" in capsys.readouterr().err
    assert host["gates"] == ["b2"]


# ---------------------------------------------------------------------------------------------
# 7. rollout: --max-failures counts every failed host of the rollout, not of one batch


class _Scripted(Rollout):
    """A Rollout whose pyinfra runs fail the hosts of ``fail`` (no real pyinfra)."""

    def __init__(self, fail: set[str]) -> None:
        self.fail, self.runs, self.lines = fail, list[list[str]](), list[str]()
        super().__init__(inventory="inv.py", deploy="serve.py", pyinfra_args=[],
                         report=lambda kind, hosts: {}, echo=self.lines.append)  # fmt: skip

    def pyinfra(
        self, hosts: list[str], deploy: str, compiling: Sequence[str] = ()
    ) -> tuple[int, dict[str, Any] | None, str]:
        self.runs.append(list(hosts))
        failed = sorted(set(hosts) & self.fail)
        err = "".join(f"[{h}] servefleet: {h}: the gate failed: instance 0 answered 500\n"
                      for h in failed)  # fmt: skip
        return (1 if failed else 0), {"failed_hosts": failed}, err


def test_max_failures_counts_failures_over_every_batch() -> None:
    plan = [["h1"], ["h2", "h3"], ["h4", "h5"], ["h6"]]
    r = _Scripted({"h1", "h3"})  # one failed host in each of the first two batches
    assert not r.run(plan, max_failures=1)
    assert r.runs == [["h1"], ["h2", "h3"]]  # stopped after the second failure
    results = {h: x.result for h, x in r.results.items()}
    assert results == {"h1": "failed", "h2": "ok", "h3": "failed", "h4": "not reached",
                       "h5": "not reached", "h6": "not reached"}  # fmt: skip
    # the same failures within the limit: every batch runs
    r = _Scripted({"h1", "h3"})
    assert r.run(plan, max_failures=2)
    assert r.runs == plan


# ---------------------------------------------------------------------------------------------
# 8. The compile fingerprint against vLLM's own flag table (the dump of vllm-rbln 0.12.0's
# parser, flags.py's): the fingerprint's table (COMPILE_INPUTS: the flags it reads, the
# ``--rbln-*`` options but RBLN_NOT_COMPILED, the speculative config's fields) says which flags
# change the compiled graph; each of those changes the fingerprint, every other flag of vLLM's
# table does not.

BASE = ["vllm", "serve", "m/x"]
SPEC_A = '{"method": "eagle3", "model": "d/1", "num_speculative_tokens": 2, "x": 1}'
SPEC_B = '{"method": "suffix", "model": "d/2", "num_speculative_tokens": 3, "x": 2}'


_READ = {
    n
    for e in compile_table.COMPILE_INPUTS
    if e.source in ("model", "flag", "json", "presence")
    for n in e.names
}
_SPEC = any(e.source == "spec" for e in compile_table.COMPILE_INPUTS)


def _counted(dest: str) -> bool:
    """Whether the fingerprint's table counts the flag that sets ``dest``."""
    if dest.replace("_", "-") in _READ:
        return True
    if dest == "speculative_config":
        return _SPEC
    return dest.startswith("rbln_") and dest[len("rbln_") :] not in compile_table.RBLN_NOT_COMPILED


COUNTED = [e for e in FLAGS if _counted(e["dest"])]
NOT_COUNTED = [e for e in FLAGS if not _counted(e["dest"])]


def _settings(entry: dict[str, Any]) -> list[list[str]]:
    """Two settings of the flag that differ (a JSON flag: two speculative configs)."""
    return settings(entry, lambda _: [SPEC_A, SPEC_B])


def _fp(argv: list[str], env: dict[str, str] | None = None) -> str:
    return fpm.compile_fingerprint(argv, env or {}, 1, "RBLN-CR13", COMPILER)


def _ids(entries: list[dict[str, Any]]) -> list[str]:
    return [spelling(e) for e in entries]


def test_the_table_splits_vllms_flags_and_quantization_counts() -> None:
    spellings = {spelling(e) for e in COUNTED}
    # what rbln.md §3.5 names as triggers, --quantization among them (the golden-only catch)
    assert {
        "--quantization",
        "--model",
        "--dtype",
        "--max-model-len",
        "--block-size",
        "--max-num-seqs",
        "--max-num-batched-tokens",
        "--gpu-memory-utilization",
        "--num-gpu-blocks-override",
        "--tensor-parallel-size",
        "--pipeline-parallel-size",
        "--data-parallel-size",
        "--enable-expert-parallel",
        "--speculative-config",
        "--kv-transfer-config",
        "--rbln-use-w8a8",
    } <= spellings
    # every flag the fingerprint reads is one vLLM has (a renamed flag would count nothing)
    table = {n.lstrip("-") for e in FLAGS for n in e["flags"]}
    assert _READ <= table
    # what the fingerprint documents as not counted is on the other side
    not_counted = {n for e in NOT_COUNTED for n in e["flags"]}
    assert {
        k for k in compile_table.NOT_COUNTED if k.startswith("--") and " " not in k
    } <= not_counted
    assert len(COUNTED) > 30 and len(NOT_COUNTED) > 200


@pytest.mark.parametrize("entry", COUNTED, ids=_ids(COUNTED))
def test_every_counted_flag_changes_the_fingerprint(entry: dict[str, Any]) -> None:
    settings = _settings(entry)
    # the positional model wins over --model (vllm serve's model_tag): --model alone, here
    base = BASE[:2] if entry["dest"] == "model" else BASE
    prints = [_fp(base + s) for s in settings]
    if entry["dest"] == "kv_transfer_config":  # its presence counts, its content does not
        assert prints[0] == prints[1] != _fp(BASE)
    elif len(settings) == 1:
        assert prints[0] != _fp(BASE), settings
    else:
        assert prints[0] != prints[1], settings


@pytest.mark.parametrize("entry", NOT_COUNTED, ids=_ids(NOT_COUNTED))
def test_every_other_flag_leaves_the_fingerprint(entry: dict[str, Any]) -> None:
    base = _fp(BASE)
    for setting in _settings(entry):
        assert _fp(BASE + setting) == base, setting


def test_compile_env_vars_change_it_and_the_others_of_vllms_list_do_not() -> None:
    counted = {e.names[0] for e in compile_table.COMPILE_INPUTS if e.source == "env"}
    counted |= {v for e in compile_table.COMPILE_INPUTS for v in e.env}
    base = _fp(BASE)
    for var in sorted(counted):
        assert _fp(BASE, {var: "1"}) != _fp(BASE, {var: "0"}), var
    for var in sorted(flags.table("rbln").envs - counted):
        assert _fp(BASE, {var: "1"}) == _fp(BASE, {var: "0"}) == base, var


def test_every_spelling_of_a_counted_flag_counts() -> None:
    """vLLM's one-dash spellings (-q, -sc, -cc, ...) count as their long flags: the fingerprint
    reads them from the flag table (it knew -tp/-pp/-dp/-ep only)."""
    differ: set[str] = set()
    for entry in COUNTED:
        for short in [f for f in entry["flags"] if not f.startswith("--")]:
            for setting in _settings(entry):
                if setting[0] == spelling(entry) and _fp(BASE + [short, *setting[1:]]) != _fp(
                    BASE + setting
                ):
                    differ.add(short)
    assert differ == set()
