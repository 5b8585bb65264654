"""What GPU platforms share (:mod:`.nvidia`, :mod:`.amd`): servefleet installs no GPU driver (it
checks that the driver and the right GPUs are there), a release is upstream ``vllm`` at its pin
(one stack, ``gpu``, for both), one server per host unless the data splits it, and no compile
pre-warm: a first start loads the model within ``serve_load_timeout``."""

from __future__ import annotations

from servefleet.platforms.base import Hardware, Platform, Wants
from servefleet.spec import ServeSpec


def number(text: str) -> bool:
    """A device index or size as the GPU tools print one: digits, not too many."""
    return text.isdigit() and len(text) < 10


class Gpu(Platform):
    stack = "gpu"
    device_word = "GPUs"
    driver_step = "check"
    compiles = False
    keys = frozenset({"serve_load_timeout"})

    def required_pins(self) -> tuple[str, ...]:
        return ("vllm",)

    def top_requirement(self, settings: Wants, extras: list[str]) -> tuple[str, str]:
        return f"vllm=={settings.sdk_pins['vllm']}", "vllm"

    def imports(self, spec: ServeSpec) -> list[str]:
        return ["vllm", *spec.requirements.imports]

    def groups(self, settings: Wants, spec: ServeSpec, hardware: Hardware) -> list[str]:
        groups = super().groups(settings, spec, hardware)
        return groups[: settings.serve_instances or 1]  # one server per host unless split

    def first_start_timeout(self, settings: Wants) -> int:
        return settings.serve_load_timeout
