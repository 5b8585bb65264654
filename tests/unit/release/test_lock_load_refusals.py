"""A lock directory that is not one ``servefleet lock`` wrote is refused in one line
(``release/lock.py`` ``load_lock``), and ``--check`` names what is locked but unused in a
stable order. Issue #52: survivors of ``bench/ast_mutation.py`` on ``release/lock.py``, each
killed here: the ``lock_version`` check dropped (``bool``), ``OSError`` or ``KeyError`` left out
of an ``except`` tuple (``elt``: a lock file that is a directory, a stack without its
``release``, raised as a traceback), the ``sorted`` of the unused stacks and files dropped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from local_release import pylock

from servefleet.release.lock import LOCK_FILE, differences, load_lock, write_lock
from servefleet.release.stack import LockError, stack


def _written(tmp_path: Path, names: tuple[str, ...] = ("s",), files: int = 0) -> Path:
    stacks = {stack(n, ["a==1.0"], (), [], None, ">=3.10", ()): pylock() for n in names}
    shipped = {f"/etc/servefleet/files/f{i}": {"sha256": f"{i}" * 64, "name": f"f{i}"}
               for i in range(files)}  # fmt: skip
    write_lock(tmp_path, stacks, {}, {}, shipped)
    return tmp_path


def _edit(path: Path, **top: object) -> None:
    doc = json.loads((path / LOCK_FILE).read_text())
    doc.update(top)
    (path / LOCK_FILE).write_text(json.dumps(doc))


def _refused(path: Path) -> str:
    with pytest.raises(LockError) as e:
        load_lock(path)
    assert len(str(e.value).splitlines()) == 1
    return str(e.value)


def test_another_lock_version_is_refused(tmp_path: Path) -> None:
    _edit(_written(tmp_path), lock_version=2)
    assert _refused(tmp_path).endswith("not a servefleet lock (lock_version 1)")


def test_a_lock_file_that_cannot_be_read_is_refused(tmp_path: Path) -> None:
    (tmp_path / LOCK_FILE).mkdir()  # a directory where the file belongs
    assert f"{LOCK_FILE}: not readable: " in _refused(tmp_path)


@pytest.mark.parametrize("key", ["release", "input", "inputs", "pylock"])
def test_a_stack_without_one_of_its_keys_is_refused(tmp_path: Path, key: str) -> None:
    doc = json.loads((_written(tmp_path) / LOCK_FILE).read_text())
    del doc["stacks"]["s"][key]
    (tmp_path / LOCK_FILE).write_text(json.dumps(doc))
    assert f"{LOCK_FILE}: stack s: malformed (" in _refused(tmp_path)


def test_what_is_locked_but_unused_is_named_in_sorted_order(tmp_path: Path) -> None:
    names = ("q", "e", "w", "r", "t", "y", "u", "i", "o", "p")
    lock = load_lock(_written(tmp_path, names, files=10))
    out = differences(lock, [], {}, {}, {})
    stacks = [line for line in out if line.startswith("stack ")]
    files = [line for line in out if line.startswith("file ")]
    assert stacks == [f"stack {n}: locked but no host uses it" for n in sorted(names)]
    assert files == [f"file /etc/servefleet/files/f{i}: locked but no host ships it"
                     for i in range(10)]  # fmt: skip


def test_a_lock_file_that_holds_no_object_is_refused(tmp_path: Path) -> None:
    """``not isinstance(doc, dict) or`` dropped (``bool``): a JSON list was a traceback."""
    (tmp_path / LOCK_FILE).write_text("[]\n")
    assert _refused(tmp_path).endswith("not a servefleet lock (lock_version 1)")


UV = {"version": "0.9.9", "file": "uv-0.9.9-py3-none-manylinux_2_17_x86_64.whl",
      "url": "https://pypi.example/files/uv-0.9.9.whl", "sha256": "a" * 64}  # fmt: skip


@pytest.mark.parametrize(
    "uv",
    [
        {k: v for k, v in UV.items() if k != "url"},
        {k: v for k, v in UV.items() if k != "version"},
        {**UV, "sha256": "not-a-hash"},
        {**UV, "file": "../uv.whl"},
        ["uv"],
    ],
    ids=["no-url", "no-version", "sha256", "file", "list"],
)
def test_a_malformed_uv_entry_is_refused(tmp_path: Path, uv: object) -> None:
    """The ``uv`` entry's check dropped (``bool``) or without ``url`` among its keys (``elt``)
    survived: a lock naming a uv wheel without a URL, or with a sha256 that is no hash, was
    read, and the hosts would take uv from it."""
    _edit(_written(tmp_path), uv=UV)
    assert load_lock(tmp_path).uv == UV
    _edit(tmp_path, uv=uv)
    assert _refused(tmp_path).endswith("uv: malformed (version, file, url, sha256)")
