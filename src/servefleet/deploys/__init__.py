"""The pyinfra layer: ``@deploy`` functions that move a resolved HostPlan onto a host.

All decisions are made in :func:`host_plan` (pure core + one probe of the host), before any
operation is added: bad data stops the whole run there with one line, and no host changes.
On a host, every failure is a failing command (never a Python exception inside an operation),
so it fails that host alone.

Order on each host: SKU check -> driver -> release -> models -> units -> restarts through the
health gate, one instance at a time, the first alone (it compiles) when the cache is cold.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import re
import shlex
import weakref
from collections.abc import Callable, Iterable
from io import BytesIO, StringIO
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.operation import OperationMeta
from pyinfra.operations import apt, files, server
from pyinfra.operations.util import any_changed

from servefleet.builds import build, cache_dir, sdist_only
from servefleet.deploys.operations import (
    HostProbe,
    InstanceHealth,
    WheelhouseFiles,
    current_link,
    prewarm_pull,
    prewarm_push,
    put_secret,
    release,
    wheelhouse_copy,
)
from servefleet.errors import RecipeError, ServefleetError
from servefleet.hostplan import (
    HF_TOKEN_FILE,
    NOLOGIN,
    REMOTE_SCRIPTS,
    SECRETS_DIR,
    HostPlan,
    plan_host,
    probe_args,
    resolve_for,
    wheelhouse_copies,
)
from servefleet.lock import LockError, Stack, resolve
from servefleet.prewarm_store import Store, WarmEntry, prewarm_roles
from servefleet.release import with_locked_models
from servefleet.settings import DEFAULTS, Settings, settings_from
from servefleet.uvbin import uv_binary

REMOTE = Path(__file__).resolve().parent.parent / "remote"
RUNFILE_DIR = "/var/cache/servefleet/driver"

__all__ = ["driver", "host_plan", "host_settings", "report", "models", "rollback", "serve", "stack"]


def host_settings() -> Settings:
    """This host's validated data; PyinfraError (one line, nothing changes) when it is bad."""
    try:
        return settings_from(host.data.get, keys=host.data.dict().keys())
    except ServefleetError as e:
        raise PyinfraError(f"servefleet: {host.name}: {e}") from None


def host_plan(files: bool = False) -> HostPlan:
    """Validate this host's data, resolve its recipe and probe the host (read-only).

    Raises PyinfraError (one line, the run stops before any change) on bad data or recipe.

    + files: also read the file hashes the serving release was installed with (``plan``)
    """
    try:
        settings = with_locked_models(host_settings())
        spec = resolve_for(settings)
        probe = host.get_fact(HostProbe, args=probe_args(settings, spec, files))
        plan = plan_host(settings, probe, spec, builder=host.name == settings.serve_prewarm_host)
        _check_driver_data(plan)
        plan = _with_wheelhouse(_with_built_wheels(plan))
    except RecipeError as e:
        raise PyinfraError(f"servefleet: {host.name}: serve_recipe/serve_selection: {e}") from None
    except ServefleetError as e:
        raise PyinfraError(f"servefleet: {host.name}: {e}") from None
    return plan


@functools.lru_cache(maxsize=16)
def _resolved(st: Stack, user: str | None, password: str | None) -> str:
    return resolve(st, user, password)


