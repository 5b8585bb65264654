"""Bench (not a test): bytes sent to an offline host by the wheelhouse copy, on the first run
and on a re-run (target 0), as numbers from one run. Needs root; brings a 1-host lab up,
leaves it down.

The host is deployed once online (driver 3.5.1 and its apt prerequisites, as its image would
have them), then cut off the lab's servers (``servefleet lab offline``); the controller locks
driver 3.6.0 and the EAGLE-3 selection and fills a wheelhouse; two deploys with
``sdk_source=wheelhouse`` follow. For each: the files and bytes the copy operation sends (its
name says them) and every byte the host received during the whole run (the bridge end of its
veth, SSH and the probe included).

    .venv/bin/python bench/bench_wheelhouse.py
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

from labbench import BIN, REPO, lab, lab_env

HOST = "lab1"
DATA = ["--data", "driver_version=3.6.0", "--data", "serve_selection=spec_decode=eagle3"]
DRAFT = "/var/lib/servefleet/hf/hub/models--nvidia--gpt-oss-120b-Eagle3-v3"
COPIED = re.compile(r"Copy (\d+) wheelhouse file\(s\) \((\d+) bytes\)")


def _run(*argv: str) -> str:
    proc = subprocess.run(argv, cwd=REPO, env=lab_env(), capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(
            f"{' '.join(argv[:3])} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc.stdout + proc.stderr  # pyinfra logs its operations on stderr


def _received() -> int:
    """Bytes sent to the host so far (transmitted by the bridge end of its veth)."""
    return int(Path(f"/sys/class/net/sfv-{HOST}/statistics/tx_bytes").read_text())


def deploy(*data: str) -> tuple[int, int, int]:
    """One deploy: (files copied, their bytes, bytes the host received in the whole run)."""
    before = _received()
    out = _run(str(BIN / "pyinfra"), "-y", *data, "inventories/lab.py", "deploys/serve.py")
    after = _received()
    copied = COPIED.search(out)
    files, size = (int(copied.group(1)), int(copied.group(2))) if copied else (0, 0)
    return files, size, after - before


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="bench-wheelhouse-") as tmp:
        lock, wheelhouse = f"{tmp}/lock", f"{tmp}/wheelhouse"
        try:
            lab("up", "--hosts", "1")
            deploy()  # online: driver 3.5.1 and its prerequisites
            data = [*DATA, "--data", f"sdk_lock={lock}", "--data", "sdk_source=wheelhouse",
                    "--data", f"sdk_wheelhouse={wheelhouse}"]  # fmt: skip
            servefleet = str(BIN / "servefleet")
            _run(servefleet, "lock", "inventories/lab.py", *data)
            _run(servefleet, "wheelhouse", wheelhouse, "--inventory", "inventories/lab.py", *data)
            lab("ssh", HOST, f"rm -rf {DRAFT}")
            lab("offline", HOST)
            runs = {"first run": deploy(*data), "re-run": deploy(*data)}
        finally:
            lab("down")
    print("Wheelhouse copy to an offline host (1 host; driver, release and draft model from it):\n")
    print("| run | files copied | file bytes sent | bytes the host received (whole run) |")
    print("|---|---|---|---|")
    for name, (files, size, received) in runs.items():
        print(f"| {name} | {files} | {size} | {received} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
