"""What a fetched model and a sealed compile cache hold, against what root recorded (#36,
src/servefleet/base/remote/content_check.py): a Hugging Face cache tree as the hub lays it out
(blobs named by their sha256 or git sha1, snapshot files linking to them), held to its blob
names and to root's record of the fetch; links out of the model, through a link or to no regular
file named and never read; a cache held to its seal; ``warm_state.py drop``; the fetcher's record
(a real fetch from a stub store) and the probe's ``model_drift`` / ``cache_drift``."""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fetch_stubs import MODEL, REV, TOP, Stub, fetch, hf_layout, respond, tgz
from hub_trees import CONFIG, NESTED, WEIGHTS, blob, git_sha1, hub_tree, record
from repo_paths import REMOTE

sys.path.insert(0, str(REMOTE))
import content_check  # noqa: E402
import layout  # noqa: E402
import systemd_units  # noqa: E402
import warm_state  # noqa: E402

FP = "cd" * 32


def verify(home: Path, model: str = MODEL) -> dict[str, Any]:
    return content_check.verify_model(str(home), model)


def test_a_hub_tree_is_held_to_its_blob_names(tmp_path: Path) -> None:
    home = tmp_path / "hf"
    snap = hub_tree(home)
    total = len(WEIGHTS) + len(CONFIG) + len(NESTED)
    assert verify(home) == {"files": 3, "bytes": total, "unchecked": 0, "differ": []}
    # a blob cut short, as a disk fault or a half-written copy leaves it
    with open(blob(snap, "model.safetensors"), "r+b") as f:
        f.truncate(100)
    # a git blob edited in place, its size kept
    blob(snap, "config.json").write_bytes(CONFIG.replace(b"tiny", b"huge"))
    found = verify(home)
    assert found["differ"] == [
        f"config.json differs from the digest its blob is named by ({git_sha1(CONFIG)})",
        "model.safetensors differs from the digest its blob is named by "
        f"({hashlib.sha256(WEIGHTS).hexdigest()})",
    ]
    assert (found["files"], found["bytes"]) == (3, 100 + len(CONFIG) + len(NESTED))


def test_with_roots_record_every_change_is_named(tmp_path: Path) -> None:
    home = tmp_path / "hf"
    snap = hub_tree(home)
    (snap / "README.md").write_text("plain\n")  # a plain file: only a record can hold it
    assert verify(home)["unchecked"] == 1
    record(home)
    assert verify(home) == {"files": 4, "bytes": len(WEIGHTS) + len(CONFIG) + len(NESTED) + 6,
                            "unchecked": 0, "differ": []}  # fmt: skip
    with open(blob(snap, "model.safetensors"), "r+b") as f:
        f.truncate(0)
    (snap / "README.md").write_text("PLAIN\n")  # the same size
    (snap / "tok" / "merges.txt").unlink()
    (snap / "added.bin").write_bytes(b"x")
    assert verify(home)["differ"] == [
        "README.md differs from the sha256 it was fetched with",
        "added.bin was not fetched (it was added since)",
        f"model.safetensors has 0 bytes, fetched with {len(WEIGHTS)}",
        "tok/merges.txt is missing",
    ]


def test_a_record_of_another_revision_or_in_a_planted_directory_is_not_used(
    tmp_path: Path,
) -> None:
    home = tmp_path / "hf"
    snap = hub_tree(home)
    hub = os.open(home / "hub", os.O_RDONLY | os.O_DIRECTORY)
    content_check.write_record(hub, TOP, "e" * 40, {})  # an earlier fetch's
    os.close(hub)
    (snap / "README.md").write_text("plain\n")
    assert verify(home)["unchecked"] == 1  # held to the blob names only
    shutil.rmtree(home / "hub" / content_check.RECORDS)
    record(home)
    (home / "hub" / content_check.RECORDS).chmod(0o777)  # writable by others: not root's own
    assert verify(home)["unchecked"] == 1