def _with_built_wheels(plan: HostPlan) -> HostPlan:
    """The plan with the wheels of its release's sdist-only packages, built once on the
    controller (the host installs them and never compiles). Only when the release is to be
    installed: unlocked, the controller resolves the stack to learn which packages those are."""
    rel, s = plan.release, plan.settings
    if plan.release_complete or plan.refusal or rel.stack is None:
        return plan
    if rel.pylock:
        pylock = rel.pylock
    else:
        try:
            pylock = _resolved(rel.stack, s.index_user, s.index_password)
        except LockError as e:  # the host may reach indexes the controller does not
            logger.warning(f"{host.print_prefix}cannot resolve release {rel.id} on the "
                           f"controller ({e}); a package with only an sdist will fail the "
                           "host's install (hosts never build)")  # fmt: skip
            return plan
    sdists = sdist_only(pylock)
    if not sdists:
        return plan
    if not plan.python:
        raise ServefleetError(f"sdk_python: {s.sdk_python} does not run on the host")
    built = []
    for package in sdists:
        wheel = build(package, plan.python, rel.stack, Path(s.sdk_wheel_cache), s.index_user,
                      s.index_password)  # fmt: skip
        how = (
            "built on the controller"
            if wheel.fresh
            else "built before, from the controller's cache"
        )
        logger.info(f"{host.print_prefix}{wheel.name}=={wheel.version} for Python {plan.python}: "
                    f"{wheel.path.name} ({how})")  # fmt: skip
        built.append(wheel.to_json(f"{plan.lib}/wheels"))
    return dataclasses.replace(plan, release=dataclasses.replace(rel, built=tuple(built)))


def _with_wheelhouse(plan: HostPlan) -> HostPlan:
    """sdk_source wheelhouse: the files this run needs, and which of them the host lacks (one
    more read of the host, and only when some step needs a file)."""
    copies = wheelhouse_copies(plan)
    if not copies:
        return plan
    wanted = json.dumps({c.dest: c.sha256 for c in copies}, sort_keys=True)
    have = set(host.get_fact(WheelhouseFiles, files=wanted))
    missing = frozenset(c.dest for c in copies if c.dest not in have)
    return dataclasses.replace(plan, wheelhouse=tuple(copies), wheelhouse_missing=missing)


def _wheelhouse_ops(plan: HostPlan, kinds: Iterable[str]) -> None:
    """Copy the wheelhouse files that these steps need and the host lacks (a re-run: none)."""
    todo = [c for c in plan.wheelhouse if c.kind in kinds and c.dest in plan.wheelhouse_missing]
    if todo:
        size = sum(c.size for c in todo)
        wheelhouse_copy(
            name=f"Copy {len(todo)} wheelhouse file(s) ({size} bytes) to "
            f"{plan.settings.serve_root}/wheelhouse, each checked by sha256",
            copies=todo,
        )


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
        name="Check the host's accelerators", commands=[f"echo {shlex.quote(message)} >&2; exit 1"]
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
    copy = plan.from_wheelhouse("driver", version)
    apt.packages(  # from a wheelhouse the host may reach no mirror: its lists are not refreshed
        name=f"Install the driver's prerequisites ({', '.join(packages)})",
        packages=packages,
        update=copy is None,
        cache_time=3600,
        no_recommends=True,
    )
    runfile = f"{RUNFILE_DIR}/rebellions-x86_64-{version}.run"
    url = (s.driver_runfile_url or "").format(version=version)  # checked in host_plan
    part = runfile + ".part"
    get = (
        _sh("cp", copy.dest, part) if copy else f"python3 -c {shlex.quote(_FETCH)} {_sh(url, part)}"
    )
    fetch = (
        f"{_sh('mkdir', '-p', RUNFILE_DIR)} && {get} && "
        f"echo {shlex.quote(s.driver_sha256[version] + '  ' + part)} | sha256sum --check --strict && "
        f"{_sh('mv', part, runfile)}"
    )
    server.shell(
        name=f"{'Take' if copy else 'Fetch'} the driver {version} runfile"
        f"{' from the wheelhouse' if copy else ''} and check its sha256",
        commands=[fetch],
        _retries=2,
        _retry_delay=3,
    )
    if plan.active_units:
        server.shell(
            name="Stop this host's servers for the driver change",
            commands=["systemctl stop 'servefleet-vllm-*.service'"],
        )
    # A failed install shows the installer's log tail and brings back what served before.
    log = f"{RUNFILE_DIR}/install-{version}.log"
    restore = _sh("python3", f"{plan.lib}/instances.py", "restore", plan.state_dir)
    server.shell(
        name=f"Install driver {version}",
        commands=[
            f"{_sh('sh', runfile, *s.driver_installer_args)} >{shlex.quote(log)} 2>&1 || "
            f"{{ rc=$?; echo {shlex.quote(f'servefleet: driver {version} installer failed; its log ({log}) ends:')} >&2; "
            f"tail -n 25 {shlex.quote(log)} >&2; {restore} >&2; exit $rc; }}"
        ],
    )
    server.shell(
        name=f"Check that rbln-smi reports driver {version}",
        commands=[f"python3 -c {shlex.quote(_CHECK_DRIVER)} {shlex.quote(version)}"],
    )
    return server.shell(
        name="Bring back the servers of the last good state through the health gate",
        commands=[restore],
    )


