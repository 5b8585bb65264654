#!/usr/bin/env python3
"""servefleet release installer. Runs ON THE HOST, as root, with the system python3 (stdlib only).

usage: install_release.py PLAN.json

1. a fresh venv at plan["path"] (an incomplete one left by a failed run is removed first);
2. each owned package downloaded from its own index only (``pip download --isolated
   --index-url OWNER --no-deps``; credentials from the 0600 netrc via $NETRC, never argv);
3. one ``pip install`` from the public index with the owned packages as direct file references
   and every public package constrained to its pin;
4. checks: every installed pin has its pinned version, every owned package came from our
   download, every required module imports;
5. only then the completion marker. A release counts as installed only with that marker.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

CHECK = r"""
import importlib, importlib.metadata as md, json, sys
plan = json.load(open(sys.argv[1]))
wheelhouse = sys.argv[2]
errors = []
for name, version in plan["expect"].items():
    try:
        have = md.version(name)
    except md.PackageNotFoundError:
        if name in plan["must_have"]:
            errors.append(f"{name} is not installed")
        continue
    if have != version:
        errors.append(f"{name} {have} is installed, {version} is pinned")
for d in plan["downloads"]:
    try:
        url = json.loads(md.distribution(d["name"]).read_text("direct_url.json") or "{}").get("url", "")
    except md.PackageNotFoundError:
        continue
    if not url.startswith("file://" + wheelhouse + "/"):
        errors.append(f"{d['name']} did not come from its own index ({d['index']}): {url or 'no direct_url'}")
for module in plan["imports"]:
    try:
        importlib.import_module(module)
    except Exception as e:
        errors.append(f"import {module} failed: {type(e).__name__}: {e}")
for e in errors:
    print("servefleet: release check: " + e, file=sys.stderr)
sys.exit(1 if errors else 0)
"""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def run(cmd: list[str], env: dict[str, str] | None = None) -> None:
    print("+", " ".join(cmd), flush=True)
    done = subprocess.run(cmd, env=env)
    if done.returncode != 0:
        sys.exit(f"servefleet: failed ({done.returncode}): {' '.join(cmd[:3])} ...")


def trusted(plan: dict) -> list[str]:
    return [a for h in plan["trusted_hosts"] for a in ("--trusted-host", h)]


def downloaded(wheelhouse: Path, name: str, version: str) -> Path:
    for f in sorted(wheelhouse.iterdir()):
        stem = f.name[: -len(".tar.gz")] if f.name.endswith(".tar.gz") else f.stem
        parts = stem.split("-")
        if len(parts) >= 2 and canonical(parts[0]) == name and parts[1] == version:
            return f
    sys.exit(f"servefleet: {name}=={version} was not downloaded into {wheelhouse}")


def main(plan_file: str) -> None:
    plan = json.loads(Path(plan_file).read_text())
    release = Path(plan["path"])
    if (release / plan["marker"]).exists():
        print(f"release {plan['id']} is complete")
        return
    if release.exists():
        shutil.rmtree(release)
    run([plan["python"], "-m", "venv", str(release)])
    pip = [str(release / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    wheelhouse = release / "wheelhouse"
    wheelhouse.mkdir()
    env = dict(os.environ)
    refs = []
    for d in plan["downloads"]:
        denv = dict(env, NETRC=plan["netrc"]) if d["auth"] and plan["netrc"] else env
        run(
            [*pip, "download", "--isolated", "--no-deps", "--dest", str(wheelhouse)]
            + ["--index-url", d["index"], *trusted(plan), f"{d['name']}=={d['version']}"],
            env=denv,
        )
        refs.append(f"{d['name']} @ {downloaded(wheelhouse, d['name'], d['version']).as_uri()}")
    constraints = release / "constraints.txt"
    constraints.write_text("".join(c + "\n" for c in plan["constraints"]))
    index = ["--isolated", "--index-url", plan["public_index"]] if plan["public_index"] else []
    run(
        [
            *pip,
            "install",
            *index,
            *trusted(plan),
            "-c",
            str(constraints),
            *refs,
            *plan["requirements"],
        ]
    )
    check = subprocess.run(
        [str(release / "bin" / "python"), "-c", CHECK, plan_file, str(wheelhouse)]
    )
    if check.returncode != 0:
        sys.exit(f"servefleet: release {plan['id']} failed its checks; it is not marked complete")
    marker = release / plan["marker"]
    tmp = marker.with_suffix(".tmp")
    tmp.write_text(json.dumps({"id": plan["id"], "pins": plan["expect"]}, sort_keys=True) + "\n")
    tmp.rename(marker)
    print(f"release {plan['id']} installed and checked")


if __name__ == "__main__":
    main(sys.argv[1])
