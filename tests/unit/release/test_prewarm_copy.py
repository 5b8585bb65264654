"""Fleet pre-warm copies: ``remote/prewarm.py`` pack/unpack and the controller's Store, run for
real on local directories (the lab tests run them on hosts through pyinfra)."""

from __future__ import annotations

import json
import os
import pwd
import sys
import tarfile
from dataclasses import asdict
from pathlib import Path

import pytest
from fetch_stubs import MODEL, REV, TOP
from hub_trees import CONFIG, blob, hub_tree, record
from repo_paths import REMOTE

from servefleet.fleet.fleetview import fleet_plan
from servefleet.release.prewarm_store import Store, WarmEntry, prewarm_roles

sys.path.insert(0, str(REMOTE))
import prewarm  # noqa: E402

FP = "0123456789abcdef"
DIR = "rbln/openai_gpt-oss-120b-1a2b3c4d/5d41402abc4b2a76"
USER = pwd.getpwuid(os.getuid()).pw_name


def warm_host(root: Path, dirs: list[str] | None = None) -> Path:
    bundle = root / DIR / "rank0" / "mega_cache.bin"
    bundle.parent.mkdir(parents=True)
    bundle.write_bytes(b"bundle" * 1000)
    (root / DIR / "rank1").mkdir()
    (root / DIR / "rank1" / "mega_cache.bin").write_bytes(b"rank one")
    (root / "rbln" / "other-model" / "ffff").mkdir(parents=True)  # another fingerprint's cache
    (root / "rbln" / "other-model" / "ffff" / "x.bin").write_bytes(b"not copied")
    # the marker as a compile-only build leaves it: its directories and the seal of their files
    prewarm.warm_state.mark_warm({"cache_root": str(root)}, FP, [DIR] if dirs is None else dirs,
                                source="compile only (RBLN-CR13)")  # fmt: skip
    return root


def packed(tmp: Path) -> tuple[Store, Path]:
    """A warm host's cache packed and kept in a controller store."""
    src = warm_host(tmp / "a")
    out = tmp / "a-out" / f"{FP}.tar"
    prewarm.pack(src, FP, out)
    store = Store(str(tmp / "store"))
    tar_part, manifest_part = store.parts(FP, "host-a")
    os.replace(out, tar_part)
    os.replace(f"{out}.json", manifest_part)
    assert "2 files" in store.accept(FP, tar_part, manifest_part, "host-a")
    assert store.has(FP)
    return store, src


def send(store: Store, dest: Path) -> Path:
    """What the push does: the store's tar and manifest into the host's incoming directory."""
    incoming = dest / ".servefleet-incoming"
    incoming.mkdir(parents=True, exist_ok=True)
    tar = incoming / f"{FP}.tar"
    tar.write_bytes(store.tar(FP).read_bytes())
    Path(f"{tar}.json").write_bytes(store.manifest_path(FP).read_bytes())
    return tar


def test_a_copy_holds_only_the_fingerprints_directories_and_makes_the_host_warm(
    tmp_path: Path,
) -> None:
    store, src = packed(tmp_path)
    with tarfile.open(store.tar(FP)) as tar:
        assert sorted(tar.getnames()) == [
            f"{DIR}/rank0/mega_cache.bin",
            f"{DIR}/rank1/mega_cache.bin",
        ]
    dest = tmp_path / "b"
    dest.mkdir()
    assert prewarm.main(["unpack", str(dest), FP, str(send(store, dest)), USER]) == 0
    for rel in ("rank0/mega_cache.bin", "rank1/mega_cache.bin"):
        assert (dest / DIR / rel).read_bytes() == (src / DIR / rel).read_bytes()
    marker = json.loads((dest / "servefleet-warm" / FP).read_text())
    assert marker["dirs"] == [DIR] and marker["source"] == "copy of host-a"
    assert not (dest / "rbln" / "other-model").exists()
    assert not (dest / ".servefleet-incoming").exists()