_FETCH = "import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])"
_CHECK_DRIVER = (
    "import json, subprocess, sys; v = json.loads(subprocess.run(['rbln-smi', '-j'], check=True, "
    "capture_output=True, text=True).stdout).get('KMD_version'); "
    "sys.exit(0 if v == sys.argv[1] else f'servefleet: rbln-smi reports driver {v}, wanted {sys.argv[1]}')"
)


def _netrc_token(value: str) -> str:
    """A netrc token that netrc readers (Python's, hence pip's) give back exactly."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _netrc(s: Settings) -> str:
    hosts = sorted({urlsplit(i.url).hostname or "" for i in s.pip_indexes if i.auth})
    user, password = _netrc_token(s.index_user or ""), _netrc_token(s.index_password or "")
    return "".join(f"machine {h} login {user} password {password}\n" for h in hosts)


# Every operation below is added only when the probe found its target differing, so a run with
# nothing to change costs one remote command per host (the probe).


def _directory(plan: HostPlan, path: str, mode: str = "755", user: str = "root") -> None:
    if not plan.has(path, "dir", mode, user):
        files.directory(name=f"Create {path} ({mode})", path=path, user=user, group=user, mode=mode)


def _put(plan: HostPlan, name: str, data: bytes, dest: str) -> None:
    if not plan.has(dest, "file", "644", sha256=hashlib.sha256(data).hexdigest()):
        files.put(name=name, src=BytesIO(data), dest=dest, user="root", group="root", mode="644")


def _secret(plan: HostPlan, name: str, dest: str, secret: str) -> None:
    line = secret if secret.endswith("\n") else secret + "\n"
    if not plan.has(dest, "file", "600", sha256=hashlib.sha256(line.encode()).hexdigest()):
        put_secret(name=name, dest=dest, secret=line)


def _secrets_dir(plan: HostPlan) -> None:
    """The 0700 directory secrets pass through and live in, when this host gets any."""
    if plan.release.netrc or _hf_token(plan):
        _directory(plan, SECRETS_DIR, mode="700")


def _hf_token(plan: HostPlan) -> str | None:
    """The token hosts fetch models with (none from a wheelhouse: the copy is local)."""
    s = plan.settings
    return s.hf_token if s.sdk_source != "wheelhouse" else None


def _lib_ops(plan: HostPlan) -> None:
    """serve_root's directories and the host-side scripts (root-owned, never the serve user's)."""
    s = plan.settings
    for path in (s.serve_root, plan.lib, f"{s.serve_root}/plans", f"{s.serve_root}/releases", plan.state_dir):
        _directory(plan, path)
    for script in REMOTE_SCRIPTS:
        _put(plan, f"Upload {script}", (REMOTE / script).read_bytes(), f"{plan.lib}/{script}")
    uv = plan.release.uv
    found = plan.paths.get(uv or "") or {}
    if uv and (found.get("type"), found.get("mode"), found.get("user")) != ("file", "755", "root"):
        files.put(
            name=f"Upload uv {uv.rsplit('-', 1)[-1]} (the release installer)",
            src=str(uv_binary()),
            dest=uv,
            user="root",
            group="root",
            mode="755",
        )


def _stack_ops(plan: HostPlan) -> OperationMeta | None:
    s, rel = plan.settings, plan.release
    if not rel.locked:
        logger.warning(
            f"{host.print_prefix}release {rel.id} is unlocked (sdk_lock not set): packages "
            "beyond the pins, and every file's hash, are what the indexes serve at install time"
        )
    plan_file = f"{s.serve_root}/plans/{rel.id}.json"
    plan_json = json.dumps(rel.to_json(), indent=1, sort_keys=True) + "\n"
    _put(plan, f"Upload the plan of release {rel.id}", plan_json.encode(), plan_file)
    if rel.netrc:
        _secret(plan, "Write the index credentials (netrc, 0600)", rel.netrc, _netrc(s))
    installed = None
    if not plan.release_complete:
        if rel.built:
            _directory(plan, f"{plan.lib}/wheels")
        for wheel in rel.built:
            files.put(
                name=f"Upload the {wheel['name']} {wheel['version']} wheel the controller built",
                src=str(cache_dir(s.sdk_wheel_cache, wheel["sdist_sha256"], str(plan.python))
                        / Path(wheel["path"]).name),
                dest=wheel["path"], user="root", group="root", mode="644",
            )  # fmt: skip
        installed = release(
            name=f"Install release {rel.id} and check it",
            plan_file=plan_file,
            marker=rel.marker,
            installer=f"{plan.lib}/install_release.py",
        )
    if plan.current != rel.id:
        current_link(
            name=f"Point {s.serve_root}/current at release {rel.id}", root=s.serve_root, release_id=rel.id
        )
    return installed


def _user_ops(plan: HostPlan) -> None:
    s = plan.settings
    if plan.account_ok:
        return
    server.group(name=f"Create group {s.serve_user}", group=s.serve_user, system=True)
    server.user(
        name=f"Create system user {s.serve_user}",
        user=s.serve_user,
        group=s.serve_user,
        system=True,
        home=s.serve_home,
        create_home=True,
        shell=NOLOGIN,
    )


def _models_ops(plan: HostPlan) -> None:
    s = plan.settings
    _user_ops(plan)
    token = []
    hf_token = _hf_token(plan)
    if hf_token:
        _secret(plan, "Write the Hugging Face token (0600)", HF_TOKEN_FILE, hf_token)
        token = ["--token-file", HF_TOKEN_FILE]
    for model in host.loop(plan.missing_models):
        copy = plan.from_wheelhouse("models", model)
        source = (
            ["--archive", copy.dest]
            if copy
            else ["--store", s.models_store_url]
            if s.models_store_url
            else ["--hub", f"{plan.release.path}/bin/python"]
        )
        pins = []
        if model in s.models_revisions:
            pins += ["--revision", s.models_revisions[model]]
        sha256 = s.models_sha256.get(model) or (copy.sha256 if copy else None)
        if sha256:
            pins += ["--sha256", sha256]
        cmd = _sh(
            "python3", f"{plan.lib}/fetch_model.py", model, s.models_hf_home, s.serve_user, *source,
            *token, "--token-env", str(host.data.get("creds_hf_token_env")), *pins,
        )  # fmt: skip
        server.shell(
            name=f"{'Unpack' if copy else 'Fetch'} {model} into {s.models_hf_home}/hub",
            commands=[cmd],
            _retries=2,
            _retry_delay=5,
        )


def _cache_dirs(plan: HostPlan) -> None:
    s = plan.settings
    for path in (s.serve_cache_root, s.models_hf_home):
        _directory(plan, path, user=s.serve_user)


def _upload_desired(
    plan: HostPlan, filename: str, what: str, when: Callable[[], bool] | None
) -> str:
    """Upload the host's desired state (unit texts included) to ``state/<filename>``."""
    dest = f"{plan.state_dir}/{filename}"
    files.put(
        _if=when,
        name=f"Upload {what}",
        src=StringIO(json.dumps(plan.desired_state(), indent=1, sort_keys=True) + "\n"),
        dest=dest,
        mode="644",
    )
    return dest


