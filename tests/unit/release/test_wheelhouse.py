"""The offline wheelhouse (src/servefleet/release/wheelhouse.py, ``servefleet wheelhouse``): every file
of a lock downloaded from stub servers on 127.0.0.x and checked against the lock, credentials
only where they belong, a tampered file refused, a re-run that downloads nothing; what a host
needs from it; and the release installed from such a copy with no index at all.

Servers (each a ``Stub`` recording every request's headers): 127.0.0.1 is the owner index
(HTTP Basic auth), 127.0.0.2 the public index and the driver runfiles, 127.0.0.3 the model store
(Bearer token under /store/)."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from fetch_stubs import REV, TOKEN, Stub, hf_layout, respond, tgz
from host_inputs import CREDS as ENV, defaults
from local_indexes import OWNER_LOGIN
from local_release import install, release_plan, with_uv

from servefleet.base.errors import DataError
from servefleet.entry.steps.facts import HOST_CHECK
from servefleet.fleet.lab.simulator import wheels as lab_wheels
from servefleet.hostplan.extras import resolve_for
from servefleet.kinds.rbln.defaults import PIP_INDEXES
from servefleet.release.lock import LOCK_FILE, load_lock, write_lock
from servefleet.release.plan import MARKER, plan_release
from servefleet.release.pylock import release_id
from servefleet.release.stack import stack
from servefleet.release.wheelhouse import (
    MANIFEST,
    Credentials,
    WheelhouseError,
    credentials,
    fill,
    host_copies,
    lock_files,
    offline_requirements,
)
from servefleet.settings.table import load_defaults, settings_from

SECRETS = {"RBLN_INDEX_USER": OWNER_LOGIN[0], "RBLN_INDEX_PASSWORD": OWNER_LOGIN[1],
           "HF_TOKEN": TOKEN}  # fmt: skip
BASIC = "Basic " + base64.b64encode("{}:{}".format(*OWNER_LOGIN).encode()).decode()
RUNFILE = b"#!/bin/sh\necho driver 1.0\n"
MODEL = "acme/tiny-1"


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """sfowned 1.0 (needs sfdep), sfdep 1.0, sfpub 1.0: name -> wheel file."""
    root = tmp_path_factory.mktemp("wheels")
    lab_wheels.write_wheel(root, "sfowned", "1.0", {"sfowned/__init__.py": "ORIGIN = 'owner'\n"}, ["sfdep"])  # fmt: skip
    lab_wheels.write_wheel(root, "sfdep", "1.0", {"sfdep/__init__.py": ""}, [])
    lab_wheels.write_wheel(root, "sfpub", "1.0", {"sfpub/__init__.py": ""}, [])
    return {p.name.split("-")[0]: p for p in root.glob("*.whl")}


def _basic(data: bytes) -> Any:
    """A route that wants the owner's Basic credentials."""

    def route(handler: Any) -> None:
        if handler.headers.get("Authorization") != BASIC:
            respond(401, b"authentication required\n")(handler)
        else:
            respond(200, data)(handler)

    return route


@pytest.fixture
def servers() -> Iterator[dict[str, Stub]]:
    stubs = {"owner": Stub("127.0.0.1"), "public": Stub("127.0.0.2"), "store": Stub("127.0.0.3")}
    stubs["store"].token = TOKEN
    yield stubs
    for s in stubs.values():
        s.close()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_lock(tmp_path: Path, servers: dict[str, Stub], wheels: dict[str, Path]) -> Path:
    """Serve every file, and write a lock of them: one stack (sfowned from its owner), driver
    1.0, the model from the store."""
    entries = []
    for name, path in sorted(wheels.items()):
        data = path.read_bytes()
        where = servers["owner" if name == "sfowned" else "public"]
        route = f"/files/{path.name}"
        where.routes[route] = _basic(data) if name == "sfowned" else respond(200, data)
        entries.append(
            f'[[packages]]\nname = "{name}"\nversion = "1.0"\n'
            f'index = "{where.url}/simple"\n'
            f'wheels = [{{ url = "{where.url}{route}", hashes = {{ sha256 = "{_sha(data)}" }} }}]\n'
        )
    pylock = 'lock-version = "1.0"\ncreated-by = "test"\n\n' + "\n".join(entries)
    st = stack("t", ["sfowned==1.0", "sfpub==1.0"], ["sfdep==1.0"],
               [{"name": "owner", "url": servers["owner"].url + "/simple",
                 "packages": ["sfowned"], "auth": True}],
               servers["public"].url + "/simple", ">=3.10", [])  # fmt: skip
    servers["public"].routes["/driver/r-1.0.run"] = respond(200, RUNFILE)
    archive = tgz(hf_layout())
    servers["store"].routes[f"/store/{MODEL}.tar.gz"] = respond(200, archive)
    lock = tmp_path / "lock"
    write_lock(
        lock,
        {st: pylock},
        {"1.0": {"url": servers["public"].url + "/driver/r-1.0.run", "sha256": _sha(RUNFILE)}},
        {MODEL: {"revision": REV, "url": f"{servers['store'].url}/store/{MODEL}.tar.gz",
                 "sha256": _sha(archive)},
         "org/hub": {"revision": REV, "url": None, "sha256": None}},
    )  # fmt: skip
    return lock


