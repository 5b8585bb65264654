"""The host programs go to a host as one tar and one command (#32 item 8: a first deploy sent each
of them in an operation of its own, 18 a host): the tar is the same bytes for the same files, and
the command, run as the host runs it, leaves each program whole at its place, root's 0644, and
nothing of its own behind; run again after a run that died half-way, it still ends there."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from pathlib import Path

from servefleet.base.remote import REMOTE
from servefleet.entry.steps.lib import BUNDLE, UNPACKED, bundle, unpack_command
from servefleet.hostplan.probe_input import REMOTE_SCRIPTS


def scripts() -> dict[str, bytes]:
    return {s: (REMOTE / s).read_bytes() for s in REMOTE_SCRIPTS}


def test_the_bundle_is_the_same_bytes_for_the_same_programs() -> None:
    first = bundle(scripts())
    assert first == bundle(dict(reversed(list(scripts().items()))))
    with tarfile.open(fileobj=io.BytesIO(first)) as tar:
        members = tar.getmembers()
        assert sorted(m.name for m in members) == sorted(REMOTE_SCRIPTS)
        assert {(m.mode, m.uid, m.gid, m.mtime, m.isfile()) for m in members} == {
            (0o644, 0, 0, 0, True)
        }


def test_the_command_puts_each_program_in_place_and_leaves_nothing(tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "probe.py").write_text("old\n")  # a program an older servefleet sent
    (lib / "keep.txt").write_text("not ours to touch\n")
    want = {"probe.py": b"new probe\n", "layout.py": b"new layout\n"}
    (lib / BUNDLE).write_bytes(bundle(want))
    (lib / UNPACKED).mkdir()  # left by a run that died while unpacking
    (lib / UNPACKED / "half.py").write_text("x")
    done = subprocess.run(["sh", "-c", unpack_command(str(lib))], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in lib.iterdir()) == ["keep.txt", "layout.py", "probe.py"]
    for name, data in want.items():
        assert (lib / name).read_bytes() == data
        st = (lib / name).stat()
        assert oct(st.st_mode & 0o777) == "0o644" and st.st_uid == os.geteuid()
    assert (lib / "keep.txt").read_text() == "not ours to touch\n"
