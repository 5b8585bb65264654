"""``servefleet lab republish NAME==VERSION``: the lab's index serves other bytes under the same
file name and version, as a re-uploaded wheel on a real index would (issue #10: a hash-locked
release must refuse it).

Every lab serves its indexes from its own hard-link copy of the build cache (``lab up``); a
republished file is written next to its old one and renamed over it, so the cache's inode, shared
by every later lab, is never written. The rewritten wheel gains one module (its RECORD lists it
with its hash) and stays installable; an sdist gains the same module in its package.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import os
import re
import tarfile
import zipfile
from pathlib import Path
from typing import Any

from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from servefleet.fleet.lab import layout
from servefleet.fleet.lab.groupdata import INDEX_OWNS
from servefleet.fleet.lab.index import fetch, normalize
from servefleet.fleet.lab.state import LabError, write_state

INDEXES = layout.INDEXES  # the lab's indexes, in the state's names
PUBLIC = "public"
EXAMPLE = "rebel-compiler==0.12.0"
MODULE = "_servefleet_republished.py"  # the module a republished distribution gains
_NAME = re.compile(r"^([A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9._-]*[A-Za-z0-9])$")


def parse_spec(spec: str) -> tuple[str, Version]:
    """The normalized name and exact version of a ``NAME==VERSION`` argument (one-line LabError
    naming the problem and the allowed form otherwise).

    + spec: e.g. ``rebel-compiler==0.12.0`` or ``vllm==0.30.0+cpu``
    """
    form = f"allowed: NAME==VERSION with an exact version, e.g. {EXAMPLE}"
    text = spec.strip()
    if "==" not in text or re.search(r"[<>!~=]", text.replace("==", "", 1)):
        raise LabError(f"{spec!r} is not NAME==VERSION; {form}")
    name, _, version = (part.strip() for part in text.partition("=="))
    if not _NAME.match(name):
        raise LabError(f"{spec!r}: {name!r} is not a package name; {form}")
    if "*" in version:
        raise LabError(f"{spec!r}: {version!r} is a wildcard, not one version; {form}")
    try:
        parsed = Version(version)
    except InvalidVersion:
        raise LabError(f"{spec!r}: {version!r} is not a version (PEP 440); {form}") from None
    return normalize(name), parsed


def check_index(index: str | None) -> None:
    """Raise a one-line LabError unless index is None or one of the lab's indexes.

    + index: the ``--index`` option
    """
    if index is not None and index not in INDEXES:
        raise LabError(f"--index {index}: unknown index; allowed: {', '.join(INDEXES)}")


def dist_of(filename: str) -> tuple[str, Version] | None:
    """Normalized name and version of a wheel or sdist file name; None for any other file.

    + filename: e.g. ``vllm-0.30.0+cpu-py3-none-any.whl`` or ``arctic_inference-0.1.1.tar.gz``
    """
    try:
        if filename.endswith(".whl"):
            name, version, _, _ = parse_wheel_filename(filename)
        elif filename.endswith((".tar.gz", ".zip")):
            name, version = parse_sdist_filename(filename)
        else:
            return None
    except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
        return None
    return normalize(name), version


def versions_on(root: Path, name: str) -> dict[Version, list[str]]:
    """Version -> file names of project name in an index directory.

    + root: the index's flat directory of distributions
    + name: a normalized project name
    """
    found: dict[Version, list[str]] = {}
    for path in sorted(root.iterdir()):
        dist = dist_of(path.name)
        if dist is not None and dist[0] == name and path.is_file():
            found.setdefault(dist[1], []).append(path.name)
    return found


def owner_of(name: str) -> str | None:
    """The lab index that owns a project per the lab's group data (``pip_indexes``), or None.

    + name: a normalized project name
    """
    return next((index for index, names in INDEX_OWNS.items() if name in names), None)


def choose_index(
    name: str, version: Version, serving: dict[str, dict[Version, list[str]]], requested: str | None
) -> str:
    """The index whose files to republish: the requested one, else the owner's, else the public
    index, else the only index that has that version. One-line LabError otherwise.

    + name: a normalized project name
    + version: the exact version
    + serving: index -> (version -> file names) of name, for every index of the lab
    + requested: the ``--index`` option, or None
    """
    spec = f"{name}=={version}"
    having = [index for index in INDEXES if version in serving.get(index, {})]
    if not having:
        listing = "; ".join(
            f"{index}: {', '.join(str(v) for v in sorted(serving[index]))}"
            for index in INDEXES
            if serving.get(index)
        )
        if not listing:
            raise LabError(f"no lab index serves {name} (any version); nothing to republish")
        raise LabError(f"no lab index serves {spec}; the indexes have {name} {listing}")
    if requested is not None:
        check_index(requested)
        if requested not in having:
            raise LabError(
                f"--index {requested} does not serve {spec}; it is on {', '.join(having)}"
            )
        return requested
    owner = owner_of(name)
    for index in (owner, PUBLIC):
        if index in having:
            return index
    if len(having) == 1:
        return having[0]
    raise LabError(f"{spec} is on {', '.join(having)} and none owns it; choose one with --index")


# --- rewriting a distribution -------------------------------------------------------------------
def _module(mark: str) -> bytes:
    return (
        "# servefleet lab republish: the same file name and version, other bytes\n"
        f"REPUBLISHED = {mark!r}\n"
    ).encode()


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def rewrite_wheel(data: bytes, mark: str) -> bytes:
    """The wheel with one more module (``<package>/_servefleet_republished.py``, holding mark)
    and a RECORD that lists every file with its hash and size: installable, other bytes.

    + data: the wheel's bytes
    + mark: what makes this content unique (a republish counter)
    """
    with zipfile.ZipFile(io.BytesIO(data)) as old:
        infos = old.infolist()
        records = [i.filename for i in infos if i.filename.endswith(".dist-info/RECORD")]
        if len(records) != 1 or "/" in records[0][: -len("/RECORD")]:
            raise LabError("the wheel has no single top-level .dist-info/RECORD")
        record = records[0]
        dist_info = record[: -len("RECORD")]
        tops = [
            i.filename.split("/", 1)[0]
            for i in infos
            if "/" in i.filename
            and not i.filename.split("/", 1)[0].endswith((".dist-info", ".data"))
        ]
        added = f"{tops[0]}/{MODULE}" if tops else MODULE
        members = [(i, old.read(i)) for i in infos if i.filename not in (record, added)]
    stamp = members[0][0].date_time if members else (1980, 1, 1, 0, 0, 0)
    new_info = zipfile.ZipInfo(added, date_time=stamp)
    new_info.compress_type = zipfile.ZIP_DEFLATED
    new_info.external_attr = 0o644 << 16
    # the new module goes before the .dist-info files, as wheel builders order them
    at = next((n for n, (i, _) in enumerate(members) if i.filename.startswith(dist_info)), None)
    members.insert(len(members) if at is None else at, (new_info, _module(mark)))
    lines = [
        f"{i.filename},{_record_hash(body)},{len(body)}" for i, body in members if not i.is_dir()
    ]
    record_info = zipfile.ZipInfo(record, date_time=stamp)
    record_info.compress_type = zipfile.ZIP_DEFLATED
    record_info.external_attr = 0o644 << 16
    members.append((record_info, ("\n".join([*lines, f"{record},,"]) + "\n").encode()))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as new:
        for info, body in members:
            new.writestr(info, body)
    return out.getvalue()


def rewrite_sdist(data: bytes, mark: str) -> bytes:
    """The .tar.gz sdist with one more module in its package (the shallowest directory with an
    ``__init__.py``, else the top directory); its top directory and PKG-INFO unchanged.

    + data: the sdist's bytes
    + mark: what makes this content unique (a republish counter)
    """
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as old:
        members: list[tuple[tarfile.TarInfo, bytes | None]] = []
        for member in old:
            handle = old.extractfile(member) if member.isfile() else None
            members.append((member, handle.read() if handle is not None else None))
    names = [m.name for m, _ in members]
    top = names[0].split("/", 1)[0] if names else ""
    if not top or not any(n == f"{top}/PKG-INFO" for n in names):
        raise LabError("the sdist has no top directory with a PKG-INFO")
    packages = sorted(
        (n[: -len("/__init__.py")] for n in names if n.endswith("/__init__.py")),
        key=lambda n: (n.count("/"), n),
    )
    added = f"{packages[0] if packages else top}/{MODULE}"
    like = next(m for m, body in members if body is not None)
    info = tarfile.TarInfo(added)
    info.mode, info.mtime, info.uname, info.gname = like.mode, like.mtime, like.uname, like.gname
    body = _module(mark)
    info.size = len(body)
    kept = [(m, b) for m, b in members if m.name != added]
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as new:
        for member, content in [*kept, (info, body)]:
            new.addfile(member, io.BytesIO(content) if content is not None else None)
    mtime = int.from_bytes(data[4:8], "little") if data[:2] == b"\x1f\x8b" else 0
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=mtime) as gz:
        gz.write(raw.getvalue())
    return out.getvalue()


def rewrite(filename: str, data: bytes, mark: str) -> bytes:
    """Other bytes for the same wheel or .tar.gz sdist (see rewrite_wheel and rewrite_sdist).

    + filename: the distribution's file name (its kind)
    + data: its bytes
    + mark: what makes this content unique (a republish counter)
    """
    if filename.endswith(".whl"):
        return rewrite_wheel(data, mark)
    if filename.endswith(".tar.gz"):
        return rewrite_sdist(data, mark)
    raise LabError(f"{filename}: only wheels and .tar.gz sdists can be republished")


def replace_file(path: Path, data: bytes) -> None:
    """Write data to a new file beside path and rename it over path: path's old inode (which the
    build cache shares) is never written.

    + path: the file to replace
    + data: its new bytes
    """
    tmp = path.with_name(f".{path.name}.republish")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    tmp.chmod(0o644)
    os.replace(tmp, path)


# --- the command --------------------------------------------------------------------------------
def _index_roots(state: dict[str, Any]) -> dict[str, Path]:
    roots = state.get("index_roots")
    if not roots:
        raise LabError(
            "this lab serves its indexes from the shared build cache; "
            "bring it up again with `servefleet lab up` to republish"
        )
    return {index: Path(roots[index]) for index in INDEXES}


def index_headers(state: dict[str, Any], index: str) -> dict[str, str]:
    """The request headers a lab index wants: Basic auth with the lab's credentials for the
    private index, none for the others.

    + state: the lab state
    + index: ``private``, ``vllm``, ``torch`` or ``public``
    """
    if index != "private":
        return {}
    user, password = (
        Path(state["secrets"][k]).read_text().strip()
        for k in ("RBLN_INDEX_USER", "RBLN_INDEX_PASSWORD")
    )
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def _served_hash(state: dict[str, Any], index: str, name: str, filename: str) -> str | None:
    try:
        code, _, page = fetch(
            f"{state['indexes'][index]}{name}/", index_headers(state, index), timeout=10
        )
    except OSError:
        return None
    found = re.search(rf"/files/{re.escape(filename)}#sha256=([0-9a-f]{{64}})", page.decode())
    return found.group(1) if code == 200 and found else None


def republish(state: dict[str, Any], spec: str, index: str | None = None) -> list[dict[str, str]]:
    """Replace the files of NAME==VERSION on one lab index with other bytes under the same names,
    check that the index serves their new sha256, and record them in the lab state
    (``republished``: one entry a file and time). Returns those entries.

    + state: the lab state (updated and written)
    + spec: ``NAME==VERSION``
    + index: the index to republish on (``private``, ``vllm``, ``torch``, ``public``); None = the
      owner's per the lab's group data, else the public index
    """
    name, version = parse_spec(spec)
    check_index(index)
    roots = _index_roots(state)
    serving = {i: versions_on(root, name) for i, root in roots.items()}
    chosen = choose_index(name, version, serving, index)
    done = []
    history = state.setdefault("republished", [])
    for filename in serving[chosen][version]:
        path = roots[chosen] / filename
        old = path.read_bytes()
        count = 1 + sum(1 for e in history if e["index"] == chosen and e["file"] == filename)
        new = rewrite(filename, old, f"{chosen}/{filename} #{count}")
        try:
            replace_file(path, new)
        except OSError as exc:
            raise LabError(f"cannot replace {path}: {exc.strerror}") from None
        entry = {
            "index": chosen,
            "file": filename,
            "old_sha256": hashlib.sha256(old).hexdigest(),
            "new_sha256": hashlib.sha256(new).hexdigest(),
        }
        history.append(entry)
        write_state(state)
        served = _served_hash(state, chosen, name, filename)
        if served != entry["new_sha256"]:
            raise LabError(
                f"the {chosen} index serves {filename} with sha256 {served or 'none'}, "
                f"not the republished {entry['new_sha256']}"
            )
        done.append(entry)
    return done
