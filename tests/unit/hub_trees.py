"""A model as the hub's snapshot_download leaves it in ``$HF_HOME/hub`` (blobs named by their
sha256 or git sha1, snapshot files linking to them), and root's record of its fetch: for the tests
of ``remote/content_check.py`` and of the compile-only build that reads a checked copy of it."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from fetch_stubs import MODEL, REV
from repo_paths import REMOTE

sys.path.insert(0, str(REMOTE))
import content_check  # noqa: E402
import layout  # noqa: E402

WEIGHTS = b"\x01\x02weights" * 1000  # an LFS file: its blob is named by its sha256
CONFIG = b'{"model_type": "tiny"}\n'  # a git file: its blob is named by its git blob sha1
NESTED = b"merges\n"


def git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def hub_tree(home: Path, model: str = MODEL, rev: str = REV) -> Path:
    """``model`` in ``home/hub`` as snapshot_download leaves it, complete at ``rev``; returns
    its snapshot directory."""
    repo = home / "hub" / content_check.repo_dir(model)
    snap = repo / "snapshots" / rev
    (snap / "tok").mkdir(parents=True)
    (repo / "blobs").mkdir()
    for data, name, link in (
        (WEIGHTS, hashlib.sha256(WEIGHTS).hexdigest(), snap / "model.safetensors"),
        (CONFIG, git_sha1(CONFIG), snap / "config.json"),
        (NESTED, git_sha1(NESTED), snap / "tok" / "merges.txt"),
    ):
        (repo / "blobs" / name).write_bytes(data)
        link.symlink_to(os.path.relpath(repo / "blobs" / name, link.parent))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(rev)
    (repo / layout.MODEL_COMPLETE).write_text(rev)
    return snap


def record(home: Path, model: str = MODEL, rev: str = REV) -> None:
    """Root's record of the model as it is now (as the fetcher writes it from its staging)."""
    top = content_check.repo_dir(model)
    hub = os.open(home / "hub", os.O_RDONLY | os.O_DIRECTORY)
    repo = os.open(home / "hub" / top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        found = content_check.snapshot_files(repo, rev)
        assert found.problems == {}
        content_check.write_record(hub, top, rev, found.files)
    finally:
        os.close(repo)
        os.close(hub)


def blob(snap: Path, name: str) -> Path:
    return (snap / name).resolve()
