#!/usr/bin/env python3
"""servefleet prewarm: one compile per fleet. Runs ON THE HOST, as root, with the system python3
(stdlib only), next to ``instances.py`` and ``health.py``.

usage: prewarm.py pack CACHE_ROOT FINGERPRINT OUT.tar          # a warm host: its cache, to copy
       prewarm.py unpack CACHE_ROOT FINGERPRINT IN.tar USER     # a cold host: check, then use it
       prewarm.py build STATE.json NPU_NAME                     # a build host: compile only

A fingerprint's cache is the directories its warm marker names (``rbln/<model>/<sig>`` under
the cache root, recorded from vllm-rbln's "Saved/Loaded rbln mega-cache bundle" lines).
``pack`` writes them as a tar with a manifest (``OUT.tar.json``: each file's size and sha256,
and the tar's). ``unpack`` checks the tar against the manifest, extracts it aside, checks every
file again, then moves the directories in and writes the warm marker last: an interrupted or
corrupt copy leaves the host cold, so it compiles for itself. Exit 3 means "no usable copy"
(one line on stderr says why); the caller then lets the host compile.

``build`` runs the first instance's unit as ``servefleet-prewarm.service`` with the compile-only
variables its platform names in the state (``compile_only``; RBLN: ``VLLM_RBLN_COMPILE_ONLY=1``
and ``RBLN_FORCE_NPU_NAME``, rbln.md §3.6: no NPU needed), waits
until it answers through the health gate (the bundle is saved before serving starts), records
the warm marker, then stops and removes the unit.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import content_check  # noqa: E402  (next to this file on the host)
import fault_point  # noqa: E402
import health  # noqa: E402
import layout  # noqa: E402
import state_files  # noqa: E402
import systemd_units  # noqa: E402
import trusted  # noqa: E402
import warm_state  # noqa: E402

sha256_of = layout.sha256_of  # the host contract's rule

NO_COPY = 3
INCOMING = layout.INCOMING
BUILD_UNIT = layout.BUILD_UNIT
BUILD_USER = layout.BUILD_USER
# rbln/<model>/<sig>: two names, neither "." nor ".." (``rbln/../..`` is not a cache directory)
_NAME = r"(?!\.{1,2}(?:/|$))[A-Za-z0-9._-]+"
_DIR = re.compile(rf"^rbln/{_NAME}/{_NAME}$")


class NoCopy(Exception):
    """This host cannot use (or give) a copy; the message says why, in one line."""


def state_of(cache_root: Path) -> dict[str, Any]:
    """As much of a state as the warm markers need."""
    return {"cache_root": str(cache_root)}


def marker_dirs(
    cache_root: Path, fingerprint: str
) -> tuple[list[str], dict[str, list[Any]] | None]:
    """The cache directories the warm marker names, and its seal (None: it has none). Only a
    compile-only build's cache is copied to the fleet: a cache a serving process wrote to (it
    runs model code and takes prompts) never leaves its host (#31 finding 5)."""
    record = warm_state.warm_record(state_of(cache_root), fingerprint)
    if record is not None and not str(record.get("source", "")).startswith(layout.COMPILE_ONLY):
        raise NoCopy(
            f"the cache of {fingerprint} here was written by a server ({record.get('source')}), "
            "not by a compile-only build: not copied from this host"
        )
    if record is None:
        raise NoCopy(f"fingerprint {fingerprint} is not warm here with a known cache")
    dirs = record.get("dirs") if isinstance(record, dict) else None
    if not dirs or not all(isinstance(d, str) and _DIR.match(d) for d in dirs):
        raise NoCopy(f"the warm marker of {fingerprint} names no cache directory")
    seal = record.get("seal")
    return list(dirs), seal if isinstance(seal, dict) and seal else None


class _Hashing:
    """A file read through: its sha256 and length as tarfile copies it."""

    def __init__(self, fh: Any) -> None:
        self.fh, self.digest, self.length = fh, hashlib.sha256(), 0

    def read(self, n: int = -1) -> bytes:
        block = self.fh.read(n)
        self.digest.update(block)
        self.length += len(block)
        return block


def _cache_dir(cache: int, rel: str, owner: tuple[int, int] | None = None) -> int:
    """A descriptor of ``rel`` (rbln/<model>[/<sig>]) in the serve user's cache root ``cache``,
    no link followed (``trusted.open_below``; ``owner``: make what is missing, theirs)."""
    try:
        return trusted.open_below(cache, rel, owner)
    except OSError:
        raise NoCopy(f"{rel}: missing here, or not a directory (a link?)") from None


def _open_cache_root(cache_root: Path) -> int:
    fd = trusted.open_dir(str(cache_root))
    if fd is None:
        raise NoCopy(f"{cache_root} is not a directory")
    return fd


def pack(cache_root: Path, fingerprint: str, out: Path) -> None:
    """The warm marker's directories as a tar and its manifest at ``out`` (root's own tree): the
    cache is read through directory descriptors, never following a link (#18 finding 2)."""
    dirs, seal = marker_dirs(cache_root, fingerprint)
    files: dict[str, list[Any]] = {}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    cache = _open_cache_root(cache_root)
    try:
        with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
            for d in dirs:
                base = _cache_dir(cache, d)
                try:
                    _pack_dir(tar, base, d, files)
                finally:
                    os.close(base)
    except OSError as e:
        raise NoCopy(f"cannot read the cache of {fingerprint}: {e}") from None
    finally:
        os.close(cache)
    if seal is None:
        tmp.unlink()
        raise NoCopy(f"the warm marker of {fingerprint} has no seal of its cache")
    if files != seal:
        tmp.unlink()
        changed = sorted(n for n in set(files) | set(seal) if files.get(n) != seal.get(n))
        raise NoCopy(
            f"the cache of {fingerprint} differs from its seal ({len(changed)} file(s), "
            f"{changed[0]} first) since its compile ended: not copied from this host"
        )
    os.replace(tmp, out)
    manifest = {
        "origin": layout.COMPILE_ONLY,  # marker_dirs packs nothing else
        "fingerprint": fingerprint,
        "dirs": dirs,
        "files": files,
        "seal": seal,
        "tar_size": out.stat().st_size,
        "tar_sha256": sha256_of(out),
    }
    systemd_units.write_atomic(Path(f"{out}.json"), json.dumps(manifest, sort_keys=True) + "\n")
    print(json.dumps({"files": len(files), "bytes": sum(f[0] for f in files.values())}))


def _pack_dir(tar: tarfile.TarFile, base: int, d: str, files: dict[str, list[Any]]) -> None:
    """Add every file of the cache directory ``base`` (``d``) to ``tar``, each one's size and
    sha256 as it was read into ``files`` (``trusted.each_file``: no link followed)."""

    def add(rel: str, f: int, st: os.stat_result) -> list[Any]:
        info = tarfile.TarInfo(rel)
        info.size, info.mtime, info.mode = st.st_size, int(st.st_mtime), 0o644
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        with os.fdopen(f, "rb", closefd=False) as fh:
            src = _Hashing(fh)
            tar.addfile(info, src)  # type: ignore[arg-type]
        return [src.length, src.digest.hexdigest()]

    try:
        files.update(trusted.each_file(base, d, add))
    except trusted.NotRegular as e:
        raise NoCopy(str(e)) from None


def _check_manifest(manifest: Any, fingerprint: str) -> dict[str, Any]:
    ok = (
        isinstance(manifest, dict)
        and manifest.get("fingerprint") == fingerprint
        and isinstance(manifest.get("dirs"), list)
        and all(isinstance(d, str) and _DIR.match(d) for d in manifest["dirs"])
        and isinstance(manifest.get("files"), dict)
    )
    if not ok:
        raise NoCopy(f"the copy's manifest is not one of fingerprint {fingerprint}")
    for name in manifest["files"]:
        parts = Path(name).parts
        inside = any(name.startswith(f"{d}/") for d in manifest["dirs"])
        if not inside or name.startswith("/") or ".." in parts or "." in parts:
            raise NoCopy(f"the copy's manifest lists {name!r}, outside its cache directories")
    return manifest


def unpack(cache_root: Path, fingerprint: str, tar_path: Path, user: str) -> None:
    try:
        manifest = _check_manifest(json.loads(Path(f"{tar_path}.json").read_text()), fingerprint)
        size = tar_path.stat().st_size
    except (OSError, ValueError):
        raise NoCopy(f"the copy of {fingerprint} is missing or unreadable") from None
    if size != manifest.get("tar_size"):
        raise NoCopy(f"the copy has {size} bytes, its manifest says {manifest.get('tar_size')}")
    got = sha256_of(tar_path)
    if got != manifest.get("tar_sha256"):
        raise NoCopy(f"the copy's sha256 is {got}, its manifest says {manifest.get('tar_sha256')}")
    os.makedirs(cache_root, exist_ok=True)
    cache = _open_cache_root(cache_root)
    try:
        # root's own directory in the serve user's tree (same file system as the cache, so the
        # copy is moved in by rename); reached through its descriptor, never by its name
        inc = trusted.root_dir(cache, INCOMING, create=True)
        assert inc is not None
        try:
            os.fchmod(inc, 0o700)
            _unpack_into(cache, inc, fingerprint, tar_path, manifest, user)
        finally:
            os.close(inc)
        clear_incoming(cache)
    finally:
        os.close(cache)
    source = str(manifest.get("source") or "a fleet copy")
    dirs = manifest["dirs"]
    warm_state.mark_warm(
        state_of(cache_root), fingerprint, dirs, source=f"copy of {source}", seal=manifest["files"]
    )
    print(f"{fingerprint}: {len(manifest['files'])} files checked and in place ({', '.join(dirs)})")


def clear_incoming(cache: int) -> None:
    """Remove root's incoming directory from the cache root (whatever is in it)."""
    inc = trusted.root_dir(cache, INCOMING)
    if inc is None:
        return
    try:
        for name in os.listdir(inc):
            trusted.remove_in(inc, name)
    finally:
        os.close(inc)
    with contextlib.suppress(OSError):
        os.rmdir(INCOMING, dir_fd=cache)


def _unpack_into(
    cache: int, inc: int, fingerprint: str, tar_path: Path, manifest: dict[str, Any], user: str
) -> None:
    trusted.remove_in(inc, fingerprint)
    incoming = Path(trusted.at(inc)) / fingerprint
    incoming.mkdir()
    dirs, files = manifest["dirs"], manifest["files"]
    seen = set()
    with tarfile.open(tar_path, "r:") as tar:
        for member in tar:
            name = member.name
            if not member.isfile() or name not in files or name in seen:
                raise NoCopy(f"the copy holds {name!r}, which its manifest does not list")
            seen.add(name)
            target = incoming / name
            target.parent.mkdir(parents=True, exist_ok=True)
            src = tar.extractfile(member)
            assert src is not None
            digest, length = hashlib.sha256(), 0
            with open(target, "wb") as fh:
                for block in iter(lambda: src.read(1 << 20), b""):  # noqa: B023
                    digest.update(block)
                    length += len(block)
                    fh.write(block)
            if [length, digest.hexdigest()] != files[name]:
                raise NoCopy(
                    f"{name}: {length} bytes, sha256 {digest.hexdigest()}; the source had "
                    f"{files[name][0]} bytes, sha256 {files[name][1]}"
                )
    if seen != set(files):
        raise NoCopy(f"the copy lacks {', '.join(sorted(set(files) - seen))}")
    uid, gid = _ids(user)
    for d in dirs:
        place(cache, inc, fingerprint, d, uid, gid)


def _ids(user: str) -> tuple[int, int]:
    import pwd

    entry = pwd.getpwnam(user)
    return entry.pw_uid, entry.pw_gid


def place(cache: int, inc: int, fingerprint: str, rel: str, uid: int, gid: int) -> None:
    """Move ``<incoming>/<fingerprint>/rel`` to ``rel`` in the cache root (replacing it), owned
    by the serve user: every step through directory descriptors, renames that follow nothing."""
    model, sig = rel.rsplit("/", 1)
    dest = _cache_dir(cache, model, owner=(uid, gid))
    src = os.open(f"{fingerprint}/{model}", trusted.DIR_FLAGS, dir_fd=inc)  # root's own tree
    try:
        os.chown(sig, uid, gid, dir_fd=src, follow_symlinks=False)
        for _, dirnames, filenames, dirfd in os.fwalk(sig, dir_fd=src, follow_symlinks=False):
            for name in dirnames + filenames:
                os.chown(name, uid, gid, dir_fd=dirfd, follow_symlinks=False)
        old = f"old-{os.getpid()}"
        with contextlib.suppress(FileNotFoundError):
            os.rename(sig, old, src_dir_fd=dest, dst_dir_fd=inc)  # a link is moved, not followed
        os.rename(sig, sig, src_dir_fd=src, dst_dir_fd=dest)
        trusted.remove_in(inc, old)
    finally:
        os.close(src)
        os.close(dest)


def build_unit(state: dict[str, Any], npu_name: str, build_root: Path, hub: Path) -> str:
    """The first instance's unit as a compile-only build: the variables the state's
    ``compile_only`` names (the controller's platform's, ``{sku}`` as ``npu_name``; RBLN:
    ``VLLM_RBLN_COMPILE_ONLY=1``, no NPU needed), as :data:`BUILD_USER`, into ``build_root``, reading the models
    from root's checked copy ``hub`` (:func:`stage_hub`), never the serve user's hub, in a
    network namespace of its own (nothing can reach it: it takes no request), never restarted."""
    lines = state["instances"][0]["text"].splitlines()
    out = []
    for line in lines:
        key = line.split("=", 1)[0]
        if key in ("User", "Group"):
            line = f"{key}={BUILD_USER}"
        elif line.startswith(('Environment="VLLM_CACHE_ROOT=', 'Environment="HOME=')):
            name = line.split('"', 1)[1].split("=", 1)[0]  # the serve user's trees: not its own
            line = f'Environment="{name}={build_root}"'
        elif line.startswith('Environment="HF_HOME='):  # the serve user's hub: root's copy
            line = f'Environment="HF_HOME={hub}"'
        elif key == "Restart":
            line = "Restart=no"
        elif key == "EnvironmentFile":  # the servers' API key: a build takes no request
            continue
        elif key == "ExecStart":
            compile_only = [(str(k), str(v).replace("{sku}", npu_name))
                            for k, v in state["compile_only"]]  # fmt: skip
            out += [f'Environment="{k}={v}"' for k, v in compile_only] + ["PrivateNetwork=yes"]
        out.append(line)
    return "\n".join(out) + "\n"


def fresh_dir(path: Path, mode: int, owner: tuple[int, int] | None = None) -> int:
    """A descriptor of ``path`` made anew in root's own tree (``mode``; ``owner``: uid, gid,
    else root's): what was there is removed through directory descriptors, no link followed."""
    parent = trusted.open_dir(str(path.parent))
    if parent is None:
        raise NoCopy(f"{path.parent} is not a directory")
    try:
        with contextlib.suppress(FileNotFoundError):
            trusted.remove_in(parent, path.name)
        os.mkdir(path.name, mode, dir_fd=parent)
        fd = os.open(path.name, trusted.DIR_FLAGS, dir_fd=parent)
    finally:
        os.close(parent)
    os.fchmod(fd, mode)
    if owner is not None:
        os.fchown(fd, *owner)
    return fd


def fresh_build_root(build_root: Path) -> None:
    """An empty ``build_root`` owned by :data:`BUILD_USER` (0700), in root's own tree: what an
    earlier build left is removed (through directory descriptors, no link followed)."""
    import pwd

    pw = pwd.getpwnam(BUILD_USER)
    os.close(fresh_dir(build_root, 0o700, (pw.pw_uid, pw.pw_gid)))


def hf_home_of(unit: str) -> str | None:
    """The ``HF_HOME`` an instance's unit text gives its server (None: it names none)."""
    for line in unit.splitlines():
        if line.startswith('Environment="HF_HOME=') and line.endswith('"'):
            return line[len('Environment="HF_HOME=') : -1]
    return None


def stage_hub(state: dict[str, Any], hub_root: Path) -> None:
    """Root's copy of every model the first instance serves, for the build to read (#46 item 2):
    ``hub_root`` made anew (root's, 0755; what an earlier build left removed), and each model of
    ``state["models"]`` copied from the serve user's hub into ``hub_root/hub``, every file held
    to root's record of its fetch (content_check.stage_model). Raises NoCopy (one line) when a
    model cannot be staged: the build compiles nothing the serve user could have written."""
    hf_home = hf_home_of(state["instances"][0]["text"])
    models = state.get("models")
    if hf_home is None or not isinstance(models, list):
        raise NoCopy("the desired state names no HF_HOME or no models to compile")
    top = fresh_dir(hub_root, 0o755)
    try:
        os.mkdir("hub", 0o755, dir_fd=top)
        hub = os.open("hub", trusted.DIR_FLAGS, dir_fd=top)
        try:
            for model in models:
                content_check.stage_model(hf_home, str(model), hub)
        except content_check.NotStaged as e:
            raise NoCopy(f"cannot give the build a checked copy of {e}") from None
        finally:
            os.close(hub)
    finally:
        os.close(top)


def drop_hub(hub_root: Path) -> None:
    """Remove root's copy of the models (a build's input only: the disk is given back)."""
    parent = trusted.open_dir(str(hub_root.parent))
    if parent is not None:
        try:
            with contextlib.suppress(FileNotFoundError):
                trusted.remove_in(parent, hub_root.name)
        finally:
            os.close(parent)


def saved_bundles(unit: str) -> tuple[list[str], str | None]:
    """The bundles this invocation of ``unit`` logged as saved, and why it cannot save one
    (it stopped), if so."""
    props = systemd_units.show([unit], "InvocationID", "ActiveState")[0]
    out = subprocess.run(
        ["journalctl", "-o", "cat", "--no-pager", f"_SYSTEMD_INVOCATION_ID={props.get('InvocationID', '')}"],
        capture_output=True, text=True,
    ).stdout  # fmt: skip
    saved = warm_state.BUNDLE_LINE.findall(out)
    stopped = props.get("ActiveState") in ("failed", "inactive") and not saved
    return saved, f"{unit} stopped ({props.get('ActiveState')})" if stopped else None


def build(state_file: Path, npu_name: str) -> int:
    """Compile-only pre-warm of the first instance of ``state_file`` (a desired state), sealed
    in its own cache (``serve_root/build-cache``) for the fleet to copy."""
    state = json.loads(state_file.read_text())
    inst = state["instances"][0]
    build_root = Path(state["root"]) / layout.BUILD_CACHE
    built = {**state, "cache_root": str(build_root)}
    done = warm_state.warm_record(built, inst["fingerprint"])
    if done is not None and str(done.get("source", "")).startswith(layout.COMPILE_ONLY):
        systemd_units.log(
            f"{inst['fingerprint']}: built already in {build_root} (a run died after)"
        )
        return 0  # pack checks its seal
    fresh_build_root(build_root)
    hub_root = Path(state["root"]) / layout.BUILD_HUB
    try:
        stage_hub(state, hub_root)
    except NoCopy as e:
        drop_hub(hub_root)
        print(f"servefleet: compile-only pre-warm failed: {e}", file=sys.stderr)
        return 1
    path = systemd_units.UNIT_DIR / BUILD_UNIT
    systemd_units.write_atomic(path, build_unit(state, npu_name, build_root, hub_root))
    systemd_units.systemctl("daemon-reload")
    systemd_units.systemctl("restart", BUILD_UNIT)
    systemd_units.log(
        f"{BUILD_UNIT}: compiling {inst['fingerprint']} for {npu_name} (compile only)"
    )
    fault_point.barrier(f"building-{inst['fingerprint']}")  # tests' fault point: it compiles
    try:
        deadline = time.monotonic() + float(state["prewarm_timeout"])
        while True:
            saved, why = saved_bundles(BUILD_UNIT)
            if saved or why or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        if not saved:
            why = why or f"no mega-cache bundle saved within {state['prewarm_timeout']}s"
            tail = health.journal_tail(BUILD_UNIT)
            print(f"servefleet: compile-only pre-warm failed: {why}\n{tail}", file=sys.stderr)
            return 1
        systemd_units.systemctl("stop", BUILD_UNIT, check=False)  # sealed once nothing writes
        dirs = warm_state.bundle_dirs(built, BUILD_UNIT, 0)
        source = f"{layout.COMPILE_ONLY} ({npu_name})"
        warm_state.mark_warm(built, inst["fingerprint"], dirs, source=source)
        systemd_units.log(f"{inst['fingerprint']}: warm in {build_root} ({', '.join(dirs)})")
        return 0
    finally:
        systemd_units.systemctl("stop", BUILD_UNIT, check=False)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        systemd_units.systemctl("daemon-reload", check=False)
        drop_hub(hub_root)


def main(argv: list[str]) -> int:
    try:
        if len(argv) == 4 and argv[0] == "pack":
            pack(Path(argv[1]), argv[2], Path(argv[3]))
            return 0
        if len(argv) == 5 and argv[0] == "unpack":
            try:
                unpack(Path(argv[1]), argv[2], Path(argv[3]), argv[4])
            finally:
                for leftover in (Path(argv[3]), Path(f"{argv[3]}.json")):
                    with contextlib.suppress(FileNotFoundError):
                        leftover.unlink()
            return 0
        if len(argv) == 3 and argv[0] == "build":
            # one at a time with the host's other builds and converges: a build whose
            # controller was killed may still be at work here (its unit, build-hub, build-cache)
            with state_files.state_lock(Path(argv[1]).parent):
                return build(Path(argv[1]), argv[2])
    except NoCopy as e:
        if len(argv) == 5:
            cache = trusted.open_dir(argv[1])
            if cache is not None:
                try:
                    clear_incoming(cache)
                finally:
                    os.close(cache)
        print(f"servefleet: {e}", file=sys.stderr)
        return NO_COPY
    except systemd_units.Failed as e:
        print(f"servefleet: {e}", file=sys.stderr)
        return 1
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
