#!/usr/bin/env python3
"""servefleet model fetch. Runs ON THE HOST, as root (stdlib only, plus huggingface_hub from the
release venv for hub downloads).

usage: fetch_model.py MODEL HF_HOME OWNER (--store URL | --hub PYTHON) [--token-file FILE]

Lays the model out as a Hugging Face download does, under $HF_HOME/hub/models--ORG--NAME, so
servers started with HF_HUB_OFFLINE=1 find it and never download. A store serves
<URL>/<org>/<name>.tar.gz holding that layout. Nothing is left half-written: the store archive is
unpacked in a temporary directory and moved into place.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path


def from_store(model: str, hub: Path, store: str, token_file: str | None, owner: str) -> None:
    org, name = model.split("/", 1)
    url = f"{store.rstrip('/')}/{org}/{name}.tar.gz"
    target = hub / f"models--{org}--{name}"
    request = urllib.request.Request(url)
    if token_file:  # the token travels in a header, never in argv or the URL
        request.add_header("Authorization", "Bearer " + Path(token_file).read_text().strip())
    with tempfile.TemporaryDirectory(dir=hub, prefix=".fetch-") as tmp:
        archive = Path(tmp) / "model.tar.gz"
        with urllib.request.urlopen(request, timeout=60) as r, open(archive, "wb") as out:
            shutil.copyfileobj(r, out)
        unpacked = Path(tmp) / "unpacked"
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                path = (unpacked / member.name).resolve()
                if (
                    not str(path).startswith(str(unpacked.resolve()))
                    or member.issym()
                    and os.path.isabs(member.linkname)
                ):
                    sys.exit(f"servefleet: {url}: unsafe path {member.name!r} in archive")
            tar.extractall(unpacked)
        got = unpacked / target.name
        if not (got / "refs" / "main").is_file():
            sys.exit(f"servefleet: {url} does not hold {target.name}/refs/main")
        chown(got, owner)  # complete and owned before it appears under its name
        if target.exists():
            shutil.rmtree(target)
        got.rename(target)


def chown(path: Path, owner: str) -> None:
    if subprocess.run(["chown", "-R", f"{owner}:{owner}", str(path)]).returncode != 0:
        sys.exit(f"servefleet: cannot give {path} to {owner}")


def from_hub(model: str, hf_home: Path, python: str, token_file: str | None) -> None:
    env = dict(os.environ, HF_HOME=str(hf_home), HF_HUB_DISABLE_TELEMETRY="1")
    if token_file:
        env["HF_TOKEN_PATH"] = token_file
    code = (
        "import sys; from huggingface_hub import snapshot_download; snapshot_download(sys.argv[1])"
    )
    if subprocess.run([python, "-c", code, model], env=env).returncode != 0:
        sys.exit(f"servefleet: downloading {model} from the Hugging Face hub failed")


def main() -> None:
    ap = argparse.ArgumentParser(prog="fetch_model.py")
    ap.add_argument("model")
    ap.add_argument("hf_home", type=Path)
    ap.add_argument("owner")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--store")
    src.add_argument("--hub", metavar="PYTHON")
    ap.add_argument("--token-file")
    a = ap.parse_args()
    hub = a.hf_home / "hub"
    hub.mkdir(parents=True, exist_ok=True)
    if a.store:
        from_store(a.model, hub, a.store, a.token_file, a.owner)
    else:
        from_hub(a.model, a.hf_home, a.hub, a.token_file)
        chown(a.hf_home, a.owner)
    print(f"{a.model} is in {hub}")


if __name__ == "__main__":
    main()
