#!/usr/bin/env python3
"""servefleet release installer. Runs ON THE HOST, as root, with the system python3 (stdlib only).

usage: install_release.py PLAN.json

1. a fresh venv at plan["path"] (an incomplete one left by a failed run is removed first);
2. with uv (plan["installer"] "uv", the binary plan["uv"]; when it is not there yet, taken
   from the uv wheel plan["uv_wheel"] names, by its sha256: from the public index or from the
   host's wheelhouse copy, so the controller sends no uv; without one, the deploy shipped it):
   ``uv pip compile`` resolves everything once, owners' indexes first (uv takes each package
   from the first index that has it, so a same-named package on the public index never wins),
   with a sha256 of every file and the index each came from; an owned package from any other
   index than its owner's is refused; ``uv pip install --require-hashes`` installs exactly that
   (``locked.txt`` in the release). With pip: each owned package downloaded from its own index
   only (``pip download --isolated --index-url OWNER --no-deps``), then one ``pip install`` from
   the public index with them as direct file references, every public package constrained.
   Credentials come from the 0600 netrc via $NETRC, never argv. A locked release installs
   from its pylock; from a wheelhouse copy (plan["offline"]) with no index at all;
3. checks: every installed pin has its pinned version, every owned package came from its owner,
   every required module imports; run by the release's python as ``nobody``, never root
   (``unprivileged.py``: it imports the release's code while root's secrets are on the host);
4. only then the completion marker. A release counts as installed only with that marker.

Nothing is ever built here (``--no-build``, pip ``--only-binary :all:``): a package the indexes
have only as an sdist comes as the wheel the controller built from it (plan["built"]). With a
lock (plan["pylock"]), ``uv pip install`` installs exactly the locked files, every sha256
checked; a file that differs fails in one line naming the package and both hashes.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
import urllib.request
import zipfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import layout  # noqa: E402  (next to this file on the host)
import release_check  # noqa: E402
import retry  # noqa: E402
import unprivileged  # noqa: E402

UV_WHEEL_MAX = 256 << 20  # bytes of a uv wheel read at most (0.13's is about 20 MB)

CHECK = r"""
import importlib, importlib.metadata as md, json, sys
plan = json.load(sys.stdin)
wheelhouse = sys.argv[1]
errors = []
for name, version in plan["expect"].items():
    try:
        have = md.version(name)
    except md.PackageNotFoundError:
        if name in plan["must_have"]:
            errors.append(f"{name} is not installed")
        continue
    if have != version:
        errors.append(f"{name} {have} is installed, {version} is pinned")
unlocked_pip = plan.get("installer") != "uv" and not plan.get("locked")
for d in plan["downloads"] if unlocked_pip else []:  # else checked by the lock's hashes
    try:
        url = json.loads(md.distribution(d["name"]).read_text("direct_url.json") or "{}").get("url", "")
    except md.PackageNotFoundError:
        continue
    if not url.startswith("file://" + wheelhouse + "/"):
        errors.append(f"{d['name']} did not come from its own index ({d['index']}): {url or 'no direct_url'}")
for module in plan["imports"]:
    try:
        importlib.import_module(module)
    except Exception as e:
        errors.append(f"import {module} failed: {type(e).__name__}: {e}")
for e in errors:
    print("servefleet: release check: " + e, file=sys.stderr)
