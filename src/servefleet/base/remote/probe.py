#!/usr/bin/env python3
"""servefleet probe: everything the controller's planner needs to know of a host, read in one
round trip. Runs ON THE HOST, as root, with python3 (stdlib only). The controller sends it
inline with ``layout.py`` (``python3 -c``, see :func:`servefleet.base.remote.inline`): a fresh host
holds nothing yet.

usage: probe.py ARGS_JSON      # ARGS_JSON: servefleet.hostplan.probe_input.probe_args()

With ``"keyed": true`` in ARGS_JSON, the first line of stdin is a key (hex) for the files in the
secrets directory: their digest is HMAC-SHA256 under that key, never a plain sha256, which in
pyinfra's fact output would let anyone with the log test guesses of a password offline.

Prints one JSON object: the kernel release, the Python of sdk_python, glibc, the accelerators
(``rbln-smi -j``, or ``lspci -n`` lines before a driver; ``nvidia-smi``/``amd-smi`` on GPU
hosts), the complete releases, ``current`` and what it holds, the last good state, our units
(active, enabled, the unit sha each main process runs, the file's sha256; for ``plan``, whose
ARGS_JSON has ``"files": true``, the file's text too), the warm compile
fingerprints, the complete models, the serve user and group, and a stat of each watched path.
With ``"verify": true`` (``serve_verify``) it also reads every file of each release, each
complete model and each warm cache, and says how each differs from what was installed, fetched
or sealed (``release_drift``, ``model_drift``, ``cache_drift``) and what it read (``verified``).
"""

from __future__ import annotations

import glob
import grp
import hashlib
import hmac
import json
import os
import pwd
import subprocess
import sys
import urllib.request
from stat import S_ISDIR, S_ISREG
from typing import Any

import content_check
import layout
import release_check
import trusted


def run(cmd: list[str]) -> str | None:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        return p.stdout if p.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def read(path: str, mode: str = "r") -> Any:
    try:
        with open(path, mode) as f:
            return f.read()
    except OSError:
        return None


def python_version(python: str) -> str | None:
    """major.minor of sdk_python (the probe runs with python3 itself)."""
    if python == "python3":
        return "{}.{}".format(*sys.version_info[:2])
    found = run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"])
    return (found or "").strip() or None


def accelerators(out: dict[str, Any], commands: list[list[Any]]) -> None:
    """Run the kind's device commands (``[name, argv, form, unless]``, from the controller's
    kind): each output under its name, JSON (None when it fails) or lines ([] when it fails);
    a command is skipped when an earlier one named ``unless`` found something."""
    for name, argv, form, unless in commands:
        found = None if unless and out.get(unless) else run(list(argv))
        if form == "json":
            try:
                out[name] = json.loads(found) if found else None
            except ValueError:
                out[name] = None
        else:
            out[name] = found.splitlines() if found else []


MISSING = object()  # a release without a marker
_MARKERS: dict[str, Any] = {}  # release path -> its parsed marker (read once a probe)


def marker_of(release: str) -> Any:
    """A release's parsed marker (a real vLLM's is ~0.5 MB: parsed once), ``None`` when it
    does not parse, :data:`MISSING` when there is none."""
    if release not in _MARKERS:
        text = read(os.path.join(release, layout.RELEASE_MARKER))
        try:
            _MARKERS[release] = MISSING if text is None else json.loads(text)
        except ValueError:
            _MARKERS[release] = None
    return _MARKERS[release]


def releases(out: dict[str, Any], root: str, files: bool) -> None:
    rel = os.path.join(root, layout.RELEASES)
    out["releases"] = sorted(
        d for d in (os.listdir(rel) if os.path.isdir(rel) else [])
        if os.path.exists(os.path.join(rel, d, layout.RELEASE_MARKER))
    )  # fmt: skip
    cur = os.path.join(root, layout.CURRENT)
    out["current"] = os.path.basename(os.readlink(cur)) if os.path.islink(cur) else None
    try:
        out["current_pins"] = marker_of(os.path.join(rel, out["current"] or "-"))["pins"]
    except (TypeError, KeyError):
        out["current_pins"] = None
    out["current_files"] = current_files(
        read(os.path.join(rel, out["current"] or "-", layout.LOCKED)) if files else None
    )


