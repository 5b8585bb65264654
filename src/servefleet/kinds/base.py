"""The Kind interface: everything that differs by recipe family and hardware, behind one seam.

A kind (:mod:`servefleet.kinds.rbln`: RBLN cards on NPU hosts; :mod:`servefleet.kinds.vllm`:
vLLM's recipes on GPU hosts) owns its recipes (recognising, naming, showing and resolving them)
and its hosts: how its devices are found in the host probe and checked against the recipe,
whether and how a driver is installed, the top package of a release and the pins it needs, the
device-selection variable of the units (and the other variables they set themselves), how
servers are grouped on devices, and how long a first start may take (RBLN compiles; GPU servers
load). The host plan, units, health gate, releases, rollback and rollouts are shared and ask the
spec's kind. A new platform is one package here
plus data: its defaults (data key -> value, shipped in its package), the ``servefleet resolve``
options it takes (:class:`ResolveOption`), the commands the host probe runs for its devices and
how to read their output, and its driver change (:class:`DriverPlan`, which the driver step
turns into operations), registered with :func:`servefleet.kinds.register`.

A kind reads the deploy's settings through :class:`Wants` (the attributes it uses), so it never
imports the settings layer above it. Pure: no pyinfra import.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from servefleet.base.errors import RecipeError
from servefleet.base.remote import layout
from servefleet.base.shipped import RECIPES_DIR
from servefleet.spec import ServeSpec

# A Hugging Face model id as every recipe names one and the host's fetcher takes it: ORG/NAME of
MODEL_ID, MODEL_ID_ALLOWED = layout.MODEL_ID, layout.MODEL_ID_ALLOWED  # the host contract's rule
# vLLM's recipes may also name a model by its local directory (an absolute path)
MODEL_PATH = re.compile(r"(?!.*\.\.)/[A-Za-z0-9._/-]+\Z")
MODEL_PATH_ALLOWED = f"{MODEL_ID_ALLOWED}, or an absolute path of [A-Za-z0-9._/-]"


def model_problem(value: Any, where: str, paths: bool = False) -> str | None:
    """Why ``value`` is not a model id (or, with ``paths``, a local model directory), or None.

    + value: the model a recipe names
    + where: how the message names it
    + paths: accept an absolute path (vLLM's recipes)
    """
    if isinstance(value, str) and (
        MODEL_ID.fullmatch(value) or (paths and MODEL_PATH.match(value))
    ):
        return None
    shown = repr(value[:80]) if isinstance(value, str) else type(value).__name__
    allowed = MODEL_PATH_ALLOWED if paths else MODEL_ID_ALLOWED
    return f"{where}: {shown} is not a model id; allowed: {allowed}"


# The words each kind's servers may start with, before the model: an allow-list, as the flag
# table is (a launcher of any bare word resolved, and only the host's pre-flight stopped it)
LAUNCHERS = {"rbln": ("vllm serve",), "vllm": ("vllm serve", "vllm-omni serve")}


def launcher_problem(value: Any, where: str, kind: str) -> str | None:
    """Why ``value`` is not a launcher of ``kind`` (:data:`LAUNCHERS`), or None.

    + value: the launcher the recipe names (``vllm serve``)
    + where: how the message names it
    + kind: ``rbln`` or ``vllm``
    """
    allowed = LAUNCHERS[kind]
    if isinstance(value, str) and " ".join(value.split()) in allowed:
        return None
    shown = repr(value[:80]) if isinstance(value, str) else type(value).__name__
    return (
        f"{where}: {shown} is not a launcher servefleet runs; allowed: "
        f"{' or '.join(repr(a) for a in allowed)}"
    )


def draft_model(config: Any, paths: bool = False) -> str | None:
    """The draft model a ``--speculative-config`` object names (None when it names none);
    RecipeError when its ``model`` is not a model id.

    + config: the flag's decoded JSON
    + paths: accept a local model directory (vLLM's recipes)
    """
    draft = config.get("model") if isinstance(config, dict) else None
    if draft is None:
        return None
    problem = model_problem(draft, "--speculative-config: draft model", paths)
    if problem:
        raise RecipeError(problem)
    return str(draft)


class Wants(Protocol):
    """What a kind reads of a host's validated settings (:class:`servefleet.settings.table.Settings`).

    + serve_*: the selection; sdk_pins: name -> version; the timeouts and instance count
    + driver_*: the driver a host needs and where its installer comes from; serve_root
    """

    @property
    def serve_recipe(self) -> str: ...
    @property
    def serve_strategy(self) -> str | None: ...
    @property
    def serve_target(self) -> str: ...
    @property
    def serve_selection(self) -> dict[str, str]: ...
    @property
    def serve_recommended(self) -> bool: ...
    @property
    def serve_hardware(self) -> str | None: ...
    @property
    def serve_variant(self) -> str | None: ...
    @property
    def serve_features(self) -> dict[str, str]: ...
    @property
    def serve_instances(self) -> int | None: ...
    @property
    def serve_nodes(self) -> int | None: ...
    @property
    def serve_prewarm_timeout(self) -> int: ...
    @property
    def serve_load_timeout(self) -> int: ...
    @property
    def driver_version(self) -> str: ...
    @property
    def driver_runfile_url(self) -> str | None: ...
    @property
    def driver_sha256(self) -> dict[str, str]: ...
    @property
    def driver_installer_args(self) -> tuple[str, ...]: ...
    @property
    def driver_apt_packages(self) -> tuple[str, ...]: ...
    @property
    def driver_apt_repo(self) -> dict[str, str] | None: ...
    @property
    def serve_root(self) -> str: ...
    @property
    def sdk_pins(self) -> dict[str, str]: ...
    def owner_of(self, package: str) -> Any: ...


@dataclass(frozen=True)
class ResolveOption:
    """One option of ``servefleet resolve`` that a kind takes (the CLI builds its click option
    from it, its help prefixed with the kind's :attr:`Kind.title`).

    + flag: the option (``--target``)
    + key: the keyword :meth:`Kind.resolve` reads its value under (``target``)
    + help: its one-line help
    + metavar: how the help names its value (``AXIS=VALUE``), None for the type's own
    + type: ``str`` or ``int``, what its value is read as
    + multiple: it may be given more than once (a tuple of values)
    + is_flag: a switch, without a value
    """

    flag: str
    key: str
    help: str
    metavar: str | None = None
    type: type = str
    multiple: bool = False
    is_flag: bool = False


@dataclass(frozen=True)
class DriverFile:
    """The installer a driver change runs: fetched (or taken from the wheelhouse) and checked
    against its sha256 before anything runs it.

    + what: how the operations name it (``runfile``)
    + url: where it is fetched from
    + sha256: what it must be
    + dest: where the host keeps it
    """

    what: str
    url: str
    sha256: str
    dest: str


@dataclass(frozen=True)
class DriverPlan:
    """A host's driver change, as its kind plans it (pure data): the driver step
    (:mod:`servefleet.entry.steps.driver`) turns it into operations, in this order: the apt
    source and the packages it needs, its installer fetched and checked, this host's servers
    stopped, the install run (a failure shows the tail of its log and brings those servers
    back), the version checked, and the servers of the last good state back through the health
    gate.

    + version: the driver version it installs
    + install: the install command (argv)
    + log: the file the install's output goes to
    + check: the command whose JSON output names the installed version (argv), and the key it
      names it under
    + apt_packages: the packages it needs, None for no apt step
    + apt_repo: an apt source for them (``{"src": ..., "key": ...}``), or None
    + installer: the file it runs, or None when there is nothing to fetch
    """

    version: str
    install: tuple[str, ...]
    log: str
    check: tuple[tuple[str, ...], str]
    apt_packages: tuple[str, ...] | None = None
    apt_repo: Mapping[str, str] | None = None
    installer: DriverFile | None = None


@dataclass(frozen=True)
class Hardware:
    """A host's accelerators, as its platform read them from the probe.

    + source: what told (``rbln-smi``, ``lspci``, ``nvidia-smi``, ``amd-smi``, ``compile only``)
    + skus: one model name per device (``RBLN-CR13``, ``NVIDIA H200``)
    + devices: device indexes (the values of the devices variable)
    + driver_version: the driver's version, None when there is no driver
    + memory_mib: each device's memory (GPUs), empty when not known
    """

    source: str
    skus: tuple[str, ...]
    devices: tuple[int, ...]
    driver_version: str | None
    memory_mib: tuple[int, ...] = ()

    @property
    def sku(self) -> str | None:
        return self.skus[0] if len(set(self.skus)) == 1 else None


class Kind:
    """The interface each kind implements (one instance, ``KIND``).

    Recipes:
    + kind: the first part of its qualified names (``rbln/...``, ``vllm/...``) and the spec's kind
    + label: how errors name a recipe of this kind (``an RBLN recipe card``)
    + title: how help and docs name it (``RBLN``, ``vLLM``)
    + options: the ``servefleet resolve`` options it takes (:class:`ResolveOption`)

    Hosts:
    + name: the name of its hosts' platform (``rbln``, ``gpu``; a release's stack name)
    + defaults: data key -> this kind's default, shipped in its package (``defaults.py``): over
      the key table's platform-neutral ones, for a host whose data does not set the key (the
      first kind's are every host's when its data names no recipe)
    + flag_table: the ``vllm serve`` flag table its servers parse with
      (:func:`servefleet.base.flags.table`)
    """

    kind = ""
    label = ""
    title = ""
    options: tuple[ResolveOption, ...] = ()
    name = ""
    defaults: Mapping[str, Any] = {}
    flag_table = "upstream"
    # what the host probe runs to find the devices: (name, argv, "json" or "lines", unless),
    # each output under its name for :meth:`hardware`; skipped when ``unless`` found something
    probe_commands: tuple[tuple[str, tuple[str, ...], str, str | None], ...] = ()
    devices_env = ""  # the unit variable that gives a server its devices
    # the variables its units set themselves (its devices, a compile-only start) -> what decides
    # them: never a variable of serve_extra_env (:func:`servefleet.kinds.deploy_env`)
    deploy_env: Mapping[str, str] = {}
    device_word = "devices"  # how units and messages name them
    # "runfile" (servefleet installs it: :meth:`driver_plan`) or "check" (it must be there);
    # the lock records a driver_runfile_url of a kind that has one
    driver_step = ""
    compiles = False  # first starts compile a cache worth pre-warming (fingerprint)

    # -- recipes

    def detect(self, path: Path, text: str) -> bool:
        """Whether a recipe file (its path and text) is of this kind."""
        raise NotImplementedError

    def locate(self, rest: str, base: Path) -> Path | None:
        """The file of the qualified name ``<kind>/<rest>`` under ``base``, if there is one."""
        return None

    def names(self, base: Path) -> list[str]:
        """Qualified names of this kind's recipes under ``base``, sorted."""
        return []

    def path_of(self, recipe: str) -> Path:
        """The file of a recipe of this kind that data names (a path, or ``<kind>/<rest>``
        under the shipped recipes).

        + recipe: ``serve_recipe``
        """
        p = Path(recipe)
        if p.is_file():
            return p
        kind, _, rest = recipe.partition("/")
        path = self.locate(rest, RECIPES_DIR) if kind == self.kind and rest else None
        if path is None:
            raise RecipeError(f"no {self.kind} recipe {recipe!r} under {RECIPES_DIR}")
        return path

    def show(self, path: Path, name: str) -> dict[str, Any]:
        """What ``servefleet recipes show`` prints: axes, allowed values, defaults, targets."""
        raise NotImplementedError

    def resolve(
        self, path: Path, name: str, strategy: str | None, options: Mapping[str, Any]
    ) -> ServeSpec:
        """Resolve a selection; ``options`` maps the keywords of :attr:`options` to values."""
        raise NotImplementedError

    # -- hosts

    def devices_env_for(self, hardware: Hardware) -> str:
        """The unit variable that gives a server its devices on this host."""
        return self.devices_env

    def resolve_data(self, settings: Wants, sku: str | None = None) -> ServeSpec:
        """The serving spec the data selects (for the host's device model, once known)."""
        raise NotImplementedError

    def hardware(self, probe: dict[str, Any]) -> Hardware:
        """The host's devices, from the probe's output."""
        raise NotImplementedError

    def refusal(self, settings: Wants, spec: ServeSpec, hardware: Hardware) -> str | None:
        """Why this host must not serve the spec (one line), or None."""
        raise NotImplementedError

    def driver_needed(self, settings: Wants, hardware: Hardware) -> bool:
        """Whether this host's driver must change (servefleet installs it)."""
        return False

    def driver_problem(self, settings: Wants) -> str | None:
        """What the data lacks to install the driver (one line naming the key), or None;
        asked before any change, of a host whose driver is needed."""
        return None

    def driver_plan(self, settings: Wants, kernel: str) -> DriverPlan | None:
        """The driver change of a host whose driver is needed, or None: this kind installs
        none (its driver must be there).

        + settings: the host's validated data
        + kernel: the host's kernel release (``uname -r``)
        """
        return None

    def release_extras(self, spec: ServeSpec) -> list[str]:
        """The extras of the release's top package the selection needs (each brings the
        packages ``sdk_extra_packages`` names for it; the others are not installed)."""
        return []

    def unit_data(self, options: Mapping[str, Any], data: dict[str, Any]) -> None:
        """What :meth:`resolve`'s ``options`` set in the data a resolved unit is rendered under
        (``servefleet resolve --format unit``), in place; nothing by default.

        + options: the keywords of :attr:`options` and their values
        + data: every data key, the defaults
        """

    def required_pins(self) -> tuple[str, ...]:
        """Distributions the data must pin for this platform."""
        raise NotImplementedError

    def top_requirement(self, settings: Wants, spec: ServeSpec) -> tuple[str, str]:
        """The release's top requirement (``vllm-rbln[kv-connectors]==0.12.0``) and its name."""
        raise NotImplementedError

    def imports(self, spec: ServeSpec) -> list[str]:
        """Modules that must import in the release before it counts as installed."""
        return list(spec.requirements.imports)

    def groups(self, settings: Wants, spec: ServeSpec, hardware: Hardware) -> list[str]:
        """The devices of each server on the host (``0,1``), one entry per instance."""
        per = spec.servers[0].npus
        devices = hardware.devices
        groups = [devices[i : i + per] for i in range(0, len(devices) - per + 1, per)]
        if settings.serve_instances is not None:
            groups = groups[: settings.serve_instances]
        return [",".join(str(d) for d in g) for g in groups]

    def first_start_timeout(self, settings: Wants) -> int:
        """Seconds a start that compiles or loads from scratch may take to pass the gate."""
        raise NotImplementedError
