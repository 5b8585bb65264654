"""Locks (src/servefleet/release/lock.py): resolving a stack with the real uv against local indexes,
installing it with every hash checked, and the lock directory's format, checks and use.

The indexes are conftest.py's ``index`` fixture: ``owner`` (HTTP Basic auth) owns ``sfowned 1.0``;
``public`` has everything else and a squatter ``sfowned 9.0``."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from host_inputs import CREDS, defaults, gpu_settings, probe
from local_indexes import OWNER_LOGIN
from local_release import install, pylock, release_plan, with_uv

from servefleet.base.errors import DataError
from servefleet.fleet.lockfleet import FleetLock, locked_models, make_lock
from servefleet.hostplan.extras import resolve_for
from servefleet.hostplan.plan import plan_host
from servefleet.release.lock import LOCK_FILE, differences, load_lock, write_lock
from servefleet.release.owners import check_owners
from servefleet.release.plan import MARKER, plan_release, with_locked_models
from servefleet.release.pylock import packages, release_id
from servefleet.release.resolve import resolve
from servefleet.release.stack import LockError, Stack, project_toml, stack

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SHA = re.compile(r"sha256:[0-9a-f]{64}")


def local_stack(index: dict[str, str], owned: tuple[str, ...] = ("sfowned",)) -> Stack:
    return stack(
        name="test",
        requirements=["sfowned==1.0", "sfpub==1.0"] if "sfowned" in owned else ["sfpub==1.0"],
        constraints=["sfdep==1.0"],
        indexes=[{"name": "owner", "url": index["owner"], "packages": owned, "auth": True}],
        public_index=index["public"],
        python=">=3.10",
        trusted_hosts=["127.0.0.1"],
    )


def by_name(pylock: str) -> dict[str, dict]:
    return {p["name"]: p for p in packages(pylock)}


def test_a_stack_locks_each_package_from_its_owner_with_every_file_hash(
    index: dict[str, str],
) -> None:
    st = local_stack(index)
    text = resolve(st, *OWNER_LOGIN)
    locked = by_name(text)
    assert sorted(locked) == ["sfdep", "sfowned", "sfpub"]
    assert locked["sfowned"]["version"] == "1.0"  # not the public squatter's 9.0
    assert locked["sfowned"]["index"].rstrip("/") == index["owner"].rstrip("/")
    assert locked["sfdep"]["version"] == "1.0"  # the constraint, not the newest 2.0
    assert all(len(p["wheels"][0]["hashes"]["sha256"]) == 64 for p in locked.values())
    assert OWNER_LOGIN[1] not in text
    check_owners(st, text, *OWNER_LOGIN)  # sfdep and sfpub: the owner does not serve them
    assert release_id(text) == release_id(resolve(st, *OWNER_LOGIN))  # same set, same id


def test_a_public_package_that_an_owner_serves_too_is_refused(index: dict[str, str]) -> None:
    """The owner index serves sfowned, but the data does not say it owns it: the lock takes
    it from the public index (the squatter's 9.0), and the owner check refuses that."""
    st = local_stack(index, owned=("sfnothing",))
    st = replace(st, inputs={**st.inputs, "requirements": ["sfowned", "sfpub==1.0"]})
    text = resolve(st, *OWNER_LOGIN)
    with pytest.raises(LockError, match="sfowned is served by the owner index and by the public"):
        check_owners(st, text, *OWNER_LOGIN)


def test_an_index_without_credentials_is_refused_before_resolving(index: dict[str, str]) -> None:
    with pytest.raises(LockError, match="the owner index needs credentials"):
        resolve(local_stack(index))


def locked_plan(index: dict[str, str], reachable: Path, pylock: str):  # type: ignore[no-untyped-def]
    plan = with_uv(release_plan(index, reachable / "release"))
    return replace(plan, id=release_id(pylock), pylock=pylock, trusted_hosts=["127.0.0.1"])


def test_a_locked_release_installs_exactly_the_lock(index: dict[str, str], reachable: Path) -> None:
    text = resolve(local_stack(index), *OWNER_LOGIN)
    plan = locked_plan(index, reachable, text)
    proc = install(plan, reachable)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (reachable / "release" / MARKER).exists()
    assert (reachable / "release" / "pylock.toml").read_text() == text
    python = str(reachable / "release" / "bin" / "python")
    origin = subprocess.run(
        [python, "-c", "import sfowned; print(sfowned.ORIGIN)"], capture_output=True, text=True
    )
    assert origin.stdout == "owner\n"


def test_a_file_whose_hash_differs_from_the_lock_fails_in_one_line(
    index: dict[str, str], reachable: Path
) -> None:
    text = resolve(local_stack(index), *OWNER_LOGIN)
    served = by_name(text)["sfpub"]["wheels"][0]["hashes"]["sha256"]
    tampered = text.replace(served, "0" * 64)
    proc = install(locked_plan(index, reachable, tampered), reachable)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last == (
        f"servefleet: hash mismatch: sfpub==1.0: the lock has sha256:{'0' * 64}, the index "
        f"served sha256:{served}; release {release_id(tampered)} not installed"
    )
    assert not (reachable / "release" / MARKER).exists()


def test_pip_installs_a_lock_from_each_locked_index_and_names_a_mismatch(
    index: dict[str, str], reachable: Path
) -> None:
    """The pip fallback with a lock: each file from the index the lock names, hash required."""
    text = resolve(local_stack(index), *OWNER_LOGIN)
    plan = replace(locked_plan(index, reachable, text), installer="pip", uv=None)
    proc = install(plan, reachable)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    python = str(reachable / "release" / "bin" / "python")
    origin = subprocess.run(
        [python, "-c", "import sfowned; print(sfowned.ORIGIN)"], capture_output=True, text=True
    )
    assert origin.stdout == "owner\n"
    served = by_name(text)["sfpub"]["wheels"][0]["hashes"]["sha256"]
    tampered = text.replace(served, "0" * 64)
    bad = replace(locked_plan(index, reachable / "2", tampered), installer="pip", uv=None)
    (reachable / "2").mkdir()
    proc = install(bad, reachable / "2")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        f"servefleet: hash mismatch: sfpub==1.0: the lock has sha256:{'0' * 64}, the index "
        f"served sha256:{served}; release {release_id(tampered)} not installed"
    )
    assert not (reachable / "2" / "release" / MARKER).exists()