def release_drift(
    out_verified: dict[str, Any], root: str, ids: list[str], current: str | None, verify: bool
) -> dict[str, list[str]]:
    """Release id -> how it differs from what its marker recorded at install (the wanted
    releases and the serving one; :func:`release_check.drift`, with ``verify`` every file's
    sha256: :func:`release_check.verify`, whose files and bytes go in ``out_verified``); none
    that do not differ."""
    out = {}
    for rid in sorted({*ids, *([current] if current else [])}):
        path = os.path.join(root, layout.RELEASES, rid)
        marker = marker_of(path)
        if marker is MISSING:
            continue  # not installed (or not complete): nothing to compare
        # an unreadable marker: every distribution differs from none recorded
        recorded = marker if isinstance(marker, dict) else {"dists": {}}
        if verify:
            full = release_check.verify(path, recorded)
            out_verified[rid] = {"files": full["files"], "bytes": full["bytes"]}
            problems = full["differ"]
        else:
            problems = release_check.drift(path, recorded)
        if problems:
            out[rid] = problems
    return out


def _counts(found: dict[str, Any]) -> dict[str, Any]:
    """What a content check read and hashed (files, bytes; those it had nothing to hold to)."""
    return {k: found[k] for k in ("files", "bytes", "unchecked", "unsealed") if k in found}


def model_drift(
    out_verified: dict[str, Any], hf_home: str, models: list[str]
) -> dict[str, list[str]]:
    """``serve_verify``: model -> how the files of its snapshot differ from what was fetched
    (:func:`content_check.verify_model`: every file read through no-follow descriptors, held to
    root's record of the fetch, else to its blob's digest-name; files and bytes read in
    ``out_verified`` under ``model <id>``); none that do not differ."""
    out = {}
    for model in models:
        found = content_check.verify_model(hf_home, model)
        out_verified[f"model {model}"] = _counts(found)
        if found["differ"]:
            out[model] = found["differ"]
    return out


def cache_drift(
    out_verified: dict[str, Any], cache_root: str, fingerprints: list[str]
) -> dict[str, list[str]]:
    """``serve_verify``: fingerprint -> how its warm cache differs from the seal its marker
    recorded when the compile ended (:func:`content_check.verify_cache`; files and bytes read in
    ``out_verified`` under ``cache <fingerprint>``); none that do not differ."""
    out = {}
    for fp in fingerprints:
        record = content_check.cache_record(cache_root, fp)
        if record is None:
            continue
        found = content_check.verify_cache(cache_root, record)
        out_verified[f"cache {fp}"] = _counts(found)
        if found["differ"]:
            out[fp] = found["differ"]
    return out


def current_files(locked: str | None) -> dict[str, list[Any]]:
    """package -> [version, sha256s] the serving release was installed with (its locked.txt)."""
    found: dict[str, list[Any]] = {}
    name = None
    for line in (locked or "").splitlines():
        head = line.split(" ", 1)[0]
        if "==" in head and not line.startswith((" ", "#")):
            name, version = head.split("==", 1)
            name = name.split("[", 1)[0].lower().replace("_", "-")
            found[name] = [version, []]
        elif name and line.strip().startswith("--hash=sha256:"):
            found[name][1].append(line.strip()[len("--hash=sha256:") :].rstrip(" \\"))
    return found


def good_state(out: dict[str, Any], root: str) -> None:
    try:
        good = json.loads(read(os.path.join(root, layout.STATE, layout.GOOD)) or "null")
        out["good"], out["good_shas"] = good["release"], [i["sha"] for i in good["instances"]]
        by = good.get("servefleet")  # the servefleet that converged it (older states: none)
        out["good_servefleet"] = by if isinstance(by, str) else None
    except (ValueError, TypeError, KeyError, AttributeError):
        out["good"], out["good_shas"], out["good_servefleet"] = None, [], None


