"""``servefleet init DIR``: an operator's fleet repository that depends on the installed
package, and the deploy files every fleet command runs (``deploy_files``: this repository's own
``deploys/*.py`` are these texts, a unit test holds them equal).

The repository: ``inventories/prod.py`` (groups and a canary) and ``inventories/lab.py``,
``group_data/all.py`` (every key of the key table, commented with its meaning, type, allowed
values and default, generated from the table; the ones a site usually sets first),
``group_data/cr13.py`` and ``group_data/lab.py``, the thin ``deploys/*.py``, ``locks/``,
``monitoring/`` (the monitoring kit: Prometheus rules with the default thresholds, a Grafana
dashboard, a prometheus.yml example; :mod:`servefleet.fleet.monitoring.kit`), a ``.gitignore``
and a short README."""

from __future__ import annotations

import os
import stat

from servefleet.base.errors import DataError

# deploy file -> (its docstring, what it imports from servefleet.entry.deploys, its one call)
DEPLOYS = {
    "serve.py": (
        "Fresh hosts to warm, health-checked `vllm serve` instances; a re-run changes nothing.\n"
        "\npyinfra inventories/lab.py deploys/serve.py\n",
        "host_plan, serve",
        "serve(plan=host_plan())",
    ),
    "driver.py": (
        "Only the RBLN driver (after the SKU check): `pyinfra inventories/prod.py deploys/driver.py`.",
        "driver, host_plan",
        "driver(plan=host_plan())",
    ),
    "stack.py": (
        "Only the pinned Python release (after the SKU check): `pyinfra INVENTORY deploys/stack.py`.",
        "host_plan, stack",
        "stack(plan=host_plan())",
    ),
    "report.py": (
        "Used by `servefleet plan` and `servefleet status`: each host's summary, no operation.",
        "report",
        "report()",
    ),
    "rollback.py": (
        "Back to each host's state before its last good deploy: `servefleet rollback INVENTORY`.",
        "host_settings, rollback",
        "rollback(settings=host_settings())",
    ),
    "restore.py": (
        "Back to each host's last good state (used by `servefleet rollout` for failed hosts).",
        "host_settings, rollback",
        'rollback(settings=host_settings(), to="good")',
    ),
}

# the keys a site usually sets: group_data/all.py lists them first (then every other key)
SITE_KEYS = (
    "driver_version", "driver_runfile_url", "driver_sha256", "sdk_pins", "sdk_lock",
    "pip_indexes", "pip_public_index", "creds_index_user_env", "creds_index_password_env",
    "creds_hf_token_env", "creds_api_key_env", "serve_recipe", "serve_target", "serve_selection",
    "serve_base_port", "serve_host", "serve_shutdown_timeout", "serve_extra_args",
    "serve_extra_env", "serve_prewarm_scope", "serve_prewarm_store", "models_store_url",
    "models_hub_url", "models_revisions", "models_sha256",
)  # fmt: skip


# what a file pyinfra runs says when its pyinfra's Python has no servefleet (#32): one line, the
# file and how to install both, instead of a ModuleNotFoundError traceback
INSTALL_BOTH = "uv tool install --with-executables-from pyinfra servefleet-VERSION-py3-none-any.whl"


def importing(line: str) -> str:
    """``line`` (an import from servefleet) as the fleet's files give it: stopping with one line
    when this pyinfra's Python cannot import servefleet.

    + line: the import statement
    """
    return (
        f"try:\n    {line}\n"
        "except ModuleNotFoundError as e:  # a pyinfra whose Python has no servefleet\n"
        "    raise SystemExit(\n"
        '        f"{__file__}: {e}; run the pyinfra installed with servefleet "\n'
        f'        "({INSTALL_BOTH})"\n'
        "    ) from None\n"
    )


def deploy_file(name: str) -> str:
    """The text of ``deploys/<name>``."""
    doc, names, call = DEPLOYS[name]
    return f'"""{doc}"""\n\n{importing(f"from servefleet.entry.deploys import {names}")}\n{call}\n'