def data_of(servers: dict[str, Stub]) -> dict[str, Any]:
    """The data `servefleet wheelhouse` reads: the rbln index (auth) at the owner stub, the model
    store at the store stub."""
    rbln = {**PIP_INDEXES["rbln"], "url": servers["owner"].url + "/simple"}
    return {"pip_indexes": {**PIP_INDEXES, "rbln": rbln},
            "models_store_url": servers["store"].url + "/store",
            "pip_trusted_hosts": ["127.0.0.1", "127.0.0.3"]}  # fmt: skip


def data_creds(servers: dict[str, Stub]) -> Credentials:
    """The secrets as that data gives them: each only for the origins it names."""
    data = {**load_defaults(), **data_of(servers)}
    return credentials(settings_from(data.get, SECRETS))


def auth_seen(servers: dict[str, Stub]) -> dict[str, set[str | None]]:
    return {n: {h.get("authorization") for _, h in s.seen} for n, s in servers.items()}


def test_every_file_of_the_lock_is_downloaded_checked_and_a_rerun_downloads_nothing(
    tmp_path: Path, servers: dict[str, Stub], wheels: dict[str, Path]
) -> None:
    files, hub = lock_files(load_lock(make_lock(tmp_path, servers, wheels)))
    assert hub == ["org/hub"]  # from the hub: no archive to hold
    wh = tmp_path / "wh"
    creds = data_creds(servers)
    done = fill(wh, files, creds, echo=lambda _: None)
    want = {
        "driver/r-1.0.run": _sha(RUNFILE),
        f"models/{MODEL}.tar.gz": _sha(tgz(hf_layout())),
        **{f"packages/{p.name}": _sha(p.read_bytes()) for p in wheels.values()},
    }
    assert (sorted(done.downloaded), done.present, done.failed) == (sorted(want), [], [])
    assert json.loads((wh / MANIFEST).read_text())["files"] == want
    assert all(_sha((wh / path).read_bytes()) == sha for path, sha in want.items())
    assert not list(wh.rglob("*.part"))
    # each secret only where it belongs: Basic to the owner index, the token to the store
    assert auth_seen(servers) == {"owner": {BASIC}, "public": {None}, "store": {f"Bearer {TOKEN}"}}
    asked = sum(len(s.seen) for s in servers.values())
    again = fill(wh, files, creds, echo=lambda _: None)
    assert (again.downloaded, sorted(again.present), again.bytes) == ([], sorted(want), 0)
    assert sum(len(s.seen) for s in servers.values()) == asked  # not one request


@pytest.fixture
def listener() -> Iterator[Stub]:
    """A server on 127.0.0.1 that no data names (another port than the owner index's): records
    the headers it is sent; serves the model's archive at /m.tar.gz."""
    stub = Stub("127.0.0.1")
    stub.routes["/m.tar.gz"] = respond(200, tgz(hf_layout()))
    yield stub
    stub.close()


def fill_as_data_says(tmp_path: Path, lock: Path, servers: dict[str, Stub]) -> Any:
    """The lock's files filled with the credentials of data that names the stubs (each request
    within 5 s, tried once)."""
    files = lock_files(load_lock(lock))[0]
    return fill(tmp_path / "wh", files, data_creds(servers), lambda _: None, timeout=5, tries=1)


def tamper(lock: Path, edit: Any) -> None:
    """Edit a lock's servefleet.lock.json as anyone who writes the repository can (``edit`` takes
    the document and the pylock text and returns the new pylock text); the pylock's release id
    is made to match, so the lock loads."""
    doc = json.loads((lock / LOCK_FILE).read_text())
    entry = doc["stacks"]["t"]
    text = edit(doc, (lock / entry["pylock"]).read_text())
    (lock / entry["pylock"]).write_text(text)
    entry["release"] = release_id(text)
    (lock / LOCK_FILE).write_text(json.dumps(doc))