def _units_ops(plan: HostPlan, when: Callable[[], bool] | None = None) -> None:
    """One converge of the unit files and the running instances, unless every instance already
    runs its unit (judged from the processes in the probe, never from what a run wrote).

    + when: run only if this is true at run time (fleet pre-warm: the seed converges first)
    """
    if plan.converged:
        return
    desired = _upload_desired(
        plan, "desired.json", "the desired state of this host's instances", when
    )
    pending = [i for i in plan.instances if not (i.converged and i.written)]
    word = plan.platform.device_word
    what = [f"{i.unit} (port {i.port}, {word} {i.devices})" for i in pending]
    what += [f"remove {u}" for u in plan.stale_units]
    server.shell(
        _if=when,
        name=f"Converge the instances through the health gate: {', '.join(what) or 'pre-warm'}",
        commands=[_sh("python3", f"{plan.lib}/instances.py", "converge", desired)],
    )


# Fleet pre-warm (serve_prewarm_scope = "fleet"). Deploy code runs for all hosts at once, so the
# hosts of a run register here while planning, and each pre-warm operation checks its host's role
# when it runs (``_if``), once every host is known: see prewarm_roles for who compiles.
_ENTRIES: weakref.WeakKeyDictionary[Any, dict[str, WarmEntry]] = weakref.WeakKeyDictionary()
_ROLES: weakref.WeakKeyDictionary[Any, dict[str, str]] = weakref.WeakKeyDictionary()