def test_the_project_uv_resolves_pins_owned_packages_to_explicit_owner_indexes() -> None:
    st = stack(
        name="rbln",
        requirements=["rebel-compiler==0.12.0", "vllm-rbln==0.12.0"],
        constraints=["transformers==5.15.1"],
        indexes=[
            {
                "name": "rbln",
                "url": "https://rbln.example/simple/",
                "packages": ["rebel-compiler"],
                "auth": True,
            },
            {
                "name": "vllm",
                "url": "https://vllm.example/cpu",
                "packages": ["vllm"],
                "auth": False,
            },
        ],  # fmt: skip
        public_index="https://pypi.example/simple",
        python=">=3.10",
        trusted_hosts=[],
    )
    project = tomllib.loads(project_toml(st))
    assert project["project"]["dependencies"] == ["rebel-compiler==0.12.0", "vllm-rbln==0.12.0"]
    assert project["tool"]["uv"]["constraint-dependencies"] == ["transformers==5.15.1"]
    assert project["tool"]["uv"]["index"] == [
        {"name": "rbln", "url": "https://rbln.example/simple", "explicit": True},
        {"name": "vllm", "url": "https://vllm.example/cpu", "explicit": True},
        {"name": "public", "url": "https://pypi.example/simple", "default": True},
    ]
    assert project["tool"]["uv"]["sources"] == {
        "rebel-compiler": {"index": "rbln"},
        "vllm": {"index": "vllm"},
    }


def test_the_release_id_is_the_locked_set_not_the_file_layout() -> None:
    text = pylock()
    blocks = text.split("\n\n")
    reordered = "\n\n".join([blocks[0], blocks[2].rstrip("\n"), blocks[1]]) + "\n"
    assert release_id(reordered) == release_id(text)
    assert release_id(pylock(b="3" * 64)) != release_id(text)
    moved = text.replace("https://i.example/files/b-2.0", "https://elsewhere.example/b-2.0")
    assert release_id(moved) != release_id(text)  # a URL alone edited (#18 finding 7)
    with pytest.raises(LockError, match="not a valid pylock file"):
        release_id("[[packages]\n")


def simple_stack(pins: tuple[str, ...] = ("a==1.0",)) -> Stack:
    return stack("s", pins, (), [], "https://i.example/simple", ">=3.10", ())