def test_a_corrupt_copy_is_refused_and_leaves_the_host_cold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store, _ = packed(tmp_path)
    data = bytearray(store.tar(FP).read_bytes())
    data[1000] ^= 0xFF  # inside the first file's content: same size, other bytes
    store.tar(FP).write_bytes(bytes(data))
    assert store.has(FP)  # the size still matches: the host's check is what catches it
    dest = tmp_path / "b"
    dest.mkdir()
    assert prewarm.main(["unpack", str(dest), FP, str(send(store, dest)), USER]) == prewarm.NO_COPY
    err = capsys.readouterr().err
    assert "sha256" in err and err.count("\n") == 1
    assert not (dest / "servefleet-warm" / FP).exists()
    assert not (dest / "rbln").exists() and not (dest / ".servefleet-incoming").exists()


def test_a_file_changed_inside_a_tar_whose_hash_was_recomputed_is_still_refused(
    tmp_path: Path,
) -> None:
    store, _ = packed(tmp_path)
    manifest = json.loads(store.manifest_path(FP).read_text())
    manifest["files"][f"{DIR}/rank1/mega_cache.bin"] = [8, "0" * 64]
    store.manifest_path(FP).write_text(json.dumps(manifest))
    dest = tmp_path / "b"
    dest.mkdir()
    with pytest.raises(prewarm.NoCopy, match="rank1/mega_cache.bin: 8 bytes"):
        prewarm.unpack(dest, FP, send(store, dest), USER)


def hostile_copy(tmp_path: Path, member: str, listed: bool) -> tuple[Path, Path]:
    """A host's incoming copy: a tar holding one file as ``member``, its manifest listing it
    (``listed``) or nothing; returns (the host's cache root, the tar)."""
    dest = tmp_path / "b"
    incoming = dest / ".servefleet-incoming"
    incoming.mkdir(parents=True)
    tar_path = incoming / f"{FP}.tar"
    evil = tmp_path / "evil"
    evil.write_text("x")
    with tarfile.open(tar_path, "w") as tar:
        tar.add(evil, arcname=member)
    files = {member: [1, prewarm.sha256_of(evil)]} if listed else {}
    manifest = {"fingerprint": FP, "dirs": [DIR], "files": files}
    manifest.update(tar_size=tar_path.stat().st_size, tar_sha256=prewarm.sha256_of(tar_path))
    Path(f"{tar_path}.json").write_text(json.dumps(manifest))
    return dest, tar_path


def test_a_copy_with_a_member_its_manifest_does_not_list_is_refused(tmp_path: Path) -> None:
    dest, tar_path = hostile_copy(tmp_path, "../../etc/evil", listed=False)
    with pytest.raises(prewarm.NoCopy, match="does not list"):
        prewarm.unpack(dest, FP, tar_path, USER)
    assert not (tmp_path / "etc").exists()


@pytest.mark.parametrize(
    "name", ["../../etc/evil", f"{DIR}/../../../../etc/evil", "/etc/evil", "x/y"]
)
def test_a_manifest_naming_a_file_outside_its_directories_is_refused(
    tmp_path: Path, name: str
) -> None:
    dest, tar_path = hostile_copy(tmp_path, name, listed=True)
    with pytest.raises(prewarm.NoCopy, match="outside its cache directories"):
        prewarm.unpack(dest, FP, tar_path, USER)
    assert not (tmp_path / "etc").exists() and not (dest / "etc").exists()


@pytest.mark.parametrize("dirs", [[], ["../../etc"], ["/etc/passwd"]])
def test_a_marker_without_a_cache_directory_gives_no_copy(tmp_path: Path, dirs: list[str]) -> None:
    src = warm_host(tmp_path / "a", dirs)
    with pytest.raises(prewarm.NoCopy, match="names no cache directory"):
        prewarm.pack(src, FP, tmp_path / "out.tar")


