"""``trusted.read`` never reads through a link planted as the file itself (``O_NOFOLLOW``), and
what that means on a host: a warm marker planted as a link is not warm. Issue #37's hole 4: the
other tests plant links as directories and temporary files, never as the file being read
(shown failing with ``read()`` opening without ``O_NOFOLLOW``)."""

from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path

import pytest
from repo_paths import REMOTE

sys.path.insert(0, str(REMOTE))
import layout  # noqa: E402  (a host program: imported as the host imports it)
import trusted  # noqa: E402
import warm_state  # noqa: E402


def test_read_refuses_a_link_planted_as_the_file(tmp_path: Path) -> None:
    secret = tmp_path / "root-only"
    secret.write_text('{"dirs": [], "source": "planted"}\n')
    secret.chmod(0o600)
    marker_dir = tmp_path / "warm"
    marker_dir.mkdir()
    (marker_dir / "real").write_text("ours\n")
    (marker_dir / "planted").symlink_to(secret)  # absolute
    (marker_dir / "relative").symlink_to("real")  # to a regular file beside it
    fd = os.open(marker_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert trusted.read(fd, "real") == "ours\n"
        for name in ("planted", "relative"):
            with pytest.raises(OSError) as err:
                trusted.read(fd, name)
            assert err.value.errno == errno.ELOOP, name
    finally:
        os.close(fd)


def test_a_warm_marker_planted_as_a_link_is_not_warm(tmp_path: Path) -> None:
    """The consequence on the host: the warm record behind a link is never read."""
    cache = tmp_path / "cache"
    warm = cache / layout.WARM_DIR
    warm.mkdir(parents=True, mode=0o755)
    warm.chmod(0o755)
    record = tmp_path / "elsewhere.json"
    record.write_text(json.dumps({"dirs": ["rbln/m/sig"], "source": "compiled"}))
    (warm / "ab").mkdir()  # a directory named like a marker is not one either
    (warm / ("cd" * 32)).write_text(json.dumps({"dirs": [], "source": "compiled"}))
    (warm / ("ef" * 32)).symlink_to(record)
    state = {"cache_root": str(cache)}
    assert warm_state.warm_record(state, "cd" * 32) == {"dirs": [], "source": "compiled"}
    assert warm_state.warm_record(state, "ef" * 32) is None
    assert warm_state.warm_record(state, "ab") is None