sys.exit(1 if errors else 0)
"""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def run(cmd: list[str], env: dict[str, str] | None = None) -> None:
    print("+", " ".join(cmd), flush=True)
    done = subprocess.run(cmd, env=env)
    if done.returncode != 0:
        sys.exit(f"servefleet: failed ({done.returncode}): {' '.join(cmd[:3])} ...")


def trusted(plan: dict) -> list[str]:
    return [a for h in plan["trusted_hosts"] for a in ("--trusted-host", h)]


def downloaded(wheelhouse: Path, name: str, version: str) -> Path:
    for f in sorted(wheelhouse.iterdir()):
        stem = f.name[: -len(".tar.gz")] if f.name.endswith(".tar.gz") else f.stem
        parts = stem.split("-")
        if len(parts) >= 2 and canonical(parts[0]) == name and parts[1] == version:
            return f
    sys.exit(f"servefleet: {name}=={version} was not downloaded into {wheelhouse}")


def main(plan_file: str, by: str | None = None) -> None:
    plan = json.loads(Path(plan_file).read_text())
    release = Path(plan["path"])
    if (release / plan["marker"]).exists():
        problems = release_check.drift(str(release), recorded(release / plan["marker"]))
        if not problems:
            print(f"release {plan['id']} is complete")
            return
        aside = set_aside(release)  # its servers run on from it until each restarts
        print(f"servefleet: release {plan['id']} drifted ({'; '.join(problems[:3])}): kept as "
              f"{aside} for inspection; installing it again", file=sys.stderr)  # fmt: skip
    if release.exists():
        shutil.rmtree(release)
    wheelhouse = release / "wheelhouse"
    if plan.get("installer") == "uv":
        install_with_uv(plan, release)
    else:
        install_with_pip(plan, release, wheelhouse)
    harden(release)
    if check(plan, release, wheelhouse) != 0:
        sys.exit(f"servefleet: release {plan['id']} failed its checks; it is not marked complete")
    marker = release / plan["marker"]
    tmp = marker.with_suffix(".tmp")
    done = {
        "id": plan["id"],
        "pins": plan["expect"],
        "servefleet": by,  # by: who installed it
        **release_check.manifest(str(release)),  # what the probe compares with (#36)
    }
    tmp.write_text(json.dumps(done, sort_keys=True) + "\n")
    tmp.rename(marker)
    print(f"release {plan['id']} installed and checked")


def check(plan: dict, release: Path, wheelhouse: Path) -> int:
    """Run :data:`CHECK` in the release's python as :data:`unprivileged.USER` (#46 item 4): it
    imports the release's own code (vllm, torch, rebel), so it runs where none of root's files
    can be read (the netrc, the token), in a PID namespace its processes die with, with a fresh
    empty HOME, no credential in its environment and nothing but the plan's parts it needs, on
    its stdin (``-I``: no cwd on its path); its exit code."""
    wanted = ("expect", "must_have", "installer", "locked", "downloads", "imports")
    given = json.dumps({k: plan.get(k) for k in wanted})
    who = unprivileged.ids()
    with unprivileged.workspace(who, "servefleet-check-") as home:
        cmd = [str(release / "bin" / "python"), "-I", "-c", CHECK, str(wheelhouse)]
        try:
            done = subprocess.run(unprivileged.argv(cmd, who), input=given, text=True,
                                  env=unprivileged.environment(home), cwd=home)  # fmt: skip
        except OSError as e:
            print(f"servefleet: cannot run the release check as {unprivileged.USER} "
                  f"({e.strerror}): unshare and setpriv (util-linux) are needed", file=sys.stderr)  # fmt: skip
            return 1
    return done.returncode


def harden(release: Path) -> None:
    """No file or directory in the release that another user may write (uv leaves its venv
    ``.lock`` 0666): group and other write bits off, links left alone (nothing is followed)."""
    for top, dirs, files in os.walk(release):
        for name in (*dirs, *files):
            path = os.path.join(top, name)
            mode = os.lstat(path).st_mode
            if not stat.S_ISLNK(mode) and mode & 0o022:
                os.chmod(path, stat.S_IMODE(mode) & ~0o022)


def recorded(marker: Path) -> dict:
    """What a release's marker recorded at install (:func:`release_check.manifest`'s keys;
    none in a marker before #36)."""
    try:
        found = json.loads(marker.read_text())
    except (OSError, ValueError):
        found = None
    # an unreadable marker: every distribution installed differs from none recorded
    return found if isinstance(found, dict) else {"dists": {}}


def set_aside(release: Path) -> Path:
    """Rename a drifted release to ``<id>.tampered-<UTC time>`` beside it (never patched in
    place; ``state_files.clean_up`` removes it after ``layout.TAMPERED_KEEP`` seconds)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside = release.with_name(f"{release.name}{layout.TAMPERED}{stamp}")
    release.rename(aside)
    return aside


def uv_env(plan: dict) -> dict[str, str]:
    env = dict(os.environ, UV_PYTHON_DOWNLOADS="never", UV_NO_CONFIG="1", UV_NO_PROGRESS="1")
    if plan.get("offline"):
        env["UV_OFFLINE"] = "1"
    if plan["netrc"]:
        env["NETRC"] = plan["netrc"]
    return env


def owners(plan: dict) -> dict[str, str]:
    """Owned package -> its index URL (normalised without a trailing slash)."""
    return {canonical(d["name"]): d["index"].rstrip("/") for d in plan["downloads"]}


def locked_sources(text: str) -> dict[str, str]:
    """``uv pip compile --emit-index-annotation`` output: package -> the index it came from."""
    out, current = {}, None
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==", line)
        if m:
            current = canonical(m.group(1))
        elif current and line.strip().startswith("# from "):
            out[current] = line.strip()[len("# from ") :].rstrip("/")
    return out


def hash_mismatch(output: str, served: str = "the index served") -> str | None:
    """uv's hash-mismatch report as one line: the package, the locked and the served sha256."""
    m = re.search(r"Hash mismatch for `([^`]+)`\s*Expected:\s*(\S+)\s*Computed:\s*(\S+)", output)
    if not m:
        return None
    return f"{m.group(1)}: the lock has {m.group(2)}, {served} {m.group(3)}"