def _all_py() -> str:
    """group_data/all.py: every key of the key table, commented, generated from it
    (:func:`servefleet.fleet.datadoc.key_docs`): the keys a site usually sets first, then the rest
    in the table's order. Uncommented as it is, each line sets the key's default."""
    from servefleet.fleet.datadoc import commented, key_docs

    docs = {doc.name: doc for doc in key_docs()}
    lines = [
        '"""Data for every host: uncomment and set what this site changes. Every key is here,',
        "commented, with its meaning, type, allowed values and default (`servefleet keys [NAME]`",
        "prints the same from the installed package). Per group: group_data/<group>.py; per",
        "host: the inventory's host tuples; per run:",
        '`pyinfra inventories/prod.py deploys/serve.py --data KEY=VALUE`."""',
        "",
        "# --- the keys a site usually sets",
        "",
    ]
    rest = [name for name in docs if name not in SITE_KEYS]
    for i, names in enumerate((SITE_KEYS, rest)):
        if i:
            lines += ["# --- every other key (the defaults usually do)", ""]
        for name in names:
            lines += [*commented(docs[name]), ""]
    return "\n".join(lines)


PROD = '''"""The fleet: hosts by group (their group's group_data applies), and a canary rolled out first.

pyinfra inventories/prod.py deploys/serve.py      # a first install, every host at once
servefleet rollout inventories/prod.py --canary 1  # a change: the first host, then the rest
"""

cr13 = [
    "npu-a1.example.internal",
    "npu-a2.example.internal",
]

# rolled out first: `servefleet rollout inventories/prod.py --canary 1` (the first host of the
# inventory alone), or deployed alone: `pyinfra inventories/prod.py deploys/serve.py --limit canary`
canary = ["npu-a1.example.internal"]
'''
LAB_INVENTORY = f'''"""The local lab fleet (`servefleet lab up`): try every command here before a real fleet."""

{importing("from servefleet.fleet.lab.inventory import lab_inventory")}
globals().update(lab_inventory())
'''
LAB_DATA = f'''"""The lab fleet's own indexes, runfiles and model store (read from the lab state)."""

{importing("from servefleet.fleet.lab.groupdata import lab_group_data")}
globals().update(lab_group_data())
'''
CR13 = '''"""Hosts with RBLN-CR13 NPUs."""

serve_recipe = "rbln/gpt-oss-120b"
'''
README = """# Our servefleet fleet

- `servefleet lab up && pyinfra -y inventories/lab.py deploys/serve.py`: the lab, locally.
- `servefleet plan inventories/prod.py`, then `servefleet rollout inventories/prod.py`.
- Set `sdk_lock = "locks/prod"` in group_data/all.py, then `servefleet lock inventories/prod.py`
  (or `servefleet lock inventories/prod.py --lock-dir locks/prod`) and commit `locks/prod`:
  every host installs the same bytes; `servefleet lock inventories/prod.py --check` in CI.
- `servefleet keys` lists every data key; `servefleet keys serve_target` explains one.
- `servefleet status inventories/prod.py --prometheus /etc/prometheus/servefleet.json`
  (from cron on the Prometheus host: the file_sd file monitoring/prometheus.yml reads);
  monitoring/ holds Prometheus rules, a Grafana dashboard and a prometheus.yml example
  (monitoring/README.md).
"""


def files() -> dict[str, str]:
    """Every file of a new fleet repository: relative path -> text."""
    from servefleet.fleet.monitoring.kit import kit_files

    out = {f"deploys/{name}": deploy_file(name) for name in DEPLOYS}
    out.update({
        "inventories/prod.py": PROD,
        "inventories/lab.py": LAB_INVENTORY,
        "group_data/all.py": _all_py(),
        "group_data/cr13.py": CR13,
        "group_data/lab.py": LAB_DATA,
        "locks/README.md": "One lock directory per fleet "
        "(`servefleet lock inventories/prod.py --lock-dir locks/prod`).\n",
        ".gitignore": ".venv/\n__pycache__/\npyinfra-debug.log\n",  # pyinfra writes it here
        "README.md": README,
        **kit_files(),
    })  # fmt: skip
    return out


