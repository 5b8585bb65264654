"""A stub of ``rebel`` (rebel-compiler, on RBLN's private index): only the names vllm-rbln 0.12.0's
platform module calls when it is imported and its parser is built (``vllm_rbln/platform``). It
compiles nothing; the real-wheel tier (tests/realvllm) uses it to load vllm-rbln's platform."""

__version__ = "0.0.0+servefleet.stub"

NPU_NAME = "RBLN-CR13"  # what rbln-smi names a CR13 NPU


def get_npu_name(device_id: int = 0) -> str:
    """The NPU's name (vllm_rbln.platform.RblnPlatform.get_device_name)."""
    return NPU_NAME


def manual_seed(seed: int) -> None:
    """Seeds the NPU's generator (RblnPlatform.seed_everything): nothing to seed here."""