def with_built(pylock: str, built: list) -> str:
    """The lock with each built package's sdist replaced by the wheel the controller built from
    it (checked by its sha256), so that nothing is built here."""
    for b in built:
        block = re.search(r'(?ms)^\[\[packages\]\]\nname = "' + re.escape(b["name"])
                          + r'"\n.*?(?=^\[\[packages\]\]|\Z)', pylock)  # fmt: skip
        if not block or f'sha256 = "{b["sdist_sha256"]}"' not in block.group(0):
            sys.exit(f"servefleet: {b['name']}: the lock has no sdist {b['sdist_sha256']}")
        wheel = f'wheels = [{{ path = "{b["path"]}", hashes = {{ sha256 = "{b["sha256"]}" }} }}]'
        sdist = re.search(r"(?m)^sdist = .*$", block.group(0))
        text = block.group(0).replace(sdist.group(0), wheel, 1) if sdist else block.group(0)
        pylock = pylock[: block.start()] + text + pylock[block.end() :]
    return pylock


def install_locked(uv: str, python: str, plan: dict, release: Path, env: dict, args: list) -> None:
    """``uv pip install`` from the release's PEP 751 lock: every file's sha256 is checked; a
    mismatch fails in one line naming the package and both hashes. Nothing is built here: a
    package the lock has only as an sdist comes as the wheel the controller built from it.

    With ``plan["offline"]`` (``{"find_links", "requirements"}``: a wheelhouse copy on the host)
    no index is asked at all: the hashed requirements derived from the lock are installed from
    that directory alone (``--offline --no-index --find-links``, hashes required and computed
    from the files, never uv's cache; no deps: the lock is the whole set)."""
    offline = plan.get("offline")
    built = plan.get("built") or []
    if offline:
        locked = release / "requirements.locked.txt"
        requirements = offline["requirements"]
        for b in built:  # the built wheel's hash in place of its sdist's
            requirements = requirements.replace(
                f"sha256:{b['sdist_sha256']}", f"sha256:{b['sha256']}"
            )
        locked.write_text(requirements)
        links = [offline["find_links"], *sorted({str(Path(b["path"]).parent) for b in built})]
        # --no-cache: uv would take a find-links file it cached before (same name and mtime)
        # without hashing the file on disk again
        args = ["--offline", "--no-index", "--no-cache", *[a for d in links for a in ("--find-links", d)],
                "--require-hashes", "--no-deps"]  # fmt: skip
    else:
        locked = release / "pylock.toml"
        locked.write_text(with_built(plan["pylock"], built))
        args = ["--preview-features", "pylock", *args]
    cmd = [uv, "pip", "install", "--quiet", "--python", python, "--no-build", *args, "-r",
           str(locked)]  # fmt: skip
    print("+", " ".join(cmd[:4]), "... -r", locked, flush=True)
    served = "the copy has" if offline else "the index served"
    done = run_install(cmd, env, plan, lambda out: hash_mismatch(out, served))
    if done.returncode != 0:
        unbuilt = re.search(r"Wheels are required for `([^`]+)`", done.stderr)
        if unbuilt:
            sys.exit(f"servefleet: {unbuilt.group(1)} has no wheel here, and hosts build nothing "
                     f"(the controller builds sdists); release {plan['id']} not installed")  # fmt: skip
        sys.exit(f"servefleet: failed ({done.returncode}): uv pip install -r {locked.name}")