def test_a_lock_directory_round_trips_and_an_edited_pylock_is_refused(tmp_path: Path) -> None:
    st = simple_stack()
    write_lock(tmp_path, {st: pylock()}, {"3.5.1": {"url": "u", "sha256": "s"}}, {})
    lock = load_lock(tmp_path)
    assert lock.stacks["s"].release == release_id(pylock())
    assert lock.for_input(st.digest) == lock.stacks["s"]
    assert differences(lock, [st], {"3.5.1": {"url": "u", "sha256": "s"}}, {}) == []
    (tmp_path / "pylock.s.toml").write_text(pylock(a="9" * 64))
    with pytest.raises(LockError, match="its packages or their URLs differ from what was locked"):
        load_lock(tmp_path)
    (tmp_path / "pylock.s.toml").write_text(pylock().replace("i.example/files", "evil.example"))
    with pytest.raises(LockError, match="its packages or their URLs differ from what was locked"):
        load_lock(tmp_path)  # the URL alone edited: refused, so `lock --check` refuses it too
    doc = json.loads((tmp_path / LOCK_FILE).read_text())
    doc["stacks"]["s"]["pylock"] = "../../etc/passwd"
    (tmp_path / LOCK_FILE).write_text(json.dumps(doc))
    with pytest.raises(LockError, match="bad pylock name"):
        load_lock(tmp_path)
    with pytest.raises(LockError, match="no servefleet.lock.json; run `servefleet lock`"):
        load_lock(tmp_path / "missing")


def test_check_names_every_difference(tmp_path: Path) -> None:
    old, stale = simple_stack(), replace(simple_stack(), name="old")
    models = {"org/m": {"revision": "r1", "url": None, "sha256": "h1"}}
    write_lock(tmp_path, {old: pylock(), stale: pylock()}, {"3.5.1": {"url": "u", "sha256": "s"}},
               models)  # fmt: skip
    lock = load_lock(tmp_path)
    assert differences(
        lock,
        [simple_stack(("a==1.1",)), replace(simple_stack(), name="new")],
        {"3.6.0": {"url": "u6", "sha256": "s6"}},
        {"org/m": {"revision": "r2", "sha256": None}, "org/n": {"revision": None, "sha256": None}},
    ) == [
        "stack new: not locked",
        "stack s: requirements: -a==1.0, +a==1.1",
        "stack old: locked but no host uses it",
        "driver 3.6.0: None -> {'url': 'u6', 'sha256': 's6'}",
        "model org/m: revision r1 -> r2",
        "model org/n: not locked",
    ]


def test_check_names_a_model_url_and_a_stack_index_the_lock_moved_from_the_data_s(
    tmp_path: Path,
) -> None:
    """#46 item 3: a lock decides no credential any more, and --check shows an edit of where its
    files come from: a model URL off the data's models_store_url, an index edited in a stack's
    inputs while the digest it states was kept."""
    st = stack("s", ["a==1.0"], (), [{"name": "rbln", "url": "https://pypi.example/simple",
               "packages": ["a"], "auth": True}], None, ">=3.10", ())  # fmt: skip
    store = "https://store.example/models"
    models = {"org/m": {"revision": "r1", "url": f"{store}/org/m.tar.gz", "sha256": "h1"},
              "org/h": {"revision": "r1", "url": None, "sha256": None}}  # fmt: skip
    write_lock(tmp_path, {st: pylock()}, {}, models)
    stores = {"org/m": store, "org/h": None}
    pinned = {m: {"revision": "r1", "sha256": None} for m in stores}
    assert differences(load_lock(tmp_path), [st], {}, pinned, None, stores) == []
    doc = json.loads((tmp_path / LOCK_FILE).read_text())
    doc["models"]["org/m"]["url"] = "http://127.0.0.1:8000/org/m.tar.gz"
    doc["models"]["org/h"]["url"] = "https://store.example:8443/org/h.tar.gz"
    doc["stacks"]["s"]["inputs"]["indexes"][0]["url"] = "http://127.0.0.1:8000/simple"
    (tmp_path / LOCK_FILE).write_text(json.dumps(doc))
    moved = '{"auth": true, "name": "rbln", "packages": ["a"], "url": "%s"}'
    assert differences(load_lock(tmp_path), [st], {}, pinned, None, stores) == [
        "stack s: indexes: -"
        + moved % "http://127.0.0.1:8000/simple"
        + ", +"
        + moved % "https://pypi.example/simple",
        "model org/h: url https://store.example:8443/org/h.tar.gz is not on models_store_url "
        "None (the hub)",
        "model org/m: url http://127.0.0.1:8000/org/m.tar.gz is not on models_store_url "
        "https://store.example/models",
    ]


