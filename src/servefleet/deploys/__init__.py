"""The pyinfra layer: ``@deploy`` functions that move a resolved HostPlan onto a host.

All decisions are made in :func:`host_plan` (pure core + one probe of the host), before any
operation is added: bad data stops the whole run there with one line, and no host changes.
On a host, every failure is a failing command (never a Python exception inside an operation),
so it fails that host alone.

Order on each host: SKU check -> driver -> release -> models -> units -> restarts through the
health gate, one instance at a time, the first alone (it compiles) when the cache is cold.
"""

from __future__ import annotations

import json
import re
import shlex
from io import StringIO
from pathlib import Path
from urllib.parse import urlsplit

from pyinfra import host
from pyinfra.api import HiddenValue, deploy
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.operation import OperationMeta
from pyinfra.operations import apt, files, server, systemd
from pyinfra.operations.util import any_changed

from servefleet.data import Settings, settings_from
from servefleet.deploys.operations import HostProbe, current_link, release, secret_file
from servefleet.errors import RecipeError, ServefleetError
from servefleet.hostplan import HF_TOKEN_FILE, SECRETS_DIR, HostPlan, plan_host, resolve_for

REMOTE = Path(__file__).resolve().parent.parent / "remote"
RUNFILE_DIR = "/var/cache/servefleet/driver"

__all__ = ["driver", "host_plan", "models", "serve", "stack"]


def host_plan() -> HostPlan:
    """Validate this host's data, resolve its recipe and probe the host (read-only).

    Raises PyinfraError (one line, the run stops before any change) on bad data or recipe.
    """
    try:
        settings = settings_from(host.data.get)
        spec = resolve_for(settings)
        probe = host.get_fact(
            HostProbe,
            root=settings.root,
            hf_home=settings.hf_home,
            cache_root=settings.cache_root,
            models=tuple(spec.requirements.models),
        )
        plan = plan_host(settings, probe, spec)
        _check_driver_data(plan)
    except RecipeError as e:
        raise PyinfraError(f"servefleet: {host.name}: serve_recipe/serve_selection: {e}") from None
    except ServefleetError as e:
        raise PyinfraError(f"servefleet: {host.name}: {e}") from None
    return plan


def _check_driver_data(plan: HostPlan) -> None:
    s = plan.settings
    if plan.refusal or not plan.driver_needed:
        return
    if not s.driver_runfile_url:
        raise ServefleetError(
            f"driver_runfile_url: not set; needed to install driver {s.driver_version}"
        )
    if s.driver_version not in s.driver_sha256:
        known = ", ".join(sorted(s.driver_sha256)) or "none"
        raise ServefleetError(
            f"driver_sha256: no sha256 for driver {s.driver_version} (known: {known})"
        )


def _refused(plan: HostPlan) -> bool:
    """Fail this host, before anything is installed, when it must not serve this recipe."""
    if plan.refusal is None:
        return False
    message = f"servefleet: {host.name}: {plan.refusal}"
    server.shell(
        name="Check the host's NPU SKU", commands=[f"echo {shlex.quote(message)} >&2; exit 1"]
    )
    return True


def _sh(*words: str) -> str:
    return " ".join(shlex.quote(w) for w in words)


