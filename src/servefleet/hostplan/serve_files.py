"""``serve_files`` in a server's command line: each path it ships replaced by the release's copy,
and a file option (``--chat-template``, ``--tool-parser-plugin``) whose relative path neither it
nor the vllm wheel provides refused.

Pure (no pyinfra import).
"""

from __future__ import annotations

import functools
import posixpath
from collections.abc import Sequence

from servefleet.base.errors import DataError
from servefleet.base.remote.layout import RELEASE_FILES
from servefleet.base.vllm_reference import reference
from servefleet.release.plan import ReleasePlan

# The options whose value names a file the server reads (vLLM resolves a relative one from its
# working directory; a chat template also among the wheel's own)
FILE_OPTIONS = ("--chat-template", "--tool-parser-plugin")


def shipped_paths(args: Sequence[str], release: ReleasePlan) -> list[str]:
    """``args`` with each path ``serve_files`` ships replaced by the release's copy, and a file
    option's relative path that neither it nor the vllm wheel provides refused (DataError)."""
    shipped = {f.argv: f"{release.path}/{RELEASE_FILES}/{f.name}" for f in release.files}
    out: list[str] = []
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if eq and flag.startswith("--") and value in shipped:
            out.append(f"{flag}={shipped[value]}")
            continue
        out.append(shipped.get(arg, arg))
        before = args[i - 1] if i else ""
        if before in FILE_OPTIONS and arg not in shipped:
            _refuse_unshipped(before, arg)
        elif eq and flag in FILE_OPTIONS:
            _refuse_unshipped(flag, value)
    return out


def _refuse_unshipped(flag: str, path: str) -> None:
    """A file option's value the host cannot have: a relative path (vLLM reads it from the
    server's working directory, /) that is not a template the wheel ships."""
    if posixpath.isabs(path):
        return
    templates = _wheel_templates()
    if flag == "--chat-template" and (any(c in path for c in "{}\n") or path in templates):
        return
    shown = f" (the wheel's: {', '.join(sorted(templates))})" if flag == "--chat-template" else ""
    raise DataError(
        f"{flag} {path}: a relative path that the vllm wheel does not ship{shown}; allowed: "
        f"ship it with serve_files = {{{path!r}: '<the file on the controller>'}}, or an "
        "absolute path on the host"
    )


@functools.lru_cache(maxsize=1)
def _wheel_templates() -> frozenset[str]:
    """The chat templates the vllm wheel ships (the version's reference data)."""
    text = reference().chat_templates.read_text()
    return frozenset(x.strip() for x in text.splitlines() if x.strip())