def test_a_deploy_with_a_lock_installs_the_locked_set_and_refuses_a_stack_it_lacks(
    tmp_path: Path,
) -> None:
    settings = defaults()
    spec = resolve_for(settings)
    unlocked = plan_release(settings, spec, None)
    assert not unlocked.locked and unlocked.stack is not None
    write_lock(tmp_path, {unlocked.stack: pylock()}, {}, {})
    locked = plan_release(replace(settings, sdk_lock=str(tmp_path)), spec, None)
    assert (locked.id, locked.pylock, locked.locked) == (release_id(pylock()), pylock(), True)
    assert locked.path.endswith(f"/releases/{locked.id}")
    bumped = replace(settings, sdk_lock=str(tmp_path),
                     sdk_pins={**settings.sdk_pins, "vllm-rbln": "0.12.1"})  # fmt: skip
    with pytest.raises(DataError) as e:
        plan_release(bumped, spec, None)
    assert str(e.value).startswith(f"sdk_lock: {tmp_path} does not lock this host's stack")
    assert "-vllm-rbln==0.12.0" in str(e.value) and "+vllm-rbln==0.12.1" in str(e.value)
    with_pip = plan_release(
        replace(settings, sdk_lock=str(tmp_path), sdk_installer="pip"), spec, None
    )
    assert with_pip.id == locked.id  # the installer does not change the release
    assert with_pip.to_json()["locked"] == [
        {"name": "a", "version": "1.0", "index": "https://i.example/simple", "sha256": ["1" * 64]},
        {"name": "b", "version": "2.0", "index": "https://i.example/simple", "sha256": ["2" * 64]},
    ]


def test_the_lock_pins_models_the_data_does_not(tmp_path: Path) -> None:
    write_lock(tmp_path, {}, {}, {
        "org/a": {"revision": "a" * 40, "url": "x", "sha256": "1" * 64},
        "org/b": {"revision": "b" * 40, "url": None, "sha256": None},
    })  # fmt: skip
    settings = replace(defaults(), sdk_lock=str(tmp_path), models_revisions={"org/b": "c" * 40})
    pinned = with_locked_models(settings)
    assert pinned.models_revisions == {"org/a": "a" * 40, "org/b": "c" * 40}  # data wins
    assert pinned.models_sha256 == {"org/a": "1" * 64}
    assert with_locked_models(defaults()) == defaults()


def test_models_are_locked_from_the_store_manifest() -> None:
    s = replace(defaults(), models_store_url="http://store.example/models/", hf_token="tok")
    asked = []

    def fetch(url: str, headers: dict[str, str]) -> bytes:
        asked.append((url, headers))
        return json.dumps(
            {
                "models": {
                    "org/a": {"sha256": "1" * 64, "revision": "a" * 40, "path": "org/a.tar.gz"}
                }
            }
        ).encode()

    fl = FleetLock(tmp := Path("/nonexistent"), {}, {}, {"org/a": {}}, {"org/a": s})
    assert tmp and locked_models(fl, fetch) == {
        "org/a": {"revision": "a" * 40, "url": "http://store.example/models/org/a.tar.gz",
                  "sha256": "1" * 64},
    }  # fmt: skip
    assert asked == [("http://store.example/models/manifest.json", {"Authorization": "Bearer tok"})]
    fl.model_sources["org/z"], fl.models["org/z"] = s, {}
    with pytest.raises(LockError, match="has no org/z"):
        locked_models(fl, fetch)
    hub = FleetLock(tmp, {}, {}, {"org/a": {"revision": None}}, {"org/a": defaults()})
    assert locked_models(hub, fetch)["org/a"] == {"revision": None, "url": None, "sha256": None}


def test_the_lock_records_a_driver_runfile_only_for_a_kind_that_installs_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """driver_runfile_url may be every host's data (one group_data over a mixed fleet): the lock
    records the runfile of an RBLN host's driver (driver_step "runfile"), and none for a GPU
    host, whose kind installs no driver and only checks it (driver_step "check")."""
    from servefleet.fleet import lockfleet

    url = "https://files.example/rebellions-x86_64-{version}.run"
    rbln = defaults(driver_runfile_url=url, sdk_lock="locks/prod")
    gpu = gpu_settings(driver_runfile_url=url, driver_version="570.133.20", sdk_lock="locks/prod")
    fleets = {"gpu": [("gpu1", gpu)], "mixed": [("npu1", rbln), ("gpu1", gpu)]}
    for fleet, hosts in fleets.items():
        monkeypatch.setattr(
            lockfleet, "_hosts", lambda inventory, overrides, environ=None, limit=(), h=hosts: h
        )
        expected = {} if fleet == "gpu" else {"3.5.1": {"url": url.format(version="3.5.1"),
                                                        "sha256": ""}}  # fmt: skip
        assert lockfleet.fleet_lock("inventory.py", {}).driver == expected, fleet