def test_a_model_url_the_lock_names_gets_no_token_and_still_downloads_when_public(
    tmp_path: Path, servers: dict[str, Stub], wheels: dict[str, Path], listener: Stub
) -> None:
    """#46 item 3: HF_TOKEN went to whatever URL a lock's models.*.url named."""
    lock = make_lock(tmp_path, servers, wheels)

    def edit(doc: dict[str, Any], text: str) -> str:
        doc["models"][MODEL]["url"] = f"{listener.url}/m.tar.gz"
        return text

    tamper(lock, edit)
    done = fill_as_data_says(tmp_path, lock, servers)
    assert listener.paths() == ["/m.tar.gz"]
    assert auth_seen({"listener": listener}) == {"listener": {None}}  # no Bearer token
    assert f"models/{MODEL}.tar.gz" in done.downloaded and done.failed == []  # anonymously
    assert auth_seen(servers)["owner"] == {BASIC}  # the data's own index still gets its own


def test_an_index_the_lock_s_stack_inputs_name_with_auth_gets_no_index_credentials(
    tmp_path: Path, servers: dict[str, Stub], wheels: dict[str, Path], listener: Stub
) -> None:
    """#46 item 3: the index's Basic credentials went to any origin the lock's own
    stacks.*.inputs.indexes named with auth on."""
    lock = make_lock(tmp_path, servers, wheels)
    sfpub = wheels["sfpub"]
    listener.routes[f"/files/{sfpub.name}"] = _basic(sfpub.read_bytes())

    def edit(doc: dict[str, Any], text: str) -> str:
        doc["stacks"]["t"]["inputs"]["indexes"].append(
            {"name": "mirror", "url": f"{listener.url}/simple", "packages": ["sfpub"], "auth": True}
        )
        return text.replace(f"{servers['public'].url}/files/{sfpub.name}",
                            f"{listener.url}/files/{sfpub.name}")  # fmt: skip

    tamper(lock, edit)
    done = fill_as_data_says(tmp_path, lock, servers)
    assert listener.paths() == [f"/files/{sfpub.name}"]
    assert auth_seen({"listener": listener}) == {"listener": {None}}  # no Basic user/password
    assert done.failed == [
        f"packages/{sfpub.name}: {listener.url}/files/{sfpub.name} answered 401 (no credentials "
        "sent: its origin is none of the data's pip_indexes with auth)"
    ]
    assert auth_seen(servers) == {"owner": {BASIC}, "public": {None}, "store": {f"Bearer {TOKEN}"}}


def test_a_credential_does_not_follow_a_redirect_from_the_data_s_origin_to_another(
    tmp_path: Path, servers: dict[str, Stub], wheels: dict[str, Path], listener: Stub
) -> None:
    """The data's store sends the archive's request on to another origin: the token stays."""
    lock = make_lock(tmp_path, servers, wheels)
    servers["store"].routes[f"/store/{MODEL}.tar.gz"] = respond(
        302, headers={"Location": f"{listener.url}/m.tar.gz"}
    )
    done = fill_as_data_says(tmp_path, lock, servers)
    assert auth_seen(servers)["store"] == {f"Bearer {TOKEN}"}  # sent to the store itself
    assert listener.paths() == ["/m.tar.gz"] and auth_seen({"l": listener}) == {"l": {None}}
    assert f"models/{MODEL}.tar.gz" in done.downloaded


class Progress:
    """Records what fill() tells a progress bar: the files to download, each one that ends."""

    def __init__(self) -> None:
        self.length: int | None = None
        self.updates: list[int] = []
        self.closed = False

    def __call__(self, length: int) -> Progress:
        self.length = length
        return self

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.closed = True

    def update(self, n: int) -> None:
        assert not self.closed
        self.updates.append(n)