def init(directory: str) -> list[str]:
    """Write a new fleet repository into ``directory`` (made if missing); refuses, before
    writing anything, when any of its files exists or any of its directories is a link (or not a
    directory). Returns the files written.

    Nothing is followed below ``directory`` (#31 finding 6): each directory is made and opened
    relative to its parent's descriptor with ``O_NOFOLLOW``, each file created with
    ``O_CREAT | O_EXCL | O_NOFOLLOW``, so a link or a file that appears after the check is never
    written through."""
    wanted = files()
    tops = ", ".join(sorted({p.split("/")[0] for p in wanted}))
    if not directory:
        raise DataError("init: the directory is an empty string; allowed: a directory path")
    if os.path.lexists(directory) and not os.path.isdir(directory):
        raise DataError(
            f"{directory}: not a directory; allowed: a directory (made when missing) without the "
            f"scaffold's files ({tops})"
        )
    there = sorted(p for p in wanted if os.path.lexists(os.path.join(directory, p)))
    if there:
        raise DataError(
            f"{directory}: {there[0]} exists; allowed: a directory without the scaffold's files "
            f"({tops})"
        )
    for here in sorted({rel.rpartition("/")[0] for rel in wanted} - {""}):
        if os.path.lexists(os.path.join(directory, here)):
            if not stat.S_ISDIR(os.lstat(os.path.join(directory, here)).st_mode):
                raise _not_a_directory(directory, here, tops)
    try:
        os.makedirs(directory, exist_ok=True)  # the operator's own path
        top = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise DataError(
            f"{directory}: cannot be made ({e.strerror}); allowed: a directory this user can "
            f"write, without the scaffold's files ({tops})"
        ) from None
    dirs: dict[str, int] = {"": top}
    try:
        for rel in wanted:  # every directory first: a link among them stops before any write
            _open_parents(directory, rel, dirs, tops)
        for rel, text in wanted.items():
            parent, _, name = rel.rpartition("/")
            _create(directory, rel, dirs[parent], name, text, tops)
    except OSError as e:  # a directory this user cannot write, a full disk
        raise DataError(
            f"{directory}: cannot be written ({e.strerror}); allowed: a directory this user can "
            f"write, without the scaffold's files ({tops})"
        ) from None
    finally:
        for fd in dirs.values():
            os.close(fd)
    return sorted(wanted)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_parents(directory: str, rel: str, dirs: dict[str, int], tops: str) -> None:
    """The directories of ``rel`` made (when missing) and opened into ``dirs`` (by their path
    below ``directory``), each relative to its parent, none of them followed."""
    parts = rel.split("/")[:-1]
    for i, part in enumerate(parts):
        here = "/".join(parts[: i + 1])
        if here in dirs:
            continue
        parent = dirs["/".join(parts[:i])]
        try:
            os.mkdir(part, 0o777, dir_fd=parent)
        except FileExistsError:
            pass
        try:
            dirs[here] = os.open(part, _DIR_FLAGS, dir_fd=parent)
        except OSError:
            raise _not_a_directory(directory, here, tops) from None


def _not_a_directory(directory: str, here: str, tops: str) -> DataError:
    return DataError(
        f"{directory}: {here} is a link or not a directory; allowed: a directory without the "
        f"scaffold's files ({tops}), none of them a link"
    )


def _create(directory: str, rel: str, parent: int, name: str, text: str, tops: str) -> None:
    """``name`` in the directory ``parent``, a new file (never one that is there, nor a link)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, 0o666, dir_fd=parent)
    except FileExistsError:
        raise DataError(
            f"{directory}: {rel} exists; allowed: a directory without the scaffold's files ({tops})"
        ) from None
    with os.fdopen(fd, "w") as f:
        f.write(text)
