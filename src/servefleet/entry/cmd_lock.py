"""``lock`` (every stack the data selects, resolved into the lock directory, or checked against
it) and ``wheelhouse`` (every file of a lock downloaded into a directory, for offline hosts)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click

from servefleet.base.exitcodes import Exit
from servefleet.entry import common


@click.command("lock")
@click.argument("inventory", shell_complete=common.complete_inventory)
@click.option("--check", is_flag=True, help="Only compare the lock with the data (offline).")
@click.option("--lock-dir", default=None, help="The lock directory (default: the data's sdk_lock).")
@common.fleet_options
@click.option(
    "--json", "as_json", is_flag=True,
    help="On stdout: the lock directory, each stack's release and packages, the models, the "
    "files (with --check: whether it matches, and what differs).",
)  # fmt: skip
@click.option(
    "--move-uv", is_flag=True,
    help="Pin the controller's uv for the hosts (default: keep the uv the lock pins).",
)  # fmt: skip
def lock_cmd(
    inventory: str, check: bool, lock_dir: str | None, limits: tuple[str, ...],
    data: tuple[str, ...], selection: tuple[str, ...], as_json: bool, move_uv: bool,
) -> None:  # fmt: skip
    """Resolve every stack the inventory's data selects (every package with its version, index
    and file sha256s; the driver runfile; the models' revisions) into the lock directory.
    With --check, exit 1 naming what no longer matches the data. The hosts keep the uv the
    lock pins: the controller's uv re-locks only when it resolves each unchanged stack the
    same, and --move-uv pins the controller's uv instead. --limit, --data and --selection pick
    the hosts and set their data as the same options of plan and rollout do: lock what you will
    roll out.

    Example:

        servefleet lock inventories/prod.py && git diff locks/
    """
    from servefleet.fleet.lockfleet import check_lock, fleet_lock, make_lock
    from servefleet.settings.across import NO_INDEX

    # --check reads only the lock and the data: no index, so no index credentials
    environ = {**os.environ, NO_INDEX: "1"} if check else None
    fl = fleet_lock(inventory, _overrides(data, selection), lock_dir, environ, limits)
    if not check:
        progress = (lambda m: click.echo(m, err=True)) if common.shows_progress() else None
        make_lock(fl, (lambda m: click.echo(m, err=True)) if as_json else click.echo, move_uv,
                  progress)  # fmt: skip
        if as_json:
            common.echo_json(lock_summary(fl.lock_dir))
        return
    problems = check_lock(fl)
    for line in problems:
        click.echo(f"servefleet: lock: {line}", err=True)
    if as_json:
        common.echo_json({"lock_dir": str(fl.lock_dir), "matches": not problems,
                    "stacks": len(fl.stacks), "differences": problems})  # fmt: skip
    if problems:
        sys.exit(Exit.FAILED)
    if not as_json:
        click.echo(f"{fl.lock_dir}: matches the data ({len(fl.stacks)} stack(s))")


def lock_summary(lock_dir: str | Path) -> dict[str, Any]:
    """What ``lock --json`` prints of a lock directory just written: each stack's release id,
    pylock file and packages (name -> version), the driver runfiles, the models and the files.

    + lock_dir: the lock directory
    """
    from servefleet.release.lock import load_lock
    from servefleet.release.pylock import packages

    lock = load_lock(lock_dir)
    stacks = {
        name: {
            "release": st.release,
            "pylock": st.pylock_file,
            "packages": {p["name"]: p["version"] for p in packages(st.pylock)},
        }
        for name, st in sorted(lock.stacks.items())
    }
    return {"lock_dir": str(lock.path), "stacks": stacks, "driver": lock.driver,
            "models": lock.models, "files": lock.files}  # fmt: skip


def _overrides(data: tuple[str, ...], selection: tuple[str, ...] = ()) -> dict[str, Any]:
    """The command's ``--data`` and ``--selection`` as data over every host
    (:func:`servefleet.fleet.inventory.command_overrides`)."""
    from servefleet.fleet.inventory import command_overrides

    return command_overrides(data, selection)


@click.command("wheelhouse")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option(
    "--inventory",
    default=None,
    help="Take sdk_lock and the credentials' variable names from this inventory's data.",
    shell_complete=common.complete_inventory,
)
@click.option("--lock-dir", default=None, help="The lock directory (default: the data's sdk_lock).")
@common.fleet_options
@click.option(
    "--json", "as_json", is_flag=True,
    help="On stdout: the files downloaded, already there and failed, the bytes, the models "
    "left out.",
)  # fmt: skip
def wheelhouse_cmd(
    directory: str,
    inventory: str | None,
    lock_dir: str | None,
    limits: tuple[str, ...],
    data: tuple[str, ...],
    selection: tuple[str, ...],
    as_json: bool,
) -> None:
    """Download every file of a lock into DIRECTORY: each stack's wheels and sdists, the driver
    runfiles, the model archives, each checked against the lock's sha256 (a file that differs
    is named with both hashes and not kept; exit 1). Files already there with the right sha256
    are not downloaded again; on a terminal a progress bar counts the files as they arrive.
    Deploy from it with sdk_source=wheelhouse, sdk_wheelhouse=DIRECTORY. --limit, --data and
    --selection apply to --inventory's hosts, as in every fleet command.

    Credentials come from the variables the data's creds_*_env name (the defaults' without
    --inventory) and go only to the origins that data names: the index's to its pip_indexes
    with auth, the token to models_store_url and models_hub_url, never to a URL of the lock.

    Example:

        servefleet wheelhouse /srv/wheelhouse --inventory inventories/prod.py
    """
    from dataclasses import replace

    from servefleet.release.lock import load_lock
    from servefleet.release.wheelhouse import credentials, fill, lock_files
    from servefleet.settings.table import DEFAULTS, default_settings

    if (limits or data or selection) and not inventory:
        raise click.UsageError("--limit, --data and --selection: give --inventory too")
    if inventory:
        from servefleet.fleet.lockfleet import lock_settings

        where, s = lock_settings(inventory, _overrides(data, selection), lock_dir, limits)
    elif lock_dir:
        where = Path(lock_dir)

        def secret(name: str) -> str | None:  # from the variable the defaults' creds_*_env name
            return os.environ.get(str(DEFAULTS[f"creds_{name}_env"])) or None

        s = replace(default_settings(), index_user=secret("index_user"),
                    index_password=secret("index_password"), hf_token=secret("hf_token"))  # fmt: skip
    else:
        raise click.UsageError("give --inventory (its data's sdk_lock) or --lock-dir")
    creds = credentials(s)
    files, hub = lock_files(load_lock(where))
    say = (lambda m: click.echo(m, err=True)) if as_json else click.echo
    for model in hub:
        say(f"model {model}: from the hub in the lock (no store archive); not included")

    def bar(count: int) -> Any:
        return click.progressbar(
            length=count, label=f"downloading {count} file(s)", file=sys.stderr
        )

    done = fill(directory, files, creds, say, progress=bar if common.shows_progress() else None)
    for line in done.failed:
        click.echo(f"servefleet: wheelhouse: {line}", err=True)
    if as_json:
        common.echo_json({"directory": directory, "downloaded": done.downloaded,
                    "present": done.present, "failed": done.failed, "bytes": done.bytes,
                    "not_included": list(hub)})  # fmt: skip
    else:
        click.echo(
            f"{directory}: {len(done.downloaded)} downloaded ({done.bytes} bytes), "
            f"{len(done.present)} already there, {len(done.failed)} failed"
        )
    if done.failed:
        sys.exit(Exit.FAILED)
