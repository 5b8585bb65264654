"""The hardware platform seam: what differs by the accelerators a host has, behind one interface.

A platform (:mod:`servefleet.platforms.rbln`: RBLN NPUs; :mod:`~servefleet.platforms.nvidia` and
:mod:`~servefleet.platforms.amd`: GPUs) says which commands the host probe runs for its devices
and how to read their output (:meth:`Platform.read`), the variable that gives a server its
devices and how units name them, whether and how its driver is installed
(:class:`DriverPlan`), the pins and the top package a release needs, the ``vllm serve`` flag
table its servers parse with, whether a first start compiles a cache worth pre-warming (and the
variables a compile-only start sets, the layout of that cache under the cache root: data the
deploy hands the host programs), how long a first start may take, and the data keys it reads.

A host's platform is decided from its probe (its hardware), among the platforms its recipe
family is served on (:attr:`servefleet.kinds.base.Kind.platforms`):
:func:`servefleet.platforms.detect`. A new platform is one module plus data, registered with
:func:`servefleet.platforms.register`. A platform reads the settings through :class:`Wants`, so
it never imports the layers above it. Pure: no pyinfra import.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from servefleet.spec import ServeSpec

# (output name, argv, "json" or "lines", unless): what the probe runs, each output under its
# name for :meth:`Platform.read`; skipped when the output ``unless`` names found something
ProbeCommand = tuple[str, tuple[str, ...], str, str | None]


class Wants(Protocol):
    """What a recipe family or a platform reads of a host's validated settings (:class:`servefleet.settings.table.Settings`).

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
    """A host's driver change, as its platform plans it (pure data): the driver step
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


class Platform:
    """The interface each hardware platform implements (one instance, ``PLATFORM``).

    + name: the platform's name (``rbln``, ``nvidia``, ``amd``): how messages name it
    + title: how help and docs name it (``RBLN NPU``, ``NVIDIA GPU``)
    + stack: the name its releases' stacks start with (``rbln``, ``gpu``: GPU platforms share
      one, since they install the same packages)
    + flag_table: the ``vllm serve`` flag table its servers parse with
      (:func:`servefleet.base.flags.table`)
    + probe_commands: what the host probe runs to find its devices (:data:`ProbeCommand`)
    + devices_env: the unit variable that gives a server its devices
    + device_word: how units and messages name its devices
    + deploy_env: the variables its units set themselves besides :attr:`devices_env` (a
      compile-only start's) -> what decides them: never a variable of ``serve_extra_env``
    + driver_step: ``runfile`` (servefleet installs it: :meth:`driver_plan`) or ``check`` (it
      must be there)
    + compiles: a first start compiles a cache worth pre-warming (the spec's fingerprint)
    + compile_only_env: the variables of a compile-only start (no device needed), ``{sku}`` for
      the device model it compiles for; what ``remote/prewarm.py build`` adds to the unit
    + cache_dirs: a regular expression of a compiled cache's directories under the cache root
      (what a warm marker may name, a fleet copy may carry); declared here, not yet handed to
      the host programs (``remote/prewarm.py``, ``warm_state.py`` and ``content_check.py`` still
      spell RBLN's ``rbln/<model>/<sig>``)
    + keys: the data keys it reads beyond every platform's (its driver's, its first start's)
    + serves: the recipe families (``Kind.kind``) it serves besides those that name it in
      ``Kind.platforms``: a platform added from outside (a new GPU's) serves vLLM's recipes
      without a change to the vLLM family
    """

    name = ""
    title = ""
    stack = ""
    flag_table = "upstream"
    probe_commands: tuple[ProbeCommand, ...] = ()
    devices_env = ""
    device_word = "devices"
    deploy_env: Mapping[str, str] = {}
    driver_step = "check"
    compiles = False
    compile_only_env: Mapping[str, str] = {}
    cache_dirs = ""
    keys: frozenset[str] = frozenset()
    serves: tuple[str, ...] = ()

    def read(self, probe: dict[str, Any]) -> Hardware | None:
        """The host's devices from the probe's output (its :attr:`probe_commands`'), or None
        when the output shows none of this platform's (another platform may)."""
        raise NotImplementedError

    def empty(self) -> Hardware:
        """A host on which no platform found a device: what the refusal names."""
        return Hardware(self.name, (), (), None)

    def driver_needed(self, settings: Wants, hardware: Hardware) -> bool:
        """Whether this host's driver must change (servefleet installs it)."""
        return False

    def driver_problem(self, settings: Wants) -> str | None:
        """What the data lacks to install the driver (one line naming the key), or None;
        asked before any change, of a host whose driver is needed."""
        return None

    def driver_plan(self, settings: Wants, kernel: str) -> DriverPlan | None:
        """The driver change of a host whose driver is needed, or None: this platform installs
        none (its driver must be there).

        + settings: the host's validated data
        + kernel: the host's kernel release (``uname -r``)
        """
        return None

    def required_pins(self) -> tuple[str, ...]:
        """Distributions the data must pin for this platform."""
        raise NotImplementedError

    def top_requirement(self, settings: Wants, extras: list[str]) -> tuple[str, str]:
        """The release's top requirement (``vllm-rbln[kv-connectors]==0.12.0``) and its name.

        + settings: the host's validated data (its pins)
        + extras: the extras of the top package the selection needs
        """
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
        return settings.serve_load_timeout
