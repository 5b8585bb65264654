"""``servefleet lab chat``: a chat completion from every lab host, to see a deploy serving."""

from __future__ import annotations

import json
import sys
import urllib.request

import click

from servefleet.base.errors import ServefleetError
from servefleet.base.exitcodes import Exit
from servefleet.fleet.lab.state import load_state


def chat_once(address: str, port: int, model: str, prompt: str, max_tokens: int = 16) -> str:
    """POST one chat completion to ``address:port`` and return the reply's text.

    + address, port: where the server listens
    + model: the served model name
    + prompt: the user message
    """
    body = json.dumps(
        {
            "model": model,
            "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": prompt}],
        }
    ).encode()
    req = urllib.request.Request(
        f"http://{address}:{port}/v1/chat/completions",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return str(json.load(r)["choices"][0]["message"]["content"])


@click.command("chat")
@click.option("--port", default=8000, show_default=True, help="the instance's port on each host")
@click.option("--model", default="openai/gpt-oss-120b", show_default=True)
@click.argument("prompt", default="Hello")
def chat(port: int, model: str, prompt: str) -> None:
    """Ask every lab host's server at PORT one question; fail if any does not answer.

    Example:

        servefleet lab chat --port 8000 "Hello"
    """
    try:
        state = load_state()
    except ServefleetError as e:
        click.echo(f"servefleet lab: {e}", err=True)
        sys.exit(Exit.USAGE)
    failed = 0
    for host in state["hosts"]:
        try:
            reply = chat_once(host["address"], port, model, prompt)
            click.echo(f"{host['name']} ({host['address']}:{port}): {reply}")
        except (OSError, ValueError, KeyError) as e:  # URLError is an OSError
            failed += 1
            click.echo(f"{host['name']} ({host['address']}:{port}): no answer: {e}", err=True)
    sys.exit(Exit.FAILED if failed else Exit.OK)
