"""What a killed fetch left in the hub, removed as the next one takes the hub's lock
(``snapshot_place.one_fetch_at_a_time``, #46 item 5): only root's own ``.fetch-*`` staging
directories go. The hub is the serve user's (``nobody`` here): a fifo it named ``.fetch-*`` hung
root's fetch for ever (``shutil.rmtree`` opened it to read), and its own directories and links
there were removed or unlinked. They are now left as they are, unopened."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from as_nobody import as_nobody

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (plants as nobody)")

TAKE_LOCK = """
import sys
from pathlib import Path
from servefleet.base.remote.snapshot_place import one_fetch_at_a_time
with one_fetch_at_a_time(Path(sys.argv[1]), 1):
    print("locked")
"""


@pytest.fixture
def hub() -> Iterator[Path]:
    """The serve user's hub in a root-owned 0755 directory (nobody reaches in)."""
    nobody = pwd.getpwnam("nobody")
    top = Path(tempfile.mkdtemp(prefix="servefleet-stale-"))
    top.chmod(0o755)
    (top / "hub").mkdir()
    os.chown(top / "hub", nobody.pw_uid, nobody.pw_gid)
    try:
        yield top / "hub"
    finally:
        shutil.rmtree(top)


def test_only_roots_own_staging_goes_and_a_planted_fifo_is_never_opened(hub: Path) -> None:
    killed = hub / ".fetch-killed"  # root's own staging, left by a killed run
    (killed / "hub" / "models--o--m").mkdir(mode=0o700, parents=True)
    killed.chmod(0o700)
    (killed / "hub" / "models--o--m" / "part").write_text("half a model")
    root_only = hub.parent / "root-only"
    root_only.mkdir(mode=0o700)
    (root_only / "sentinel").write_text("root's\n")
    planted = f"""
os.mkfifo(".fetch-fifo")
os.mkdir(".fetch-theirs"); open(".fetch-theirs/keep", "w").write("the serve user's")
os.symlink({str(root_only)!r}, ".fetch-link")
"""
    assert as_nobody(hub, planted) == 0
    proc = subprocess.run([sys.executable, "-c", TAKE_LOCK, str(hub)], capture_output=True,
                          text=True, timeout=30)  # fmt: skip  # before: waited on the fifo
    assert (proc.returncode, proc.stdout) == (0, "locked\n"), proc.stderr
    assert sorted(p.name for p in hub.iterdir()) == [".fetch-fifo", ".fetch-link", ".fetch-theirs"]
    assert (hub / ".fetch-fifo").is_fifo()
    assert (hub / ".fetch-theirs" / "keep").read_text() == "the serve user's"
    assert os.readlink(hub / ".fetch-link") == str(root_only)
    assert (root_only / "sentinel").read_text() == "root's\n"
