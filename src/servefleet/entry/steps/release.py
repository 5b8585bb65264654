"""The release (the stack): its plan uploaded, the index credentials, the wheels the controller
built, the install into ``releases/<id>`` (checked before its marker is written), and
``current`` switched to it. Running servers keep their release: units name it, and no release a
unit or kept state names is removed."""

from __future__ import annotations

import json
from pathlib import Path

from pyinfra import host, logger
from pyinfra.api.operation import OperationMeta
from pyinfra.operations import files, server

from servefleet.base.remote.layout import CURRENT, PLANS, RELEASE_FILES, RELEASES, TAMPERED
from servefleet.entry.steps import ensure
from servefleet.entry.steps.credentials import netrc
from servefleet.entry.steps.lib import command
from servefleet.entry.steps.operations import release
from servefleet.hostplan.types import HostPlan
from servefleet.release.builds import cache_dir


def install(plan: HostPlan) -> OperationMeta | None:
    s, rel = plan.settings, plan.release
    if not rel.locked:
        logger.warning(
            f"{host.print_prefix}release {rel.id} is unlocked (sdk_lock not set): packages "
            "beyond the pins, and every file's hash, are what the indexes serve at install time"
        )
    plan_file = f"{s.serve_root}/{PLANS}/{rel.id}.json"
    plan_json = json.dumps(rel.to_json(), indent=1, sort_keys=True) + "\n"
    ensure.upload(plan, f"Upload the plan of release {rel.id}", plan_json.encode(), plan_file)
    if rel.netrc:
        ensure.secret(plan, "Write the index credentials (netrc, 0600)", rel.netrc, netrc(s))
    installed = None
    if not plan.release_complete:
        if rel.built:
            ensure.directory(plan, f"{plan.lib}/wheels")
        for wheel in rel.built:
            files.put(
                name=f"Upload the {wheel['name']} {wheel['version']} wheel the controller built",
                src=str(cache_dir(s.sdk_wheel_cache, wheel["sdist_sha256"], str(plan.python))
                        / Path(wheel["path"]).name),
                dest=wheel["path"], user="root", group="root", mode="644",
            )  # fmt: skip
        drifted = [line for line in plan.release_drift if line.startswith(f"release {rel.id}:")]
        for line in drifted:
            logger.warning(f"{host.print_prefix}{line}")
        if drifted:
            logger.warning(
                f"{host.print_prefix}release {rel.id} drifted: installed again beside it, the "
                f"drifted one kept as {s.serve_root}/{RELEASES}/{rel.id}{TAMPERED}<UTC time>"
            )
        installed = release(
            name=f"Install release {rel.id} and check it",
            plan_file=plan_file,
            marker=rel.marker,
            installer=f"{plan.lib}/install_release.py",
            drifted=bool(drifted),
        )
    if rel.files:  # serve_files: the files its command lines name, root's, next to its venv
        ensure.directory(plan, f"{rel.path}/{RELEASE_FILES}")
        for f in rel.files:
            dest = f"{rel.path}/{RELEASE_FILES}/{f.name}"
            ensure.upload(plan, f"Ship {f.source} as {f.argv}", f.data, dest)
    if plan.current != rel.id:
        server.shell(
            name=f"Point {s.serve_root}/{CURRENT} at release {rel.id}",
            commands=[command(s.serve_root, "instances.py", "current", s.serve_root, rel.id)],
        )
    return installed
