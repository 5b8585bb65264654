"""Used by `servefleet plan` and `servefleet status`: each host's summary, no operation."""

try:
    from servefleet.entry.deploys import report
except ModuleNotFoundError as e:  # a pyinfra whose Python has no servefleet
    raise SystemExit(
        f"{__file__}: {e}; run the pyinfra installed with servefleet "
        "(uv tool install --with-executables-from pyinfra servefleet-VERSION-py3-none-any.whl)"
    ) from None

report()
