"""Reproducible archives of the lab builder: a .tar.gz whose members and gzip header carry fixed
timestamps and owners, so the same input gives the same bytes; and a file's sha256."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from servefleet.base.remote import layout

EPOCH = 315532800  # 1980-01-01: fixed timestamps make the artifacts reproducible


def _tar_add(tar: tarfile.TarFile, arcname: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(arcname)
    info.size, info.mode, info.mtime = len(data), mode, EPOCH
    info.uname = info.gname = "root"
    tar.addfile(info, io.BytesIO(data))


def _tar_dir(tar: tarfile.TarFile, arcname: str) -> None:
    info = tarfile.TarInfo(arcname)
    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, EPOCH
    info.uname = info.gname = "root"
    tar.addfile(info)


def write_tgz(path: Path, members: list[tuple[str, bytes | None]]) -> None:
    """A reproducible .tar.gz; a None payload is a directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for arc, data in members:
            if data is None:
                _tar_dir(tar, arc)
            else:
                _tar_add(tar, arc, data)
    import gzip

    with open(path, "wb") as fh, gzip.GzipFile(fileobj=fh, mode="wb", mtime=EPOCH) as gz:
        gz.write(raw.getvalue())


file_sha256 = layout.sha256_of  # the host contract's rule
