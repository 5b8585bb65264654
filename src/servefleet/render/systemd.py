"""systemd escaping: one step from an argv list (and env) to ``ExecStart=``/``Environment=`` lines.

``ExecStart=`` (systemd.service(5), systemd.syntax(7)): the line first goes through specifier
expansion (``%%`` -> ``%``), is then split into words with C-style unescaping inside double
quotes, and each word finally gets ``$VAR`` expansion at exec time (``$$`` -> ``$``). So each arg
is JSON-quoted (``"`` and ``\\`` escaped, newlines as ``\\n``), then ``%`` -> ``%%`` and
``$`` -> ``$$``, as nixpkgs ``escapeSystemdExecArg`` does. A quoted ``";"`` is a literal
semicolon: systemd only treats an *unquoted* lone ``;`` as a command separator.

``Environment=`` takes quoted ``"NAME=value"`` words with the same C-style unescaping and
specifier expansion, but no variable expansion (``$`` has no special meaning there), so only
``%`` is doubled.

Shell quoting (``shlex.quote``) is wrong for both.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from servefleet.base.errors import ServefleetError
from servefleet.base.remote import layout

# Prefixes systemd reads from the first word of ExecStart= after unquoting.
_EXEC_PREFIXES = "@-:+!|"


def _quote(value: str, what: str) -> str:
    if "\0" in value:
        raise ServefleetError(f"{what}: contains a NUL byte, which systemd cannot pass")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ServefleetError(f"{what}: not valid UTF-8") from None
    return json.dumps(value, ensure_ascii=False).replace("%", "%%")


def exec_arg(arg: str) -> str:
    """One argv entry quoted for ``ExecStart=``.

    + arg: the argument, exactly as the process must receive it
    """
    return _quote(arg, f"argument {arg!r}").replace("$", "$$")


def exec_line(argv: Sequence[str]) -> str:
    """The value of ``ExecStart=`` for an argv (without the ``ExecStart=`` key).

    + argv: the command; the first entry is the executable (absolute path or a bare name)
    """
    if not argv:
        raise ServefleetError("ExecStart: empty argv")
    first = argv[0]
    if not first or first[0] in _EXEC_PREFIXES:
        raise ServefleetError(
            f"ExecStart: executable {first!r} must not be empty or start with one of "
            f"{_EXEC_PREFIXES} (systemd reads those as prefixes)"
        )
    return " ".join(exec_arg(a) for a in argv)


def environment_line(name: str, value: str) -> str:
    """The value of one ``Environment=`` line (without the ``Environment=`` key).

    + name: the variable name
    + value: its value, exactly as the process must see it
    """
    if not layout.ENV_NAME.fullmatch(name):
        raise ServefleetError(f"Environment: {name!r} is not a valid variable name")
    return _quote(f"{name}={value}", f"Environment {name}")


def unit_text(
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    description: str,
    user: str | None = None,
    timeout_start_sec: str = "infinity",
) -> str:
    """A minimal service unit running one server (the deploy's template mirrors this).

    + argv: the server's argv (``argv[0]`` an absolute path or a name systemd finds in PATH)
    + env: environment, in order
    + description: ``Description=`` (one line)
    + user: ``User=``, if any
    + timeout_start_sec: ``TimeoutStartSec=`` (cold compiles take hours)
    """
    if "\n" in description:
        raise ServefleetError("Description: must be one line")
    lines = [
        "[Unit]",
        f"Description={description.replace('%', '%%')}",
        "After=network-online.target",
        "Wants=network-online.target",
        "",
        "[Service]",
        "Type=simple",
    ]
    if user:
        lines.append(f"User={user}")
    lines += [f"Environment={environment_line(k, v)}" for k, v in env.items()]
    lines += [
        f"ExecStart={exec_line(argv)}",
        "Restart=on-failure",
        f"TimeoutStartSec={timeout_start_sec}",
        "KillMode=mixed",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
    ]
    return "\n".join(lines) + "\n"