def test_lock_check_with_a_selection_names_the_stack_it_needs(tmp_path: Path) -> None:
    """The CLI in a subprocess (reading an inventory imports pyinfra's CLI, which patches the
    process with gevent)."""
    inventory = tmp_path / "inventories" / "prod.py"
    inventory.parent.mkdir()
    inventory.write_text('hosts = ["h1"]\n')  # and no group_data: the defaults
    settings = defaults()
    default = plan_release(settings, resolve_for(settings), None).stack
    assert default is not None
    model = {"openai/gpt-oss-120b": {"revision": None, "url": None, "sha256": None}}
    write_lock(tmp_path / "lock", {default: pylock()}, {}, model)

    def check(*extra: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "servefleet", "lock", str(inventory), "--lock-dir",
               str(tmp_path / "lock"), "--check", *extra]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("RBLN_")} | CREDS
        return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True)

    current = check()
    assert (current.returncode, current.stdout) == (
        0, f"{tmp_path / 'lock'}: matches the data (1 stack(s))\n"
    ), current.stderr  # fmt: skip
    suffix = check("--selection", "spec_decode=suffix")
    assert suffix.returncode == 1
    assert f"servefleet: lock: stack {default.name}-arctic-inference: not locked" in suffix.stderr
    assert f"servefleet: lock: stack {default.name}: locked but no host uses it" in suffix.stderr
    bad = check("--selection", "spec_decode")
    assert bad.returncode == 2 and "--selection 'spec_decode': expected KEY=VALUE" in bad.stderr


TEMPLATE = "examples/tool_chat_template_x.jinja"


def test_serve_files_are_locked_and_a_file_that_differs_is_refused_in_one_line(
    tmp_path: Path,
) -> None:
    """#22: the lock holds each file serve_files ships (argv path -> sha256 and shipped name);
    `--check` names a changed file, and a locked deploy refuses it before any change."""
    template = tmp_path / "x.jinja"
    template.write_text("{{ messages }}\n")
    settings = defaults(serve_files={TEMPLATE: str(template)}, serve_files_root=str(tmp_path))
    spec = resolve_for(settings)
    unlocked = plan_release(settings, spec, None)
    assert unlocked.stack is not None and len(unlocked.files) == 1
    shipped = unlocked.files[0]
    entry = {"sha256": shipped.sha256, "name": shipped.name}
    fl = FleetLock(tmp_path / "lock", {}, {}, {}, {}, {TEMPLATE: entry})
    lines: list[str] = []
    make_lock(fl, lines.append)  # no stack, no model: nothing resolved, the file written
    assert f"file {TEMPLATE}: sha256 {shipped.sha256}" in lines
    assert load_lock(tmp_path / "lock").files == {TEMPLATE: entry}
    write_lock(tmp_path / "lock", {unlocked.stack: pylock()}, {}, {}, {TEMPLATE: entry})
    doc = json.loads((tmp_path / "lock" / LOCK_FILE).read_text())
    assert doc["files"] == {TEMPLATE: entry} and doc["lock_version"] == 1
    lock = load_lock(tmp_path / "lock")
    assert differences(lock, [unlocked.stack], {}, {}, {TEMPLATE: entry}) == []
    locked = replace(settings, sdk_lock=str(tmp_path / "lock"))
    plan = plan_release(locked, spec, None)
    assert plan.locked and plan.files == unlocked.files
    assert plan.id != release_id(pylock())  # the file's bytes are in the release id

    template.write_text("{{ messages }} edited\n")
    changed = hashlib.sha256(template.read_bytes()).hexdigest()
    with pytest.raises(DataError) as e:
        plan_release(locked, spec, None)
    line = str(e.value)
    assert "\n" not in line
    assert line == (
        f"serve_files: {tmp_path / 'lock'} does not lock the files this host ships (file "
        f"{TEMPLATE}: sha256 {shipped.sha256} -> {changed}); run `servefleet lock` and review "
        "the diff"
    )
    with pytest.raises(DataError) as planned:  # the deploy's plan, before any operation
        plan_host(locked, probe())
    assert str(planned.value) == line
    now = {TEMPLATE: {"sha256": changed, "name": f"{changed[:16]}-tool_chat_template_x.jinja"}}
    assert differences(lock, [unlocked.stack], {}, {}, now) == [
        f"file {TEMPLATE}: sha256 {shipped.sha256} -> {changed}"
    ]
    assert differences(lock, [unlocked.stack], {}, {}, {}) == [
        f"file {TEMPLATE}: locked but no host ships it"
    ]


