"""The real-wheel tier's interpreters: the real ``vllm==0.30.0`` wheel, importable without a GPU.

usage: python tests/realvllm/build.py [--print]      # build once (setup.sh runs it), or say where

Two venvs, outside the repository, in a directory keyed by the pins (``pins.txt``,
``pins-rbln.txt``, ``rebel_stub/``, this file and the Python version), so a changed pin builds a
new pair and an unchanged one is reused:

- ``upstream``: vLLM 0.30.0 without its dependency tree (``--no-deps``), the CPU torch from this
  machine's pip configuration, and the pinned packages that importing vLLM's CLI needs. A
  ``.pth`` line sets ``VLLM_TARGET_DEVICE=cpu`` (unless set) at start-up, so vLLM resolves its
  upstream ``CpuPlatform`` as a CPU build does: the upstream flag set, as GPU hosts parse it.
- ``rbln``: vllm-rbln 0.12.0 (its wheel only) and a stub of the private ``rebel``, over the
  upstream venv's packages (a ``.pth`` path line): vllm-rbln's ``RblnPlatform``, as CR13 hosts
  parse.

The pair is built in a temporary directory beside its place and renamed into it when complete,
so a build that dies leaves nothing that counts as built. Indexes and mirrors come from the
machine's pip configuration, never from here.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PINS = HERE / "pins.txt"
PINS_RBLN = HERE / "pins-rbln.txt"
STUB = HERE / "rebel_stub"
PLATFORMS = ("upstream", "rbln")
CPU_PTH = "import os; os.environ.setdefault('VLLM_TARGET_DEVICE', 'cpu')\n"


def home() -> Path:
    """Where the keyed builds live: ``$SERVEFLEET_REAL_VLLM_HOME``, else the user's cache."""
    configured = os.environ.get("SERVEFLEET_REAL_VLLM_HOME")
    if configured:
        return Path(configured)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "servefleet" / "real-vllm"


def key() -> str:
    """The build's key: a digest of everything that goes into it."""
    digest = hashlib.sha256(f"python{sys.version_info[0]}.{sys.version_info[1]}\n".encode())
    stub_files = sorted(p for p in STUB.rglob("*.py"))
    for path in [PINS, PINS_RBLN, Path(__file__).resolve(), *stub_files]:
        digest.update(f"{path.relative_to(HERE)}\n".encode() + path.read_bytes())
    return digest.hexdigest()[:16]


def built() -> Path:
    """The directory of this key's pair (``upstream/``, ``rbln/``), built or not."""
    return home() / key()


def python(platform: str) -> Path:
    """The interpreter of one platform's venv.

    + platform: ``upstream`` or ``rbln``
    """
    return built() / platform / "bin" / "python"


def is_built() -> bool:
    return (built() / ".complete").is_file()


def _site(venv: Path) -> Path:
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return Path(out.stdout.strip())


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-3:]
        raise SystemExit(f"realvllm/build.py: {' '.join(cmd[:4])} ... failed: {' | '.join(tail)}")


def build() -> Path:
    """Build this key's pair unless it is built; its directory."""
    dest = built()
    if is_built():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".build-{dest.name}-", dir=dest.parent))
    try:
        up, rbln = work / "upstream", work / "rbln"
        _run([sys.executable, "-m", "venv", str(up)])
        pip = [str(up / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "-q"]
        _run([*pip, "install", "--no-deps", "-r", str(PINS)])
        (_site(up) / "servefleet-cpu-platform.pth").write_text(CPU_PTH)
        _run([sys.executable, "-m", "venv", "--without-pip", str(rbln)])
        _run([*pip, "--python", str(rbln / "bin" / "python"), "install", "--no-deps", "-r", str(PINS_RBLN)])  # fmt: skip
        site = _site(rbln)
        shutil.copytree(STUB / "rebel", site / "rebel")
        (site / "servefleet-upstream.pth").write_text(f"{_site(up)}\n")
        (work / ".complete").write_text(key() + "\n")
        # venvs name their own paths (bin/ scripts, pyvenv.cfg, the .pth): fix them for dest
        _relocate(work, dest)
        if dest.exists():  # another build of the same key finished first
            shutil.rmtree(work)
        else:
            os.rename(work, dest)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return dest


def _relocate(work: Path, dest: Path) -> None:
    """Rewrite the temporary directory's path to ``dest`` in the venvs' text files."""
    old, new = str(work).encode(), str(dest).encode()
    for path in [
        *work.glob("*/bin/*"),
        *work.glob("*/pyvenv.cfg"),
        *work.rglob("servefleet-*.pth"),
    ]:
        if path.is_symlink() or not path.is_file():
            continue
        data = path.read_bytes()
        if old in data and b"\0" not in data[:1024]:
            path.write_bytes(data.replace(old, new))


def main(argv: list[str]) -> int:
    if argv[1:] == ["--print"]:
        print(built())
        return 0 if is_built() else 1
    if argv[1:]:
        print("usage: build.py [--print]", file=sys.stderr)
        return 2
    fresh = not is_built()
    dest = build()
    print(f"realvllm: {'built' if fresh else 'ready'} {dest}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
