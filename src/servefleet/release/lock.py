"""Hash-locked stacks: what ``servefleet lock`` writes, what ``--check`` compares, what deploys read.

A *stack* is the set of packages one selection installs (the SDK pins, the extras and extra
packages it needs, the indexes that own them). ``servefleet lock`` resolves each stack of the
data once, on the controller, with uv, and writes under the lock directory (``sdk_lock``):

- ``pylock.<stack>.toml``: the stack as PEP 751 lock (every package with its exact version, the
  index it comes from, the URL and sha256 of each of its files), as ``uv export`` writes it;
- ``servefleet.lock.json``: per stack the inputs it was made from (to name what differs when
  the data moves on), the pylock file and the release id (the sha256 of the locked set, so a
  release is the same bytes on every host); the driver runfile's sha256; each model's revision
  and store archive sha256; each file ``serve_files`` ships (the path argv names -> its sha256
  and shipped name; absent in a lock of data that ships none).

Every owned package comes only from its owner: the owners' indexes are uv *explicit* indexes,
each owned package pinned to its own, and every other package comes from the public index. A
package that is not owned but that an owner's index serves too is refused: the data must say
whose it is.

This module is controller-side and imports no pyinfra.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servefleet.base.download import same_origin
from servefleet.base.files import write_atomic
from servefleet.base.version import VERSION
from servefleet.release.pylock import release_id
from servefleet.release.stack import LockError, Stack

LOCK_FILE = "servefleet.lock.json"
LOCK_VERSION = 1


# ---------------------------------------------------------------------------------------------
# The lock directory


@dataclass(frozen=True)
class Locked:
    """One stack of a lock: its inputs, pylock file and text, and release id."""

    name: str
    input: str
    inputs: dict[str, Any]
    pylock_file: str
    pylock: str
    release: str


@dataclass(frozen=True)
class Lock:
    """A lock directory, read and verified (see the module docstring)."""

    path: Path
    stacks: dict[str, Locked]
    driver: dict[str, Any]
    models: dict[str, Any]
    files: dict[str, Any] = field(default_factory=dict)  # serve_files: argv path -> sha256, name
    uv: dict[str, Any] | None = None  # the uv wheel hosts take uv from (uvbin.uv_wheel)

    def for_input(self, digest: str) -> Locked | None:
        return next((s for s in self.stacks.values() if s.input == digest), None)


def pylock_name(stack_name: str) -> str:
    return f"pylock.{stack_name}.toml"


def write_lock(
    path: Path,
    locked: Mapping[Stack, str],
    driver: Mapping[str, Any],
    models: Mapping[str, Any],
    files: Mapping[str, Any] | None = None,
    uv: Mapping[str, Any] | None = None,
) -> None:
    """Write a lock directory: one pylock per stack, then servefleet.lock.json (stale pylocks of
    stacks no longer locked are removed).

    + path: the lock directory
    + locked: stack -> its pylock text
    + driver: driver version -> {"url", "sha256"}
    + models: model id -> {"revision", "url", "sha256"}
    + files: serve_files' path in argv -> {"sha256", "name"} (none: the entry is left out, as in
      a lock written before it existed)
    + uv: the uv wheel hosts take uv from (none: the deploy sends the controller's)
    """
    path.mkdir(parents=True, exist_ok=True)
    entries = {}
    for st, text in sorted(locked.items(), key=lambda kv: kv[0].name):
        name = pylock_name(st.name)
        write_atomic(path / name, text)
        entries[st.name] = {
            "input": st.digest,
            "inputs": st.inputs,
            "pylock": name,
            "release": release_id(text),
        }
    doc = {"lock_version": LOCK_VERSION, "stacks": entries, "driver": dict(driver),
           "models": dict(models), "servefleet": VERSION}  # fmt: skip
    if files:
        doc["files"] = dict(files)
    if uv:
        doc["uv"] = dict(uv)
    write_atomic(path / LOCK_FILE, json.dumps(doc, indent=2, sort_keys=True) + "\n")
    keep = {e["pylock"] for e in entries.values()}
    for old in path.glob("pylock.*.toml"):
        if old.name not in keep:
            old.unlink()


def load_lock(path: str | Path) -> Lock:
    """Read and verify a lock directory (cached while its files are unchanged).

    Raises LockError when it is missing, malformed, or a pylock was edited after locking.

    + path: the lock directory
    """
    p = Path(path).expanduser()
    stamp = tuple(
        (f.name, f.stat().st_mtime_ns, f.stat().st_size) for f in sorted(p.glob("*")) if f.is_file()
    ) if p.is_dir() else ()  # fmt: skip
    return _load(str(p.resolve()), stamp)


@functools.lru_cache(maxsize=8)
def _load(path: str, stamp: tuple[Any, ...]) -> Lock:
    where = Path(path)
    try:
        doc = json.loads((where / LOCK_FILE).read_text())
    except FileNotFoundError:
        raise LockError(f"{where}: no {LOCK_FILE}; run `servefleet lock`") from None
    except (OSError, ValueError) as e:
        raise LockError(f"{where / LOCK_FILE}: not readable: {e}") from None
    if not isinstance(doc, dict) or doc.get("lock_version") != LOCK_VERSION:
        raise LockError(f"{where / LOCK_FILE}: not a servefleet lock (lock_version {LOCK_VERSION})")
    stacks = {}
    for name, entry in (doc.get("stacks") or {}).items():
        try:
            file = entry["pylock"]
            if Path(file).name != file or not file.startswith("pylock."):
                raise LockError(f"{where / LOCK_FILE}: stack {name}: bad pylock name {file!r}")
            text = (where / file).read_text()
            if release_id(text) != entry["release"]:
                raise LockError(
                    f"{where / file}: its packages or their URLs differ from what was locked (release "
                    f"{entry['release']}); run `servefleet lock` again"
                )
            stacks[name] = Locked(name, entry["input"], entry["inputs"], file, text,
                                  entry["release"])  # fmt: skip
        except (KeyError, TypeError, OSError) as e:
            raise LockError(f"{where / LOCK_FILE}: stack {name}: malformed ({e})") from None
    files = doc.get("files") or {}
    if not isinstance(files, dict) or not all(
        isinstance(e, dict) and isinstance(e.get("sha256"), str) for e in files.values()
    ):
        raise LockError(f"{where / LOCK_FILE}: files: malformed (path -> {{sha256, name}})")
    uv = doc.get("uv")
    if uv is not None and not (
        isinstance(uv, dict)
        and all(isinstance(uv.get(k), str) for k in ("version", "file", "url", "sha256"))
        and re.fullmatch(r"uv-[A-Za-z0-9_.+-]+\.whl", uv["file"])
        and re.fullmatch(r"[0-9a-f]{64}", uv["sha256"])
    ):
        raise LockError(f"{where / LOCK_FILE}: uv: malformed (version, file, url, sha256)")
    return Lock(where, stacks, dict(doc.get("driver") or {}), dict(doc.get("models") or {}),
                dict(files), uv)  # fmt: skip


# ---------------------------------------------------------------------------------------------
# --check


def _diff(key: str, old: Any, new: Any) -> list[str]:
    if old == new:
        return []
    if isinstance(old, list) and isinstance(new, list):
        gone = [json.dumps(x, sort_keys=True) if isinstance(x, dict) else str(x)
                for x in old if x not in new]  # fmt: skip
        added = [json.dumps(x, sort_keys=True) if isinstance(x, dict) else str(x)
                 for x in new if x not in old]  # fmt: skip
        return [f"{key}: " + ", ".join([*(f"-{x}" for x in gone), *(f"+{x}" for x in added)])]
    return [f"{key}: {old!r} -> {new!r}"]


def differences(
    lock: Lock,
    wanted: Iterable[Stack],
    driver: Mapping[str, Any],
    models: Mapping[str, Any],
    files: Mapping[str, Any] | None = None,
    stores: Mapping[str, str | None] | None = None,
) -> list[str]:
    """What no longer matches between a lock and the data (empty: the lock is current). A
    stack's inputs are compared as the file holds them (an edit that kept the digest it states
    is named too).

    + lock: the lock read from disk
    + wanted: the stacks the data's hosts need
    + driver: driver version -> {"url", "sha256"} from the data
    + models: model id -> {"revision", "sha256"} the data pins (None: not pinned by data)
    + files: serve_files' path in argv -> {"sha256", "name"} the data ships (None: not compared)
    + stores: model id -> the data's models_store_url for it (None: the hub); a locked archive
      URL on another origin is named (None: not compared)
    """
    out: list[str] = []
    seen = set()
    for st in sorted(set(wanted), key=lambda s: s.name):
        seen.add(st.name)
        have = lock.stacks.get(st.name)
        if have is None:
            out.append(f"stack {st.name}: not locked")
            continue
        if st.digest != have.input or st.digest != Stack(st.name, have.inputs).digest:
            for key in sorted(set(have.inputs) | set(st.inputs)):
                out += [f"stack {st.name}: {line}"
                        for line in _diff(key, have.inputs.get(key), st.inputs.get(key))]  # fmt: skip
    out += [f"stack {name}: locked but no host uses it" for name in sorted(set(lock.stacks) - seen)]
    for version, entry in sorted(driver.items()):
        if lock.driver.get(version) != entry:
            out.append(f"driver {version}: {lock.driver.get(version)} -> {entry}")
    for model, entry in sorted(models.items()):
        have = lock.models.get(model)
        if have is None:
            out.append(f"model {model}: not locked")
            continue
        for key in ("revision", "sha256"):
            if entry.get(key) and entry[key] != have.get(key):
                out.append(f"model {model}: {key} {have.get(key)} -> {entry[key]}")
    for model, store in sorted((stores or {}).items()):
        url = (lock.models.get(model) or {}).get("url")
        on_store = same_origin(url, [store]) if url and store else not url and not store
        if model in lock.models and not on_store:
            out.append(f"model {model}: url {url or 'None (the hub)'} is not on models_store_url "
                       f"{store or 'None (the hub)'}")  # fmt: skip
    if files is not None:
        out += file_differences(lock, files)
        out += [
            f"file {p}: locked but no host ships it" for p in sorted(set(lock.files) - set(files))
        ]
    return out


def file_differences(lock: Lock, files: Mapping[str, Any]) -> list[str]:
    """The files the data ships that the lock does not hold as they are (by sha256).

    + lock: the lock read from disk
    + files: serve_files' path in argv -> {"sha256", ...} of the files the data ships
    """
    out = []
    for argv, entry in sorted(files.items()):
        have = lock.files.get(argv)
        if have is None:
            out.append(f"file {argv}: not locked")
        elif have.get("sha256") != entry["sha256"]:
            out.append(f"file {argv}: sha256 {have.get('sha256')} -> {entry['sha256']}")
    return out