def test_the_store_keeps_only_a_download_that_matches_its_manifest(tmp_path: Path) -> None:
    src = warm_host(tmp_path / "a")
    out = tmp_path / "out" / f"{FP}.tar"
    prewarm.pack(src, FP, out)
    store = Store(str(tmp_path / "store"))
    tar_part, manifest_part = store.parts(FP, "host-a")
    os.replace(f"{out}.json", manifest_part)
    tar_part.write_bytes(out.read_bytes()[:-512])  # a cut download
    with pytest.raises(ValueError, match="bytes, sha256"):
        store.accept(FP, tar_part, manifest_part, "host-a")
    assert not store.has(FP) and not tar_part.exists() and not manifest_part.exists()
    with pytest.raises(ValueError, match="not a compile fingerprint"):
        store.tar("../x")


def test_a_cache_written_since_its_seal_is_never_copied(tmp_path: Path) -> None:
    """#18 finding 5: a serving process (the serve user) rewrites a bundle or adds a file after
    the compile ended and its seal was recorded: the host gives no copy, and nothing is left."""
    for change in ("rewrite", "add"):
        src = warm_host(tmp_path / change)
        if change == "rewrite":
            (src / DIR / "rank0" / "mega_cache.bin").write_bytes(b"poisoned" * 750)
        else:
            (src / DIR / "rank1" / "extra.py").write_text("import os\n")
        out = tmp_path / f"{change}-out" / f"{FP}.tar"
        with pytest.raises(
            prewarm.NoCopy, match="differs from its seal .* since its compile ended"
        ):
            prewarm.pack(src, FP, out)
        assert not out.exists() and list(out.parent.iterdir()) == []


def test_a_marker_without_a_seal_gives_no_copy(tmp_path: Path) -> None:
    src = warm_host(tmp_path / "a")
    marker = src / "servefleet-warm" / FP
    marker.write_text(json.dumps({"dirs": [DIR], "source": "compile only (RBLN-CR13)"}))
    with pytest.raises(prewarm.NoCopy, match="has no seal of its cache"):
        prewarm.pack(src, FP, tmp_path / "out" / f"{FP}.tar")


@pytest.mark.parametrize("seal", [None, {}, "other"])
def test_the_store_keeps_only_a_copy_of_its_sealed_files(tmp_path: Path, seal: object) -> None:
    src = warm_host(tmp_path / "a")
    out = tmp_path / "out" / f"{FP}.tar"
    prewarm.pack(src, FP, out)
    manifest = json.loads(Path(f"{out}.json").read_text())
    if seal == "other":
        manifest["seal"] = dict(manifest["files"], **{f"{DIR}/rank0/mega_cache.bin": [1, "0" * 64]})
    else:
        manifest["seal"] = seal
    store = Store(str(tmp_path / "store"))
    tar_part, manifest_part = store.parts(FP, "host-a")
    os.replace(out, tar_part)
    manifest_part.write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="not the seal root recorded when its compile ended"):
        store.accept(FP, tar_part, manifest_part, "host-a")
    assert not store.has(FP)


def test_a_host_warm_from_a_copy_is_sealed_by_its_checked_manifest(tmp_path: Path) -> None:
    store, _ = packed(tmp_path)
    dest = tmp_path / "b"
    dest.mkdir()
    assert prewarm.main(["unpack", str(dest), FP, str(send(store, dest)), USER]) == 0
    marker = json.loads((dest / "servefleet-warm" / FP).read_text())
    assert marker["seal"] == store.manifest(FP)["files"]  # type: ignore[index]
    with pytest.raises(prewarm.NoCopy, match="written by a server"):  # it serves: never a source
        prewarm.pack(dest, FP, tmp_path / "again" / f"{FP}.tar")