def _uv_wheel_bytes(source: dict) -> bytes:
    """The uv wheel's bytes: the wheelhouse copy's, or downloaded from the public index (again
    after a transient failure; a refusal ends the install in one line)."""
    if source.get("path"):
        with open(source["path"], "rb") as f:
            return f.read(UV_WHEEL_MAX + 1)

    def once() -> bytes:
        request = urllib.request.Request(source["url"], headers={"User-Agent": "servefleet"})
        with urllib.request.urlopen(request, timeout=60) as response:
            data = response.read(UV_WHEEL_MAX + 1)
            if len(data) <= UV_WHEEL_MAX:
                retry.check_whole(response)
            return data

    try:
        return retry.attempts(once)
    except retry.GaveUp as e:
        print(f"servefleet: {source['url']}: not reachable ({e})", file=sys.stderr)
        sys.exit(retry.UNREACHABLE_EXIT)
    except OSError as e:
        sys.exit(f"servefleet: {source['url']}: {retry.reason(e)}; release not installed")


def ensure_uv(plan: dict) -> None:
    """plan["uv"] in place: when missing, its one file ``uv-<version>.data/scripts/uv`` from the
    uv wheel plan["uv_wheel"] names, after the wheel's sha256 matched; written beside it (root's
    lib/, no one else's) and renamed into place, mode 0755. Without a uv_wheel the deploy ships
    uv itself, so a missing one is an error."""
    dest, source = plan["uv"], plan.get("uv_wheel")
    if os.path.isfile(dest) and os.access(dest, os.X_OK):
        return
    if not source:
        sys.exit(f"servefleet: uv is not at {dest} and no uv wheel is named; release not installed")
    data = _uv_wheel_bytes(source)
    got = hashlib.sha256(data).hexdigest()
    where = source.get("path") or source["url"]
    if got != source["sha256"]:
        sys.exit(f"servefleet: {where}: sha256:{got}, the plan names sha256:{source['sha256']}; "
                 "uv not installed")  # fmt: skip
    member = f"uv-{source['version']}.data/scripts/uv"
    try:
        binary = zipfile.ZipFile(io.BytesIO(data)).read(member)
    except (zipfile.BadZipFile, KeyError) as e:
        sys.exit(f"servefleet: {where}: no {member} in it ({e}); uv not installed")
    tmp = f"{dest}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o700)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(binary)
            f.flush()
            os.fchmod(f.fileno(), 0o755)
            os.fsync(f.fileno())
        os.rename(tmp, dest)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    print(f"uv {source['version']} taken from {os.path.basename(where)} (sha256 checked)")


def install_with_uv(plan: dict, release: Path) -> None:
    ensure_uv(plan)
    uv, env = plan["uv"], uv_env(plan)
    run([uv, "venv", "--quiet", "--python", plan["python"], str(release)], env=env)
    python = str(release / "bin" / "python")
    urls = list(dict.fromkeys(owners(plan).values()))
    indexes = [a for u in urls for a in ("--index", u)]
    if plan["public_index"]:
        indexes += ["--default-index", plan["public_index"]]
    insecure = [a for h in plan["trusted_hosts"] for a in ("--allow-insecure-host", h)]
    built = plan.get("built") or []
    wheels = [a for d in sorted({str(Path(b["path"]).parent) for b in built})
              for a in ("--find-links", d)]  # fmt: skip
    if plan.get("pylock"):
        public = ["--default-index", plan["public_index"]] if plan["public_index"] else []
        return install_locked(uv, python, plan, release, env, [*public, *insecure])
    wanted = release / "requirements.in"
    wanted.write_text("".join(
        f"{r}\n" for r in [*(f"{d['name']}=={d['version']}" for d in plan["downloads"]),
                           *plan["requirements"]]
    ))  # fmt: skip
    constraints = release / "constraints.txt"
    constraints.write_text("".join(c + "\n" for c in plan["constraints"]))
    locked = release / layout.LOCKED
    run([uv, "pip", "compile", "--quiet", "--python", python, *indexes, *insecure, *wheels,
         "--no-build", "--generate-hashes", "--emit-index-annotation", "--no-header", "-c", str(constraints),
         "-o", str(locked), str(wanted)], env=env)  # fmt: skip
    came = locked_sources(locked.read_text())
    for name, index in owners(plan).items():
        if came.get(name) != index:
            sys.exit(f"servefleet: {name} resolved from {came.get(name) or 'nowhere'}, "
                     f"not from its owner {index}; nothing installed")  # fmt: skip
    run([uv, "pip", "install", "--quiet", "--python", python, *indexes, *insecure, *wheels,
         "--no-build", "--require-hashes", "--no-deps", "-r", str(locked)], env=env)  # fmt: skip