def test_a_lock_without_files_serves_data_without_serve_files_and_refuses_data_with_them(
    tmp_path: Path,
) -> None:
    """A lock written before the files entry existed: unchanged for data that ships none."""
    plain = defaults()
    spec = resolve_for(plain)
    st = plan_release(plain, spec, None).stack
    assert st is not None
    write_lock(tmp_path, {st: pylock()}, {}, {})
    assert "files" not in json.loads((tmp_path / LOCK_FILE).read_text())
    lock = load_lock(tmp_path)
    assert lock.files == {} and differences(lock, [st], {}, {}, {}) == []
    assert plan_release(replace(plain, sdk_lock=str(tmp_path)), spec, None).id == release_id(
        pylock()
    )
    template = tmp_path / "x.jinja"
    template.write_text("{{ messages }}\n")
    shipping = replace(
        defaults(serve_files={TEMPLATE: str(template)}, serve_files_root=str(tmp_path)),
        sdk_lock=str(tmp_path),
    )
    with pytest.raises(DataError, match=rf"\(file {TEMPLATE}: not locked\); run `servefleet lock`"):
        plan_release(shipping, spec, None)
    doc = json.loads((tmp_path / LOCK_FILE).read_text())
    doc["files"] = {TEMPLATE: "not an entry"}
    (tmp_path / LOCK_FILE).write_text(json.dumps(doc))
    with pytest.raises(LockError, match=r"files: malformed \(path -> \{sha256, name\}\)"):
        load_lock(tmp_path)


def test_lock_check_names_a_changed_serve_files_file_and_refuses_two_files_for_one_path(
    tmp_path: Path,
) -> None:
    """The CLI in a subprocess, as above: `servefleet lock --check` reads serve_files from the
    inventory's data."""
    template, other = tmp_path / "x.jinja", tmp_path / "y.jinja"
    template.write_text("{{ messages }}\n")
    other.write_text("{{ other }}\n")
    inventory = tmp_path / "inventories" / "prod.py"
    inventory.parent.mkdir()
    inventory.write_text('hosts = ["h1"]\n')
    settings = defaults(serve_files={TEMPLATE: str(template)}, serve_files_root=str(tmp_path))
    rel = plan_release(settings, resolve_for(settings), None)
    assert rel.stack is not None
    model = {"openai/gpt-oss-120b": {"revision": None, "url": None, "sha256": None}}
    write_lock(tmp_path / "lock", {rel.stack: pylock()}, {}, model,
               {f.argv: f.lock_entry() for f in rel.files})  # fmt: skip

    def check(inv: Path) -> subprocess.CompletedProcess[str]:
        files = json.dumps({TEMPLATE: str(template)})
        cmd = [sys.executable, "-m", "servefleet", "lock", str(inv), "--lock-dir",
               str(tmp_path / "lock"), "--check", "--data", f"serve_files={files}"]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("RBLN_")} | CREDS
        return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True)

    current = check(inventory)
    assert (current.returncode, current.stdout) == (
        0, f"{tmp_path / 'lock'}: matches the data (1 stack(s))\n"
    ), current.stderr  # fmt: skip
    old = rel.files[0].sha256
    template.write_text("{{ messages }} edited\n")
    new = hashlib.sha256(template.read_bytes()).hexdigest()
    changed = check(inventory)
    assert changed.returncode == 1
    assert changed.stderr == f"servefleet: lock: file {TEMPLATE}: sha256 {old} -> {new}\n"
    two = tmp_path / "inventories" / "two.py"
    two.write_text(
        f'hosts = [("h1", {{"serve_files": {{"{TEMPLATE}": "{template}"}}}}),\n'
        f'         ("h2", {{"serve_files": {{"{TEMPLATE}": "{other}"}}}})]\n'
    )
    cmd = [sys.executable, "-m", "servefleet", "lock", str(two), "--lock-dir",
           str(tmp_path / "lock"), "--check"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("RBLN_")} | CREDS
    split = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert split.returncode == 2
    assert split.stderr.strip().splitlines() == [
        f"servefleet: error: serve_files: h1 and h2 ship different files as '{TEMPLATE}'; allowed: one "
        "file for each path on every host of a lock"
    ], split.stderr