@pytest.mark.parametrize("source", ["compiled", "copy of lab1", None])
def test_a_cache_a_server_wrote_is_never_packed(tmp_path: Path, source: str | None) -> None:
    """#31 finding 5: a serving host's cache (its own compile, or a copy its servers have run
    from since) is never copied to the fleet, sealed or not: only a compile-only build's."""
    src = warm_host(tmp_path / "a")
    marker = src / "servefleet-warm" / FP
    record = json.loads(marker.read_text())
    record["source"] = source
    marker.write_text(json.dumps(record))
    out = tmp_path / "out" / f"{FP}.tar"
    with pytest.raises(prewarm.NoCopy, match="written by a server .* not by a compile-only build"):
        prewarm.pack(src, FP, out)
    assert not out.exists()


def test_the_store_keeps_no_copy_that_is_not_a_compile_only_builds(tmp_path: Path) -> None:
    src = warm_host(tmp_path / "a")
    out = tmp_path / "out" / f"{FP}.tar"
    prewarm.pack(src, FP, out)
    manifest = json.loads(Path(f"{out}.json").read_text())
    assert manifest["origin"] == "compile only"
    del manifest["origin"]  # a copy kept before #31, or made from a serving host
    store = Store(str(tmp_path / "store"))
    tar_part, manifest_part = store.parts(FP, "host-a")
    os.replace(out, tar_part)
    manifest_part.write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="does not come from a compile-only build"):
        store.accept(FP, tar_part, manifest_part, "host-a")
    assert not store.has(FP)
    store.root.mkdir(parents=True, exist_ok=True)  # and one already kept does not count
    store.tar(FP).write_bytes(b"x")
    store.manifest_path(FP).write_text(json.dumps({**manifest, "tar_size": 1}))
    assert not store.has(FP)


def entry(host: str, warm: bool = False, kept: bool = False, **kw: object) -> WarmEntry:
    fields = {"fingerprint": FP, "fleet": True, "builder": False, **kw}
    return WarmEntry(host=host, warm=warm, kept=kept, **fields)  # type: ignore[arg-type]


def test_the_first_cold_host_compiles_and_the_others_copy() -> None:
    roles = prewarm_roles([entry("a"), entry("b"), entry("c")])
    assert roles == {"a": "seed", "b": "copy", "c": "copy"}


def test_a_warm_host_is_never_the_source_the_first_cold_host_builds() -> None:
    roles = prewarm_roles([entry("a"), entry("b"), entry("c", warm=True), entry("d", warm=True)])
    assert roles == {"a": "seed", "b": "copy", "c": "warm", "d": "warm"}


def test_a_kept_copy_means_nobody_compiles() -> None:
    roles = prewarm_roles([entry("a", kept=True), entry("b", kept=True, warm=True)])
    assert roles == {"a": "copy", "b": "warm"}


def test_a_build_host_compiles_for_every_serving_host() -> None:
    roles = prewarm_roles([entry("a"), entry("b"), entry("build", builder=True)])
    assert roles == {"a": "copy", "b": "copy", "build": "build"}
    assert prewarm_roles([entry("build", builder=True, kept=True)]) == {"build": "warm"}


def test_host_scope_and_other_fingerprints_are_independent() -> None:
    roles = prewarm_roles(
        [entry("a", fleet=False), entry("b"), entry("c", fingerprint="fedcba9876543210"),
         entry("d", fingerprint=None)]
    )  # fmt: skip
    assert roles == {"a": "host", "b": "seed", "c": "seed", "d": "host"}


def test_plan_marks_only_the_seed_as_recompiling() -> None:
    def summary(host: str, order: int, warm: bool = False) -> dict[str, object]:
        e = entry(host, warm=warm)
        return {"recompile": not warm, "prewarm": "warm" if warm else "host",
                "warm_entry": asdict(e), "order": order}  # fmt: skip

    plans = fleet_plan({"b": summary("b", 1), "a": summary("a", 0), "c": summary("c", 2)})
    assert {h: (p["prewarm"], p["recompile"]) for h, p in plans.items()} == {
        "a": ("seed", True),
        "b": ("copy", False),
        "c": ("copy", False),
    }


