"""``servefleet lock --check`` (``release/lock.py`` ``differences``) compares every field of the
lock with the data: one test per field, each a lock written from the data (current: no line),
then that one field of the data changed (named in one line). Issue #52 bug 3: with a model's
sha256 no longer compared (``for key in ("revision",)``), ``model org/m: sha256 h1 -> h2`` went
unreported; ``test_a_models_sha256_is_compared`` failed on that bug.

Not compared, on purpose: the lock's ``uv`` (the hosts run the uv the lock pins, whichever uv
the controller has: ``lockfleet.check_lock``), a model's revision or sha256 the data does not
pin (None: the lock's own stands), and a ``serve_files`` entry's ``name`` (the file is the
sha256; its name in argv is the key)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from local_release import pylock

from servefleet.release.lock import differences, load_lock, write_lock
from servefleet.release.stack import Stack, stack

STORE = "https://store.example/models"
PARTS: dict[str, Any] = {
    "name": "s",
    "requirements": ["a==1.0", "vllm==0.30.0"],
    "constraints": ["c==2.0"],
    "indexes": [
        {"name": "rbln", "url": "https://rbln.example/simple", "packages": ["a"], "auth": True}
    ],  # fmt: skip
    "public_index": "https://pypi.example/simple",
    "python": ">=3.10",
    "trusted_hosts": ["10.0.0.9"],
}
DRIVER = {"3.5.1": {"url": "https://files.example/rebellions-3.5.1.run", "sha256": "d" * 64}}
MODELS = {"org/m": {"revision": "r1", "url": f"{STORE}/org/m.tar.gz", "sha256": "h1"}}
PINNED = {"org/m": {"revision": "r1", "sha256": "h1"}}
FILES = {"/etc/servefleet/files/t.jinja": {"sha256": "f" * 64, "name": "t.jinja"}}
STORES: dict[str, str | None] = {"org/m": STORE}


def _stack(**over: Any) -> Stack:
    p = {**PARTS, **over}
    return stack(p["name"], p["requirements"], p["constraints"], p["indexes"],
                 p["public_index"], p["python"], p["trusted_hosts"])  # fmt: skip


def _check(tmp_path: Path, **data: Any) -> list[str]:
    """The lock written from the defaults above, checked against them with ``data`` on top."""
    write_lock(tmp_path, {_stack(): pylock()}, DRIVER, MODELS, FILES)
    args: dict[str, Any] = {"wanted": [_stack()], "driver": DRIVER, "models": PINNED,
                            "files": FILES, "stores": STORES}  # fmt: skip
    args.update(data)
    return differences(load_lock(tmp_path), **args)


def test_a_lock_written_from_the_data_is_current(tmp_path: Path) -> None:
    assert _check(tmp_path) == []


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("requirements", ["a==1.1", "vllm==0.30.0"]),
        ("constraints", ["c==2.1"]),
        (
            "indexes",
            [
                {
                    "name": "rbln",
                    "url": "https://other.example/simple",
                    "packages": ["a"],
                    "auth": True,
                }
            ],
        ),  # fmt: skip
        ("public_index", "https://mirror.example/simple"),
        ("python", ">=3.11"),
        ("trusted_hosts", ["10.0.0.8"]),
    ],
)
def test_each_input_of_a_stack_is_compared(tmp_path: Path, key: str, value: Any) -> None:
    out = _check(tmp_path, wanted=[_stack(**{key: value})])
    assert len(out) == 1 and out[0].startswith(f"stack s: {key}: "), out


def test_a_stack_no_host_uses_and_one_not_locked_are_named(tmp_path: Path) -> None:
    assert _check(tmp_path, wanted=[_stack(name="t")]) == [
        "stack t: not locked",
        "stack s: locked but no host uses it",
    ]


def test_a_drivers_url_is_compared(tmp_path: Path) -> None:
    moved = {"3.5.1": {**DRIVER["3.5.1"], "url": "https://files.example/other.run"}}
    out = _check(tmp_path, driver=moved)
    assert len(out) == 1 and out[0].startswith("driver 3.5.1: ") and "other.run" in out[0]


def test_a_drivers_sha256_is_compared(tmp_path: Path) -> None:
    moved = {"3.5.1": {**DRIVER["3.5.1"], "sha256": "e" * 64}}
    out = _check(tmp_path, driver=moved)
    assert len(out) == 1 and out[0].startswith("driver 3.5.1: ") and "e" * 64 in out[0]


def test_a_drivers_version_is_compared(tmp_path: Path) -> None:
    out = _check(tmp_path, driver={"3.6.0": DRIVER["3.5.1"]})
    assert out == [f"driver 3.6.0: None -> {DRIVER['3.5.1']}"]


def test_a_models_revision_is_compared(tmp_path: Path) -> None:
    out = _check(tmp_path, models={"org/m": {"revision": "r2", "sha256": "h1"}})
    assert out == ["model org/m: revision r1 -> r2"]


def test_a_models_sha256_is_compared(tmp_path: Path) -> None:
    out = _check(tmp_path, models={"org/m": {"revision": "r1", "sha256": "h2"}})
    assert out == ["model org/m: sha256 h1 -> h2"]


def test_a_model_not_locked_is_named(tmp_path: Path) -> None:
    out = _check(tmp_path, models={**PINNED, "org/n": {"revision": None, "sha256": None}})
    assert out == ["model org/n: not locked"]


def test_a_models_url_is_compared_with_its_store(tmp_path: Path) -> None:
    out = _check(tmp_path, stores={"org/m": "https://elsewhere.example/models"})
    assert out == [
        f"model org/m: url {STORE}/org/m.tar.gz is not on models_store_url "
        "https://elsewhere.example/models"
    ]


def test_a_files_sha256_is_compared(tmp_path: Path) -> None:
    path = next(iter(FILES))
    out = _check(tmp_path, files={path: {**FILES[path], "sha256": "0" * 64}})
    assert out == [f"file {path}: sha256 {'f' * 64} -> {'0' * 64}"]


def test_a_file_not_locked_and_one_no_host_ships_are_named(tmp_path: Path) -> None:
    path = next(iter(FILES))
    other = "/etc/servefleet/files/u.jinja"
    out = _check(tmp_path, files={other: {"sha256": "1" * 64, "name": "u.jinja"}})
    assert out == [f"file {other}: not locked", f"file {path}: locked but no host ships it"]


def test_a_model_the_data_pins_that_is_not_locked_is_named(tmp_path: Path) -> None:
    """Issue #52, a survivor of ``bench/ast_mutation.py``: the pins compared before the ``not
    locked`` check (``swap``) raised on a model the lock lacks and the data pins."""
    out = _check(tmp_path, models={**PINNED, "org/n": {"revision": "r9", "sha256": "h9"}})
    assert out == ["model org/n: not locked"]
