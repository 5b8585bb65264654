"""A test-only hardware platform that serves an existing recipe family (vLLM's recipes) without
a change to it or to any file under ``src/``: one module plus data, registered by the tests
(:func:`servefleet.platforms.register`)."""

from testplatform.platform import Testgpu

__all__ = ["Testgpu"]