COMPILE_ONLY = [["VLLM_RBLN_COMPILE_ONLY", "1"], ["RBLN_FORCE_NPU_NAME", "{sku}"]]


def test_the_compile_only_build_runs_as_its_own_user_unreachable_into_its_own_cache() -> None:
    """#31 finding 5: the build a fleet copies is the first instance's unit with compile-only
    mode, as servefleet-build (not the serve user), HOME and VLLM_CACHE_ROOT its own tree, in a
    network namespace of its own (it takes no request), without the servers' API key."""
    text = (
        "[Service]\nType=simple\nUser=servefleet\nGroup=servefleet\n"
        'Environment="HOME=/var/lib/servefleet"\nEnvironment="VLLM_CACHE_ROOT=/var/cache/x"\n'
        'Environment="HF_HOME=/var/lib/servefleet/hf"\n'
        "EnvironmentFile=/etc/servefleet/secrets/vllm-api-key.env\n"
        'ExecStart="/opt/servefleet/releases/r/bin/vllm" "serve" "m"\nRestart=on-failure\n'
    )
    state = {"instances": [{"text": text}], "compile_only": COMPILE_ONLY}  # the platform's (#47)
    unit = prewarm.build_unit(state, "RBLN-CR13", Path("/opt/b/c"), Path("/opt/b/hub"))
    lines = unit.splitlines()
    assert "User=servefleet-build" in lines and "Group=servefleet-build" in lines
    assert (
        'Environment="HOME=/opt/b/c"' in lines and 'Environment="VLLM_CACHE_ROOT=/opt/b/c"' in lines
    )
    assert 'Environment="HF_HOME=/opt/b/hub"' in lines  # root's checked copy (#46 item 2)
    assert not [x for x in lines if "/var/lib/servefleet/hf" in x]  # never the serve user's hub
    assert "PrivateNetwork=yes" in lines and "Restart=no" in lines
    assert 'Environment="VLLM_RBLN_COMPILE_ONLY=1"' in lines
    assert 'Environment="RBLN_FORCE_NPU_NAME=RBLN-CR13"' in lines
    assert not any(x.startswith(("EnvironmentFile", "User=servefleet\n")) for x in lines)
    assert lines.index("PrivateNetwork=yes") < lines.index(
        next(x for x in lines if x.startswith("ExecStart="))
    )


def test_the_build_reads_root_s_checked_copy_and_refuses_a_changed_model(tmp_path: Path) -> None:
    """#46 item 2: stage_hub copies the models the state names from the serve user's hub into
    root's own build hub (made anew), held to root's fetch record; a model changed since its
    fetch is one line and no copy, so the build compiles nothing the serve user wrote."""
    home = tmp_path / "hf"
    snap = hub_tree(home)
    record(home)
    text = f'[Service]\nEnvironment="HF_HOME={home}"\nExecStart="vllm" "serve" "m"\n'
    state = {"instances": [{"text": text}], "models": [MODEL]}
    hub_root = tmp_path / "build-hub"
    hub_root.mkdir()
    (hub_root / "left-by-an-earlier-build").write_text("x")
    prewarm.stage_hub(state, hub_root)
    assert sorted(p.name for p in hub_root.iterdir()) == ["hub"]
    assert (hub_root / "hub" / TOP / "snapshots" / REV / "config.json").read_bytes() == CONFIG
    blob(snap, "config.json").write_bytes(CONFIG.replace(b"tiny", b"evil"))
    with pytest.raises(prewarm.NoCopy) as e:
        prewarm.stage_hub(state, hub_root)
    assert str(e.value) == (
        f"cannot give the build a checked copy of {MODEL}: config.json differs from the sha256 "
        "it was fetched with; fetch it again (delete the model directory)"
    )
    with pytest.raises(prewarm.NoCopy, match="names no HF_HOME or no models"):
        prewarm.stage_hub({"instances": [{"text": "[Service]\n"}], "models": [MODEL]}, hub_root)
    prewarm.drop_hub(hub_root)
    assert not hub_root.exists()