def _driver_ops(plan: HostPlan) -> OperationMeta | None:
    s = plan.settings
    if not plan.driver_needed:
        return None
    version = s.driver_version
    if s.driver_apt_repo:
        repo = s.driver_apt_repo
        keyring = re.search(r"signed-by=([^\s\]]+)", repo["src"])
        changed = []
        if repo.get("key") and keyring:
            changed.append(
                files.put(
                    name="Install the apt repository key",
                    src=repo["key"],
                    dest=keyring.group(1),
                    mode="644",
                )
            )
        changed.append(
            apt.repo(name="Add the apt repository", src=repo["src"], filename="servefleet-driver")
        )
        apt.update(name="Update apt lists", _if=any_changed(*changed))
    packages = [p.format(kernel=plan.kernel) for p in s.driver_apt_packages]
    apt.packages(
        name=f"Install the driver's prerequisites ({', '.join(packages)})",
        packages=packages,
        update=True,
        cache_time=3600,
        no_recommends=True,
    )
    runfile = f"{RUNFILE_DIR}/rebellions-x86_64-{version}.run"
    url = (s.driver_runfile_url or "").format(version=version)  # checked in host_plan
    fetch = (
        f"mkdir -p {RUNFILE_DIR} && python3 -c {shlex.quote(_FETCH)} {_sh(url, runfile + '.part')} && "
        f"echo {shlex.quote(s.driver_sha256[version] + '  ' + runfile + '.part')} | sha256sum --check --strict && "
        f"mv {runfile}.part {runfile}"
    )
    server.shell(name=f"Fetch the driver {version} runfile and check its sha256", commands=[fetch])
    if plan.active_units:
        server.shell(
            name="Stop this host's servers for the driver change",
            commands=["systemctl stop 'servefleet-vllm-*.service'"],
        )
    server.shell(
        name=f"Install driver {version}", commands=[_sh("sh", runfile, *s.driver_installer_args)]
    )
    return server.shell(
        name=f"Check that rbln-smi reports driver {version}",
        commands=[f"python3 -c {shlex.quote(_CHECK_DRIVER)} {shlex.quote(version)}"],
    )


_FETCH = "import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])"
_CHECK_DRIVER = (
    "import json, subprocess, sys; v = json.loads(subprocess.run(['rbln-smi', '-j'], check=True, "
    "capture_output=True, text=True).stdout).get('KMD_version'); "
    "sys.exit(0 if v == sys.argv[1] else f'servefleet: rbln-smi reports driver {v}, wanted {sys.argv[1]}')"
)


def _netrc(s: Settings) -> str:
    hosts = sorted({urlsplit(i.url).hostname or "" for i in s.indexes if i.auth})
    return "".join(f"machine {h} login {s.index_user} password {s.index_password}\n" for h in hosts)


def _secrets_dir(plan: HostPlan) -> None:
    """The 0700 directory secrets pass through and live in, when this host gets any."""
    if plan.release.netrc or plan.settings.hf_token:
        files.directory(name=f"Create {SECRETS_DIR} (0700)", path=SECRETS_DIR, mode="700")


def _stack_ops(plan: HostPlan) -> OperationMeta:
    s, rel = plan.settings, plan.release
    for path in (s.root, plan.lib, f"{s.root}/plans", f"{s.root}/releases"):
        files.directory(name=f"Create {path}", path=path, mode="755")
    files.put(
        name="Upload the release installer",
        src=str(REMOTE / "install_release.py"),
        dest=f"{plan.lib}/install_release.py",
        mode="644",
    )
    plan_file = f"{s.root}/plans/{rel.id}.json"
    files.put(
        name=f"Upload the plan of release {rel.id}",
        src=StringIO(json.dumps(rel.to_json(), indent=1, sort_keys=True) + "\n"),
        dest=plan_file,
        mode="644",
    )
    if rel.netrc:
        secret_file(
            name="Write the index credentials (netrc, 0600)",
            dest=rel.netrc,
            content=HiddenValue(_netrc(s)),
        )
    installed = release(
        name=f"Install release {rel.id} and check it",
        plan_file=plan_file,
        marker=rel.marker,
        installer=f"{plan.lib}/install_release.py",
    )
    current_link(name=f"Point {s.root}/current at release {rel.id}", root=s.root, release_id=rel.id)
    return installed


def _user_ops(s: Settings) -> None:
    server.group(name=f"Create group {s.user}", group=s.user, system=True)
    server.user(
        name=f"Create system user {s.user}",
        user=s.user,
        group=s.user,
        system=True,
        home=s.home,
        create_home=True,
        shell="/usr/sbin/nologin",
    )