def units(names: list[str] | None = None, texts: bool = False) -> dict[str, dict[str, Any]]:
    """Our units (``names``, else every instance unit on disk): active, the sha its main process
    runs (from its environment), enabled, whether systemd needs a reload, the file's sha256, and
    with ``texts`` the file's text (``plan --diff``: units hold no secret, they are 0644)."""
    if names is None:
        names = sorted(
            os.path.basename(u) for u in glob.glob(os.path.join(layout.UNIT_DIR, layout.UNIT_GLOB))
        )
    props = ["Id", "ActiveState", "MainPID", "NeedDaemonReload", "UnitFileState"]
    args = [x for p in props for x in ("-p", p)]
    shown = run(["systemctl", "show", *args, *names]) if names else ""
    by_id = {}
    for block in (shown or "").split("\n\n"):
        kv = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        by_id[kv.get("Id")] = kv
    var = f"{layout.UNIT_SHA_VAR}=".encode()
    gvar = f"{layout.GROUP_SHA_VAR}=".encode()  # a serving group's rank: the group's hash
    key_var = f"{layout.API_KEY_VAR}=".encode()
    file_key = release_check.env_file_value([layout.API_KEY_FILE], layout.API_KEY_VAR)
    found = {}
    for u in names:
        kv = by_id.get(u, {})
        pid = int(kv.get("MainPID") or 0)
        env = (read(f"/proc/{pid}/environ", "rb") or b"") if pid else b""
        running = [e[len(var) :].decode() for e in env.split(b"\0") if e.startswith(var)]
        group = [e[len(gvar) :].decode() for e in env.split(b"\0") if e.startswith(gvar)]
        key = [e[len(key_var) :] for e in env.split(b"\0") if e.startswith(key_var)]
        runs_key = key[-1].decode("utf-8", "surrogateescape") if key else None  # as Python reads it
        text = read(os.path.join(layout.UNIT_DIR, u), "rb")
        found[u] = {
            "active": kv.get("ActiveState", "unknown"),
            "running": (running or [None])[0],
            "group": (group or [None])[0],
            "enabled": kv.get("UnitFileState"),
            "reload": kv.get("NeedDaemonReload") == "yes",
            "file": hashlib.sha256(text).hexdigest() if text is not None else None,
            # it runs with the key the key file holds (or neither has one): a yes or no, no
            # digest of the key leaves the host (#31 finding 4)
            "key_current": runs_key == _wanted_key(text, file_key) if pid else None,
            # it started before its release was (re)installed: it runs files gone since
            "older_than_release": release_check.older_than_release(
                pid, text.decode("utf-8", "replace") if text else None, layout.RELEASE_MARKER
            ),
            "started": release_check.process_started(pid) if pid else None,
        }
        if texts:
            found[u]["text"] = text.decode("utf-8", "replace") if text is not None else None
    return found


def _wanted_key(text: bytes | None, file_key: str | None) -> str | None:
    """The key a unit's server should run with: the key file's (as systemd reads it), when its
    unit names that file."""
    names = text is not None and f"EnvironmentFile={layout.API_KEY_FILE}".encode() in text
    return file_key if names else None


MAX_WORKERS_REPLY = 1 << 20  # bytes of the router's worker list the probe reads


def proxy() -> dict[str, Any]:
    """The router's proxy unit (as :func:`units`), whether nginx and nft (the router's guard) are
    installed, the sha256 of the configuration it runs (its copy in PROXY_RUN, root's) and whether
    the admin key it checks is the one on the host (a yes or no: no digest of a secret leaves the
    host)."""
    found = units([layout.PROXY_UNIT])[layout.PROXY_UNIT]
    found["running"] = (read(layout.PROXY_STARTED) or "").strip() or None
    loaded = read(layout.PROXY_LOADED, "rb")
    found["nginx"] = os.path.isfile(layout.NGINX)
    found["nft"] = os.path.isfile(layout.NFT)
    found["loaded"] = hashlib.sha256(loaded).hexdigest() if loaded is not None else None
    admin = read(layout.PROXY_ADMIN_LOADED, "rb")
    found["admin"] = admin is not None and admin == read(layout.ROUTER_ADMIN_MAP, "rb")
    return found


def router(url: str | None) -> dict[str, Any]:
    """The router unit (as :func:`units`) and, when it runs and ``url`` is given, the workers it
    lists and whether it finds each healthy (its ``/workers``; None when it does not answer
    with such a list)."""
    found = units([layout.ROUTER_UNIT])[layout.ROUTER_UNIT]
    found["proxy"] = proxy()
    found["workers"] = found["healthy"] = None
    if url and found["active"] == "active":
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(url + "/workers", timeout=5) as r:
                listed = json.loads(r.read(MAX_WORKERS_REPLY + 1))["workers"]
            urls = [w["url"] for w in listed]
            if all(isinstance(u, str) for u in urls):
                found["workers"] = urls
                found["healthy"] = {w["url"]: w.get("is_healthy") is True for w in listed}
                found["types"] = {w["url"]: str(w.get("worker_type")) for w in listed}
        except (OSError, ValueError, KeyError, TypeError):
            pass
    return found


def present(hf_home: str, model: str, revision: str | None) -> bool:
    """The model is complete (its marker names a snapshot there) at the pinned revision. The
    serve user owns the hub: the marker is read through no-follow descriptors, a regular file
    only, never waited on (:func:`content_check.complete_revision`; a fifo planted there hung
    the probe, #46 item 5)."""
    have = content_check.complete_revision(hf_home, model)
    return have is not None and revision in (None, have)


def account(out: dict[str, Any], user: str) -> None:
    try:
        pw = pwd.getpwnam(user)
        out["user"] = {"uid": pw.pw_uid, "shell": pw.pw_shell, "home": pw.pw_dir,
                       "group": grp.getgrgid(pw.pw_gid).gr_name}  # fmt: skip
    except KeyError:
        out["user"] = None
    try:
        out["group"] = grp.getgrnam(user).gr_gid is not None
    except KeyError:
        out["group"] = False


