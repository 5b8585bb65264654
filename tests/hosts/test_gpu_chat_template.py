"""A file a command line names (#22), on an H200 host: a selection whose command names the
relative ``examples/tool_chat_template_x.jinja`` (which the vllm wheel does not ship, and vLLM
would read from the server's working directory) is refused before any change, in one line, and
the host keeps serving; with ``serve_files`` naming a file on the controller, it serves, its
argv points at the release's shipped copy, and that copy holds the controller's bytes."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from faults import run
from labhelpers import on_host, relabbed

TEMPLATE = "examples/tool_chat_template_x.jinja"
TEXT = "{% for m in messages %}{{ m['content'] }}{% endfor %}\n"  # a chat template of the test's


@pytest.fixture
def h200_lab(lab: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """One H200 host; the session lab comes back as it was after."""
    with relabbed(lab, "--hosts", "1", "--hardware", "h200") as one:
        yield one


def serving(lab: dict[str, Any]) -> str:
    """The unit file's bytes and its server's main process (a restart changes it)."""
    return on_host(lab, "lab1", "cat /etc/systemd/system/servefleet-vllm-*.service; "
                   "systemctl show -p MainPID servefleet-vllm-0.service").stdout  # fmt: skip


def test_a_relative_chat_template_is_refused_until_shipped(
    h200_lab: dict[str, Any], tmp_path: Path
) -> None:
    lab = h200_lab
    first = run(lab)
    assert first.returncode == 0, (first.stdout + first.stderr)[-4000:]
    before = serving(lab)
    extra = ["--data", f"serve_extra_args={json.dumps(['--chat-template', TEMPLATE])}"]
    refused = run(lab, *extra)
    out = refused.stdout + refused.stderr
    lines = [x for x in out.splitlines() if "servefleet:" in x]
    assert refused.returncode != 0 and "Traceback" not in out, out[-3000:]
    assert len(lines) == 1 and f"--chat-template {TEMPLATE}: a relative path that the vllm " \
           "wheel does not ship" in lines[0], lines  # fmt: skip
    assert "serve_files" in lines[0]
    assert serving(lab) == before  # nothing written, nothing restarted

    local = tmp_path / "tool_chat_template_x.jinja"
    local.write_text(TEXT)
    shipped = run(
        lab,
        *extra,
        "--data",
        f"serve_files={json.dumps({TEMPLATE: str(local)})}",
        "--data",
        f"serve_files_root={tmp_path}",
    )  # the file lives outside the repo
    assert shipped.returncode == 0, (shipped.stdout + shipped.stderr)[-4000:]
    pid = "$(systemctl show -p MainPID --value servefleet-vllm-0.service)"
    argv = on_host(lab, "lab1", f"cat /proc/{pid}/cmdline").stdout.split("\0")
    path = argv[argv.index("--chat-template") + 1]
    digest = hashlib.sha256(TEXT.encode()).hexdigest()
    assert path.startswith("/opt/servefleet/releases/") and path.endswith(
        f"/files/{digest[:16]}-tool_chat_template_x.jinja"
    ), path
    assert on_host(lab, "lab1", f"sha256sum {path}").stdout.split()[0] == digest
    assert TEMPLATE not in argv  # the relative path never reaches vLLM
