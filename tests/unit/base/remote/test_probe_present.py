"""The probe's complete models (``probe.present``, #46 item 5). The serve user owns the hub, so
root reads a model's ``.servefleet-complete`` through no-follow descriptors, a regular file only,
opened without waiting: a fifo the serve user planted there hung the probe for ever (and with it
plan, status, deploy and rollout on that host); a link there, a marker naming no revision and a
snapshot reached through a link each counted the model as present. With ``nobody`` standing in
for the serve user, the probe as the controller sends it, run for real on this machine."""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from as_nobody import as_nobody
from host_inputs import CR13, run_probe

from servefleet.base.remote.layout import MODEL_COMPLETE

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (plants as nobody)")
MODEL = "openai/gpt-oss-120b"  # the default recipe's model
REV = "a" * 40
PROMPT = 30  # seconds the probe takes at most here (it answers in about one)


@pytest.fixture
def base() -> Iterator[Path]:
    """A root-owned 0755 directory (pytest's own are 0700: nobody could not reach in), with the
    serve user's hub holding the model's directory and its snapshot, and no marker yet."""
    nobody = pwd.getpwnam("nobody")
    top = Path(tempfile.mkdtemp(prefix="servefleet-present-"))
    top.chmod(0o755)
    repo = top / "hf" / "hub" / ("models--" + MODEL.replace("/", "--"))
    (repo / "snapshots" / REV).mkdir(parents=True)
    for path in (top / "hf", top / "hf" / "hub", repo, *repo.rglob("*")):
        os.chown(path, nobody.pw_uid, nobody.pw_gid)
    try:
        yield top
    finally:
        shutil.rmtree(top)


def models(base: Path) -> list[str]:
    return run_probe(base, CR13, driver=True, timeout=PROMPT)["models"]


def plant(base: Path, code: str) -> None:
    """Run ``code`` as nobody in the model's directory; it must run through."""
    repo = base / "hf" / "hub" / ("models--" + MODEL.replace("/", "--"))
    assert as_nobody(repo, code) == 0


def test_a_complete_model_is_present(base: Path) -> None:
    plant(base, f"open({MODEL_COMPLETE!r}, 'w').write({REV!r})")
    assert models(base) == [MODEL]


def test_a_fifo_planted_as_the_marker_is_no_marker_and_never_waited_on(base: Path) -> None:
    plant(base, f"os.mkfifo({MODEL_COMPLETE!r})")
    began = time.monotonic()
    assert models(base) == []  # before: the probe waited for a writer, killed at PROMPT
    assert time.monotonic() - began < PROMPT
    marker = base / "hf" / "hub" / ("models--" + MODEL.replace("/", "--")) / MODEL_COMPLETE
    assert marker.is_fifo()  # left as it was


PLANTED = {
    # a link to a file naming the revision (the serve user's, anywhere)
    "marker link": f"open('../planted', 'w').write({REV!r}); "
    f"os.symlink('../planted', {MODEL_COMPLETE!r})",
    # a marker naming a path, not a revision (snapshots/../.. is the hub, a directory)
    "names a path": f"open({MODEL_COMPLETE!r}, 'w').write('../..')",
    # the snapshot a link to a directory elsewhere, the marker itself regular
    "snapshot link": f"os.rename('snapshots/{REV}', 'elsewhere'); "
    f"os.symlink('../elsewhere', 'snapshots/{REV}'); open({MODEL_COMPLETE!r}, 'w').write({REV!r})",
}


@pytest.mark.parametrize("how", PLANTED)
def test_a_marker_or_snapshot_the_serve_user_planted_does_not_count(base: Path, how: str) -> None:
    plant(base, PLANTED[how])
    assert models(base) == []  # before: present