def test_a_progress_bar_counts_the_files_as_they_arrive(
    tmp_path: Path,
    servers: dict[str, Stub],
    wheels: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from click.testing import CliRunner

    from servefleet.entry.cli import main

    lock = make_lock(tmp_path, servers, wheels)
    files, _ = lock_files(load_lock(lock))
    bar = Progress()
    fill(tmp_path / "wh", files, data_creds(servers), echo=lambda _: None, progress=bar)
    assert (bar.length, bar.updates, bar.closed) == (len(files), [1] * len(files), True)
    again = Progress()
    fill(tmp_path / "wh", files, data_creds(servers), echo=lambda _: None, progress=again)
    assert again.length is None  # nothing to download: no bar
    # the command shows click's bar on stderr when that is a terminal (--lock-dir alone takes
    # the default data, which names neither stub: they answer without credentials here)
    servers["owner"].routes[f"/files/{wheels['sfowned'].name}"] = respond(
        200, wheels["sfowned"].read_bytes()
    )
    servers["store"].token = None
    monkeypatch.setattr("servefleet.entry.common.shows_progress", lambda: True)
    for name, value in zip(("RBLN_INDEX_USER", "RBLN_INDEX_PASSWORD"), OWNER_LOGIN, strict=True):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    result = CliRunner().invoke(
        main, ["wheelhouse", str(tmp_path / "cli"), "--lock-dir", str(lock)]
    )
    assert result.exit_code == 0, result.output
    assert f"downloading {len(files)} file(s)" in result.stderr
    assert f"{len(files)} downloaded" in result.stdout


def test_a_file_that_differs_from_the_lock_is_named_with_both_hashes_and_not_kept(
    tmp_path: Path, servers: dict[str, Stub], wheels: dict[str, Path]
) -> None:
    lock = make_lock(tmp_path, servers, wheels)
    tampered = RUNFILE + b"echo and something else\n"
    servers["public"].routes["/driver/r-1.0.run"] = respond(200, tampered)
    wh = tmp_path / "wh"
    inventory = tmp_path / "inv.py"
    inventory.write_text('fleet = ["npu-a1"]\n')
    data = [a for k, v in {**data_of(servers), "sdk_lock": str(lock)}.items()
            for a in ("--data", f"{k}={json.dumps(v) if not isinstance(v, str) else v}")]  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "servefleet", "wheelhouse", str(wh),
                           "--inventory", str(inventory), *data], env={**os.environ, **SECRETS},
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    url = servers["public"].url + "/driver/r-1.0.run"
    assert proc.stderr.splitlines() == [
        f"servefleet: wheelhouse: driver/r-1.0.run: {url} has sha256 {_sha(tampered)}, "
        f"the lock has {_sha(RUNFILE)}"
    ]
    assert "model org/hub: from the hub in the lock (no store archive); not included" in proc.stdout
    assert "4 downloaded" in proc.stdout and "1 failed" in proc.stdout
    assert not (wh / "driver" / "r-1.0.run").exists() and not list(wh.rglob("*.part"))
    assert "driver/r-1.0.run" not in json.loads((wh / MANIFEST).read_text())["files"]


def test_without_the_index_credentials_the_owned_file_fails_naming_the_variables(
    tmp_path: Path, servers: dict[str, Stub], wheels: dict[str, Path]
) -> None:
    files, _ = lock_files(load_lock(make_lock(tmp_path, servers, wheels)))
    creds = replace(data_creds(servers), index_user=None, index_password=None)
    done = fill(tmp_path / "wh", files, creds, echo=lambda _: None)
    assert len(done.failed) == 1 and done.failed[0].startswith("packages/sfowned-1.0-")
    assert done.failed[0].endswith(
        "answered 401 (set the variables creds_index_user_env/creds_index_password_env name)"
    )


def test_a_host_gets_only_what_its_steps_need_and_the_wheelhouse_must_hold_it(
    tmp_path: Path, servers: dict[str, Stub], wheels: dict[str, Path]
) -> None:
    lock = load_lock(make_lock(tmp_path, servers, wheels))
    wh = tmp_path / "wh"
    files, _ = lock_files(lock)
    fill(wh, files, data_creds(servers), echo=lambda _: None)
    pylock = next(iter(lock.stacks.values())).pylock
    copies = host_copies(str(wh), "/opt/sf", lock, pylock, "1.0", [MODEL])
    assert [(c.kind, c.name) for c in copies] == [
        *(("release", f"packages/{wheels[n].name}") for n in sorted(wheels)),
        ("driver", "1.0"),
        ("models", MODEL),
    ]
    assert copies[-1].dest == f"/opt/sf/wheelhouse/models/{MODEL}.tar.gz"
    assert copies[-2].size == len(RUNFILE) and copies[-2].src == str(wh / "driver" / "r-1.0.run")
    assert host_copies(str(wh), "/opt/sf", lock, None, None, []) == []  # nothing to install
    with pytest.raises(WheelhouseError, match="sdk_lock: no driver runfile for driver 2.0"):
        host_copies(str(wh), "/opt/sf", lock, None, "2.0", [])
    with pytest.raises(WheelhouseError, match="sdk_source: org/hub comes from the hub"):
        host_copies(str(wh), "/opt/sf", lock, None, None, ["org/hub"])
    (wh / "driver" / "r-1.0.run").unlink()
    with pytest.raises(WheelhouseError) as e:
        host_copies(str(wh), "/opt/sf", lock, None, "1.0", [])
    assert str(e.value) == (
        f"sdk_wheelhouse: {wh} lacks driver/r-1.0.run (sha256 {_sha(RUNFILE)}); "
        f"run `servefleet wheelhouse {wh}`"
    )
    with pytest.raises(WheelhouseError, match="has no manifest.json; run `servefleet wheelhouse"):
        host_copies(str(tmp_path / "empty"), "/opt/sf", lock, pylock, None, [])