def run_install(
    cmd: list, env: dict, plan: dict, mismatch: Callable[[str], str | None]
) -> subprocess.CompletedProcess:
    """Run one install step and echo its output; a file whose hash differs from the lock ends
    the install in one line naming the package and both hashes."""
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    sys.stdout.write(done.stdout)
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        found = mismatch(done.stdout + done.stderr)
        if found:
            sys.exit(f"servefleet: hash mismatch: {found}; release {plan['id']} not installed")
    return done


def pip_mismatch(output: str) -> str | None:
    """pip's hash-mismatch report as one line (as :func:`hash_mismatch` for uv)."""
    m = re.search(r"(\S+==\S+) from [^\n]*\n\s*Expected sha256 (\w+)\s*Got\s+(\w+)", output)
    if not m:
        return None
    return f"{m.group(1)}: the lock has sha256:{m.group(2)}, the index served sha256:{m.group(3)}"


def install_locked_with_pip(plan: dict, release: Path, wheelhouse: Path, pip: list) -> None:
    """pip with a lock: each locked package downloaded from the index the lock names, its hash
    required (``pip download --require-hashes``, one call per index), then installed from those
    files alone (``--no-index``). A built wheel stands in for its sdist; nothing is built."""
    built = {b["name"]: b for b in plan.get("built") or []}
    env = dict(os.environ, NETRC=plan["netrc"]) if plan["netrc"] else dict(os.environ)
    wanted: list[str] = []
    by_index: dict[str, list[str]] = {}
    for p in plan["locked"]:
        hashes = [built[p["name"]]["sha256"]] if p["name"] in built else p["sha256"]
        line = f"{p['name']}=={p['version']}" + "".join(f" --hash=sha256:{h}" for h in hashes)
        wanted.append(line)
        if p["name"] not in built:
            by_index.setdefault(p["index"], []).append(line)
    for n, (index, lines) in enumerate(sorted(by_index.items())):
        reqs = release / f"download-{n}.txt"
        reqs.write_text("".join(line + "\n" for line in lines))
        cmd = [*pip, "download", "--isolated", "--no-deps", "--require-hashes", "--only-binary",
               ":all:", "--dest", str(wheelhouse), "--index-url", index, *trusted(plan), "-r",
               str(reqs)]  # fmt: skip
        print("+", " ".join(cmd[:4]), "... --index-url", index, flush=True)
        done = run_install(cmd, env, plan, pip_mismatch)
        if done.returncode != 0:
            sys.exit(f"servefleet: failed ({done.returncode}): pip download from {index}")
    hashed = release / "requirements.locked.txt"
    hashed.write_text("".join(line + "\n" for line in wanted))
    links = [str(wheelhouse), *sorted({str(Path(b["path"]).parent) for b in built.values()})]
    run([*pip, "install", "--isolated", "--no-index", *[a for d in links for a in ("--find-links", d)],
         "--require-hashes", "--no-deps", "--only-binary", ":all:", "-r", str(hashed)])  # fmt: skip


def install_with_pip(plan: dict, release: Path, wheelhouse: Path) -> None:
    run([plan["python"], "-m", "venv", str(release)])
    pip = [str(release / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    wheelhouse.mkdir()
    if plan.get("locked"):
        return install_locked_with_pip(plan, release, wheelhouse, pip)
    env = dict(os.environ)
    refs = []
    for d in plan["downloads"]:
        denv = dict(env, NETRC=plan["netrc"]) if d["auth"] and plan["netrc"] else env
        run(
            [*pip, "download", "--isolated", "--no-deps", "--dest", str(wheelhouse)]
            + ["--index-url", d["index"], *trusted(plan), f"{d['name']}=={d['version']}"],
            env=denv,
        )
        refs.append(f"{d['name']} @ {downloaded(wheelhouse, d['name'], d['version']).as_uri()}")
    constraints = release / "constraints.txt"
    constraints.write_text("".join(c + "\n" for c in plan["constraints"]))
    index = ["--isolated", "--index-url", plan["public_index"]] if plan["public_index"] else []
    built = sorted({str(Path(b["path"]).parent) for b in plan.get("built") or []})
    run(
        [
            *pip,
            "install",
            *index,
            *trusted(plan),
            *[a for d in built for a in ("--find-links", d)],
            "--only-binary",
            ":all:",
            "-c",
            str(constraints),
            *refs,
            *plan["requirements"],
        ]
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