@pytest.mark.parametrize(
    ("plant", "line"),
    [
        (
            lambda s, r: _relink(s / "config.json", "/etc/passwd"),
            "config.json links to /etc/passwd, outside its model's directory",
        ),
        (
            lambda s, r: _relink(s / "config.json", "../../../../secret"),
            "config.json links to ../../../../secret, outside its model's directory",
        ),
        (
            lambda s, r: _relink(s / "config.json", "../../blobs/x/../y"),
            "config.json links to ../../blobs/x/../y, not to a file of its model's directory",
        ),
        (
            lambda s, r: _relink(s / "config.json", "../../blobs/missing"),
            "config.json links to ../../blobs/missing, which is missing",
        ),
        (
            lambda s, r: (
                (r / "blobs" / "link").symlink_to("/etc/passwd")
                or _relink(s / "config.json", "../../blobs/link")
            ),
            "config.json links to ../../blobs/link, itself a link",
        ),
        (
            lambda s, r: (r / "blobs" / "d").mkdir() or _relink(s / "config.json", "../../blobs/d"),
            "config.json links to ../../blobs/d, not a regular file",
        ),
        (
            lambda s, r: (r / "blobs").rename(r / "real") or (r / "blobs").symlink_to("real"),
            "config.json links to ../../blobs/" + git_sha1(CONFIG) + ", through a link or a "
            "missing directory",
        ),
        (lambda s, r: os.mkfifo(s / "fifo"), "fifo is not a regular file"),
    ],  # fmt: skip
    ids=["absolute", "above", "dotdot", "missing", "link", "dir", "through", "fifo"],
)
def test_a_file_that_is_not_in_its_model_is_named_and_never_read(
    tmp_path: Path, plant: Any, line: str
) -> None:
    home = tmp_path / "hf"
    snap = hub_tree(home)
    (tmp_path / "secret").write_text("root's\n")
    plant(snap, snap.parent.parent)
    found = verify(home)
    assert line in found["differ"], found["differ"]
    assert found["bytes"] <= len(WEIGHTS) + len(CONFIG) + len(NESTED)  # nothing read beyond


def _relink(link: Path, target: str) -> None:
    link.unlink()
    link.symlink_to(target)


