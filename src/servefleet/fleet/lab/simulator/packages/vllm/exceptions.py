"""vLLM's ``vllm.exceptions``: the base classes of vLLM's own errors and
``VLLMValidationError``, which ``validate_chat_template`` raises. A SIMULATION for the servefleet
lab."""

from __future__ import annotations

from typing import Any


class VLLMError(Exception):
    """Base class for all vLLM-specific errors."""


class VLLMClientError(VLLMError):
    """Base class for errors caused by the client request (4xx)."""


class VLLMServerError(VLLMError):
    """Base class for errors caused by the server (5xx)."""


class VLLMValidationError(VLLMClientError):
    """vLLM-specific validation error: its text names the parameter and value when given."""

    def __init__(self, message: str, *, parameter: str | None = None, value: Any = None) -> None:
        super().__init__(message)
        self.parameter = parameter
        self.value = value

    def __str__(self) -> str:
        base = super().__str__()
        extras = []
        if self.parameter is not None:
            extras.append(f"parameter={self.parameter}")
        if self.value is not None:
            extras.append(f"value={self.value}")
        return f"{base} ({', '.join(extras)})" if extras else base