def warm_entry(plan: HostPlan) -> WarmEntry:
    s, fingerprint = plan.settings, plan.spec.compile_fingerprint
    fleet = s.serve_prewarm_scope == "fleet" and bool(fingerprint)
    return WarmEntry(
        host=host.name,
        fingerprint=fingerprint,
        fleet=fleet,
        warm=plan.warm,
        kept=fleet and Store(s.serve_prewarm_store).has(fingerprint or ""),
        builder=plan.builder,
    )


def _role_is(*wanted: str) -> Callable[[], bool]:
    """An ``_if`` for this host: true when, at run time, its pre-warm role is one of ``wanted``."""
    state, name = host.state, host.name

    def check() -> bool:
        roles = _ROLES.get(state)
        if roles is None:
            entries = _ENTRIES.get(state, {})
            order = [entries[h.name] for h in state.inventory if h.name in entries]
            roles = _ROLES[state] = prewarm_roles(order)
        return roles.get(name) in wanted

    return check


def _copy_args(plan: HostPlan) -> dict[str, Any]:
    """Where a fingerprint's cache is on the host and in the controller's store."""
    s = plan.settings
    return dict(
        fingerprint=plan.spec.compile_fingerprint or "",
        cache_root=s.serve_cache_root,
        lib=plan.lib,
        store=s.serve_prewarm_store,
    )


def _build_ops(plan: HostPlan, when: Callable[[], bool]) -> None:
    """The build host: compile only (no NPU), then hand the cache to the store."""
    if plan.warm:
        return
    desired = _upload_desired(plan, "prewarm.json", "the instance to compile", when)
    sku = plan.hardware.skus[0]
    server.shell(
        _if=when,
        name=f"Compile {plan.spec.compile_fingerprint} for {sku} (compile only, no NPU)",
        commands=[_sh("python3", f"{plan.lib}/prewarm.py", "build", desired, sku)],
    )


@deploy("Driver", data_defaults=DEFAULTS)
def driver(plan: HostPlan) -> OperationMeta | None:
    """Check the host's SKU, then install the wanted RBLN driver if it is missing or different;
    the servers of the host's last good state come back through the health gate."""
    if _refused(plan):
        return None
    _lib_ops(plan)
    _wheelhouse_ops(plan, ["driver"])
    return _driver_ops(plan)


@deploy("Release", data_defaults=DEFAULTS)
def stack(plan: HostPlan) -> OperationMeta | None:
    """Check the host's SKU, then install the pinned release the selection needs. Running
    servers keep their release: units name it, and no release a unit or state names is removed."""
    if _refused(plan):
        return None
    _lib_ops(plan)
    _secrets_dir(plan)
    _wheelhouse_ops(plan, ["release"])
    return _stack_ops(plan)


@deploy("Models", data_defaults=DEFAULTS)
def models(plan: HostPlan) -> None:
    """Fetch the model and any draft model into $HF_HOME/hub."""
    if not _refused(plan):
        _lib_ops(plan)
        _secrets_dir(plan)
        _wheelhouse_ops(plan, ["models"])
        _models_ops(plan)