def _models_ops(plan: HostPlan) -> None:
    s = plan.settings
    _user_ops(s)
    token = None
    if s.hf_token:
        secret_file(
            name="Write the Hugging Face token (0600)",
            dest=HF_TOKEN_FILE,
            content=HiddenValue(s.hf_token),
        )
        token = HF_TOKEN_FILE
    source = (
        ["--store", s.models_store_url]
        if s.models_store_url
        else ["--hub", f"{plan.release.path}/bin/python"]
    )
    files.put(
        name="Upload the model fetcher",
        src=str(REMOTE / "fetch_model.py"),
        dest=f"{plan.lib}/fetch_model.py",
        mode="644",
    )
    for model in host.loop(plan.missing_models):
        cmd = _sh("python3", f"{plan.lib}/fetch_model.py", model, s.hf_home, s.user, *source)
        if token:
            cmd += " --token-file " + shlex.quote(token)
        server.shell(name=f"Fetch {model} into {s.hf_home}/hub", commands=[cmd])


def _units_ops(plan: HostPlan, triggers: list[OperationMeta]) -> None:
    s = plan.settings
    for path in (s.cache_root, s.hf_home):
        files.directory(name=f"Create {path}", path=path, user=s.user, group=s.user, mode="755")
    files.put(
        name="Upload the health gate",
        src=str(REMOTE / "health.py"),
        dest=f"{plan.lib}/health.py",
        mode="644",
    )
    units = [
        files.put(
            name=f"Write {inst.unit} (port {inst.port}, NPUs {inst.devices})",
            src=StringIO(inst.text),
            dest=f"/etc/systemd/system/{inst.unit}",
            mode="644",
        )
        for inst in plan.instances
    ]
    systemd.daemon_reload(name="Reload systemd", _if=any_changed(*units) if units else None)
    model = plan.spec.requirements.models[0]
    for inst, unit in host.loop(list(zip(plan.instances, units, strict=True))):
        cold = inst.index == 0 and not plan.warm
        gate = [f"{plan.lib}/health.py", inst.unit, str(inst.port), model]
        gate.append(str(s.prewarm_timeout if cold else s.health_timeout))
        if s.host:
            gate += ["--host", s.host]
        if cold:
            gate += ["--warm-marker", plan.warm_marker]
        command = (
            f"systemctl enable --quiet {inst.unit} && systemctl restart {inst.unit} && "
            + _sh("python3", *gate)
        )
        server.shell(
            name=f"{'Pre-warm (compile) with' if cold else 'Restart'} {inst.unit} through the health gate",
            commands=[command],
            _if=any_changed(unit, *triggers) if inst.unit in plan.active_units else None,
        )
    for unit_name in host.loop(plan.stale_units):
        server.shell(
            name=f"Remove {unit_name} (no NPU group for it now)",
            commands=[
                f"systemctl disable --now {unit_name} && rm -f /etc/systemd/system/{unit_name} "
                "&& systemctl daemon-reload"
            ],
        )


@deploy("Driver")
def driver(plan: HostPlan) -> OperationMeta | None:
    """Check the host's SKU, then install the wanted RBLN driver if it is missing or different."""
    if _refused(plan):
        return None
    return _driver_ops(plan)


@deploy("Release")
def stack(plan: HostPlan) -> OperationMeta | None:
    """Check the host's SKU, then install the pinned release the selection needs."""
    if _refused(plan):
        return None
    _secrets_dir(plan)
    return _stack_ops(plan)


@deploy("Models")
def models(plan: HostPlan) -> None:
    """Fetch the model and any draft model into $HF_HOME/hub."""
    if not _refused(plan):
        _secrets_dir(plan)
        _models_ops(plan)


@deploy("servefleet")
def serve(plan: HostPlan) -> None:
    """Fresh host to warm, health-checked vllm serve instances; a re-run changes nothing."""
    if _refused(plan):
        return
    _secrets_dir(plan)
    changed = [op for op in (_driver_ops(plan), _stack_ops(plan)) if op is not None]
    _models_ops(plan)
    _units_ops(plan, changed)