def test_the_host_check_lists_only_files_with_their_sha256(tmp_path: Path) -> None:
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.write_bytes(b"good")
    bad.write_bytes(b"tampered")
    wanted = {str(good): _sha(b"good"), str(bad): _sha(b"bad"), str(tmp_path / "none"): "0" * 64}
    proc = subprocess.run(["python3", "-c", HOST_CHECK, json.dumps(wanted)],
                          capture_output=True, text=True, check=True)  # fmt: skip
    assert json.loads(proc.stdout) == [str(good)]


def test_the_copy_takes_its_place_only_with_its_sha256(tmp_path: Path) -> None:
    from servefleet.entry.steps.operations import _PLACE

    dest = tmp_path / "dir" / "file"
    dest.parent.mkdir()
    part = Path(f"{dest}.part")
    part.write_bytes(b"cut sh")
    proc = subprocess.run(["sh", "-c", _PLACE, "sh", str(part), str(dest), _sha(b"whole")],
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 1 and not part.exists() and not dest.exists()
    assert proc.stderr == f"servefleet: {dest}: the copy does not have sha256 {_sha(b'whole')}\n"
    part.write_bytes(b"whole")
    subprocess.run(["sh", "-c", _PLACE, "sh", str(part), str(dest), _sha(b"whole")], check=True)
    assert dest.read_bytes() == b"whole" and not part.exists()


def test_a_release_installs_from_the_copy_with_no_index_and_refuses_a_tampered_file(
    tmp_path: Path,
    servers: dict[str, Stub],
    wheels: dict[str, Path],
    index: dict[str, str],
    reachable: Path,
) -> None:
    lock = load_lock(make_lock(tmp_path, servers, wheels))
    wh = tmp_path / "wh"
    fill(wh, lock_files(lock)[0], data_creds(servers), echo=lambda _: None)
    for s in servers.values():
        s.close()  # nothing answers any more
    pylock = next(iter(lock.stacks.values())).pylock
    dead = "http://127.0.0.1:9/simple/"
    plan = replace(
        with_uv(release_plan({**index, "owner": dead, "public": dead}, reachable / "release")),
        id=release_id(pylock),
        pylock=pylock,
        netrc=None,
        offline={"find_links": str(wh / "packages"), "requirements": offline_requirements(pylock)},
    )
    proc = install(plan, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (reachable / "release" / MARKER).exists()
    python = str(reachable / "release" / "bin" / "python")
    origin = subprocess.run([python, "-c", "import sfowned; print(sfowned.ORIGIN)"],
                            capture_output=True, text=True)  # fmt: skip
    assert origin.stdout == "owner\n"
    # the same name with other bytes in the copy: one line with both hashes, nothing installed
    sfpub = wh / "packages" / wheels["sfpub"].name
    want = _sha(sfpub.read_bytes())
    sfpub.unlink()
    lab_wheels.write_wheel(wh / "packages", "sfpub", "1.0", {"sfpub/__init__.py": "X = 1\n"}, [])
    again = replace(plan, path=str(reachable / "release2"))
    proc = install(again, tmp_path)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1] == (
        f"servefleet: hash mismatch: sfpub==1.0: the lock has sha256:{want}, the copy has "
        f"sha256:{_sha(sfpub.read_bytes())}; release {plan.id} not installed"
    )
    assert not (reachable / "release2" / MARKER).exists()


def test_an_offline_install_builds_nothing_and_names_a_package_with_only_an_sdist(
    tmp_path: Path, index: dict[str, str], reachable: Path
) -> None:
    packages = tmp_path / "packages"
    packages.mkdir()
    sdist = packages / "sfsrc-1.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        data = b'[project]\nname = "sfsrc"\nversion = "1.0"\n'
        info = tarfile.TarInfo("sfsrc-1.0/pyproject.toml")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    pylock = (f'lock-version = "1.0"\n[[packages]]\nname = "sfsrc"\nversion = "1.0"\n'
              f'sdist = {{ url = "http://127.0.0.1:9/files/{sdist.name}", '
              f'hashes = {{ sha256 = "{_sha(sdist.read_bytes())}" }} }}\n')  # fmt: skip
    plan = replace(
        with_uv(release_plan(index, reachable / "release")),
        id="rel-sdist",
        pylock=pylock,
        netrc=None,
        offline={"find_links": str(packages), "requirements": offline_requirements(pylock)},
    )
    proc = install(plan, tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "servefleet: sfsrc has no wheel here, and hosts build nothing (the controller "
        "builds sdists); release rel-sdist not installed"
    )


def test_the_wheelhouse_source_needs_a_lock_and_hosts_get_no_index_credentials(
    tmp_path: Path,
) -> None:
    with pytest.raises(DataError, match="sdk_source: 'wheelhouse' needs sdk_lock and sdk_wheelhouse set"):  # fmt: skip
        defaults(sdk_source="wheelhouse")
    # no credentials in the environment: hosts reach no index, so none are needed
    s = settings_from(lambda k: {"sdk_source": "wheelhouse", "sdk_lock": str(tmp_path),
                                 "sdk_wheelhouse": str(tmp_path / "wh")}.get(k),
                      environ={}, keys=["sdk_source", "sdk_lock", "sdk_wheelhouse"])  # fmt: skip
    spec = resolve_for(s)
    unlocked = plan_release(replace(s, sdk_lock=None, sdk_source="index"), spec, None)
    assert unlocked.stack is not None
    pylock = 'lock-version = "1.0"\n[[packages]]\nname = "vllm-rbln"\nversion = "0.12.0"\n' \
             'wheels = [{ url = "https://x.example/v.whl", hashes = { sha256 = "' + "a" * 64 + '" } }]\n'  # fmt: skip
    write_lock(tmp_path, {unlocked.stack: pylock}, {}, {})
    rel = plan_release(s, spec, "/etc/servefleet/secrets/netrc")
    assert rel.netrc is None and rel.pylock == pylock
    assert rel.offline == {
        "find_links": "/opt/servefleet/wheelhouse/packages",
        "requirements": "vllm-rbln==0.12.0 \\\n    --hash=sha256:" + "a" * 64 + "\n",
    }
    assert rel.to_json()["offline"] == rel.offline


LOCK_DATA = r"""
import json, sys
from servefleet.fleet.lockfleet import fleet_lock, lock_settings
inventory, data = sys.argv[1], json.loads(sys.argv[2])
fl = fleet_lock(inventory, data)
where, s = lock_settings(inventory, data)
print(json.dumps({"lock_dir": str(fl.lock_dir), "stacks": len(fl.stacks),
                  "planned": sorted({(x.sdk_source, x.sdk_lock) for x in fl.stacks.values()}),
                  "where": str(where), "source": s.sdk_source, "wheelhouse": s.sdk_wheelhouse}))
"""


def test_lock_and_wheelhouse_read_the_same_data_a_wheelhouse_deploy_does(tmp_path: Path) -> None:
    """`servefleet lock` and `servefleet wheelhouse --inventory` take data that says
    sdk_source=wheelhouse (the lock is made from the indexes all the same). pyinfra reads the
    inventory in a process of its own (it patches threading)."""
    inventory = tmp_path / "inv.py"
    inventory.write_text('fleet = ["npu-a1"]\n')
    lock, wh = str(tmp_path / "lock"), str(tmp_path / "wh")
    data = {"sdk_source": "wheelhouse", "sdk_lock": lock, "sdk_wheelhouse": wh}
    proc = subprocess.run([sys.executable, "-c", LOCK_DATA, str(inventory), json.dumps(data)],
                          capture_output=True, text=True, env={**os.environ, **ENV})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {
        "lock_dir": lock, "stacks": 1, "planned": [["index", None]],
        "where": lock, "source": "wheelhouse", "wheelhouse": wh,
    }  # fmt: skip