@deploy("servefleet", data_defaults=DEFAULTS)
def serve(plan: HostPlan) -> None:
    """Fresh host to warm, health-checked vllm serve instances; a re-run changes nothing."""
    if _refused(plan):
        return
    _lib_ops(plan)
    _secrets_dir(plan)
    _wheelhouse_ops(plan, ["driver", "release", "models"])
    _driver_ops(plan)
    _stack_ops(plan)
    _models_ops(plan)
    _cache_dirs(plan)
    entry = warm_entry(plan)
    if not entry.fleet:
        _units_ops(plan)
        return
    _ENTRIES.setdefault(host.state, {})[host.name] = entry
    # pyinfra runs each operation on every host before the next, so the order of these lines is
    # the fleet's: the seed or build host compiles, its cache goes to the store, the others get
    # the copy, then they converge (warm). Each runs only where the host's role says, at run time.
    if not plan.warm:
        _units_ops(plan, when=_role_is("seed"))
        if plan.builder:
            _build_ops(plan, when=_role_is("build"))
    fp = plan.spec.compile_fingerprint
    if not entry.kept:
        prewarm_pull(
            _if=_role_is("seed", "source", "build"),
            name=f"Keep the compile cache of {fp} on the controller",
            **_copy_args(plan),
        )
    if not plan.warm and not plan.builder:
        prewarm_push(
            _if=_role_is("copy"),
            name=f"Copy the fleet's compile cache of {fp} to this host",
            user=plan.settings.serve_user,
            **_copy_args(plan),
        )
    if not plan.builder:
        _units_ops(plan, when=_role_is("host", "warm", "source", "copy"))


@deploy("Rollback", data_defaults=DEFAULTS)
def rollback(settings: Settings, to: str = "previous") -> None:
    """Back to a kept state through the health gate: ``previous`` (the state before the last
    good one) or ``good`` (the last good one, e.g. after a failed change). Needs no recipe:
    everything comes from the host's kept states.

    + to: "previous" or "good"
    """
    command = "rollback" if to == "previous" else "restore"
    server.shell(
        name=f"Roll back to the {to} state",
        commands=[_sh("python3", f"{settings.serve_root}/lib/instances.py", command,
                      f"{settings.serve_root}/state")],
    )  # fmt: skip


def _changed_on_index(plan: HostPlan) -> dict[str, Any]:
    """Unlocked and serving its release: what the indexes now serve under the same versions but
    with other bytes than the release was installed with (resolved on the controller)."""
    from servefleet.lock import LockError, changed_on_index

    rel, s = plan.release, plan.settings
    if rel.locked or rel.stack is None or plan.current != rel.id or not plan.current_files:
        return {}
    try:
        resolved = _resolved(rel.stack, s.index_user, s.index_password)
        return changed_on_index(plan.current_files, resolved)
    except LockError as e:
        logger.warning(f"{host.print_prefix}plan: cannot compare with the indexes: {e}")
        return {}


REPORT_DIR_ENV = "SERVEFLEET_REPORT_DIR"  # where report() writes <host>.json
REPORT_ENV = "SERVEFLEET_REPORT"  # "plan" or "status"


def report() -> None:
    """``servefleet plan`` / ``status``: this host's summary from the deploy's own plan, written
    on the controller to $SERVEFLEET_REPORT_DIR/<host>.json. Adds no operation: changes nothing."""
    import os

    from servefleet.fleetview import plan_summary, status_summary

    kind = os.environ.get(REPORT_ENV)
    plan = host_plan(files=kind == "plan")
    if kind == "status":
        ports = tuple(i.port for i in plan.instances)
        health = host.get_fact(InstanceHealth, ports=ports) if ports else {}
        address = str(host.data.get("ssh_hostname") or host.name)
        summary = status_summary(plan, health, address)
    else:
        order = [h.name for h in host.state.inventory].index(host.name)
        summary = plan_summary(plan, warm_entry(plan), order, _changed_on_index(plan))
    out = Path(os.environ[REPORT_DIR_ENV]) / f"{host.name}.json"
    out.write_text(json.dumps(summary, sort_keys=True))