def _name(get: Any, i: int) -> str:
    try:
        return get(i)[0]
    except KeyError:
        return str(i)


def stat(path: str, key: bytes | None = None) -> dict[str, str] | None:
    """type, mode, owner and group of ``path`` (not followed), and a file's sha256 (a secret's:
    its HMAC under ``key``; none without a key)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    kind = "dir" if S_ISDIR(st.st_mode) else "file" if S_ISREG(st.st_mode) else "other"
    info = {"type": kind, "mode": "%o" % (st.st_mode & 0o7777),
            "user": _name(pwd.getpwuid, st.st_uid), "group": _name(grp.getgrgid, st.st_gid)}  # fmt: skip
    secret = os.path.dirname(path) == layout.SECRETS_DIR
    if kind == "file" and st.st_size < 1 << 24 and (key or not secret):
        data = read(path, "rb") or b""
        digest = hmac.new(key, data, "sha256") if key and secret else hashlib.sha256(data)
        info["sha256"] = digest.hexdigest()
    return info


def warm_markers(cache_root: str) -> list[str]:
    """The fingerprints warm here: the markers in root's own warm directory (``trusted``)."""
    fd = trusted.root_dir_in(cache_root, layout.WARM_DIR)
    if fd is None:
        return []
    try:
        return trusted.names(fd)
    finally:
        os.close(fd)


def preflights(path: str) -> list[str]:
    """The keys of the pre-flights that passed (root's own tree, serve_root/state)."""
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def addresses() -> dict[str, list[str]]:
    """Each interface's addresses (``ip -j addr``): a rank of a serving group names the one
    that carries its address to NCCL and Gloo."""
    found = run(["ip", "-j", "addr", "show"])
    try:
        links = json.loads(found or "[]")
    except ValueError:
        return {}
    return {
        str(link.get("ifname")): [
            f"{x.get('local')}/{x.get('prefixlen')}" for x in link.get("addr_info") or []
        ]
        for link in links if isinstance(link, dict)
    }  # fmt: skip


def after_good(started: float | None, found: dict[str, Any], good_at: float | None) -> bool:
    """Whether a serving group's rank (``Restart=no``) started more than a second after the
    good state was recorded: a run restarted it and died before its gate, so it has never passed
    one. A single-host instance is never flagged (systemd restarts it after a crash)."""
    return bool(found.get("group") and started and good_at and started > good_at + 1)


def probe(a: dict[str, Any]) -> dict[str, Any]:
    # read first: the controller writes the key as the probe starts
    key = bytes.fromhex(sys.stdin.readline().strip()) if a.get("keyed") else None
    root, hf_home, cache_root = a["root"], a["hf_home"], a["cache_root"]
    out: dict[str, Any] = {"kernel": os.uname().release}
    out["python"] = python_version(a["python"])
    try:
        out["libc"] = os.confstr("CS_GNU_LIBC_VERSION")  # "glibc 2.36"; the release's sources
    except (ValueError, OSError):
        out["libc"] = None
    accelerators(out, a["accelerators"])
    releases(out, root, bool(a.get("files")))
    out["verified"] = {}
    out["release_drift"] = release_drift(out["verified"], root, a.get("releases") or [],
                                         out["current"], bool(a.get("verify")))  # fmt: skip
    good_state(out, root)
    out["units"] = units(texts=bool(a.get("files")))  # the plan's probe: their texts too
    good_at = release_check.mtime(os.path.join(root, layout.STATE, layout.GOOD))
    for found in out["units"].values():
        found["after_good"] = after_good(found.pop("started", None), found, good_at)
    out["router"] = router((a.get("router") or {}).get("url"))
    out["nft"] = os.path.isfile(layout.NFT)  # a group's rank loads its rendezvous guard with it
    out["warm"] = warm_markers(cache_root)
    out["preflight"] = preflights(f"{root}/{layout.STATE}/{layout.PREFLIGHT}")
    out["models"] = [m for m, r in sorted(a["models"].items()) if present(hf_home, m, r)]
    verify = bool(a.get("verify"))  # every present model's and warm cache's files, read (#36)
    out["model_drift"] = model_drift(out["verified"], hf_home, out["models"]) if verify else {}
    fps = [fp for fp in out["warm"] if a.get("fingerprint") in (None, fp)]  # given: only its
    out["cache_drift"] = cache_drift(out["verified"], cache_root, fps) if verify else {}
    account(out, a["user"])
    out["paths"] = {p: stat(p, key) for p in a.get("paths", [])}
    if a.get("addresses"):
        out["addresses"] = addresses()
    return out


if __name__ == "__main__":
    print(json.dumps(probe(json.loads(sys.argv[1]))))