def test_a_model_directory_or_snapshot_replaced_by_a_link_is_drift(tmp_path: Path) -> None:
    home = tmp_path / "hf"
    snap = hub_tree(home)
    repo = snap.parent.parent
    real = tmp_path / "elsewhere"
    snap.rename(real)
    snap.symlink_to(real)
    assert verify(home)["differ"] == [f"snapshots/{REV} is not a directory (a link?)"]
    (repo / layout.MODEL_COMPLETE).write_text("not a revision")
    assert verify(home)["differ"] == [f"{layout.MODEL_COMPLETE} names no snapshot"]
    repo.rename(tmp_path / "moved")
    repo.symlink_to(tmp_path / "moved")
    assert verify(home)["differ"] == [f"{TOP} is not a directory (a link?)"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (the serve user's tree as nobody's)")
def test_the_serve_users_tree_is_read_through_descriptors(tmp_path: Path) -> None:
    """The hub is the serve user's (nobody's here): its link to a root-only file, planted as a
    snapshot file's blob, is named and the file never read."""
    tmp_path.chmod(0o755)
    home = tmp_path / "hf"
    snap = hub_tree(home)
    nobody = pwd.getpwnam("nobody")
    for path in [home, *home.rglob("*")]:
        os.chown(path, nobody.pw_uid, nobody.pw_gid, follow_symlinks=False)
    record(home)
    secret = tmp_path / "root-only"
    secret.write_bytes(CONFIG)
    secret.chmod(0o600)
    name = git_sha1(CONFIG)
    (snap.parent.parent / "blobs" / name).unlink()
    (snap.parent.parent / "blobs" / name).symlink_to(secret)
    assert verify(home)["differ"] == [f"config.json links to ../../blobs/{name}, itself a link"]


# --- caches ---------------------------------------------------------------------------------
def warm_cache(cache: Path, dirs: tuple[str, ...] = ("rbln/m-1/sig1", "rbln/m-1/sig2")) -> None:
    """A compile cache of FP under ``cache``, marked warm with its seal (as the gate does)."""
    for d in dirs:
        (cache / d / "rank0").mkdir(parents=True)
        (cache / d / "rank0" / "mega_cache.bin").write_bytes(d.encode() * 100)
    warm_state.mark_warm({"cache_root": str(cache)}, FP, list(dirs))


def check_cache(cache: Path) -> dict[str, Any]:
    record = content_check.cache_record(str(cache), FP)
    assert record is not None
    return content_check.verify_cache(str(cache), record)


def test_a_cache_is_held_to_its_seal(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    warm_cache(cache)
    assert check_cache(cache) == {"files": 2, "bytes": 2600, "unchecked": 0, "differ": []}
    bundle = cache / "rbln/m-1/sig1/rank0/mega_cache.bin"
    bundle.write_bytes(b"X" + bundle.read_bytes()[1:])
    (cache / "rbln/m-1/sig1/rank0/extra").write_text("written by a server\n")
    (cache / "rbln/m-1/sig1/rank0/link").symlink_to("/etc/passwd")
    shutil.rmtree(cache / "rbln/m-1/sig2")
    assert check_cache(cache)["differ"] == [
        "rbln/m-1/sig2 is missing, or not a directory (a link?)",
        "rbln/m-1/sig1/rank0/extra was not sealed (it was added since)",
        "rbln/m-1/sig1/rank0/link is a link",
        "rbln/m-1/sig1/rank0/mega_cache.bin differs from the sha256 it was sealed with",
    ]
    # a marker without a seal (no plain tree when its compile ended) holds nothing to check
    found = content_check.verify_cache(str(cache), {"dirs": ["rbln/m-1/sig1"], "seal": None})
    assert found == {"files": 0, "bytes": 0, "unchecked": 0, "differ": [], "unsealed": True}


def test_drop_removes_a_drifted_cache_and_stops_its_first_instance(
    tmp_path: Path, monkeypatch: Any
) -> None:
    cache = tmp_path / "cache"
    warm_cache(cache)
    stopped: list[tuple[str, ...]] = []
    monkeypatch.setattr(systemd_units, "systemctl", lambda *a, check=True: stopped.append(a))
    warm_state.drop(str(cache), FP, "servefleet-vllm-0.service")  # matches its seal: kept
    assert stopped == [] and content_check.cache_record(str(cache), FP) is not None
    bundle = cache / "rbln/m-1/sig2/rank0/mega_cache.bin"
    bundle.write_bytes(b"tampered")
    warm_state.drop(str(cache), FP, "servefleet-vllm-0.service")
    assert stopped == [("stop", "servefleet-vllm-0.service")]
    assert content_check.cache_record(str(cache), FP) is None  # cold: the converge compiles
    assert sorted(p.name for p in (cache / "rbln" / "m-1").iterdir()) == []  # nothing aside left


def test_drop_as_the_deploy_runs_it(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    warm_cache(cache)
    out = subprocess.run([sys.executable, str(REMOTE / "warm_state.py"), "drop", str(cache), FP,
                          "x.service"], capture_output=True, text=True, check=True)  # fmt: skip
    assert out.stdout == f"cache {FP}: matches its seal: kept\n"
    bad = subprocess.run([sys.executable, str(REMOTE / "warm_state.py"), "pack"],
                         capture_output=True, text=True)  # fmt: skip
    assert bad.returncode == 2 and bad.stderr.startswith("usage: warm_state.py drop")


# --- the fetcher's record, the probe's report ---------------------------------------------------
def test_a_fetch_records_each_file_and_a_refetch_replaces_a_drifted_copy(tmp_path: Path) -> None:
    home = tmp_path / "hf"
    stub = Stub("127.0.0.1")
    try:
        data = tgz(hf_layout())
        sha = hashlib.sha256(data).hexdigest()
        stub.routes[f"/store/{MODEL}.tar.gz"] = respond(200, data)
        store = ["--store", f"{stub.url}/store", "--sha256", sha]
        assert fetch(home, *store).returncode == 0
        assert verify(home)["differ"] == [] and verify(home)["unchecked"] == 0
        weights = home / "hub" / TOP / "snapshots" / REV / "model.safetensors"  # a plain file
        weights.write_bytes(b"stub")
        assert verify(home)["differ"] == ["model.safetensors has 4 bytes, fetched with 13"]
        proc = fetch(home, *store)  # the deploy's refetch: whole, renamed over the drifted copy
        assert proc.returncode == 0, proc.stderr
        assert verify(home)["differ"] == [] and weights.read_bytes() == b"stub weights\n"
        # a snapshot that links to no file of its model is refused whole
        data = tgz([m for m in hf_layout() if "/blobs/" not in m[1]])
        stub.routes[f"/store/{MODEL}.tar.gz"] = respond(200, data)
        sha = hashlib.sha256(data).hexdigest()
        proc = fetch(home, "--store", f"{stub.url}/store", "--sha256", sha)
        assert proc.returncode == 1 and "config.json links to ../../blobs/" in proc.stderr
        assert "which is missing" in proc.stderr
    finally:
        stub.close()


def test_the_probe_reports_model_and_cache_drift_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from host_inputs import run_probe, settings

    from servefleet.hostplan.extras import resolve_for

    spec = resolve_for(settings())
    model = spec.requirements.models[0]
    assert spec.compile_fingerprint
    monkeypatch.setattr(sys.modules[__name__], "FP", spec.compile_fingerprint)  # the one checked
    snap = hub_tree(tmp_path / "hf", model)
    warm_cache(tmp_path / "cache")
    quiet = run_probe(tmp_path, None, driver=False)
    assert quiet["model_drift"] == {} and quiet["cache_drift"] == {}  # not asked: not read
    assert model in quiet["models"] and FP in quiet["warm"]
    with open(blob(snap, "model.safetensors"), "r+b") as f:
        f.truncate(10)
    (tmp_path / "cache/rbln/m-1/sig1/rank0/mega_cache.bin").write_bytes(b"changed")
    found = run_probe(tmp_path, None, driver=False, serve_verify=True)
    assert found["model_drift"] == {model: [
        "model.safetensors differs from the digest its blob is named by "
        f"({hashlib.sha256(WEIGHTS).hexdigest()})"]}  # fmt: skip
    assert found["cache_drift"] == {FP: [
        "rbln/m-1/sig1/rank0/mega_cache.bin has 7 bytes, sealed with 1300"]}  # fmt: skip
    assert found["verified"][f"model {model}"] == {
        "files": 3, "bytes": 10 + len(CONFIG) + len(NESTED), "unchecked": 0}  # fmt: skip
    assert found["verified"][f"cache {FP}"] == {"files": 2, "bytes": 7 + 1300, "unchecked": 0}
    assert json.dumps(found)  # one JSON object, as the fact reads it


# --- root's copy for the compile-only build (#46 item 2) ----------------------------------------
def staged(home: Path, dest: Path) -> str:
    """stage_model of MODEL from ``home``'s hub into a new ``dest`` (root's own hub)."""
    dest.mkdir()
    fd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return content_check.stage_model(str(home), MODEL, fd)
    finally:
        os.close(fd)


def test_the_build_gets_the_recorded_bytes_as_root_s_regular_files(tmp_path: Path) -> None:
    """The copy holds each recorded file's bytes, as regular files (the snapshot's links to
    blobs resolved), and refs/main; a file the serve user added since the fetch is left out."""
    home = tmp_path / "hf"
    snap = hub_tree(home)
    record(home)
    (snap / "modeling_evil.py").write_text("import os; os.system('id')\n")  # added after the fetch
    dest = tmp_path / "build-hub"
    assert staged(home, dest) == REV
    out = dest / TOP / "snapshots" / REV
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if not p.is_dir())
    assert files == ["config.json", "model.safetensors", "tok/merges.txt"]
    assert (out / "model.safetensors").read_bytes() == WEIGHTS
    assert (out / "config.json").read_bytes() == CONFIG
    assert (out / "tok" / "merges.txt").read_bytes() == NESTED
    assert not any(p.is_symlink() for p in out.rglob("*"))
    assert {oct(p.stat().st_mode & 0o777) for p in out.rglob("*") if p.is_file()} == {"0o644"}
    assert (dest / TOP / "refs" / "main").read_text() == REV


@pytest.mark.parametrize(
    "change, why",
    [
        ("edit", "config.json differs from the sha256 it was fetched with"),
        ("truncate", f"model.safetensors has 0 bytes, fetched with {len(WEIGHTS)}"),
        ("remove", "tok/merges.txt is missing"),
        ("relink", "config.json links to /etc/hostname, outside its model's directory"),
    ],
)
def test_a_file_the_serve_user_changed_since_the_fetch_is_never_staged(
    tmp_path: Path, change: str, why: str
) -> None:
    home = tmp_path / "hf"
    snap = hub_tree(home)
    record(home)
    if change == "edit":
        blob(snap, "config.json").write_bytes(CONFIG.replace(b"tiny", b"huge"))
    elif change == "truncate":
        with open(blob(snap, "model.safetensors"), "r+b") as f:
            f.truncate(0)
    elif change == "remove":
        (snap / "tok" / "merges.txt").unlink()
    else:
        (snap / "config.json").unlink()
        (snap / "config.json").symlink_to("/etc/hostname")
    with pytest.raises(content_check.NotStaged) as e:
        staged(home, tmp_path / "build-hub")
    line = str(e.value)
    assert "\n" not in line
    assert line == f"{MODEL}: {why}; fetch it again (delete the model directory)"
    assert not (tmp_path / "build-hub" / TOP / "refs").exists()  # not a complete copy


def test_a_model_without_root_s_record_is_never_staged(tmp_path: Path) -> None:
    """Blob names are the serve user's to choose: only root's record of the fetch counts."""
    home = tmp_path / "hf"
    hub_tree(home)
    with pytest.raises(content_check.NotStaged, match="no record of root's fetch"):
        staged(home, tmp_path / "build-hub")
